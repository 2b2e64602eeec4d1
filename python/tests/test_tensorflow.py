"""Real TensorFlow on real Spark: TF_CONFIG is enough for MultiWorkerMirroredStrategy.

Each node imports TensorFlow (~5 s of CPU each), so this module stays small.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import ember
from conftest import no_leftovers

pytestmark = pytest.mark.timeout(240)


def train_with_mwms(args, ctx):
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # configured by TF_CONFIG alone
    global_batch = 32
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
        optimizer = tf.keras.optimizers.SGD(0.05)
        optimizer.build(model.trainable_variables)

    def dataset_fn(input_context):
        rng = np.random.default_rng(input_context.input_pipeline_id)
        x = rng.random((256, 4), dtype=np.float32)
        y = x.sum(axis=1)
        batch = input_context.get_per_replica_batch_size(global_batch)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)

    # A custom loop: Keras 3's model.fit cannot run MultiWorkerMirroredStrategy on more than
    # one worker (keras-team/keras#20585).
    def replica_step(batch):
        x, y = batch
        with tf.GradientTape() as tape:
            error = model(x, training=True)[:, 0] - y
            loss = tf.nn.compute_average_loss(tf.square(error), global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(iterator):
        loss = strategy.run(replica_step, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    losses = []
    for step in range(1, 11):
        losses.append(float(train_step(iterator)))
        ctx.report(step=step, loss=losses[-1], samples=step * global_batch)
    result = {"replicas": strategy.num_replicas_in_sync, "loss": losses,
              "weights": [w.tolist() for w in model.get_weights()]}
    Path(args["out"], f"{ctx.job_name}-{ctx.task_index}.json").write_text(json.dumps(result))


def test_multi_worker_mirrored_strategy_trains_on_two_nodes(spark, tmp_path, capsys):
    cluster = ember.Cluster.run(spark, train_with_mwms, {"out": str(tmp_path)}, num_executors=2,
                                reservation_timeout=60)
    cluster.shutdown(timeout=180)
    results = {p.stem: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert sorted(results) == ["worker-0", "worker-1"]
    for result in results.values():
        assert result["replicas"] == 2
        assert len(result["loss"]) == 10
        assert result["loss"][-1] < result["loss"][0]
    # Synchronous training: both replicas end with the same weights.
    assert _close(results["worker-0"]["weights"], results["worker-1"]["weights"])
    err = capsys.readouterr().err
    assert "[worker:0] progress: step=" in err and "samples/s=" in err
    no_leftovers(cluster.job_id)


def _close(a, b, tol=1e-5) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b))
    return abs(a - b) <= tol


def test_keras_progress_callback_reports_through_ctx():
    import numpy as np
    import tensorflow as tf

    import ember.keras

    class FakeCtx:
        def __init__(self):
            self.reports = []

        def report(self, step=None, loss=None, **metrics):
            self.reports.append(dict(step=step, loss=loss, **metrics))

    ctx = FakeCtx()
    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    x = np.ones((40, 2), dtype=np.float32)
    model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0,
              callbacks=[ember.keras.ProgressCallback(ctx, every_n_steps=2, batch_size=8)])
    steps = [r["step"] for r in ctx.reports]
    assert steps == [2, 4, 5, 6, 8, 10, 10]  # every 2 batches, plus each epoch's end
    assert all(r["loss"] is not None and r["loss"] >= 0 for r in ctx.reports)
    assert ctx.reports[1]["samples"] == 32 and "mae" in ctx.reports[1]
    assert ctx.reports[-1]["epoch"] == 2
