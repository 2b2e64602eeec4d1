"""The check before the first nodes (ember._driver.spark_job.check_executor_python): Spark's Python
workers must import this driver's Ember, the same version with a loadable native module, or
Cluster.run fails at once with an error saying which Python the executors run, why, and the fix.

The first test runs the README's snippet as a new user runs it: a script started with the
project's venv, PYSPARK_PYTHON unset, so Spark's Python workers run `python3` from PATH, which has
no Ember.  The second gives the executors a Python without Ember and, on their PYTHONPATH, stub
`ember` packages: another version, no native module, a native module of another build."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

import ember

SCRIPT = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession
    import ember

    spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()

    def main_fun(args, ctx):
        print("a node ran")

    try:
        ember.Cluster.run(spark, main_fun, None, num_executors=2, reservation_timeout=60).shutdown(timeout=60)
    except ember.ClusterError as e:
        print("CLUSTER_ERROR_BEGIN")
        print(e)
        sys.exit(3)
    print("NO ERROR")
""")


def test_executors_without_ember_get_a_clear_error(tmp_path):
    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if system_python is None:
        pytest.skip("no python3 in /usr/bin or /bin to stand for an executor's Python without Ember")
    probe = subprocess.run([system_python, "-c", "import ember"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{system_python} can import ember; it cannot stand for an executor without it")
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")}
    env["PATH"] = "/usr/bin:/bin"  # python3 on PATH is the system's, as on an executor without Ember
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout
    assert proc.returncode == 3 and "CLUSTER_ERROR_BEGIN" in out, out[-2000:] + proc.stderr[-3000:]
    error = out.split("CLUSTER_ERROR_BEGIN", 1)[1]
    assert "cannot import Ember" in error, error
    assert "They run `python3` (PYSPARK_PYTHON is unset" in error, error
    assert f"which is {system_python} (Python " in error, error  # what python3 turned out to be
    assert sys.executable in error and "PYSPARK_PYTHON" in error and "spark.archives" in error, error
    assert "`ember pack`" in error and "./environment/bin/python" in error, error
    assert f"PYSPARK_PYTHON={sys.executable}" in error  # local mode: the driver's interpreter
    assert "Why: ModuleNotFoundError: No module named 'ember'" in error  # the cause
    assert "No node was launched" in error
    assert "a node ran" not in out


STUBS = {
    # another Ember: an older version
    "another version": ({"__init__.py": "__version__ = '0.0.1'\n"},
                        "it imports Ember 0.0.1 from {stub}/ember/__init__.py, not this driver's Ember {version}"),
    # this version's Python files, but no native module (a build that did not finish, a wheel
    # of another platform)
    "no native module": ({"__init__.py": "__version__ = {version!r}\n"},
                         "ImportError: cannot import name '_ember' from 'ember' ({stub}/ember/__init__.py)"),
    # a native module of another build of this version (it lacks the classes this driver has)
    "another build": ({"__init__.py": "__version__ = {version!r}\n", "_ember.py": "class Status: pass\n"},
                      "its native module {stub}/ember/_ember.py is another build of Ember {version}: it lacks "),
}


def test_another_ember_on_the_executors_is_caught(spark_sessions, tmp_path, monkeypatch):
    base_python = os.path.join(sys.base_prefix, "bin", "python3")
    if sys.prefix == sys.base_prefix or not os.access(base_python, os.X_OK):
        pytest.skip("needs the tests to run in a virtual environment over a base Python")
    if subprocess.run([base_python, "-c", "import ember"], capture_output=True).returncode == 0:
        pytest.skip(f"{base_python} can import ember; it cannot stand for an executor's Python")
    stub = tmp_path / "stub"
    spark_sessions.stop()
    # The executors run the venv's base Python (same version as the driver, no Ember) with the
    # stub on their PYTHONPATH; fresh Python workers per task, so each stub is imported anew.
    monkeypatch.setenv("PYSPARK_PYTHON", base_python)
    spark = spark_sessions.get("local[2]", conf={"spark.executorEnv.PYTHONPATH": str(stub),
                                                 "spark.python.worker.reuse": "false"})
    try:
        for name, (files, expected) in STUBS.items():
            shutil.rmtree(stub, ignore_errors=True)
            (stub / "ember").mkdir(parents=True)
            for fname, text in files.items():
                (stub / "ember" / fname).write_text(text.format(version=ember.__version__))
            with pytest.raises(ember.ClusterError) as info:
                ember.Cluster.run(spark, _never_runs, None, num_executors=2, reservation_timeout=60)
            error = str(info.value)
            assert "cannot import Ember" in error, (name, error)
            assert f"which is {base_python} (Python " in error, (name, error)
            assert expected.format(stub=stub, version=ember.__version__) in error, (name, error)
            assert "2 of 2 check tasks failed" in error and "No node was launched" in error, (name, error)
            assert f"PYSPARK_PYTHON={sys.executable}" in error, (name, error)
    finally:
        spark_sessions.stop()


def _never_runs(args, ctx):
    raise AssertionError("a node was launched although the executors' Ember is not this one")


def test_the_check_has_a_deadline(spark_sessions, tmp_path):
    """The check's job cannot run while the application's only task slot is busy: past its
    deadline it is cancelled and DeadlineExceeded names it."""
    import threading

    from ember._driver.spark_job import check_executor_python

    spark_sessions.stop()
    spark = spark_sessions.get("local[1]")
    sc = spark.sparkContext
    release, running = tmp_path / "release", tmp_path / "running"

    def hold_the_slot(_):
        import os
        import time
        open(str(running), "w").close()
        end = time.monotonic() + 120
        while not os.path.exists(str(release)) and time.monotonic() < end:
            time.sleep(0.05)
        yield 1

    def busy():
        sc.setJobGroup("ember-test-busy", "holds the only slot")
        sc.parallelize([0], 1).mapPartitions(hold_the_slot).collect()

    holder = threading.Thread(target=busy, daemon=True)
    holder.start()
    try:
        deadline = time.monotonic() + 120
        while not running.exists():  # the slot is taken once the task runs
            assert time.monotonic() < deadline, "the task holding the slot did not start within 120 s"
            time.sleep(0.05)
        with pytest.raises(ember.errors.DeadlineExceeded) as info:
            check_executor_python(sc, 1, 2.0)
        assert "the check that Spark's Python workers import Ember" in str(info.value)
        assert "did not end within 2s" in str(info.value) and "spark.ember.executorCheckTimeout" in str(info.value)
    finally:
        release.write_text("")
        holder.join(120)
        spark_sessions.stop()
    assert not holder.is_alive()
