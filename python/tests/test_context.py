"""ctx without Spark: absolute_path (TFoS hdfs_path semantics), derived fields, config, console."""
from __future__ import annotations

import getpass
import io
import pickle

import pytest

from ember import config
from ember._driver.console import Console
from ember.context import Context, absolute_path

pytestmark = pytest.mark.timeout(30)

USER = getpass.getuser()


@pytest.mark.parametrize("path, default_fs, working_dir, expected", [
    # A scheme is kept as is, whatever the default filesystem.
    ("hdfs://nn:8020/data/x", "file:///", "/work", "hdfs://nn:8020/data/x"),
    ("file:///tmp/x", "hdfs://nn:8020", "/work", "file:///tmp/x"),
    ("s3a://bucket/key", "hdfs://nn:8020", "/work", "s3a://bucket/key"),
    ("viewfs://cluster/x", "file:///", "/work", "viewfs://cluster/x"),
    ("gs://bucket/x", "file:///", "/work", "gs://bucket/x"),
    # Absolute paths go on the default filesystem, without a doubled slash.
    ("/tmp/x", "file:///", "/work", "file:///tmp/x"),
    ("/tmp/x", "file://", "/work", "file:///tmp/x"),
    ("/data/x", "hdfs://nn:8020", "/work", "hdfs://nn:8020/data/x"),
    ("/data/x", "hdfs://nn:8020/", "/work", "hdfs://nn:8020/data/x"),
    ("/data/x", "viewfs://cluster", "/work", "viewfs://cluster/data/x"),
    # Relative paths: the working dir on file://, the user's home on hdfs/viewfs.
    ("models/m1", "file:///", "/work/main", "file:///work/main/models/m1"),
    ("./models/../m2", "file:///", "/work/main", "file:///work/main/m2"),
    ("models/m1", "hdfs://nn:8020", "/work/main", f"hdfs://nn:8020/user/{USER}/models/m1"),
    ("models/m1", "viewfs://cluster/", "/work/main", f"viewfs://cluster/user/{USER}/models/m1"),
    # No default filesystem configured: local.
    ("/tmp/x", None, "/work", "file:///tmp/x"),
    ("rel", "", "/work", "file:///work/rel"),
])
def test_absolute_path(path, default_fs, working_dir, expected):
    assert absolute_path(path, default_fs, working_dir) == expected


def test_absolute_path_rejects_a_default_fs_that_is_not_a_uri():
    with pytest.raises(ValueError, match="not a URI"):
        absolute_path("/x", "nonsense", "/work")


def _ctx(**overrides):
    fields = dict(executor_id=2, job_name="worker", task_index=0,
                  cluster_spec={"ps": ["h:1"], "chief": ["h:2"], "evaluator": ["h:3"],
                                "worker": ["h:4", "h:5"]},
                  default_fs="file:///", working_dir="/work/main", log_dir="logs/run1")
    fields.update(overrides)
    return Context(**fields)


def test_context_fields():
    ctx = _ctx()
    assert ctx.worker_num == ctx.executor_id == 2
    assert ctx.num_workers == 3  # chief + 2 workers; ps and evaluator do not train
    assert ctx.log_dir == "file:///work/main/logs/run1"
    assert ctx.absolute_path("/tmp/a") == "file:///tmp/a"
    assert _ctx(log_dir=None).log_dir is None
    again = pickle.loads(pickle.dumps(ctx))
    assert (again.job_name, again.cluster_spec, again.log_dir) == (ctx.job_name, ctx.cluster_spec,
                                                                   ctx.log_dir)


def test_training_ranks_and_roles_are_the_cores():
    """ctx.training_rank/num_workers, the role lists and TFoS's cluster template come from the
    core's one roles module (include/ember/roles.h), as a C++ node's do."""
    from ember import _ember, _names
    from ember.compat.tensorflowonspark import TFCluster
    assert [_ctx(job_name=j, task_index=i).training_rank for j, i in
            (("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0), ("evaluator", 0))] == [0, 1, 2, None, None]
    assert _names.WORKER_ROLES == ("chief", "master", "worker")
    assert set(_names.SUPPORT_ROLES) == {"ps", "evaluator"}
    assert set(_ember.ROLES) == set(_names.WORKER_ROLES) | set(_names.SUPPORT_ROLES)
    assert TFCluster._cluster_template(6, 2, "chief", True) == \
        {"ps": [0, 1], "chief": [2], "evaluator": [3], "worker": [4, 5]}
    assert TFCluster._cluster_template(2, 0, None, False) == {"worker": [0, 1]}


def test_context_wraps_its_node_context():
    """Context's fields are its NodeContext's (the start-up message), read and written through;
    its communicator's options are the core's (Node::OpenCommunicator's rule)."""
    from ember import _ember
    ctx = _ctx(job_id="ember-j", coordinator=("driver", 7077, b"s" * 32, 2.5))
    ctx.task_index = 1
    assert ctx._node.task_index == 1 and ctx.training_rank == 2
    assert ctx._coordinator == ("driver", 7077, b"s" * 32, 2.5) and _ctx()._coordinator is None
    options = _ember.node_communicator_options(ctx._node, _ember.CommunicatorOptions())
    assert (options.rank, options.size, options.host, options.bind_host, options.name, options.prefix) == \
        (2, 3, "h", "h", "worker:1", "ember-ember-j-c0")
    ctx._node.bind_host = "0.0.0.0"
    assert _ember.node_communicator_options(ctx._node, _ember.CommunicatorOptions()).bind_host == "0.0.0.0"
    with pytest.raises(ValueError, match="ps:0 is not a training node"):
        _ctx(job_name="ps").communicator()


def test_report_without_a_coordinator_says_so():
    with pytest.raises(RuntimeError, match="not connected"):
        _ctx().report(step=1, loss=0.5)


def test_config_precedence(monkeypatch):
    class Conf:
        def __init__(self, values):
            self.values = values

        def get(self, key, default=None):
            return self.values.get(key, default)

    class FakeSc:
        def __init__(self, values):
            self._conf = Conf(values)

        def getConf(self):
            return self._conf

    assert config.get("slot_timeout") == 30.0
    monkeypatch.setenv("EMBER_SLOT_TIMEOUT", "7")
    assert config.get("slot_timeout") == 7.0
    assert config.get("slot_timeout", FakeSc({"spark.ember.slotTimeout": "9"})) == 9.0
    assert config.get("slot_timeout", FakeSc({"spark.ember.slotTimeout": "9"}), explicit=1.5) == 1.5
    monkeypatch.setenv("EMBER_SLOT_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="EMBER_SLOT_TIMEOUT"):
        config.get("slot_timeout")


def test_console_lines_and_progress(monkeypatch):
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    monkeypatch.setattr("sys.stderr", err)
    console = Console(live=False)
    console.node_line("worker:1", "stdout", "hello")
    console.node_line("worker:1", "stderr", "warning")
    console.progress("worker:0", {"step": 10, "loss": 0.5, "samples": 320, "time": 100.0})
    console.progress("worker:0", {"step": 20, "loss": 0.25, "samples": 640, "time": 102.0,
                                  "accuracy": 0.75})
    assert out.getvalue() == "[worker:1] hello\n"
    lines = err.getvalue().splitlines()
    assert lines[0] == "[worker:1] warning"
    assert lines[1] == "[worker:0] progress: step=10 loss=0.5000"
    assert lines[2] == "[worker:0] progress: step=20 loss=0.2500 samples/s=160.0 accuracy=0.75"


def test_console_live_line_is_rewritten(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    console = Console(live=True)
    console.progress("worker:0", {"step": 1})
    console.progress("worker:1", {"step": 2})
    console.info("hello")
    console.clear_progress()
    text = err.getvalue()
    assert "worker:0 step=1 | worker:1 step=2" in text
    assert "[ember] hello\n" in text
    assert text.endswith("\r")
