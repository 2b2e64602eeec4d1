"""The C++ trainer on Ember: Spark feeds Fashion-MNIST to a C++ program on 2 nodes.

    make cpp-trainer                                   # builds build/cpp_trainer/cpp_trainer
    python examples/cpp_trainer/run.py                 # Spark local[4], 2 nodes
    python examples/cpp_trainer/run.py --master spark://127.0.0.1:7077

The nodes are the C++ program cpp_trainer.cc (no ML framework, no Python): softmax regression
with plain SGD, the nodes' parameters averaged every few steps through the job's key/value
store.  ``cluster.train`` feeds the training DataFrame (the Parquet files of
examples/fashion_mnist) for --epochs epochs; ``cluster.inference`` then runs the test DataFrame
through the same processes and returns it with a ``prediction`` column, from which Spark
computes the accuracy.  Prints ``test_accuracy=``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "fashion_mnist"))
import data  # noqa: E402  (examples/fashion_mnist/data.py)
from train_spark_mode import write_parquet  # noqa: E402  (the same Parquet files)

DEFAULT_BINARY = REPO / "build" / "cpp_trainer" / "cpp_trainer"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Fashion-MNIST softmax regression by a C++ Ember node")
    p.add_argument("--master", default="local[4]", help="Spark master URL")
    p.add_argument("--num-nodes", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per node")
    p.add_argument("--learning-rate", type=float, default=0.2)
    p.add_argument("--lr-decay", type=float, default=0.5, help="learning-rate factor per epoch")
    p.add_argument("--sync-every", type=int, default=50, help="steps between averaging rounds")
    p.add_argument("--binary", default=str(DEFAULT_BINARY), help="the cpp_trainer program")
    p.add_argument("--data-dir", default=str(data.DEFAULT_DATA_DIR))
    p.add_argument("--shutdown-timeout", type=float, default=600)
    p.add_argument("--log-dir", default=None, help="TensorBoard log dir (local or hdfs://); each node "
                   "writes <log-dir>/<job>_<index>")
    args = p.parse_args(argv)
    args.data_dir = str(Path(args.data_dir).resolve())
    return args


def run(spark, args) -> dict:
    """Trains and evaluates on `spark`; returns accuracy, row counts and timings."""
    import ember

    paths = write_parquet(Path(args.data_dir))
    train_df = spark.read.parquet(paths["train"]).cache()
    test_df = spark.read.parquet(paths["test"])
    argv = [args.binary, f"--epochs={args.epochs}", f"--batch-size={args.batch_size}",
            f"--learning-rate={args.learning_rate}", f"--lr-decay={args.lr_decay}",
            f"--sync-every={args.sync_every}"]
    t0 = time.monotonic()
    cluster = ember.Cluster.run(spark, argv, num_executors=args.num_nodes,
                                input_mode=ember.InputMode.SPARK, reservation_timeout=120,
                                log_dir=args.log_dir)
    try:
        cluster.train(train_df, num_epochs=args.epochs)
        t_train = time.monotonic()
        predictions = cluster.inference(test_df, output_schema="prediction long").cache()
        stats = predictions.selectExpr("count(*) as n",
                                       "avg(cast(prediction = label as double)) as acc").first()
        t_infer = time.monotonic()
    finally:
        cluster.shutdown(timeout=args.shutdown_timeout)
    return {"accuracy": stats["acc"], "inference_rows": stats["n"], "test_rows": test_df.count(),
            "train_secs": t_train - t0, "inference_secs": t_infer - t_train, "job_id": cluster.job_id}


def main(argv=None) -> float:
    args = parse_args(argv)
    if not os.path.exists(args.binary):
        subprocess.run(["make", "-C", str(REPO), "cpp-trainer"], check=True)
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(args.master).appName("ember-cpp-trainer")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    try:
        result = run(spark, args)
    finally:
        spark.stop()
    print(f"inference_rows={result['inference_rows']} of {result['test_rows']}")
    print(f"train_secs={result['train_secs']:.1f} inference_secs={result['inference_secs']:.1f} "
          f"({args.num_nodes} C++ nodes, {args.epochs} epochs, InputMode.SPARK)")
    print(f"test_accuracy={result['accuracy']:.4f}")
    return result["accuracy"]


if __name__ == "__main__":
    main()
