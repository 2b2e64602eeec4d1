"""ember.tune: search spaces, ASHA, a small Fashion-MNIST search whose diverging trial is
stopped early, a TPE search in warm runners, failing and dying trials, the time budget."""
from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import no_leftovers
from ember import tune

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "fashion_mnist"
sys.path.insert(0, str(EXAMPLES))
import data as fmnist  # noqa: E402

needs_dataset = pytest.mark.skipif(
    not (fmnist.SOURCE_DIR / "t10k-labels-idx1-ubyte.gz").exists(),
    reason="Debian package dataset-fashion-mnist is not installed")

EPOCHS = 4


def test_space_grid_times_samples_is_deterministic():
    space = {"lr": tune.loguniform(1e-4, 1e-1), "units": tune.grid([32, 64]), "act": tune.choice(["relu", "tanh"]),
             "layers": tune.randint(1, 4), "drop": tune.uniform(0.0, 0.5), "epochs": 3}
    trials = tune.trials_of(space, num_samples=3, seed=5)
    assert len(trials) == 6 and [t["units"] for t in trials] == [32, 64] * 3
    assert trials == tune.trials_of(space, num_samples=3, seed=5)
    assert all(1e-4 <= t["lr"] < 1e-1 and 1 <= t["layers"] < 4 and t["epochs"] == 3 for t in trials)
    assert len({t["lr"] for t in trials}) == 6


def test_asha_stops_the_worse_and_the_diverged():
    asha = tune.ASHA(time_attr="epoch", grace_period=1, reduction_factor=2, max_t=8)
    asha.setup("acc", "max")
    assert asha.rungs(8) == [1, 2, 4]
    assert asha.on_report(0, {"epoch": 1, "acc": 0.8}) is None      # first at the rung goes on
    assert asha.on_report(1, {"epoch": 1, "acc": 0.85}) is None
    reason = asha.on_report(2, {"epoch": 1, "acc": 0.1})
    assert reason and "outside the best 1/2" in reason
    assert asha.on_report(0, {"epoch": 0.5, "acc": 0.0}) is None     # before the grace period
    assert "is nan" in asha.on_report(3, {"epoch": 0.2, "loss": math.nan, "acc": 0.5})
    asha_min = tune.ASHA(grace_period=1, reduction_factor=2)
    asha_min.setup("loss", "min")
    assert asha_min.on_report(0, {"epoch": 1, "loss": 0.3}) is None
    assert asha_min.on_report(1, {"epoch": 1, "loss": 2.0}) is not None


def fmnist_trial(params, ctx):
    """A small dense classifier on 12,000 training images; reports val_accuracy every epoch."""
    import os
    sys.path.insert(0, params["examples"])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import data
    import keras
    import tensorflow as tf

    import ember.keras

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(1)
    x, y = data.load_split("train")
    xv, yv = data.load_split("test")
    x, y = x[:12000].reshape(-1, 784) / 255.0, y[:12000]
    xv, yv = xv[:2000].reshape(-1, 784) / 255.0, yv[:2000]
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(params["units"], activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(params["lr"]), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(x, y, validation_data=(xv, yv), epochs=EPOCHS, batch_size=64, verbose=0,
              callbacks=[ember.keras.ProgressCallback(ctx, every_n_steps=10_000)])
    return model


@needs_dataset
def test_fashion_mnist_search_stops_the_diverging_trial(spark):
    space = {"lr": tune.grid([1e-3, 3e-3, 10.0]), "units": 64, "examples": str(EXAMPLES)}
    t0 = time.monotonic()
    search = tune.run(spark, fmnist_trial, space, metric="val_accuracy", mode="max", parallelism=2,
                      scheduler=tune.ASHA(time_attr="epoch", grace_period=1, reduction_factor=2, max_t=EPOCHS))
    print(f"search: {time.monotonic() - t0:.1f}s, {search.trials_per_hour:.0f} trials/hour")
    by_lr = {t.params["lr"]: t for t in search.trials}
    bad = by_lr[10.0]
    # Trial 2 starts once trial 0 or 1 ended: both were recorded at rung 1, so it is stopped there.
    assert bad.status == "stopped", (bad.status, bad.error)
    assert "ASHA" in bad.error and bad.progress is not None and bad.progress < EPOCHS
    assert bad.metric is not None and bad.metric < 0.5
    best = search.best_trial
    assert best.params["lr"] in (1e-3, 3e-3) and best.status == "ok" and best.progress == EPOCHS
    assert best.metric > 0.8

    df = search.to_df(spark)
    assert set(df.columns) >= {"trial", "lr", "units", "metric", "status", "seconds"}
    rows = df.collect()
    assert len(rows) == 3 and rows[0]["trial"] == best.index
    assert {r["status"] for r in rows if r["lr"] == 10.0} == {"stopped"}

    xv, yv = fmnist.load_split("test")
    xv, yv = xv[5000:6000].reshape(-1, 784) / 255.0, yv[5000:6000]
    model = search.best_model()
    acc = float(np.mean(np.argmax(model.predict(xv, verbose=0), axis=1) == yv))
    assert acc > 0.75
    ensemble = search.best_ensemble(2)
    assert 1 <= len(ensemble.models) <= 2
    p = ensemble.predict(xv)
    assert float(np.mean(np.argmax(p, axis=1) == yv)) > 0.75
    merged = ensemble.to_keras_model()
    assert np.allclose(merged.predict(xv, verbose=0), p, atol=1e-5)


def _fails_for_odd(params, ctx):
    if params["k"] == 3:
        os._exit(7)  # the runner process dies: its trial fails, the runner is replaced
    if params["k"] % 2:
        raise RuntimeError(f"trial with k={params['k']} fails")
    return {"score": float(params["k"]), "pid": os.getpid()}


def test_failed_trials_are_recorded_and_the_budget_is_kept(spark):
    # One slot: the trials run in order, so which runner ran which trial is known.
    search = tune.run(spark, _fails_for_odd, {"k": tune.grid([1, 2, 3, 4, 6])}, metric="score", mode="max",
                      parallelism=1)
    status = {t.params["k"]: t.status for t in search.trials}
    assert status == {1: "failed", 2: "ok", 3: "failed", 4: "ok", 6: "ok"}
    by_k = {t.params["k"]: t for t in search.trials}
    assert "trial 0 failed" in by_k[1].error and "RuntimeError: trial with k=1 fails" in by_k[1].error
    assert "trial 2: its runner process ended while it ran" in by_k[3].error and "exit code 7" in by_k[3].error
    assert search.best_params == {"k": 6} and search.best_trial.metric == 6.0
    # The runner went on after k=1 raised, died with k=3 and was replaced for k=4 and 6.
    job = [by_k[k].job_id for k in (1, 2, 3, 4, 6)]
    assert job[0] == job[1] == job[2] != job[3] == job[4]
    assert by_k[2].value["pid"] != by_k[4].value["pid"] and by_k[4].value["pid"] == by_k[6].value["pid"]
    for job_id in {t.job_id for t in search.trials}:
        no_leftovers(job_id)
    with pytest.raises(ValueError, match="nodes_per_trial=9"):
        tune.run(spark, _fails_for_odd, {"k": 1}, metric="score", nodes_per_trial=9)
    late = tune.run(spark, _fails_for_odd, {"k": tune.grid([2, 4])}, metric="score", time_budget_s=0.0)
    assert [t.status for t in late.trials] == ["pending", "pending"]


def _sleeps(params, ctx):
    time.sleep(600)  # never reports: only the budget's end can stop it


def test_the_budget_ends_a_running_trial_in_a_warm_runner(spark):
    # Trial 0 is drawn at once, so the budget's end stops it ("stopped": while it sleeps in its
    # runner, or before it gets there if the runner starts late); 1 and 2 are never drawn.
    search = tune.run(spark, _sleeps, {"k": tune.grid([1, 2, 3])}, metric="score", parallelism=1, time_budget_s=2.0)
    assert [t.status for t in search.trials] == ["stopped", "pending", "pending"]
    assert "time budget of 2s ran out" in search.trials[0].error
    assert search.seconds < 60  # the trial's own wait would have lasted 600 s
    no_leftovers(search.trials[0].job_id)


def tpe_trial(params, ctx):
    """A tiny dense classifier on 2,000 training images, 3 epochs; reports val_accuracy each epoch."""
    sys.path.insert(0, params["examples"])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import data
    import keras
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)  # a no-op in a warm runner's next trials
    tf.config.threading.set_inter_op_parallelism_threads(1)
    keras.utils.set_random_seed(1)
    x, y = data.load_split("train")
    xv, yv = data.load_split("test")
    x, y = x[:2000].reshape(-1, 784) / 255.0, y[:2000]
    xv, yv = xv[:1000].reshape(-1, 784) / 255.0, yv[:1000]
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(params["units"], activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(params["lr"]), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    for epoch in range(3):
        model.fit(x, y, epochs=1, batch_size=64, verbose=0)
        acc = float(model.evaluate(xv, yv, verbose=0, batch_size=1000)[1])
        ctx.report(epoch=epoch + 1, val_accuracy=acc)
    return {"val_accuracy": acc, "pid": os.getpid()}


@needs_dataset
def test_tpe_search_in_warm_runners(spark):
    from optuna.trial import TrialState

    sampler = tune.TPE(n_startup_trials=3)
    space = {"lr": tune.loguniform(1e-4, 3e-1), "units": tune.choice([16, 32, 64]), "examples": str(EXAMPLES)}
    search = tune.run(spark, tpe_trial, space, metric="val_accuracy", mode="max", num_samples=5, parallelism=2,
                      sampler=sampler, scheduler=tune.ASHA(time_attr="epoch", grace_period=1, reduction_factor=2,
                                                           max_t=3))
    trials = search.trials
    assert len(trials) == 5 and all(t.status in ("ok", "stopped") for t in trials), [(t.status, t.error) for t in trials]
    # Every trial went through Optuna's ask/tell: finished ones COMPLETE with their metric, the
    # ones ASHA stopped PRUNED with the values they reported (what TPE ranks them by).
    optuna_trials = sampler._study.get_trials(deepcopy=False)
    assert len(optuna_trials) == 5
    assert sorted(ot.state == TrialState.COMPLETE for ot in optuna_trials) == \
        sorted(t.status == "ok" for t in trials)
    for t, ot in zip(trials, optuna_trials):
        assert ot.params["units"] == [16, 32, 64].index(t.params["units"]) and ot.params["lr"] == t.params["lr"]
        assert list(ot.intermediate_values.values()) == [r["val_accuracy"] for r in t.reports]
        if t.status == "ok":
            assert ot.value == t.metric and t.progress == 3
        else:
            assert "ASHA" in t.error and t.progress < 3
    # Warm runners: 5 trials ran in the 2 runners' processes, each a job of its own.
    pids = {t.value["pid"] for t in trials if t.status == "ok"}
    assert len({t.job_id for t in trials}) == 2 and len(pids) <= 2
    assert search.best_trial.metric > 0.6
    for job_id in {t.job_id for t in trials}:
        no_leftovers(job_id)


def _two_node_trial(params, ctx):
    total = ctx.allreduce(np.array([params["k"] * (ctx.training_rank + 1)], np.float64), "sum")
    ctx.report(epoch=1, score=float(total[0]))
    return {"score": float(total[0]), "nodes": ctx.num_workers}


def test_a_trial_can_be_a_multi_node_job(spark):
    search = tune.run(spark, _two_node_trial, {"k": tune.grid([1, 2])}, metric="score", mode="min",
                      nodes_per_trial=2, parallelism=2)
    assert [(t.status, t.value) for t in search.trials] == [("ok", {"score": 3.0, "nodes": 2}),
                                                            ("ok", {"score": 6.0, "nodes": 2})]
    assert search.best_params == {"k": 1}
