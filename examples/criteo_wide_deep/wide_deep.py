"""Wide & deep click-through prediction on a Criteo-shaped DataFrame: the embeddings live on
parameter-server shards and train asynchronously, the dense layers train synchronously.

    python examples/criteo_wide_deep/wide_deep.py                    # Spark local[4]: 1 ps + 2 workers
    python examples/criteo_wide_deep/wide_deep.py --rows 1000000 --master spark://127.0.0.1:7077

The data is synthetic but shaped like Criteo's display-advertising logs, and made by Spark
itself (it lives in a DataFrame, as a data team's would): 13 dense features (``dense``,
array<float>), 26 categorical fields (``cats``, array<long>) whose ids follow a skewed
distribution (a few ids take most rows; vocabularies from 10 to 10 million), and a 0/1
``label`` drawn from a hidden logistic function of the ids and the dense features.

The split that Persia and Monolith make, on Ember:

* **Embeddings, async on the PS.**  Two sparse tables on the ps node's shard: ``deep`` (8 floats
  per id, the deep part's embeddings) and ``wide`` (1 float per id, the linear "wide" part).
  A worker pulls the rows of its batch's unique ids, computes their gradients, and pushes them
  (``sgd`` on the shard).  Nobody waits: rows are created on first touch, whatever the
  vocabulary.
* **Dense layers, sync with Ember's collectives.**  Every step's gradients of the MLP are
  averaged over the workers (``ember.keras.allreduce_gradients``, one fused allreduce), so the
  MLP is the same on every worker.

``cluster.inference`` then scores the held-out rows; Spark computes the AUC and log loss, next to
the log loss of always predicting the base rate.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

FIELDS, DENSE, DIM = 26, 13, 8


def make_data(spark, rows: int, seed: int, partitions: int):
    """The Criteo-shaped DataFrame: dense (13 floats), cats (26 skewed ids), label (0/1)."""
    from pyspark.sql import functions as F

    # Field f's vocabulary: 10 ... 10^7, log-spaced; ids skewed by u^4 (u uniform): id 0 is the
    # most frequent, as in click logs.
    vocab = [int(10 ** (1 + 6 * f / (FIELDS - 1))) for f in range(FIELDS)]
    cats = [F.floor(F.pow(F.rand(seed + f), 4) * v).cast("long") for f, v in enumerate(vocab)]
    dense = [F.randn(seed + 100 + j).cast("float") for j in range(DENSE)]
    df = spark.range(rows, numPartitions=partitions).select(F.array(*cats).alias("cats"),
                                                            F.array(*dense).alias("dense"))
    # The hidden truth: each (field, id) has an effect in [-1, 1) from a hash, plus 2 dense terms.
    effect = sum((F.abs(F.xxhash64(F.lit(f), F.col("cats")[f])) % 2000 / 1000.0 - 1.0) for f in range(8))
    logit = effect + 0.8 * F.col("dense")[0] - 0.5 * F.col("dense")[1] - 1.0
    return df.withColumn("label", (F.rand(seed + 999) < 1 / (1 + F.exp(-logit))).cast("double"))


def main_fun(args, ctx):
    import numpy as np

    import ember.ps

    if ctx.job_name == "ps":
        ember.ps.serve(ctx)  # the embedding tables' shard, until shutdown

    import keras
    import tensorflow as tf

    import ember.keras

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(args.seed)  # the same MLP on every worker
    ps = ember.ps.connect(ctx)
    ps.create_table("deep", dim=DIM, seed=args.seed, init_scale=0.05, rule="sgd", lr=args.embedding_lr)
    ps.create_table("wide", dim=1, seed=args.seed + 1, init_scale=0.0, rule="sgd", lr=args.embedding_lr)
    mlp = keras.Sequential([keras.Input((DENSE + FIELDS * DIM,)), keras.layers.Dense(64, activation="relu"),
                            keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])
    opt = keras.optimizers.Adam(args.learning_rate)
    field_key = np.arange(FIELDS, dtype=np.int64) << 40  # one id space per field on one table

    def logits(cols, training):
        """The model's logits, and what the embedding gradients need (unique keys, rows)."""
        keys = cols["cats"].astype(np.int64) + field_key
        unique, inverse = np.unique(keys, return_inverse=True)
        deep = tf.constant(ps.pull_rows("deep", unique))
        wide = tf.constant(ps.pull_rows("wide", unique))
        n = len(keys)
        return unique, deep, wide, lambda: (
            mlp(tf.concat([tf.constant(cols["dense"], tf.float32),
                           tf.reshape(tf.gather(deep, inverse.reshape(-1)), (n, FIELDS * DIM))], axis=1),
                training=training)[:, 0]
            + tf.reduce_sum(tf.reshape(tf.gather(wide, inverse.reshape(-1)), (n, FIELDS)), axis=1))

    bce = keras.losses.BinaryCrossentropy(from_logits=True)
    feed = ctx.get_data_feed(train_mode=True)
    for epoch in range(args.epochs):
        steps, total = 0, 0.0
        for cols in feed.epoch_batches(args.batch_size):
            unique, deep, wide, forward = logits(cols, training=True)
            with tf.GradientTape() as tape:
                tape.watch([deep, wide])
                loss = bce(cols["label"].astype(np.float32), forward())
            grads = tape.gradient(loss, mlp.trainable_variables + [deep, wide])
            opt.apply_gradients(zip(ember.keras.allreduce_gradients(grads[:-2]), mlp.trainable_variables))
            ps.push_rows("deep", unique, tf.convert_to_tensor(grads[-2]).numpy())  # async: no waiting
            ps.push_rows("wide", unique, tf.convert_to_tensor(grads[-1]).numpy())
            steps, total = steps + 1, total + float(loss)
        if ctx.is_chief or ctx.training_rank == 0:
            print(f"epoch {epoch + 1}: train log loss {total / max(steps, 1):.4f} over {steps} steps", flush=True)

    feed = ctx.get_data_feed(train_mode=False)  # cluster.inference: score the held-out rows
    while not feed.should_stop():
        cols = feed.next_batch_columns(4096)
        if cols:
            _, _, _, forward = logits(cols, training=False)
            feed.batch_results({"p": tf.sigmoid(forward()).numpy().astype(np.float64)})


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Wide & deep on a Criteo-shaped DataFrame (embeddings on the PS)")
    p.add_argument("--master", default="local[4]", help="Spark master URL")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=512, help="per worker")
    p.add_argument("--learning-rate", type=float, default=2e-3, help="the dense layers' Adam")
    p.add_argument("--embedding-lr", type=float, default=0.5, help="the tables' SGD on the shard")
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    from pyspark.ml.evaluation import BinaryClassificationEvaluator
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import ember

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(args.master).appName("ember-criteo-wide-deep")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    spark.sparkContext.addPyFile(os.path.abspath(__file__))  # main_fun's module, for the nodes
    t0 = time.monotonic()
    try:
        df = make_data(spark, args.rows, args.seed, partitions=2 * args.workers)
        train, test = df.randomSplit([0.9, 0.1], seed=args.seed)
        train, test = train.cache(), test.cache()
        base_rate = train.agg(F.avg("label")).first()[0]
        cluster = ember.Cluster.run(spark, main_fun, args, num_executors=args.workers + 1, num_ps=1,
                                    input_mode=ember.InputMode.SPARK, reservation_timeout=120)
        try:
            cluster.train(train, num_epochs=args.epochs)
            scored = cluster.inference(test, output_schema="p double")
            scored = scored.withColumn("p", F.least(F.greatest("p", F.lit(1e-7)), F.lit(1 - 1e-7))).cache()
            auc = BinaryClassificationEvaluator(rawPredictionCol="p", labelCol="label").evaluate(scored)
            logloss = scored.select(F.avg(-(F.col("label") * F.log("p") + (1 - F.col("label")) * F.log(1 - F.col("p"))))).first()[0]
            n_test = scored.count()
        finally:
            cluster.shutdown(timeout=600)
    finally:
        spark.stop()
    base = -(base_rate * math.log(base_rate) + (1 - base_rate) * math.log(1 - base_rate))
    result = {"auc": auc, "logloss": logloss, "base_rate_logloss": base, "test_rows": n_test,
              "secs": time.monotonic() - t0}
    print(f"test AUC {auc:.4f}, log loss {logloss:.4f} (always the base rate {base_rate:.3f}: {base:.4f}) "
          f"on {n_test} rows; {result['secs']:.0f} s", flush=True)
    return result


if __name__ == "__main__":
    main()
