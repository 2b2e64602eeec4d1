"""Shared fixtures: real Spark sessions, and the check that a job left no process behind.

Only one SparkContext may exist per process, so tests get their session from
the session-scoped ``spark_sessions`` factory, which keeps the current context
while the master stays the same and replaces it when a test asks for another
master (e.g. a standalone cluster).  The ``spark`` fixture (local[4]) is
stopped at the end of each module that uses it.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import pytest

TESTS_DIR = Path(__file__).resolve().parent

# Executors run the venv's Python, and import test modules by name: main
# functions defined in tests are pickled by reference.  Spark's Python workers
# inherit PYTHONPATH from the JVM, which inherits it from this process, so set
# both before the first SparkContext starts.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
_pythonpath = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if str(TESTS_DIR) not in _pythonpath:
    os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR)] + _pythonpath)

LOCAL_MASTER = "local[4]"  # enough slots for the 4-node ps/chief/evaluator/worker layout


class SparkSessions:
    """Hands out the process's one SparkSession for a given master."""

    def __init__(self) -> None:
        self._session = None
        self._master: Optional[str] = None

    def get(self, master: str = LOCAL_MASTER, conf: Optional[Dict[str, str]] = None):
        """A SparkSession on `master`; stops the current one first if its master differs."""
        if self._session is not None and self._session.sparkContext._jsc is None:
            self._session, self._master = None, None  # stopped behind our back
        if self._session is not None and self._master == master and not conf:
            return self._session
        self.stop()
        from pyspark.sql import SparkSession

        builder = (SparkSession.builder.master(master).appName("ember-tests")
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.sql.shuffle.partitions", "4"))
        for key, value in (conf or {}).items():
            builder = builder.config(key, value)
        self._session = builder.getOrCreate()
        self._session.sparkContext.setLogLevel("ERROR")
        self._master = master
        return self._session

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()
            self._session = None
            self._master = None


@pytest.fixture(scope="session")
def spark_sessions():
    sessions = SparkSessions()
    yield sessions
    sessions.stop()


@pytest.fixture(scope="module")
def spark(spark_sessions):
    """A local[4] SparkSession shared by the tests of a module.

    Stopped after the module, so that a later module may start a context of its
    own (e.g. on a standalone cluster) with SparkSession.builder.getOrCreate().
    """
    yield spark_sessions.get(LOCAL_MASTER)
    spark_sessions.stop()


def processes_of_job(job_id: str) -> List[int]:
    """Pids of live processes whose environment has EMBER_JOB_ID=<job_id>."""
    marker = f"EMBER_JOB_ID={job_id}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue  # gone, or not ours to read
        if marker in env and state != b"Z":
            pids.append(int(entry))
    return pids


def shm_of_job(job_id: str) -> list:
    """Shared-memory segments named after job `job_id` (feed rings, result rings)."""
    try:
        return sorted(n for n in os.listdir("/dev/shm") if job_id in n)
    except FileNotFoundError:
        return []


def no_leftovers(job_id: str, timeout: float = 20.0) -> None:
    """Asserts that, within `timeout` seconds, no process of job `job_id` is alive and no
    shared-memory segment of it is left."""
    deadline = time.monotonic() + timeout
    while True:
        pids = processes_of_job(job_id)
        if not pids:
            break
        if time.monotonic() > deadline:
            details = []
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
                    details.append(f"{pid}: {cmdline[:200]}")
                except OSError:
                    details.append(str(pid))
            raise AssertionError(f"processes of job {job_id} still alive after {timeout}s:\n"
                                 + "\n".join(details))
        time.sleep(0.2)
    while shm_of_job(job_id):  # the last launcher may still be closing its ring
        if time.monotonic() > deadline:
            raise AssertionError(f"shared memory of job {job_id} left after {timeout}s: {shm_of_job(job_id)}")
        time.sleep(0.2)


@pytest.fixture(scope="session")
def hdfs():
    """A real HDFS (NameNode + DataNode on loopback, python/tests/hdfs_cluster.py), shared by the
    session's tests and stopped at its end; `make setup-hdfs` fetches its jars."""
    from hdfs_cluster import HdfsCluster
    with HdfsCluster() as cluster:
        yield cluster


@pytest.fixture
def spark_on_hdfs(spark, hdfs):
    """The module's SparkSession with fs.defaultFS and dfs.namenode.http-address naming `hdfs`
    for the test (restored after), as a cluster with HDFS configured would have them."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    saved = {k: conf.get(k) for k in ("fs.defaultFS", "dfs.namenode.http-address")}
    conf.set("fs.defaultFS", hdfs.default_fs)
    conf.set("dfs.namenode.http-address", hdfs.http_address)
    try:
        yield spark
    finally:
        for k, v in saved.items():
            if v is None:
                conf.unset(k)
            else:
                conf.set(k, v)
