"""Real Delta tables for test_delta.py, written by Spark with Delta Lake's own connector
(delta-spark from .delta/lib, `make setup-delta`) in a JVM of their own: the tests' shared
SparkSession has no Delta jars and cannot load them once started.

    python delta_tables.py OUT     # writes OUT/<table> and OUT/expected.json

expected.json holds, per table and version, the sorted `label` values Spark itself reads back
(`versionAsOf`), and the logs' facts the tests check (checkpoint versions, ...).
"""
from __future__ import annotations

import glob
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DELTA_JARS = sorted(glob.glob(str(ROOT / ".delta" / "lib" / "*.jar")))


def main(out: str) -> None:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    if not DELTA_JARS:
        raise SystemExit(f"no Delta jars in {ROOT / '.delta' / 'lib'}: run `make setup-delta`")
    spark = (SparkSession.builder.master("local[1]").appName("ember-delta-tables")
             .config("spark.jars", ",".join(DELTA_JARS))
             .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
             .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .config("spark.databricks.delta.snapshotPartitions", "1")  # the log's state: 1 task, not 50
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "1g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    def rows(start, stop, parts=2):
        return spark.range(start, stop, 1, parts).select(
            F.col("id").alias("label"), (F.col("id") % 3).cast("int").alias("part"),
            F.array(F.col("id").cast("float"), (F.col("id") * 2).cast("float")).alias("x"))

    expected = {}

    def record(name, path):
        versions = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version").collect()
        expected[name] = {str(v.version): sorted(r.label for r in spark.read.format("delta")
                                                 .option("versionAsOf", v.version).load(path).select("label").collect())
                          for v in versions}

    # 1. partitioned by `part`; v0 write, v1 append, v2 a DELETE (files rewritten: removes + adds),
    #    v3 an overwrite of one partition (replaceWhere)
    t = f"{out}/events"
    rows(0, 100).write.format("delta").partitionBy("part").save(t)
    rows(100, 130).write.format("delta").mode("append").save(t)
    spark.sql(f"DELETE FROM delta.`{t}` WHERE label < 10")
    rows(200, 260).where("part = 1").write.format("delta").mode("overwrite") \
        .option("replaceWhere", "part = 1").save(t)
    record("events", t)

    # 2. a checkpoint every 2 commits (v0..v5: checkpoints at 2 and 4)
    t = f"{out}/checkpointed"
    rows(0, 20, 1).write.format("delta").option("delta.checkpointInterval", "2").save(t)
    spark.sql(f"ALTER TABLE delta.`{t}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    for k in range(4):
        rows(20 + 10 * k, 30 + 10 * k, 1).write.format("delta").mode("append").save(t)
    record("checkpointed", t)
    expected["checkpoints"] = sorted(int(os.path.basename(p).split(".")[0])
                                     for p in glob.glob(f"{t}/_delta_log/*.checkpoint.parquet"))

    # 3. deletion vectors: a DELETE marks rows instead of rewriting files
    t = f"{out}/with_dv"
    spark.sql(f"CREATE TABLE delta.`{t}` (label BIGINT, part INT, x ARRAY<FLOAT>) USING delta "
              "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    rows(0, 50, 1).write.format("delta").mode("append").save(t)
    spark.sql(f"DELETE FROM delta.`{t}` WHERE label % 5 = 0")
    record("with_dv", t)

    # 4. column mapping by name: Parquet columns carry physical names, not the table's
    t = f"{out}/mapped"
    spark.sql(f"CREATE TABLE delta.`{t}` (label BIGINT, part INT, x ARRAY<FLOAT>) USING delta "
              "TBLPROPERTIES ('delta.columnMapping.mode' = 'name', 'delta.minReaderVersion' = '2', "
              "'delta.minWriterVersion' = '5')")
    rows(0, 10, 1).write.format("delta").mode("append").save(t)
    record("mapped", t)

    # Which of these DataFrames cluster.train would read in place (ember._driver.scan), asked in
    # this JVM, the one with Delta's reader: [columns or None, why not].
    from ember._driver.scan import parquet_scan
    from ember._driver.spark_side import spark_side
    side = spark_side(spark)
    frames = {
        "events_label_x": spark.read.format("delta").load(f"{out}/events").select("label", "x"),
        "events_all": spark.read.format("delta").load(f"{out}/events"),
        "events_v1": spark.read.format("delta").option("versionAsOf", 1).load(f"{out}/events").select("label"),
        "with_dv": spark.read.format("delta").load(f"{out}/with_dv"),
        "with_dv_v1": spark.read.format("delta").option("versionAsOf", 1).load(f"{out}/with_dv"),
        "mapped": spark.read.format("delta").load(f"{out}/mapped"),
    }
    expected["scans"] = {}
    for name, df in frames.items():
        scan, why = parquet_scan(df, side)
        expected["scans"][name] = [scan.columns if scan else None, why]

    Path(out, "expected.json").write_text(json.dumps(expected))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1])
