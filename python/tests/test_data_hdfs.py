"""ember.data against a real HDFS (hadoop-minicluster on loopback, reached over WebHDFS):
DataFrame <-> TFRecord round trips, node-side reading, and the TENSORFLOW-mode main job
(examples/fashion_mnist/main.py) with its data on HDFS."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

import ember
import ember.data
from ember import _ember
from ember.data import _fs

from test_data import every_type_df

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples" / "fashion_mnist"


def test_dataframe_round_trip_on_hdfs(spark_on_hdfs, hdfs):
    spark = spark_on_hdfs
    df = every_type_df(spark)
    out = f"{hdfs.default_fs}/t/{uuid.uuid4().hex[:8]}"
    assert ember.data.save_as_tfrecords(df, out, compression="gzip") == 41
    opts = _fs.resolve_options()
    names = _ember.fs_list(out, opts)
    assert "_SUCCESS" in names and sum(n.startswith("part-r-") and n.endswith(".gz") for n in names) == 6
    assert "_temporary" not in names
    back = {r["i"]: r for r in ember.data.load_tfrecords(spark, out, schema=df.schema).collect()}
    for r in df.collect():
        g = back[r["i"]]
        assert (g["l"], g["s"], g["al"], g["as"]) == (r["l"], r["s"], r["al"], r["as"])
    # A path with no scheme lives in fs.defaultFS, as in Spark.
    path_only = out[len(hdfs.default_fs):]
    assert ember.data.load_tfrecords(spark, path_only, schema=df.schema).count() == 41


def test_node_side_batches_from_hdfs(spark_on_hdfs, hdfs, tmp_path):
    import tensorflow as tf
    spark = spark_on_hdfs
    df = spark.createDataFrame([(i, [i] * 3) for i in range(100)], "id long, v array<long>")
    out = f"{hdfs.default_fs}/n/{uuid.uuid4().hex[:8]}"
    ember.data.save_as_tfrecords(df.repartition(4), out)
    spec = {"id": tf.io.FixedLenFeature([], tf.int64), "v": tf.io.FixedLenFeature([3], tf.int64)}
    seen = []
    for shard in range(2):  # two nodes: two files each
        for b in ember.data.tfrecord_batches(f"{out}/part-r-*", spec, 16, shard=(shard, 2)):
            assert (b["v"] == b["id"][:, None]).all()
            seen.extend(b["id"].tolist())
    assert sorted(seen) == list(range(100))


def test_parquet_read_in_place_from_hdfs(spark_on_hdfs, hdfs):
    """Issue 23: Spark writes a partitioned Parquet table to HDFS; two shards read it back over
    WebHDFS (Arrow's reader over Ember's FileSystem layer: footers and column chunks at their
    offsets), every row once, the partition key and the array column in their numpy forms."""
    spark = spark_on_hdfs
    out = f"{hdfs.default_fs}/pq/{uuid.uuid4().hex[:8]}"
    spark.range(0, 300, 1, 3).selectExpr("id", "id % 2 as half", "array(cast(id as float), 1.0f) as v") \
        .write.partitionBy("half").parquet(out)
    seen = []
    for shard in range(2):
        data = ember.data.parquet_batches(out, {"id": None, "v": (2,), "half": None}, 32, shard=(shard, 2),
                                          shuffle=True)
        for b in data:
            assert (b["v"][:, 0] == b["id"]).all() and (b["half"] == b["id"] % 2).all()
            seen.extend(b["id"].tolist())
    assert sorted(seen) == list(range(300))
    # The partition filter: only half=1's files are opened; a path without a scheme is on fs.defaultFS.
    odd = ember.data.parquet_batches(out[len(hdfs.default_fs):], ["id"], 64, partition_filter={"half": 1})
    assert sorted(int(i) for b in odd for i in b["id"]) == list(range(1, 300, 2))


def test_file_uris_are_read_locally_where_the_default_fs_is_hdfs(spark_on_hdfs, hdfs, tmp_path):
    """Issue 18: with fs.defaultFS on HDFS, file:// paths were read from HDFS: the glob gave
    "/tmp/..." without its scheme and the readers resolved that on the default file system
    ("NotFound: hdfs://.../tmp/...").  A path with a scheme is kept as it is, everywhere."""
    spark = spark_on_hdfs
    df = spark.createDataFrame([(i, [i] * 2, f"s{i}") for i in range(30)], "id long, v array<long>, s string")
    local = f"file://{tmp_path}/tfr"
    assert ember.data.save_as_tfrecords(df.repartition(3), local) == 30
    parts = sorted(p.name for p in (tmp_path / "tfr").glob("part-r-*"))
    assert len(parts) == 3  # written to the local disk
    opts = _fs.resolve_options()
    assert opts.default_fs == hdfs.default_fs
    with pytest.raises(Exception, match="NotFound"):  # and not to HDFS
        _ember.fs_stat(str(tmp_path / "tfr"), opts)
    # Globs keep the pattern's scheme ...
    assert _fs.expand(f"{local}/part-r-*", opts) == [f"{local}/{p}" for p in parts]
    assert _fs.expand(f"file:{tmp_path}/tfr", opts) == [f"{local}/{p}" for p in parts]  # Hadoop's file:/x
    # ... and every reader reads the local files: Spark tasks (schema given and inferred) ...
    want = sorted((r["id"], r["v"], r["s"]) for r in df.collect())
    for loaded in (ember.data.load_tfrecords(spark, local, schema=df.schema),
                   ember.data.load_tfrecords(spark, f"{local}/part-r-*")):
        assert sorted((r["id"], r["v"], r["s"]) for r in loaded.collect()) == want
    # ... and the node-side batches (resolved with the active Spark's fs.defaultFS).
    ids = []
    for b in ember.data.tfrecord_batches(local, {"id": ("int64", ())}, 8):
        ids.extend(b["id"].tolist())
    assert sorted(ids) == list(range(30))
    # A path qualified by the same rule (ctx.absolute_path) keeps its scheme as well.
    from ember.context import absolute_path
    assert absolute_path(local, hdfs.default_fs, "/work") == local
    assert absolute_path(f"file:{tmp_path}", hdfs.default_fs, "/work") == f"file:{tmp_path}"
    assert absolute_path(str(tmp_path), hdfs.default_fs, "/work") == f"{hdfs.default_fs}{tmp_path}"


def upload_fashion_mnist(hdfs, local_dir: Path, remote: str) -> None:
    opts = _fs.options_from(hdfs.default_fs, hdfs.http_address)
    for split in ("train", "test"):
        for f in sorted((local_dir / split).iterdir()):
            _ember.fs_write_file(f"{remote}/{split}/{f.name}", f.read_bytes(), opts)


@pytest.mark.parametrize("api_mode", ["classic", "connect"])
def test_tensorflow_mode_main_job_reads_hdfs(hdfs, tmp_path, api_mode):
    """examples/fashion_mnist/main.py, unchanged, run as `make run` runs it but with
    --data-dir hdfs://... and the cluster's Hadoop settings given to Spark: 2 nodes read their
    shards over WebHDFS (no libhdfs, no CLASSPATH) and train with model.fit.  Under Spark 4's
    SPARK_API_MODE=connect the same program's builder starts a Spark Connect server on its
    master and hands main.py a Connect session (issue 22: the README's job from a Connect client)."""
    sys.path.insert(0, str(EXAMPLE_DIR))
    import data
    local = Path(data.DEFAULT_DATA_DIR)
    data.convert(local)
    remote = f"{hdfs.default_fs}/fashion"
    upload_fashion_mnist(hdfs, local, remote)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_API_MODE=api_mode, PYSPARK_SUBMIT_ARGS=(
        f"--conf spark.hadoop.fs.defaultFS={hdfs.default_fs} "
        f"--conf spark.hadoop.dfs.namenode.http-address={hdfs.http_address} pyspark-shell"))
    proc = subprocess.run([sys.executable, str(EXAMPLE_DIR / "main.py"), "--epochs", "1", "--data-dir", remote,
                           "--model-dir", str(tmp_path), "--threads", "1"],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())  # written by the chief
    assert metrics["epochs"] == 1 and metrics["test_accuracy"] >= 0.75, metrics
    assert "test_accuracy=" in proc.stdout + proc.stderr
    # Which kind of session main.py's builder gave Ember (its console names a Connect session's master).
    assert ("from a Spark Connect session" in proc.stdout + proc.stderr) == (api_mode == "connect"), \
        proc.stderr[-3000:]
    assert not Path(remote).exists()  # nothing was converted locally instead (Path makes it "hdfs:/...")
