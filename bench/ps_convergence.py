#!/usr/bin/env python
"""Fashion-MNIST test accuracy: async training through Ember's parameter server vs sync training.

Issue 21's convergence item, on the real Fashion-MNIST: the same model, seed, epochs and
per-worker batch for every variant, each variant one real Ember job on Spark.

Variants (each --workers training nodes; the async ones add 1 ps node serving one shard):
  sync      ember.keras.DistributedOptimizer + SyncCallback (global batch = workers x batch)
  downpour  AsyncCallback(algorithm="downpour", frequency=--window)
  adag      AsyncCallback(algorithm="adag", frequency=--adag-window)   (default 5, DOWNPOUR's window:
            at dist-keras's 12 the delta divided by 12 moves the center too little in 5 epochs)
  easgd     AsyncCallback(algorithm="easgd", frequency=--easgd-window, alpha=--alpha)
            (dist-keras's AEASGD: window 32, alpha = rho x eta = 5 x 0.1 = 0.5)
  ssp2      AsyncCallback(algorithm=--ssp-algorithm (default "downpour"), frequency=--ssp-window
            (default --window), ssp=2)

Data: Debian's dataset-fashion-mnist through examples/fashion_mnist/data.py; every worker trains
on its shard of the 60,000 training images (rank r takes images r, r+W, ...), --batch-size per
worker, full batches only (tf.data, reshuffled every epoch, seeded): the same steps per epoch on
every worker, checked (the batches each worker ran are counted).  Model: an MLP
784-128(relu)-10 (the examples' CNN needs ~40 s per epoch per node on one thread here: 5 variants
would not fit in 10 minutes), Adam(--lr) on every worker (for the async variants, --async-lr and
--adag-lr if given: the local optimizer whose steps become the pushed delta), 1 intra-op thread per
node.  After training,
worker 0 evaluates on the 10,000 test images: for sync its model, for the async variants the
shards' weights once every worker's last push is in (for easgd: the center variable, as
dist-keras returns); it also reads the shard's staleness histogram.  Results travel through the
job's KV store.  Per variant it prints accuracy, test loss, seconds in fit and for the whole job,
the workers' start/end skew (wall clock), exchanges per worker, the shard's pushes (one per tensor
per exchange), the longest SSP wait and the staleness histogram (shard updates between a push's
pull and the push; the last bucket counts 16 and more).

Last line: ps_convergence: downpour=<pt> adag=<pt> easgd=<pt> ssp2=<pt> (goals 1.0/1.0/1.0/0.5) met=<k>/<n>
(points = 100 x (variant accuracy - sync accuracy), means over --repeats; a goal is met when the
variant is no more than its goal below sync).

  .venv/bin/python bench/ps_convergence.py        # ~2 min (each variant ~20 s); --repeats 3: ~6 min
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (sets PYTHONPATH/PYSPARK_PYTHON before Spark starts)

EXAMPLE_DIR = C.REPO / "examples" / "fashion_mnist"
VARIANTS = ("sync", "downpour", "adag", "easgd", "ssp2")
GOALS = {"downpour": 1.0, "adag": 1.0, "easgd": 1.0, "ssp2": 0.5}  # points below sync, at most
RESULT_KEY = "bench/ps_convergence/result"


def node_main(args, ctx):
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.path.insert(0, args["example_dir"])
    import keras
    import numpy as np
    import tensorflow as tf

    import data  # examples/fashion_mnist/data.py
    import ember.keras
    import ember.ps

    if ctx.job_name == "ps":
        ember.ps.serve(ctx)  # until cluster.shutdown() stops the node
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(args["seed"])
    variant = args["variant"]
    rank, n = ctx.training_rank, ctx.num_workers
    images, labels = data.load_split("train")
    x = images[rank::n].reshape(-1, 784).astype(np.float32) / 255.0
    y = labels[rank::n].astype(np.int64)
    steps = min(len(images[r::n]) for r in range(n)) // args["batch_size"]  # equal on every worker
    # Reshuffled every epoch (seeded), only full batches: `steps` per epoch on every worker.
    train = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y), seed=args["seed"] + rank)
             .batch(args["batch_size"], drop_remainder=True).take(steps).prefetch(2))

    model = keras.Sequential([keras.Input(shape=(784,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(data.NUM_CLASSES)])
    optimizer = keras.optimizers.Adam(args["lr"])
    ps = None
    if variant == "sync":
        optimizer = ember.keras.DistributedOptimizer(optimizer)
        callback = ember.keras.SyncCallback()
    else:
        ps = ember.ps.connect(ctx, timeout=120)
        knobs = {"downpour": dict(algorithm="downpour", frequency=args["window"]),
                 "adag": dict(algorithm="adag", frequency=args["adag_window"]),
                 "easgd": dict(algorithm="easgd", frequency=args["easgd_window"], alpha=args["alpha"]),
                 "ssp2": dict(algorithm=args["ssp_algorithm"], frequency=args["ssp_window"], ssp=2)}[variant]
        callback = ember.keras.AsyncCallback(ps, **knobs)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    batches = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: batches.append(batch))
    start, fit_start = time.monotonic(), time.time()  # wall clock too: the workers' skew (one host)
    history = model.fit(train, epochs=args["epochs"], callbacks=[callback, counter], verbose=0)
    train_secs, fit_end = time.monotonic() - start, time.time()

    comm = ctx.communicator()
    mine = {"train_secs": train_secs, "fit_start": fit_start, "fit_end": fit_end,
            "train_loss": float(history.history["loss"][-1]), "batches": len(batches)}
    if ps is not None:
        ex = callback.exchange
        shared = sum("float" in str(v.dtype) for v in model.weights)  # Exchange counts a push per tensor
        mine.update(exchanges=ex.pushes // shared, rejected=ex.rejected, ssp_waited_secs=ex.waited_secs)
    kv = ctx._coordinator_client()
    kv.kv_set(f"{RESULT_KEY}/worker/{rank}", json.dumps(mine).encode())
    comm.barrier()  # every worker's last push is in
    if rank != 0:
        return
    result = {"variant": variant, "steps_per_epoch": steps, "epochs_run": len(history.history["loss"])}
    if ps is not None:
        for v in model.weights:  # the shard's weights (easgd: the center variable)
            if "float" in str(v.dtype):
                v.assign(ps.pull("model/" + v.path, shape=tuple(v.shape))[0])
        stats = ps.stats()
        result["histogram"] = [int(sum(h)) for h in zip(*(s.staleness_histogram for s in stats))]
        result["pushes_applied"] = int(sum(s.pushes_applied for s in stats))
        result["pushes_rejected"] = int(sum(s.pushes_rejected for s in stats))
    tx, ty = data.load_split("test")
    loss, acc = model.evaluate(tx.reshape(-1, 784).astype(np.float32) / 255.0, ty.astype(np.int64),
                               batch_size=1000, verbose=0)
    result.update(accuracy=float(acc), test_loss=float(loss))
    kv.kv_set(RESULT_KEY, json.dumps(result).encode())


def lr_of(variant: str, args) -> float:
    """The variant's Adam learning rate (for the async variants: the local optimizer's)."""
    if variant == "sync":
        return args.lr
    if variant == "adag" and args.adag_lr:
        return args.adag_lr
    return args.async_lr or args.lr


def run_variant(spark, variant: str, seed: int, args) -> dict:
    import ember

    node_args = {"variant": variant, "seed": seed, "epochs": args.epochs, "batch_size": args.batch_size,
                 "lr": lr_of(variant, args), "window": args.window, "ssp_window": args.ssp_window or args.window,
                 "ssp_algorithm": args.ssp_algorithm, "adag_window": args.adag_window, "easgd_window": args.easgd_window, "alpha": args.alpha,
                 "example_dir": str(EXAMPLE_DIR)}
    num_ps = 0 if variant == "sync" else 1
    start = time.monotonic()
    cluster = ember.Cluster.run(spark, node_main, node_args, num_executors=args.workers + num_ps, num_ps=num_ps,
                                reservation_timeout=300)
    cluster.shutdown(timeout=1800)  # the workers finished; the ps node is stopped
    wall = time.monotonic() - start
    kv = cluster._gang.server
    result = json.loads(kv.kv_get(RESULT_KEY))
    result["workers"] = [json.loads(kv.kv_get(f"{RESULT_KEY}/worker/{r}")) for r in range(args.workers)]
    result["wall_secs"] = wall
    ran = [w["batches"] for w in result["workers"]]
    if ran != [args.epochs * result["steps_per_epoch"]] * args.workers:
        raise RuntimeError(f"{variant}: the workers ran {ran} batches, not {args.epochs} x {result['steps_per_epoch']}")
    return result


def histogram_text(h) -> str:
    """Nonzero buckets as staleness:count; the last bucket counts staleness >= its index."""
    last = len(h) - 1
    return " ".join(f"{s}{'+' if s == last else ''}:{c}" for s, c in enumerate(h) if c) or "-"


def describe(r: dict) -> str:
    train = max(w["train_secs"] for w in r["workers"])
    starts, ends = [w["fit_start"] for w in r["workers"]], [w["fit_end"] for w in r["workers"]]
    text = (f"acc={r['accuracy']:.4f} loss={r['test_loss']:.4f} train={train:.1f}s wall={r['wall_secs']:.1f}s"
            f" skew start/end={max(starts) - min(starts):.1f}/{max(ends) - min(ends):.1f}s")
    if "histogram" in r:
        exchanges = [w["exchanges"] for w in r["workers"]]
        waited = max(w["ssp_waited_secs"] for w in r["workers"])
        text += (f" exchanges/worker={exchanges} shard_pushes_applied={r['pushes_applied']}"
                 f" rejected={r['pushes_rejected']} ssp_wait={waited:.1f}s"
                 f" staleness[{histogram_text(r['histogram'])}]")
    return text


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--workers", type=int, default=2, help="training nodes per variant")
    p.add_argument("--seed", type=int, default=1, help="repeat r uses seed + r for every variant")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {','.join(VARIANTS)}")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--master", default=None, help="Spark master (default local[workers + 1])")
    p.add_argument("--batch-size", type=int, default=64, help="per worker")
    p.add_argument("--lr", type=float, default=1e-3, help="sync's Adam lr (the async variants' too, unless --async-lr)")
    p.add_argument("--async-lr", type=float, default=None, help="the async variants' local Adam lr (default --lr)")
    p.add_argument("--window", type=int, default=5, help="downpour (and ssp2): batches per exchange")
    p.add_argument("--ssp-window", type=int, default=None, help="ssp2: batches per exchange (default --window)")
    p.add_argument("--ssp-algorithm", default="downpour", help="ssp2's algorithm (downpour, dynsgd, adag)")
    p.add_argument("--adag-window", type=int, default=5, help="adag: batches per exchange (dist-keras: 12)")
    p.add_argument("--adag-lr", type=float, default=None, help="adag's local Adam lr (default --async-lr)")
    p.add_argument("--easgd-window", type=int, default=32)
    p.add_argument("--alpha", type=float, default=0.5, help="easgd's moving rate")
    p.add_argument("--json", help="write every result here")
    args = p.parse_args()
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    master = args.master or f"local[{args.workers + 1}]"
    C.log(f"machine: {C.machine_info()}")
    C.log(f"{args.workers} workers, {args.epochs} epochs, batch {args.batch_size}/worker, Adam lr "
          f"{', '.join(f'{v}={lr_of(v, args):g}' for v in variants)}; windows downpour={args.window} "
          f"ssp2={args.ssp_window or args.window} adag={args.adag_window} easgd={args.easgd_window} "
          f"alpha={args.alpha}, master {master}")
    from pyspark.sql import SparkSession
    spark = SparkSession.builder.master(master).appName("ember-bench-ps-convergence").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    results = {v: [] for v in variants}
    try:
        for rep in range(args.repeats):
            for v in variants:
                r = run_variant(spark, v, args.seed + rep, args)
                results[v].append(r)
                C.log(f"repeat {rep} seed {args.seed + rep} {v}: {describe(r)}")
    finally:
        spark.stop()
    C.log(f"machine at end: {C.machine_info()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")

    acc = {v: statistics.mean(r["accuracy"] for r in rs) for v, rs in results.items()}
    print(f"{'variant':<9} {'test acc':>8} {'wall s':>7} {'train s':>7}  staleness histogram (summed over repeats)"
          + ("; accuracy per seed" if args.repeats > 1 else ""))
    for v, rs in results.items():
        hist = [sum(b) for b in zip(*(r["histogram"] for r in rs))] if "histogram" in rs[0] else None
        seeds = "; " + " ".join(f"{r['accuracy']:.4f}" for r in rs) if args.repeats > 1 else ""
        print(f"{v:<9} {acc[v]:8.4f} {statistics.mean(r['wall_secs'] for r in rs):7.1f} "
              f"{statistics.mean(max(w['train_secs'] for w in r['workers']) for r in rs):7.1f}  "
              f"{histogram_text(hist) if hist else '-'}{seeds}")
    parts, met, judged = [], 0, 0
    for v in (v for v in variants if v in GOALS):
        if "sync" not in acc:
            parts.append(f"{v}={100 * acc[v]:.2f}%")
            continue
        diff = 100 * (acc[v] - acc["sync"])
        ok = diff >= -GOALS[v]
        met, judged = met + ok, judged + 1
        per_seed = " ".join(f"{100 * (r['accuracy'] - s['accuracy']):+.2f}"
                            for r, s in zip(results[v], results["sync"]))
        print(f"{v:<9} {diff:+.2f} points vs sync (goal: within {GOALS[v]}): {'met' if ok else 'NOT met'}"
              + (f"; per seed: {per_seed}" if args.repeats > 1 else ""))
        parts.append(f"{v}={diff:+.2f}pt")
    goals = "/".join(f"{GOALS[v]}" for v in variants if v in GOALS)
    print(f"ps_convergence: {' '.join(parts)} (goals {goals}) met={met}/{judged}")


if __name__ == "__main__":
    main()
