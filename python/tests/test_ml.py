"""ember.ml: KerasEstimator / KerasModel as Spark ML stages (Pipeline, fit on the cluster,
transform with mapInArrow, save/load)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "fashion_mnist"))
import data as fmnist  # noqa: E402

needs_dataset = pytest.mark.skipif(
    not (fmnist.SOURCE_DIR / "t10k-labels-idx1-ubyte.gz").exists(),
    reason="Debian package dataset-fashion-mnist is not installed")

W1, W2 = 3.14, 1.618


def linear_model():
    import keras
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.2), loss="mse")
    return model


def cnn_model():
    import keras
    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(2e-3), loss="sparse_categorical_crossentropy")
    return model


@pytest.fixture(scope="module")
def linear_df(spark):
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, size=(1000, 2))
    y = W1 * x[:, 0] + W2 * x[:, 1]
    rows = [(i, float(a), float(b), float(t)) for i, ((a, b), t) in enumerate(zip(x, y))]
    return spark.createDataFrame(rows, "id long, x1 double, x2 double, y double").repartition(3).cache()


@pytest.fixture(scope="module")
def linear_pipeline_model(linear_df):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    from ember.ml import KerasEstimator

    est = KerasEstimator(model=linear_model, labelCol="y", epochs=8, batchSize=32, numWorkers=2, seed=1)
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=["x1", "x2"], outputCol="features"), est])
    t0 = time.monotonic()
    fitted = pipeline.fit(linear_df)
    print(f"linear pipeline fit: {time.monotonic() - t0:.1f}s")
    return fitted


def test_params_have_defaults_and_docs():
    from ember.ml import KerasEstimator

    est = KerasEstimator(model=linear_model)
    assert (est.getInputCol(), est.getLabelCol(), est.getOutputCol()) == ("features", "label", "prediction")
    assert (est.getEpochs(), est.getBatchSize(), est.getNumWorkers(), est.getOutputMode()) == (1, 32, 1, "raw")
    assert "global training batch" in est.explainParam("batchSize")
    est.setEpochs(3).setBatchSize(64)
    assert est.getEpochs() == 3 and est.copy().getBatchSize() == 64
    with pytest.raises(TypeError):
        est.setEpochs("many")


def test_linear_regression_pipeline_recovers_the_weights(spark, linear_pipeline_model):
    keras_stage = linear_pipeline_model.stages[-1]
    assert type(keras_stage).__name__ == "KerasModel"
    test = spark.createDataFrame([(1.0, 1.0), (2.0, -1.0)], "x1 double, x2 double")
    preds = [r["prediction"] for r in linear_pipeline_model.transform(test).collect()]
    assert round(preds[0], 2) == round(W1 + W2, 2) == 4.76
    assert preds[1] == pytest.approx(2 * W1 - W2, abs=0.01)
    kernel = keras_stage.keras_model().layers[0].get_weights()[0].ravel()
    assert kernel == pytest.approx([W1, W2], abs=0.005)


def test_transform_keeps_every_column_and_the_row_order(linear_df, linear_pipeline_model):
    out = linear_pipeline_model.transform(linear_df)
    assert out.columns == linear_df.columns + ["features", "prediction"]
    rows = out.collect()
    assert [r["id"] for r in rows] == [r["id"] for r in linear_df.collect()]
    assert all(abs(r["prediction"] - r["y"]) < 0.02 for r in rows)


def test_save_load_gives_the_same_predictions(linear_df, linear_pipeline_model, tmp_path):
    from pyspark.ml import PipelineModel

    from ember.ml import KerasModel

    stage = linear_pipeline_model.stages[-1]
    stage.write().save(str(tmp_path / "keras"))
    with pytest.raises(Exception, match="already exists"):
        stage.save(str(tmp_path / "keras"))
    stage.write().overwrite().save(str(tmp_path / "keras"))
    loaded = KerasModel.load(str(tmp_path / "keras"))
    assert loaded.uid == stage.uid and loaded.getOutputCol() == "prediction"
    assert loaded.input_shape == [None, 2]
    features = linear_pipeline_model.stages[0].transform(linear_df)
    a = [r["prediction"] for r in stage.transform(features).collect()]
    b = [r["prediction"] for r in loaded.transform(features).collect()]
    assert a == b
    # the whole pipeline too (VectorAssembler's Java writer + ours)
    linear_pipeline_model.save(str(tmp_path / "pipeline"))
    c = [r["prediction"] for r in PipelineModel.load(str(tmp_path / "pipeline")).transform(linear_df).collect()]
    assert c == a


def test_bad_input_is_named(spark, linear_df, linear_pipeline_model):
    from pyspark.ml.feature import VectorAssembler

    from ember.ml import KerasEstimator

    stage = linear_pipeline_model.stages[-1]
    with pytest.raises(ValueError, match="input column 'features' is not in the DataFrame .*columns: id, x1"):
        stage.transform(linear_df)
    wide = VectorAssembler(inputCols=["x1", "x2", "y"], outputCol="features").transform(linear_df)
    with pytest.raises(ValueError, match="input column 'features' holds vectors of size 3 but the model's input"):
        stage.transform(wide)
    arrays = spark.createDataFrame([([1.0, 2.0, 3.0],)], "features array<double>")
    with pytest.raises(Exception, match="column 'features': a row has 3 values but the model's input takes 2"):
        stage.transform(arrays).collect()
    with pytest.raises(ValueError, match="label column 'nope' is not in the DataFrame"):
        KerasEstimator(model=linear_model, labelCol="nope").fit(wide)
    with pytest.raises(ValueError, match="input column 'x1' is string"):
        strings = spark.createDataFrame([("a", 1.0)], "x1 string, label double")
        KerasEstimator(model=linear_model, inputCol="x1").fit(strings)


def test_wrong_width_in_fit_names_the_column(spark, linear_df):
    from pyspark.ml.feature import VectorAssembler

    import ember
    from ember.ml import KerasEstimator

    wide = VectorAssembler(inputCols=["x1", "x2", "y"], outputCol="features").transform(linear_df)
    with pytest.raises(ember.NodeError, match="column 'features' has rows of 3 values but the model's input"):
        KerasEstimator(model=linear_model, labelCol="y", timeout=120).fit(wide)


def _fmnist_df(spark, split: str, out_dir: Path):
    """The Debian IDX split as Parquet (image: 784 floats in [0, 1], label), read back with an
    ``image`` Vector column; written with pyarrow, so no row passes through the driver's JVM."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    images, labels = fmnist.load_split(split)
    flat = (images.reshape(len(labels), -1) / 255.0).astype(np.float32)
    path = out_dir / f"{split}.parquet"
    path.mkdir()
    step = -(-len(labels) // 4)
    for i in range(0, len(labels), step):
        table = pa.table({"image": pa.FixedSizeListArray.from_arrays(pa.array(flat[i:i + step].ravel()), 784)
                          .cast(pa.list_(pa.float32())),
                          "label": pa.array(labels[i:i + step].astype(np.int64))})
        pq.write_table(table, path / f"part-{i // step}.parquet")
    df = spark.read.parquet(str(path))
    return df.withColumn("image", array_to_vector(F.col("image")))


@needs_dataset
def test_fashion_mnist_cnn_pipeline(spark, tmp_path):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    from ember.ml import KerasEstimator, KerasModel

    train = _fmnist_df(spark, "train", tmp_path).cache()
    test = _fmnist_df(spark, "test", tmp_path).cache()
    assert train.count() == 60000 and test.count() == 10000
    # VectorAssembler stores each row dense or sparse, whichever is smaller: both kinds reach the model.
    est = KerasEstimator(model=cnn_model, labelCol="label", outputMode="argmax", epochs=1, batchSize=128,
                         numWorkers=1, seed=1)
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=["image"], outputCol="features"), est])
    t0 = time.monotonic()
    fitted = pipeline.fit(train)
    t1 = time.monotonic()
    out = fitted.transform(test).cache()
    accuracy = out.selectExpr("avg(cast(prediction = label as double)) as acc").first()["acc"]
    t2 = time.monotonic()
    print(f"Fashion-MNIST CNN pipeline: fit {t1 - t0:.1f}s, transform 10,000 rows {t2 - t1:.1f}s, "
          f"accuracy {accuracy:.4f}")
    assert accuracy >= 0.85  # one epoch: 0.869 seen (two: ~0.89)
    path = str(tmp_path / "cnn")
    fitted.stages[-1].save(path)
    again = KerasModel.load(path).transform(fitted.stages[0].transform(test).limit(500))
    assert [r["prediction"] for r in again.collect()] == [r["prediction"] for r in out.limit(500).collect()]


def _tfos_train_fn(args, ctx):
    """A TFoS-style train_fn: reads its feed with input_mapping, exports a SavedModel."""
    import keras

    feed = ctx.get_data_feed(train_mode=True, input_mapping=args.input_mapping)
    xs, ys = [], []
    while not feed.should_stop():
        batch = feed.next_batch(args.batch_size)
        xs += batch["x"]
        ys += batch["y"]
    x, y = np.asarray(xs, np.float32), np.asarray(ys, np.float32)
    w, *_ = np.linalg.lstsq(np.c_[x, np.ones(len(x))], y, rcond=None)  # the data's own least squares
    model = keras.Sequential([keras.Input((2,), name="x"), keras.layers.Dense(1)])
    model.set_weights([w[:2].reshape(2, 1).astype(np.float32), w[2:].astype(np.float32)])
    assert args.note == "from tf_args" and len(x) == 1000
    model.export(args.export_dir, verbose=False)


def test_tfos_pipeline_estimator_and_model(spark, linear_df, tmp_path):
    from argparse import Namespace

    from ember.compat.tensorflowonspark.pipeline import TFEstimator, TFModel

    df = linear_df.selectExpr("id", "array(x1, x2) as features", "y")
    est = (TFEstimator(_tfos_train_fn, Namespace(note="from tf_args"))
           .setInputMapping({"features": "x", "y": "y"}).setClusterSize(1).setEpochs(1).setBatchSize(100)
           .setExportDir(str(tmp_path / "export")).setGraceSecs(0))
    assert est.getNumPS() == 0 and est.getMasterNode() == "chief" and est.getSteps() == 1000
    assert est.merge_args_params().export_dir == str(tmp_path / "export")
    model = est.fit(df)
    assert isinstance(model, TFModel) and model.getExportDir() == str(tmp_path / "export")
    model.setInputMapping({"features": "x"}).setOutputMapping({"output_0": "pred"})
    out = model.transform(df)
    assert out.columns == ["pred"]
    preds = [r["pred"][0] for r in out.collect()]
    ys = [r["y"] for r in df.collect()]
    assert np.allclose(preds, ys, atol=1e-3)
    with pytest.raises(ValueError, match="input_mapping column 'nope' is not in the DataFrame"):
        model.setInputMapping({"nope": "x"}).transform(df)


def test_save_load_on_hdfs(spark_on_hdfs, linear_pipeline_model):
    from ember.ml import KerasModel

    stage = linear_pipeline_model.stages[-1]
    stage.write().overwrite().save("/ml/linear")  # no scheme: fs.defaultFS, the test's HDFS
    loaded = KerasModel.load("/ml/linear")
    assert loaded.model_bytes == stage.model_bytes and loaded.uid == stage.uid
