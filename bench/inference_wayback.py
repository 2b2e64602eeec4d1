#!/usr/bin/env python
"""cluster.inference's way back (issue 23, point 4): what returning every input column costs.

Until the thirteenth session cluster.inference fed partitions to the nodes through mapInArrow,
which must return every input column with the predictions, so a packed array column crossed
Python -> JVM again and was unpacked (ember_unpack_floats); that is still its way under Spark
Connect.  In a classic session with Ember's extension it now joins by position in the JVM
(EmberInfer): ``ci`` measures that.  The measuring variants, not product paths: ``ci_mapinarrow``
is the mapInArrow way (FD.inference with the position join switched off); ``ci_noback`` the same
feed returning only the non-packed columns and the predictions (it drops a column, which
cluster.inference may not); ``ci_udf`` keeps every column the way Spark's pandas UDFs do: a
scalar iterator pandas UDF feeds the nodes and Spark joins the predictions to the rows it kept
(see inference_udf; its output is checked equal to cluster.inference's).  The same Keras model (784 -> 128 -> 10, argmax) as bench/inference.py,
a cached {id, features: array<float> of 784} DataFrame in 8 partitions, local[4], Ember's Spark
extension loaded, Spark's noop sink; each contender warms up once, then runs REPEATS times;
medians.  ``pbu`` is Spark's predict_batch_udf over the same column, ``transform`` is
KerasModel.transform; the ``_nomodel`` twins answer zeros.

  .venv/bin/python bench/inference_wayback.py [ROWS [REPEATS [CONTENDERS]]]
  .venv/bin/python bench/inference_wayback.py 200000 3 pbu,ci,ci_noback

Last line: inference_wayback: ci_noback_vs_ci=<x> ci_vs_pbu=<x> ci_udf_vs_pbu=<x>
ci_vs_ci_mapinarrow=<x> (those run).
"""
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (sets PYTHONPATH/PYSPARK_PYTHON before Spark starts)
from inference import WIDTH, build_model  # noqa: E402  (the same model and width as bench/inference.py)
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
conf = {"spark.ui.showConsoleProgress": "false", "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
        "spark.driver.memory": "6g"}
conf.update(ember.spark_conf(conf))
b = SparkSession.builder.master("local[4]")
for k, v in conf.items(): b = b.config(k, v)
spark = b.getOrCreate(); spark.sparkContext.setLogLevel("WARN")

model = build_model()  # bench/inference.py's model, seeded
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

def inference_noback(data, endpoints, options, output_schema=None, coordinator=None, pack=False, **_):
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


def inference_udf(data, endpoints, options, output_schema=None, coordinator=None, pack=False, **_):
    """The way back left to Spark: a scalar iterator pandas UDF (ArrowEvalPython) over a struct of
    the fed columns; the passthrough columns stay in the JVM, the feed is the same.  Measuring
    only: a pandas round trip changes nullable integers and float nulls, so a product path would
    need a rule per type."""
    from pyspark.sql.pandas.types import to_arrow_schema
    out_fields = FD._output_fields(output_schema)
    in_names = data.columns
    fed, packed = FD.pack_rows(data) if pack else (data, ())
    meta = _arrow_rows.packed_meta(packed)
    in_schema = to_arrow_schema(fed.schema)
    eps = list(endpoints)
    n = len(eps)

    def fn(it):
        from pyspark import TaskContext
        p = TaskContext.get().partitionId()
        ep = eps[p % n]

        def batches():
            for pdf in it:
                yield _arrow_rows.mark_packed(pa.RecordBatch.from_pandas(pdf, schema=in_schema, preserve_index=False),
                                              meta)
        for _, res in infer_partition(batches(), p, ep, options, coordinator):
            yield res.to_pandas()
    udf = F.pandas_udf(fn, out_fields, F.PandasUDFType.SCALAR_ITER)
    args = [F.call_function("ember_pack_floats", F.col(FD._quoted(c))).alias(c) if c in packed
            else F.col(FD._quoted(c)) for c in in_names]
    return data.select("*", udf(F.struct(*args)).alias("__r")).select(*in_names, "__r.*")


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
orig, joins = FD.inference, FD._joins_by_position
for model_on in (True, False):
    cl = ember.Cluster.run(spark, main_fun, {"mb": mb, "model": model_on}, num_executors=2, input_mode=ember.InputMode.SPARK)
    try:
        sfx = "" if model_on else "_nomodel"
        FD.inference = orig
        run("ci" + sfx, lambda d: cl.inference(d, output_schema="prediction double"))
        FD._joins_by_position = lambda d: False  # the mapInArrow way, as under Spark Connect
        run("ci_mapinarrow" + sfx, lambda d: cl.inference(d, output_schema="prediction double"))
        FD._joins_by_position = joins
        FD.inference = inference_noback
        run("ci_noback" + sfx, lambda d: cl.inference(d, output_schema="prediction double"))
        FD.inference = inference_udf
        run("ci_udf" + sfx, lambda d: cl.inference(d, output_schema="prediction double"))
        if model_on and (not ONLY or "ci_udf" in ONLY):  # the UDF way gives what the shipped one gives
            got = cl.inference(warm, output_schema="prediction double").orderBy("id").toPandas()
            FD.inference = orig
            want = cl.inference(warm, output_schema="prediction double").orderBy("id").toPandas()
            assert list(got.columns) == list(want.columns), (got.columns, want.columns)
            assert (got["prediction"].values == want["prediction"].values).all(), "predictions differ"
            assert all(np.array_equal(a, b) for a, b in zip(got["features"], want["features"])), "features differ"
            C.log("ci_udf's output equals cluster.inference's, row by row")
    finally:
        FD.inference, FD._joins_by_position = orig, joins
        cl.shutdown(timeout=120)
med = {k: statistics.median(v) for k, v in results.items()}
C.log("medians: " + ", ".join(f"{k} {v:,.0f} rows/s" for k, v in med.items()) + f"; load {os.getloadavg()}")
last = []
if "ci" in med and "ci_noback" in med:
    last.append(f"ci_noback_vs_ci={med['ci_noback'] / med['ci']:.2f}")
if "ci" in med and "pbu" in med:
    last.append(f"ci_vs_pbu={med['ci'] / med['pbu']:.2f}")
if "ci_udf" in med and "pbu" in med:
    last.append(f"ci_udf_vs_pbu={med['ci_udf'] / med['pbu']:.2f}")
if "ci" in med and "ci_mapinarrow" in med:
    last.append(f"ci_vs_ci_mapinarrow={med['ci'] / med['ci_mapinarrow']:.2f}")
print("inference_wayback: " + " ".join(last), flush=True)
