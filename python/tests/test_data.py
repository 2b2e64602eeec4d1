"""ember.data: TFRecord/tf.Example read and written by the C++ core, checked against real
TensorFlow both ways, and DataFrame <-> TFRecord over real Spark."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import ember  # noqa: E402
import ember.data  # noqa: E402
from ember import errors  # noqa: E402


@pytest.fixture(scope="module")
def tf():
    import tensorflow as tf
    return tf


def write_tf_examples(tf, path, rows, compression=None):
    """TF's own writer: rows of {id: int64, score: float, tags: bytes list, vec: 3 floats,
    pixels: 4 raw bytes}; every 5th row lacks 'score'."""
    opts = tf.io.TFRecordOptions(compression_type=compression) if compression else None
    with tf.io.TFRecordWriter(str(path), opts) as w:
        for i in rows:
            feat = {
                "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                "tags": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"t%d" % j for j in range(i % 3)])),
                "vec": tf.train.Feature(float_list=tf.train.FloatList(value=[i, i + 0.5, -i])),
                "pixels": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes([i % 256] * 4)])),
            }
            if i % 5:
                feat["score"] = tf.train.Feature(float_list=tf.train.FloatList(value=[i / 10]))
            w.write(tf.train.Example(features=tf.train.Features(feature=feat)).SerializeToString())


def features(tf):
    return {
        "id": tf.io.FixedLenFeature([], tf.int64),
        "score": tf.io.FixedLenFeature([], tf.float32, default_value=-1.0),
        "tags": tf.io.VarLenFeature(tf.string),
        "vec": tf.io.FixedLenFeature([3], tf.float32),
        "pixels": ember.data.RawBytes((2, 2)),
    }


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_reads_what_tensorflow_wrote(tf, tmp_path, compression):
    suffix = {None: "", "GZIP": ".gz", "ZLIB": ".zlib"}[compression]
    write_tf_examples(tf, tmp_path / f"a.tfrecord{suffix}", range(0, 23), compression)
    write_tf_examples(tf, tmp_path / f"b.tfrecord{suffix}", range(23, 30), compression)
    batches = list(ember.data.tfrecord_batches(str(tmp_path), features(tf), batch_size=8))
    assert [len(b["id"]) for b in batches] == [8, 8, 8, 6]
    ids = np.concatenate([b["id"] for b in batches])
    np.testing.assert_array_equal(ids, np.arange(30))
    score = np.concatenate([b["score"] for b in batches])
    np.testing.assert_allclose(score, [i / 10 if i % 5 else -1.0 for i in range(30)], rtol=1e-6)
    vec = np.concatenate([b["vec"] for b in batches])
    np.testing.assert_allclose(vec, [[i, i + 0.5, -i] for i in range(30)])
    pixels = np.concatenate([b["pixels"] for b in batches])
    assert pixels.dtype == np.uint8 and pixels.shape == (30, 2, 2)
    np.testing.assert_array_equal(pixels[:, 0, 0], np.arange(30) % 256)
    values, splits = batches[0]["tags"]
    assert [list(values[splits[i]:splits[i + 1]]) for i in range(4)] == [[], [b"t0"], [b"t0", b"t1"], []]


def test_tf_dataset_matches_parse_example(tf, tmp_path):
    write_tf_examples(tf, tmp_path / "a.tfrecord", range(12))
    ours = ember.data.tfrecord_dataset(str(tmp_path / "a.tfrecord"), features(tf), batch_size=5)
    spec = {k: v for k, v in features(tf).items() if k != "pixels"}
    theirs = tf.data.TFRecordDataset(str(tmp_path / "a.tfrecord")).batch(5).map(
        lambda s: tf.io.parse_example(s, spec))
    for a, b in zip(ours, theirs):
        for k in ("id", "score", "vec"):
            np.testing.assert_allclose(a[k].numpy(), b[k].numpy())
        assert a["tags"].to_list() == tf.RaggedTensor.from_sparse(b["tags"]).to_list()
        assert a["pixels"].dtype == tf.uint8
    assert sum(1 for _ in ours) == 3  # a second pass reads the file again
    # Already the node's shard: a tf.distribute strategy must not shard it a second time.
    assert ours.options().experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF


@pytest.mark.parametrize("drop_remainder", [False, True])
@pytest.mark.parametrize("decode_threads", [1, 3])
def test_tf_dataset_of_fixed_features_in_chunks(tf, tmp_path, drop_remainder, decode_threads):
    """Fixed-shape features reach tf.data in chunks of batches (one generator step each, then
    unbatch()): the batches, their sizes and the remainder are those of tfrecord_batches."""
    write_tf_examples(tf, tmp_path / "a.tfrecord", range(0, 23))
    write_tf_examples(tf, tmp_path / "b.tfrecord", range(23, 37))
    spec = {k: v for k, v in features(tf).items() if k != "tags"}
    kw = dict(batch_size=5, drop_remainder=drop_remainder, decode_threads=decode_threads)
    want = list(ember.data.tfrecord_batches(str(tmp_path), spec, **kw))
    ds = ember.data.tfrecord_dataset(str(tmp_path), spec, **kw)
    assert ds.element_spec["pixels"].shape.as_list() == [None, 2, 2]
    for _ in range(2):  # each pass reads the files again
        got = list(ds)
        assert [len(b["id"]) for b in got] == [5] * 7 + ([] if drop_remainder else [2])
        assert len(got) == len(want)
        for a, b in zip(got, want):
            for k in spec:
                np.testing.assert_array_equal(a[k].numpy(), b[k])


def test_shards_whole_files_or_records(tf, tmp_path):
    for i in range(3):
        write_tf_examples(tf, tmp_path / f"part-{i}", range(10 * i, 10 * i + 10))
    spec = {"id": tf.io.FixedLenFeature([], tf.int64)}

    def ids(path, shard):
        return sorted(np.concatenate([b["id"] for b in ember.data.tfrecord_batches(path, spec, 4, shard=shard)]))

    # 3 files over 2 nodes: whole files each (files 0, 2 and file 1).
    assert ids(str(tmp_path), (0, 2)) == list(range(0, 10)) + list(range(20, 30))
    assert ids(str(tmp_path), (1, 2)) == list(range(10, 20))
    # 3 files over 4 nodes: every 4th record.
    assert ids(str(tmp_path / "part-*"), (3, 4)) == list(range(3, 30, 4))


def test_epochs_reuse_the_mapped_files_and_see_a_rewritten_one(tf, tmp_path):
    for i in range(2):
        write_tf_examples(tf, tmp_path / f"part-{i}", range(10 * i, 10 * i + 10))
    spec = {"id": tf.io.FixedLenFeature([], tf.int64)}
    batches = ember.data.tfrecord_batches(str(tmp_path), spec, 4)

    def epoch():
        return [int(x) for b in batches for x in b["id"]]

    assert epoch() == list(range(20))
    assert batches._mappings.hits == 0
    assert epoch() == list(range(20))
    assert batches._mappings.hits == 2  # both files still mapped from the first epoch
    # A file replaced between epochs is read as it is now, not from the old mapping.
    write_tf_examples(tf, tmp_path / "part-1.new", range(100, 105))
    os.replace(tmp_path / "part-1.new", tmp_path / "part-1")
    assert epoch() == list(range(10)) + list(range(100, 105))
    assert batches._mappings.hits == 3
    # keep_mapped_bytes=0: every pass maps its files anew.
    fresh = ember.data.tfrecord_batches(str(tmp_path), spec, 4, keep_mapped_bytes=0)
    assert [list(b["id"]) for b in fresh] == [list(b["id"]) for b in fresh]
    assert fresh._mappings.hits == 0 and fresh._mappings.mapped_bytes == 0


def test_inferred_features(tf, tmp_path):
    write_tf_examples(tf, tmp_path / "a", range(1, 11))
    b = next(iter(ember.data.tfrecord_batches(str(tmp_path / "a"), batch_size=10)))
    assert b["id"].shape == (10,)  # one value in every record: a scalar
    assert isinstance(b["tags"], tuple)  # varying: a list
    assert isinstance(b["score"], tuple)  # missing from some: a list, empty there


def test_bad_input_names_file_offset_feature(tf, tmp_path):
    path = tmp_path / "a.tfrecord"
    write_tf_examples(tf, path, range(10))
    bad = {"id": tf.io.FixedLenFeature([], tf.float32)}  # it is int64
    with pytest.raises(errors.EmberError) as e:
        list(ember.data.tfrecord_batches(str(path), bad, 4))
    assert str(path) in str(e.value) and "at byte 0" in str(e.value) and "id" in str(e.value)
    with pytest.raises(errors.EmberError) as e:  # RawBytes of another size than the records'
        list(ember.data.tfrecord_batches(str(path), {"pixels": ember.data.RawBytes((3,))}, 4))
    assert str(path) in str(e.value) and "at byte 0" in str(e.value) and "'pixels'" in str(e.value)
    assert "a value of 4 bytes, the schema says 3" in str(e.value)
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF  # inside the second or third record
    path.write_bytes(bytes(data))
    spec = {"id": tf.io.FixedLenFeature([], tf.int64)}
    with pytest.raises(errors.Corruption) as e:
        list(ember.data.tfrecord_batches(str(path), spec, 4))
    assert str(path) in str(e.value) and "offset" in str(e.value)
    kept = ember.data.tfrecord_batches(str(path), spec, 4, skip_corrupt=True)
    ids = np.concatenate([b["id"] for b in kept])
    assert len(ids) == 9 and kept.stats["skipped_records"] == 1
    with pytest.raises(errors.NotFound) as e:
        ember.data.tfrecord_batches(str(tmp_path / "nothing-*"), spec, 4)
    assert "nothing-*" in str(e.value)


# ----------------------------------------------------------------------------- DataFrame
def every_type_df(spark):
    from pyspark.sql import types as T
    schema = T.StructType([
        T.StructField("b", T.BooleanType()), T.StructField("i", T.IntegerType()),
        T.StructField("l", T.LongType()), T.StructField("f", T.FloatType()),
        T.StructField("d", T.DoubleType()), T.StructField("s", T.StringType()),
        T.StructField("bin", T.BinaryType()), T.StructField("al", T.ArrayType(T.LongType())),
        T.StructField("af", T.ArrayType(T.FloatType())), T.StructField("as", T.ArrayType(T.StringType())),
        T.StructField("ab", T.ArrayType(T.BinaryType())),
    ])
    rows = []
    for k in range(40):
        rows.append((k % 2 == 0, k, 10 ** 12 + k, k / 4, k / 8, f"s{k}é", bytes([k, 0, 255]),
                     list(range(k % 4)), [k / 2] * (k % 3), [f"x{j}" for j in range(k % 2)],
                     [bytes([j]) for j in range(k % 3)]))
    rows.append((None,) * 11)  # every column null
    return spark.createDataFrame(rows, schema).repartition(6)  # some partitions hold few rows


def test_dataframe_round_trip_every_type(spark, tmp_path):
    df = every_type_df(spark)
    out = str(tmp_path / "tfr")
    assert ember.data.save_as_tfrecords(df, out) == 41
    files = sorted(os.listdir(out))
    assert "_SUCCESS" in files and sum(f.startswith("part-r-") for f in files) == 6
    back = ember.data.load_tfrecords(spark, out, schema=df.schema).collect()
    want = {r["i"]: r for r in df.collect()}
    got = {r["i"]: r for r in back}
    assert set(got) == set(want)
    for k, r in want.items():
        g = got[k]
        if k is None:
            assert all(g[c] is None for c in ("b", "l", "f", "s", "bin", "al")), g
            continue
        assert g["b"] == r["b"] and g["l"] == r["l"] and g["s"] == r["s"] and bytes(g["bin"]) == bytes(r["bin"])
        assert g["f"] == pytest.approx(r["f"]) and g["d"] == pytest.approx(r["d"], rel=1e-6)
        assert g["al"] == r["al"] and g["as"] == r["as"] and [bytes(x) for x in g["ab"]] == [bytes(x) for x in r["ab"]]
        assert g["af"] == pytest.approx(r["af"])


def test_dataframe_files_read_by_tensorflow_and_inferred(spark, tmp_path, tf):
    df = spark.createDataFrame([(i, f"n{i}", [float(i)] * 2) for i in range(20)], "id long, name string, v array<float>")
    out = str(tmp_path / "tfr")
    ember.data.save_as_tfrecords(df.repartition(3), out, compression="gzip")
    files = sorted(str(p) for p in (tmp_path / "tfr").glob("part-r-*.gz"))
    ds = tf.data.TFRecordDataset(files, compression_type="GZIP").map(lambda s: tf.io.parse_single_example(s, {
        "id": tf.io.FixedLenFeature([], tf.int64), "name": tf.io.FixedLenFeature([], tf.string),
        "v": tf.io.FixedLenFeature([2], tf.float32)}))
    seen = sorted((int(e["id"]), e["name"].numpy().decode(), list(e["v"].numpy())) for e in ds)
    assert seen == [(i, f"n{i}", [float(i)] * 2) for i in range(20)]
    inferred = ember.data.load_tfrecords(spark, out)  # TFoS-style: strings unless binary_features
    assert dict(inferred.dtypes) == {"id": "bigint", "name": "string", "v": "array<float>"}
    assert sorted(r["id"] for r in inferred.collect()) == list(range(20))
    as_binary = ember.data.load_tfrecords(spark, out, binary_features=["name"])
    assert dict(as_binary.dtypes)["name"] == "binary"


def test_save_refuses_bad_columns_and_existing_dir(spark, tmp_path):
    df = spark.createDataFrame([(1, {"a": 1})], "id long, m map<string,int>")
    with pytest.raises(TypeError, match="'m'"):
        ember.data.save_as_tfrecords(df, str(tmp_path / "x"))
    ok = spark.createDataFrame([(1,)], "id long")
    ember.data.save_as_tfrecords(ok, str(tmp_path / "y"))
    with pytest.raises(FileExistsError):
        ember.data.save_as_tfrecords(ok, str(tmp_path / "y"))
    assert ember.data.save_as_tfrecords(ok, str(tmp_path / "y"), mode="overwrite") == 1


def test_empty_dataframe_and_arrays(spark, tmp_path):
    df = spark.createDataFrame([], "id long, v array<long>")
    out = str(tmp_path / "e")
    assert ember.data.save_as_tfrecords(df, out) == 0
    assert ember.data.load_tfrecords(spark, out, schema=df.schema).count() == 0
    df2 = spark.createDataFrame([(1, []), (2, [7])], "id long, v array<long>")
    ember.data.save_as_tfrecords(df2, out, mode="overwrite")
    got = {r["id"]: r["v"] for r in ember.data.load_tfrecords(spark, out, schema=df2.schema).collect()}
    assert got == {1: [], 2: [7]}  # an empty array stays empty, not null


def test_string_and_binary_lists_all_empty_in_a_batch(spark, tmp_path, tf):
    """Issue 18: a batch whose every row of an array<string> or array<binary> column is []
    comes from Spark's Arrow with an empty offsets buffer, and save_as_tfrecords raised
    InvalidArgument ("bytes_offsets is empty").  The files it writes then hold only empty
    bytes_lists, which every reader takes back as empty lists."""
    df = spark.createDataFrame([(1, [], []), (2, [], [])], "id long, as_ array<string>, ab array<binary>")
    out = str(tmp_path / "empty_bytes")
    assert ember.data.save_as_tfrecords(df.coalesce(1), out) == 2
    rows = lambda d: sorted((r["id"], r["as_"], [bytes(x) for x in r["ab"]]) for r in d.collect())  # noqa: E731
    assert rows(ember.data.load_tfrecords(spark, out, schema=df.schema)) == [(1, [], []), (2, [], [])]
    inferred = ember.data.load_tfrecords(spark, out)  # from a file whose every bytes_list is empty
    assert dict(inferred.dtypes) == {"id": "bigint", "as_": "array<string>", "ab": "array<string>"}
    assert rows(inferred) == [(1, [], []), (2, [], [])]
    files = sorted(str(p) for p in (tmp_path / "empty_bytes").glob("part-r-*"))
    spec = {"id": tf.io.FixedLenFeature([], tf.int64), "as_": tf.io.VarLenFeature(tf.string),
            "ab": tf.io.VarLenFeature(tf.string)}
    for e in tf.data.TFRecordDataset(files).map(lambda s: tf.io.parse_single_example(s, spec)):
        assert e["as_"].values.shape == (0,) and e["ab"].values.shape == (0,)  # present, empty
    [b] = list(ember.data.tfrecord_dataset(files, spec, 4))
    assert b["id"].numpy().tolist() == [1, 2]
    for k in ("as_", "ab"):
        assert b[k].dtype == tf.string and b[k].to_list() == [[], []]
    # An empty list beside a non-empty one, in one batch, as before.
    mixed = spark.createDataFrame([(1, []), (2, ["x"])], "id long, as_ array<string>").coalesce(1)
    ember.data.save_as_tfrecords(mixed, out, mode="overwrite")
    back = ember.data.load_tfrecords(spark, out, schema=mixed.schema).collect()
    assert sorted((r["id"], r["as_"]) for r in back) == [(1, []), (2, ["x"])]


def test_load_names_file_and_record_on_schema_mismatch(spark, tmp_path):
    df = spark.createDataFrame([(i, [i, i]) for i in range(5)], "id long, v array<long>")
    out = str(tmp_path / "m")
    ember.data.save_as_tfrecords(df.coalesce(1), out)
    wrong = spark.createDataFrame([], "id long, v long").schema  # v is a 2-element list
    with pytest.raises(Exception) as e:
        ember.data.load_tfrecords(spark, out, schema=wrong).collect()
    msg = str(e.value)
    assert "'v'" in msg and "part-r-00000" in msg and "the record at byte 0" in msg, msg
