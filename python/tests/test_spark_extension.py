"""Ember's Spark extension (issue 23, point 4): the jar built from the package's Scala source with
pyspark's own compiler, ember_pack_floats in Spark SQL, and KerasModel.transform over it on a
real local Spark session that loads it through ember.spark_conf().  The transform's predictions
are checked against the Keras model run in this process, row by row; the plain path's
(no extension) are in test_ml.py."""
from __future__ import annotations

import struct
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
        spark_ext.createDataFrame([([None, 1.0],)], "d array<double>").selectExpr("ember_pack_floats(d)").collect()


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
        assert "ember_pack_floats" in out._jdf.queryExecution().toString(), column  # the packed path ran
        got = out.collect()
        assert out.columns == ["id", "name", "f", "d", "v", "p"]
        assert [r["id"] for r in got] == order  # input order, every row once
        assert all(r["name"] == f"row{r['id']}" for r in got)
        np.testing.assert_allclose(np.array([r["p"] for r in got]), want[order], rtol=1e-5, atol=1e-6)


def test_transform_names_bad_rows_on_the_packed_path(spark_ext, model):
    from ember.ml import KerasModel

    km = KerasModel.from_keras(model, inputCol="f", outputCol="p")
    nulls = spark_ext.createDataFrame([(1, [0.0] * WIDTH), (2, None)], "id long, f array<float>")
    with pytest.raises(Exception, match="column 'f' has 1 null rows"):
        km.transform(nulls).collect()
    short = spark_ext.createDataFrame([(1, [0.0] * WIDTH), (2, [0.0] * (WIDTH - 1))], "id long, f array<float>")
    with pytest.raises(Exception, match=f"column 'f': a row has {WIDTH - 1} values but the model's input takes {WIDTH}"):
        km.transform(short).collect()
    holes = spark_ext.createDataFrame([(1, [0.0, None] + [0.0] * (WIDTH - 2))], "id long, f array<float>")
    with pytest.raises(Exception, match=rf"ember_pack_floats\(f\): element 1 of a row's array \(of {WIDTH}\) is null"):
        km.transform(holes).collect()
