"""Automatic recovery (Cluster.run(max_restarts=N)) on real Spark with real Keras: a node killed
with SIGKILL mid-epoch makes the driver relaunch every node, the nodes resume from their newest
checkpoint, and the job ends with the weights an undisturbed run reaches; past max_restarts the
failure is raised with every reason; nothing of either gang is left behind."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import ember
from ember import errors
from conftest import no_leftovers

pytestmark = pytest.mark.timeout(600)

EPOCHS = 4


def train_with_checkpoints(args, ctx):
    """Sync Keras training on 2 nodes, deterministic (fixed seeds, no shuffling, plain SGD), with a
    checkpoint of the weights after every epoch (the chief: a temporary file, then a rename).
    args["kills"]: [(rank, epoch, batch)], each done once (a marker file says so): training rank
    `rank` SIGKILLs itself after `batch` of `epoch`, or with batch "checkpoint" in the middle of
    writing that epoch's checkpoint (its temporary file written, not yet renamed)."""
    import os
    import signal
    import time

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import ember.keras

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    out = Path(args["out"])
    keras.utils.set_random_seed(100 + ctx.executor_id)
    rng = np.random.default_rng(ctx.executor_id)
    x = rng.normal(size=(512, 8)).astype(np.float32)
    y = (x @ np.arange(1, 9, dtype=np.float32) / 10.0).astype(np.float32)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    ember_ckpt = args.get("ember_checkpoints", False)  # ember.keras's callback (Adam: its state too)
    optimizer = keras.optimizers.Adam(0.01) if ember_ckpt else keras.optimizers.SGD(0.05)
    model.compile(optimizer=ember.keras.DistributedOptimizer(optimizer), loss="mse")

    ckpt = out / "ckpt.npz"
    initial_epoch = 0
    if ember_ckpt:
        initial_epoch = ember.keras.restore_latest(model, str(out / "ckpt"))
    elif ckpt.exists():  # a restarted gang: resume where the last checkpoint left off
        saved = np.load(ckpt)
        initial_epoch = int(saved["epoch"])
        model.set_weights([saved[f"w{i}"] for i in range(len(model.get_weights()))])
    (out / f"restored-{ctx.training_rank}-{os.environ['EMBER_JOB_ID']}.txt").write_text(str(initial_epoch))

    def maybe_die(epoch, batch):
        for k, (rank, at_epoch, at_batch) in enumerate(args.get("kills", [])):
            marker = out / f"killed-{k}"
            if (rank, at_epoch, at_batch) == (ctx.training_rank, epoch, batch) and not marker.exists():
                marker.write_text(str(os.getpid()))
                if args.get("lose_executor"):
                    # A lost executor, as when its host goes away: SIGKILL the Spark executor
                    # hosting this node, and this node makes no more progress (its host is gone).
                    # Without the freeze the node would train on until the launcher's death reaches
                    # it (parent-death signal), racing the chief's next checkpoint.
                    os.kill(_executor_pid(), signal.SIGKILL)
                    while True:
                        time.sleep(60)
                os.kill(os.getpid(), signal.SIGKILL)

    class Checkpoint(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            maybe_die(self.epoch, batch)

        def on_epoch_end(self, epoch, logs=None):
            if ember.keras.is_chief() and not ember_ckpt:
                tmp = out / "ckpt.tmp.npz"
                np.savez(tmp, epoch=epoch + 1, **{f"w{i}": w for i, w in enumerate(self.model.get_weights())})
                maybe_die(epoch, "checkpoint")
                os.replace(tmp, ckpt)  # atomic: a restart sees the old or the new one

    callbacks = [ember.keras.SyncCallback(), Checkpoint()]
    if ember_ckpt:
        callbacks.append(ember.keras.CheckpointCallback(str(out / "ckpt"), keep=2))
    history = model.fit(x, y, batch_size=32, epochs=EPOCHS, initial_epoch=initial_epoch, shuffle=False,
                        callbacks=callbacks, verbose=0)
    np.savez(out / f"weights-{ctx.training_rank}.npz", *model.get_weights())
    (out / f"history-{ctx.training_rank}.json").write_text(json.dumps(history.history))


def _executor_pid() -> int:
    """The pid of the Spark executor JVM this process runs under (its nearest such ancestor)."""
    import os
    pid = os.getpid()
    while pid > 1:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"CoarseGrainedExecutorBackend" in cmdline:
            return pid
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
    raise RuntimeError("no Spark executor among this process's ancestors (not on a standalone cluster?)")


def always_fails(args, ctx):
    if ctx.task_index == 0 and ctx.job_name == "worker":
        raise RuntimeError(f"broken on purpose in {ctx.job_id}")


def _weights(directory: Path, rank: int):
    w = np.load(directory / f"weights-{rank}.npz")
    return [w[k] for k in sorted(w.files, key=lambda k: int(k.split("_")[1]))]


_undisturbed: dict = {}


def undisturbed(spark, tmp_path_factory, ember_checkpoints: bool) -> Path:
    """The directory of an undisturbed run of train_with_checkpoints (run once per kind)."""
    if ember_checkpoints not in _undisturbed:
        out = tmp_path_factory.mktemp("undisturbed")
        cluster = ember.Cluster.run(spark, train_with_checkpoints,
                                    {"out": str(out), "ember_checkpoints": ember_checkpoints},
                                    num_executors=2, reservation_timeout=120, max_restarts=2)
        cluster.shutdown(timeout=300)
        assert cluster.restarts == []
        no_leftovers(cluster.job_id)
        _undisturbed[ember_checkpoints] = out
    return _undisturbed[ember_checkpoints]


@pytest.mark.parametrize("kills, resumed_at, ember_checkpoints", [
    # a worker in the middle of epoch 2: the new gang resumes from epoch 1's checkpoint
    ([(1, 2, 5)], [2], False),
    # the chief while writing epoch 1's checkpoint (epoch 0's stays the newest), then a worker in
    # the next gang's second epoch: two failures in a row
    ([(0, 1, "checkpoint"), (1, 2, 3)], [1, 2], False),
    # ember.keras.CheckpointCallback + restore_latest, Adam (its moments restored too)
    ([(1, 2, 5)], [2], True),
], ids=["worker-mid-epoch", "chief-in-checkpoint-then-worker", "ember-checkpoints-adam"])
def test_killed_nodes_restart_the_gang_which_resumes_from_its_checkpoint(spark, tmp_path, tmp_path_factory, capsys,
                                                                         kills, resumed_at, ember_checkpoints):
    calm = undisturbed(spark, tmp_path_factory, ember_checkpoints)
    cluster = ember.Cluster.run(spark, train_with_checkpoints,
                                {"out": str(tmp_path), "kills": kills, "ember_checkpoints": ember_checkpoints},
                                num_executors=2, reservation_timeout=120, max_restarts=2)
    cluster.shutdown(timeout=300)
    assert all((tmp_path / f"killed-{k}").exists() for k in range(len(kills)))
    assert [r.node for r in cluster.restarts] == [("worker:0", "worker:1")[rank] for rank, _, _ in kills]
    assert all("SIGKILL" in r.reason for r in cluster.restarts), cluster.restarts
    gangs = [f"{cluster.job_id}-r{k + 1}" for k in range(len(kills))]
    assert [r.node_job_id for r in cluster.restarts] == gangs and cluster.node_job_id == gangs[-1]
    printed = capsys.readouterr()
    assert f"restarting all 2 nodes (restart 1 of 2)" in printed.out + printed.err
    # Each new gang resumed from the newest complete checkpoint (a half-written one is not seen)...
    for gang, epoch in zip(gangs, resumed_at):
        assert [(tmp_path / f"restored-{r}-{gang}.txt").read_text() for r in range(2)] == [str(epoch)] * 2
    # ...and the job ended where the undisturbed run did, bit for bit, on both nodes.
    for rank in range(2):
        for a, b in zip(_weights(calm, rank), _weights(tmp_path, rank)):
            np.testing.assert_array_equal(a, b)
    for job_id in [cluster.job_id] + gangs:
        no_leftovers(job_id)


def test_failures_past_max_restarts_raise_with_every_reason(spark):
    cluster = ember.Cluster.run(spark, always_fails, {}, num_executors=2, reservation_timeout=120, max_restarts=1)
    with pytest.raises(errors.NodeError) as info:
        cluster.shutdown(timeout=120)
    text = str(info.value) + "".join(getattr(info.value, "__notes__", []))
    assert f"broken on purpose in {cluster.job_id}-r1" in text  # the last gang's failure...
    assert "earlier restarts" in text and f"broken on purpose in {cluster.job_id}" in text  # ...and the first's
    assert [r.node for r in cluster.restarts] == ["worker:0"]
    for job_id in (cluster.job_id, f"{cluster.job_id}-r1"):
        no_leftovers(job_id)


def test_max_restarts_must_not_be_negative(spark):
    with pytest.raises(ValueError, match="max_restarts"):
        ember.Cluster.run(spark, always_fails, {}, num_executors=2, max_restarts=-1)


def spark_mode_ids(args, ctx):
    """InputMode.SPARK: each epoch, every node records the ids it was fed; the chief checkpoints
    the epoch count.  Node worker:1 SIGKILLs itself after 2 batches of epoch 1, once."""
    import os
    import signal

    out = Path(args["out"])
    ckpt = out / "epoch.txt"
    start = int(ckpt.read_text()) if ckpt.exists() else 0
    (out / f"start-{ctx.training_rank}-{os.environ['EMBER_JOB_ID']}.txt").write_text(str(start))
    feed = ctx.get_data_feed()
    for epoch in range(start, args["epochs"]):
        ids = []
        for k, batch in enumerate(feed.epoch_batches(10)):
            ids.extend(int(i) for i in batch["id"])
            if epoch == 1 and k == 2 and ctx.training_rank == 1 and not (out / "killed").exists():
                (out / "killed").write_text("yes")
                os.kill(os.getpid(), signal.SIGKILL)
        (out / f"ids-{ctx.training_rank}-{epoch}.json").write_text(json.dumps(sorted(ids)))
        ctx.barrier(f"epoch-{epoch}", timeout=120)  # both nodes finished the epoch
        if ctx.training_rank == 0:
            tmp = out / "epoch.tmp"
            tmp.write_text(str(epoch + 1))
            os.replace(tmp, ckpt)


def test_spark_mode_refeeds_the_interrupted_epoch_to_the_new_gang(spark, tmp_path):
    df = spark.range(0, 400, 1, 4).withColumnRenamed("id", "id")
    cluster = ember.Cluster.run(spark, spark_mode_ids, {"out": str(tmp_path), "epochs": 3}, num_executors=2,
                                input_mode=ember.InputMode.SPARK, reservation_timeout=120, max_restarts=1)
    cluster.train(df, num_epochs=3)
    cluster.shutdown(timeout=120)
    assert (tmp_path / "killed").exists()
    assert [r.node for r in cluster.restarts] == ["worker:1"]
    # The new gang started at epoch 1 (the chief's last checkpoint) and was fed epochs 1 and 2 whole.
    for rank in range(2):
        assert (tmp_path / f"start-{rank}-{cluster.node_job_id}.txt").read_text() == "1"
    for epoch in range(3):
        got = sorted(json.loads((tmp_path / f"ids-0-{epoch}.json").read_text())
                     + json.loads((tmp_path / f"ids-1-{epoch}.json").read_text()))
        assert got == list(range(400)), f"epoch {epoch}: rows lost or repeated"
    for job_id in (cluster.job_id, cluster.node_job_id):
        no_leftovers(job_id)


def test_a_lost_executor_restarts_the_gang_on_a_standalone_cluster(spark_sessions, tmp_path):
    """The executor hosting worker:1 is SIGKILLed mid-epoch (a lost executor): Spark's standalone
    worker starts a new executor, Ember relaunches both nodes, they resume from the newest
    checkpoint and finish; nothing of the job or the cluster is left."""
    from spark_cluster import StandaloneCluster

    spark_sessions.stop()  # one SparkContext per process: make room for the cluster's
    with StandaloneCluster(num_workers=2, cores_per_worker=2, memory="2g") as standalone:
        spark = standalone.session("ember-lost-executor-test")
        try:
            cluster = ember.Cluster.run(spark, train_with_checkpoints,
                                        {"out": str(tmp_path), "kills": [(1, 2, 5)], "lose_executor": True},
                                        num_executors=2, reservation_timeout=120, max_restarts=1)
            cluster.shutdown(timeout=300)
        finally:
            spark.stop()
        assert (tmp_path / "killed-0").exists()
        assert len(cluster.restarts) == 1, cluster.restarts
        restart = cluster.restarts[0]
        print(f"lost executor: {restart}")
        assert restart.node == "worker:1" and "lost" in restart.reason, restart  # "lost: no heartbeat"
        gang = f"{cluster.job_id}-r1"
        assert restart.node_job_id == gang
        assert [(tmp_path / f"restored-{r}-{gang}.txt").read_text() for r in range(2)] == ["2", "2"]
        for r in range(2):
            history = json.loads((tmp_path / f"history-{r}.json").read_text())
            assert len(history["loss"]) == EPOCHS - 2  # epochs 2 and 3, after the restart
        for job_id in (cluster.job_id, gang):
            no_leftovers(job_id)
    assert standalone.processes() == []
