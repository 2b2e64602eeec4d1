"""Checkpoints: ember.checkpoint on a local directory and a real HDFS; Keras model.fit on two
Spark nodes that checkpoints, then a second job that restores and continues; a damaged
checkpoint refused, naming the file."""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import numpy as np
import pytest

import ember
import ember.checkpoint
import ember.summary
from conftest import no_leftovers
from ember import _ember, errors

pytestmark = pytest.mark.timeout(420)


# -- (a) round trips, keep-K ------------------------------------------------------------------

def _round_trip(directory, resolve=None):
    m = ember.checkpoint.CheckpointManager(directory, keep=2, resolve=resolve)
    assert m.latest() is None and m.steps() == [] and m.restore() is None
    big = os.urandom(3 << 20)
    for step in (1, 2, 3):
        m.save(step, {"model.npz": big[:step * 1000], "meta": f"step {step}".encode(), "empty": b""})
    assert m.steps() == [2, 3]  # keep=2
    assert m.latest() == 3
    step, blobs = m.restore()
    assert step == 3 and blobs == {"model.npz": big[:3000], "meta": b"step 3", "empty": b""}
    assert m.restore(step=2)[1]["meta"] == b"step 2"
    assert m.restore(step=1) is None
    m.save(4, {"model.npz": big})
    # A second manager (a restarted node) reads the same bytes.
    again = ember.checkpoint.CheckpointManager(directory, resolve=resolve)
    assert again.steps() == [3, 4] and again.restore()[1] == {"model.npz": big}
    with pytest.raises(ValueError, match="invalid blob name"):
        m.save(5, {"../x": b""})
    with pytest.raises(TypeError):
        m.save(5, {"x": "not bytes"})
    return m


def test_round_trip_and_keep_on_a_local_directory(tmp_path):
    m = _round_trip(str(tmp_path / "ckpt"))
    assert m.uri == str(tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["ckpt-0000000003", "ckpt-0000000004"]
    assert sorted(os.listdir(tmp_path / "ckpt" / "ckpt-0000000004")) == ["MANIFEST", "model.npz"]
    with pytest.raises(ValueError, match="keep"):
        ember.checkpoint.CheckpointManager(str(tmp_path / "other"), keep=0)


def test_round_trip_and_keep_on_hdfs(hdfs):
    directory = f"{hdfs.default_fs}/checkpoints/{uuid.uuid4().hex[:8]}"
    resolve = ember.summary.resolve_options(hdfs.default_fs, hdfs.http_address)
    m = _round_trip(directory, resolve)
    assert m.uri == directory
    names = sorted(n.rstrip("/").rsplit("/", 1)[-1] for n in _ember.fs_list(directory, resolve))
    assert names == ["ckpt-0000000003", "ckpt-0000000004"], names
    manifest = _ember.fs_read_file(f"{directory}/ckpt-0000000004/MANIFEST", resolve)
    assert manifest.startswith(b"ember-checkpoint 1\nstep 4\nblob model.npz 3145728 ")


# -- (c) damage is refused, naming the file ------------------------------------------------------

def test_a_damaged_blob_is_refused_naming_the_file(tmp_path):
    m = ember.checkpoint.CheckpointManager(str(tmp_path), keep=3)
    m.save(1, {"model.npz": b"a" * 100})
    m.save(2, {"model.npz": b"b" * 100})
    blob = tmp_path / "ckpt-0000000002" / "model.npz"
    data = bytearray(blob.read_bytes())
    data[50] ^= 1
    blob.write_bytes(bytes(data))
    with pytest.raises(errors.Corruption, match="CRC32C") as info:
        m.restore()
    assert str(blob) in str(info.value)
    assert m.restore(fall_back_to_older=True) == (1, {"model.npz": b"a" * 100})
    blob.write_bytes(b"short")
    with pytest.raises(errors.Corruption, match="5 bytes, its MANIFEST says 100"):
        m.restore(step=2)


# -- (b) Keras on two Spark nodes: checkpoint, then a new job restores and continues -----------

def keras_job(args, ctx):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    import ember.keras

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(100 + ctx.executor_id + 10 * args["epochs"])  # differs per node and job
    rng = np.random.default_rng(ctx.executor_id)
    x = rng.normal(size=(512, 8)).astype(np.float32)
    y = (x @ np.arange(1, 9, dtype=np.float32) / 10.0).astype(np.float32)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=ember.keras.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    out, r = Path(args["out"]), ctx.training_rank

    initial_epoch = ember.keras.restore_latest(model, args["ckpt"])  # the restart's first step
    opt_vars = [keras.ops.convert_to_numpy(v) for v in model.optimizer.variables] if model.optimizer.built else []
    np.savez(out / f"restored-{r}.npz", *model.get_weights())
    np.savez(out / f"restored-opt-{r}.npz", *opt_vars)
    history = model.fit(x, y, batch_size=32, epochs=args["epochs"], initial_epoch=initial_epoch, shuffle=False,
                        callbacks=[ember.keras.SyncCallback(), ember.keras.CheckpointCallback(args["ckpt"], keep=3)],
                        verbose=ember.keras.verbose(2))
    np.savez(out / f"final-{r}.npz", *model.get_weights())
    (out / f"run-{r}.json").write_text(json.dumps(
        {"initial_epoch": initial_epoch, "epochs": history.epoch, "loss": history.history["loss"],
         "iterations": int(keras.ops.convert_to_numpy(model.optimizer.iterations))}))


def _run(spark, out: Path, ckpt: str, epochs: int):
    out.mkdir()
    cluster = ember.Cluster.run(spark, keras_job, {"out": str(out), "ckpt": ckpt, "epochs": epochs},
                                num_executors=2, reservation_timeout=120)
    cluster.shutdown(timeout=240)
    no_leftovers(cluster.job_id)
    return [json.loads((out / f"run-{r}.json").read_text()) for r in range(2)]


def _arrays(path: Path):
    with np.load(path) as z:
        return [z[f"arr_{k}"] for k in range(len(z.files))]


def _npz_blob(data: bytes):
    import io

    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return [z[n] for n in sorted(z.files)]


def test_keras_fit_checkpoints_and_a_new_job_resumes(spark, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    first = _run(spark, tmp_path / "first", ckpt, epochs=2)
    assert [run["initial_epoch"] for run in first] == [0, 0]
    assert first[0]["epochs"] == [0, 1] and first[0]["iterations"] == 32  # 512 rows / 32 per step, 2 epochs

    m = ember.checkpoint.CheckpointManager(ckpt)
    assert m.steps() == [1, 2]
    step, blobs = m.restore()
    assert step == 2 and sorted(blobs) == ["meta.json", "model.npz", "optimizer.npz"]
    saved = _npz_blob(blobs["model.npz"])
    for a, b in zip(saved, _arrays(tmp_path / "first" / "final-0.npz")):
        np.testing.assert_array_equal(a, b)  # the chief's weights at the end of epoch 2
    saved_opt = _npz_blob(blobs["optimizer.npz"])
    assert int(saved_opt[0]) == 32  # iterations first (Keras 3's optimizer.variables order)

    second = _run(spark, tmp_path / "second", ckpt, epochs=3)
    for r, run in enumerate(second):
        assert run["initial_epoch"] == 2, run
        assert run["epochs"] == [2], run  # one more epoch, numbered from 2
        assert run["iterations"] == 48, run  # Adam's step count went on from the checkpoint's
        restored = _arrays(tmp_path / "second" / f"restored-{r}.npz")
        assert len(restored) == len(saved) == 4
        for a, b in zip(restored, saved):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()  # bit for bit, on every node
        for a, b in zip(_arrays(tmp_path / "second" / f"restored-opt-{r}.npz"), saved_opt):
            assert a.tobytes() == b.tobytes()
    # Training continued from the checkpoint, not from fresh weights.
    assert second[0]["loss"][0] < first[0]["loss"][0] * 0.5, (first, second)
    assert second[0]["loss"] == second[1]["loss"]
    assert m.steps() == [1, 2, 3]
    assert json.loads(m.restore()[1]["meta.json"]) == {"format": 1, "epochs_done": 3}


def test_restore_latest_without_a_checkpoint_changes_nothing(tmp_path):
    import keras

    import ember.keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = model.get_weights()
    assert ember.keras.restore_latest(model, str(tmp_path / "none")) == 0
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    ember.checkpoint.CheckpointManager(str(tmp_path / "c")).save(
        1, {"model.npz": ember.keras._npz_bytes(other.get_weights()), "meta.json": b'{"epochs_done": 1}'})
    with pytest.raises(ValueError, match="do not fit"):
        ember.keras.restore_latest(model, str(tmp_path / "c"))
