#!/usr/bin/env python
"""Synchronous 2-node training throughput on Fashion-MNIST: Ember vs its peers, same run.

Contenders (each a 2-node Ember job on Spark local[2]; one TensorFlow/PyTorch thread per node;
the same CNN, the same per-node batch of in-memory Fashion-MNIST images):

  ember_keras   Keras 3 model.fit with ember.keras.DistributedOptimizer + SyncCallback
  mwms          the MultiWorkerMirroredStrategy custom training loop Ember's main job needed
                before (examples/fashion_mnist/mwms_custom_loop.py's loop: Keras 3 model.fit
                cannot run MWMS on 2 workers, keras-team/keras#20585)
  keras_local   model.fit on each node with no synchronization: the compute-only ceiling
  ember_torch   PyTorch loop with ember.torch.DistributedOptimizer
  ddp           PyTorch DistributedDataParallel with torch.distributed's gloo backend
  torch_local   the PyTorch loop without synchronization: its ceiling

`--overlap` instead compares ember.torch's two gradient paths on the same PyTorch CNN, by step
time per node (ms): torch_local (no sync), ember_torch_fused (overlap=False: one fused allreduce
per dtype in step(), after backward) and ember_torch (overlap=True: buckets of `--bucket-cap-mb`
reduced from autograd hooks while backward runs).  One 2-node job holds the three (a model and
optimizer each) and times them in turn (rotating which goes first), `--repeats` blocks of `--steps` steps each after a
barrier, so that the load of a shared machine drifts over all three alike; medians of the
blocks, averaged over the nodes.  The CNN's gradients are 0.9 MB, so DDP's 25 MB would make one
bucket sent in step(); the default here, 0.25 MB, makes two (the classifier's,
launched before the convolutions' backward).  `--transport tcp` puts the nodes' communicator on
loopback TCP instead of shared memory.  Last line:
  sync_overlap_step_ms: local=<ms> fused=<ms> overlap=<ms> hidden=<(fused-overlap)/(fused-local)>
(hidden from the medians of the per-block differences, each block's three runs back to back)

Each node times `--steps` steps after `--warmup` untimed ones; a contender's rate is the sum
over both nodes of samples/s.  Contenders run interleaved, `--repeats` times; medians.
The torch contenders need PyTorch (.torch-site/, `make setup-torch`); they are skipped with a
printed reason without it.  Last line:
  sync_training_samples_per_sec: ember_keras=<v> mwms=<v> ratio=<v> ember_torch=<v> ddp=<v> torch_ratio=<v>

  .venv/bin/python bench/sync_training.py                   # defaults: 3 repeats
  .venv/bin/python bench/sync_training.py --repeats 1 --steps 100 --only ember_keras,mwms
  .venv/bin/python bench/sync_training.py --overlap --repeats 15 --steps 40
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (sets PYTHONPATH/PYSPARK_PYTHON before Spark starts)

REPO = C.REPO
EXAMPLES = REPO / "examples" / "fashion_mnist"
TORCH_SITE = REPO / ".torch-site"
KERAS_MODES = ("ember_keras", "mwms", "keras_local")
TORCH_MODES = ("ember_torch", "ddp", "torch_local")
OVERLAP_MODES = ("torch_local", "ember_torch_fused", "ember_torch")


# ----------------------------------------------------------------------------- node code
def _shard(ctx, batch):
    """This node's share of the training images as float32 NHWC [0, 1] and int64 labels."""
    import numpy as np

    import data
    images, labels = data.load_split("train")
    n, k = ctx.num_workers, ctx.training_rank
    x = images[k::n].reshape(-1, 28, 28, 1).astype(np.float32) / 255.0
    y = labels[k::n].astype(np.int64)
    return x, y


def _write(args, ctx, rate, extra=None):
    extra = {"step_ms": 1000.0 * args["batch"] / rate, **(extra or {})}
    out = {"rate": rate, **extra}
    Path(args["out"], f"{args['mode']}-{args['run']}-{ctx.training_rank}.json").write_text(json.dumps(out))


def keras_node(args, ctx):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import train_single

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    batch, mode = args["batch"], args["mode"]
    # MWMS must be created before TensorFlow runs anything (set_random_seed does).
    strategy = tf.distribute.MultiWorkerMirroredStrategy() if mode == "mwms" else None
    keras.utils.set_random_seed(1)
    x, y = _shard(ctx, batch)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True).prefetch(2)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    if mode in ("ember_keras", "keras_local"):
        import ember.keras
        model = train_single.build_model(keras)
        opt = keras.optimizers.Adam(1e-3)
        callbacks = []
        if mode == "ember_keras":
            opt = ember.keras.DistributedOptimizer(opt)
            callbacks = [ember.keras.SyncCallback()]
        model.compile(optimizer=opt, loss=loss, metrics=["accuracy"])

        class Clock(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                if epoch == 1:
                    self.t0 = time.perf_counter()

            def on_train_end(self, logs=None):
                self.secs = time.perf_counter() - self.t0

        clock = Clock()
        # epoch 0 = warm-up (tracing, first allreduces); epoch 1 = the timed steps
        model.fit(ds, epochs=2, steps_per_epoch=args["steps"], callbacks=callbacks + [clock], verbose=0)
        _write(args, ctx, args["steps"] * batch / clock.secs)
        return

    # mwms: the custom loop of examples/fashion_mnist/mwms_custom_loop.py
    global_batch = batch * ctx.num_workers
    with strategy.scope():
        model = train_single.build_model(keras)
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def replica_step(b):
        images, labels = b
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            l = tf.nn.compute_average_loss(per_example(labels, logits), global_batch_size=global_batch)
        grads = tape.gradient(l, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return l

    @tf.function
    def train_steps(iterator, num_steps):
        total = tf.constant(0.0)
        for _ in tf.range(num_steps):
            total += strategy.experimental_local_results(strategy.run(replica_step, args=(next(iterator),)))[0]
        return strategy.reduce(tf.distribute.ReduceOp.SUM, total, axis=None)

    it = iter(ds)
    float(train_steps(it, tf.constant(args["warmup"])))
    t0 = time.perf_counter()
    float(train_steps(it, tf.constant(args["steps"])))
    _write(args, ctx, args["steps"] * batch / (time.perf_counter() - t0))


def _cnn(nn):
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * 5 * 5, 128), nn.ReLU(), nn.Dropout(0.3),
                         nn.Linear(128, 10))


def torch_node(args, ctx):
    sys.path.append(str(TORCH_SITE))
    import torch
    import torch.nn as nn

    torch.set_num_threads(1)
    torch.manual_seed(1)
    batch, mode = args["batch"], args["mode"]
    x, y = _shard(ctx, batch)
    x = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()
    y = torch.from_numpy(y)
    model = _cnn(nn)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    if mode == "ember_torch":
        import ember.torch
        ember.torch.broadcast_parameters(model)
        opt = ember.torch.DistributedOptimizer(opt, bucket_cap_mb=args["bucket_cap_mb"])
    elif mode == "ddp":
        import torch.distributed as dist
        dist.init_process_group("gloo")  # MASTER_ADDR etc. are set by Ember on every node
        model = nn.parallel.DistributedDataParallel(model)
    loss_fn = nn.CrossEntropyLoss()
    n = x.shape[0] // batch

    def steps(k, start):
        for i in range(start, start + k):
            j = (i % n) * batch
            opt.zero_grad()
            loss_fn(model(x[j:j + batch]), y[j:j + batch]).backward()
            opt.step()

    steps(args["warmup"], 0)
    t0 = time.perf_counter()
    steps(args["steps"], args["warmup"])
    _write(args, ctx, args["steps"] * batch / (time.perf_counter() - t0))
    if mode == "ddp":
        torch.distributed.destroy_process_group()


def overlap_node(args, ctx):
    """The three OVERLAP_MODES in one process, timed in turn: ms per step of each block."""
    sys.path.append(str(TORCH_SITE))
    import torch
    import torch.nn as nn

    import ember.torch

    torch.set_num_threads(1)
    comm = ctx.communicator(transport=args["transport"])  # the first call: ember.torch's default too
    batch = args["batch"]
    x, y = _shard(ctx, batch)
    x, y = torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(y)
    n, loss_fn = x.shape[0] // batch, nn.CrossEntropyLoss()
    runs = {}
    for mode in OVERLAP_MODES:
        torch.manual_seed(1)
        model = _cnn(nn)
        opt = torch.optim.Adam(model.parameters(), 1e-3)
        if mode != "torch_local":
            ember.torch.broadcast_parameters(model)
            opt = ember.torch.DistributedOptimizer(opt, overlap=mode == "ember_torch",
                                                   bucket_cap_mb=args["bucket_cap_mb"])
        runs[mode] = (model, opt, [0])

    def steps(mode, k):
        model, opt, at = runs[mode]
        for _ in range(k):
            j = (at[0] % n) * batch
            opt.zero_grad()
            loss_fn(model(x[j:j + batch]), y[j:j + batch]).backward()
            opt.step()
            at[0] += 1

    for mode in OVERLAP_MODES:
        steps(mode, args["warmup"])
    blocks = {m: [] for m in OVERLAP_MODES}
    for r in range(args["repeats"]):
        for mode in OVERLAP_MODES[r % 3:] + OVERLAP_MODES[:r % 3]:  # each first in turn
            comm.barrier()
            t0 = time.perf_counter()
            steps(mode, args["steps"])
            blocks[mode].append(1000.0 * (time.perf_counter() - t0) / args["steps"])
    Path(args["out"], f"overlap-{ctx.training_rank}.json").write_text(json.dumps(blocks))


# ----------------------------------------------------------------------------- driver
def run_one(spark, mode: str, run: int, args, out: Path, key: str = "rate") -> float:
    import ember

    fn = keras_node if mode in KERAS_MODES else torch_node
    node_args = {"mode": mode, "run": run, "out": str(out), "batch": args.batch_size, "steps": args.steps,
                 "warmup": args.warmup, "bucket_cap_mb": args.bucket_cap_mb}
    cluster = ember.Cluster.run(spark, fn, node_args, num_executors=2, reservation_timeout=120)
    cluster.shutdown(timeout=900)
    values = [json.loads((out / f"{mode}-{run}-{r}.json").read_text())[key] for r in range(2)]
    return sum(values) if key == "rate" else sum(values) / len(values)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=300, help="timed steps per node")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps first (torch, mwms)")
    p.add_argument("--batch-size", type=int, default=64, help="per-node batch")
    p.add_argument("--only", default="", help="comma-separated contenders (default: all)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--overlap", action="store_true",
                   help="compare ember.torch with and without overlap by step time (see the docstring)")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="ember.torch's bucket size (default 0.25 with --overlap, else DDP's 25)")
    p.add_argument("--transport", default="auto", choices=("auto", "tcp"),
                   help="with --overlap: the nodes' communicator (auto: shared memory on this host; tcp: loopback TCP)")
    args = p.parse_args(argv)
    if args.bucket_cap_mb is None:
        args.bucket_cap_mb = 0.25 if args.overlap else 25.0
    if args.overlap:
        return overlap_main(args)
    modes = [m for m in KERAS_MODES + TORCH_MODES if not args.only or m in args.only.split(",")]
    if any(m in TORCH_MODES for m in modes) and not (TORCH_SITE / ".installed").exists():
        C.log(f"torch contenders skipped: PyTorch is not installed in {TORCH_SITE} (make setup-torch)")
        modes = [m for m in modes if m not in TORCH_MODES]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, str(EXAMPLES))

    C.log(f"machine: {C.machine_info()}")
    spark = _spark()
    out = Path(tempfile.mkdtemp(prefix="ember-bench-sync-"))
    results = {m: [] for m in modes}
    try:
        for r in range(args.repeats):
            for m in modes:
                t = time.time()
                rate = run_one(spark, m, r, args, out)
                results[m].append(rate)
                C.log(f"repeat {r + 1} {m:12s} {rate:8.0f} samples/s (job {time.time() - t:.0f}s)")
    finally:
        spark.stop()
    med = {m: C.median(v) for m, v in results.items()}
    print()
    print(f"medians of {args.repeats} repeats, samples/s over 2 nodes (batch {args.batch_size} per node, "
          f"{args.steps} timed steps):")
    for m in modes:
        ceiling = med.get("keras_local" if m in KERAS_MODES else "torch_local", float("nan"))
        print(f"  {m:12s} {med[m]:8.0f}   of ceiling {med[m] / ceiling:.2f}   runs {[round(v) for v in results[m]]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "medians": med, "args": vars(args)}, indent=1))
    C.log(f"machine at end: {C.machine_info()}")
    nan = float("nan")
    ek, mw, et, dd = (med.get(k, nan) for k in ("ember_keras", "mwms", "ember_torch", "ddp"))
    print(f"sync_training_samples_per_sec: ember_keras={C.fmt_rate(ek)} mwms={C.fmt_rate(mw)} ratio={ek / mw:.2f} "
          f"ember_torch={C.fmt_rate(et)} ddp={C.fmt_rate(dd)} torch_ratio={et / dd:.2f}")


def _spark():
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").appName("bench-sync-training")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def overlap_main(args) -> None:
    """ember.torch overlap=True vs overlap=False vs no sync, by step time per node."""
    if not (TORCH_SITE / ".installed").exists():
        C.log(f"skipped: PyTorch is not installed in {TORCH_SITE} (make setup-torch)")
        return
    os.environ["PYTHONPATH"] = os.pathsep.join([str(EXAMPLES), os.environ.get("PYTHONPATH", "")])
    sys.path.insert(0, str(EXAMPLES))
    C.log(f"machine: {C.machine_info()}")
    spark = _spark()
    out = Path(tempfile.mkdtemp(prefix="ember-bench-overlap-"))
    import ember
    node_args = {"out": str(out), "batch": args.batch_size, "steps": args.steps, "warmup": args.warmup,
                 "repeats": args.repeats, "bucket_cap_mb": args.bucket_cap_mb, "transport": args.transport}
    t = time.time()
    try:
        cluster = ember.Cluster.run(spark, overlap_node, node_args, num_executors=2, reservation_timeout=120)
        cluster.shutdown(timeout=1800)
    finally:
        spark.stop()
    C.log(f"job {time.time() - t:.0f}s")
    nodes = [json.loads((out / f"overlap-{r}.json").read_text()) for r in range(2)]
    results = {m: [sum(b) / 2 for b in zip(*(node[m] for node in nodes))] for m in OVERLAP_MODES}
    med = {m: C.median(v) for m, v in results.items()}
    print()
    print(f"medians of {args.repeats} blocks of {args.steps} steps, ms per step, mean of 2 nodes "
          f"(batch {args.batch_size} per node, bucket_cap_mb {args.bucket_cap_mb}, transport {args.transport}):")
    for m in OVERLAP_MODES:
        print(f"  {m:18s} {med[m]:7.2f}   sync {med[m] - med['torch_local']:6.2f}   "
              f"blocks {[round(v, 1) for v in results[m]]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "medians": med, "args": vars(args)}, indent=1))
    C.log(f"machine at end: {C.machine_info()}")
    # Paired by block (the three ran back to back): the machine's drift cancels out.
    sync = C.median([f - l for f, l in zip(results["ember_torch_fused"], results["torch_local"])])
    saved = C.median([f - o for f, o in zip(results["ember_torch_fused"], results["ember_torch"])])
    print(f"paired medians: fused - local {sync:.2f} ms (the sync time), fused - overlap {saved:.2f} ms (hidden)")
    local, fused, overlap = med["torch_local"], med["ember_torch_fused"], med["ember_torch"]
    print(f"sync_overlap_step_ms: local={local:.2f} fused={fused:.2f} overlap={overlap:.2f} "
          f"hidden={saved / sync:.2f}")


if __name__ == "__main__":
    main()
