#!/usr/bin/env python
"""Inference over a plain Parquet scan: which way past Spark's Python-worker floor (issue 23, point 4)?

Measures, in one Spark application (local[N]) over the same Parquet files ({id: long,
features: array<float> of 784}, written once under --dir), the same Keras model
(784 -> Dense 128 relu -> Dense 10, argmax as a double ``prediction``), every row kept with
every column, output to Spark's ``noop`` sink:

  pbu            Spark's predict_batch_udf over ``features`` (the peer)
  floor          a pandas UDF over ``features`` returning zeros: Spark's hand-over of the array
                 column to a Python worker and back, no model
  scan           the scan alone, no Python (the ceiling of any way that keeps the passthrough
                 columns: Spark decodes them)
  rowidx         a pandas UDF over ``_metadata.file_path`` and ``_metadata.row_index`` only (two
                 scalars per row cross to Python); the worker reads ``features`` from the same row
                 groups with Arrow (no element-by-element copy), predicts, and Spark appends the
                 result in order: the "read in the task, join by position" way
  rowidx_nomodel the same, returning zeros without reading or predicting: its hand-over floor
  files          a mapInArrow task per file reading all its columns with Arrow, predicting and
                 returning them (the array column then crosses Python -> JVM instead)
  files_nomodel  the same without the model: the output direction's floor
  packed         a pandas UDF over ember_pack_floats(features) (Ember's Spark extension, loaded
                 through ember.spark_conf()): the numbers cross as one binary buffer per row, then
                 one float32 matrix per batch; what KerasModel.transform does in such a session
  packed_nomodel the same, returning zeros: the packed hand-over's floor
  transform      ember.ml.KerasModel.transform itself (since the fourteenth session: Spark keeps
                 the rows and joins the output by position, Arrow batches of the packed column
                 to the model, no pandas)

pbu and floor run in Python workers of their own (Ember settles the workers it runs in, which
would speed up a later UDF there).

Each contender runs once on a slice to warm up (workers import TensorFlow, load the model); then
the contenders take turns for --repeats rounds; medians are printed.  rowidx's predictions are
checked against pbu's, row by row, by id, and so are packed's.  The last line:
  inference_paths: transform_vs_pbu=<x> packed_vs_pbu=<x> rowidx_vs_pbu=<x> files_vs_pbu=<x> floor_vs_pbu=<x> scan_vs_pbu=<x>

  .venv/bin/python bench/inference_paths.py                  # 200,000 rows, 3 rounds
  .venv/bin/python bench/inference_paths.py --rows 50000 --repeats 1
  .venv/bin/python bench/inference_paths.py --only packed,packed_nomodel,floor,scan
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (sets PYTHONPATH/PYSPARK_PYTHON before Spark starts)

WIDTH = 784
_MODEL = {}


def _model(model_bytes: bytes):
    if "m" not in _MODEL:  # once per Python worker
        from ember.parallel import load_keras_model
        _MODEL["m"] = load_keras_model(model_bytes)
    return _MODEL["m"]


def _predict(m, x, batch: int):
    import numpy as np
    return np.concatenate([np.argmax(m.predict_on_batch(x[k:k + batch]), axis=1)
                           for k in range(0, len(x), batch)]).astype(np.float64)


def rowidx_udf(model_bytes: bytes, batch: int, with_model: bool):
    """pandas UDF over (file_path, row_index): features read from the file's row groups."""
    import numpy as np
    import pandas as pd

    def fn(it):
        import pyarrow.parquet as pq

        m = _model(model_bytes) if with_model else None
        opened = {}  # the last file: (ParquetFile, row-group starts, {group: features column})
        for files, index in it:
            if m is None:
                yield pd.Series(np.zeros(len(files)))
                continue
            f, ix = files.to_numpy(), index.to_numpy()
            out = np.empty(len(f))
            cuts = np.flatnonzero(f[1:] != f[:-1]) + 1
            for a, b in zip(np.r_[0, cuts], np.r_[cuts, len(f)]):
                name = f[a][5:] if f[a].startswith("file:") else f[a]
                if name not in opened:
                    pf = pq.ParquetFile(name)
                    starts = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)])
                    opened.clear()
                    opened[name] = (pf, starts, {})
                pf, starts, groups = opened[name]
                lo, hi = int(ix[a]), int(ix[b - 1]) + 1
                if not (ix[a:b] == np.arange(lo, hi)).all():
                    raise ValueError(f"{name}: rows {lo}..{hi} are not consecutive in this batch")
                parts = []
                for g in range(np.searchsorted(starts, lo, "right") - 1, np.searchsorted(starts, hi - 1, "right")):
                    if g not in groups:
                        groups.clear()
                        groups[g] = pf.read_row_group(g, columns=["features"]).column(0).combine_chunks()
                    s0, s1 = max(lo, starts[g]) - starts[g], min(hi, starts[g + 1]) - starts[g]
                    parts.append(groups[g].slice(s0, s1 - s0).flatten().to_numpy().reshape(-1, WIDTH))
                out[a:b] = _predict(m, parts[0] if len(parts) == 1 else np.concatenate(parts), batch)
            yield pd.Series(out)
    fn.__annotations__ = {"it": Iterator[Tuple[pd.Series, pd.Series]], "return": Iterator[pd.Series]}
    return fn


def files_fn(files, model_bytes: bytes, batch: int, with_model: bool):
    """mapInArrow over file numbers: each file's row groups read with Arrow, prediction appended."""
    import numpy as np

    def fn(it):
        import pyarrow as pa
        import pyarrow.parquet as pq

        m = _model(model_bytes) if with_model else None
        for b in it:
            for i in b.column(0).to_pylist():
                pf = pq.ParquetFile(files[i])
                for g in range(pf.num_row_groups):
                    for rb in pf.read_row_group(g).to_batches(10_000):
                        pred = (np.zeros(rb.num_rows) if m is None else
                                _predict(m, rb.column(1).flatten().to_numpy().reshape(-1, WIDTH), batch))
                        yield pa.RecordBatch.from_arrays(list(rb.columns) + [pa.array(pred)],
                                                         names=rb.schema.names + ["prediction"])
    return fn


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--dir", default="/tmp/ember-bench-inference-paths")
    p.add_argument("--master", default="local[4]")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--only", default="", help="comma-separated contenders to run (pbu always runs)")
    a = p.parse_args(argv)

    import numpy as np
    import pandas as pd
    from pyspark.ml.functions import predict_batch_udf

    import ember
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, StructField, StructType

    C.log(C.machine_info())
    spark = (SparkSession.builder.master(a.master).appName("ember-bench-inference-paths")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.execution.arrow.maxRecordsPerBatch", "10000")
             .config("spark.driver.memory", "6g")
             .config(map=ember.spark_conf())  # Ember's extension: ember_pack_floats, for "packed"
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    C.log(C.versions())
    path = os.path.join(a.dir, f"rows{a.rows}-files{a.files}")
    if not os.path.exists(os.path.join(path, "_SUCCESS")):
        spark.range(a.rows, numPartitions=a.files).select(
            F.col("id"), F.expr(f"transform(sequence(1, {WIDTH}), i -> cast(((id * 7919 + i * 104729) "
                                f"% 256) / 255.0 as float))").alias("features")
        ).write.mode("overwrite").option("parquet.block.size", 32 << 20).parquet(path)
    files = sorted(glob.glob(os.path.join(path, "*.parquet")))
    df = spark.read.parquet(path)
    C.log(f"data: {a.rows:,} rows x {WIDTH} floats in {len(files)} Parquet files under {path}")

    import keras

    from ember.parallel import keras_model_bytes
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((WIDTH,), name="x"), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10)])
    mb = keras_model_bytes(model)

    def make_predict_fn():
        m = _model(mb)
        return lambda x: np.argmax(m.predict_on_batch(x), axis=1).astype(np.float64)

    pbu = predict_batch_udf(make_predict_fn, return_type=DoubleType(), batch_size=a.batch,
                            input_tensor_shapes=[[WIDTH]])

    def zeros(series):
        for s in series:
            yield pd.Series(np.zeros(len(s)))
    zeros.__annotations__ = {"series": Iterator[pd.Series], "return": Iterator[pd.Series]}
    floor = F.pandas_udf(zeros, DoubleType())
    rowidx = F.pandas_udf(rowidx_udf(mb, a.batch, True), DoubleType())
    rowidx0 = F.pandas_udf(rowidx_udf(mb, a.batch, False), DoubleType())
    where = (F.col("_metadata.file_path"), F.col("_metadata.row_index"))
    out_schema = StructType(df.schema.fields + [StructField("prediction", DoubleType())])
    per_file = spark.range(len(files), numPartitions=len(files))
    def packed_fn(with_model):
        def fn(series):
            m = _model(mb) if with_model else None
            for s in series:
                if m is None:
                    yield pd.Series(np.zeros(len(s)))
                    continue
                x = np.frombuffer(b"".join(s.to_numpy()), "<f4").reshape(len(s), WIDTH)
                yield pd.Series(_predict(m, x, a.batch))
        fn.__annotations__ = {"series": Iterator[pd.Series], "return": Iterator[pd.Series]}
        return F.pandas_udf(fn, DoubleType())
    packed, packed0 = packed_fn(True), packed_fn(False)
    pk = F.call_function("ember_pack_floats", F.col("features"))
    C.own_python_workers(spark, "features", pbu, floor)
    from ember.ml import KerasModel
    km = KerasModel.from_keras(model, inputCol="features", outputMode="argmax", predictBatchSize=a.batch)
    contenders = {
        "transform": lambda: km.transform(df),
        "packed": lambda: df.withColumn("prediction", packed(pk)),
        "packed_nomodel": lambda: df.withColumn("prediction", packed0(pk)),
        "pbu": lambda: df.withColumn("prediction", pbu("features")),
        "floor": lambda: df.withColumn("prediction", floor("features")),
        "scan": lambda: df,
        "rowidx": lambda: df.withColumn("prediction", rowidx(*where)),
        "rowidx_nomodel": lambda: df.withColumn("prediction", rowidx0(*where)),
        "files": lambda: per_file.mapInArrow(files_fn(files, mb, a.batch, True), out_schema),
        "files_nomodel": lambda: per_file.mapInArrow(files_fn(files, mb, a.batch, False), out_schema),
    }
    if a.only:
        keep = {"pbu", *a.only.split(",")}
        contenders = {n: fn for n, fn in contenders.items() if n in keep}
    for name, fn in contenders.items():
        fn().limit(20_000).write.format("noop").mode("overwrite").save()
    expected = contenders["pbu"]().select("id", "prediction").orderBy("id").collect()
    for name in ("rowidx", "packed", "transform"):
        if name in contenders:
            got = contenders[name]().select("id", "prediction").orderBy("id").collect()
            differ = sum(g != e for g, e in zip(got, expected)) + abs(len(got) - len(expected))
            # transform's batches are cut by bytes, not pbu's rows: a row whose two best scores
            # tie to the last bit may rank the other way; more than that is a bug.
            if differ > (len(expected) // 10_000 if name == "transform" else 0):
                raise SystemExit(f"{name}'s predictions differ from predict_batch_udf's in {differ} rows")
            C.log(f"{name}'s predictions equal predict_batch_udf's, row by row ({differ} rows differ)")
    rates = {name: [] for name in contenders}
    for r in range(a.repeats):
        for name, fn in contenders.items():
            t0 = time.monotonic()
            fn().write.format("noop").mode("overwrite").save()
            secs = time.monotonic() - t0
            rates[name].append(a.rows / secs)
            C.log(f"{name} (round {r + 1}): {a.rows / secs:,.0f} rows/s, load {os.getloadavg()[0]:.2f}")
    spark.stop()
    med = {name: statistics.median(v) for name, v in rates.items()}
    for name, v in med.items():
        print(f"{name:15s} {v:>10,.0f} rows/s (median of {a.repeats}; {v / med['pbu']:.2f} of pbu)")
    print(f"load average {os.getloadavg()}")
    print("inference_paths: " + " ".join(f"{n}_vs_pbu={med[n] / med['pbu']:.2f}"
                                         for n in ("transform", "packed", "rowidx", "files", "floor", "scan")
                                         if n in med))


if __name__ == "__main__":
    main()
