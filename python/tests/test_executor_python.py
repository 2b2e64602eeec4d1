"""The README's snippet run as a new user runs it: a script started with the project's venv,
PYSPARK_PYTHON unset, so Spark's Python workers run `python3` from PATH, which has no Ember.
Cluster.run must fail at once with an error saying which Python the executors run and the fix,
not only "No module named 'ember'"."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

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
    assert sys.executable in error and "PYSPARK_PYTHON" in error and "spark.archives" in error, error
    assert f"PYSPARK_PYTHON={sys.executable}" in error  # local mode: the driver's interpreter
    assert "No module named 'ember'" in error  # the cause is still there
    assert "a node ran" not in out
