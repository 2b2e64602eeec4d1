#!/usr/bin/env python
"""Hyperparameter search at a fixed time budget: trials/hour and best accuracy, Ember vs
hyperopt's SparkTrials, on the same space, trial and Spark application.

The trial: a dense Fashion-MNIST classifier (784 -> units relu -> 10) trained with Adam for
--epochs epochs on the first --train-rows training images, scored by its accuracy on 2,000
test images (the Debian package dataset-fashion-mnist).  Space: learning rate
loguniform(1e-4, 3e-1), units choice(32, 64, 128), batch size choice(32, 64, 128).

  ember        ember.tune.run: TPE (Optuna's TPESampler through ask/tell, 10 random start-up
               trials; --sampler random for random search), ASHA (grace 1 epoch, reduction
               factor 3) fed by each epoch's val_accuracy through ctx.report, ``parallelism``
               trials at once in warm runners (one long-lived node process per slot takes trial
               after trial); time_budget_s stops the search.
  sparktrials  hyperopt 0.3.0: fmin(tpe.suggest, SparkTrials(parallelism, timeout)); each trial
               is a Spark task running the objective (no early stopping in hyperopt).  It is
               installed by this script into bench/.hyperopt-site (pip --target, --no-deps, with
               the dependencies the main venv lacks), as bench/_common.py does for TFoS.

trials/hour counts the trials that ended (finished, stopped early or failed) within the budget.
The last two lines are:
  best_val_accuracy: ember=<v> sparktrials=<v>
  tune_trials_per_hour: ember=<v> sparktrials=<v> ratio=<v>

  .venv/bin/python bench/tune.py                       # 300 s budget each, local[2]
  .venv/bin/python bench/tune.py --budget 60           # quick
"""
from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (sets PYTHONPATH/PYSPARK_PYTHON before Spark starts)

HYPEROPT_VERSION = "0.3.0"
HYPEROPT_SITE = C.BENCH_DIR / ".hyperopt-site"
# What hyperopt needs beyond the main venv (numpy and six are there): installed --no-deps so
# that nothing shadows the venv's own packages on the executors' PYTHONPATH.
HYPEROPT_DEPS = ["networkx", "future", "tqdm", "cloudpickle", "scipy"]
EXAMPLES = C.REPO / "examples" / "fashion_mnist"


def ensure_hyperopt() -> str:
    if not (HYPEROPT_SITE / "hyperopt" / "spark.py").exists():
        C.log(f"installing hyperopt=={HYPEROPT_VERSION} and {', '.join(HYPEROPT_DEPS)} into {HYPEROPT_SITE} "
              f"(pip --target, no deps)")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--target", str(HYPEROPT_SITE), f"hyperopt=={HYPEROPT_VERSION}", *HYPEROPT_DEPS], check=True)
    if str(HYPEROPT_SITE) not in sys.path:
        sys.path.insert(0, str(HYPEROPT_SITE))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(HYPEROPT_SITE) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(HYPEROPT_SITE)] + paths)
    import hyperopt
    return f"hyperopt {hyperopt.__version__} from {HYPEROPT_SITE}"


def train_and_score(params: dict, epochs: int, train_rows: int, report=None) -> float:
    """Trains the trial's model; returns its test accuracy.  `report(epoch, acc)` after each epoch."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    import data
    import keras
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    x, y = data.load_split("train")
    xv, yv = data.load_split("test")
    x, y = x[:train_rows].reshape(-1, 784) / 255.0, y[:train_rows]
    xv, yv = xv[:2000].reshape(-1, 784) / 255.0, yv[:2000]
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(int(params["units"]), activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(float(params["lr"])), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    acc = 0.0
    for epoch in range(epochs):
        model.fit(x, y, batch_size=int(params["batch"]), epochs=1, verbose=0)
        acc = float(model.evaluate(xv, yv, verbose=0, batch_size=1000)[1])
        if report is not None:
            report(epoch + 1, acc)
    return acc


def ember_trial(params, ctx):
    def report(epoch, acc):
        ctx.report(epoch=epoch, val_accuracy=acc)
    return {"val_accuracy": train_and_score(params, params["epochs"], params["train_rows"], report)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=300.0, help="seconds per contender")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--train-rows", type=int, default=12000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sampler", choices=["tpe", "random"], default="tpe", help="Ember's sampler")
    p.add_argument("--reduction-factor", type=float, default=4.0, help="Ember's ASHA reduction factor")
    a = p.parse_args(argv)

    C.log(C.machine_info())
    note = ensure_hyperopt()  # before Spark starts: the executors' PYTHONPATH
    C.log(note)
    from hyperopt import STATUS_OK, SparkTrials, fmin, hp, tpe
    from pyspark.sql import SparkSession

    from ember import tune

    spark = (SparkSession.builder.master(a.master).appName("ember-bench-tune")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    C.log(C.versions())

    # --- Ember
    space = {"lr": tune.loguniform(1e-4, 3e-1), "units": tune.choice([32, 64, 128]),
             "batch": tune.choice([32, 64, 128]), "epochs": a.epochs, "train_rows": a.train_rows}
    t0 = time.monotonic()
    search = tune.run(spark, ember_trial, space, metric="val_accuracy", mode="max", num_samples=10_000,
                      scheduler=tune.ASHA(time_attr="epoch", grace_period=1, reduction_factor=a.reduction_factor,
                                          max_t=a.epochs),
                      parallelism=a.parallelism, time_budget_s=a.budget, seed=a.seed, sampler=a.sampler)
    ember_secs = time.monotonic() - t0
    ended = [t for t in search.trials if t.status in ("ok", "stopped", "failed")]
    ranked = search.ranked(("ok", "stopped"))
    ember_best = ranked[0].metric if ranked else float("nan")
    counts = {s: sum(1 for t in ended if t.status == s) for s in ("ok", "stopped", "failed")}
    ember_tph = len(ended) * 3600.0 / a.budget
    C.log(f"ember ({a.sampler}, ASHA factor {a.reduction_factor:g}): {len(ended)} trials ended in "
          f"{ember_secs:.0f}s (budget {a.budget:g}s; {counts}); best val_accuracy {ember_best:.4f} with "
          f"{ranked[0].params if ranked else None}")

    # --- hyperopt SparkTrials
    hp_space = {"lr": hp.loguniform("lr", math.log(1e-4), math.log(3e-1)), "units": hp.choice("units", [32, 64, 128]),
                "batch": hp.choice("batch", [32, 64, 128])}
    epochs, rows = a.epochs, a.train_rows

    def objective(params):
        return {"loss": -train_and_score(params, epochs, rows), "status": STATUS_OK}

    trials = SparkTrials(parallelism=a.parallelism, timeout=int(a.budget), spark_session=spark)
    t0 = time.monotonic()
    try:
        fmin(objective, hp_space, algo=tpe.suggest, max_evals=10_000, trials=trials,
             rstate=__import__("numpy").random.default_rng(a.seed), show_progressbar=False)
    except Exception as e:  # noqa: BLE001 - fmin raises when no trial finished in the budget
        C.log(f"sparktrials: fmin ended with {type(e).__name__}: {str(e)[:300]}")
    hp_secs = time.monotonic() - t0
    done = [t for t in trials.trials if t["result"].get("status") == STATUS_OK]
    hp_best = max((-t["result"]["loss"] for t in done), default=float("nan"))
    hp_ended = trials.count_successful_trials() + trials.count_failed_trials()
    hp_tph = hp_ended * 3600.0 / a.budget
    C.log(f"sparktrials: {hp_ended} trials ended in {hp_secs:.0f}s (budget {a.budget:g}s); best val_accuracy "
          f"{hp_best:.4f}")
    spark.stop()
    print(f"best_val_accuracy: ember={ember_best:.4f} sparktrials={hp_best:.4f}")
    print(f"tune_trials_per_hour: ember={ember_tph:.0f} sparktrials={hp_tph:.0f} "
          f"ratio={ember_tph / hp_tph if hp_tph else float('nan'):.2f}")


if __name__ == "__main__":
    main()
