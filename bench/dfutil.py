#!/usr/bin/env python
"""DataFrame <-> TFRecord: rows/s of ember.data.save_as_tfrecords / load_tfrecords against Spark's
own Parquet writer and reader of the same DataFrame (the reference), and LinkedIn's spark-tfrecord
data source (Maven Central) where it runs on this Spark.

Data: --rows (200,000) Fashion-MNIST-shaped rows {image: 784-byte binary, label: int} in 8
partitions (bench/_common.py synthetic_df), cached and counted before any timing.  Spark
local[2] (the embedded default), one session for all contenders.

  write  ember     ember.data.save_as_tfrecords(df, dir)            image -> BytesList, label -> Int64List
         parquet   df.write.parquet(dir)
         tfrecord  df.write.format("tfrecord").option("recordType", "Example").save(dir)
  read   each reads back what it wrote, with the schema given, and materialises every column
         (df.write.format("noop"): no column can be pruned, every value is decoded)
         ember     ember.data.load_tfrecords(spark, dir, schema, binary_features=["image"])
         parquet   spark.read.parquet(dir)
         tfrecord  spark.read.format("tfrecord").option("recordType", "Example").schema(...).load(dir)

spark-tfrecord: com.linkedin.sparktfrecord:spark-tfrecord_2.13 (--tfrecord-version, 0.7.0: built
for Spark 3.5) through spark.jars.packages.  If it cannot be fetched or fails on this Spark, the
reason is printed and Parquet stays the only peer.  Each contender runs one untimed warm-up, then
--repeats timed runs, interleaved; medians are reported.

Last line:
  dfutil_rows_per_sec: ember_write=<v> parquet_write=<v> ember_read=<v> parquet_read=<v>
                       [tfrecord_write=<v> tfrecord_read=<v>] ratio_write=<ember/parquet> ratio_read=<ember/parquet>

  .venv/bin/python bench/dfutil.py                       # ~3 min
  .venv/bin/python bench/dfutil.py --rows 20000 --repeats 1 --no-tfrecord   # quick
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (sets PYTHONPATH/PYSPARK_PYTHON before Spark starts)

TFRECORD_PACKAGE = "com.linkedin.sparktfrecord:spark-tfrecord_2.13:{version}"


def make_session(packages: str | None):
    from pyspark.sql import SparkSession
    b = (SparkSession.builder.master("local[2]").appName("bench-dfutil")
         .config("spark.sql.shuffle.partitions", "8").config("spark.driver.memory", "4g")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false"))
    if packages:
        b = b.config("spark.jars.packages", packages)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def contenders(spark, schema, with_tfrecord: bool):
    import ember.data

    def ember_write(df, path):
        ember.data.save_as_tfrecords(df, path)

    def ember_read(path):
        return ember.data.load_tfrecords(spark, path, schema=schema, binary_features=["image"])

    def parquet_write(df, path):
        df.write.parquet(path)

    def parquet_read(path):
        return spark.read.schema(schema).parquet(path)

    out = {"ember": (ember_write, ember_read), "parquet": (parquet_write, parquet_read)}
    if with_tfrecord:
        def tfrecord_write(df, path):
            df.write.format("tfrecord").option("recordType", "Example").save(path)

        def tfrecord_read(path):
            return spark.read.format("tfrecord").option("recordType", "Example").schema(schema).load(path)

        out["tfrecord"] = (tfrecord_write, tfrecord_read)
    return out


def timed(fn) -> float:
    t = time.monotonic()
    fn()
    return time.monotonic() - t


def run_once(spark, df, rows: int, name: str, write, read, tmp: Path, run: str) -> tuple:
    path = str(tmp / f"{name}-{run}")
    w = timed(lambda: write(df, path))
    r = timed(lambda: read(path).write.format("noop").mode("overwrite").save())
    back = read(path).count()
    if back != rows:
        raise AssertionError(f"{name} read back {back} rows of {rows}")
    shutil.rmtree(path, ignore_errors=True)
    return rows / w, rows / r


def probe_tfrecord(spark, df, tmp: Path, write, read) -> str | None:
    """None if spark-tfrecord writes and reads here, else why not (one line)."""
    try:
        path = str(tmp / "probe")
        write(df.limit(100), path)
        n = read(path).count()
        shutil.rmtree(path, ignore_errors=True)
        return None if n == 100 else f"read back {n} of 100 rows"
    except Exception as e:  # noqa: BLE001 - any failure of the peer: say why and go on
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        return (lines[0] if lines else type(e).__name__)[:300]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tfrecord-version", default="0.7.0")
    p.add_argument("--no-tfrecord", action="store_true", help="skip the spark-tfrecord peer")
    p.add_argument("--json", help="also write the results here")
    args = p.parse_args(argv)

    C.log(f"machine: {C.machine_info()}")
    C.log(f"versions: {C.versions()}")
    tmp = Path(tempfile.mkdtemp(prefix="ember-bench-dfutil-"))
    spark, why_not = None, None
    try:
        if not args.no_tfrecord:
            package = TFRECORD_PACKAGE.format(version=args.tfrecord_version)
            try:
                spark = make_session(package)
            except Exception as e:  # noqa: BLE001 - Ivy could not fetch it: go on without
                why_not = (f"{package} could not be fetched (spark.jars.packages; Ivy's report is above: "
                           f"{str(e).splitlines()[0][:200]})")
                spark = None
        if spark is None:
            spark = make_session(None)
        from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType
        schema = StructType([StructField("image", BinaryType()), StructField("label", IntegerType())])
        df = C.synthetic_df(spark, args.rows, args.partitions)
        mb = args.rows * (C.IMAGE_BYTES + 4) / 1e6
        C.log(f"data: {args.rows} rows ({mb:.0f} MB of values) in {args.partitions} partitions, cached")
        with_tfrecord = not args.no_tfrecord and why_not is None
        cands = contenders(spark, schema, with_tfrecord)
        if with_tfrecord:
            why_not = probe_tfrecord(spark, df, tmp, *cands["tfrecord"])
            if why_not is not None:
                del cands["tfrecord"]
        if not args.no_tfrecord and why_not is not None:
            C.log(f"spark-tfrecord skipped: {why_not}")
        res = {name: {"write": [], "read": []} for name in cands}
        for name, (write, read) in cands.items():  # warm-up: JIT, Python workers, imports
            run_once(spark, df, args.rows, name, write, read, tmp, "warmup")
        for r in range(args.repeats):
            names = list(cands)
            for name in names[r % len(names):] + names[:r % len(names)]:
                w, rd = run_once(spark, df, args.rows, name, *cands[name], tmp, str(r))
                res[name]["write"].append(w)
                res[name]["read"].append(rd)
                C.log(f"{name:8s} repeat {r + 1}: write {w:,.0f} rows/s, read {rd:,.0f} rows/s")
    finally:
        if spark is not None:
            spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    med = {name: {k: C.median(v) for k, v in d.items()} for name, d in res.items()}
    print()
    print(f"medians over {args.repeats} repeats, rows/s ({args.rows} rows):")
    for name, m in med.items():
        print(f"  {name:8s} write {m['write']:10,.0f}   read {m['read']:10,.0f}")
    C.log(f"machine at end: {C.machine_info()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "runs": res, "medians": med,
                                               "tfrecord_skipped": why_not}, indent=1) + "\n")
    e, pq = med["ember"], med["parquet"]
    peer = ""
    if "tfrecord" in med:
        peer = f"tfrecord_write={C.fmt_rate(med['tfrecord']['write'])} tfrecord_read={C.fmt_rate(med['tfrecord']['read'])} "
    print(f"dfutil_rows_per_sec: ember_write={C.fmt_rate(e['write'])} parquet_write={C.fmt_rate(pq['write'])} "
          f"ember_read={C.fmt_rate(e['read'])} parquet_read={C.fmt_rate(pq['read'])} {peer}"
          f"ratio_write={e['write'] / pq['write']:.2f} ratio_read={e['read'] / pq['read']:.2f}")


if __name__ == "__main__":
    main()
