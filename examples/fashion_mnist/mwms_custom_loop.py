"""Fashion-MNIST on Ember with TensorFlow's own MultiWorkerMirroredStrategy: how the main job had
to be written before Ember's synchronous training (Keras 3's ``model.fit`` cannot run MWMS on more
than one worker, keras-team/keras#20585, so this is a custom training loop).  Kept as the way
TFoS users synchronise (TF_CONFIG), and as the peer of bench/sync_training.py; main.py is the
same job with ``model.fit``.

    python examples/fashion_mnist/mwms_custom_loop.py                      # Spark local[2], 2 nodes
    python examples/fashion_mnist/mwms_custom_loop.py --master spark://127.0.0.1:7077

The driver converts the Debian IDX files into TFRecord shards (once), launches one TensorFlow
node per Spark executor slot with ``ember.Cluster.run`` (InputMode.TENSORFLOW: every node reads
its own shards with tf.data), and waits. The chief saves the model, evaluates it on the 10,000
test images and writes ``metrics.json`` into the model directory; the driver prints
``test_accuracy=<value>``.
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
from train_single import build_model  # noqa: E402  (the CNN, shared with main.py)

REPO = Path(__file__).resolve().parents[2]
METRICS_FILE = "metrics.json"
MODEL_FILE = "fashion_mnist.keras"


def _is_chief(resolver) -> bool:
    """MWMS convention: the 'chief' task, or worker 0 when the cluster has no chief."""
    task_type, task_id = resolver.task_type, resolver.task_id
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return task_type == "chief" or (task_type == "worker" and task_id == 0 and not has_chief)


def _no_autotune(tf):
    """tf.data options without the autotuner: its model thread can block an iterator's
    destructor for up to a minute (TF 2.21), and with ~1 core per node there is little to tune."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def main_fun(args, ctx):
    """Runs on every node, in its own process, with TF_CONFIG set by Ember."""
    import shutil
    import tempfile

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TF's C++ INFO lines: gRPC, devices
    import tensorflow as tf

    # Each node gets about one core; set before TensorFlow creates its thread pools.
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    chief = _is_chief(resolver)
    # This worker's place among the workers, in TF's order (chief first), and their number.
    spec = resolver.cluster_spec().as_dict()
    workers = [(job, k) for job in ("chief", "worker") for k in range(len(spec.get(job, [])))]
    worker_index, num_workers = workers.index((resolver.task_type, resolver.task_id)), len(workers)
    if strategy.num_replicas_in_sync != num_workers:
        raise ValueError(f"this example feeds one replica per worker; got "
                         f"{strategy.num_replicas_in_sync} replicas on {num_workers} workers")
    global_batch = args.batch_size
    if global_batch % num_workers:
        raise ValueError(f"--batch-size {global_batch} is not a multiple of {num_workers} workers")
    worker_batch = global_batch // num_workers

    # Shard by file: worker i of n reads files i, i+n, i+2n, ..., so the workers read disjoint
    # parts that together cover the training set, every epoch.
    train_files = data.shard_paths(args.data_dir, "train")
    shard_sizes = data.shard_examples(args.data_dir, "train")
    if len(train_files) < num_workers:
        raise ValueError(f"{len(train_files)} training shards cannot feed {num_workers} "
                         f"workers; convert with --train-shards {num_workers} or more")
    my_files = train_files[worker_index::num_workers]
    # Every worker must run the same number of steps (each one is an all-reduce over all of
    # them): the one with the fewest examples sets it.
    steps_per_epoch = min(sum(shard_sizes[i::num_workers]) for i in range(num_workers)) \
        // worker_batch
    print(f"{resolver.task_type}:{resolver.task_id} reads {[Path(f).name for f in my_files]}, "
          f"{steps_per_epoch} steps of {worker_batch} per epoch", flush=True)

    # Each worker iterates its own plain tf.data pipeline and hands its batches to strategy.run
    # (one replica per worker, so a batch is that replica's). Not a distributed dataset: with
    # one it runs through a MultiDeviceIterator, whose internal pipelines use tf.data's
    # autotuner, and destroying those at exit blocked the chief for 30-90 s (TF 2.21).
    train_ds = tf.data.TFRecordDataset(my_files, num_parallel_reads=len(my_files))
    train_ds = train_ds.map(data.parse_example, num_parallel_calls=2).cache()
    train_ds = train_ds.shuffle(args.shuffle_buffer, seed=args.seed + worker_index,
                                reshuffle_each_iteration=True)
    train_ds = train_ds.batch(worker_batch, drop_remainder=True).take(steps_per_epoch)
    train_ds = train_ds.repeat(args.epochs).prefetch(2).with_options(_no_autotune(tf))

    # Same initial weights on every run (MWMS copies the chief's to the other workers anyway).
    tf.keras.utils.set_random_seed(args.seed)
    with strategy.scope():
        model = build_model(tf.keras)
        optimizer = tf.keras.optimizers.Adam(args.learning_rate)
        optimizer.build(model.trainable_variables)
    per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none")

    # A custom loop, not model.fit: Keras 3's fit cannot run MultiWorkerMirroredStrategy on more
    # than one worker (keras-team/keras#20585: it all-reduces a nested first batch and fails).
    def replica_step(batch):
        images, labels = batch
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            # Scaled by the global batch: the optimizer sums gradients over all replicas.
            loss = tf.nn.compute_average_loss(per_example_loss(labels, logits),
                                              global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1), labels), tf.float32))
        return loss, correct

    @tf.function
    def train_steps(iterator, num_steps):
        """num_steps synchronous steps; returns (mean loss, accuracy) over them, all workers."""
        local_loss, local_correct = tf.constant(0.0), tf.constant(0.0)
        for _ in tf.range(num_steps):
            loss, correct = strategy.run(replica_step, args=(next(iterator),))
            local_loss += strategy.experimental_local_results(loss)[0]
            local_correct += strategy.experimental_local_results(correct)[0]
        # One all-reduce per call, not two per step.
        totals = strategy.reduce(tf.distribute.ReduceOp.SUM, tf.stack([local_loss, local_correct]),
                                 axis=None)
        steps = tf.cast(num_steps, tf.float32)
        return totals[0] / steps, totals[1] / (steps * global_batch)

    iterator = iter(train_ds)
    start = time.monotonic()
    step = 0
    for epoch in range(args.epochs):
        epoch_start, done, loss_sum, acc_sum = time.monotonic(), 0, 0.0, 0.0
        while done < steps_per_epoch:
            n = min(args.report_every, steps_per_epoch - done)
            loss, accuracy = (float(v) for v in train_steps(iterator, tf.constant(n)))
            done, step = done + n, step + n
            loss_sum, acc_sum = loss_sum + loss * n, acc_sum + accuracy * n
            ctx.report(step=step, loss=loss, samples=step * worker_batch)
        train_loss, train_accuracy = loss_sum / done, acc_sum / done
        if chief:
            print(f"epoch {epoch + 1}/{args.epochs}: loss={train_loss:.4f} "
                  f"accuracy={train_accuracy:.4f} ({time.monotonic() - epoch_start:.1f}s)",
                  flush=True)
    train_secs = time.monotonic() - start

    # Every worker saves (MWMS expects it); only the chief writes to the real model directory.
    model_dir = Path(args.model_dir)
    save_dir = model_dir if chief else Path(tempfile.mkdtemp(prefix="ember-fmnist-worker-"))
    save_dir.mkdir(parents=True, exist_ok=True)
    model.save(save_dir / MODEL_FILE)
    if chief:
        metrics = evaluate(tf, model, args)
        metrics.update(train_secs=train_secs, train_loss=train_loss, train_accuracy=train_accuracy,
                       epochs=args.epochs, global_batch_size=global_batch,
                       num_workers=num_workers)
        tmp = model_dir / (METRICS_FILE + ".tmp")
        tmp.write_text(json.dumps(metrics, indent=1) + "\n")
        os.replace(tmp, model_dir / METRICS_FILE)
        print(f"chief: test_accuracy={metrics['test_accuracy']:.4f} on "
              f"{metrics['test_examples']} images; trained {train_secs:.1f}s", flush=True)
    else:
        shutil.rmtree(save_dir, ignore_errors=True)
    # Leave together: a worker that exits while the chief still evaluates stops heartbeating to
    # TF's coordination service (hosted by the chief), which then aborts the chief's collectives
    # and logs that worker as crashed.
    ctx.barrier("fashion_mnist_done", timeout=args.eval_timeout)


def evaluate(tf, model, args) -> dict:
    """The chief alone evaluates a plain copy of the trained model on every test image:
    evaluating the distributed model would need all workers in the loop."""
    eval_model = build_model(tf.keras)
    eval_model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                       metrics=["accuracy"])
    eval_model.set_weights(model.get_weights())
    test_examples = data.num_examples(args.data_dir, "test")
    test_ds = (tf.data.TFRecordDataset(data.shard_paths(args.data_dir, "test"))
               # Fails the evaluation if the shards hold more or fewer images than recorded.
               .apply(tf.data.experimental.assert_cardinality(test_examples))
               .map(data.parse_example, num_parallel_calls=2)
               .batch(1000)
               .with_options(_no_autotune(tf)))
    test_loss, test_accuracy = eval_model.evaluate(test_ds, verbose=0)
    return {"test_accuracy": float(test_accuracy), "test_loss": float(test_loss),
            "test_examples": test_examples}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Fashion-MNIST CNN on Ember (InputMode.TENSORFLOW)")
    p.add_argument("--master", default="local[2]", help="Spark master URL")
    p.add_argument("--num-nodes", type=int, default=2, help="TensorFlow nodes (Spark tasks)")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=128, help="global batch size")
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--data-dir", default=str(data.DEFAULT_DATA_DIR))
    p.add_argument("--model-dir", default=str(REPO / "data" / "fashion_mnist_model"))
    p.add_argument("--train-shards", type=int, default=8)
    p.add_argument("--shuffle-buffer", type=int, default=30_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--intra-op-threads", type=int, default=1)
    p.add_argument("--inter-op-threads", type=int, default=1)
    p.add_argument("--report-every", type=int, default=50, help="progress report every N steps")
    p.add_argument("--eval-timeout", type=float, default=600,
                   help="seconds the workers wait for the chief to save and evaluate")
    p.add_argument("--reservation-timeout", type=float, default=120, help="seconds")
    p.add_argument("--shutdown-timeout", type=float, default=1800, help="seconds")
    args = p.parse_args(argv)
    # Nodes may run in another working directory: hand them absolute paths.
    args.data_dir = str(Path(args.data_dir).resolve())
    args.model_dir = str(Path(args.model_dir).resolve())
    return args


def main(argv: list[str] | None = None) -> float:
    t0 = time.monotonic()
    args = parse_args(argv)
    manifest = data.convert(args.data_dir, train_shards=args.train_shards)
    print(f"data: {args.data_dir} "
          f"({'converted in %.1fs' % manifest['convert_secs'] if manifest['converted'] else 'ready'})",
          flush=True)

    import ember
    from pyspark.sql import SparkSession

    # Spark's Python workers (and so the nodes) run PYSPARK_PYTHON, "python3" on PATH if unset:
    # default to this interpreter, whose environment has TensorFlow and Ember.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    spark = (SparkSession.builder.master(args.master).appName("ember-fashion-mnist")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    # main_fun imports data.py on the nodes.
    for module in (data, sys.modules[build_model.__module__]):  # main_fun uses them on the nodes
        spark.sparkContext.addPyFile(str(Path(module.__file__).resolve()))
    metrics_path = Path(args.model_dir) / METRICS_FILE
    metrics_path.unlink(missing_ok=True)  # never report a previous run's result
    try:
        t_run = time.monotonic()
        cluster = ember.Cluster.run(
            spark, main_fun, args, num_executors=args.num_nodes, num_ps=0, master_node=None,
            input_mode=ember.InputMode.TENSORFLOW, log_dir=None,
            reservation_timeout=args.reservation_timeout)
        startup = getattr(cluster, "startup_secs", None)
        if startup is not None:
            print(f"cluster_startup_secs={startup:.2f} (Cluster.run to all nodes registered)")
        cluster.shutdown(grace_secs=0, timeout=args.shutdown_timeout)
        run_secs = time.monotonic() - t_run
    finally:
        spark.stop()

    if not metrics_path.exists():
        raise RuntimeError(f"the job ended without writing {metrics_path}")
    metrics = json.loads(metrics_path.read_text())
    print(f"test_accuracy={metrics['test_accuracy']:.4f}")
    print(f"wall_secs={time.monotonic() - t0:.1f} (cluster {run_secs:.1f}, "
          f"training {metrics['train_secs']:.1f}, {args.num_nodes} nodes, {args.epochs} epochs)")
    return metrics["test_accuracy"]


if __name__ == "__main__":
    main()
