"""Ember's collectives from Python: the bindings on threads, then real nodes on real Spark,
then Keras 3 ``model.fit`` on two nodes with DistributedOptimizer + SyncCallback."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ember
from ember import _ember, errors
from ember.collective import Communicator
from conftest import no_leftovers
from thread_ranks import run_threads

pytestmark = pytest.mark.timeout(300)



@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_numpy_collectives_on_threads(transport):
    def work(comm):
        r = comm.rank
        out = {}
        x = np.arange(10, dtype=np.float32) + r
        out["average"] = comm.allreduce(x)                        # new array, x unchanged
        out["x_unchanged"] = np.array_equal(x, np.arange(10, dtype=np.float32) + r)
        y = np.full(5, r + 1, dtype=np.int64)
        comm.allreduce_(y, op="sum")
        out["sum_int64"] = y
        h = np.ones(7, dtype=np.float16)
        out["sum_float16"] = comm.allreduce(h, op="sum")
        out["max"] = comm.allreduce(np.array([r, -r], dtype=np.float64), op="max")
        out["bcast"] = comm.broadcast(np.array([r * 10.0, 1.0]), root=2)
        out["gather"] = comm.allgather(np.full((r, 2), r, dtype=np.int32))  # varying rows, rank 0 none
        out["rs"] = comm.reduce_scatter(np.arange(6, dtype=np.float32).reshape(3, 2) * (r + 1), op="sum")
        grads = [np.full(3, r, np.float32), np.full((2, 2), 2 * r, np.float32)]
        comm.allreduce_many_(grads, op="average")
        out["many"] = grads
        z = np.full(1000, float(r), np.float32)
        work_handle = comm.allreduce_async_(z, op="sum")
        work_handle.wait()
        out["async"] = z
        comm.barrier()
        return out

    res = run_threads(3, work, transport=transport)
    for r, out in enumerate(res):
        np.testing.assert_array_equal(out["average"], np.arange(10, dtype=np.float32) + 1.0)
        assert out["x_unchanged"]
        np.testing.assert_array_equal(out["sum_int64"], np.full(5, 6))
        assert out["sum_float16"].dtype == np.float16 and (out["sum_float16"] == 3).all()
        np.testing.assert_array_equal(out["max"], [2.0, 0.0])
        np.testing.assert_array_equal(out["bcast"], [20.0, 1.0])
        np.testing.assert_array_equal(out["gather"], [[1, 1], [2, 2], [2, 2]])
        np.testing.assert_array_equal(out["rs"], (np.arange(6, dtype=np.float32).reshape(3, 2) * 6)[r:r + 1])
        np.testing.assert_array_equal(out["many"][0], np.full(3, 1.0))
        np.testing.assert_array_equal(out["many"][1], np.full((2, 2), 2.0))
        np.testing.assert_array_equal(out["async"], np.full(1000, 3.0))


def test_mismatch_raises_on_every_rank_naming_ranks():
    def work(comm):
        n = 4 if comm.rank == 0 else 5
        try:
            comm.allreduce(np.ones(n, np.float32), timeout=10)
        except (errors.InvalidArgument, errors.Aborted) as e:
            return str(e)
        return None

    msgs = run_threads(2, work)
    for m in msgs:
        assert m is not None and "rank" in m, msgs
    assert any("mismatched" in m for m in msgs), msgs


def test_bad_dtype_and_op_are_clear_errors():
    import ml_dtypes

    def work(comm):
        with pytest.raises(ValueError, match="op must be one of"):
            comm.allreduce(np.ones(2, np.float32), op="product")
        with pytest.raises(ValueError, match="float32, float64.*; got uint8"):
            comm.allreduce(np.ones(2, np.uint8))
        with pytest.raises(ValueError, match="bfloat16.*; got complex64"):
            comm.allgather(np.ones(2, np.complex64))
        with pytest.raises(ValueError, match="bfloat16.*; got float8_e4m3fn"):  # ml_dtypes, but not one the core has
            comm.broadcast(np.ones(2, ml_dtypes.float8_e4m3fn))
        with pytest.raises(ValueError, match="one dtype"):  # bfloat16 bits must not pass for float16
            comm.allreduce_many_([np.ones(2, ml_dtypes.bfloat16), np.ones(2, np.float16)])
        return True

    assert run_threads(1, work) == [True]


def _bf16_bits(values) -> list:
    """The bfloat16 bit patterns of `values` (exact small integers), as the core's sums give them."""
    import ml_dtypes
    return np.asarray(values, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16).tolist()


@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize("kind", ["numpy", "tf"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_from_numpy_and_tf_on_threads(transport, kind, dtype):
    """Issue 18 item 4: numpy's ml_dtypes.bfloat16 (TF's and JAX's) and TF bf16 tensors were
    refused by every collective.  Every call takes them and gives back the caller's kind and
    dtype, with the core's exact sums of small integers."""
    import ml_dtypes
    import tensorflow as tf

    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16

    def make(values):
        a = np.asarray(values, np.float32).astype(np_dtype)
        return tf.constant(a) if kind == "tf" else a

    def bits(x):
        assert type(x) is type(make([0])), type(x)  # the caller's kind ...
        a = x.numpy() if kind == "tf" else x
        assert a.dtype == np_dtype, a.dtype  # ... and dtype
        return a.view(np.uint16).tolist()

    def work(comm):
        r, out = comm.rank, {}
        x = make(np.arange(8) + r)
        out["sum"] = bits(comm.allreduce(x, op="sum"))
        out["x_unchanged"] = bits(x) == _bf16_bits(np.arange(8) + r) if dtype == "bfloat16" else None
        out["average"] = bits(comm.allreduce(make([2.0 * (r + 1), -4.0]), op="average"))
        out["max"] = bits(comm.allreduce(make([r, -r]), op="max"))
        out["bcast"] = bits(comm.broadcast(make([r * 10.0, 1.0]), root=2))
        out["gather"] = bits(comm.allgather(make(np.full((r, 2), r))))  # varying rows, rank 0 none
        out["gather_shape"] = tuple(comm.allgather(make(np.full((r, 2), r))).shape)
        out["rs"] = bits(comm.reduce_scatter(make(np.arange(6).reshape(3, 2) * (r + 1)), op="sum"))
        if kind == "numpy":  # in place: numpy arrays are written through a view, no copy
            y = make([r + 1.0] * 5)
            assert comm.allreduce_(y, op="sum") is y
            out["in_place"] = bits(y)
            grads = [make([r] * 3), make(np.full((2, 2), 2 * r))]
            comm.allreduce_many_(grads, op="sum")
            out["many"] = [bits(g) for g in grads]
            z = make([float(r)] * 1000)
            comm.allreduce_async_(z, op="sum").wait()
            out["async"] = bits(z)
        return out

    def want(values):
        return np.asarray(values, np.float32).astype(np_dtype).view(np.uint16).tolist()

    res = run_threads(3, work, transport=transport)
    for r, out in enumerate(res):
        assert out["sum"] == want(3 * np.arange(8) + 3)
        assert out["x_unchanged"] in (True, None)
        assert out["average"] == want([4.0, -4.0])
        assert out["max"] == want([2.0, 0.0])
        assert out["bcast"] == want([20.0, 1.0])
        assert out["gather"] == want([[1, 1], [2, 2], [2, 2]]) and out["gather_shape"] == (3, 2)
        assert out["rs"] == want((np.arange(6).reshape(3, 2) * 6)[r:r + 1])
        if kind == "numpy":
            assert out["in_place"] == want([6.0] * 5)
            assert out["many"] == [want([3] * 3), want(np.full((2, 2), 6))]
            assert out["async"] == want([3.0] * 1000)


def test_bfloat16_is_reduced_as_bfloat16_by_the_core():
    """numpy bfloat16 reaches the core as bfloat16 (not float32, not its uint16 bits): a
    mismatched call names the dtype, and 256 + 1 + 1 is 258, the core's one rounding after a
    float32 sum (bf16 per step would give 256; uint16 bits would be nonsense)."""
    import ml_dtypes

    def total(comm):
        return comm.allreduce(np.array([[256.0, 1.0, 1.0][comm.rank]], ml_dtypes.bfloat16), op="sum")

    def mismatch(comm):  # a communicator of its own: the failure breaks it on every rank
        try:
            comm.allreduce(np.ones(4 + comm.rank, ml_dtypes.bfloat16), timeout=10)
        except (errors.InvalidArgument, errors.Aborted) as e:
            return str(e)
        return None

    for got in run_threads(3, total, transport="tcp"):
        assert got.dtype == ml_dtypes.bfloat16 and got.astype(np.float32).tolist() == [258.0]
    msgs = run_threads(3, mismatch, transport="tcp")
    assert any(m and "mismatched" in m and "bfloat16" in m for m in msgs), msgs


def test_keras_gradients_in_bfloat16_on_threads():
    """ember.keras's gradient allreduce (DistributedOptimizer's path) on bf16 and fp16 gradients."""
    import tensorflow as tf

    import ember.keras

    def work(comm):
        r = comm.rank
        grads = [tf.fill([3], tf.constant(r + 1.0, tf.bfloat16)), None, tf.fill([2, 2], tf.constant(2.0 * r, tf.float16)),
                 tf.constant([[1.0, 2.0]], tf.bfloat16) * (r + 1)]
        return ember.keras.allreduce_gradients(grads, comm, op="average")

    for g in run_threads(2, work):
        assert g[1] is None
        assert g[0].dtype == tf.bfloat16 and g[0].numpy().astype(np.float32).tolist() == [1.5] * 3
        assert g[2].dtype == tf.float16 and g[2].numpy().astype(np.float32).tolist() == [[1.0, 1.0]] * 2
        assert g[3].dtype == tf.bfloat16 and g[3].numpy().astype(np.float32).tolist() == [[1.5, 3.0]]


def test_keras_sync_callback_broadcasts_bfloat16_weights_on_threads():
    """SyncCallback broadcasts a bf16 Keras model's weights (numpy ml_dtypes arrays, as Keras gives them)."""
    import keras
    import ml_dtypes

    import ember.keras

    def work(comm):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, dtype="bfloat16")])
        model.set_weights([np.full(w.shape, comm.rank + 1.5, w.dtype) for w in model.get_weights()])
        callback = ember.keras.SyncCallback(comm=comm)
        callback.set_model(model)
        callback.on_train_begin()
        return model.get_weights()

    for weights in run_threads(2, work):
        assert [w.dtype for w in weights] == [ml_dtypes.bfloat16] * 2
        assert all((w.astype(np.float32) == 1.5).all() for w in weights), weights


# ----------------------------------------------------------------------------- real nodes
def node_collectives(args, ctx):
    import ml_dtypes
    import numpy as np
    import tensorflow as tf

    comm = ctx.communicator(timeout=60)
    r = ctx.training_rank
    bf16 = np.array([r + 1.0, 2.0], ml_dtypes.bfloat16)
    tf_bf16 = tf.constant([[r + 1.0]] * (r + 1), tf.bfloat16)
    result = {
        "rank": r, "size": comm.size, "is_chief": ctx.is_chief,
        "sum": ctx.allreduce(np.array([r + 1.0, 2.0]), op="sum").tolist(),
        "bcast": ctx.broadcast(np.array([ctx.executor_id * 100.0]), root=1).tolist(),
        "gather": ctx.allgather(np.array([r] * (r + 1))).tolist(),
        "describe": comm.describe(1),
        "bf16_sum": [str(v.dtype) for v in [ctx.allreduce(bf16, op="sum")]] + ctx.allreduce(bf16, op="sum").astype(
            np.float32).tolist(),
        "bf16_bcast": ctx.broadcast(bf16, root=1).astype(np.float32).tolist(),
        "tf_bf16_gather": [ctx.allgather(tf_bf16).dtype.name] + ctx.allgather(tf_bf16).numpy().astype(
            np.float32).ravel().tolist(),
    }
    Path(args["out"], f"node-{r}.json").write_text(json.dumps(result))


def test_collectives_between_nodes(spark, tmp_path):
    cluster = ember.Cluster.run(spark, node_collectives, {"out": str(tmp_path)}, num_executors=2,
                                reservation_timeout=120)
    cluster.shutdown(timeout=120)
    no_leftovers(cluster.job_id)
    res = [json.loads((tmp_path / f"node-{r}.json").read_text()) for r in range(2)]
    for r, out in enumerate(res):
        assert out["rank"] == r and out["size"] == 2 and out["is_chief"] == (r == 0)
        assert out["sum"] == [3.0, 4.0]
        assert out["gather"] == [0, 1, 1]
        assert out["bcast"] == res[1]["bcast"]
        assert out["describe"].startswith("rank 1 (worker:")
        assert out["bf16_sum"] == ["bfloat16", 3.0, 4.0]
        assert out["bf16_bcast"] == [2.0, 2.0]
        assert out["tf_bf16_gather"] == ["bfloat16", 1.0, 2.0, 2.0]


def node_dies_in_allreduce(args, ctx):
    import os
    import signal

    import numpy as np

    comm = ctx.communicator(timeout=60)
    if ctx.training_rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    comm.allreduce(np.ones(1000, np.float32))


def test_a_dead_node_is_named(spark):
    cluster = ember.Cluster.run(spark, node_dies_in_allreduce, {}, num_executors=2, reservation_timeout=120)
    with pytest.raises(errors.EmberError) as info:
        cluster.shutdown(timeout=120)
    # The driver names the node that died (training rank 1 is worker:1 in this layout).
    assert "worker:1" in str(info.value) and "SIGKILL" in str(info.value), str(info.value)
    no_leftovers(cluster.job_id)


# ----------------------------------------------------------------------------- Keras model.fit
def keras_fit(args, ctx):
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    import ember.keras

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(100 + ctx.executor_id)  # different initial weights on purpose
    rng = np.random.default_rng(ctx.executor_id)
    x = rng.normal(size=(512, 8)).astype(np.float32)
    y = (x @ np.arange(1, 9, dtype=np.float32) / 10.0).astype(np.float32)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=ember.keras.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    xv = rng.normal(size=(64, 8)).astype(np.float32)
    yv = (xv @ np.arange(1, 9, dtype=np.float32) / 10.0).astype(np.float32)
    history = model.fit(x, y, batch_size=32, epochs=4, shuffle=False, validation_data=(xv, yv),
                        callbacks=[ember.keras.SyncCallback(), ember.keras.SummaryCallback(every_n_steps=4)],
                        verbose=ember.keras.verbose(2))
    np.savez(Path(args["out"]) / f"weights-{ctx.training_rank}.npz", *model.get_weights())
    Path(args["out"], f"history-{ctx.training_rank}.json").write_text(json.dumps(history.history))


def _scalars(directory) -> dict:
    """{tag: [(step, value)]} of the one event file in `directory`, read by TensorFlow."""
    import tensorflow as tf
    (path,) = Path(directory).glob("events.out.tfevents.*")
    out: dict = {}
    for event in tf.compat.v1.train.summary_iterator(str(path)):
        for v in event.summary.value:
            out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


def test_keras_fit_on_two_nodes_keeps_replicas_identical(spark, tmp_path):
    cluster = ember.Cluster.run(spark, keras_fit, {"out": str(tmp_path)}, num_executors=2, reservation_timeout=120,
                                log_dir=str(tmp_path / "logs"))
    cluster.shutdown(timeout=240)
    no_leftovers(cluster.job_id)
    w0, w1 = (np.load(tmp_path / f"weights-{r}.npz") for r in range(2))
    assert len(w0.files) == 4
    for k in w0.files:
        np.testing.assert_array_equal(w0[k], w1[k])  # same bits on both nodes
    h0, h1 = (json.loads((tmp_path / f"history-{r}.json").read_text()) for r in range(2))
    assert h0 == h1  # epoch metrics are averaged over the nodes
    assert h0["loss"][-1] < h0["loss"][0] * 0.5, h0
    # SummaryCallback: every node its batch loss every 4 of its 16 batches per epoch; the chief
    # the job's epoch metrics, validation included, as model.fit returned them.
    chief, other = (_scalars(tmp_path / "logs" / f"worker_{i}") for i in range(2))
    for node in (chief, other):
        assert [s for s, _ in node["batch/loss"]] == list(range(4, 65, 4))
    for key in ("loss", "val_loss"):
        np.testing.assert_allclose([v for _, v in chief[f"epoch/{key}"]], h0[key], rtol=1e-6)
        assert [s for s, _ in chief[f"epoch/{key}"]] == [0, 1, 2, 3]
    assert not any(tag.startswith("epoch/") for tag in other)
