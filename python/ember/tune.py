"""Hyperparameter search on Ember: grid and random search, trials spread over the executors,
early stopping (asynchronous successive halving) fed by ``ctx.report``, best model and the
best-N ensemble.

    from ember import tune

    def train(params, ctx):                    # one trial, in a node process of its own
        model = build(params["lr"], params["units"])
        model.fit(x, y, validation_data=(xv, yv), epochs=8,
                  callbacks=[ember.keras.ProgressCallback(ctx)])   # reports epoch + val_accuracy
        return model                           # or a dict of metrics

    search = tune.run(spark, train, {"lr": tune.loguniform(1e-4, 1e-1), "units": tune.grid([64, 128])},
                      metric="val_accuracy", mode="max", num_samples=4,
                      scheduler=tune.ASHA(time_attr="epoch", grace_period=1, reduction_factor=2))
    search.to_df(spark).show()                 # params, metric, status, seconds, ...
    best = search.best_model()                 # a keras.Model
    ensemble = search.best_ensemble(3)         # averages the 3 best models' predictions

Each trial is a run of :mod:`ember.parallel` (an Ember job of its own, ``nodes_per_trial``
nodes: a trial may be a multi-node synchronous training), so a trial that fails or is stopped
leaves the others running.  At most ``parallelism`` trials run at once; the next one starts
when one ends.

The scheduler sees every ``ctx.report`` of every trial as it reaches the driver (the
coordinator's progress events) and stops a trial by telling its nodes to stop (the same
mechanism ``Cluster.shutdown`` uses for ps nodes: SIGTERM, then SIGKILL after the grace
period).  A stopped trial keeps the last metric it reported.
"""
from __future__ import annotations

import itertools
import math
import queue
import random
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from ember.parallel import Run, RunResult, traceback_tail


# --------------------------------------------------------------------------- search space
class Domain:
    """A dimension of the search space."""

    def sample(self, rng: random.Random) -> Any:
        raise NotImplementedError


@dataclass(frozen=True)
class grid(Domain):
    """Every value is tried (the search runs the cartesian product of the grid dimensions)."""
    values: Sequence[Any]

    def __post_init__(self):
        if not list(self.values):
            raise ValueError("tune.grid needs at least one value")


@dataclass(frozen=True)
class choice(Domain):
    """One of `values`, uniformly at random."""
    values: Sequence[Any]

    def sample(self, rng: random.Random) -> Any:
        return rng.choice(list(self.values))


@dataclass(frozen=True)
class uniform(Domain):
    """A float uniformly in [low, high)."""
    low: float
    high: float

    def sample(self, rng: random.Random) -> float:
        return rng.uniform(self.low, self.high)


@dataclass(frozen=True)
class loguniform(Domain):
    """A float whose logarithm is uniform in [log(low), log(high)) (learning rates)."""
    low: float
    high: float

    def __post_init__(self):
        if not 0 < self.low < self.high:
            raise ValueError(f"tune.loguniform needs 0 < low < high, got {self.low}, {self.high}")

    def sample(self, rng: random.Random) -> float:
        return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))


@dataclass(frozen=True)
class randint(Domain):
    """An int uniformly in [low, high) (Python's range convention)."""
    low: int
    high: int

    def sample(self, rng: random.Random) -> int:
        return rng.randrange(self.low, self.high)


def trials_of(space: Dict[str, Any], num_samples: int = 1, seed: int = 0) -> List[Dict[str, Any]]:
    """The trials' parameters: the cartesian product of the `grid` dimensions, repeated
    `num_samples` times, each with fresh samples of the random dimensions; plain values are
    passed as they are.  Deterministic for a given `seed`."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    rng = random.Random(seed)
    grid_keys = [k for k, v in space.items() if isinstance(v, grid)]
    combos = list(itertools.product(*[list(space[k].values) for k in grid_keys])) or [()]
    out = []
    for _ in range(num_samples):
        for combo in combos:
            params = {}
            for k, v in space.items():
                if isinstance(v, grid):
                    params[k] = combo[grid_keys.index(k)]
                elif isinstance(v, Domain):
                    params[k] = v.sample(rng)
                else:
                    params[k] = v
            out.append(params)
    return out


# --------------------------------------------------------------------------- schedulers
class FIFO:
    """No early stopping: every trial runs to its end."""

    def setup(self, metric: str, mode: str) -> None:
        pass

    def on_report(self, trial: int, metrics: Dict[str, float]) -> Optional[str]:
        return None


class ASHA(FIFO):
    """Asynchronous successive halving (Li et al., "A System for Massively Parallel
    Hyperparameter Tuning", 2020), the rule Ray Tune's ASHAScheduler uses.

    Rungs lie at ``grace_period * reduction_factor**k`` units of `time_attr` (an increasing
    number the trials report, e.g. ``epoch``), below `max_t`.  When a trial first reports at
    or past a rung, its metric is compared with what the trials that reached that rung before
    it reported: outside the best ``1/reduction_factor`` of them it is stopped.  The first
    trial at a rung always goes on.  A trial that reports a non-finite metric or loss is
    stopped at once (it diverged).  Thread-safe.

    Args:
        time_attr: the reported key that measures progress.
        grace_period: the first rung; no trial is stopped before it.
        reduction_factor: keep the best 1/reduction_factor at each rung (> 1).
        max_t: no rung at or past this (None: no limit).
    """

    def __init__(self, time_attr: str = "epoch", grace_period: float = 1, reduction_factor: float = 3,
                 max_t: Optional[float] = None):
        if reduction_factor <= 1:
            raise ValueError(f"reduction_factor must be > 1, got {reduction_factor}")
        if grace_period <= 0:
            raise ValueError(f"grace_period must be > 0, got {grace_period}")
        self.time_attr = time_attr
        self.grace_period = grace_period
        self.reduction_factor = reduction_factor
        self.max_t = max_t
        self._metric = ""
        self._sign = 1.0
        self._rungs: Dict[float, Dict[int, float]] = {}  # rung -> {trial: reward}
        self._lock = threading.Lock()

    def setup(self, metric: str, mode: str) -> None:
        self._metric = metric
        self._sign = 1.0 if mode == "max" else -1.0

    def rungs(self, upto: float) -> List[float]:
        out, r = [], float(self.grace_period)
        while r <= upto and (self.max_t is None or r < self.max_t):
            out.append(r)
            r *= self.reduction_factor
        return out

    def on_report(self, trial: int, metrics: Dict[str, float]) -> Optional[str]:
        for key in (self._metric, "loss"):
            v = metrics.get(key)
            if v is not None and not math.isfinite(v):
                return f"ASHA: {key} is {v} at {self.time_attr} {metrics.get(self.time_attr)}"
        t, v = metrics.get(self.time_attr), metrics.get(self._metric)
        if t is None or v is None:
            return None
        reward = self._sign * v
        with self._lock:
            for rung in self.rungs(t):
                recorded = self._rungs.setdefault(rung, {})
                if trial in recorded:
                    continue
                cutoff = _percentile(list(recorded.values()), 1 - 1 / self.reduction_factor)
                recorded[trial] = reward
                if cutoff is not None and reward < cutoff:
                    return (f"ASHA: {self._metric}={v:.4g} at {self.time_attr} {rung:g} is outside the best "
                            f"1/{self.reduction_factor:g} of the {len(recorded) - 1} trials there before it "
                            f"(cutoff {self._sign * cutoff:.4g})")
        return None


def _percentile(values: List[float], q: float) -> Optional[float]:
    """The q-quantile of `values` (linear interpolation, numpy's default); None if empty."""
    if not values:
        return None
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo, hi = int(math.floor(pos)), int(math.ceil(pos))
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


# --------------------------------------------------------------------------- results
@dataclass
class Trial:
    """One trial of a search.

    Attributes:
        index: its number, in the order trials were generated.
        params: its hyperparameters.
        status: "ok", "stopped" (by the scheduler or the time budget), "failed" or "pending"
            (never started: the time budget ran out).
        metric: the final value of the search's metric: the trial's returned dict's, else its
            last report's (None if it never reported it).
        progress: the last reported value of the scheduler's time attribute (e.g. epochs done).
        seconds: wall time of the trial.
        error: why it failed or was stopped.
        value: what the trial function returned (a Keras model, a dict, ...).
        reports: its ``ctx.report`` values in order.
    """
    index: int
    params: Dict[str, Any]
    status: str = "pending"
    metric: Optional[float] = None
    progress: Optional[float] = None
    seconds: float = 0.0
    error: str = ""
    value: Any = None
    reports: List[Dict[str, Any]] = field(default_factory=list)


class Ensemble:
    """The average of several Keras models' predictions (Elephas's best_ensemble idea).

    Attributes:
        models: the member keras.Models, best first.
    """

    def __init__(self, models: List[Any]):
        if not models:
            raise ValueError("an Ensemble needs at least one model")
        self.models = list(models)

    def predict(self, x: Any, **kwargs: Any) -> Any:
        """The mean of the members' ``predict(x)``."""
        import numpy as np
        return np.mean([np.asarray(m.predict(x, verbose=0, **kwargs)) for m in self.models], axis=0)

    def to_keras_model(self) -> Any:
        """One keras.Model averaging the members' outputs (e.g. for
        ``ember.ml.KerasModel.from_keras`` and a Spark ``transform``)."""
        import keras
        first = self.models[0]
        inp = keras.Input(shape=first.inputs[0].shape[1:])
        outs = []
        for i, m in enumerate(self.models):
            clone = keras.models.clone_model(m)
            clone.set_weights(m.get_weights())
            clone.name = f"member_{i}"
            outs.append(clone(inp))
        out = keras.layers.Average()(outs) if len(outs) > 1 else outs[0]
        return keras.Model(inp, out, name="ensemble")


class SearchResult:
    """What :func:`run` returns: every trial, and the best ones.

    Attributes:
        trials: every Trial, in generation order.
        metric, mode: what "best" means.
        seconds: wall time of the search.
    """

    def __init__(self, trials: List[Trial], metric: str, mode: str, seconds: float):
        self.trials = trials
        self.metric = metric
        self.mode = mode
        self.seconds = seconds

    def ranked(self, statuses: Sequence[str] = ("ok",)) -> List[Trial]:
        """Trials of the given statuses with a finite metric, best first."""
        good = [t for t in self.trials if t.status in statuses and t.metric is not None and math.isfinite(t.metric)]
        return sorted(good, key=lambda t: t.metric, reverse=self.mode == "max")

    @property
    def best_trial(self) -> Trial:
        ranked = self.ranked()
        if not ranked:
            raise ValueError(f"no trial finished with a value for {self.metric!r}: "
                             + "; ".join(f"trial {t.index} {t.status} {t.error[:200]}" for t in self.trials))
        return ranked[0]

    @property
    def best_params(self) -> Dict[str, Any]:
        return dict(self.best_trial.params)

    def best_model(self) -> Any:
        """What the best finished trial returned (its Keras model when the trial function returns one)."""
        return self.best_trial.value

    def best_ensemble(self, n: int = 3) -> Ensemble:
        """The average of the `n` best finished trials' Keras models."""
        from ember.parallel import _is_keras_model
        models = [t.value for t in self.ranked() if _is_keras_model(t.value)][:n]
        if not models:
            raise ValueError("no finished trial returned a Keras model; return the model from the trial function")
        return Ensemble(models)

    @property
    def trials_per_hour(self) -> float:
        done = sum(1 for t in self.trials if t.status in ("ok", "stopped", "failed"))
        return done * 3600.0 / self.seconds if self.seconds > 0 else float("nan")

    def to_df(self, spark: Any) -> Any:
        """The trials as a Spark DataFrame: ``trial``, one column per parameter (double when
        every value is a number, else string), ``metric``, ``status``, ``progress``,
        ``seconds``, ``error``; best first."""
        from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

        keys = sorted({k for t in self.trials for k in t.params})
        numeric = {k: all(isinstance(t.params.get(k), (int, float)) and not isinstance(t.params.get(k), bool)
                          for t in self.trials if k in t.params) for k in keys}
        fields = [StructField("trial", LongType(), False)]
        fields += [StructField(k, DoubleType() if numeric[k] else StringType(), True) for k in keys]
        fields += [StructField("metric", DoubleType(), True), StructField("status", StringType(), False),
                   StructField("progress", DoubleType(), True), StructField("seconds", DoubleType(), False),
                   StructField("error", StringType(), False)]
        order = {t.index: i for i, t in enumerate(self.ranked(("ok", "stopped")))}
        rows = []
        for t in sorted(self.trials, key=lambda t: (order.get(t.index, len(order)), t.index)):
            values = [float(t.params[k]) if numeric[k] and k in t.params else
                      (None if k not in t.params else str(t.params[k])) for k in keys]
            rows.append(tuple([t.index] + values + [t.metric, t.status, t.progress, float(t.seconds), t.error]))
        return spark.createDataFrame(rows, StructType(fields))


# --------------------------------------------------------------------------- the search
def _trial_main(payload, ctx) -> Any:
    fn, params = payload
    return fn(dict(params), ctx)


def run(spark: Any, fn: Callable[[Dict[str, Any], Any], Any], space: Dict[str, Any], metric: str,
        mode: str = "max", num_samples: int = 1, scheduler: Optional[FIFO] = None,
        parallelism: Optional[int] = None, nodes_per_trial: int = 1, time_budget_s: Optional[float] = None,
        trial_timeout: Optional[float] = None, seed: int = 0, **cluster_options: Any) -> SearchResult:
    """Runs a hyperparameter search and returns every trial's outcome.

    Args:
        spark: a SparkSession or SparkContext.
        fn: the trial, ``fn(params, ctx) -> result`` in a node process of its own (pickled
            with cloudpickle).  It reports progress with ``ctx.report(epoch=..., <metric>=...)``
            (``ember.keras.ProgressCallback(ctx)`` does it each epoch) and returns a Keras model
            (for best_model/best_ensemble), a dict of metrics, or a number (the metric).
        space: {name: tune.grid | choice | uniform | loguniform | randint | plain value}.
        metric: the reported (or returned) key to optimise.
        mode: "max" or "min".
        num_samples: how many times the grid is repeated with new random samples.
        scheduler: tune.ASHA(...) for early stopping; default FIFO (none).
        parallelism: trials at once; default the task slots // nodes_per_trial.
        nodes_per_trial: nodes of each trial (> 1: a synchronous multi-node training; fn runs
            on each node, rank 0's result counts).
        time_budget_s: start no trial after this many seconds, and stop the running ones
            then (status "stopped"); None: no budget.
        trial_timeout: seconds a trial may run before it is aborted (status "failed").
        seed: seed of the random dimensions.
        **cluster_options: passed to each trial's ``Cluster.run``.

    Returns:
        a :class:`SearchResult`.
    """
    from ember._spark_job import spark_context, task_slots

    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    scheduler = scheduler if scheduler is not None else FIFO()
    scheduler.setup(metric, mode)
    sc = spark_context(spark)
    slots = task_slots(sc)
    if nodes_per_trial < 1 or nodes_per_trial > slots:
        raise ValueError(f"nodes_per_trial={nodes_per_trial} but the Spark application has {slots} task slots")
    width = int(parallelism) if parallelism else max(1, slots // nodes_per_trial)
    if width * nodes_per_trial > slots:
        raise ValueError(f"parallelism={width} trials of {nodes_per_trial} nodes need {width * nodes_per_trial} "
                         f"task slots; the Spark application has {slots}")
    trials = [Trial(i, p) for i, p in enumerate(trials_of(space, num_samples, seed))]
    started = time.monotonic()
    budget_end = None if time_budget_s is None else started + time_budget_s
    todo: "queue.Queue[Trial]" = queue.Queue()
    for t in trials:
        todo.put(t)
    running: Dict[int, Run] = {}
    lock = threading.Lock()

    def on_report(run: Run, label: str, metrics: Dict[str, float]) -> None:
        reason = scheduler.on_report(run.index, metrics)
        if reason is not None:
            run.stop(reason)

    def finish(trial: Trial, result: RunResult) -> None:
        trial.status, trial.seconds, trial.reports = result.status, result.seconds, result.reports
        trial.error = result.error
        value = result.value
        trial.value = value
        mine = [r for r in result.reports if metric in r]
        if isinstance(value, dict) and isinstance(value.get(metric), (int, float)):
            trial.metric = float(value[metric])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            trial.metric = float(value)
        elif mine:
            trial.metric = float(mine[-1][metric])
        attr = getattr(scheduler, "time_attr", "epoch")
        steps = [r[attr] for r in result.reports if attr in r]
        trial.progress = float(max(steps)) if steps else None

    def worker() -> None:
        while True:
            if budget_end is not None and time.monotonic() >= budget_end:
                return
            try:
                trial = todo.get_nowait()
            except queue.Empty:
                return
            run_ = Run(spark, _trial_main, (fn, trial.params), trial.index, len(trials), num_nodes=nodes_per_trial,
                       name=f"trial {trial.index}", on_report=on_report, cluster_options=cluster_options)
            with lock:
                running[trial.index] = run_
                if budget_end is not None and time.monotonic() >= budget_end:
                    run_.stop(f"the search's time budget of {time_budget_s:g}s ran out")
            trial.status = "running"
            try:
                run_.start()
                left = None if budget_end is None else max(0.0, budget_end - time.monotonic())
                timeout = trial_timeout if left is None else (left + 60.0 if trial_timeout is None
                                                             else min(trial_timeout, left + 60.0))
                result = run_.wait(timeout)
            except BaseException:  # noqa: BLE001 - the trial failed to start: record, go on
                result = RunResult(trial.index, "failed", None,
                                   f"trial {trial.index} failed to start: {traceback_tail(traceback.format_exc())}",
                                   time.monotonic() - run_._started, list(run_.reports))
            finally:
                with lock:
                    running.pop(trial.index, None)
            finish(trial, result)

    threads = [threading.Thread(target=worker, daemon=True, name=f"ember-tune-{i}") for i in range(width)]
    for t in threads:
        t.start()
    timer = None
    if budget_end is not None:
        def stop_running() -> None:  # the budget's end: workers start nothing new after it
            with lock:
                for r in running.values():
                    r.stop(f"the search's time budget of {time_budget_s:g}s ran out")

        timer = threading.Timer(max(0.0, budget_end - time.monotonic()), stop_running)
        timer.daemon = True
        timer.start()
    for t in threads:
        t.join()  # each trial's waits have deadlines (reservation_timeout, trial_timeout, budget)
    if timer is not None:
        timer.cancel()
    return SearchResult(trials, metric, mode, time.monotonic() - started)
