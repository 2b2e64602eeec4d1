"""Fashion-MNIST on Ember, InputMode.SPARK: Spark feeds the data, Spark gets the predictions.

    python examples/fashion_mnist/train_spark_mode.py               # Spark local[4], 2 nodes
    python examples/fashion_mnist/train_spark_mode.py --master spark://127.0.0.1:7077
    SPARK_API_MODE=connect python examples/fashion_mnist/train_spark_mode.py   # from a Spark Connect client

The data lives where a data team keeps it: Parquet files (written once from the Debian IDX
files), read as a DataFrame of ``image`` (784 raw bytes) and ``label``.  ``cluster.train``
feeds it to 2 nodes that train the CNN of train_single.py with Keras ``model.fit`` and Ember's
synchronous training (every node gets the same number of batches per epoch, so the gradient
allreduce of every step has all its peers);
``cluster.inference`` then runs the test DataFrame through the trained nodes and returns it
with a ``prediction`` column; the accuracy is computed from that DataFrame by Spark.

Nodes hold 2 task slots for their lifetime; feeding tasks need more, hence local[4].
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data  # noqa: E402
import ember  # noqa: E402
import train_single as single  # noqa: E402  (the model, shared with the TENSORFLOW-mode twins)

REPO = Path(__file__).resolve().parents[2]


def write_parquet(data_dir: Path, num_files: int = 8) -> dict:
    """The Debian IDX files as Parquet: image (binary, 784 bytes) + label (int); once."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = {}
    for split in ("train", "test"):
        split_dir = data_dir / f"{split}.parquet"
        out[split] = str(split_dir)
        if split_dir.is_dir() and any(split_dir.glob("*.parquet")):
            continue
        images, labels = data.load_split(split)
        tmp = data_dir / f".{split}.parquet.tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        files = num_files if split == "train" else 2
        for i, idx in enumerate(range(0, len(labels), -(-len(labels) // files))):
            chunk = slice(idx, idx + -(-len(labels) // files))
            flat = images[chunk].reshape(len(labels[chunk]), -1)
            table = pa.table({"image": pa.array([row.tobytes() for row in flat], pa.binary()),
                              "label": pa.array(labels[chunk].astype("int64"))})
            pq.write_table(table, tmp / f"part-{i:05d}.parquet")
        os.replace(tmp, split_dir)
    return out


def main_fun(args, ctx):
    """Trains from the feed with Keras model.fit, then answers inference requests."""
    import keras
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(args.seed)
    per_node_batch = args.batch_size // ctx.num_workers

    def to_xy(cols):
        x = cols["image"].reshape(-1, 28, 28, 1).astype(np.float32) / 255.0
        return x, cols["label"].astype(np.int64)

    # Each pass over the dataset is one epoch of cluster.train: the same number of full
    # batches on every node, so every step's gradient allreduce has all its peers.
    train = ctx.get_data_feed(train_mode=True).to_tf_dataset(per_node_batch, transform=to_xy).prefetch(2)
    model = single.build_model(keras)
    model.compile(optimizer=ember.keras.DistributedOptimizer(keras.optimizers.Adam(args.learning_rate)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(train, epochs=args.epochs, callbacks=[ember.keras.SyncCallback(), ember.keras.ProgressCallback(ctx)],
              verbose=ember.keras.verbose(2))

    # Inference: partitions of the test DataFrame arrive here; answer every row.
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        cols = feed.next_batch_columns(1000)
        if cols:
            logits = model.predict_on_batch(to_xy(cols)[0])
            feed.batch_results({"prediction": np.argmax(logits, axis=1).astype(np.int64)})
    ctx.barrier("spark_mode_done", timeout=600)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Fashion-MNIST CNN on Ember (InputMode.SPARK)")
    p.add_argument("--master", default="local[4]", help="Spark master URL")
    p.add_argument("--num-nodes", type=int, default=2)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=128, help="global batch size")
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--data-dir", default=str(data.DEFAULT_DATA_DIR))
    p.add_argument("--shutdown-timeout", type=float, default=1800)
    args = p.parse_args(argv)
    args.data_dir = str(Path(args.data_dir).resolve())
    return args


def main(argv=None) -> float:
    t0 = time.monotonic()
    args = parse_args(argv)
    paths = write_parquet(Path(args.data_dir))

    import ember
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Nothing here needs a SparkContext, so the same program runs on a classic session and on a
    # Spark Connect one (SPARK_API_MODE=connect, or .remote(...) in place of .master(...)).
    spark = (SparkSession.builder.master(args.master).appName("ember-fashion-mnist-spark-mode")
             .config("spark.ui.showConsoleProgress", "false").config("spark.log.level", "WARN").getOrCreate())
    for module in (data, single):  # main_fun uses them on the nodes (one per call: pyspark 4.0's classic
        spark.addArtifacts(str(Path(module.__file__).resolve()), pyfile=True)  # form takes one at a time)
    try:
        train_df = spark.read.parquet(paths["train"]).cache()
        test_df = spark.read.parquet(paths["test"])
        print(f"train: {train_df.count()} rows", flush=True)
        cluster = ember.Cluster.run(spark, main_fun, args, num_executors=args.num_nodes,
                                    input_mode=ember.InputMode.SPARK, reservation_timeout=120)
        try:
            t_train = time.monotonic()
            cluster.train(train_df, num_epochs=args.epochs)
            predictions = cluster.inference(test_df, output_schema="prediction long")
            accuracy = predictions.selectExpr("avg(cast(prediction = label as double)) as acc").first()["acc"]
        finally:
            cluster.shutdown(timeout=args.shutdown_timeout)
        run_secs = time.monotonic() - t_train
    finally:
        spark.stop()
    print(f"test_accuracy={accuracy:.4f}")
    print(f"wall_secs={time.monotonic() - t0:.1f} (train+inference {run_secs:.1f}, {args.num_nodes} nodes, "
          f"{args.epochs} epochs, InputMode.SPARK)")
    return accuracy


if __name__ == "__main__":
    main()
