"""ember.compat.elephas (issue 21, in progress): an Elephas program, imports changed, on real
Spark (local[4]) and TensorFlow: asynchronous training through a parameter-server shard on the
driver's host, and the trained weights back in ``master_network``."""
from __future__ import annotations

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from conftest import no_leftovers  # noqa: E402
from ember.compat.elephas import SparkModel, to_simple_rdd  # noqa: E402


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
    assert spark_model.predict(x_test[:5]).shape == (5, 3)
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
