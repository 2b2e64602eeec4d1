"""Ember on a real Spark standalone cluster (master + 2 workers started by the harness):
nodes run in executor processes separate from the driver, in both input modes."""
from __future__ import annotations

import json
import os

import pytest

import ember
from conftest import no_leftovers
from spark_cluster import StandaloneCluster
from test_cluster import record_and_greet, record_then_block_if_not_training
from test_spark_mode import square_server

pytestmark = pytest.mark.timeout(420)


def test_both_input_modes_on_a_standalone_cluster(spark_sessions, tmp_path):
    spark_sessions.stop()  # one SparkContext per process: make room for the cluster's
    with StandaloneCluster(num_workers=2, cores_per_worker=2, memory="2g") as standalone:
        spark = standalone.session("ember-standalone-test")
        try:
            # InputMode.TENSORFLOW: two nodes, each in an executor's process tree.
            out = tmp_path / "tf"
            out.mkdir()
            cluster = ember.Cluster.run(spark, record_and_greet, {"out": str(out)}, num_executors=2,
                                        reservation_timeout=120)
            cluster.shutdown(timeout=120)
            infos = [json.loads((out / f"worker-{i}.json").read_text()) for i in range(2)]
            assert {i["executor_id"] for i in infos} == {0, 1}
            assert all(i["tf_config"]["cluster"] == infos[0]["cluster_spec"] for i in infos)
            assert all(i["ppid"] != os.getpid() for i in infos)
            no_leftovers(cluster.job_id)

            # InputMode.SPARK: inference of x² through the feed, order kept (TFoS parity).
            cluster = ember.Cluster.run(spark, square_server, {}, num_executors=2,
                                        input_mode=ember.InputMode.SPARK, reservation_timeout=120)
            try:
                result = cluster.inference(spark.sparkContext.parallelize(range(1000), 10)).collect()
                assert result == [x * x for x in range(1000)]
            finally:
                cluster.shutdown(timeout=120)
            no_leftovers(cluster.job_id)

            # driver_ps_nodes (TFoS): the ps node runs in the driver's host, its launcher on a
            # driver thread, so 5 nodes fit the cluster's 4 task slots; shutdown stops the ps.
            out = tmp_path / "driver_ps"
            out.mkdir()
            cluster = ember.Cluster.run(spark, record_then_block_if_not_training, {"out": str(out)},
                                        num_executors=5, num_ps=1, driver_ps_nodes=True, reservation_timeout=120)
            cluster.shutdown(timeout=120)
            ps = json.loads((out / "ps-0.json").read_text())
            workers = [json.loads((out / f"worker-{i}.json").read_text()) for i in range(4)]
            assert ps["executor_id"] == 0 and ps["ppid"] == os.getpid(), ps  # a child of the driver
            assert sorted(w["executor_id"] for w in workers) == [1, 2, 3, 4]
            assert all(w["ppid"] != os.getpid() for w in workers)  # in the executors' process trees
            assert all(w["tf_config"]["cluster"]["ps"] == ps["cluster_spec"]["ps"] for w in workers)
            no_leftovers(cluster.job_id)
        finally:
            spark.stop()
    assert standalone.processes() == []
