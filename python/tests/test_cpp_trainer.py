"""The C++ trainer example (examples/cpp_trainer): a C++ program as the node, trained in
InputMode.SPARK on the Fashion-MNIST DataFrame on 2 nodes, then cluster.inference through
the same processes; under local[4] and on a standalone cluster."""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
from pathlib import Path

import pytest

from conftest import no_leftovers
from spark_cluster import StandaloneCluster

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(900)


def _load_run_module():
    spec = importlib.util.spec_from_file_location("cpp_trainer_run", REPO / "examples" / "cpp_trainer" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cpp_trainer() -> str:
    """Builds the program with `make cpp-trainer` (incremental) and returns its path."""
    subprocess.run(["make", "-C", str(REPO), "cpp-trainer"], check=True, timeout=600,
                   stdout=subprocess.DEVNULL)
    binary = REPO / "build" / "cpp_trainer" / "cpp_trainer"
    assert binary.is_file()
    return str(binary)


def _args(run_module, binary: str) -> argparse.Namespace:
    return run_module.parse_args(["--binary", binary, "--epochs", "3"])


def _check(result: dict) -> None:
    assert result["accuracy"] >= 0.80, result
    assert result["inference_rows"] == result["test_rows"] == 10_000, result  # one row per input
    no_leftovers(result["job_id"])


def test_cpp_trainer_under_local_mode(spark, cpp_trainer, tmp_path):
    run = _load_run_module()
    args = _args(run, cpp_trainer)
    args.log_dir = str(tmp_path / "logs")
    result = run.run(spark, args)
    print(f"local[4]: test_accuracy={result['accuracy']:.4f} ({result['train_secs']:.1f}s training)")
    _check(result)
    # Each C++ node wrote its own TensorBoard event file through Node::OpenSummaryWriter,
    # readable by TensorFlow's own reader: 3 epoch losses, falling, and batch losses.
    import tensorflow as tf
    for node in ("worker_0", "worker_1"):
        files = list((tmp_path / "logs" / node).glob("events.out.tfevents.*"))
        assert len(files) == 1, files
        scalars = {}
        for event in tf.compat.v1.train.summary_iterator(str(files[0])):
            for v in event.summary.value:
                value = v.simple_value if v.HasField("simple_value") else float(tf.make_ndarray(v.tensor))
                scalars.setdefault(v.tag, []).append((event.step, value))
        epochs = scalars["epoch/loss"]
        assert [s for s, _ in epochs] == [0, 1, 2], epochs
        assert epochs[-1][1] < epochs[0][1], epochs
        assert len(scalars["batch/loss"]) >= 3, scalars.keys()


def test_cpp_trainer_on_a_standalone_cluster(spark_sessions, cpp_trainer):
    spark_sessions.stop()  # one SparkContext per process: make room for the cluster's
    run = _load_run_module()
    with StandaloneCluster(num_workers=2, cores_per_worker=2, memory="2g") as standalone:
        spark = standalone.session("ember-cpp-trainer-test")
        try:
            result = run.run(spark, _args(run, cpp_trainer))
        finally:
            spark.stop()
    print(f"standalone: test_accuracy={result['accuracy']:.4f} ({result['train_secs']:.1f}s training)")
    _check(result)
    assert standalone.processes() == []
