"""A network partition while InputMode.SPARK training feeds (issue 18, items 8-10), on the
multi-host namespace cluster (python/tests/netns_cluster.py): a worker host's link is set down
in the switch namespace, so its packets are dropped without a reset, as when a cable or a
switch port fails.

* train() raises within heartbeat_timeout (plus a few seconds), naming the lost node and its
  host, although the feeding tasks are blocked sending to the unreachable node (item 8);
* once the link is back, the cut host's /dev/shm holds nothing of the job (item 9);
* with max_restarts=1 a restart whose new gang cannot start (Spark placed a node on the cut
  host, then dropped that host's worker) is recorded in Cluster.restarts, and the error names
  the partitioned host first and says what Spark said (item 10).

The two scenarios without a restart share a cluster and a driver program, one after the other;
the restart scenario, whose partition outlasts the master's worker timeout (so Spark drops the
cut host's worker), gets its own.  heartbeat_timeout and the master's worker timeout are lowered
so that it takes seconds, not minutes; the scenarios without a restart restore the link once
train() raised.  Skipped, saying why, only where the kernel or
permissions refuse network namespaces.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)

HOSTS = ("h1", "h2")
CUT = "h2"              # the host whose link goes down
HEARTBEAT_TIMEOUT = 8.0  # Cluster.run(heartbeat_timeout=...): seconds before a silent node is lost
WORKER_TIMEOUT = 15      # the master's spark.worker.timeout: seconds before it drops a silent worker
FEED_TIMEOUT = 120.0     # train(feed_timeout=...): what a blocked send would wait without the fix
HANG_SECS = HEARTBEAT_TIMEOUT + 25  # how long the driver gives train() to raise after the cut
RESTART_HANG_SECS = WORKER_TIMEOUT + 35  # ... when it restarts first (Spark must drop the worker)
ROWS = 2_000_000         # 32 MB of feed: far more than the 1 MiB rings and the sockets hold
_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
SPARK_CONF = {"spark.driver.extraJavaOptions": _JVM_OPTS, "spark.executor.extraJavaOptions": _JVM_OPTS,
              "spark.ember.feed.ringBytes": str(1 << 20)}


# ----------------------------------------------------------------------------- node program
def stalled_reader(args, ctx):
    """Reads one batch, says so, then reads nothing: its 1 MiB ring fills and the feeding
    tasks block sending to it.  A restarted gang (job id ...-r<k>) reads its whole feed."""
    feed = ctx.get_data_feed()
    job = os.environ.get("EMBER_JOB_ID", "")
    feed.next_batch_columns(64)
    Path(args["out"], f"started-{job}-{ctx.task_index}").write_text("")
    if "-r" in job.rsplit("ember-", 1)[-1]:
        while not feed.should_stop():
            feed.next_batch_columns(4096)
        return
    while True:
        time.sleep(1)


def idle_node(args, ctx):
    """Reads nothing: the driver, having fed epoch 0 (which fits the ring), waits for the node
    to begin it before feeding epoch 1."""
    ctx.get_data_feed()
    Path(args["out"], f"started-{os.environ.get('EMBER_JOB_ID', '')}-{ctx.task_index}").write_text("")
    while True:
        time.sleep(1)


# ----------------------------------------------------------------------------- driver side
def _pid_in_netns(netns: str, marker: bytes) -> int:
    """The pid of the process of host `netns` whose command line holds `marker`."""
    inode = f"net:[{os.stat(f'/run/netns/{netns}').st_ino}]"
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            if os.readlink(f"/proc/{pid}/ns/net") != inode:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker in f.read():
                    return pid
        except OSError:
            continue
    raise RuntimeError(f"no process with {marker.decode()} in its command line runs in {netns}")


def _shm_of_host(netns: str, job_id: str) -> list:
    """The names of job `job_id` in /dev/shm of host `netns` (seen through its Spark worker's
    mount namespace: each host has a private /dev/shm)."""
    pid = _pid_in_netns(netns, b"deploy.worker.Worker")
    return sorted(n for n in os.listdir(f"/proc/{pid}/root/dev/shm") if job_id in n)


def _kill_executor(netns: str) -> None:
    """SIGKILLs the Spark executor JVM of host `netns`."""
    os.kill(_pid_in_netns(netns, b"CoarseGrainedExecutorBackend"), signal.SIGKILL)


def _link(conf: dict, state: str) -> None:
    subprocess.run(["ip", "-n", conf["switch"], "link", "set", conf["port"], state], check=True,
                   capture_output=True, timeout=30)


def case_cut_while_feeding(spark, conf: dict, work: Path) -> dict:
    """Starts a SPARK-mode job, cuts host CUT's link while train() is blocked feeding (conf
    "wait": "send", in the feeding Spark job; "await", between epochs, asking the nodes whether
    they began the last one), and reports what train() raised and when, Cluster.restarts, and
    the cut host's /dev/shm."""
    import dataclasses

    import ember

    out = work / "nodes"
    out.mkdir()
    awaits = conf["wait"] == "await"
    for attempt in range(3):
        cluster = ember.Cluster.run(spark, idle_node if awaits else stalled_reader, {"out": str(out)}, num_executors=2,
                                    input_mode=ember.InputMode.SPARK, reservation_timeout=120,
                                    heartbeat_timeout=HEARTBEAT_TIMEOUT, max_restarts=conf["max_restarts"])
        spec = cluster.cluster_spec
        cut_nodes = [f"worker:{i}" for i, a in enumerate(spec["worker"]) if a.rsplit(":", 1)[0] == conf["cut_address"]]
        if len(cut_nodes) == 1:
            break
        # Spark placed both nodes on one host (seen once after the previous case's executor was
        # replaced: the new one had registered but got no task of the barrier stage).  The
        # scenario needs one node per host, so the job starts again.  Its nodes never return
        # from main_fun, so shutdown() cannot wait for them: it aborts the job once its short
        # timeout passes, which is what is wanted here.
        try:
            cluster.shutdown(timeout=5)
        except ember.errors.DeadlineExceeded:
            pass
        time.sleep(2)
    df = spark.range(0, 1000 if awaits else ROWS, numPartitions=4).selectExpr("id as x", "id * 2 as y")
    box: dict = {}

    def train() -> None:
        try:
            cluster.train(df, num_epochs=2 if awaits else 1, feed_timeout=FEED_TIMEOUT)
        except BaseException as e:  # noqa: BLE001 - reported to the test
            box["error"] = e
        box["end"] = time.monotonic()

    thread = threading.Thread(target=train, daemon=True, name="train")
    thread.start()
    deadline = time.monotonic() + 120
    while len(list(out.glob(f"started-{cluster.job_id}-*"))) < 2:  # both nodes are being fed
        assert thread.is_alive() and time.monotonic() < deadline, f"the feed did not start: {box}"
        time.sleep(0.2)
    if awaits:  # epoch 0 was fed (its Spark job succeeded) and no epoch 1 job started
        tracker = spark.sparkContext.statusTracker()
        while True:
            jobs = [tracker.getJobInfo(j) for j in tracker.getJobIdsForGroup(f"{cluster.job_id}-feed")]
            if len(jobs) == 1 and jobs[0] is not None and jobs[0].status == "SUCCEEDED":
                break
            assert thread.is_alive() and time.monotonic() < deadline, f"epoch 0 was not fed: {jobs} {box}"
            time.sleep(0.2)
    time.sleep(3)  # the rings fill and the feeding tasks block in their sends; or the driver waits
    shm_before = _shm_of_host(conf["cut_netns"], cluster.job_id)
    _link(conf, "down")
    cut_at = time.monotonic()
    thread.join(conf["hang_secs"])
    hung = thread.is_alive()
    shm_killed = None
    if conf.get("kill_executor"):
        # Item 9, the launcher killed: the cut host's executor ends while the link is still down
        # (as when its worker ends it for the master that dropped it), and PySpark's daemon ends
        # the launcher with SIGHUP, which runs no cleanup; the launcher cannot have heard of the
        # abort either.  Its ring must go all the same.
        _kill_executor(conf["cut_netns"])
        killed_at = time.monotonic()
        shm_killed = _shm_of_host(conf["cut_netns"], cluster.job_id)
        while shm_killed and time.monotonic() < killed_at + 15:
            time.sleep(0.5)
            shm_killed = _shm_of_host(conf["cut_netns"], cluster.job_id)
    if conf["outlast_worker_timeout"]:
        # The partition outlasts the master's worker timeout, so Spark drops the cut host's worker
        # and its executor, as in a real outage: when the link returns, that executor is ended.
        # (Otherwise the link returns once train() raised: the cut host's launcher then hears of
        # the job's end from its coordinator connection, or went with its killed executor.)
        time.sleep(max(0.0, cut_at + WORKER_TIMEOUT + 10 - time.monotonic()))
    _link(conf, "up")
    restored_at = time.monotonic()
    if hung:
        thread.join(FEED_TIMEOUT + 60)  # the test fails; this only lets the driver end
    # Item 9: once the link is back, the cut host's launcher ends (told by its coordinator
    # connection, or killed with its executor): its ring must go with it.
    shm_after = _shm_of_host(conf["cut_netns"], cluster.job_id)
    while shm_after and time.monotonic() < restored_at + 60:
        time.sleep(1)
        shm_after = _shm_of_host(conf["cut_netns"], cluster.job_id)
    error = box.get("error")
    try:
        cluster.shutdown(timeout=30)
    except Exception:  # noqa: BLE001 - train() raised already; shutdown() of a failed job may too
        pass
    return {
        "cluster_spec": spec, "cut_nodes": cut_nodes, "job_id": cluster.job_id, "hung": hung,
        "raised_after_cut_secs": (box["end"] - cut_at) if "end" in box else None,
        "error_type": type(error).__name__ if error is not None else None,
        "error": "".join(traceback.format_exception_only(type(error), error)) if error is not None else None,
        "error_lost": getattr(error, "lost", None), "error_host": getattr(error, "host", None),
        "restarts": [dataclasses.asdict(r) for r in cluster.restarts],
        "shm_before": shm_before, "shm_after": shm_after, "shm_after_executor_killed": shm_killed,
        "shm_gone_secs": time.monotonic() - restored_at if not shm_after else None,
    }


def _executor_ids(spark) -> set:
    return set(filter(None, spark.sparkContext._jsc.sc().getExecutorIds().mkString(",").split(",")))


def driver_main(inp: str, out: str) -> None:
    """The driver program: IN's cases, one after the other, on one session built from IN's
    spark_conf; writes OUT ({"results": [...]}) after each.  Before each case both hosts have an
    executor; after a case whose cut host lost its executor, a new one (the master starts it once
    the host's worker is heard from again)."""
    from pyspark.sql import SparkSession

    conf = json.loads(Path(inp).read_text())
    builder = SparkSession.builder.appName("ember-partition")
    for key, value in conf["spark_conf"].items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    results = []
    before: set = set()
    for case in conf["cases"]:
        deadline = time.monotonic() + 120
        while True:
            ids = _executor_ids(spark)
            if len(ids) == len(HOSTS) and (not case.get("kill_executor_before") or ids != before):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(HOSTS)} executors (ids now {sorted(ids)}, before the last case "
                                   f"{sorted(before)}) did not register within 120s")
            time.sleep(0.2)
        before = ids
        t0 = time.monotonic()
        try:
            result = {"ok": True, **case_cut_while_feeding(spark, {**conf, **case}, Path(case["work"]))}
        except Exception:  # noqa: BLE001 - reported to the test, which fails with it
            result = {"ok": False, "error": traceback.format_exc()}
        result["secs"] = time.monotonic() - t0
        results.append(result)
        Path(out).write_text(json.dumps({"results": results}))
    spark.stop()


# ----------------------------------------------------------------------------- the tests
def _scenarios(work: Path, cores: int, cases: list) -> list:
    """Runs `cases` (case_cut_while_feeding's settings, each with its "work" directory) in one
    driver program on a new namespaced cluster; returns their results."""
    from netns_cluster import NetnsCluster, NetnsUnavailable

    t0 = time.monotonic()
    with pytest.MonkeyPatch.context() as mp:
        # The master drops a worker it has not heard from for WORKER_TIMEOUT seconds (default 60).
        mp.setenv("SPARK_DAEMON_JAVA_OPTS", f"-Dspark.worker.timeout={WORKER_TIMEOUT}")
        nc = NetnsCluster(hosts=HOSTS, cores_per_worker=cores, memory="2g")
        try:
            with nc:
                cut = nc.worker_host(CUT)
                for i, case in enumerate(cases):
                    case["work"] = str(work / f"case{i}")
                    Path(case["work"]).mkdir(parents=True)
                    case["kill_executor_before"] = i > 0 and bool(cases[i - 1].get("kill_executor"))
                results = nc.run_driver(Path(__file__), {
                    "cases": cases, "cut_address": cut.address, "cut_netns": cut.netns, "switch": nc.network.switch,
                    "port": f"v-{CUT}"[:15]}, timeout=500, spark_conf=SPARK_CONF)["results"]
        except NetnsUnavailable as e:
            pytest.skip(f"no multi-host cluster: {e}")
    assert nc.leftovers == [], nc.leftovers
    for case, result in zip(cases, results):
        assert result["ok"], f"the driver program failed:\n{result['error']}"
        print(f"partition scenario (max_restarts={case['max_restarts']}, driver waiting in {case['wait']}): "
              f"driver case {result['secs']:.1f}s, "
              f"train() raised {result['raised_after_cut_secs']}s after the cut, "
              f"cut host's /dev/shm clean {result['shm_gone_secs']}s after the link returned "
              f"(held {result['shm_before']} during the feed, {result['shm_after']} at the end); "
              f"train() raised:\n{result['error']}")
    assert len(results) == len(cases), results
    print(f"partition scenarios: {time.monotonic() - t0:.1f}s in all")
    return results


def _case(max_restarts: int, hang_secs: float, wait: str = "send", kill_executor: bool = False,
          outlast_worker_timeout: bool = False) -> dict:
    return {"max_restarts": max_restarts, "hang_secs": hang_secs, "wait": wait, "kill_executor": kill_executor,
            "outlast_worker_timeout": outlast_worker_timeout}


@pytest.fixture(scope="module")
def cut_without_restart(tmp_path_factory):
    """The two max_restarts=0 scenarios, one after the other on one cluster (cores=2): the cut
    while feeding (the cut host's executor killed while the link is down), then the cut while
    the driver awaits an epoch."""
    return _scenarios(tmp_path_factory.mktemp("partition"), cores=2, cases=[
        _case(0, HANG_SECS, wait="send", kill_executor=True), _case(0, HANG_SECS, wait="await")])


def test_partition_while_feeding_fails_train_at_once_naming_node_and_host(cut_without_restart):
    """Items 8 and 9: train() raises the lost node's NodeError within heartbeat_timeout of the
    cut (the feeding Spark job, blocked sending to the unreachable node, is cancelled); the
    cut host's feed ring goes with its launcher when the host's executor ends while the link
    is still down, and nothing of the job is there once the link is back."""
    r = cut_without_restart[0]
    assert len(r["cut_nodes"]) == 1, r  # one node per host
    cut_address = r["cluster_spec"]["worker"][int(r["cut_nodes"][0].split(":")[1])]
    assert not r["hung"], f"train() still blocked {HANG_SECS:.0f}s after the cut: {r}"
    assert r["raised_after_cut_secs"] < HEARTBEAT_TIMEOUT + 15, r
    assert r["error_type"] == "NodeError" and r["error_lost"], r
    host = cut_address.rsplit(":", 1)[0]
    assert r["error_host"] == host and host in r["error"] and r["cut_nodes"][0] in r["error"], r
    assert "no heartbeat" in r["error"], r
    assert r["restarts"] == [], r
    # Item 9: the ring existed on the cut host during the feed; it went with its launcher, which
    # the executor's end killed while the link was still down; nothing is there after it returned.
    assert r["shm_before"], r
    assert r["shm_after_executor_killed"] == [], f"the cut host kept {r['shm_after_executor_killed']}"
    assert r["shm_after"] == [], f"the cut host still holds {r['shm_after']} after the link returned"


def test_partition_while_the_driver_awaits_an_epoch_fails_train_at_once(cut_without_restart):
    """Item 8, the other wait of train(): the driver fed epoch 0 and asks the nodes' feed
    servers whether they began it (a wait of feed_timeout) when the host is cut; train() still
    raises the lost node's NodeError within heartbeat_timeout of the cut."""
    r = cut_without_restart[1]
    assert len(r["cut_nodes"]) == 1, r
    host = r["cluster_spec"]["worker"][int(r["cut_nodes"][0].split(":")[1])].rsplit(":", 1)[0]
    assert not r["hung"], f"train() still blocked {HANG_SECS:.0f}s after the cut: {r}"
    assert r["raised_after_cut_secs"] < HEARTBEAT_TIMEOUT + 15, r
    assert r["error_type"] == "NodeError" and r["error_lost"] and r["error_host"] == host, r
    assert r["cut_nodes"][0] in r["error"] and host in r["error"], r
    assert r["shm_after"] == [], f"the cut host still holds {r['shm_after']} after the link returned"


def test_partition_with_restart_reports_the_cut_host_first_and_what_spark_said(tmp_path):
    """Item 10: max_restarts=1; the restarted gang cannot start (Spark places its node on the
    cut host, whose worker it drops WORKER_TIMEOUT seconds after the cut).  The restart is in
    Cluster.restarts, and the error leads with the node on the partitioned host, then says
    what Spark said of the new gang's job."""
    r = _scenarios(tmp_path, cores=4, cases=[_case(1, RESTART_HANG_SECS, outlast_worker_timeout=True)])[0]
    assert not r["hung"], f"train() still blocked {RESTART_HANG_SECS:.0f}s after the cut: {r}"
    host = r["cluster_spec"]["worker"][int(r["cut_nodes"][0].split(":")[1])].rsplit(":", 1)[0]
    assert r["error_type"] == "NodeError", r
    first_line = r["error"].splitlines()[0]
    assert r["cut_nodes"][0] in first_line and host in first_line and "was lost" in first_line, r
    assert len(r["restarts"]) == 1, r
    restart = r["restarts"][0]
    assert restart["node"] == r["cut_nodes"][0] and restart["host"] == host, restart
    assert restart["relaunch_secs"] is None and restart["error"], restart
    assert "restart 1 of 1" in r["error"] and "did not start" in r["error"], r
    # Spark's own words for the lost worker (the master's, or the driver's heartbeat check).
    assert "Spark failed the new gang's job" in r["error"], r
    assert "worker lost" in r["error"] or "heartbeat" in r["error"].split("did not start", 1)[1].lower(), r


def test_spark_failure_reason_is_the_stage_failure_in_one_line():
    """What the restart error quotes of a failed barrier job (Py4JJavaError's text), and
    nothing for a job the driver cancelled itself."""
    from ember._driver.spark_job import spark_failure_reason

    text = ("An error occurred while calling o85.collect.\n: org.apache.spark.SparkException: Job aborted due "
            "to stage failure: Could not recover from a failed barrier ResultStage. Most recent failure reason: "
            "Stage failed because barrier task ResultTask(3, 1) finished unsuccessfully.\nExecutorLostFailure "
            "(executor 1 exited caused by one of the running tasks) Reason: worker lost: Not receiving heartbeat "
            "for 60 seconds\nDriver stacktrace:\n\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndepen"
            "dentStages(DAGScheduler.scala:2856)\n")
    assert spark_failure_reason(RuntimeError(text)) == (
        "Could not recover from a failed barrier ResultStage. Most recent failure reason: Stage failed because "
        "barrier task ResultTask(3, 1) finished unsuccessfully. ExecutorLostFailure (executor 1 exited caused by "
        "one of the running tasks) Reason: worker lost: Not receiving heartbeat for 60 seconds")
    cancelled = ("An error occurred while calling o85.collect.\n: org.apache.spark.SparkException: Job 3 "
                 "cancelled part of cancelled job group ember-1-feed\n\tat org.apache.spark.Foo.bar(Foo.scala:1)")
    assert spark_failure_reason(RuntimeError(cancelled)) is None



def test_a_read_only_question_to_spark_is_asked_again_after_a_gateway_reset_only():
    """A Py4J connection reset under a read-only question (no answer from the JVM) is asked once
    more; an error the JVM raised is not, and neither is a second reset."""
    from py4j.protocol import Py4JError, Py4JJavaError

    from ember._driver.spark_side import _retrying_a_reset_gateway

    calls = []

    def reset_once():
        calls.append(1)
        if len(calls) == 1:
            raise Py4JError("An error occurred while calling o8901.resourceProfileManager")
        return 4

    assert _retrying_a_reset_gateway(reset_once, "the task slot count") == 4
    assert len(calls) == 2

    class FakeJavaError(Py4JJavaError):
        def __init__(self):
            Exception.__init__(self, "java.lang.IllegalStateException: stopped SparkContext")

        def __str__(self):
            return self.args[0]

    def java_error():
        calls.append(1)
        raise FakeJavaError()

    calls.clear()
    with pytest.raises(Py4JJavaError):
        _retrying_a_reset_gateway(java_error, "x")
    assert len(calls) == 1

    def always_reset():
        calls.append(1)
        raise Py4JError("An error occurred while calling o1.x")

    calls.clear()
    with pytest.raises(Py4JError):
        _retrying_a_reset_gateway(always_reset, "x")
    assert len(calls) == 2

if __name__ == "__main__":  # the driver program, run by NetnsCluster.run_driver in host "drv"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import test_partition  # by name, so that the node function pickles by reference

    test_partition.driver_main(sys.argv[1], sys.argv[2])
