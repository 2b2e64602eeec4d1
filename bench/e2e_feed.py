#!/usr/bin/env python
"""End to end: 2-node Fashion-MNIST CNN training throughput (samples/s) by how data reaches it.

Same model (examples/fashion_mnist/main.py: build_model), same synchronous custom training loop
(MultiWorkerMirroredStrategy, one all-reduce per step; Keras 3's model.fit cannot run MWMS on 2
workers, keras-team/keras#20585), same per-node batch, same number of steps, 1 intra-op and 1
inter-op thread per node, on a Spark standalone cluster of 2 workers on this host:

  ember_spark  Ember InputMode.SPARK: the Fashion-MNIST training images as a cached DataFrame
               (image: 784-byte binary, label: long), cluster.train(df); each node trains from
               feed.to_tf_dataset(batch, transform=bytes -> float32 [28,28,1] / 255).
  ember_tf     Ember InputMode.TENSORFLOW: each node reads its own TFRecord shards (made from the
               same IDX files by examples/fashion_mnist/data.py) with ember.data.tfrecord_dataset
               (Ember's C++ reader: CRC checks and tf.Example decode on the core's thread, the
               image as raw uint8 [B, 28, 28], read from the files on every pass, no cache).
  ember_parquet  Ember InputMode.TENSORFLOW from Parquet (issue 23): each node reads its share of
               the row groups of the Parquet file the ember_spark DataFrame is read from (image:
               binary, label: long) with ember.data.parquet_dataset (Arrow's reader; the image as
               raw uint8 [B, 28, 28] through RawBytes, no copy), read from the file on every pass.
  tfdata_tf    the same shards with tf.data (TFRecordDataset, parse_example, cache, batch): what
               a TENSORFLOW-mode program used before ember.data (TFoS's examples read this way).
  compute_only the ceiling, not a contender: Ember InputMode.TENSORFLOW where each node trains on
               one batch held in memory (tf.data from_tensors(...).repeat()): the model's own
               speed here, with no input pipeline at all.  No feed can beat it, so
               compute_only / tfos_spark bounds what any ratio vs TFoS can be on this machine.
  tfos_spark   TensorFlowOnSpark 2.2.5 InputMode.SPARK: the same DataFrame as df.rdd,
               TFCluster.train; each node trains from a tf.data generator over
               TFNode.DataFeed.next_batch(batch) (chief + worker, so TFoS sets TF_CONFIG).

The four Ember pipelines run in ONE pair of node processes (InputMode.SPARK; the TFRecord and
in-memory pipelines need no feed), interleaved: each node warms every pipeline up (--warmup steps
each: tracing, first all-reduces), then runs --repeats rounds, each timing one window of --steps
steps per pipeline, the order rotating from round to round.  So the contenders share the same
process, model state and machine load, and a burst of load from elsewhere hits all of them
alike (run one after another, two runs of the same code 20 minutes apart read SPARK / ceiling
1.03 and 0.79).  TFoS cannot share those processes; it runs after, in its own application, with
the same windows.  Each worker iterates its own plain tf.data pipeline (prefetch 2, autotuner
off, as main.py does) and hands its batch to strategy.run.  No shuffling in any mode.
samples/s = steps x global batch / window seconds, measured on worker 0 (chief for TFoS);
medians over the windows.  The last line is:
  e2e_samples_per_sec: ember_spark=<v> ember_tf=<v> ember_parquet=<v> tfdata_tf=<v> compute_only=<v> tfos_spark=<v>
                       ratio_spark_vs_tf=<v> ratio_vs_tfos=<v> ceiling_ratio_vs_tfos=<v>
                       ratio_tf_vs_ceiling=<v> ratio_spark_vs_ceiling=<v> ratio_parquet_vs_ceiling=<v>
  (the three *_vs_ceiling: median over rounds of each round's ember_tf, ember_spark or
  ember_parquet / compute_only)

  .venv/bin/python bench/e2e_feed.py            # defaults: batch 64 per node, 20 + 10 rounds x 100 steps
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
DATA_CACHE = C.BENCH_DIR / ".cache" / "fashion_mnist_tfrecords"


# ----------------------------------------------------------------------------- node code
def _node_common(args):
    """Imports the example (model, data helpers); TF threads; returns (tf, example module, data)."""
    import importlib.util
    import sys

    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(args["intra_op_threads"])
    tf.config.threading.set_inter_op_parallelism_threads(args["inter_op_threads"])
    sys.path.insert(0, args["example_dir"])
    spec = importlib.util.spec_from_file_location("ember_fmnist_example", f"{args['example_dir']}/main.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    import data  # examples/fashion_mnist/data.py
    return tf, example, data


def _plain_options(tf):
    """As examples/fashion_mnist/main.py: no tf.data autotuner (its thread can block an
    iterator's destructor for up to a minute in TF 2.21; ~1 core per node leaves little to tune)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def _keep_freed_memory() -> None:
    """--mallopt: undo tf.data's M_TRIM_THRESHOLD patch (pins glibc's mmap threshold at 128 KiB,
    so each large buffer, e.g. every feed ring read, is a fresh mmap faulted in page by page)."""
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 64 << 20)   # M_MMAP_THRESHOLD
    libc.mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD


def _build_step(args, tf, example, strategy):
    """The example's custom synchronous step (one replica per worker, one all-reduce per step):
    returns train_steps(iterator, num_steps) -> mean loss, and the global batch."""
    global_batch = args["batch"] * strategy.num_replicas_in_sync
    with strategy.scope():
        model = example.build_model(tf.keras)
        optimizer = tf.keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)
    per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def replica_step(batch):
        images, labels = batch
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.nn.compute_average_loss(per_example_loss(labels, logits), global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_steps(iterator, num_steps):
        local = tf.constant(0.0)
        for _ in tf.range(num_steps):
            loss = strategy.run(replica_step, args=(next(iterator),))
            local += strategy.experimental_local_results(loss)[0]
        return strategy.reduce(tf.distribute.ReduceOp.SUM, local, axis=None) / tf.cast(num_steps, tf.float32)

    return train_steps, global_batch


def _time_windows(args, tf, train_steps, global_batch, pipelines, is_reporter: bool, out_name: str):
    """Warms every pipeline up (--warmup steps each), then runs --repeats rounds; each round
    times one window of --steps steps per pipeline, the order rotating from round to round, so
    every contender sees the same machine load, the same process and the same model state."""
    import json
    import time
    from pathlib import Path

    iterators = {name: iter(ds.with_options(_plain_options(tf))) for name, ds in pipelines.items()}
    if args["mallopt"]:
        _keep_freed_memory()
    res = {name: {"global_batch": global_batch, "steps": args["steps"], "windows": [], "losses": []}
           for name in iterators}
    for name, it in iterators.items():
        t = time.monotonic()
        res[name]["first_loss"] = float(train_steps(it, tf.constant(args["warmup"])))
        res[name]["warmup_secs"] = time.monotonic() - t
    names = list(iterators)
    for r in range(args["repeats"]):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t = time.monotonic()
            res[name]["losses"].append(float(train_steps(iterators[name], tf.constant(args["steps"]))))
            res[name]["windows"].append(time.monotonic() - t)
    for r in res.values():
        r["samples_per_sec"] = [args["steps"] * global_batch / w for w in r["windows"]]
    if is_reporter:
        Path(args["out"], out_name).write_text(json.dumps(res))
    return iterators


def _to_xy(np, images, labels):
    x = images.reshape(-1, 28, 28, 1).astype(np.float32) / np.float32(255.0)
    return x, labels.astype(np.int64)


def ember_interleaved_main(args, ctx):
    """One pair of Ember nodes (InputMode.SPARK) times all four Ember pipelines in turn."""
    import numpy as np
    tf, example, data = _node_common(args)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    train_steps, global_batch = _build_step(args, tf, example, strategy)
    files = data.shard_paths(args["data_dir"], "train")
    n, i = ctx.num_workers, ctx.task_index  # worker i of n reads files i, i+n, ... (as main.py)

    # ember_spark: fed by cluster.train(df) on the driver.
    feed = ctx.get_data_feed()
    spark_ds = feed.to_tf_dataset(args["batch"], transform=lambda c: _to_xy(np, c["image"], c["label"]))
    # ember_tf: this node's own TFRecord shards through Ember's reader (as main.py reads them).
    import ember.data
    ember_ds = ember.data.tfrecord_dataset(files, data.ember_features(), args["batch"], shard=(i, n),
                                           drop_remainder=True).map(data.parse_batch).repeat()
    # ember_parquet: this node's row groups of the Parquet file, read in place on every pass.
    pq_ds = ember.data.parquet_dataset(args["parquet"], {"image": ember.data.RawBytes((28, 28)), "label": None},
                                       args["batch"], shard=(i, n), drop_remainder=True).map(data.parse_batch).repeat()
    # tfdata_tf: the same shards through tf.data.
    tf_ds = tf.data.TFRecordDataset(files[i::n], num_parallel_reads=len(files[i::n]))
    tf_ds = tf_ds.map(data.parse_example, num_parallel_calls=2).cache()
    tf_ds = tf_ds.batch(args["batch"], drop_remainder=True).repeat()
    # compute_only: one batch held in memory, no input pipeline at all (the ceiling).
    batch = next(iter(tf.data.TFRecordDataset(files[i::n]).map(data.parse_example).batch(args["batch"])))
    compute_ds = tf.data.Dataset.from_tensors(batch).repeat()

    pipelines = {"ember_spark": spark_ds.prefetch(2), "ember_tf": ember_ds.prefetch(2),
                 "ember_parquet": pq_ds.prefetch(2), "tfdata_tf": tf_ds.prefetch(2), "compute_only": compute_ds}
    _time_windows(args, tf, train_steps, global_batch, pipelines, ctx.task_index == 0, "ember.json")
    ctx.barrier("bench_done", timeout=600)  # leave together (TF's coordination service)


def tfos_spark_main(args, ctx):
    import numpy as np
    tf, example, _ = _node_common(args)
    from tensorflowonspark import TFNode
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    feed = TFNode.DataFeed(ctx.mgr, train_mode=True)

    def gen():
        while not feed.should_stop():
            rows = feed.next_batch(args["batch"])
            if len(rows) < args["batch"]:
                return  # end of feed (TFoS hands a short batch only then)
            images = np.frombuffer(b"".join(bytes(r[0]) for r in rows), np.uint8)
            yield _to_xy(np, images, np.array([r[1] for r in rows]))

    sig = (tf.TensorSpec((None, 28, 28, 1), tf.float32), tf.TensorSpec((None,), tf.int64))
    ds = tf.data.Dataset.from_generator(gen, output_signature=sig).prefetch(2)
    train_steps, global_batch = _build_step(args, tf, example, strategy)
    _time_windows(args, tf, train_steps, global_batch, {"tfos_spark": ds}, ctx.job_name == "chief", "tfos.json")
    feed.terminate()  # TFoS's way to skip the rest of the feed (it was fed extra; see run_tfos)


# ----------------------------------------------------------------------------- driver
def fashion_df(spark, rows: int, partitions: int, tmp: Path):
    """`rows` training images of Fashion-MNIST, in order (repeated past the 60,000), as a cached
    DataFrame (image, label)."""
    sys.path.insert(0, str(EXAMPLE_DIR))
    import data
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    images, labels = data.load_split("train")
    idx = np.arange(rows) % len(labels)  # past the 60,000 training images, they come round again
    images, labels = images[idx], labels[idx]
    n = len(labels)
    flat = np.ascontiguousarray(images).reshape(-1)
    offsets = np.arange(0, (n + 1) * 784, 784, dtype=np.int32)
    image = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(flat)])
    table = pa.table({"image": image, "label": pa.array(labels.astype(np.int64))})
    path = tmp / "train.parquet"
    pq.write_table(table, path, row_group_size=max(1, n // partitions))
    df = spark.read.parquet(str(path)).repartition(partitions).cache()
    assert df.count() == n
    return df


def run_ember(cluster, args, node_args, out: Path, tmp: Path) -> dict:
    import ember
    spark = C.session(cluster, "bench-e2e-ember")
    sc = spark.sparkContext
    C.wait_executors(sc, 2)
    # Exactly the rows the ember_spark windows consume: 2 nodes x batch x steps.
    rows = 2 * args.batch * (args.warmup + args.repeats * args.steps)
    df = fashion_df(spark, rows, args.partitions, tmp)
    node_args = dict(node_args, parquet=str(tmp / "train.parquet"))  # ember_parquet reads it in place
    C.log(f"ember_spark data: {rows} rows in {args.partitions} partitions; {C.cached_fraction(sc)}")
    t = time.time()
    c = ember.Cluster.run(spark, ember_interleaved_main, node_args, num_executors=2,
                          input_mode=ember.InputMode.SPARK, reservation_timeout=180)
    c.train(df, num_epochs=1)
    c.shutdown(timeout=1200)
    res = json.loads((out / "ember.json").read_text())
    for name, r in res.items():
        C.log(f"{name}: {fmt(r)}")
    C.log(f"ember: done in {time.time() - t:.1f}s")
    spark.stop()
    return res


def run_tfos(cluster, args, node_args, out: Path, tmp: Path) -> tuple:
    env = C.ensure_tfos()
    C.log(f"tfos: {env}")
    spark = C.session(cluster, "bench-e2e-tfos", **{
        "spark.executor.cores": "1", "spark.cores.max": "2", "spark.task.cpus": "1",
        "spark.executorEnv.PYTHONPATH": C.pythonpath_with(C.TFOS_SITE)})
    sc = spark.sparkContext
    C.wait_executors(sc, 2)
    rows = 2 * args.batch * (args.warmup + args.repeats * args.steps)
    df = fashion_df(spark, rows, args.partitions, tmp)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from tensorflowonspark import TFCluster
    t = time.time()
    tc = TFCluster.run(sc, tfos_spark_main, node_args, num_executors=2, num_ps=0,
                       input_mode=TFCluster.InputMode.SPARK, master_node="chief", reservation_timeout=180)
    # TFoS sends each partition to whichever executor runs its task, so nodes get uneven row
    # counts; feed two epochs so neither runs dry before the fixed step count (the nodes
    # terminate() the feed when done: TFoS's own remedy; its examples stop at 90 % of steps).
    tc.train(df.rdd, num_epochs=2)
    tc.shutdown(timeout=1200)
    res = json.loads((out / "tfos.json").read_text())["tfos_spark"]
    C.log(f"tfos_spark: done in {time.time() - t:.1f}s: {fmt(res)}")
    spark.stop()
    return res, env


def fmt(r: dict) -> str:
    return (f"samples/s per window {[round(v) for v in r['samples_per_sec']]} (global batch "
            f"{r['global_batch']}, {r['steps']} steps/window; warm-up {r['warmup_secs']:.1f}s; "
            f"loss {r['first_loss']:.3f} -> {r['losses'][-1]:.3f})")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64, help="per-node batch (global = 2x)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first")
    p.add_argument("--steps", type=int, default=100, help="steps per timed window")
    p.add_argument("--repeats", type=int, default=10, help="timed rounds (one window per contender each)")
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--intra-op-threads", type=int, default=1)
    p.add_argument("--inter-op-threads", type=int, default=1)
    p.add_argument("--mallopt", action="store_true",
                   help="in every mode, undo tf.data's malloc patch on the nodes (experiment)")
    p.add_argument("--skip-tfos", action="store_true")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)

    C.log(f"machine: {C.machine_info()}")
    C.log(f"versions: {C.versions()}")
    sys.path.insert(0, str(EXAMPLE_DIR))
    import data
    manifest = data.convert(DATA_CACHE, train_shards=8)
    C.log(f"TFRecords for ember_tf: {DATA_CACHE} ({'converted' if manifest['converted'] else 'ready'})")
    out = Path(tempfile.mkdtemp(prefix="ember-bench-e2e-"))
    tmp = Path(tempfile.mkdtemp(prefix="ember-bench-e2e-data-"))
    node_args = {"batch": args.batch, "warmup": args.warmup, "steps": args.steps, "repeats": args.repeats,
                 "intra_op_threads": args.intra_op_threads, "inter_op_threads": args.inter_op_threads,
                 "example_dir": str(EXAMPLE_DIR), "data_dir": str(DATA_CACHE), "out": str(out),
                 "mallopt": args.mallopt}
    cluster = C.start_standalone(num_workers=2, cores_per_worker=2, memory="3g")
    results = {"args": vars(args), "machine": C.machine_info()}
    try:
        C.log(f"standalone cluster {cluster.master_url}: 2 workers x 2 cores")
        results.update(run_ember(cluster, args, node_args, out, tmp))
        if not args.skip_tfos:
            results["tfos_spark"], results["tfos_env"] = run_tfos(cluster, args, node_args, out, tmp)
    finally:
        cluster.stop()
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)

    med = {k: C.median(results[k]["samples_per_sec"]) if k in results else float("nan")
           for k in ("ember_spark", "ember_tf", "ember_parquet", "tfdata_tf", "compute_only", "tfos_spark")}
    results["medians"] = med
    # Paired: each round's window over the same round's compute_only window.
    ceiling = results["compute_only"]["samples_per_sec"]
    paired = [a / b for a, b in zip(results["ember_spark"]["samples_per_sec"], ceiling)]
    paired_tf = [a / b for a, b in zip(results["ember_tf"]["samples_per_sec"], ceiling)]
    paired_pq = [a / b for a, b in zip(results["ember_parquet"]["samples_per_sec"], ceiling)]
    results["paired_spark_vs_ceiling"], results["paired_tf_vs_ceiling"] = paired, paired_tf
    results["paired_parquet_vs_ceiling"] = paired_pq
    C.log(f"ember_spark / compute_only per round: {[round(x, 3) for x in paired]}")
    C.log(f"ember_tf / compute_only per round: {[round(x, 3) for x in paired_tf]}")
    C.log(f"ember_parquet / compute_only per round: {[round(x, 3) for x in paired_pq]}")
    print()
    print(f"medians over {args.repeats} windows of {args.steps} steps, samples/s (global batch {2 * args.batch}):")
    for k, v in med.items():
        print(f"  {k:12s} {v:10.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    C.log(f"machine at end: {C.machine_info()}")
    print(f"e2e_samples_per_sec: ember_spark={C.fmt_rate(med['ember_spark'])} ember_tf={C.fmt_rate(med['ember_tf'])} "
          f"ember_parquet={C.fmt_rate(med['ember_parquet'])} "
          f"tfdata_tf={C.fmt_rate(med['tfdata_tf'])} "
          f"compute_only={C.fmt_rate(med['compute_only'])} tfos_spark={C.fmt_rate(med['tfos_spark'])} "
          f"ratio_spark_vs_tf={med['ember_spark'] / med['ember_tf']:.2f} "
          f"ratio_vs_tfos={med['ember_spark'] / med['tfos_spark']:.2f} "
          f"ceiling_ratio_vs_tfos={med['compute_only'] / med['tfos_spark']:.2f} "
          f"ratio_tf_vs_ceiling={C.median(paired_tf):.2f} ratio_spark_vs_ceiling={C.median(paired):.2f} "
          f"ratio_parquet_vs_ceiling={C.median(paired_pq):.2f}")


if __name__ == "__main__":
    main()
