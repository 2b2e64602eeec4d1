"""The standalone-cluster harness itself: it starts, runs a job on separate executors, and leaves
no process behind."""

from __future__ import annotations

import os
import time

import pytest

from spark_cluster import StandaloneCluster, StandaloneClusterError


def _java_pids_under(path: str) -> list[int]:
    """Java processes whose command line or working directory mentions ``path``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if "java" in cmdline and (path in cmdline or cwd.startswith(path)):
            pids.append(int(entry))
    return pids


@pytest.mark.timeout(240)
def test_standalone_cluster_runs_job_and_cleans_up():
    cluster = StandaloneCluster(num_workers=2, cores_per_worker=1, memory="1g")
    with cluster:
        base_dir = str(cluster.base_dir)
        assert cluster.master_url.startswith("spark://127.0.0.1:")
        state = cluster.master_state()
        assert state["aliveworkers"] == 2, state
        assert sorted(w["cores"] for w in state["workers"]) == [1, 1]
        daemons = cluster.processes()
        assert len(daemons) >= 3, daemons  # master + 2 workers

        spark = cluster.session("ember-harness-test")
        try:
            sc = spark.sparkContext
            assert sc.master == cluster.master_url
            assert sc.parallelize(range(100), 4).map(lambda x: x * x).sum() == 328350
            executor_pids = set(sc.parallelize(range(4), 4).map(lambda _: os.getpid()).collect())
            assert os.getpid() not in executor_pids
            assert cluster.master_state()["activeapps"], "the job did not run as a cluster app"
            # Executors are JVMs of their own, started by the workers under the harness's dir.
            assert len(_java_pids_under(base_dir)) >= 3 + 2
            # Python workers run on the executors, as children of the marked processes.
            assert executor_pids & set(cluster.processes())
        finally:
            spark.stop()

    assert cluster.processes() == []
    assert _java_pids_under(base_dir) == []
    assert not os.path.exists(base_dir)


@pytest.mark.timeout(120)
def test_start_timeout_names_the_missing_workers():
    # A worker given a malformed memory size exits at once: a clear error naming it, and no
    # process left behind.
    cluster = StandaloneCluster(num_workers=1, memory="not-a-size", start_timeout=60)
    start = time.monotonic()
    with pytest.raises(StandaloneClusterError) as err:
        cluster.start()
    assert time.monotonic() - start < 60
    assert "worker-0" in str(err.value)
    assert cluster.processes() == []
