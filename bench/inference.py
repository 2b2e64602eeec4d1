#!/usr/bin/env python
"""Inference throughput: rows/s of one Keras model over a DataFrame.

Contenders, same model (784 -> Dense 128 relu -> Dense 10, the output's argmax as a double
``prediction``), same cached DataFrame (``features``: array<float> of 784, Fashion-MNIST's
shape, synthetic), same Spark application (local[N] by default):

  ember      ember.ml.KerasModel.transform: a scalar-iterator pandas UDF over the input column,
             each batch one float32 matrix, the model loaded once per Python worker.  The session
             loads Ember's Spark extension (ember.spark_conf()), so the column crosses packed by
             ember_pack_floats as one binary buffer per row (--no-extension: Spark's array
             hand-over, as predict_batch_udf gets it).
  ember_ci   ember.Cluster.run(..., InputMode.SPARK) + cluster.inference(df): --nodes nodes
             answer the feed (next_batch_columns -> predict -> batch_results); feeding tasks
             run in the slots the nodes leave free.
  pbu        Spark's own pyspark.ml.functions.predict_batch_udf (make_predict_fn loads the model
             once per Python worker), batch_size --batch.
  floor      (--floor) a pandas UDF that returns zeros: Spark's hand-over of the input column to a
             Python worker and back, no model; no evaluator in a Python worker can beat it.
  floor_packed  (--floor, with the extension) the same over ember_pack_floats(features): the
             hand-over of the packed column, the most the ember contender can reach.
  tfos       TensorFlowOnSpark 2.2.5's pipeline.TFModel over a SavedModel export of the model,
             when tensorflowonspark is importable (bench/.tfos-site, see _common.ensure_tfos;
             --tfos installs it).

With --connect, the Ember contenders (ember, ember_ci) run once more from a Spark Connect client
(``SparkSession.builder.remote``), against a Spark Connect server from pyspark's own distribution
on the same master and driver memory, over the same synthetic data (made and cached by that
application), after the classic session has stopped: the ``connect`` column, and its ratio to
the classic figures.  With --floor as well, the Connect run times the floor too: how much of
Connect's cost is Spark's own Python-UDF path (connect_floor_rows_per_sec, and
floor_connect_vs_classic on the last line).

Spark's own UDFs (pbu, floor, floor_packed) run in Python workers of their own: Ember settles the
workers it runs in (ember._feeder.worker), which would also speed up a later UDF in the same
worker; a user of predict_batch_udf alone would not have that.

Every contender's output is written to Spark's ``noop`` sink (the whole DataFrame is computed,
nothing stored).  Every contender first runs once at --warmup-rows (its workers load TensorFlow
and the model); then the contenders take turns, --repeats rounds, so the host's drift touches
each alike.  The best run counts; the medians are logged.  The last line is:
  inference_rows_per_sec: ember=<v> predict_batch_udf=<v> ratio=<v> ember_cluster_inference=<v> ci_ratio=<v>
(with --connect: ... ember_connect=<v> connect_vs_classic=<v>, Ember's transform under Connect
over Ember's under a classic session; with --floor too, floor_connect_vs_classic=<v>).

  .venv/bin/python bench/inference.py                       # 1,000,000 rows, local[4], 2 repeats
  .venv/bin/python bench/inference.py --connect             # and the Connect column
  .venv/bin/python bench/inference.py --connect --floor     # ... with Spark's floor in both sessions
  .venv/bin/python bench/inference.py --rows 50000 --repeats 1   # quick
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (sets PYTHONPATH/PYSPARK_PYTHON before Spark starts)

WIDTH = 784


def build_model():
    import keras
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((WIDTH,), name="x"), keras.layers.Dense(128, activation="relu"),
                             keras.layers.Dense(10)])


def ember_ci_main(args, ctx):
    """Ember node for cluster.inference: answer every fed row with the model's argmax."""
    import numpy as np

    from ember.parallel import load_keras_model

    model = load_keras_model(args["model_bytes"])
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        cols = feed.next_batch_columns(args["batch"])
        if cols:
            x = cols["features"].astype(np.float32, copy=False)
            feed.batch_results({"prediction": np.argmax(model.predict_on_batch(x), axis=1).astype(np.float64)})


def timed(what: str, df_fn, rows: int, repeats: int) -> float:
    best = float("inf")
    for i in range(repeats):
        t0 = time.monotonic()
        df_fn().write.format("noop").mode("overwrite").save()
        secs = time.monotonic() - t0
        best = min(best, secs)
        C.log(f"{what}: run {i + 1}: {rows} rows in {secs:.2f}s = {rows / secs:,.0f} rows/s")
    return rows / best


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--warmup-rows", type=int, default=20_000)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--master", default="local[4]")
    p.add_argument("--driver-memory", default="6g", help="local mode: the cached DataFrame lives here (1M rows: ~3.2 GB)")
    p.add_argument("--nodes", type=int, default=2, help="nodes of the cluster.inference contender")
    p.add_argument("--batch", type=int, default=1024, help="rows per model call (all contenders)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--input", choices=("array", "vector"), default="array",
                   help="features as array<float>, or as a Spark ML Vector (VectorAssembler's output; "
                        "predict_batch_udf then needs vector_to_array, Ember reads the Vector itself)")
    p.add_argument("--floor", action="store_true",
                   help="also time Spark's hand-over alone: the input column to Python and zeros back, no model "
                        "(the most any evaluator in a Python worker can reach)")
    p.add_argument("--no-extension", action="store_true",
                   help="leave Ember's Spark extension (ember.spark_conf(): ember_pack_floats) out of the session: "
                        "Ember's transform then takes Spark's array hand-over as predict_batch_udf does")
    p.add_argument("--tfos", action="store_true", help="install TFoS into bench/.tfos-site if missing and run it")
    p.add_argument("--no-tfos", action="store_true", help="leave TFoS out even where bench/.tfos-site has it")
    p.add_argument("--connect", action="store_true",
                   help="also run the Ember contenders from a Spark Connect client (a Connect server on --master)")
    p.add_argument("--remote", help=argparse.SUPPRESS)  # internal: be that Connect client, of this server URL
    a = p.parse_args(argv)

    C.log(C.machine_info())
    tfos_note = None
    if not a.no_tfos and (a.tfos or (C.TFOS_SITE / "tensorflowonspark").is_dir()):
        try:
            tfos_note = C.ensure_tfos()
        except Exception as e:  # noqa: BLE001 - the peer is optional
            C.log(f"tfos: unavailable ({type(e).__name__}: {e})")
    import numpy as np
    import pandas as pd
    from pyspark.ml.functions import array_to_vector, predict_batch_udf, vector_to_array
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType

    import ember
    from ember.ml import KerasModel
    from ember.parallel import keras_model_bytes

    conf = {"spark.ui.showConsoleProgress": "false", "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
            "spark.driver.memory": a.driver_memory}
    if not a.no_extension:
        conf.update(ember.spark_conf(conf))
    if a.remote:  # the Connect client: the server was started with `conf`
        spark = SparkSession.builder.remote(a.remote).getOrCreate()
    else:
        if tfos_note:
            conf["spark.executorEnv.PYTHONPATH"] = C.pythonpath_with(C.TFOS_SITE)
        builder = SparkSession.builder.master(a.master).appName("ember-bench-inference")
        for k, v in conf.items():
            builder = builder.config(k, v)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
    C.log(C.versions())
    model = build_model()
    model_bytes = keras_model_bytes(model)

    def data(rows: int):
        # Deterministic pseudo-pixels in [0, 1): no Python per row.  255.0D: a double division
        # (255.0 is a decimal literal, divided through BigDecimal: 6.4 minutes for 1M rows).
        df = spark.range(rows, numPartitions=a.partitions).select(
            F.col("id"), F.expr(f"transform(sequence(1, {WIDTH}), i -> cast(((id * 7919 + i * 104729) "
                                f"% 256) / 255.0D as float))").alias("features"))
        if a.input == "vector":
            df = df.withColumn("features", array_to_vector("features"))
        return df.cache()

    warm, df = data(a.warmup_rows), data(a.rows)
    C.log(f"data: {df.count():,} rows x {WIDTH} floats ({a.input}) in {a.partitions} partitions, cached; "
          f"{warm.count():,} rows for warm-up")

    km = KerasModel.from_keras(model, inputCol="features", outputMode="argmax", predictBatchSize=a.batch)

    def make_predict_fn():
        from ember.parallel import load_keras_model
        m = load_keras_model(model_bytes)

        def predict(x):
            return np.argmax(m.predict_on_batch(x), axis=1).astype(np.float64)
        return predict

    pbu = predict_batch_udf(make_predict_fn, return_type=DoubleType(), batch_size=a.batch,
                            input_tensor_shapes=[[WIDTH]])

    def no_model(series):  # the input column to Python and zeros back: no model, no conversion
        for s in series:
            yield pd.Series(np.zeros(len(s)))
    no_model.__annotations__ = {"series": Iterator[pd.Series], "return": Iterator[pd.Series]}
    floor_udf = F.pandas_udf(no_model, DoubleType())
    if not a.remote:
        C.own_python_workers(spark, "features", pbu, floor_udf)
    contenders = {
        "ember": lambda d: km.transform(d),
        "pbu": lambda d: d.withColumn("prediction", pbu(vector_to_array("features", "float32")
                                                        if a.input == "vector" else F.col("features"))),
    }
    if a.remote:
        del contenders["pbu"]  # the Connect run measures Ember's two paths only
    if a.floor:  # Spark's own floor, in the Connect run too: how much of the gap is Spark's
        contenders["floor"] = lambda d: d.withColumn("prediction", floor_udf(
            vector_to_array("features", "float32") if a.input == "vector" else F.col("features")))
        if not a.no_extension:  # ... and the floor of the column packed by Ember's extension
            contenders["floor_packed"] = lambda d: d.withColumn("prediction", floor_udf(F.call_function(
                "ember_pack_floats", vector_to_array("features", "float32") if a.input == "vector"
                else F.col("features"))))
    # cluster.inference's nodes start first (they idle, with the model loaded, while the others
    # run); every contender warms up (its Python workers load TensorFlow and the model) before
    # any is timed, and the timed runs take turns: the host's drift touches each contender alike.
    cluster = ember.Cluster.run(spark, ember_ci_main, {"model_bytes": model_bytes, "batch": a.batch},
                                num_executors=a.nodes, input_mode=ember.InputMode.SPARK)
    try:
        def fed(d):  # the feed carries arrays: a Vector column is converted in the JVM first
            return d.withColumn("features", vector_to_array("features", "float32")) if a.input == "vector" else d

        contenders["ember_ci"] = lambda d: cluster.inference(fed(d), output_schema="prediction double")
        for name, fn in contenders.items():
            timed(f"{name} warm-up", lambda: fn(warm), a.warmup_rows, 1)
        runs: dict = {name: [] for name in contenders}
        for i in range(a.repeats):
            for name, fn in contenders.items():
                runs[name].append(timed(f"{name} (round {i + 1})", lambda: fn(df), a.rows, 1))
    finally:
        cluster.shutdown(timeout=120)
    rates = {name: max(r) for name, r in runs.items()}
    C.log("medians: " + ", ".join(f"{name} {statistics.median(r):,.0f} rows/s" for name, r in runs.items()))

    if a.remote:
        print("CONNECT_RATES " + json.dumps(rates), flush=True)
        spark.stop()
        return
    if tfos_note:
        try:
            rates["tfos"] = _tfos(spark, model, warm, df, a)
        except Exception as e:  # noqa: BLE001 - report and go on: the headline is ember vs pbu
            C.log(f"tfos: failed: {type(e).__name__}: {str(e)[:500]}")
    spark.stop()
    connect = _connect_rates(a, conf, argv) if a.connect else {}
    for name, rate in rates.items():
        C.log(f"{name}: {rate:,.0f} rows/s")
    for name, rate in connect.items():
        C.log(f"{name} (Spark Connect client): {rate:,.0f} rows/s = {rate / rates[name]:.3f} of classic")
    if "floor" in rates:
        print(f"floor_rows_per_sec={rates['floor']:.0f} (Spark to Python and back, no model)"
              + (f" floor_packed_rows_per_sec={rates['floor_packed']:.0f} (the same, packed by ember_pack_floats)"
                 if "floor_packed" in rates else ""))
    print(f"ember_cluster_inference_rows_per_sec={rates['ember_ci']:.0f} tfos_rows_per_sec="
          f"{rates.get('tfos', float('nan')):.0f}")
    tail = ""
    if connect:
        print(f"connect_rows_per_sec: ember={connect['ember']:.0f} ({connect['ember'] / rates['ember']:.3f} of classic) "
              f"ember_cluster_inference={connect['ember_ci']:.0f} ({connect['ember_ci'] / rates['ember_ci']:.3f} of classic)")
        tail = f" ember_connect={connect['ember']:.0f} connect_vs_classic={connect['ember'] / rates['ember']:.3f}"
        if "floor" in connect:
            floor_kept = connect["floor"] / rates["floor"]
            print(f"connect_floor_rows_per_sec={connect['floor']:.0f} ({floor_kept:.3f} of classic): Ember's "
                  f"transform keeps {connect['ember'] / rates['ember'] / floor_kept:.3f} of what Spark's own "
                  f"Python-UDF path keeps under Connect")
            tail += f" floor_connect_vs_classic={floor_kept:.3f}"
    print(f"inference_rows_per_sec: ember={rates['ember']:.0f} predict_batch_udf={rates['pbu']:.0f} "
          f"ratio={rates['ember'] / rates['pbu']:.2f} ember_cluster_inference={rates['ember_ci']:.0f} "
          f"ci_ratio={rates['ember_ci'] / rates['pbu']:.2f}{tail}")


def _connect_rates(a, conf: dict, argv) -> dict:
    """The Ember contenders' rates from a Spark Connect client: a Connect server (pyspark's own
    distribution) on a.master with `conf`, and this script run again as its client."""
    rest = [x for x in (argv if argv is not None else sys.argv[1:]) if x not in ("--connect", "--tfos")]
    return C.run_as_connect_client(a.master, {k: v for k, v in conf.items() if k != "spark.executorEnv.PYTHONPATH"},
                                   [str(Path(__file__).resolve())] + rest, "CONNECT_RATES")


def _tfos(spark, model, warm, df, a) -> float:
    """TFoS's TFModel over a SavedModel export of the same model."""
    import tempfile

    from tensorflowonspark import pipeline

    export_dir = tempfile.mkdtemp(prefix="bench-inference-tfos-")
    model.export(export_dir, verbose=False)
    # TFoS's TF2 path looks the signature up by key and has no default for it.
    tfm = (pipeline.TFModel({}).setExportDir(export_dir).setSignatureDefKey("serving_default")
           .setTagSet("serve").setInputMapping({"features": "x"})
           .setOutputMapping({"output_0": "prediction"}).setBatchSize(a.batch))
    timed("tfos warm-up", lambda: tfm.transform(warm), a.warmup_rows, 1)
    return timed("tfos", lambda: tfm.transform(df), a.rows, a.repeats)


if __name__ == "__main__":
    main()
