"""Fashion-MNIST with Keras 3 ``model.fit``: train_single.py in one process, main.py on N nodes.

    python examples/fashion_mnist/train_single.py                  # one process
    python examples/fashion_mnist/main.py                          # Spark local[2], 2 nodes
    python examples/fashion_mnist/main.py --master spark://127.0.0.1:7077

Both read the TFRecord shards of data.py (train_single.py with tf.data, main.py with ember.data,
whose C++ reader also takes ``--data-dir hdfs://...``), train a small CNN, evaluate it on the
10,000 test images and print ``test_accuracy=<value>``.  main.py is train_single.py made
distributed with Ember's synchronous training (InputMode.TENSORFLOW: each node reads its own
shards); ``diff`` the two files to see what a user changes (python/tests/test_examples.py keeps
it under 10 lines).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import data  # noqa: E402  (examples/fashion_mnist/data.py)
import ember  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402


def build_model(keras):
    """Two conv blocks and a dense head: ~0.90 test accuracy after a few epochs."""
    return keras.Sequential([
        keras.Input(shape=(*data.IMAGE_SHAPE, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.3),
        keras.layers.Dense(data.NUM_CLASSES),
    ])


def main_fun(args, ctx):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    keras.utils.set_random_seed(args.seed)
    files = data.shard_paths(args.data_dir, "train")
    train = (ember.data.tfrecord_dataset(files, data.ember_features(), 500).map(data.parse_batch).unbatch().cache()
             .shuffle(30_000, seed=args.seed).batch(args.batch_size // ctx.num_workers).prefetch(2))
    test = ember.data.tfrecord_dataset(data.shard_paths(args.data_dir, "test"), data.ember_features(), 1000, shard=(0, 1)).map(data.parse_batch)

    model = build_model(keras)
    model.compile(optimizer=ember.keras.DistributedOptimizer(keras.optimizers.Adam(args.learning_rate)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    start = time.monotonic()
    history = model.fit(train, epochs=args.epochs, callbacks=[ember.keras.SyncCallback()], verbose=ember.keras.verbose(2))
    train_secs = time.monotonic() - start
    if not ember.keras.is_chief(): return  # noqa: E701  (only the chief evaluates and saves)

    test_loss, test_accuracy = model.evaluate(test, verbose=0)
    model.save(Path(args.model_dir) / "fashion_mnist.keras")
    metrics = {"test_accuracy": test_accuracy, "test_loss": test_loss, "train_secs": train_secs,
               "train_loss": history.history["loss"][-1], "epochs": args.epochs}
    (Path(args.model_dir) / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    print(f"test_accuracy={test_accuracy:.4f} (trained {train_secs:.1f}s)", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=128, help="global batch size")
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2, help="TensorFlow threads per process")
    p.add_argument("--data-dir", default=str(data.DEFAULT_DATA_DIR))
    p.add_argument("--model-dir", default=str(Path(__file__).resolve().parents[2] / "data" / "fashion_mnist_model"))
    p.add_argument("--master", default="local[2]", help="Spark master URL (main.py)")
    p.add_argument("--num-nodes", type=int, default=2, help="nodes (main.py)")
    args = p.parse_args(argv)
    data.convert(args.data_dir)  # the TFRecord shards, once
    Path(args.model_dir).mkdir(parents=True, exist_ok=True)
    args.data_dir, args.model_dir = data.absolute(args.data_dir), str(Path(args.model_dir).resolve())
    return args


if __name__ == "__main__":
    args = parse_args()
    ember.Cluster.run(SparkSession.builder.master(args.master).config("spark.submit.pyFiles", data.__file__).getOrCreate(), main_fun, args, num_executors=args.num_nodes).shutdown()
