#!/usr/bin/env python
"""cluster.inference's way back (issue 23, point 4): what returning every input column costs.

cluster.inference feeds partitions to the nodes through mapInArrow, which must return every input
column with the predictions, so a packed array column crosses Python -> JVM again and is unpacked
(ember_unpack_floats).  ``ci_noback`` is a measuring variant, not a product path: the same feed,
returning only the non-packed columns and the predictions (it drops a column, which
cluster.inference may not).  The same Keras model (784 -> 128 -> 10, argmax) as bench/inference.py,
a cached {id, features: array<float> of 784} DataFrame in 8 partitions, local[4], Ember's Spark
extension loaded, Spark's noop sink; each contender warms up once, then runs REPEATS times;
medians.  ``pbu`` is Spark's predict_batch_udf over the same column, ``transform`` is
KerasModel.transform; the ``_nomodel`` twins answer zeros.

  .venv/bin/python bench/inference_wayback.py [ROWS [REPEATS [CONTENDERS]]]
  .venv/bin/python bench/inference_wayback.py 200000 3 pbu,ci,ci_noback

Last line: inference_wayback: ci_noback_vs_ci=<x> ci_vs_pbu=<x> (when both were run).
"""
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (sets PYTHONPATH/PYSPARK_PYTHON before Spark starts)
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from pyspark.sql import SparkSession, functions as F  # noqa: E402
from pyspark.sql.types import DoubleType
from pyspark.ml.functions import predict_batch_udf
import ember
from ember.parallel import keras_model_bytes
from ember.ml import KerasModel
from ember._driver import feed as FD
from ember import _arrow_rows
from ember._feeder.task import infer_partition

ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
REP = int(sys.argv[2]) if len(sys.argv) > 2 else 3
ONLY = sys.argv[3].split(",") if len(sys.argv) > 3 else None
WIDTH = 784
conf = {"spark.ui.showConsoleProgress": "false", "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
        "spark.driver.memory": "6g"}
conf.update(ember.spark_conf(conf))
b = SparkSession.builder.master("local[4]")
for k, v in conf.items(): b = b.config(k, v)
spark = b.getOrCreate(); spark.sparkContext.setLogLevel("WARN")

import keras
keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((WIDTH,), name="x"), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(10)])
mb = keras_model_bytes(model)

def data(rows):
    return spark.range(rows, numPartitions=8).select(F.col("id"), F.expr(
        f"transform(sequence(1, {WIDTH}), i -> cast(((id * 7919 + i * 104729) % 256) / 255.0D as float))").alias("features")).cache()
warm, df = data(20000), data(ROWS)
df.count(); warm.count()

def main_fun(args, ctx):
    import numpy as np
    from ember.parallel import load_keras_model
    model = load_keras_model(args["mb"]) if args["model"] else None
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        cols = feed.next_batch_columns(1024)
        if cols:
            x = cols["features"]
            if model is None:
                feed.batch_results({"prediction": np.zeros(len(x))})
            else:
                feed.batch_results({"prediction": np.argmax(model.predict_on_batch(x), axis=1).astype(np.float64)})

def inference_noback(data, endpoints, options, output_schema=None, coordinator=None, pack=False):
    """mapInArrow as today, but returning only the non-packed columns + outputs: the cost of the way back."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType
    out_fields = FD._output_fields(output_schema)
    fed, packed = FD.pack_rows(data) if pack else (data, ())
    meta = _arrow_rows.packed_meta(packed)
    keep = [f for f in fed.schema.fields if f.name not in packed]
    full = StructType(keep + list(out_fields.fields))
    arrow_out = to_arrow_schema(full)
    eps = list(endpoints); n = len(eps)
    def infer_df(batches):
        from pyspark import TaskContext
        p = TaskContext.get().partitionId()
        ep = eps[p % n]
        batches = (_arrow_rows.mark_packed(b, meta) for b in batches)
        for inp, res in infer_partition(batches, p, ep, options, coordinator):
            cols = [inp.column(f.name) for f in keep] + [res.column(0)]
            yield pa.RecordBatch.from_arrays(cols, schema=arrow_out)
    return fed.mapInArrow(infer_df, full)


def timed(fn):
    t0 = time.monotonic(); fn().write.format("noop").mode("overwrite").save(); return time.monotonic() - t0

km = KerasModel.from_keras(model, inputCol="features", outputMode="argmax", predictBatchSize=1024)
def mk():
    from ember.parallel import load_keras_model
    m = load_keras_model(mb)
    return lambda x: np.argmax(m.predict_on_batch(x), axis=1).astype(np.float64)
pbu = predict_batch_udf(mk, return_type=DoubleType(), batch_size=1024, input_tensor_shapes=[[WIDTH]])

results = {}
def run(name, fn):
    if ONLY and name not in ONLY: return
    timed(lambda: fn(warm))
    results[name] = [ROWS / timed(lambda: fn(df)) for _ in range(REP)]
    C.log(f"{name}: {[round(r) for r in results[name]]} median {statistics.median(results[name]):,.0f}")

run("pbu", lambda d: d.withColumn("prediction", pbu(F.col("features"))))
run("transform", lambda d: km.transform(d))
orig = FD.inference
for model_on in (True, False):
    cl = ember.Cluster.run(spark, main_fun, {"mb": mb, "model": model_on}, num_executors=2, input_mode=ember.InputMode.SPARK)
    try:
        sfx = "" if model_on else "_nomodel"
        FD.inference = orig
        run("ci" + sfx, lambda d: cl.inference(d, output_schema="prediction double"))
        FD.inference = inference_noback
        run("ci_noback" + sfx, lambda d: cl.inference(d, output_schema="prediction double"))
    finally:
        FD.inference = orig
        cl.shutdown(timeout=120)
med = {k: statistics.median(v) for k, v in results.items()}
C.log("medians: " + ", ".join(f"{k} {v:,.0f} rows/s" for k, v in med.items()) + f"; load {os.getloadavg()}")
last = []
if "ci" in med and "ci_noback" in med:
    last.append(f"ci_noback_vs_ci={med['ci_noback'] / med['ci']:.2f}")
if "ci" in med and "pbu" in med:
    last.append(f"ci_vs_pbu={med['ci'] / med['pbu']:.2f}")
print("inference_wayback: " + " ".join(last), flush=True)
