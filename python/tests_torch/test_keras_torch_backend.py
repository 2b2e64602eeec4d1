"""Keras 3 on its PyTorch backend (KERAS_BACKEND=torch), trained synchronously on Ember's nodes
(real Spark, real Keras and torch): ember.keras.DistributedOptimizer reduces the torch gradient
tensors in place through Ember's collectives (the path CUDA tensors take on GPU nodes), and
SyncCallback starts every node from the chief's weights, so the replicas stay identical."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ember

pytestmark = pytest.mark.timeout(300)


def keras_torch_train(args, ctx):
    import os

    os.environ["KERAS_BACKEND"] = "torch"  # before keras is first imported in this node
    import keras
    import torch

    import ember.keras

    assert keras.backend.backend() == "torch", keras.backend.backend()
    torch.set_num_threads(1)
    rng = np.random.default_rng(ctx.executor_id)  # different data on each node
    x = rng.normal(size=(256, 8)).astype("float32")
    y = (x @ np.arange(1.0, 9.0, dtype="float32") / 10.0).astype("float32")
    results = {}
    for overlap in (False, True):  # the same start and data: overlap must give the same bits
        keras.utils.set_random_seed(10 + ctx.executor_id)  # different initial weights on purpose
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)])
        # bucket_cap_mb tiny: the two Dense layers' gradients go out in several buckets during backward
        model.compile(optimizer=ember.keras.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                                                 overlap=overlap, bucket_cap_mb=0.00005),
                      loss="mse")
        history = model.fit(x, y, batch_size=32, epochs=15, shuffle=False, verbose=0,
                            callbacks=[ember.keras.SyncCallback()])
        reducer = getattr(model.optimizer, "_ember_reducer", None)
        results["overlap" if overlap else "fused"] = {
            "weights": [w.tolist() for w in model.get_weights()], "loss": history.history["loss"],
            "buckets": len(reducer.buckets) if reducer is not None else 0}
    results["value_type"] = type(model.trainable_weights[0].value).__name__
    Path(args["out"], f"result-{ctx.training_rank}.json").write_text(json.dumps(results))


def test_keras_on_the_torch_backend_keeps_replicas_identical(spark, tmp_path):
    cluster = ember.Cluster.run(spark, keras_torch_train, {"out": str(tmp_path)}, num_executors=2,
                                reservation_timeout=120)
    cluster.shutdown(timeout=240)
    r0, r1 = (json.loads((tmp_path / f"result-{r}.json").read_text()) for r in range(2))
    assert r0["value_type"] == "Parameter"  # Keras's variables are torch tensors: the torch path ran
    assert r0["fused"]["buckets"] == 0 and r0["overlap"]["buckets"] >= 2, (r0["fused"]["buckets"],
                                                                           r0["overlap"]["buckets"])
    for way in ("fused", "overlap"):
        for k, (a, b) in enumerate(zip(r0[way]["weights"], r1[way]["weights"])):
            assert np.array_equal(np.asarray(a), np.asarray(b)), f"{way}: weight {k} differs between the nodes"
        # Each node's epoch loss is over its own data; both fall, as one model trained on both halves.
        for r in (r0, r1):
            assert r[way]["loss"][-1] < r[way]["loss"][0] * 0.3, r[way]["loss"]
    for k, (a, b) in enumerate(zip(r0["fused"]["weights"], r0["overlap"]["weights"])):
        assert np.array_equal(np.asarray(a), np.asarray(b)), f"weight {k}: overlap changed the result"


def test_an_unsupported_backend_is_named(monkeypatch):
    import keras

    import ember.keras

    monkeypatch.setattr(keras.backend, "backend", lambda: "jax")  # JAX itself is not installed here
    with pytest.raises(ValueError, match=r"Keras backend 'jax' is not supported.*'tensorflow' or 'torch'"):
        ember.keras.allreduce_gradients([])


def test_overlap_needs_the_torch_backend():
    import keras

    import ember.keras

    assert keras.backend.backend() == "tensorflow"  # this test process's default
    with pytest.raises(ValueError, match=r"needs Keras's PyTorch backend.*not 'tensorflow'"):
        ember.keras.DistributedOptimizer(keras.optimizers.SGD(0.1), overlap=True)
