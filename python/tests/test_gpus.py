"""GPUs from Spark's own scheduling, on CPU machines: workers declare GPUs the way a GPU host's
do (spark.worker.resource.gpu.amount + a discovery script), and every node process must get
CUDA_VISIBLE_DEVICES = exactly its barrier task's GPUs, all distinct; fractional amounts share;
too few GPUs fail fast; an executor's own CUDA_VISIBLE_DEVICES is remapped; two nodes given one
GPU fail naming both.  No CUDA is needed: the nodes report what they were given.
"""
from __future__ import annotations

import json
import os
import time

import pytest

import ember
from conftest import LOCAL_MASTER, no_leftovers
from ember import _ember
from ember.errors import ClusterError, InvalidArgument
from spark_cluster import StandaloneCluster

pytestmark = pytest.mark.timeout(420)


def report_gpus(args, ctx):
    """Writes what the node was given: its CUDA_VISIBLE_DEVICES, device order and ctx.gpus."""
    seen = {"executor_id": ctx.executor_id, "label": f"{ctx.job_name}:{ctx.task_index}",
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "order": os.environ.get("CUDA_DEVICE_ORDER"),
            "gpus": ctx.gpus}
    with open(os.path.join(args["out"], f"{ctx.executor_id}.json"), "w") as f:
        json.dump(seen, f)


def run_and_collect(spark, out, num_nodes, **kwargs):
    out.mkdir()
    cluster = ember.Cluster.run(spark, report_gpus, {"out": str(out)}, num_executors=num_nodes,
                                reservation_timeout=120, **kwargs)
    cluster.shutdown(timeout=120)
    no_leftovers(cluster.job_id)
    return [json.loads((out / f"{i}.json").read_text()) for i in range(num_nodes)]


def test_the_bindings_ask_the_core():
    assert _ember.gpu_visible_devices(["1"], "6,7") == ["7"]
    assert _ember.gpu_visible_devices(["1"], None) == ["1"]
    with pytest.raises(InvalidArgument, match="hides every GPU"):
        _ember.gpu_visible_devices(["0"], "")
    with pytest.raises(InvalidArgument, match="w0 and w1 were both given GPU 3 of host h"):
        _ember.gpu_check_distinct([("w0", "h", ["3"]), ("w1", "h", ["3"])])
    with pytest.raises(ember.errors.NotFound, match="libember-absent"):
        _ember.gpu_uuids(["0"], library="libember-absent.so")


def test_local_mode_shares_out_the_drivers_gpus(spark_sessions, tmp_path):
    script = tmp_path / "gpus.sh"
    script.write_text("#!/bin/sh\necho '{\"name\": \"gpu\", \"addresses\": [\"3\", \"5\"]}'\n")
    script.chmod(0o755)
    conf = {"spark.driver.resource.gpu.amount": "2", "spark.driver.resource.gpu.discoveryScript": str(script)}
    spark = spark_sessions.get(LOCAL_MASTER, conf)
    jvm = spark.sparkContext._jvm
    try:
        nodes = run_and_collect(spark, tmp_path / "whole", 2, gpus_per_node=1)
        assert sorted(n["visible"] for n in nodes) == ["3", "5"]
        assert all(n["gpus"] == [n["visible"]] and n["order"] == "PCI_BUS_ID" for n in nodes)

        nodes = run_and_collect(spark, tmp_path / "shared", 4, gpus_per_node=0.5, log_dir=str(tmp_path / "tb"))
        assert sorted(n["visible"] for n in nodes) == ["3", "3", "5", "5"]
        # TensorBoard's Text tab names each node's GPUs, in the node's own run directory.
        import tensorflow as tf
        texts = {}
        for path in sorted((tmp_path / "tb").glob("worker_*/events.out.tfevents.*")):
            for event in tf.compat.v1.train.summary_iterator(str(path)):
                for v in event.summary.value:
                    if v.tag == "ember/gpus":
                        texts[path.parent.name] = tf.make_ndarray(v.tensor).item().decode()
        assert sorted(texts) == ["worker_0", "worker_1", "worker_2", "worker_3"], texts
        assert all(t.startswith(f"worker:{d[-1]}: CUDA_VISIBLE_DEVICES=") for d, t in texts.items()), texts

        with pytest.raises(ClusterError, match=r"3 nodes with 1 GPU each \(3 GPUs\), but local mode has 2 "
                                               r"\(spark.driver.resource.gpu: 3, 5\)"):
            ember.Cluster.run(spark, report_gpus, {"out": str(tmp_path)}, num_executors=3, gpus_per_node=1)
        with pytest.raises(ValueError, match="1/k"):
            ember.Cluster.run(spark, report_gpus, {"out": str(tmp_path)}, num_executors=2, gpus_per_node=0.3)

        # Without GPUs asked, nodes keep the environment they had.
        nodes = run_and_collect(spark, tmp_path / "none", 2)
        assert all(n["gpus"] == [] for n in nodes)
    finally:
        spark_sessions.stop()
        for key in conf:  # PySpark keeps a session's settings as JVM system properties
            jvm.java.lang.System.clearProperty(key)


def test_local_mode_without_gpus_says_what_to_set(spark):
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        pytest.fail("this test needs a driver without CUDA_VISIBLE_DEVICES")
    with pytest.raises(ClusterError, match="spark.driver.resource.gpu.amount"):
        ember.Cluster.run(spark, report_gpus, {"out": "/nonexistent"}, num_executors=2, gpus_per_node=1)


def test_gpus_of_a_standalone_cluster(spark_sessions, tmp_path):
    """Two workers of one host, each declaring two GPUs; the second worker's executors see
    physical GPUs 6 and 7 (a pre-set CUDA_VISIBLE_DEVICES) that its discovery script numbers 0
    and 1, so its nodes must get 6 and 7."""
    spark_sessions.stop()  # one SparkContext per process: make room for the cluster's
    with StandaloneCluster(num_workers=2, cores_per_worker=2, memory="2g", worker_gpus=[["0", "1"], ["0", "1"]],
                           worker_env=[None, {"CUDA_VISIBLE_DEVICES": "6,7"}]) as standalone:
        spark = standalone.session("ember-gpus", **{"spark.executor.resource.gpu.amount": "2"})
        try:
            nodes = run_and_collect(spark, tmp_path / "whole", 4, gpus_per_node=1)
            assert sorted(n["visible"] for n in nodes) == ["0", "1", "6", "7"], nodes
            assert all(n["gpus"] == [n["visible"]] and n["order"] == "PCI_BUS_ID" for n in nodes)

            nodes = run_and_collect(spark, tmp_path / "shared", 4, gpus_per_node=0.5)
            assert all(len(n["gpus"]) == 1 and n["visible"] in ("0", "1", "6", "7") for n in nodes), nodes

            # InputMode.SPARK: the feeding tasks need no GPU while the nodes hold them all.
            cluster = ember.Cluster.run(spark, gpu_square_server, {}, num_executors=2, gpus_per_node=1,
                                        input_mode=ember.InputMode.SPARK, reservation_timeout=120)
            try:
                rows = cluster.inference(spark.sparkContext.parallelize(range(200), 4)).collect()
                assert sorted(rows) == sorted(x * x for x in range(200))
            finally:
                cluster.shutdown(timeout=120)
            no_leftovers(cluster.job_id)

            started = time.monotonic()
            with pytest.raises(ClusterError) as too_few:
                ember.Cluster.run(spark, report_gpus, {"out": str(tmp_path)}, num_executors=3, gpus_per_node=2,
                                  slot_timeout=5)
            assert time.monotonic() - started < 60
            assert "3 nodes with 2 GPUs each (6 GPUs)" in str(too_few.value), too_few.value
            assert "offer 4 GPUs" in str(too_few.value) and "room for 2" in str(too_few.value), too_few.value
        finally:
            spark.stop()
        # The same from a Spark Connect client (issue 22): a Connect server's application on this
        # cluster, the nodes' GPUs asked through a stage-level resource profile.
        r = _connect_gpus(standalone, tmp_path)
        assert sorted(n["visible"] for n in r["nodes"]) == ["0", "1", "6", "7"], r
        assert all(n["gpus"] == [n["visible"]] for n in r["nodes"]), r
        no_leftovers(r["job_id"])
    assert standalone.processes() == []


CONNECT_GPUS = r'''
import json, os, sys
from pyspark.sql import SparkSession
import ember

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)

def report(args, ctx):
    with open(os.path.join(args["out"], f"{ctx.task_index}.json"), "w") as f:
        json.dump({"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpus": ctx.gpus}, f)

out = sys.argv[2]
cluster = ember.Cluster.run(spark, report, {"out": out}, num_executors=4, gpus_per_node=1, reservation_timeout=120)
cluster.shutdown(timeout=120)
print("RESULT " + json.dumps({"job_id": cluster.job_id,
                              "nodes": [json.load(open(os.path.join(out, f"{i}.json"))) for i in range(4)]}), flush=True)
'''


def _connect_gpus(standalone, tmp_path) -> dict:
    from connect_server import ConnectServer, run_client

    conf = {k: v for k, v in standalone.spark_conf().items() if k != "spark.master"}
    server = ConnectServer(standalone.master_url, tmp_path / "connect-server.log", env=standalone.env(),
                           conf={**conf, "spark.executor.resource.gpu.amount": "2"})
    try:
        out = tmp_path / "connect"
        out.mkdir()
        proc = run_client(CONNECT_GPUS, server.url, str(out), timeout=300)
        found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and found, (proc.stdout[-3000:], proc.stderr[-5000:], server.log_tail())
        return json.loads(found[-1][len("RESULT "):])
    finally:
        server.stop()


def gpu_square_server(args, ctx):
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(ctx.gpus) and len(ctx.gpus) == 1
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        batch = feed.next_batch(16)
        if batch:
            feed.batch_results([x * x for x in batch])


def test_two_nodes_given_one_gpu_fail_naming_both(spark_sessions, tmp_path):
    """Two workers of one host that both declare GPU 0 (TFoS #146/#280's two tasks on one GPU)."""
    spark_sessions.stop()
    with StandaloneCluster(num_workers=2, cores_per_worker=1, memory="1g", worker_gpus=[["0"], ["0"]]) as standalone:
        spark = standalone.session("ember-gpus-shared", **{"spark.executor.resource.gpu.amount": "1"})
        try:
            with pytest.raises(ClusterError) as shared:
                ember.Cluster.run(spark, report_gpus, {"out": str(tmp_path)}, num_executors=2, gpus_per_node=1,
                                  reservation_timeout=120)
            text = str(shared.value)
            assert "worker:0 (executor 0) and worker:1 (executor 1) were both given GPU 0 of host" in text, text
            assert "gpus_per_node=0.5" in text
            # On purpose, with a fractional amount, they may share it.
            nodes = run_and_collect(spark, tmp_path / "shared", 2, gpus_per_node=0.5)
            assert [n["visible"] for n in nodes] == ["0", "0"]
        finally:
            spark.stop()
    assert standalone.processes() == []
