"""Ember on a real multi-host Spark standalone cluster: network namespaces as hosts
(python/tests/netns_cluster.py).  Host "drv" runs the master and the driver program, hosts
h1 and h2 one worker each; they reach each other only through a bridge, each has a private
/dev/shm, so nodes on different hosts can talk only over TCP, as between machines.

One driver program (this file, run as a script in "drv") runs every case on one SparkContext,
to pay for the cluster's and the driver's start once; each test checks its case's results.
Skipped, saying why, only where the kernel or permissions refuse network namespaces.
"""
from __future__ import annotations

import json
import os
import re
import socket
import struct
import sys
import time
import traceback
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)

HOSTS = ("h1", "h2")
CLIENT = "cli"  # a host that no executor can dial: a Spark Connect client behind NAT or a firewall
# The driver's and executors' JVMs do little work here: C1 only and the serial GC start faster
# on a loaded 2-core machine (as the daemons' SPARK_DAEMON_JAVA_OPTS in spark_cluster.py).
_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
FAST_JVM = {"spark.driver.extraJavaOptions": _JVM_OPTS, "spark.executor.extraJavaOptions": _JVM_OPTS}


# ----------------------------------------------------------------------------- node programs
def _tcp_sockets(pids) -> dict:
    """This network namespace's IPv4 TCP sockets held by processes `pids`:
    {"established": [[local, remote], ...], "listening": [local, ...]} as "ip:port"."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])

    def addr(text: str) -> str:
        ip, port = text.split(":")
        return f"{socket.inet_ntoa(struct.pack('<I', int(ip, 16)))}:{int(port, 16)}"

    found = {"established": [], "listening": []}
    with open("/proc/self/net/tcp") as f:  # every socket of this network namespace
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[9] not in inodes:
                continue
            if fields[3] == "01":
                found["established"].append([addr(fields[1]), addr(fields[2])])
            elif fields[3] == "0A":
                found["listening"].append(addr(fields[1]))
    return found


def keras_on_hosts(args, ctx):
    """test_collective's Keras model.fit (DistributedOptimizer + SyncCallback), then what the
    node sees of the network while both nodes' communicators are still open."""
    from test_collective import keras_fit

    keras_fit(args, ctx)
    comm = ctx.communicator()
    facts = {
        "rank": ctx.training_rank,
        "own": ctx.cluster_spec[ctx.job_name][ctx.task_index],
        "peer_describe": comm.describe(1 - ctx.training_rank),
        "tcp": _tcp_sockets([os.getpid()])["established"],
        "shm": sorted(os.listdir("/dev/shm")),  # this host's own /dev/shm
    }
    # No node ends (closing its side of the ring) before the other one has looked: after this
    # barrier returns here, the other node has entered it, i.e. has taken its facts.
    comm.barrier()
    Path(args["out"], f"net-{ctx.training_rank}.json").write_text(json.dumps(facts))


def feed_on_hosts(args, ctx):
    """InputMode.SPARK training: reads the feed to its end, keeps what it got."""
    import numpy as np

    feed = ctx.get_data_feed()
    xs, ys = [], []
    while not feed.should_stop():
        cols = feed.next_batch_columns(64)
        if cols:
            xs.append(np.asarray(cols["x"]))
            ys.append(np.asarray(cols["y"]))
    x, y = np.concatenate(xs), np.concatenate(ys)
    own = ctx.cluster_spec[ctx.job_name][ctx.task_index]
    Path(args["out"], f"feed-{ctx.task_index}.json").write_text(json.dumps({
        "own": own, "rows": int(len(x)), "distinct": int(len(set(x.tolist()))),
        "listening": _tcp_sockets([os.getpid(), os.getppid()])["listening"],  # node's and launcher's
        "sum": int(x.sum()), "y_is_2x": bool((y == 2 * x).all())}))


# ----------------------------------------------------------------------------- driver cases
def case_keras(spark, work: Path) -> dict:
    import ember
    from conftest import no_leftovers

    out = work / "keras"
    out.mkdir()
    cluster = ember.Cluster.run(spark, keras_on_hosts, {"out": str(out)}, num_executors=2,
                                reservation_timeout=120, log_dir=str(out / "logs"))
    spec = cluster.cluster_spec
    cluster.shutdown(timeout=240)
    no_leftovers(cluster.job_id)
    return {"out": str(out), "cluster_spec": spec, "job_id": cluster.job_id}


def case_spark_mode(spark, work: Path) -> dict:
    import ember
    from conftest import no_leftovers
    from test_spark_mode import column_server

    out = work / "feed"
    out.mkdir()
    # Training feed: 4 partitions of 500 rows; each partition is spread evenly over both nodes,
    # so every feeding task feeds the node on the other host (over TCP: /dev/shm is per host).
    df = spark.range(0, 2000, numPartitions=4).selectExpr("id as x", "id * 2 as y")
    cluster = ember.Cluster.run(spark, feed_on_hosts, {"out": str(out)}, num_executors=2,
                                input_mode=ember.InputMode.SPARK, reservation_timeout=120)
    spec = cluster.cluster_spec
    cluster.train(df, num_epochs=1, feed_timeout=120)
    cluster.shutdown(timeout=120)
    no_leftovers(cluster.job_id)

    # Inference over a DataFrame: columns kept, order kept.
    cluster = ember.Cluster.run(spark, column_server, {}, num_executors=2,
                                input_mode=ember.InputMode.SPARK, reservation_timeout=120)
    try:
        idf = spark.range(0, 300, numPartitions=6).selectExpr("id as x", "concat('r', id) as name")
        rows = cluster.inference(idf, output_schema="double_x long, tag string", feed_timeout=120).collect()
    finally:
        cluster.shutdown(timeout=120)
    no_leftovers(cluster.job_id)
    return {"out": str(out), "cluster_spec": spec,
            "inference": [[r.x, r.name, r.double_x, r.tag] for r in rows]}


def case_node_killed(spark, work: Path) -> dict:
    import ember
    from conftest import no_leftovers
    from test_collective import node_dies_in_allreduce

    cluster = ember.Cluster.run(spark, node_dies_in_allreduce, {}, num_executors=2, reservation_timeout=120)
    spec = cluster.cluster_spec
    started = time.monotonic()
    try:
        cluster.shutdown(timeout=120)
        error = None
    except Exception as e:  # noqa: BLE001 - the test checks what it says
        error = f"{type(e).__name__}: {e}"
    secs = time.monotonic() - started
    no_leftovers(cluster.job_id)
    return {"cluster_spec": spec, "error": error, "detect_secs": secs}


def case_archive(spark, work: Path) -> dict:
    """Run by a second driver program whose executors run ./environment/bin/python from
    spark.archives (the node venv packed by `ember pack`): each node reports where its Ember
    came from."""
    import ember
    from conftest import no_leftovers

    out = work / "archive"
    out.mkdir()

    def where_is_ember(args, ctx):  # nested: shipped by value (the archive has no pytest)
        import json
        import sys

        import ember
        from ember import _ember

        with open(f"{args['out']}/{ctx.task_index}.json", "w") as f:
            json.dump({"ember": ember.__file__, "native": _ember.__file__, "prefix": sys.prefix,
                       "own": ctx.cluster_spec["worker"][ctx.task_index]}, f)

    cluster = ember.Cluster.run(spark, where_is_ember, {"out": str(out)}, num_executors=2, reservation_timeout=120)
    cluster.shutdown(timeout=120)
    no_leftovers(cluster.job_id)
    return {"reports": [json.loads((out / f"{i}.json").read_text()) for i in range(2)]}


CASES = {"keras": case_keras, "spark_mode": case_spark_mode, "node_killed": case_node_killed,
         "archive": case_archive}


def driver_main(inp: str, out: str) -> None:
    """The driver program: runs the cases of IN on a session built from IN's spark_conf and
    writes {case: {"ok", "secs", ... or "error"}} to OUT after each case."""
    from pyspark.sql import SparkSession

    conf = json.loads(Path(inp).read_text())
    if conf.get("pyspark_python"):  # what the executors run (PySpark reads only the environment)
        os.environ["PYSPARK_PYTHON"] = conf["pyspark_python"]
    builder = SparkSession.builder.appName("ember-multihost")
    for key, value in conf["spark_conf"].items():
        builder = builder.config(key, value)
    t0 = time.monotonic()
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # Spark hands a stage's tasks to executors round-robin, so once both executors are up the
    # two nodes of a job land on different hosts.
    deadline = time.monotonic() + conf["executors_timeout"]
    while spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() < 1 + conf["executors"]:  # + driver
        if time.monotonic() > deadline:
            raise TimeoutError(f"{conf['executors']} executors did not register within "
                               f"{conf['executors_timeout']}s")
        time.sleep(0.2)
    results = {"session_secs": time.monotonic() - t0}
    work = Path(conf["work"])
    try:
        for name in conf["cases"]:
            t0 = time.monotonic()
            try:
                results[name] = {"ok": True, **CASES[name](spark, work)}
            except Exception:  # noqa: BLE001 - reported to the test, which fails with it
                results[name] = {"ok": False, "error": traceback.format_exc()}
            results[name]["secs"] = time.monotonic() - t0
            Path(out).write_text(json.dumps(results))
    finally:
        spark.stop()


# ----------------------------------------------------------------------------- the tests
def test_hosts_reach_each_other_only_through_the_bridge():
    """The harness's own promises, without Spark: each host has its own loopback and
    /dev/shm, a host's listener is reachable from another host at its address only, tc
    settings land on the host's link, and nothing is left once the network is destroyed."""
    import subprocess

    from netns_cluster import NetnsNetwork, netns_unavailable_reason

    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(f"no multi-host cluster: {reason}")
    net = NetnsNetwork(["h1", "h2"], shaping={"h2": "tbf rate 1gbit burst 128kb latency 5ms"})
    try:
        net.create()
        h1, h2 = net.hosts["h1"], net.hosts["h2"]
        listener = h2.call(lambda: socket.create_server(("0.0.0.0", 0)))
        port = listener.getsockname()[1]
        with listener:
            def connect(address):
                try:
                    socket.create_connection((address, port), timeout=10).close()
                    return "connected"
                except OSError as e:
                    return type(e).__name__
            assert h1.call(lambda: connect(h2.address)) == "connected"
            assert h1.call(lambda: connect("127.0.0.1")) == "ConnectionRefusedError"  # h1's own lo
        assert not h1.address.startswith("127.") and h1.address != h2.address
        run = lambda host, cmd: subprocess.run([*host.prefix, "sh", "-c", cmd], capture_output=True,
                                               text=True, timeout=30, check=True).stdout
        assert run(h1, "touch /dev/shm/ember-probe && ls /dev/shm").split() == ["ember-probe"]
        assert run(h2, "ls /dev/shm").split() == []
        assert " tbf " in run(h2, "tc qdisc show dev eth0") and " tbf " not in run(h1, "tc qdisc show dev eth0")
    finally:
        net.destroy()
    assert net.leftovers() == []
    assert not os.path.exists("/dev/shm/ember-probe")


def _connect_client_nothing_dials(nc, work: Path) -> dict:
    """Issue 22: a Spark Connect server on "drv" against the cluster, and a client on host CLIENT
    that drops every connection made to it (nc.refuse_connections): the SPARK-mode job of
    test_connect.py, unchanged, with the coordinator's placement left to "auto"."""
    import subprocess

    from connect_server import ConnectServer
    from test_connect import SPARK_MODE

    nc.refuse_connections(CLIENT)
    conf = {k: v for k, v in {**nc.spark.spark_conf(), **FAST_JVM}.items() if k != "spark.master"}
    t0 = time.monotonic()
    server = ConnectServer(nc.spark.master_url, work / "connect-server.log", conf=conf, host=nc.driver_host,
                           env=nc.spark.env(nc.driver_host))
    try:
        client = nc.network.hosts[CLIENT]
        proc = subprocess.run([*client.prefix, sys.executable, "-c", SPARK_MODE, server.url], capture_output=True,
                              text=True, timeout=300, env=nc.spark.env(client), stdin=subprocess.DEVNULL)
        secs = time.monotonic() - t0
        # The relay ends with its agent (the client's job): nothing of it stays on the executors.
        deadline = time.monotonic() + 15
        while True:
            relays = [p for p in nc.network.processes() if b"ember._launcher.relay" in _cmdline(p)]
            if not relays or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr[-8000:],
                "relays_left": relays, "secs": secs, "server_log": server.log_tail(60)}
    finally:
        server.stop()


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ")
    except OSError:
        return b""


@pytest.fixture(scope="module")
def multihost(tmp_path_factory, spark_sessions):
    """Starts the namespaced cluster, runs the cases in one driver program (and the archive
    case in a second one, whose executors run the packed environment), tears everything down,
    and hands the tests the results, the hosts' addresses and what was left over."""
    import subprocess

    from netns_cluster import NetnsCluster, NetnsUnavailable
    from node_env import make_node_venv, pack_command

    spark_sessions.stop()  # not needed here, but frees the memory of this process's context
    work = tmp_path_factory.mktemp("multihost")
    t0 = time.monotonic()
    nc = NetnsCluster(hosts=HOSTS, cores_per_worker=2, memory="2g", clients=(CLIENT,))
    try:
        with nc:
            started = time.monotonic() - t0
            results = {"connect_relay": _connect_client_nothing_dials(nc, work)}
            cases = [c for c in CASES if c != "archive"]
            results.update(nc.run_driver(Path(__file__), {"work": str(work), "cases": cases,
                                                     "executors": len(HOSTS), "executors_timeout": 120},
                                    timeout=480, spark_conf=FAST_JVM))
            # The environment-shipping path: a second application whose executors get Ember
            # only from the archive, served by the driver's host to the workers' hosts.
            archive = work / "env.tar.gz"
            proc = subprocess.run(pack_command(make_node_venv(work / "node-venv"), archive),
                                  capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stderr
            results.update(nc.run_driver(
                Path(__file__), {"work": str(work), "cases": ["archive"], "executors": len(HOSTS),
                                 "executors_timeout": 120, "pyspark_python": "./environment/bin/python"},
                timeout=300, spark_conf={**FAST_JVM, "spark.archives": f"{archive}#environment"}))
            archive.unlink()
    except NetnsUnavailable as e:
        pytest.skip(f"no multi-host cluster: {e}")
    results.update(
        cluster_start_secs=started, total_secs=time.monotonic() - t0, leftovers=nc.leftovers,
        namespaces=nc.network.namespaces,
        addresses={label: nc.network.hosts[label].address for label in (nc.DRIVER, *HOSTS)})
    print(f"multihost timings: {json.dumps({k: v for k, v in results.items() if 'secs' in k})}, "
          + ", ".join(f"{c}: {results[c]['secs']:.1f}s" for c in CASES if c in results))
    return results


def _case(results: dict, name: str) -> dict:
    case = results.get(name)
    assert case is not None, f"the driver program did not reach case {name}: {results}"
    assert case["ok"], f"case {name} failed in the driver program:\n{case['error']}"
    return case


def _worker_hosts(results: dict) -> set:
    return {results["addresses"][h] for h in HOSTS}


def test_keras_sync_training_across_hosts_uses_tcp_collectives(multihost):
    import numpy as np

    case = _case(multihost, "keras")
    out = Path(case["out"])
    hosts = [a.rsplit(":", 1)[0] for a in case["cluster_spec"]["worker"]]
    # One node per host, each known by its namespace's address (never loopback).
    assert sorted(hosts) == sorted(_worker_hosts(multihost)), (hosts, multihost["addresses"])
    nets = [json.loads((out / f"net-{r}.json").read_text()) for r in range(2)]
    for r, net in enumerate(nets):
        me, peer = net["own"].rsplit(":", 1)[0], nets[1 - r]["own"].rsplit(":", 1)[0]
        assert me != peer and not me.startswith("127.")
        assert peer in net["peer_describe"], net
        # The collective ring is TCP from this host's address to the other host's: the node
        # process holds such a connection, and no collective shared memory exists on its host.
        assert any(lo.startswith(me + ":") and rem.startswith(peer + ":") for lo, rem in net["tcp"]), net
        assert not [n for n in net["shm"] if "-shm" in n], net
    # Synchronous training kept the replicas identical (same bits) and learnt something.
    w0, w1 = (np.load(out / f"weights-{r}.npz") for r in range(2))
    for k in w0.files:
        np.testing.assert_array_equal(w0[k], w1[k])
    h0, h1 = (json.loads((out / f"history-{r}.json").read_text()) for r in range(2))
    assert h0 == h1 and h0["loss"][-1] < h0["loss"][0], h0


def test_spark_input_mode_feeds_and_infers_across_hosts(multihost):
    case = _case(multihost, "spark_mode")
    out = Path(case["out"])
    fed = [json.loads((out / f"feed-{i}.json").read_text()) for i in range(2)]
    assert {f["own"].rsplit(":", 1)[0] for f in fed} == _worker_hosts(multihost), fed
    # Every row of the DataFrame reached exactly one node, y == 2x intact, 1000 per node.
    assert [f["rows"] for f in fed] == [1000, 1000] and all(f["distinct"] == 1000 for f in fed), fed
    assert sum(f["sum"] for f in fed) == sum(range(2000)) and all(f["y_is_2x"] for f in fed), fed
    # The node's launcher listens (its feed server) on the node's own address, not 0.0.0.0.
    for f in fed:
        host = f["own"].rsplit(":", 1)[0]
        assert f["listening"] and all(a.rsplit(":", 1)[0] == host for a in f["listening"]), f
    # Inference: every input row, in input order, columns kept, answered by a node.
    rows = case["inference"]
    assert [(x, name) for x, name, _, _ in rows] == [(i, f"r{i}") for i in range(300)]
    assert all(d == 2 * x for x, _, d, _ in rows)
    assert {t for *_, t in rows} <= {"worker:0", "worker:1"}


def test_node_killed_on_one_host_fails_the_job_naming_node_and_host(multihost):
    case = _case(multihost, "node_killed")
    killed_host = case["cluster_spec"]["worker"][1].rsplit(":", 1)[0]
    assert killed_host in _worker_hosts(multihost)
    error = case["error"]
    assert error is not None, "shutdown() raised nothing although worker:1 was SIGKILLed"
    assert "worker:1" in error and killed_host in error and "SIGKILL" in error, error
    # Detected from the node's exit, not by a timeout (the allreduce's is 60 s).
    assert case["detect_secs"] < 45, case


def test_executors_on_other_hosts_get_ember_only_from_the_archive(multihost):
    """`ember pack`'s archive shipped with spark.archives: on both worker hosts the nodes'
    Ember (package and native module) is the unpacked archive's, in the executor's directory."""
    case = _case(multihost, "archive")
    reports = case["reports"]
    assert {r["own"].rsplit(":", 1)[0] for r in reports} == _worker_hosts(multihost), reports
    for r in reports:
        env_dir = Path(r["prefix"])
        assert env_dir.name == "environment", r  # unpacked by Spark in the executor's work dir
        assert r["ember"].startswith(str(env_dir) + "/") and r["ember"].endswith("ember/__init__.py"), r
        assert r["native"].startswith(str(env_dir) + "/"), r


def test_a_connect_client_no_executor_can_dial_runs_its_job_through_a_relay(multihost):
    """Issue 22: the client's host drops every connection made to it.  An executor's try of the
    client's coordinator fails, so the nodes (and the feeding tasks) reach it through a relay the
    placement job starts on an executor and the client dials out to; training, ordered inference
    and the nodes' output work as with a reachable client, and the relay ends with the job."""
    case = multihost["connect_relay"]
    out = case["stdout"] + case["stderr"]
    found = [line for line in case["stdout"].splitlines() if line.startswith("RESULT ")]
    assert case["returncode"] == 0 and found, (f"client exited {case['returncode']}\n{out[-6000:]}\n"
                                               f"--- server log\n{case['server_log']}")
    r = json.loads(found[-1][len("RESULT "):])
    relay = re.search(r"through a relay at ([0-9.]+):\d+", out)
    assert relay and relay.group(1) in _worker_hosts(multihost), out[-4000:]
    assert r["seen"] == [[100, 100], [100, 100]], r
    expected = [i for i in range(37) if i % 5 != 0 or i < 10]
    assert [row[0] for row in r["rows"]] == expected  # order kept
    assert all(row[1] == f"r{row[0]}" and row[2] == 2 * row[0] for row in r["rows"])
    assert case["relays_left"] == [], case["relays_left"]


def test_nothing_is_left_after_teardown(multihost):
    """Namespaces, links and every process of the run are gone once the harness stopped."""
    assert multihost["leftovers"] == [], multihost["leftovers"]
    listed = os.popen("ip netns list").read()
    assert not [ns for ns in multihost["namespaces"] if ns in listed], listed


if __name__ == "__main__":  # the driver program, run by NetnsCluster.run_driver in host "drv"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import test_multihost  # by name, so that node functions pickle by reference

    test_multihost.driver_main(sys.argv[1], sys.argv[2])
