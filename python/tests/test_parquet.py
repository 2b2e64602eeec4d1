"""ember.data reads Parquet in place (issue 23): a node's shard of row groups, balanced by rows;
projection, Hive partitions, shuffling, equal batches for synchronous training; the column
forms of the module's table; files Spark wrote; a 2-node job training from Parquet; and bad
input named by file, row group and column.  Arrow's own writer makes most files here (the real
reader is under test, the files are the fixture); Spark writes the others."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ember
from ember import errors
from ember.data import RawBytes, parquet_batches


def _write(path, table, row_group_size):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, str(path), row_group_size=row_group_size)
    return path


def _ids(start, n):
    return pa.table({"id": pa.array(range(start, start + n), pa.int64()),
                     "x": pa.array(np.arange(start, start + n, dtype=np.float32) * 0.5)})


@pytest.fixture
def uneven(tmp_path):
    """Three files, 1000 rows in row groups of 100, 300 (and a short last one), 70."""
    d = tmp_path / "uneven"
    _write(d / "part-0.parquet", _ids(0, 400), 100)      # 4 groups of 100
    _write(d / "part-1.parquet", _ids(400, 530), 300)    # 300 + 230
    _write(d / "part-2.parquet", _ids(930, 70), 70)      # 70
    (d / "_SUCCESS").write_text("")                      # Spark's marker: skipped
    return d


def _all(batches):
    out = {}
    for b in batches:
        for k, v in b.items():
            out.setdefault(k, []).append(v)
    return {k: np.concatenate(v) for k, v in out.items()}


@pytest.mark.parametrize("count", [1, 2, 3, 4, 9])
def test_every_row_once_over_the_nodes_balanced_by_rows(uneven, count):
    parts = [parquet_batches(str(uneven), batch_size=64, shard=(i, count)) for i in range(count)]
    seen = np.concatenate([_all(p)["id"] for p in parts])
    assert sorted(seen.tolist()) == list(range(1000))
    rows = parts[0].node_rows
    assert all(p.node_rows == rows for p in parts)  # every node makes the same plan
    assert [p.rows for p in parts] == rows and sum(rows) == 1000
    # Largest first to the emptiest node: no node is a whole row group (at most 300 rows) behind.
    assert max(rows) - min(rows) <= 300, rows
    if count == 9:  # 7 row groups for 9 nodes: each row group is cut into a range per node
        assert max(rows) - min(rows) <= 40, rows
    x = np.concatenate([_all(p)["x"] for p in parts])
    assert np.array_equal(np.sort(x), np.arange(1000, dtype=np.float32) * 0.5)


def test_batches_in_order_carry_rows_across_row_groups(uneven):
    b = parquet_batches(str(uneven / "part-0.parquet"), ["id"], batch_size=64)
    sizes = [len(x["id"]) for x in b]
    assert sizes == [64] * 6 + [16] and b.batches_per_pass == 7
    assert _all(b)["id"].tolist() == list(range(400))  # in file order without shuffling
    b = parquet_batches(str(uneven / "part-0.parquet"), ["id"], batch_size=64, drop_remainder=True)
    assert [len(x["id"]) for x in b] == [64] * 6 and b.stats == {"row_groups": 4, "rows": 400, "batches": 6}
    assert list(_all(b)) == ["id"]  # projection: only the columns asked for


def test_equal_batches_give_every_node_the_same_count(uneven):
    parts = [parquet_batches(str(uneven), batch_size=50, shard=(i, 3), equal_batches=True) for i in range(3)]
    counts = [sum(1 for _ in p) for p in parts]
    assert len(set(counts)) == 1 and counts[0] == min(r // 50 for r in parts[0].node_rows)
    assert all(p.batches_per_pass == counts[0] for p in parts)
    assert all(len(b["id"]) == 50 for p in parts for b in p)


def test_shuffle_differs_every_pass_keeps_every_row_and_is_seeded(uneven):
    b = parquet_batches(str(uneven), batch_size=100, shuffle=True, shuffle_buffer=250, seed=7)
    first, second = _all(b)["id"], _all(b)["id"]
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(1000))
    assert not np.array_equal(first, second) and not np.array_equal(first, np.arange(1000))
    again = parquet_batches(str(uneven), batch_size=100, shuffle=True, shuffle_buffer=250, seed=7)
    assert np.array_equal(_all(again)["id"], first)  # the same seed, the same first pass
    # Rows mix across row groups (the pool), not only within them: some batch spans groups.
    assert any(len({int(v) // 100 for v in x["id"]}) > 2 for x in
               parquet_batches(str(uneven / "part-0.parquet"), batch_size=100, shuffle=True, shuffle_buffer=250))


def test_column_forms(tmp_path):
    n = 10
    table = pa.table({
        "i": pa.array(range(n), pa.int32()),
        "f": pa.array(np.linspace(0, 1, n), pa.float64()),
        "flag": pa.array([i % 2 == 0 for i in range(n)]),
        "fixed": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * 4, dtype=np.float32)), 4),
        "nested": pa.FixedSizeListArray.from_arrays(
            pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * 6, dtype=np.int64)), 3), 2),
        "spark_array": pa.array([[float(i)] * 4 for i in range(n)], pa.list_(pa.float32())),
        "ragged": pa.array([list(range(i % 3)) for i in range(n)], pa.list_(pa.int64())),
        "pixels": pa.array([bytes([i] * 4) for i in range(n)], pa.binary()),
        "name": pa.array([f"r{i}" for i in range(n)], pa.string()),
    })
    path = _write(tmp_path / "forms.parquet", table, 4)  # row groups of 4, 4, 2: batches of 3 span them
    b = _all(parquet_batches(str(path), {"i": None, "f": None, "flag": None, "fixed": None, "nested": None,
                                         "spark_array": (2, 2), "pixels": RawBytes((2, 2)), "name": None},
                             batch_size=3))
    assert b["i"].dtype == np.int32 and b["i"].tolist() == list(range(n))
    assert b["f"].dtype == np.float64 and b["flag"].dtype == bool
    assert b["fixed"].shape == (n, 4) and b["fixed"][3].tolist() == [12, 13, 14, 15]
    assert b["nested"].shape == (n, 2, 3) and b["nested"][1].tolist() == [[6, 7, 8], [9, 10, 11]]
    assert b["spark_array"].shape == (n, 2, 2) and b["spark_array"].dtype == np.float32
    assert (b["spark_array"][5] == 5).all()
    assert b["pixels"].shape == (n, 2, 2) and b["pixels"].dtype == np.uint8 and (b["pixels"][7] == 7).all()
    assert b["name"].tolist() == [f"r{i}" for i in range(n)]
    # A list without a shape is (values, row_splits), as a tf.Example VarLenFeature.
    rows = []
    for batch in parquet_batches(str(path), ["ragged"], batch_size=3):
        values, splits = batch["ragged"]
        rows += [values[splits[k]:splits[k + 1]].tolist() for k in range(len(splits) - 1)]
    assert rows == [list(range(i % 3)) for i in range(n)]
    # Shuffled, the ragged rows stay whole.
    for batch in parquet_batches(str(path), ["i", "ragged"], batch_size=4, shuffle=True, shuffle_buffer=3):
        values, splits = batch["ragged"]
        assert [values[splits[k]:splits[k + 1]].tolist() for k in range(len(batch["i"]))] == \
            [list(range(i % 3)) for i in batch["i"]]


def test_hive_partitions_filter_and_columns(tmp_path):
    root = tmp_path / "table"
    for day in (1, 2, 3):
        _write(root / f"day={day}" / "part-0.parquet", _ids(day * 100, 10), 5)
    b = parquet_batches(str(root), ["id", "day"], batch_size=8, partition_filter={"day": [1, 3]})
    out = _all(b)
    assert sorted(out["id"].tolist()) == list(range(100, 110)) + list(range(300, 310))
    assert out["day"].dtype == np.int64 and (out["day"] == out["id"] // 100).all()
    only = _all(parquet_batches(str(root), ["id"], batch_size=8, partition_filter=lambda p: p["day"] == "2"))
    assert sorted(only["id"].tolist()) == list(range(200, 210))
    with pytest.raises(errors.NotFound, match="partitions"):
        parquet_batches(str(root), batch_size=8, partition_filter={"day": 9})


def test_files_spark_wrote_partitioned_with_array_columns(spark, tmp_path):
    df = spark.range(0, 500, 1, 5).selectExpr(
        "id", "id % 3 as part", "array(cast(id as float), cast(id as float) * 2) as v", "cast(id as string) as s")
    out = str(tmp_path / "spark_table")
    df.write.partitionBy("part").parquet(out)
    seen = {}
    for shard in range(2):
        for batch in parquet_batches(out, {"id": None, "v": (2,), "part": None, "s": None}, 64, shard=(shard, 2)):
            assert (batch["v"][:, 1] == 2 * batch["v"][:, 0]).all() and (batch["v"][:, 0] == batch["id"]).all()
            assert (batch["part"] == batch["id"] % 3).all()
            assert [int(s) for s in batch["s"]] == batch["id"].tolist()
            for i in batch["id"].tolist():
                seen[i] = seen.get(i, 0) + 1
    assert sorted(seen) == list(range(500)) and set(seen.values()) == {1}


def test_bad_input_is_named(tmp_path):
    good = _write(tmp_path / "a" / "part-0.parquet", _ids(0, 20), 10)
    # A missing column names the file and what it has.
    with pytest.raises(errors.InvalidArgument, match=r"part-0\.parquet: no column 'nope' \(it has \['id', 'x'\]"):
        parquet_batches(str(good), ["nope"])
    # Schemas that differ between files name both files and the column.
    _write(tmp_path / "a" / "part-1.parquet", pa.table({"id": pa.array(["s"] * 5), "x": pa.array([0.0] * 5)}), 5)
    with pytest.raises(errors.InvalidArgument, match=r"part-1\.parquet: column 'id' is string, .*part-0\.parquet has int64"):
        parquet_batches(str(tmp_path / "a"))
    # Nulls name the file, row group and column.
    nulls = _write(tmp_path / "n.parquet", pa.table({"id": pa.array([1, None, 3] * 4, pa.int64())}), 6)
    with pytest.raises(errors.InvalidArgument, match=r"n\.parquet, row group 0, column 'id': 2 null"):
        list(parquet_batches(str(nulls)))
    # Raw bytes of the wrong width name the row.
    widths = _write(tmp_path / "w.parquet", pa.table({"p": pa.array([b"abcd", b"abcd", b"abc"])}), 10)
    with pytest.raises(errors.InvalidArgument, match=r"w\.parquet, row group 0, column 'p': row 2 .* 3 bytes"):
        list(parquet_batches(str(widths), {"p": RawBytes((2, 2))}))
    # A list shape that does not fit names the row.
    with pytest.raises(errors.InvalidArgument, match=r"column 'v': row 1 of the row group holds 1 values"):
        list(parquet_batches(str(_write(tmp_path / "l.parquet", pa.table({"v": pa.array([[1, 2], [3]])}), 5)),
                             {"v": (2,)}))
    # Empty: no files, or files without rows.
    with pytest.raises(errors.NotFound):
        parquet_batches(str(tmp_path / "missing"))
    empty = _write(tmp_path / "e" / "part-0.parquet", _ids(0, 0), 10)
    with pytest.raises(errors.NotFound, match="no rows"):
        parquet_batches(str(empty.parent))
    # Not Parquet at all.
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all, just text" * 10)
    with pytest.raises(errors.Corruption, match=r"junk\.parquet: not a readable Parquet file"):
        parquet_batches(str(tmp_path / "junk.parquet"))


def test_truncated_files_fail_cleanly_naming_the_file(tmp_path):
    """Fuzz-style: a Parquet file cut at many lengths either still opens (never, here: the
    footer is at the end) or fails with an EmberError naming the file; nothing crashes."""
    data = _write(tmp_path / "whole.parquet", _ids(0, 300), 50).read_bytes()
    rng = np.random.default_rng(3)
    cuts = sorted({0, 1, 4, 8, len(data) - 1, len(data) - 8, *rng.integers(1, len(data), 40).tolist()})
    for cut in cuts:
        p = tmp_path / f"cut-{cut}.parquet"
        p.write_bytes(data[:cut])
        with pytest.raises(errors.EmberError, match=rf"cut-{cut}\.parquet"):
            list(parquet_batches(str(p)))
    # A corrupt column chunk (footer intact): the row group's read names file and row group.
    bad = bytearray(data)
    bad[200:260] = b"\xff" * 60
    (tmp_path / "flipped.parquet").write_bytes(bytes(bad))
    try:
        got = _all(parquet_batches(str(tmp_path / "flipped.parquet")))
    except errors.EmberError as e:
        assert "flipped.parquet, row group" in str(e), e
    else:  # the bytes hit padding Arrow does not read: then every row is what was written
        assert got["id"].tolist() == list(range(300))


def test_tf_dataset_shapes(tmp_path):
    import tensorflow as tf
    table = pa.table({"image": pa.array([bytes([i % 256]) * 784 for i in range(50)]),
                      "label": pa.array(range(50), pa.int64()),
                      "tags": pa.array([[1] * (i % 3) for i in range(50)], pa.list_(pa.int64()))})
    path = _write(tmp_path / "img.parquet", table, 20)
    ds = ember.data.parquet_dataset(str(path), {"image": RawBytes((28, 28)), "label": None, "tags": None},
                                    batch_size=16)
    batches = list(ds)
    assert [int(b["label"].shape[0]) for b in batches] == [16, 16, 16, 2]
    assert batches[0]["image"].shape == (16, 28, 28) and batches[0]["image"].dtype == tf.uint8
    assert isinstance(batches[0]["tags"], tf.RaggedTensor)
    assert batches[1]["tags"].row_lengths().numpy().tolist() == [(16 + i) % 3 for i in range(16)]


def parquet_node(args, ctx):
    """Each node trains a linear model on its shard of the Parquet files with model.fit and
    Ember's synchronous training (equal batches on both nodes), then reports."""
    import keras
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    keras.utils.set_random_seed(1)
    data = ember.data.parquet_batches(args["path"], {"x": (2,), "y": None}, batch_size=25, shuffle=True,
                                      equal_batches=True)
    ds = data.to_tf_dataset().map(lambda b: (b["x"], b["y"]))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=ember.keras.DistributedOptimizer(keras.optimizers.SGD(0.2)), loss="mse")
    history = model.fit(ds, epochs=8, callbacks=[ember.keras.SyncCallback()], verbose=0)
    w = model.get_weights()[0].ravel().tolist()
    with open(os.path.join(args["out"], f"{ctx.task_index}.json"), "w") as f:
        json.dump({"rows": data.rows, "node_rows": data.node_rows, "batches": data.batches_per_pass,
                   "loss": history.history["loss"], "w": w}, f)


def test_two_nodes_train_from_parquet_in_sync(spark, tmp_path):
    rng = np.random.default_rng(0)
    d = tmp_path / "lin"
    for i in range(3):  # y = 2 x0 - x1: 3 files, row groups of 40
        x = rng.uniform(-1, 1, size=(160, 2)).astype(np.float32)
        y = (2 * x[:, 0] - x[:, 1]).astype(np.float32)
        _write(d / f"part-{i}.parquet",
               pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 2), "y": pa.array(y)}), 40)
    out = tmp_path / "out"
    out.mkdir()
    cluster = ember.Cluster.run(spark, parquet_node, {"path": str(d), "out": str(out)}, num_executors=2,
                                reservation_timeout=120)
    cluster.shutdown(timeout=240)
    reports = [json.loads((out / f"{i}.json").read_text()) for i in range(2)]
    assert reports[0]["node_rows"] == reports[1]["node_rows"] and sum(reports[0]["node_rows"]) == 480
    assert sorted(r["rows"] for r in reports) == sorted(reports[0]["node_rows"])
    assert reports[0]["batches"] == reports[1]["batches"] > 0
    assert reports[0]["w"] == reports[1]["w"]  # synchronous: the replicas stay identical
    assert np.allclose(reports[0]["w"], [2, -1], atol=0.15), reports[0]
    assert reports[0]["loss"][-1] < reports[0]["loss"][0] / 5


def test_a_shuffled_pass_reads_each_footer_once(uneven, monkeypatch):
    """Shuffled, a node's row groups come file after file in any order: each reader keeps its
    last few files open, so a pass over 3 files opens each once, not once per row group."""
    from ember.data import parquet as P

    opened = []
    real = P._parquet_file
    monkeypatch.setattr(P, "_parquet_file", lambda uri, resolve: opened.append(uri) or real(uri, resolve))
    data = parquet_batches(str(uneven), ["id"], 50, shard=(0, 1), shuffle=True, prefetch=0)
    opened.clear()  # the plan's own footer reads
    for _ in range(2):
        opened.clear()
        assert sorted(int(i) for b in data for i in b["id"]) == list(range(1000))
        assert sorted(opened) == sorted(set(opened)) and len(opened) == 3


# ----------------------------------------------------------------------------- cluster.train(df) from files
def test_which_dataframes_are_plain_parquet_scans(spark, tmp_path):
    """Cluster.train reads a DataFrame's files in place only when every row of every file is what
    it holds: a Parquet relation, or a projection of its columns; anything else names why not."""
    from pyspark.sql import functions as F

    from ember._driver.scan import parquet_scan
    from ember._driver.spark_side import spark_side

    side = spark_side(spark)
    spark.range(0, 50, 1, 2).selectExpr("id", "id % 2 as h", "array(cast(id as float)) as v") \
        .write.parquet(str(tmp_path / "p"))
    spark.range(0, 50, 1, 2).selectExpr("id", "id % 2 as h").write.partitionBy("h").parquet(str(tmp_path / "q"))
    spark.range(5).write.json(str(tmp_path / "j"))
    df = spark.read.parquet(str(tmp_path / "p"))
    scan, why = parquet_scan(df, side)
    assert why == "" and scan.columns == ["id", "h", "v"] and len(scan.files) == 2
    assert all(f.endswith(".parquet") for f in scan.files)
    scan, _ = parquet_scan(df.select("v", "id"), side)
    assert scan.columns == ["v", "id"]
    part = spark.read.parquet(str(tmp_path / "q"))
    assert parquet_scan(part.select("id"), side)[0].columns == ["id"]  # every file, no partition column
    refused = {
        "filter": (df.where("id > 3"), "more than a scan (Filter)"),
        "expression": (df.select((F.col("id") * 2).alias("y")), "computes columns"),
        "partition column": (part, "'h' is not in the files (a partition column)"),
        "json": (spark.read.json(str(tmp_path / "j")), "not a Parquet scan"),
        "limit": (df.limit(3), "more than a scan"),
    }
    for name, (d, reason) in refused.items():
        scan, why = parquet_scan(d, side)
        assert scan is None and reason in why, (name, why)


def test_file_rows_slice_like_a_batch():
    from ember._parquet_io import FileRows

    rows = FileRows("file:///x.parquet", ["a"], [(0, 0, 100), (1, 0, 30), (2, 0, 70)])
    assert rows.num_rows == 200
    assert rows.slice(90, 50).ranges == [(0, 90, 100), (1, 0, 30), (2, 0, 10)]
    assert rows.slice(130, 70).ranges == [(2, 0, 70)] and rows.slice(199, 5).ranges == [(2, 69, 70)]


def fed_node(args, ctx):
    """Reads every epoch cluster.train feeds (and the first val_epochs' validation), reports the rows."""
    feed = ctx.get_data_feed()
    epochs = []
    while not feed.should_stop():
        seen = []
        for b in feed.epoch_batches(10):
            assert b["v"].shape == (len(b["id"]), 2) and (b["v"][:, 0] == b["id"]).all()
            seen += b["id"].tolist()
        if not seen:
            break
        val = [i for b in feed.validation_batches(10) for i in b["id"].tolist()] \
            if len(epochs) < args["val_epochs"] else []
        epochs.append({"train": seen, "val": val})
    with open(os.path.join(args["out"], f"{ctx.task_index}.json"), "w") as f:
        json.dump(epochs, f)


def test_train_reads_a_plain_parquet_scan_in_place(spark, tmp_path, capfd, monkeypatch):
    """cluster.train(df) of a plain Parquet scan: the feeding tasks send the files' row ranges and
    the nodes read them (logged); every epoch holds every row once, equally split, validation too;
    the same rows as the rows feed (spark.ember.feed.source=spark), which a filtered DataFrame
    takes by itself."""
    spark.range(0, 600, 1, 3).selectExpr("id", "array(cast(id as float), 0.5f) as v", "id % 7 as other") \
        .write.option("parquet.block.size", 8 * 1024).parquet(str(tmp_path / "train"))
    spark.range(1000, 1100, 1, 1).selectExpr("id", "array(cast(id as float), 0.5f) as v") \
        .write.parquet(str(tmp_path / "val"))
    out = tmp_path / "out"
    out.mkdir()
    cluster = ember.Cluster.run(spark, fed_node, {"out": str(out), "val_epochs": 2}, num_executors=2,
                                input_mode=ember.InputMode.SPARK, reservation_timeout=120)
    try:
        df = spark.read.parquet(str(tmp_path / "train")).select("id", "v")
        cluster.train(df, num_epochs=2, validation_data=spark.read.parquet(str(tmp_path / "val")))
        logged = capfd.readouterr().err
        assert "Cluster.train: the DataFrame is a plain Parquet scan of 3 file(s)" in logged
        assert "validation_data: the DataFrame is a plain Parquet scan of 1 file(s)" in logged
        monkeypatch.setenv("EMBER_FEED_SOURCE", "spark")
        cluster.train(df, num_epochs=1)
        monkeypatch.delenv("EMBER_FEED_SOURCE")
        cluster.train(df.where("id >= 100"), num_epochs=1)
        assert "feeding the DataFrame's rows through Spark: its plan is more than a scan (Filter)" in \
            capfd.readouterr().err
        # spark.ember.feed.cacheDir: a DataFrame that is not a plain scan, fed 2 epochs, is written once
        # as Parquet there and read in place; one epoch is not worth a copy
        cache = tmp_path / "cache"
        monkeypatch.setenv("EMBER_FEED_CACHE_DIR", str(cache))
        cluster.train(df.where("id >= 100"), num_epochs=1)
        assert f"its plan is more than a scan (Filter) (one epoch: not worth a Parquet copy under {cache})" in \
            capfd.readouterr().err
        cluster.train(df.where("id >= 100"), num_epochs=2)
        logged = capfd.readouterr().err
        assert "Cluster.train: the DataFrame is not a plain Parquet scan (its plan is more than a scan (Filter)): " \
            "written once as Parquet to " in logged and f"{cache}/{cluster.job_id}-feed-1 (" in logged, logged
        assert "the nodes read in place each of the 2 epochs" in logged
        assert len(list((cache / f"{cluster.job_id}-feed-1").glob("*.parquet"))) >= 1
        # a copy that cannot be written: the error names it, and nothing is left behind
        (tmp_path / "a-file").write_text("not a directory")
        monkeypatch.setenv("EMBER_FEED_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
        with pytest.raises(ember.errors.ClusterError, match="writing its Parquet copy to .*a-file/cache/"
                                                            f"{cluster.job_id}-feed-2 .* failed"):
            cluster.train(df.where("id >= 100"), num_epochs=2)
        assert (tmp_path / "a-file").read_text() == "not a directory"
    finally:
        cluster.shutdown(timeout=240)
    assert list(cache.iterdir()) == []  # the copy is removed when the job ends
    reports = [json.loads((out / f"{i}.json").read_text()) for i in range(2)]
    assert [len(r) for r in reports] == [7, 7]
    for e in range(7):
        a, b = reports[0][e]["train"], reports[1][e]["train"]
        want = range(100, 600) if e >= 3 else range(600)
        assert len(a) == len(b) and not set(a) & set(b) and set(a) | set(b) <= set(want)
        assert len(want) - len(a) - len(b) < 2 * 10  # each node at most a batch short
    for e in range(2):  # validation: every row, equal halves
        assert sorted(reports[0][e]["val"] + reports[1][e]["val"]) == list(range(1000, 1100))
    # files and rows feeds give the nodes the same rows (each node's share may differ)
    assert sorted(reports[0][0]["train"] + reports[1][0]["train"]) == \
        sorted(reports[0][2]["train"] + reports[1][2]["train"])
