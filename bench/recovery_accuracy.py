#!/usr/bin/env python
"""Test accuracy of the main job's CNN on Fashion-MNIST with and without a lost node: the same
2-node synchronous Keras training (seeded) run undisturbed, and run with worker:1 SIGKILLed in the
middle of epoch 1 under Cluster.run(max_restarts=1), resuming from ember.keras.CheckpointCallback's
newest checkpoint (ember.keras.restore_latest).  Both runs evaluate on the 10,000 test images.

Data: Debian's dataset-fashion-mnist (IDX files), each node training on its half of the 60,000
training images (rank r takes images r, r+2, ...), batch 64 per node, Adam 1e-3, --epochs epochs,
1 intra-op thread per node, local[4].

Last line: recovery_accuracy: undisturbed=<acc> restarted=<acc> diff_points=<100 x (restarted - undisturbed)>

  .venv/bin/python bench/recovery_accuracy.py        # ~5 min
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (sets PYTHONPATH/PYSPARK_PYTHON before Spark starts)

EXAMPLE_DIR = C.REPO / "examples" / "fashion_mnist"


def node_main(args, ctx):
    import os
    import signal
    import sys

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, args["example_dir"])
    import keras
    import numpy as np
    import tensorflow as tf

    import data
    import ember.keras
    import train_single

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(args["seed"])
    out = Path(args["out"])
    images, labels = data.load_split("train")
    rank, n = ctx.training_rank, ctx.num_workers
    x = (images[rank::n].astype(np.float32) / 255.0)[..., None]
    y = labels[rank::n].astype(np.int64)
    model = train_single.build_model(keras)
    model.compile(optimizer=ember.keras.DistributedOptimizer(keras.optimizers.Adam(1e-3)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    initial_epoch = ember.keras.restore_latest(model, str(out / "ckpt"))

    class Killer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            marker = out / "killed"
            if args["kill"] and rank == 1 and self.epoch == 1 and batch == 200 and not marker.exists():
                marker.write_text("yes")
                os.kill(os.getpid(), signal.SIGKILL)

    model.fit(x, y, batch_size=64, epochs=args["epochs"], initial_epoch=initial_epoch, shuffle=True,
              callbacks=[ember.keras.SyncCallback(), ember.keras.CheckpointCallback(str(out / "ckpt"), keep=2),
                         Killer()], verbose=0)
    if ember.keras.is_chief():
        tx, ty = data.load_split("test")
        _, acc = model.evaluate((tx.astype(np.float32) / 255.0)[..., None], ty.astype(np.int64), verbose=0)
        (out / "accuracy.json").write_text(json.dumps({"accuracy": acc, "initial_epoch": initial_epoch}))


def run(spark, kill: bool, args) -> dict:
    import ember
    out = Path(tempfile.mkdtemp(prefix="ember-bench-recovery-acc-"))
    try:
        node_args = {"out": str(out), "kill": kill, "epochs": args.epochs, "seed": args.seed,
                     "example_dir": str(EXAMPLE_DIR)}
        cluster = ember.Cluster.run(spark, node_main, node_args, num_executors=2, reservation_timeout=300,
                                    max_restarts=1)
        cluster.shutdown(timeout=3600)
        result = json.loads((out / "accuracy.json").read_text())
        result["restarts"] = [r.node for r in cluster.restarts]
        return result
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    C.log(f"machine: {C.machine_info()}")
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.master("local[4]").appName("ember-bench-recovery-accuracy").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        calm = run(spark, False, args)
        C.log(f"undisturbed: {calm}")
        hit = run(spark, True, args)
        C.log(f"worker:1 killed in epoch 1: {hit}")
    finally:
        spark.stop()
    assert calm["restarts"] == [] and hit["restarts"] == ["worker:1"], (calm, hit)
    C.log(f"machine at end: {C.machine_info()}")
    print(f"recovery_accuracy: undisturbed={calm['accuracy']:.4f} restarted={hit['accuracy']:.4f} "
          f"diff_points={100 * (hit['accuracy'] - calm['accuracy']):+.2f}")


if __name__ == "__main__":
    main()
