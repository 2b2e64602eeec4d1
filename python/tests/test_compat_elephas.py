"""ember.compat.elephas (issue 21, in progress): Elephas programs, imports changed, on real
Spark (local[4]) and TensorFlow: asynchronous training through a parameter-server shard on the
driver's host, and the trained weights back in ``master_network``; the Spark ML stages
(ElephasEstimator in a Pipeline, synchronous, then ElephasTransformer); predict over an RDD."""
from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from conftest import no_leftovers  # noqa: E402
from ember.compat.elephas import (ElephasEstimator, ElephasTransformer, ModelType, SparkModel,  # noqa: E402
                                  from_labeled_point, load_ml_transformer, lp_to_simple_rdd, to_labeled_point,
                                  to_simple_rdd)


def _data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 10)).astype(np.float32)
    labels = (x[:, :3].sum(axis=1) > 0).astype(np.int64) + (x[:, 3] > 1).astype(np.int64)
    return x, keras.utils.to_categorical(labels, 3)


def test_an_elephas_program_trains_asynchronously_and_returns_the_weights(spark):
    x_train, y_train = _data(1200, 0)
    x_test, y_test = _data(400, 1)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="categorical_crossentropy", metrics=["accuracy"])
    before = model.evaluate(x_test, y_test, verbose=0)[1]

    # The Elephas README's program, imports changed.
    rdd = to_simple_rdd(spark.sparkContext, x_train, y_train).repartition(2)
    spark_model = SparkModel(model, frequency="batch", mode="asynchronous", num_workers=2)
    with pytest.warns(UserWarning, match="validation_split"):
        spark_model.fit(rdd, epochs=4, batch_size=32, verbose=0, validation_split=0.1)
    after = spark_model.master_network.evaluate(x_test, y_test, verbose=0)[1]
    assert after > max(0.8, before + 0.2), (before, after)
    assert spark_model.evaluate(x_test, y_test, verbose=0)[1] == after
    assert np.asarray(spark_model.predict(x_test[:5])).shape == (5, 3)
    no_leftovers(spark_model.training_histories[-1]["job_id"])


def test_elephas_arguments_are_checked():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="compile the model first"):
        SparkModel(model)
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="mode must be"):
        SparkModel(model, mode="eventually")
    with pytest.raises(ValueError, match="frequency must be"):
        SparkModel(model, frequency="hourly")


def test_an_elephas_ml_pipeline_trains_and_its_transformer_predicts_with_the_real_model(spark, tmp_path):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql.types import ArrayType, DoubleType

    x_train, y_train = _data(1200, 0)
    x_test, y_test = _data(400, 1)
    labels_test = y_test.argmax(axis=1)
    cols = [f"x{i}" for i in range(10)]

    def frame(x, y):  # ten number columns, a label (class index), and a column to pass through
        rows = [(*map(float, xi), float(li), f"row{i}") for i, (xi, li) in enumerate(zip(x, y.argmax(axis=1)))]
        return spark.createDataFrame(rows, cols + ["index_category", "tag"])

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    # The Elephas README's ML program, imports changed.
    estimator = ElephasEstimator(featuresCol="features", labelCol="index_category")
    estimator.set_keras_model_config(model.to_json())
    estimator.set_categorical_labels(True)
    estimator.set_nb_classes(3)
    estimator.set_num_workers(2)
    estimator.set_epochs(5)
    estimator.set_batch_size(32)
    estimator.set_verbosity(0)
    estimator.set_validation_split(0.15)
    estimator.set_optimizer_config(keras.optimizers.serialize(keras.optimizers.Adam(0.01)))
    estimator.set_mode("synchronous")
    estimator.set_loss("categorical_crossentropy")
    estimator.set_metrics(["acc"])
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=cols, outputCol="features"), estimator])
    with pytest.warns(UserWarning, match="validation_split"):
        fitted = pipeline.fit(frame(x_train, y_train))
    transformer = fitted.stages[-1]
    assert isinstance(transformer, ElephasTransformer) and transformer.model_type == ModelType.CLASSIFICATION

    out = fitted.transform(frame(x_test, y_test))
    assert out.columns == cols + ["index_category", "tag", "features", "prediction"]
    output_type = out.schema["prediction"].dataType  # Elephas's: the class probabilities as doubles
    assert isinstance(output_type, ArrayType) and output_type.elementType == DoubleType()
    rows = out.select("tag", "index_category", "prediction").collect()
    assert [r.tag for r in rows] == [f"row{i}" for i in range(400)]  # input order, column passed through
    predicted = np.array([r.prediction for r in rows])
    trained = transformer.get_model()
    assert np.allclose(predicted, trained.predict(x_test, verbose=0), atol=1e-5)
    accuracy = float(np.mean(predicted.argmax(axis=1) == labels_test))
    majority = float(np.bincount(labels_test).max() / len(labels_test))
    assert accuracy > max(0.8, majority + 0.2), (accuracy, majority)

    # SparkModel.predict over an RDD: a list of rows, in the RDD's order (over 3 partitions).
    trained.compile(optimizer="sgd", loss="categorical_crossentropy")
    from_rdd = SparkModel(trained).predict(spark.sparkContext.parallelize(list(x_test), 3))
    assert isinstance(from_rdd, list) and len(from_rdd) == 400 and from_rdd[0].shape == (3,)
    assert np.allclose(np.stack(from_rdd), predicted, atol=1e-5)

    transformer.save(str(tmp_path / "transformer.h5"))  # Elephas's file: config + weights
    loaded = load_ml_transformer(str(tmp_path / "transformer.h5"))
    assert loaded.model_type == ModelType.CLASSIFICATION and loaded.getOutputCol() == "prediction"
    assert all(np.array_equal(a, b) for a, b in zip(loaded.weights, transformer.weights))
    no_leftovers(transformer.history[-1]["job_id"])


def test_labeled_point_helpers_round_trip(spark):
    x, y = _data(6, 2)
    lp = to_labeled_point(spark.sparkContext, x, y, categorical=True)
    assert [p.label for p in lp.collect()] == [float(v) for v in y.argmax(axis=1)]
    features, labels = from_labeled_point(lp, categorical=True, nb_classes=3)
    assert np.allclose(features, x) and np.array_equal(labels, y)
    pairs = lp_to_simple_rdd(lp, categorical=True, nb_classes=3).collect()
    assert np.allclose(np.stack([a for a, _ in pairs]), x) and np.array_equal(np.stack([b for _, b in pairs]), y)


def test_elephas_ml_arguments_are_checked(spark):
    estimator = ElephasEstimator()
    for setter, value, name in [("set_num_workers", 0, "num_workers"), ("set_batch_size", 0, "batch_size"),
                                ("set_epochs", -1, "epochs"), ("set_validation_split", 1.5, "validation_split"),
                                ("set_nb_classes", 0, "nb_classes"), ("set_mode", "eventually", "mode"),
                                ("set_frequency", "hourly", "frequency"),
                                ("set_keras_model_config", "not json", "keras_model_config")]:
        with pytest.raises(ValueError, match=f"ElephasEstimator: {name} must be"):
            getattr(estimator, setter)(value)
    with pytest.raises(ValueError, match="no parameter 'learning_rate'"):
        ElephasEstimator(learning_rate=0.1)

    # Required Params and columns are checked before any Spark job or training node starts.
    df = spark.createDataFrame([([0.0, 1.0], 1.0)], "features array<float>, y double")
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])
    with pytest.raises(ValueError, match="keras_model_config is not set"):
        estimator.fit(df)
    estimator.set_keras_model_config(model.to_json())
    with pytest.raises(ValueError, match="loss is not set"):
        estimator.fit(df)
    estimator.set_loss("categorical_crossentropy")
    with pytest.raises(ValueError, match="optimizer_config is not set"):
        estimator.fit(df)
    estimator.set_optimizer_config("sgd")
    with pytest.raises(ValueError, match="label column 'label' is not in the DataFrame"):
        estimator.fit(df)
