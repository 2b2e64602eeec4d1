"""Language-neutral node start-up: the typed start-up message (encoded by the C++ core),
program nodes (Cluster.run with an argv), and how a node's end reaches its feed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ember
from conftest import no_leftovers
from ember import _ember, errors
from ember._launcher import proc as _proc
from ember._launcher import task as _launcher
from ember.context import Context
from ember.input_mode import InputMode

pytestmark = pytest.mark.timeout(180)

PROGRAM = str(Path(__file__).resolve().parent / "node_program.py")


def _full_context() -> "_ember.NodeContext":
    c = _ember.NodeContext()
    c.job_id = "ember-0123456789ab"
    c.executor_id = 2
    c.job_name = "worker"
    c.task_index = 1
    c.cluster_spec = {"chief": ["h:1"], "worker": ["h:2", "h:3"]}
    c.coordinator_host = "driver"
    c.coordinator_port = 7077
    c.secret = bytes(range(32))
    c.connect_timeout = 12.5
    c.input_mode = int(InputMode.SPARK)
    c.feed_ring = "/ember-0123456789ab-2"
    c.default_fs = "file:///"
    c.working_dir = "/work/main"
    c.log_dir = "file:///work/main/logs"
    c.traceback_path = "/tmp/tb.txt"
    c.payload = b"\x80\x05user code"
    return c


def test_startup_message_round_trips_through_the_core():
    c = _full_context()
    data = _ember.encode_node_startup(c)
    assert data[:4] == b"EMBN"
    assert b"\x80\x05" not in data[:-len(c.payload)]  # only the payload is a pickle
    back = _ember.decode_node_startup(data)
    assert back == c
    assert (back.secret, back.connect_timeout, back.cluster_spec) == (c.secret, 12.5, c.cluster_spec)
    with pytest.raises(errors.Corruption):
        _ember.decode_node_startup(data[:-1])
    with pytest.raises(errors.InvalidArgument, match="version 7"):
        _ember.decode_node_startup(data[:4] + b"\x07\x00" + data[6:])


def test_the_message_carries_the_bind_address_and_the_training_rank():
    """bind_host travels in the message (not in EMBER_NODE_BIND); training_rank/num_workers are
    the core's, also carried on the wire for programs that do not link the core."""
    c = _full_context()
    c.bind_host = "0.0.0.0"
    back = _ember.decode_node_startup(_ember.encode_node_startup(c))
    assert (back.bind_host, back.training_rank, back.num_workers) == ("0.0.0.0", 2, 3)
    ctx = Context.from_node_context(back)
    assert ctx._node is back and (ctx.training_rank, ctx.num_workers) == (2, 3)
    c.job_name, c.task_index = "ps", 0
    assert _ember.decode_node_startup(_ember.encode_node_startup(c)).training_rank is None


def test_context_is_built_from_the_typed_message():
    ctx = Context.from_node_context(_full_context())
    assert (ctx.executor_id, ctx.job_name, ctx.task_index, ctx.num_workers) == (2, "worker", 1, 3)
    assert ctx.input_mode == InputMode.SPARK
    assert ctx.log_dir == "file:///work/main/logs"
    assert ctx._feed_ring == "/ember-0123456789ab-2"
    assert ctx._coordinator == ("driver", 7077, bytes(range(32)), 12.5)
    plain = _full_context()
    plain.log_dir, plain.feed_ring = "", ""
    ctx = Context.from_node_context(plain)
    assert ctx.log_dir is None and ctx._feed_ring is None


class _RecordingRing:
    def __init__(self):
        self.calls = []

    def abort(self, reason):
        self.calls.append(("abort", reason))

    def terminate(self):
        self.calls.append(("terminate",))


def _feed_with(ring) -> _launcher.NodeFeed:
    feed = _launcher.NodeFeed.__new__(_launcher.NodeFeed)  # a recording FeedHost: no ring, no feed server
    feed.host = ring
    return feed


def _exited_child(code_line: str) -> subprocess.Popen:
    child = _proc.spawn([sys.executable, "-c", code_line], {}, stdin=subprocess.DEVNULL)
    import time

    deadline = time.monotonic() + 30
    while not _proc.has_exited(child):  # what the launcher's supervision loop sees
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert child.returncode is None  # has_exited() does not reap: the bug's premise
    return child


def test_crashed_node_feed_is_settled_with_its_real_exit_status():
    """Regression: a crashed node's feed was settled with the return code read before the
    child was reaped (None), so feeding tasks were told to stop quietly (terminate)
    instead of failing with the node's error."""
    ring = _RecordingRing()
    child = _exited_child("import os; os._exit(3)")
    returncode = _launcher.end_node(child, "exit", "", _feed_with(ring), "worker:1", 1.0)
    assert returncode == 3
    assert len(ring.calls) == 1 and ring.calls[0][0] == "abort", ring.calls
    assert "worker:1 failed (exit code 3)" in ring.calls[0][1]

    ring = _RecordingRing()
    child = _exited_child("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert _launcher.end_node(child, "exit", "", _feed_with(ring), "worker:0", 1.0) == -9
    assert "killed by SIGKILL" in ring.calls[0][1]

    ring = _RecordingRing()  # a clean end still terminates the feed quietly
    child = _exited_child("pass")
    assert _launcher.end_node(child, "exit", "", _feed_with(ring), "worker:0", 1.0) == 0
    assert ring.calls == [("terminate",)]


def test_stopped_or_aborted_node_feed_is_settled_before_the_node_is_ended():
    ring = _RecordingRing()
    child = _proc.spawn([sys.executable, "-c", "import time; time.sleep(60)"], {},
                        stdin=subprocess.DEVNULL)
    returncode = _launcher.end_node(child, "abort", "worker:0 failed", _feed_with(ring), "worker:1", 5.0)
    assert returncode == -15  # SIGTERM within the grace period
    assert ring.calls == [("abort", "the job was aborted: worker:0 failed")]


# -- program nodes on Spark -------------------------------------------------------


def test_a_program_runs_on_every_node_with_its_context(spark, tmp_path):
    cluster = ember.Cluster.run(spark, (sys.executable, PROGRAM, str(tmp_path), "--flag"),
                                num_executors=2, reservation_timeout=60)
    cluster.shutdown(timeout=60)
    infos = [json.loads((tmp_path / f"worker-{i}.json").read_text()) for i in range(2)]
    assert {i["executor_id"] for i in infos} == {0, 1}
    for info in infos:
        assert info["job_id"] == cluster.job_id
        assert info["argv"][1:] == [str(tmp_path), "--flag"]
        assert info["payload"] == ""  # nothing pickled for a program
        assert info["stdin"] == ""    # /dev/null
        assert info["cluster_spec"] == cluster.cluster_spec == info["tf_config"]["cluster"]
        assert info["secret_len"] == 32
        assert not info["secret_in_env"] and not info["secret_in_argv"]
    no_leftovers(cluster.job_id)


def test_a_failing_program_fails_the_job_with_its_stderr(spark, tmp_path):
    cluster = ember.Cluster.run(spark, [sys.executable, PROGRAM, str(tmp_path), "--fail"],
                                num_executors=2, reservation_timeout=60)
    with pytest.raises(ember.NodeError) as info:
        cluster.shutdown(timeout=60)
    assert (info.value.job_name, info.value.task_index) == ("worker", 1)
    message = str(info.value)
    assert "exit code 3" in message
    assert "the model diverged" in message
    no_leftovers(cluster.job_id)


def test_a_missing_program_is_named(spark, tmp_path):
    with pytest.raises((ember.NodeError, ember.ClusterError)) as info:
        cluster = ember.Cluster.run(spark, ["/nonexistent/trainer", "--x"], num_executors=1,
                                    reservation_timeout=60)
        cluster.shutdown(timeout=60)
    assert "/nonexistent/trainer" in str(info.value)


def test_program_argv_is_checked_on_the_driver(spark):
    with pytest.raises(TypeError, match="argv"):
        ember.Cluster.run(spark, [], num_executors=1)
    with pytest.raises(TypeError, match="argv"):
        ember.Cluster.run(spark, ["./trainer", 3], num_executors=1)
    with pytest.raises(TypeError, match="args="):
        ember.Cluster.run(spark, ["./trainer"], {"lr": 0.1}, num_executors=1)


def _record_env(args, ctx):
    """A main_fun node: records what node_program.py records of its environment."""
    import os

    from node_program import NODE_ENV_KEYS
    Path(args["out"], f"{ctx.job_name}-{ctx.task_index}.json").write_text(
        json.dumps({"env": {k: os.environ.get(k) for k in NODE_ENV_KEYS}, "cluster_spec": ctx.cluster_spec}))


def _envs_by_rank(out: Path, num: int) -> list:
    infos = [json.loads((out / f"worker-{i}.json").read_text()) for i in range(num)]
    return sorted(infos, key=lambda info: int(info["env"]["RANK"] or -1))


def test_a_program_node_gets_the_environment_of_a_main_fun_node(spark, tmp_path):
    """MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE/LOCAL_RANK, TF_CONFIG and the quiet defaults are
    set for an executable node as for a main_fun node (they were main_fun's alone, so an
    unchanged torch.distributed program failed as an executable: "RANK expected, but not set")."""
    envs = {}
    for kind, target in (("program", [sys.executable, PROGRAM]), ("main_fun", _record_env)):
        out = tmp_path / kind
        out.mkdir()
        if kind == "program":
            cluster = ember.Cluster.run(spark, target + [str(out)], num_executors=3, reservation_timeout=60)
        else:
            cluster = ember.Cluster.run(spark, target, {"out": str(out)}, num_executors=3, reservation_timeout=60)
        cluster.shutdown(timeout=60)
        infos = _envs_by_rank(out, 3)
        rank0 = cluster.cluster_spec["worker"][0]
        for rank, info in enumerate(infos):
            env = info["env"]
            assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == tuple(rank0.rsplit(":", 1)), kind
            assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == (str(rank), "3", str(rank)), kind
            assert json.loads(env["TF_CONFIG"]) == {"cluster": cluster.cluster_spec,
                                                    "task": {"type": "worker", "index": rank}}, kind
            assert env["EMBER_JOB_ID"] == cluster.job_id and env["PYTHONUNBUFFERED"] == "1", kind
            # The bind address travels in the start-up message: the launcher adds no variable
            # (the node sees only what its executor had, e.g. a user's own setting).
            assert env["EMBER_NODE_BIND"] == os.environ.get("EMBER_NODE_BIND"), kind
            # The quiet default (item 7), unless this process's environment (which local[N]
            # executors inherit) sets a level: then the user's level wins.
            assert env["TF_CPP_MIN_LOG_LEVEL"] == os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1"), kind
        # The same variables, with this job's values: only the ports and job ids differ.
        envs[kind] = [{k: v for k, v in info["env"].items() if k not in ("MASTER_PORT", "TF_CONFIG", "EMBER_JOB_ID")}
                      for info in infos]
        no_leftovers(cluster.job_id)
    assert envs["program"] == envs["main_fun"]


def test_node_env_sets_facts_and_keeps_a_user_set_quiet_default():
    from ember._node.env import node_env

    spec = {"chief": ["a:1"], "worker": ["b:2", "a:3"], "ps": ["c:4"]}
    base = {"RANK": "7", "PATH": "/bin"}  # a stale RANK in the executor's environment
    worker = node_env(base, spec, "worker", 1)
    assert {k: worker[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")} == \
        {"MASTER_ADDR": "a", "MASTER_PORT": "1", "RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "1"}
    assert worker["PATH"] == "/bin" and worker["TF_CPP_MIN_LOG_LEVEL"] == "1" and base["RANK"] == "7"
    ps = node_env({}, spec, "ps", 0)
    assert "RANK" not in ps and json.loads(ps["TF_CONFIG"])["task"] == {"type": "ps", "index": 0}
    assert node_env({"TF_CPP_MIN_LOG_LEVEL": "0"}, spec, "chief", 0)["TF_CPP_MIN_LOG_LEVEL"] == "0"
