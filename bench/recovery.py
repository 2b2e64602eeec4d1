#!/usr/bin/env python
"""Recovery from a lost node: Ember's automatic restart (Cluster.run(max_restarts=1)) against a
plain restart of the whole job from the same checkpoint, in the same run on the same Spark.

The job: 2 nodes train the Fashion-MNIST CNN of examples/fashion_mnist (Keras model.fit with
ember.keras.DistributedOptimizer + SyncCallback, 1 intra-op thread each) on synthetic images, with
a checkpoint of the weights after every epoch (the chief, np.savez + rename).  In epoch 1, after
--kill-after batches, node worker:1 SIGKILLs itself (its time of death is written just before).

  ember    one Cluster.run(..., max_restarts=1): the driver notices the failure, aborts the gang,
           starts a new one; the new nodes restore the checkpoint and train on.
  restart  the same job with max_restarts=0: shutdown() raises the node's error, and the driver
           program calls Cluster.run again (what a TFoS user does by hand); its nodes restore
           the same checkpoint and train on.

Both times are from the node's death to the first training step finished by every node of the
new gang (each node writes the wall time of its first step after a restore).  The split for
Ember: detect (death -> the driver learnt of it), stop (abort, Spark stage ended), relaunch
(new gang registered), restore (nodes started Python/TF, restored, first step).  --repeats
pairs, interleaved; medians.

Last line: recovery_secs: ember=<s> restart=<s> ratio=<ember/restart>

  .venv/bin/python bench/recovery.py                 # local[4], ~3 min
  .venv/bin/python bench/recovery.py --standalone    # a standalone cluster of 2 workers
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
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

    import ember.keras
    import train_single

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    out = Path(args["out"])
    rng = np.random.default_rng(ctx.executor_id)
    x = rng.random((args["rows"], 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, args["rows"])
    model = train_single.build_model(keras)
    model.compile(optimizer=ember.keras.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))  # the model ends in logits
    ckpt = out / "ckpt.npz"
    initial_epoch, restored = 0, ckpt.exists()
    if restored:
        saved = np.load(ckpt)
        initial_epoch = int(saved["epoch"])
        model.set_weights([saved[f"w{i}"] for i in range(len(model.get_weights()))])

    class Bench(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if restored and not getattr(self, "stamped", False):
                self.stamped = True
                (out / f"resumed-{ctx.training_rank}-{os.environ['EMBER_JOB_ID']}").write_text(repr(time.time()))
            if (not restored and self.epoch == 1 and batch == args["kill_after"] and ctx.training_rank == 1):
                (out / "died").write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)

        def on_epoch_end(self, epoch, logs=None):
            if ember.keras.is_chief():
                np.savez(out / "ckpt.tmp.npz", epoch=epoch + 1,
                         **{f"w{i}": w for i, w in enumerate(self.model.get_weights())})
                os.replace(out / "ckpt.tmp.npz", ckpt)

    model.fit(x, y, batch_size=args["batch"], epochs=args["epochs"], initial_epoch=initial_epoch,
              shuffle=False, callbacks=[ember.keras.SyncCallback(), Bench()], verbose=0)


def resumed_at(out: Path, job_id: str) -> float:
    return max(float((out / f"resumed-{r}-{job_id}").read_text()) for r in range(2))


def run_ember(spark, node_args, out: Path) -> dict:
    import ember
    cluster = ember.Cluster.run(spark, node_main, {**node_args, "out": str(out)}, num_executors=2,
                                reservation_timeout=300, max_restarts=1)
    cluster.shutdown(timeout=900)
    (r,) = cluster.restarts
    died, resumed = float((out / "died").read_text()), resumed_at(out, cluster.node_job_id)
    detect = r.failed_at - died
    return {"total": resumed - died, "detect": detect, "stop": r.stop_secs, "relaunch": r.relaunch_secs,
            "restore": resumed - died - detect - r.stop_secs - r.relaunch_secs}


def run_restart(spark, node_args, out: Path) -> dict:
    import ember
    from ember import errors
    cluster = ember.Cluster.run(spark, node_main, {**node_args, "out": str(out)}, num_executors=2,
                                reservation_timeout=300)
    try:
        cluster.shutdown(timeout=900)
        raise RuntimeError("the node did not die")
    except errors.NodeError:
        pass  # what the user's driver sees; it runs the job again
    failed_at = time.time()
    cluster = ember.Cluster.run(spark, node_main, {**node_args, "out": str(out)}, num_executors=2,
                                reservation_timeout=300)
    cluster.shutdown(timeout=900)
    died, resumed = float((out / "died").read_text()), resumed_at(out, cluster.job_id)
    return {"total": resumed - died, "detect": failed_at - died}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rows", type=int, default=1024, help="training images per node")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--kill-after", type=int, default=5, help="batches of epoch 1 before the kill")
    p.add_argument("--standalone", action="store_true", help="a standalone cluster instead of local[4]")
    args = p.parse_args()
    C.log(f"machine: {C.machine_info()}")
    node_args = {"rows": args.rows, "batch": args.batch, "epochs": args.epochs, "kill_after": args.kill_after,
                 "example_dir": str(EXAMPLE_DIR)}
    standalone = None
    if args.standalone:
        standalone = C.start_standalone(num_workers=2, cores_per_worker=2, memory="3g")
        spark = C.session(standalone, "ember-bench-recovery")
        C.wait_executors(spark.sparkContext, 2)
        where = f"standalone {standalone.master_url}"
    else:
        from pyspark.sql import SparkSession
        spark = SparkSession.builder.master("local[4]").appName("ember-bench-recovery").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        where = "local[4]"
    results = {"ember": [], "restart": []}
    try:
        for rep in range(args.repeats):
            for name, fn in (("ember", run_ember), ("restart", run_restart)):
                out = Path(tempfile.mkdtemp(prefix=f"ember-bench-recovery-{name}-"))
                try:
                    r = fn(spark, node_args, out)
                finally:
                    shutil.rmtree(out, ignore_errors=True)
                results[name].append(r)
                C.log(f"{name} repeat {rep + 1}: " + ", ".join(f"{k} {v:.2f}s" for k, v in r.items()))
    finally:
        spark.stop()
        if standalone is not None:
            standalone.stop()
    med = {name: {k: C.median([r[k] for r in runs]) for k in runs[0]} for name, runs in results.items()}
    print(f"\n{where}, {args.repeats} pairs; medians in seconds from the node's death to every node's first "
          f"step after the restore")
    for name in ("ember", "restart"):
        print(f"  {name:8s} " + "  ".join(f"{k} {v:.2f}" for k, v in med[name].items()))
    print(json.dumps(results))
    C.log(f"machine at end: {C.machine_info()}")
    print(f"recovery_secs: ember={med['ember']['total']:.2f} restart={med['restart']['total']:.2f} "
          f"ratio={med['ember']['total'] / med['restart']['total']:.2f}")


if __name__ == "__main__":
    main()
