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
               same IDX files by examples/fashion_mnist/data.py) with tf.data (parse, cache, batch).
  compute_only the ceiling, not a contender: Ember InputMode.TENSORFLOW where each node trains on
               one batch held in memory (tf.data from_tensors(...).repeat()): the model's own
               speed here, with no input pipeline at all.  No feed can beat it, so
               compute_only / tfos_spark bounds what any ratio vs TFoS can be on this machine.
  tfos_spark   TensorFlowOnSpark 2.2.5 InputMode.SPARK: the same DataFrame as df.rdd,
               TFCluster.train; each node trains from a tf.data generator over
               TFNode.DataFeed.next_batch(batch) (chief + worker, so TFoS sets TF_CONFIG).

Each worker iterates its own plain tf.data pipeline (prefetch 2, autotuner off, as main.py
does) and hands its batch to strategy.run.  No shuffling in any mode.  Each node runs --warmup steps (tracing, first all-reduces), then
--repeats timed windows of --steps steps; samples/s = steps x global batch / window seconds,
measured on worker 0 (chief for TFoS); medians over the windows.  The last line is:
  e2e_samples_per_sec: ember_spark=<v> ember_tf=<v> compute_only=<v> tfos_spark=<v> ratio_spark_vs_tf=<v>
                       ratio_vs_tfos=<v> ceiling_ratio_vs_tfos=<v>

  .venv/bin/python bench/e2e_feed.py            # defaults: batch 64 per node, 20 + 3 x 100 steps
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


def _train_and_time(args, tf, example, strategy, dataset, is_reporter: bool, out_name: str):
    """The example's custom synchronous loop (one replica per worker, each worker iterating its
    own plain tf.data pipeline, one all-reduce per step); times --repeats windows of --steps."""
    import json
    import time
    from pathlib import Path

    global_batch = args["batch"] * strategy.num_replicas_in_sync
    with strategy.scope():
        model = example.build_model(tf)
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

    iterator = iter(dataset.with_options(_plain_options(tf)))
    if args["mallopt"]:
        _keep_freed_memory()
    t = time.monotonic()
    first_loss = float(train_steps(iterator, tf.constant(args["warmup"])))
    warm_secs = time.monotonic() - t
    windows, losses = [], []
    for _ in range(args["repeats"]):
        t = time.monotonic()
        losses.append(float(train_steps(iterator, tf.constant(args["steps"]))))
        windows.append(time.monotonic() - t)
    if is_reporter:
        Path(args["out"], out_name).write_text(json.dumps({
            "global_batch": global_batch, "steps": args["steps"], "windows": windows,
            "warmup_secs": warm_secs, "first_loss": first_loss, "losses": losses,
            "samples_per_sec": [args["steps"] * global_batch / w for w in windows]}))
    return iterator


def _to_xy(np, images, labels):
    x = images.reshape(-1, 28, 28, 1).astype(np.float32) / np.float32(255.0)
    return x, labels.astype(np.int64)


def ember_spark_main(args, ctx):
    import numpy as np
    tf, example, _ = _node_common(args)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    feed = ctx.get_data_feed()

    ds = feed.to_tf_dataset(args["batch"], transform=lambda c: _to_xy(np, c["image"], c["label"]))
    _train_and_time(args, tf, example, strategy, ds.prefetch(2), ctx.task_index == 0, "ember_spark.json")
    ctx.barrier("bench_done", timeout=600)  # leave together (TF's coordination service)


def ember_tf_main(args, ctx):
    tf, example, data = _node_common(args)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    files = data.shard_paths(args["data_dir"], "train")

    n, i = ctx.num_workers, ctx.task_index  # worker i of n reads files i, i+n, ... (as main.py)
    ds = tf.data.TFRecordDataset(files[i::n], num_parallel_reads=len(files[i::n]))
    ds = ds.map(data.parse_example, num_parallel_calls=2).cache()
    ds = ds.batch(args["batch"], drop_remainder=True).repeat().prefetch(2)
    _train_and_time(args, tf, example, strategy, ds, ctx.task_index == 0, "ember_tf.json")
    ctx.barrier("bench_done", timeout=600)


def compute_only_main(args, ctx):
    tf, example, data = _node_common(args)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    files = data.shard_paths(args["data_dir"], "train")
    n, i = ctx.num_workers, ctx.task_index
    batch = next(iter(tf.data.TFRecordDataset(files[i::n]).map(data.parse_example).batch(args["batch"])))
    ds = tf.data.Dataset.from_tensors(batch).repeat()  # one batch, in memory: no input pipeline
    _train_and_time(args, tf, example, strategy, ds, ctx.task_index == 0, "compute_only.json")
    ctx.barrier("bench_done", timeout=600)


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
    _train_and_time(args, tf, example, strategy, ds, ctx.job_name == "chief", "tfos_spark.json")
    feed.terminate()  # TFoS's way to skip the rest of the feed (it was fed extra; see run_tfos)


# ----------------------------------------------------------------------------- driver
def fashion_df(spark, rows: int, partitions: int, tmp: Path):
    """The first `rows` training images of Fashion-MNIST as a cached DataFrame (image, label)."""
    sys.path.insert(0, str(EXAMPLE_DIR))
    import data
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    images, labels = data.load_split("train")
    images, labels = images[:rows], labels[:rows]
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
    res = {}

    def run_mode(name, main_fun, input_mode, data=None):
        t = time.time()
        c = ember.Cluster.run(spark, main_fun, node_args, num_executors=2, input_mode=input_mode,
                              reservation_timeout=180)
        if data is not None:
            c.train(data, num_epochs=1)
        c.shutdown(timeout=1200)
        res[name] = json.loads((out / f"{name}.json").read_text())
        C.log(f"{name}: done in {time.time() - t:.1f}s: {fmt(res[name])}")

    # TENSORFLOW mode: nodes read TFRecords themselves.
    run_mode("ember_tf", ember_tf_main, ember.InputMode.TENSORFLOW)
    # The ceiling: the same training step on one in-memory batch.
    run_mode("compute_only", compute_only_main, ember.InputMode.TENSORFLOW)
    # SPARK mode: the same images as a cached DataFrame, exactly the rows the steps consume.
    rows = 2 * args.batch * (args.warmup + args.repeats * args.steps)
    df = fashion_df(spark, rows, args.partitions, tmp)
    C.log(f"ember_spark data: {rows} rows in {args.partitions} partitions; {C.cached_fraction(sc)}")
    run_mode("ember_spark", ember_spark_main, ember.InputMode.SPARK, df)
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
    res = json.loads((out / "tfos_spark.json").read_text())
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
    p.add_argument("--repeats", type=int, default=3, help="timed windows")
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
           for k in ("ember_spark", "ember_tf", "compute_only", "tfos_spark")}
    results["medians"] = med
    print()
    print(f"medians over {args.repeats} windows of {args.steps} steps, samples/s (global batch {2 * args.batch}):")
    for k, v in med.items():
        print(f"  {k:12s} {v:10.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    C.log(f"machine at end: {C.machine_info()}")
    print(f"e2e_samples_per_sec: ember_spark={C.fmt_rate(med['ember_spark'])} ember_tf={C.fmt_rate(med['ember_tf'])} "
          f"compute_only={C.fmt_rate(med['compute_only'])} tfos_spark={C.fmt_rate(med['tfos_spark'])} "
          f"ratio_spark_vs_tf={med['ember_spark'] / med['ember_tf']:.2f} "
          f"ratio_vs_tfos={med['ember_spark'] / med['tfos_spark']:.2f} "
          f"ceiling_ratio_vs_tfos={med['compute_only'] / med['tfos_spark']:.2f}")


if __name__ == "__main__":
    main()
