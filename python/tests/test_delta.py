"""ember.data reads Delta Lake tables in place (issue 23): the snapshot at any version (the
newest checkpoint, then the commits after it), its files shared among nodes as Parquet's are,
partition columns typed by the table's schema; on HDFS over WebHDFS; in a job's nodes; and what
it cannot read refused naming why (deletion vectors, column mapping, a commit gone from the log,
a data file gone).  Spark writes every table, with Delta Lake's own connector
(python/tests/delta_tables.py, in a JVM of its own), and says what each version holds."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

import ember
from ember import errors
from ember.data import delta_batches, delta_snapshot

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    out = tmp_path_factory.mktemp("delta")
    proc = subprocess.run([sys.executable, str(HERE / "delta_tables.py"), str(out)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads((out / "expected.json").read_text())


def _labels(table, version=None, nodes=2, **kw):
    seen = []
    for i in range(nodes):
        for b in delta_batches(str(table), {"label": None, "part": None, "x": (2,)}, 16, version=version, shard=(i, nodes), **kw):
            assert b["part"].dtype == np.int32 or b["part"].dtype == np.int64
            assert (b["part"] == b["label"] % 3).all()  # typed from the table's schema, per file
            assert b["x"].shape == (len(b["label"]), 2) and (b["x"][:, 0] == b["label"]).all()
            seen.extend(b["label"].tolist())
    return seen


def test_every_version_reads_what_spark_reads(tables):
    out, expected = tables
    for name in ("events", "checkpointed"):
        for version, want in expected[name].items():
            got = _labels(out / name, int(version), nodes=2)
            assert sorted(got) == want, (name, version)  # every row once, over both nodes
        newest = max(int(v) for v in expected[name])
        assert delta_snapshot(str(out / name)).version == newest
        assert sorted(_labels(out / name, nodes=3)) == expected[name][str(newest)]


def test_partition_filter_and_the_default_columns(tables):
    out, expected = tables
    got = _labels(out / "events", partition_filter={"part": "1"}, nodes=1)
    assert sorted(got) == [v for v in expected["events"]["3"] if v % 3 == 1]
    snap = delta_snapshot(str(out / "events"))
    assert snap.partition_columns == ["part"] and all(set(p) == {"part"} for p in snap.partition_values)
    b = next(iter(delta_batches(str(out / "events"), batch_size=4, shard=(0, 1))))
    assert list(b) == ["label", "part", "x"]  # the table's columns, its partition column among them


def test_a_checkpoint_stands_for_the_commits_before_it(tables, tmp_path):
    """With the commits up to 3 gone (as the log's retention removes them), versions 4 and 5 are
    read from checkpoint 4; version 3 cannot be rebuilt, and the error says which commit is gone."""
    out, expected = tables
    assert expected["checkpoints"] == [2, 4]
    t = tmp_path / "t"
    shutil.copytree(out / "checkpointed", t)
    for v in range(4):
        os.remove(t / "_delta_log" / f"{v:020d}.json")
    for v in ("4", "5"):
        assert sorted(_labels(t, int(v))) == expected["checkpointed"][v]
    with pytest.raises(errors.NotFound, match=r"version 3 cannot be rebuilt, commit 3 is not in"):
        delta_snapshot(str(t), 3)
    # The snapshot from checkpoint 4 and commit 5 is the one from all six commits.
    names = [[os.path.basename(f) for f in delta_snapshot(str(d), 5).files] for d in (t, out / "checkpointed")]
    assert names[0] == names[1] and len(names[0]) == 5  # a file per write


def test_what_cannot_be_read_is_refused_naming_why(tables, tmp_path):
    out, expected = tables
    # Deletion vectors: the version with one is refused; the one before reads.
    with pytest.raises(errors.InvalidArgument, match=r"carry deletion vectors .*REORG TABLE"):
        delta_batches(str(out / "with_dv"), ["label"], 8, shard=(0, 1))
    before = str(int(max(expected["with_dv"], key=int)) - 1)
    got = [int(v) for b in delta_batches(str(out / "with_dv"), ["label"], 8, version=int(before), shard=(0, 1))
           for v in b["label"]]
    assert sorted(got) == expected["with_dv"][before]
    with pytest.raises(errors.InvalidArgument, match=r"maps columns by 'name'"):
        delta_batches(str(out / "mapped"), ["label"], 8, shard=(0, 1))
    with pytest.raises(errors.NotFound, match=r"has no version 9 \(its versions end at 3\)"):
        delta_snapshot(str(out / "events"), 9)
    with pytest.raises(errors.NotFound, match=r"not a Delta table"):
        delta_snapshot(str(tmp_path))
    # A data file the log lists, gone: named, with the table and version that list it.
    t = tmp_path / "events"
    shutil.copytree(out / "events", t)
    victim = delta_snapshot(str(t)).files[0]
    os.remove(victim[len("file://"):] if victim.startswith("file://") else victim)
    with pytest.raises(errors.NotFound, match=rf"{os.path.basename(victim)}: no such Parquet file; Delta table "
                                              rf".* at version 3 lists it"):
        delta_batches(str(t), ["label"], 8, shard=(0, 1))
    # A commit that is not JSON: the file and line.
    (t / "_delta_log" / f"{4:020d}.json").write_text('{"commitInfo": {}}\n{"add": \n')
    with pytest.raises(errors.Corruption, match=rf"{4:020d}.json, line 2: not a JSON action"):
        delta_snapshot(str(t))


def test_a_delta_table_on_hdfs(tables, spark_on_hdfs, hdfs):
    """The table copied to HDFS by Hadoop's own client; its log and files read over WebHDFS."""
    out, expected = tables
    jvm = spark_on_hdfs.sparkContext._jvm
    conf = spark_on_hdfs.sparkContext._jsc.hadoopConfiguration()
    dest = f"{hdfs.default_fs}/delta/{uuid.uuid4().hex[:8]}"
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI(hdfs.default_fs), conf)
    fs.copyFromLocalFile(jvm.org.apache.hadoop.fs.Path(f"file://{out / 'events'}"), jvm.org.apache.hadoop.fs.Path(dest))
    for version in ("1", "3"):
        assert sorted(_labels(dest, int(version))) == expected["events"][version]
    assert all(f.startswith(dest + "/part=") for f in delta_snapshot(dest).files)


def delta_node(args, ctx):
    """A node reads its share of the table (the shard from ctx), in equal batches."""
    data = ember.data.delta_batches(args["table"], ["label"], 8, equal_batches=True)
    labels = [int(v) for b in data for v in b["label"]]
    with open(os.path.join(args["out"], f"{ctx.task_index}.json"), "w") as f:
        json.dump({"labels": labels, "node_rows": data.node_rows, "batches": data.batches_per_pass}, f)


def test_two_nodes_read_their_shares_of_a_delta_table(spark, tables, tmp_path):
    out, expected = tables
    res = tmp_path / "res"
    res.mkdir()
    cluster = ember.Cluster.run(spark, delta_node, {"table": str(out / "events"), "out": str(res)},
                                num_executors=2, reservation_timeout=120)
    cluster.shutdown(timeout=240)
    reports = [json.loads((res / f"{i}.json").read_text()) for i in range(2)]
    want = expected["events"]["3"]
    assert reports[0]["node_rows"] == reports[1]["node_rows"] and sum(reports[0]["node_rows"]) == len(want)
    assert len(reports[0]["labels"]) == len(reports[1]["labels"]) == 8 * reports[0]["batches"]
    both = reports[0]["labels"] + reports[1]["labels"]
    assert len(set(both)) == len(both) and set(both) <= set(want)
    assert len(want) - len(both) < 16  # equal full batches: at most a batch short per node


def test_cluster_train_reads_a_delta_table_in_place_only_where_its_files_are_its_rows(tables):
    """A Delta scan prints as a Parquet relation; cluster.train reads its files in place only where
    Ember's log reader reads the newest snapshot and its files are the DataFrame's (asked in the
    JVM with Delta's connector, delta_tables.py)."""
    _, expected = tables
    scans = expected["scans"]
    assert scans["events_label_x"] == [["label", "x"], ""]
    assert scans["events_all"][0] is None and "'part' is not in the files (a partition column)" in scans["events_all"][1]
    assert scans["events_v1"][0] is None and "other than its newest (3): time travel" in scans["events_v1"][1]
    # Deletion vectors hide rows the files still hold: the newest version's rows go through Spark.
    assert scans["with_dv"][0] is None and "carry deletion vectors" in scans["with_dv"][1]
    assert scans["with_dv_v1"][0] is None  # an older version: Spark's, whatever its files
    assert scans["mapped"][0] is None and "maps columns by 'name'" in scans["mapped"][1]
