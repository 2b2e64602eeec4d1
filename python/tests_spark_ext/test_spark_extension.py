"""Ember's Spark extension (issue 23, point 4): the jar built from the package's Scala source with
pyspark's own compiler, ember_pack_floats in Spark SQL, and KerasModel.transform over it on a
real local Spark session that loads it through ember.spark_conf().  The transform's predictions
are checked against the Keras model run in this process, row by row; the plain path's
(no extension) are in python/tests/test_ml.py.  Run in a pytest process of their own (conftest.py)."""
from __future__ import annotations

import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

import ember
from ember import _jvm
from ember.errors import EmberError

from conftest import LOCAL_MASTER

WIDTH = 6


# ----------------------------------------------------------------------------- the jar
def test_the_jar_is_built_once_per_source_and_spark_conf_merges_the_user_settings(tmp_path):
    jar = Path(ember.spark_jar(str(tmp_path)))
    assert jar.parent == tmp_path and jar.name.startswith("ember-spark-") and jar.suffix == ".jar"
    with zipfile.ZipFile(jar) as z:
        names = set(z.namelist())
    assert {"org/ember/spark/PackFloats.class", "org/ember/spark/EmberExtensions.class"} <= names, names
    built = jar.stat().st_mtime_ns
    assert ember.spark_jar(str(tmp_path)) == str(jar) and jar.stat().st_mtime_ns == built  # reused
    assert [p.name for p in tmp_path.iterdir()] == [jar.name]  # no build directory left behind
    conf = ember.spark_conf({"spark.jars": "/opt/a.jar", "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension"},
                           cache_dir=str(tmp_path))
    assert conf == {"spark.jars": f"/opt/a.jar,{jar}",
                    "spark.sql.extensions": f"io.delta.sql.DeltaSparkSessionExtension,{_jvm.EXTENSIONS}"}
    assert ember.spark_conf(conf, cache_dir=str(tmp_path)) == conf  # nothing added twice


def test_no_java_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EmberError, match="needs `java`.*JAVA_HOME"):
        ember.spark_jar(str(tmp_path / "jars"))


def test_a_compiler_error_is_shown_and_nothing_is_left(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    (src / "Broken.scala").write_text("package org.ember.spark\nobject Broken { def f: Int = \"not an int\" }\n")
    monkeypatch.setattr(_jvm, "SOURCES", src)
    with pytest.raises(EmberError, match=r"(?s)compiling Ember's Spark extension failed.*Broken\.scala.*type mismatch"):
        ember.spark_jar(str(tmp_path / "jars"))
    assert list((tmp_path / "jars").iterdir()) == []


_LATE_SESSION = """
import logging, sys
import ember
from ember import _jvm
from pyspark.sql import SparkSession
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(name)s %(levelname)s %(message)s")
first = SparkSession.builder.master("local[1]").getOrCreate()  # starts the JVM without Ember's jar
first.stop()  # the JVM stays
late = SparkSession.builder.master("local[1]").config(map=ember.spark_conf()).getOrCreate()
print("HAS", _jvm.has_pack_floats(late), _jvm.has_pack_floats(late))
late.stop()
"""


def test_a_session_whose_jvm_started_without_the_jar_is_told_why_and_what_to_do():
    # A notebook's second session: Spark itself only logs a ClassNotFoundException and goes on.
    # A real process of its own, since this one's JVM has the jar.
    proc = subprocess.run([sys.executable, "-c", _LATE_SESSION], capture_output=True, text=True, timeout=240,
                          cwd=tempfile.gettempdir())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "HAS False False" in proc.stdout, proc.stdout[-3000:]
    told = [line for line in proc.stdout.splitlines() if line.startswith("ember WARNING")]
    assert len(told) == 1, proc.stdout[-3000:]  # once per session
    assert (f"spark.sql.extensions names {_jvm.EXTENSIONS} but this Spark session lacks ember_pack_floats: its "
            "JVM was started without Ember's jar") in told[0]
    assert "first session of a new Python process" in told[0]


# ----------------------------------------------------------------------------- in Spark
@pytest.fixture(scope="module")
def spark_ext(spark_sessions):
    spark = spark_sessions.get(LOCAL_MASTER, conf=ember.spark_conf())
    yield spark
    spark_sessions.stop()


def _sql_value(spark, expr: str):
    return spark.sql(f"SELECT {expr} AS v").collect()[0]["v"]


def test_ember_pack_floats_in_sql(spark_ext):
    assert _jvm.has_pack_floats(spark_ext)
    assert bytes(_sql_value(spark_ext, "ember_pack_floats(array(1.5F, -2.0F, 3.25F))")) == struct.pack("<3f", 1.5, -2.0, 3.25)
    assert bytes(_sql_value(spark_ext, "ember_pack_floats(array(0.1D, 1e40D))")) == struct.pack("<2f", 0.1, float("inf"))
    assert bytes(_sql_value(spark_ext, "ember_pack_floats(cast(array() as array<float>))")) == b""
    assert _sql_value(spark_ext, "ember_pack_floats(cast(null as array<float>))") is None
    # Rows as a scan hands them over (UnsafeArrayData: the bulk copy), 200 of them, 0..783 each.
    df = spark_ext.range(200, numPartitions=3).selectExpr(
        "id", "transform(sequence(0, 783), i -> cast(id * 1000 + i as float)) AS f").cache()
    for r in df.selectExpr("id", "ember_pack_floats(f) AS p").collect():
        assert np.array_equal(np.frombuffer(r["p"], "<f4"), r["id"] * 1000 + np.arange(784, dtype=np.float32))
    from pyspark.errors import AnalysisException
    with pytest.raises(AnalysisException, match="ember_pack_floats takes an array of float or double; .* is string"):
        spark_ext.sql("SELECT ember_pack_floats('x')").collect()
    with pytest.raises(Exception, match="ember_pack_floats takes one argument"):
        spark_ext.sql("SELECT ember_pack_floats(array(1F), array(2F))").collect()
    with pytest.raises(Exception, match=r"ember_pack_floats\(array\(.*NULL.*\)\): element 1 of a row's array \(of 3\) is null"):
        spark_ext.sql("SELECT ember_pack_floats(array(1F, CAST(NULL AS FLOAT), 3F))").collect()
    with pytest.raises(Exception, match=r"ember_pack_floats\(d\): element 0 of a row's array \(of 2\) is null"):
        spark_ext.createDataFrame([([None, 1.0],)], "d array<double>").coalesce(1).selectExpr("ember_pack_floats(d)").collect()


@pytest.fixture(scope="module")
def model():
    import keras
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(3)])


def _rows(n: int):
    from pyspark.ml.linalg import Vectors
    out = []
    for i in range(n):
        x = [float((i * 7 + j * 3) % 11) / 10 - 0.5 for j in range(WIDTH)]
        v = Vectors.dense(x) if i % 3 else Vectors.sparse(WIDTH, {j: x[j] for j in range(0, WIDTH, 2)})
        out.append((i, f"row{i}", x, x, v))
    return out


def test_transform_packs_the_column_and_predicts_what_keras_does(spark_ext, model):
    from ember.ml import KerasModel

    rows = _rows(300)
    df = (spark_ext.createDataFrame(rows, ["id", "name", "f", "d", "v"]).repartition(4)
          .selectExpr("id", "name", "cast(f as array<float>) AS f", "d", "v").cache())  # one row order
    order = [r["id"] for r in df.select("id").collect()]
    for column in ("f", "d", "v"):
        x = np.array([rows[i][4].toArray() if column == "v" else rows[i][2] for i in range(len(rows))], np.float32)
        want = np.asarray(model.predict_on_batch(x))
        km = KerasModel.from_keras(model, inputCol=column, outputCol="p", predictBatchSize=64)
        out = km.transform(df)
        plan = out._jdf.queryExecution().toString()
        assert "ember_pack_floats" in plan and "EmberInfer" in plan, column  # packed, joined by position
        got = out.collect()
        assert out.columns == ["id", "name", "f", "d", "v", "p"]
        assert [r["id"] for r in got] == order  # input order, every row once
        assert all(r["name"] == f"row{r['id']}" for r in got)
        np.testing.assert_allclose(np.array([r["p"] for r in got]), want[order], rtol=1e-5, atol=1e-6)


def test_transform_joins_its_output_to_every_row_in_order(spark_ext, model):
    """Spark keeps the rows and appends the model's output by position: every input column
    exactly, in input order, across uneven and empty partitions and many batches per partition;
    argmax as a double; what follows composes."""
    from ember.ml import KerasModel

    df = spark_ext.range(500, numPartitions=3).selectExpr(
        "id", "IF(id % 13 = 0, NULL, concat('r', id)) AS s", "named_struct('a', id, 'b', array(id, NULL)) AS st",
        f"transform(sequence(0, {WIDTH - 1}), k -> cast((id * 7 + k * 3) % 11 / 10.0D - 0.5 AS float)) AS f")
    df = df.repartitionByRange(9, "id").filter("id % 5 != 0 OR id < 40")  # uneven, some partitions empty
    want = df.collect()
    x = np.array([r["f"] for r in want], np.float32)
    km = KerasModel.from_keras(model, inputCol="f", outputCol="p", outputMode="argmax", predictBatchSize=16)
    out = km.transform(df)
    assert "EmberInfer" in out._jdf.queryExecution().toString()
    spark_ext.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "7")  # many batches per partition
    try:
        rows = out.collect()
    finally:
        spark_ext.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert out.columns == df.columns + ["p"] and out.schema.fields[:-1] == df.schema.fields
    assert [tuple(r)[:-1] for r in rows] == [tuple(r) for r in want]  # every value, in order
    logits = np.asarray(model.predict_on_batch(x))
    top2 = np.sort(logits, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-4  # rows whose argmax no rounding can change
    assert clear.mean() > 0.9
    np.testing.assert_array_equal(np.array([r["p"] for r in rows])[clear], np.argmax(logits, axis=1)[clear])
    assert out.filter("p = 0").count() == sum(1 for r in rows if r["p"] == 0)
    assert km.transform(df.limit(0)).collect() == []


def test_transform_names_bad_rows_on_the_packed_path(spark_ext, model):
    from ember.ml import KerasModel

    km = KerasModel.from_keras(model, inputCol="f", outputCol="p")
    # One task per failing job (coalesce(1)): when a task fails, Spark kills its siblings, and a
    # Python worker killed mid-stream may be reused by the next job's task, which then fails with
    # CancelledKeyException instead of the error under test (seen 2 runs in 5 with 4 tasks).
    nulls = spark_ext.createDataFrame([(1, [0.0] * WIDTH), (2, None)], "id long, f array<float>").coalesce(1)
    with pytest.raises(Exception, match="column 'f' has 1 null rows"):
        km.transform(nulls).collect()
    short = spark_ext.createDataFrame([(1, [0.0] * WIDTH), (2, [0.0] * (WIDTH - 1))], "id long, f array<float>").coalesce(1)
    with pytest.raises(Exception, match=f"column 'f': a row has {WIDTH - 1} values but the model's input takes {WIDTH}"):
        km.transform(short).collect()
    holes = spark_ext.createDataFrame([(1, [0.0, None] + [0.0] * (WIDTH - 2))], "id long, f array<float>").coalesce(1)
    with pytest.raises(Exception, match=rf"ember_pack_floats\(f\): element 1 of a row's array \(of {WIDTH}\) is null"):
        km.transform(holes).collect()


def test_torch_model_is_packed_joined_by_position_and_predicts_what_torch_does(spark_ext, tmp_path):
    """TorchModel, KerasModel's twin: the same packed hand-over and join by position; the
    column's values reshaped to the model's input (here a convolution's [1, 2, 3])."""
    import torch

    from ember.ml import TorchModel

    torch.manual_seed(11)
    module = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 2), torch.nn.Flatten(), torch.nn.Linear(4, 3))
    df = spark_ext.range(300, numPartitions=3).selectExpr(
        "id", "IF(id % 11 = 0, NULL, concat('r', id)) AS s",
        f"transform(sequence(0, {WIDTH - 1}), k -> cast((id * 7 + k * 3) % 11 / 10.0D - 0.5 AS float)) AS f")
    df = df.repartitionByRange(7, "id").filter("id % 4 != 0 OR id < 30")  # uneven, some partitions empty
    want = df.collect()
    x = np.array([r["f"] for r in want], np.float32)
    with torch.no_grad():
        logits = module.eval()(torch.from_numpy(x.reshape(-1, 1, 2, 3))).numpy()
    tm = TorchModel.from_torch(module, input_shape=[1, 2, 3], inputCol="f", outputCol="p", predictBatchSize=16)
    assert tm.input_shape == [None, 1, 2, 3] and tm.output_shape == [None, 3]
    tm.save(str(tmp_path / "tm"))
    for model in (tm, TorchModel.load(str(tmp_path / "tm"))):
        out = model.transform(df)
        plan = out._jdf.queryExecution().toString()
        assert "ember_pack_floats" in plan and "EmberInfer" in plan, plan
        rows = out.collect()
        assert out.columns == df.columns + ["p"]
        assert [tuple(r)[:-1] for r in rows] == [tuple(r) for r in want]  # every value, in order
        np.testing.assert_allclose(np.array([r["p"] for r in rows]), logits, rtol=1e-5, atol=1e-6)
    top = tm.copy({tm.outputMode: "argmax"}).transform(df)
    assert [r["p"] for r in top.collect()] == list(np.argmax(logits, axis=1).astype(float))
    assert tm.transform(df.limit(0)).collect() == []
    nulls = spark_ext.createDataFrame([(1, [0.0] * WIDTH), (2, None)], "id long, f array<float>").coalesce(1)
    with pytest.raises(Exception, match="column 'f' has 1 null rows"):
        tm.transform(nulls).collect()


def test_transform_of_a_streaming_dataframe_is_joined_by_position_in_every_micro_batch(spark_ext, model, tmp_path):
    """Structured Streaming: the same operator plans in each micro-batch (a file source, one file
    per trigger, so several batches), every row once with its own prediction."""
    from ember.ml import KerasModel

    src = tmp_path / "in"
    df = spark_ext.range(150, numPartitions=3).selectExpr(
        "id", f"transform(sequence(0, {WIDTH - 1}), k -> cast((id * 7 + k * 3) % 11 / 10.0D - 0.5 AS float)) AS f")
    df.write.parquet(str(src))
    stream = spark_ext.readStream.schema(df.schema).option("maxFilesPerTrigger", 1).parquet(str(src))
    out = KerasModel.from_keras(model, inputCol="f", outputCol="p", predictBatchSize=8).transform(stream)
    assert out.isStreaming
    query = out.writeStream.format("memory").queryName("ember_streamed").trigger(availableNow=True).start()
    try:
        assert query.awaitTermination(300), "the streaming query did not end within 300 s"
        assert query.exception() is None, query.exception()
        assert "EmberInfer" in query._jsq.streamingQuery().lastExecution().toString()
        assert len(query.recentProgress) >= 3  # a micro-batch per file
        got = spark_ext.sql("SELECT * FROM ember_streamed").orderBy("id").collect()
    finally:
        query.stop()
    assert [r["id"] for r in got] == list(range(150))
    x = np.array([r["f"] for r in got], np.float32)
    np.testing.assert_allclose(np.array([r["p"] for r in got]), np.asarray(model.predict_on_batch(x)),
                               rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- the feed, packed
W = 12  # floats per row: id + k/8, exact in float32


def _packed_rows_df(spark, n: int):
    return spark.range(n, numPartitions=4).selectExpr(
        "id", f"transform(sequence(0, {W - 1}), k -> cast(id + k / 8.0D as float)) AS f", "cast(id AS string) AS s")


def _train_node(args, ctx):
    """Reads each epoch with epoch_batches; writes what it saw: dtypes, shapes, wrong values."""
    import json

    import numpy as np
    feed = ctx.get_data_feed()
    seen = []
    for _ in range(2):
        for cols in feed.epoch_batches(7, drop_remainder=False):
            f, ids = cols["f"], cols["id"]
            want = ids[:, None].astype(np.float64) + np.arange(f.shape[1]) / 8.0
            seen.append({"dtype": str(f.dtype), "shape": list(f.shape), "ids": ids.tolist(),
                         "bad": int((f.astype(np.float64) != want).sum()), "s": [str(v) for v in cols["s"][:1]]})
    Path(args["out"], f"node{ctx.task_index}.json").write_text(json.dumps(seen))


def _infer_node(args, ctx):
    import numpy as np
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        cols = feed.next_batch_columns(50)
        if cols:
            f = cols["f"]
            feed.batch_results({"total": f.astype(np.float64).sum(axis=1), "dtype": [str(f.dtype)] * len(f)})


def test_train_feeds_array_float_columns_packed_and_the_nodes_see_float32(spark_ext, tmp_path, capsys):
    import json

    from conftest import no_leftovers
    df = _packed_rows_df(spark_ext, 300)
    cluster = ember.Cluster.run(spark_ext, _train_node, {"out": str(tmp_path)}, num_executors=2,
                                input_mode=ember.InputMode.SPARK)
    try:
        cluster.train(df, num_epochs=2)
    finally:
        cluster.shutdown(timeout=120)
    assert "array<float> column(s) ['f'] packed by Ember's Spark extension" in capsys.readouterr().err
    seen = [b for k in range(2) for b in json.loads((tmp_path / f"node{k}.json").read_text())]
    assert {b["dtype"] for b in seen} == {"float32"}
    assert all(len(b["shape"]) == 2 and b["shape"][1] == W for b in seen), seen[:3]
    assert sum(b["bad"] for b in seen) == 0
    ids = sorted(i for b in seen for i in b["ids"])
    assert ids == sorted(list(range(300)) * 2)  # both epochs, every row once each
    assert all(b["s"] == [str(b["ids"][0])] for b in seen)  # the other columns as they were
    no_leftovers(cluster.job_id)


def test_inference_feeds_packed_and_gives_the_array_column_back(spark_ext):
    """The rows stay in Spark's JVM; the nodes' results are joined to them by position
    (EmberInfer), so the array column is never unpacked."""
    from pyspark.sql.types import ArrayType, FloatType

    from conftest import no_leftovers
    df = _packed_rows_df(spark_ext, 400)
    cluster = ember.Cluster.run(spark_ext, _infer_node, None, num_executors=2, input_mode=ember.InputMode.SPARK)
    try:
        out = cluster.inference(df, output_schema="total double, dtype string")
        plan = out._jdf.queryExecution().toString()
        assert "EmberInfer" in plan and "ember_pack_floats" in plan and "ember_unpack_floats" not in plan, plan
        rows = out.collect()
    finally:
        cluster.shutdown(timeout=120)
    assert out.columns == ["id", "f", "s", "total", "dtype"]
    assert isinstance(out.schema["f"].dataType, ArrayType) and isinstance(out.schema["f"].dataType.elementType, FloatType)
    assert [r["id"] for r in rows] == list(range(400))  # input order
    for r in rows:
        want = [r["id"] + k / 8.0 for k in range(W)]
        assert r["f"] == want and r["s"] == str(r["id"]) and r["dtype"] == "float32"
        assert r["total"] == pytest.approx(sum(want))
    no_leftovers(cluster.job_id)


def _twice_node(args, ctx):
    """Answers each row's id doubled and the node's name; with args["extra"], that many rows more
    (or fewer) per batch than it was given."""
    feed = ctx.get_data_feed(train_mode=False)
    extra = (args or {}).get("extra", 0)
    while not feed.should_stop():
        cols = feed.next_batch_columns(7)
        if cols:
            ids = list(cols["id"]) + [0] * max(extra, 0)
            ids = ids[:len(ids) + min(extra, 0)]
            feed.batch_results({"twice": [2 * int(i) for i in ids], "by": [ctx.job_name] * len(ids)})


def test_inference_joins_the_results_to_the_rows_spark_kept(spark_ext, tmp_path):
    """Every input column comes back exactly as it was (nulls, nested types, a null array row,
    nullable integers), in input order across uneven and empty partitions; the results are
    appended by position; the plan composes with what follows it; a streaming DataFrame is
    answered micro-batch by micro-batch."""
    from conftest import no_leftovers
    df = spark_ext.range(300, numPartitions=3).selectExpr(
        "id", "IF(id % 7 = 0, NULL, CAST(id AS INT)) AS n", "IF(id % 11 = 0, NULL, id / 4.0D) AS x",
        "IF(id % 13 = 0, NULL, concat('r', id)) AS s", "named_struct('a', id, 'b', array(id, NULL)) AS st",
        f"IF(id % 17 = 0, NULL, transform(sequence(0, {W - 1}), k -> cast(id + k AS float))) AS f",
        "array(id / 2.0D) AS d", "timestamp_seconds(id) AS ts")
    df = df.repartitionByRange(9, "id").filter("id % 5 != 0 OR id < 40")  # uneven, some partitions empty
    want = df.collect()
    cluster = ember.Cluster.run(spark_ext, _twice_node, None, num_executors=2, input_mode=ember.InputMode.SPARK)
    try:
        out = cluster.inference(df, output_schema="twice long, by string")
        assert "EmberInfer" in out._jdf.queryExecution().toString()
        rows = out.collect()
        spark_ext.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "7")  # many batches per partition
        try:
            assert out.collect() == rows
        finally:
            spark_ext.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
        assert out.columns == df.columns + ["twice", "by"]
        assert out.schema.fields[:len(df.columns)] == df.schema.fields  # the input columns' types, unchanged
        assert [tuple(r)[:len(df.columns)] for r in rows] == [tuple(r) for r in want]  # every value, in order
        assert [r["twice"] for r in rows] == [2 * r["id"] for r in want] and {r["by"] for r in rows} == {"worker"}
        # What follows composes: a filter on a result, an aggregate over the whole.
        assert out.filter("twice % 4 = 0").count() == sum(1 for r in want if r["id"] % 2 == 0)
        assert out.groupBy().sum("twice").collect()[0][0] == 2 * sum(r["id"] for r in want)
        empty = cluster.inference(df.limit(0), output_schema="twice long, by string")
        assert empty.collect() == [] and empty.columns == out.columns
        # Structured Streaming: the same rows from Parquet files, one file per micro-batch.
        df.write.parquet(str(tmp_path / "in"))
        stream = spark_ext.readStream.schema(df.schema).option("maxFilesPerTrigger", 1).parquet(str(tmp_path / "in"))
        query = (cluster.inference(stream, output_schema="twice long, by string").writeStream.format("memory")
                 .queryName("ember_streamed_inference").trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(300), "the streaming query did not end within 300 s"
            assert query.exception() is None, query.exception()
            assert len(query.recentProgress) >= 3
            streamed = spark_ext.sql("SELECT * FROM ember_streamed_inference").orderBy("id").collect()
        finally:
            query.stop()
        assert [tuple(r) for r in streamed] == sorted((tuple(r) for r in rows), key=lambda t: t[0])
    finally:
        cluster.shutdown(timeout=120)
    no_leftovers(cluster.job_id)


@pytest.mark.parametrize("extra,match", [(1, "exactly one result per input row"), (-1, "answered")])
def test_inference_with_a_wrong_result_count_names_node_and_partition(spark_ext, extra, match):
    """Rows are joined by position, so a node's count must match exactly: an error, never a
    shifted or dropped row."""
    from conftest import no_leftovers
    cluster = ember.Cluster.run(spark_ext, _twice_node, {"extra": extra}, num_executors=2,
                                input_mode=ember.InputMode.SPARK)
    try:
        out = cluster.inference(_packed_rows_df(spark_ext, 60), output_schema="twice long, by string",
                                feed_timeout=30)
        with pytest.raises(Exception, match=match) as info:
            out.collect()
        assert "partition" in str(info.value) and "node worker:" in str(info.value), str(info.value)[-2000:]
    finally:
        with pytest.raises(ember.NodeError):  # the node raised too
            cluster.shutdown(timeout=60)
    no_leftovers(cluster.job_id)


def test_packed_batches_give_float32_columns_and_python_rows():
    """The node side alone: a batch marked packed (as the feeding tasks mark it)."""
    import pyarrow as pa

    from ember import _arrow_rows
    rows = [np.arange(4, dtype="<f4") + i for i in range(3)]
    batch = pa.RecordBatch.from_arrays([pa.array([0, 1, 2]), pa.array([r.tobytes() for r in rows], pa.binary())],
                                       names=["id", "f"])
    marked = _arrow_rows.mark_packed(batch, _arrow_rows.packed_meta(["f"]))
    cols = _arrow_rows.batch_to_columns(marked)
    assert cols["f"].dtype == np.float32 and cols["f"].shape == (3, 4)
    np.testing.assert_array_equal(cols["f"], np.stack(rows))
    assert _arrow_rows.batch_to_rows(marked) == [(i, rows[i].tolist()) for i in range(3)]
    ragged = pa.RecordBatch.from_arrays([pa.array([b"\0\0\x80?", b"", None], pa.binary())], names=["f"])
    out = _arrow_rows.batch_to_columns(_arrow_rows.mark_packed(ragged, _arrow_rows.packed_meta(["f"])))["f"]
    assert out.dtype == object and out[0].tolist() == [1.0] and out[1].tolist() == [] and out[2] is None
    assert _arrow_rows.batch_to_columns(batch)["f"].dtype == np.uint8  # unmarked: the bytes, as before


def test_a_spark_worker_that_ran_transform_is_settled(spark_ext, model):
    """ember._feeder.worker on a real Spark worker: once KerasModel.transform has run in it, the
    worker's zip importers re-read only changed archives and what it had loaded is frozen out of
    the collector's walks; the tasks that follow in it (Spark reuses workers) find it so."""
    import json

    import pyarrow as pa

    from ember.ml import KerasModel

    df = spark_ext.range(40, numPartitions=2).selectExpr(
        f"transform(sequence(0, {WIDTH - 1}), k -> cast(id + k AS float)) AS f")
    assert len(KerasModel.from_keras(model, inputCol="f", outputCol="p").transform(df).collect()) == 40

    def probe(batches):
        import gc
        import sys

        from ember._feeder import worker
        for _ in batches:
            pass
        zips = {p: type(f).__name__ for p, f in sys.path_importer_cache.items() if p.endswith((".zip", ".jar"))}
        yield pa.RecordBatch.from_pylist([{"settled": worker._settled, "frozen": gc.get_freeze_count(),
                                           "zips": json.dumps(zips)}])
    seen = df.mapInArrow(probe, "settled boolean, frozen long, zips string").collect()
    settled = [r for r in seen if r["settled"]]
    assert settled, seen  # reused workers: at least one ran the transform's tasks
    for r in settled:
        zips = json.loads(r["zips"])
        assert any("pyspark" in p for p in zips), zips  # Spark's own zips are on the worker's path...
        assert set(zips.values()) == {"_ZipImporter"}, zips  # ... and are read again only when changed
        assert r["frozen"] > 100_000  # TensorFlow and the model, left out of the collector's walks
