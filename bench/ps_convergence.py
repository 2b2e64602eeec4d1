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
  ssp2avg   ssp2 with average=True: each delta divided by the workers (the shards move by their
            mean delta; summed, the deltas of workers held in step overshoot: docs/ps.md)

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

--trace DIR: each worker also writes a per-exchange trace (wall times of push / clock return /
pull, versions, staleness, wait, delta norm; Keras's running loss per batch) and evaluates its own
model when its fit ends; a line per run then gives those accuracies in finishing order and the
pushes the first and last worker made alone (DOWNPOUR's solo tail: docs/benchmarks.md).

Last line: ps_convergence: downpour=<pt> adag=<pt> easgd=<pt> ssp2=<pt> ssp2avg=<pt> (goals 1.0/1.0/1.0/0.5/0.5) met=<k>/<n>
(points = 100 x (variant accuracy - sync accuracy), means over --repeats; a goal is met when the
variant is no more than its goal below sync).

  .venv/bin/python bench/ps_convergence.py        # ~2.5 min (each variant ~20-30 s); --repeats 3: ~7 min
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
VARIANTS = ("sync", "downpour", "adag", "easgd", "ssp2", "ssp2avg")
GOALS = {"downpour": 1.0, "adag": 1.0, "easgd": 1.0, "ssp2": 0.5, "ssp2avg": 0.5}  # points below sync, at most
RESULT_KEY = "bench/ps_convergence/result"


class TracingClient:
    """--trace: an ember.ps.Client that records, per exchange, the wall times of push / clock
    return / pull, the versions pushed from and pulled, the push's staleness, the clock's wait
    and the delta's norm (Exchange calls push_many, then clock, then pull_many)."""

    def __init__(self, ps, records):
        self._ps, self.records = ps, records

    def __getattr__(self, name):
        return getattr(self._ps, name)

    def push_many(self, names, updates, versions):
        import numpy as np
        t = time.time()
        results = self._ps.push_many(names, updates, versions)
        self.records.append({"push": t, "pushed": time.time(), "base": list(versions[0].per_slice),
                             "after": list(results[0].versions.per_slice),
                             "staleness": max(int(r.max_staleness) for r in results),
                             "delta_norm": float(np.sqrt(sum(float(np.sum(np.square(u))) for u in updates)))})
        return results

    def clock(self, clock, *a, **kw):
        r = self._ps.clock(clock, *a, **kw)
        if self.records and "clock" not in self.records[-1]:
            self.records[-1].update(clock=r.clock, min_clock=r.min_clock, waited=r.waited_us / 1e6,
                                    clocked=time.time())
        return r

    def pull_many(self, names, shapes=None):
        values, versions = self._ps.pull_many(names, shapes)
        if self.records and "pulled" not in self.records[-1]:
            self.records[-1].update(pulled=list(versions[0].per_slice), pulled_at=time.time())
        return values, versions


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
        if args["trace"]:
            ps = TracingClient(ps, [])
        knobs = {"downpour": dict(algorithm="downpour", frequency=args["window"]),
                 "adag": dict(algorithm="adag", frequency=args["adag_window"]),
                 "easgd": dict(algorithm="easgd", frequency=args["easgd_window"], alpha=args["alpha"]),
                 "ssp2": dict(algorithm=args["ssp_algorithm"], frequency=args["ssp_window"], ssp=2),
                 "ssp2avg": dict(algorithm=args["ssp_algorithm"], frequency=args["ssp_window"], ssp=2,
                                 average=True)}[variant]
        callback = ember.keras.AsyncCallback(ps, **knobs)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    batches, losses = [], []  # losses: Keras's running mean over the epoch at each batch

    def count(batch, logs):
        batches.append(batch)
        losses.append(float(logs["loss"]))

    counter = keras.callbacks.LambdaCallback(on_train_batch_end=count)
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
    if args["trace"]:
        # This worker's model when its fit ended (async: the shards' weights then, before the
        # other workers' remaining pushes): the accuracy the job would have ended with here.
        tx, ty = data.load_split("test")
        _, acc_at_end = model.evaluate(tx.reshape(-1, 784).astype(np.float32) / 255.0, ty.astype(np.int64),
                                       batch_size=1000, verbose=0)
        trace = {"rank": rank, "steps_per_epoch": steps, "fit_start": fit_start, "fit_end": fit_end,
                 "acc_at_end": float(acc_at_end), "losses": losses,
                 "exchanges": ps.records if ps is not None else []}
        Path(args["trace"], f"{variant}-seed{args['seed']}-w{rank}.json").write_text(json.dumps(trace))
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
                 "example_dir": str(EXAMPLE_DIR), "trace": args.trace}
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


def trace_text(trace_dir: str, variant: str, seed: int, workers: int) -> str:
    """--trace's summary of one run: each worker's test accuracy when its fit ended (in finishing
    order), the pushes the first and the last worker made alone at the start and the end, the
    longest run of one worker's pushes, and the staleness of the pushes by share."""
    ws = [json.loads(Path(trace_dir, f"{variant}-seed{seed}-w{r}.json").read_text()) for r in range(workers)]
    ends = " ".join(f"w{w['rank']}={w['acc_at_end']:.4f}" for w in sorted(ws, key=lambda w: w["fit_end"]))
    pushes = sorted((e["push"], w["rank"]) for w in ws for e in w["exchanges"])
    if not pushes:
        return f"acc at each worker's end: {ends}"
    runs, n = [], 1
    for (_, a), (_, b) in zip(pushes, pushes[1:]):
        if a == b:
            n += 1
        else:
            runs.append(n)
            n = 1
    runs.append(n)
    stale = [e["staleness"] for w in ws for e in w["exchanges"]]
    shares = " ".join(f"{k}:{stale.count(k) / len(stale):.2f}" for k in sorted(set(stale)) if k < 4)
    return (f"acc at each worker's end: {ends}; pushes alone: first {runs[0]}, last {runs[-1]}, longest "
            f"{max(runs)} (of {len(pushes)}); staleness shares {shares}")


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
    p.add_argument("--trace", help="directory: each worker writes <variant>-seed<s>-w<rank>.json there, per "
                   "exchange the wall times of push / clock return / pull, versions, staleness, wait")
    args = p.parse_args()
    if args.trace:
        args.trace = str(Path(args.trace).resolve())
        Path(args.trace).mkdir(parents=True, exist_ok=True)
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
                if args.trace:
                    C.log(f"  trace: {trace_text(args.trace, v, args.seed + rep, args.workers)}")
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
