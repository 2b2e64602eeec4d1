#!/usr/bin/env python
"""Inference throughput of a PyTorch model over a DataFrame: ember.ml.TorchModel.transform vs
Spark's own predict_batch_udf (issue 23, point 4's "torch twin").

Same model for both (784 -> Linear 128 -> ReLU -> Linear 10, the output's argmax as a double
``prediction``; seeded), exported once with torch.export (dynamic batch) and loaded from those
bytes by both; same cached DataFrame as bench/inference.py (``features``: array<float> of 784,
synthetic), same Spark application (local[4]):

  ember  ember.ml.TorchModel.transform.  The session loads Ember's Spark extension
         (ember.spark_conf()), so the column crosses packed (ember_pack_floats, one binary buffer
         per row), Spark keeps every row and appends the output by position (EmberInfer), and each
         Arrow batch is one float32 matrix handed to torch without a copy (torch.from_numpy).
         --no-extension: Spark's array hand-over to a pandas UDF, as predict_batch_udf gets it.
  pbu    pyspark.ml.functions.predict_batch_udf (make_predict_fn loads the program once per
         Python worker; torch.inference_mode), batch_size --batch, in Python workers of its own.

Both write to Spark's ``noop`` sink.  Each runs once at --warmup-rows first; then they take turns,
--repeats rounds; best and median logged, with the driver-side load average.  Before the timed
rounds the two outputs are compared row by row (argmax equal where the top two logits differ by
more than 1e-4).  Needs PyTorch (.torch-site/, `make setup-torch`).  Last line:
  inference_torch_rows_per_sec: ember=<best> predict_batch_udf=<best> ratio=<v> median_ratio=<v>

  .venv/bin/python bench/inference_torch.py                  # 1,000,000 rows, 3 rounds
  .venv/bin/python bench/inference_torch.py --rows 50000 --repeats 1   # quick
"""
from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (sets PYTHONPATH/PYSPARK_PYTHON before Spark starts)

TORCH_SITE = C.REPO / ".torch-site"
if str(TORCH_SITE) not in sys.path:
    sys.path.append(str(TORCH_SITE))  # after the venv, as python/tests_torch has it
os.environ["PYTHONPATH"] = os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(TORCH_SITE)])
WIDTH = 784


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--warmup-rows", type=int, default=20_000)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--master", default="local[4]")
    p.add_argument("--driver-memory", default="6g")
    p.add_argument("--batch", type=int, default=1024, help="rows per model call (both contenders)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-extension", action="store_true", help="leave Ember's Spark extension out of the session")
    a = p.parse_args(argv)

    C.log(C.machine_info())
    import numpy as np
    import torch
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType

    import ember
    from ember.ml import TorchModel

    conf = {"spark.ui.showConsoleProgress": "false", "spark.sql.execution.arrow.maxRecordsPerBatch": "10000",
            "spark.driver.memory": a.driver_memory}
    if not a.no_extension:
        conf.update(ember.spark_conf(conf))
    builder = SparkSession.builder.master(a.master).appName("ember-bench-inference-torch")
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    C.log(C.versions() + f", torch {torch.__version__}")

    torch.manual_seed(1)
    module = torch.nn.Sequential(torch.nn.Linear(WIDTH, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    tm = TorchModel.from_torch(module, input_shape=[WIDTH], inputCol="features", outputMode="argmax",
                               predictBatchSize=a.batch)
    program = tm.model_bytes

    def make_predict_fn():  # what a predict_batch_udf user writes: load once, predict per batch
        import torch as t
        m = t.export.load(io.BytesIO(program)).module()

        def predict(x):
            with t.inference_mode():
                return np.argmax(m(t.from_numpy(x)).numpy(), axis=1).astype(np.float64)
        return predict

    pbu = predict_batch_udf(make_predict_fn, return_type=DoubleType(), batch_size=a.batch,
                            input_tensor_shapes=[[WIDTH]])
    C.own_python_workers(spark, "features", pbu)

    def data(rows: int):  # bench/inference.py's synthetic pixels
        return spark.range(rows, numPartitions=a.partitions).select(
            F.col("id"), F.expr(f"transform(sequence(1, {WIDTH}), i -> cast(((id * 7919 + i * 104729) "
                                f"% 256) / 255.0D as float))").alias("features")).cache()

    warm, df = data(a.warmup_rows), data(a.rows)
    C.log(f"data: {df.count():,} rows x {WIDTH} floats in {a.partitions} partitions, cached; "
          f"{warm.count():,} rows for warm-up")
    contenders = {"ember": lambda d: tm.transform(d),
                  "pbu": lambda d: d.withColumn("prediction", pbu(F.col("features")))}
    for name, fn in contenders.items():
        t0 = time.monotonic()
        fn(warm).write.format("noop").mode("overwrite").save()
        C.log(f"{name} warm-up: {time.monotonic() - t0:.1f} s")
    # The same predictions, row by row, before anything is timed.
    got = {name: fn(warm).orderBy("id").select("id", "prediction").toPandas() for name, fn in contenders.items()}
    x = np.array(warm.orderBy("id").select("features").toPandas()["features"].tolist(), np.float32)
    with torch.no_grad():
        logits = module.eval()(torch.from_numpy(x)).numpy()
    top2 = np.sort(logits, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-4
    for name, out in got.items():
        assert (out["prediction"].values[clear] == np.argmax(logits, axis=1)[clear]).all(), f"{name} differs"
    C.log(f"both contenders' predictions equal torch's on {int(clear.sum()):,} of {len(clear):,} warm-up rows "
          f"(the rest: top two logits within 1e-4)")
    runs = {name: [] for name in contenders}
    for i in range(a.repeats):
        for name, fn in contenders.items():
            t0 = time.monotonic()
            fn(df).write.format("noop").mode("overwrite").save()
            secs = time.monotonic() - t0
            runs[name].append(a.rows / secs)
            C.log(f"{name} (round {i + 1}): {a.rows} rows in {secs:.2f}s = {a.rows / secs:,.0f} rows/s; "
                  f"load {os.getloadavg()[0]:.2f}")
    best = {k: max(v) for k, v in runs.items()}
    med = {k: statistics.median(v) for k, v in runs.items()}
    C.log("medians: " + ", ".join(f"{k} {v:,.0f} rows/s" for k, v in med.items()))
    spark.stop()
    print(f"inference_torch_rows_per_sec: ember={best['ember']:.0f} predict_batch_udf={best['pbu']:.0f} "
          f"ratio={best['ember'] / best['pbu']:.2f} median_ratio={med['ember'] / med['pbu']:.2f}")


if __name__ == "__main__":
    main()
