"""Cluster.run / shutdown on real Spark (local[4]), InputMode.TENSORFLOW, without TensorFlow.

Main functions live at module level: executors import this module by name
(conftest puts python/tests on the workers' PYTHONPATH).
"""
from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

import ember
from conftest import no_leftovers
from ember import _ember, errors

pytestmark = pytest.mark.timeout(180)


# -- main functions (run on the nodes) ------------------------------------------


def _write_ctx(ctx, out_dir: str) -> None:
    info = dict(executor_id=ctx.executor_id, worker_num=ctx.worker_num, job_name=ctx.job_name,
                task_index=ctx.task_index, cluster_spec=ctx.cluster_spec,
                num_workers=ctx.num_workers, default_fs=ctx.default_fs,
                working_dir=ctx.working_dir, log_dir=ctx.log_dir, job_id=ctx.job_id,
                input_mode=int(ctx.input_mode),
                tf_config=json.loads(os.environ["TF_CONFIG"]),
                env_job_id=os.environ.get("EMBER_JOB_ID"), pid=os.getpid(), ppid=os.getppid(),
                pgid=os.getpgid(0), absolute=ctx.absolute_path("models/m1"))
    path = Path(out_dir) / f"{ctx.job_name}-{ctx.task_index}.json"
    path.write_text(json.dumps(info))


def record_and_greet(args, ctx):
    _write_ctx(ctx, args["out"])
    print(f"hello from {ctx.job_name} {ctx.task_index}")
    import sys

    print(f"complaint from {ctx.job_name} {ctx.task_index}", file=sys.stderr)


def record_then_block_if_not_training(args, ctx):
    """ps and evaluator nodes never return, like a TF ps doing server.join().  Every node
    records first (the barrier): shutdown stops ps and evaluator as soon as the training nodes
    are done, which may be before a slower node process got to main_fun."""
    _write_ctx(ctx, args["out"])
    ctx.barrier("recorded", timeout=60)
    if ctx.job_name in ("ps", "evaluator"):
        while True:
            time.sleep(1)


def fail_on_worker_1(args, ctx):
    if ctx.task_index == 1:
        raise ValueError(f"boom from node {ctx.executor_id}")
    time.sleep(120)  # stopped by the abort


def ps_fails_late(args, ctx):
    if ctx.job_name == "ps":
        time.sleep(2)
        raise RuntimeError("late failure on the ps")


def meet_report_and_linger(args, ctx):
    ctx.barrier("start", timeout=60)
    for step in range(1, 4):
        ctx.report(step=step, loss=1.0 / step, samples=32 * step)
        time.sleep(0.3)
    time.sleep(args["linger"])
    ctx.barrier("end", timeout=60)


def exit_hard(args, ctx):
    if ctx.executor_id == 0:
        print("about to die", flush=True)
        os._exit(7)


def wait_for_release(args, ctx):
    deadline = time.time() + 120
    while not os.path.exists(args["release"]) and time.time() < deadline:
        time.sleep(0.2)


# -- tests --------------------------------------------------------------------------


def test_tensorflow_mode_two_nodes(spark, tmp_path, capsys):
    cluster = ember.Cluster.run(spark, record_and_greet, {"out": str(tmp_path)}, num_executors=2,
                                reservation_timeout=60)
    assert cluster.startup_secs is not None and cluster.startup_secs > 0
    cluster.shutdown(timeout=60)
    cluster.shutdown()  # idempotent

    nodes = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(nodes) == ["worker-0", "worker-1"]
    spec = cluster.cluster_spec
    assert list(spec) == ["worker"] and len(spec["worker"]) == 2
    assert len(set(spec["worker"])) == 2
    for i in range(2):
        node = nodes[f"worker-{i}"]
        assert node["executor_id"] == node["worker_num"] == node["task_index"] == i
        assert node["job_name"] == "worker"
        assert node["cluster_spec"] == spec
        assert node["num_workers"] == 2
        assert node["default_fs"] == "file:///"
        assert node["working_dir"] == os.getcwd()
        assert node["absolute"] == f"file://{os.getcwd()}/models/m1"
        assert node["tf_config"] == {"cluster": spec, "task": {"type": "worker", "index": i}}
        assert node["job_id"] == node["env_job_id"] == cluster.job_id
        assert node["input_mode"] == int(ember.InputMode.TENSORFLOW)
        assert node["pgid"] == node["pid"], "main_fun must run in its own process group"
        host, port = spec["worker"][i].rsplit(":", 1)
        assert host and int(port) > 0

    out, err = capsys.readouterr()
    assert "[worker:0] hello from worker 0" in out
    assert "[worker:1] hello from worker 1" in out
    assert "[worker:1] complaint from worker 1" in err
    assert "all 2 nodes registered in" in err
    no_leftovers(cluster.job_id)


def test_ps_chief_evaluator_worker_layout(spark, tmp_path):
    start = time.monotonic()
    cluster = ember.Cluster.run(spark, record_then_block_if_not_training, {"out": str(tmp_path)},
                                num_executors=4, num_ps=1, master_node="chief", eval_node=True,
                                reservation_timeout=60)
    cluster.shutdown(timeout=60)  # returns although ps and evaluator never do
    assert time.monotonic() - start < 90

    nodes = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(nodes) == ["chief-0", "evaluator-0", "ps-0", "worker-0"]
    spec = cluster.cluster_spec
    assert sorted(spec) == ["chief", "evaluator", "ps", "worker"]
    assert all(len(hosts) == 1 for hosts in spec.values())
    expected_executor = {"ps": 0, "chief": 1, "evaluator": 2, "worker": 3}
    for name, node in nodes.items():
        role = node["job_name"]
        assert node["executor_id"] == expected_executor[role]
        assert node["task_index"] == 0
        assert node["num_workers"] == 2  # chief + worker
        assert node["tf_config"] == {"cluster": spec, "task": {"type": role, "index": 0}}
    no_leftovers(cluster.job_id)


def test_node_exception_reaches_the_driver_and_stops_the_others(spark):
    cluster = ember.Cluster.run(spark, fail_on_worker_1, None, num_executors=2,
                                reservation_timeout=60)
    start = time.monotonic()
    with pytest.raises(ember.NodeError) as info:
        cluster.shutdown(timeout=120)
    assert time.monotonic() - start < 30
    e = info.value
    assert (e.job_name, e.task_index, e.executor_id) == ("worker", 1, 1)
    assert e.host
    assert "ValueError: boom from node 1" in e.remote_traceback
    assert "fail_on_worker_1" in e.remote_traceback  # the node's own frames
    assert "worker:1" in str(e) and "boom from node 1" in str(e) and e.host in str(e)
    cluster.shutdown()  # idempotent after a failure
    no_leftovers(cluster.job_id)  # worker 0 slept for 120 s: it was stopped


def test_late_exception_is_caught_by_grace_secs(spark):
    cluster = ember.Cluster.run(spark, ps_fails_late, None, num_executors=2, num_ps=1,
                                reservation_timeout=60)
    start = time.monotonic()
    with pytest.raises(ember.NodeError, match="late failure on the ps") as info:
        cluster.shutdown(grace_secs=15, timeout=60)
    assert time.monotonic() - start < 15
    assert (info.value.job_name, info.value.task_index) == ("ps", 0)
    no_leftovers(cluster.job_id)


def test_node_process_dying_without_traceback(spark):
    cluster = ember.Cluster.run(spark, exit_hard, None, num_executors=2, reservation_timeout=60)
    with pytest.raises(ember.NodeError) as info:
        cluster.shutdown(timeout=60)
    assert info.value.executor_id == 0
    assert "exit code 7" in str(info.value)
    no_leftovers(cluster.job_id)


def test_too_few_slots_fails_fast(spark):
    start = time.monotonic()
    with pytest.raises(ember.ClusterError) as info:
        ember.Cluster.run(spark, record_and_greet, {"out": "/nonexistent"}, num_executors=5)
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "needs 5 free task slots" in message
    assert "has 4" in message
    assert "local[5]" in message


def test_unpicklable_args_are_refused(spark):
    import threading

    with pytest.raises(TypeError, match="do not pickle"):
        ember.Cluster.run(spark, record_and_greet, {"lock": threading.Lock()}, num_executors=2)


def test_impossible_layout_is_refused(spark):
    with pytest.raises(errors.InvalidArgument, match="num_ps"):
        ember.Cluster.run(spark, record_and_greet, None, num_executors=2, num_ps=3)


def test_unreachable_coordinator_fails_run_at_once(spark, monkeypatch):
    # The coordinator listens on 127.0.0.2 only, but nodes are told 127.0.0.1: refused.
    monkeypatch.setenv("EMBER_COORDINATOR_BIND", "127.0.0.2")
    monkeypatch.setenv("EMBER_COORDINATOR_HOST", "127.0.0.1")
    start = time.monotonic()
    with pytest.raises(ember.ClusterError) as info:
        ember.Cluster.run(spark, record_and_greet, None, num_executors=2, reservation_timeout=600,
                          connect_timeout=3)
    assert time.monotonic() - start < 30  # not the 600 s reservation_timeout
    assert "cannot reach the Ember coordinator at 127.0.0.1:" in str(info.value)


def test_garbage_and_unauthenticated_connections_do_not_disturb_the_job(spark, capsys):
    cluster = ember.Cluster.run(spark, meet_report_and_linger, {"linger": 2.0}, num_executors=2,
                                reservation_timeout=60)
    host, port = cluster.coordinator_address.rsplit(":", 1)
    port = int(port)
    # Raw garbage, a flood, and a peer that connects and says nothing.
    for payload in (b"GET / HTTP/1.1\r\n\r\n", os.urandom(4096), b"\xff" * 64, b""):
        with socket.create_connection((host, port), timeout=5) as s:
            try:
                s.sendall(payload)
                s.settimeout(3)
                s.recv(1024)  # the server drops us (or says nothing) - either way no crash
            except OSError:
                pass
    silent = socket.create_connection((host, port), timeout=5)
    # A real client that does not know the secret fails the HMAC challenge.
    with pytest.raises(errors.Unauthenticated):
        _ember.CoordinatorClient.connect(host, port, os.urandom(32), connect_timeout=5)
    cluster.shutdown(timeout=60)
    silent.close()

    err = capsys.readouterr().err
    assert "[worker:0] progress: step=3" in err
    assert "samples/s=" in err
    no_leftovers(cluster.job_id)


def test_tensorboard_runs_beside_worker_0(spark, tmp_path):
    import urllib.request

    release = tmp_path / "release"
    cluster = ember.Cluster.run(spark, wait_for_release, {"release": str(release)},
                                num_executors=1, tensorboard=True, log_dir=str(tmp_path / "tb"),
                                reservation_timeout=60)
    try:
        url = cluster.tensorboard_url
        assert url and url.startswith("http://")
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    assert response.status == 200
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        release.touch()
    cluster.shutdown(timeout=60)
    no_leftovers(cluster.job_id)  # TensorBoard carries EMBER_JOB_ID too
