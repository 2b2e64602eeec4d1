"""Hyperparameter search on Ember: grid, random and TPE search, trials spread over the executors,
early stopping (asynchronous successive halving) fed by ``ctx.report``, best model and the
best-N ensemble.

    from ember import tune

    def train(params, ctx):                    # one trial, in a warm node process
        model = build(params["lr"], params["units"])
        model.fit(x, y, validation_data=(xv, yv), epochs=8,
                  callbacks=[ember.keras.ProgressCallback(ctx)])   # reports epoch + val_accuracy
        return model                           # or a dict of metrics

    search = tune.run(spark, train, {"lr": tune.loguniform(1e-4, 1e-1), "units": tune.grid([64, 128])},
                      metric="val_accuracy", mode="max", num_samples=4, sampler="tpe",
                      scheduler=tune.ASHA(time_attr="epoch", grace_period=1, reduction_factor=2))
    search.to_df(spark).show()                 # params, metric, status, seconds, ...
    best = search.best_model()                 # a keras.Model
    ensemble = search.best_ensemble(3)         # averages the 3 best models' predictions

Trials run in warm runners (:mod:`ember._tune_runner`): one long-lived node process per slot,
an Ember job of its own, takes trial after trial from the driver, so a trial costs its own work
only.  A trial that raises is recorded as failed and its runner goes on; a runner whose process
dies fails its trial (named, with the node's error) and is replaced.  A multi-node trial
(``nodes_per_trial`` > 1: a synchronous multi-node training), or any trial with
``warm_runners=False``, is a run of :mod:`ember.parallel` instead, an Ember job of its own.  At
most ``parallelism`` trials run at once; the next one starts when one ends.

The sampler picks each trial's parameters: random/grid search, or ``sampler="tpe"`` (Optuna's
tree-structured Parzen estimator through ask/tell), which sees every reported value of the
metric, so trials stopped early still inform it.

The scheduler sees every ``ctx.report`` of every trial as it reaches the driver (the
coordinator's progress events).  In a warm runner ``ctx.report`` waits for the driver's verdict,
and a stop raises ``TrialStopped`` in the trial at that report; a trial of its own is stopped by
telling its nodes to stop (SIGTERM, then SIGKILL after the grace period).  A stopped trial keeps
the last metric it reported.
"""
from __future__ import annotations

import itertools
import math
import random
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from ember._tune_runner import TrialStopped  # noqa: F401 - public: what a stopped trial's ctx.report raises
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


# --------------------------------------------------------------------------- samplers
class Sampler:
    """How a search picks each trial's parameters, through ask and tell.

    The search calls, under one lock: ``setup`` once; ``ask(i)`` for trial i's parameters
    when a slot is free (i = 0, 1, ... up to what setup returned); ``report(i, step, value)``
    for each value of the metric that trial i reports (step 0, 1, ...); ``tell(i, status,
    value)`` when it ended ("ok", "stopped" by the scheduler or the time budget, or
    "failed"), with its final metric or None.
    """

    def setup(self, space: Dict[str, Any], num_samples: int, metric: str, mode: str, seed: int) -> int:
        """Prepares a search; returns how many trials it has."""
        raise NotImplementedError

    def ask(self, index: int) -> Dict[str, Any]:
        raise NotImplementedError

    def report(self, index: int, step: int, value: float) -> None:
        pass

    def tell(self, index: int, status: str, value: Optional[float]) -> None:
        pass

    def unasked(self, start: int) -> List[Dict[str, Any]]:
        """The parameters of trials from `start` on that were never asked for, when they are
        known in advance (listed as "pending" in the result); else []."""
        return []


class RandomSearch(Sampler):
    """Grid and random search: the trials of :func:`trials_of` in order (the grid's cartesian
    product, repeated `num_samples` times with fresh samples of the random dimensions)."""

    def __init__(self) -> None:
        self._params: List[Dict[str, Any]] = []

    def setup(self, space: Dict[str, Any], num_samples: int, metric: str, mode: str, seed: int) -> int:
        self._params = trials_of(space, num_samples, seed)
        return len(self._params)

    def ask(self, index: int) -> Dict[str, Any]:
        return self._params[index]

    def unasked(self, start: int) -> List[Dict[str, Any]]:
        return self._params[start:]


class TPE(Sampler):
    """A model-based search: the tree-structured Parzen estimator (Bergstra et al., "Algorithms
    for Hyper-Parameter Optimization", NeurIPS 2011; hyperopt's ``tpe.suggest``) of Optuna's
    ``TPESampler``, driven through Optuna's ask/tell interface.

    The first `n_startup_trials` trials are random; after them each trial's parameters are
    drawn where the best trials so far lie.  Trials stopped early by the scheduler count with
    the last value they reported (Optuna's pruned trials, ranked by how far they got), running
    trials as bad ones (Optuna's "constant liar": parallel trials do not all pick the same
    point).  Grid dimensions are enumerated as in random search (each trial's grid values are
    fixed, the rest are drawn); choice dimensions are categorical.  Needs the ``optuna``
    package on the driver only.  Optuna's own INFO log is turned down to WARNING.

    Args:
        n_startup_trials: random trials before the model is used.
        seed: the sampler's seed (default: the search's `seed`).
        **options: more ``optuna.samplers.TPESampler`` arguments (e.g. ``n_ei_candidates``).
    """

    def __init__(self, n_startup_trials: int = 10, seed: Optional[int] = None, **options: Any):
        self.n_startup_trials = n_startup_trials
        self.seed = seed
        self.options = options
        self._study: Any = None
        self._trials: Dict[int, Any] = {}

    def setup(self, space: Dict[str, Any], num_samples: int, metric: str, mode: str, seed: int) -> int:
        try:
            import optuna
        except ImportError:
            raise ImportError("tune.TPE needs the optuna package on the driver: pip install optuna") from None
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        self._space = dict(space)
        self._grid_keys = [k for k, v in space.items() if isinstance(v, grid)]
        self._combos = list(itertools.product(*[range(len(list(space[k].values))) for k in self._grid_keys])) or [()]
        self._dists: Dict[str, Any] = {}
        for k, v in space.items():
            if isinstance(v, (grid, choice)):
                self._dists[k] = CategoricalDistribution(list(range(len(list(v.values)))))
            elif isinstance(v, loguniform):
                self._dists[k] = FloatDistribution(v.low, v.high, log=True)
            elif isinstance(v, uniform):
                self._dists[k] = FloatDistribution(v.low, v.high)
            elif isinstance(v, randint):
                if v.high <= v.low:
                    raise ValueError(f"tune.randint for {k!r} needs low < high, got {v.low}, {v.high}")
                self._dists[k] = IntDistribution(v.low, v.high - 1)
            elif isinstance(v, Domain):
                raise ValueError(f"tune.TPE samples grid, choice, uniform, loguniform and randint; parameter "
                                 f"{k!r} is a {type(v).__name__}")
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(n_startup_trials=self.n_startup_trials,
                                             seed=seed if self.seed is None else self.seed, **self.options)
        self._study = optuna.create_study(direction="maximize" if mode == "max" else "minimize", sampler=sampler)
        self._trials = {}
        return num_samples * len(self._combos)

    def ask(self, index: int) -> Dict[str, Any]:
        combo = self._combos[index % len(self._combos)]
        if self._grid_keys:
            self._study.enqueue_trial(dict(zip(self._grid_keys, combo)), skip_if_exists=False)
        trial = self._study.ask(self._dists)
        self._trials[index] = trial
        params = {}
        for k, v in self._space.items():
            if k not in self._dists:
                params[k] = v
            elif isinstance(v, (grid, choice)):
                params[k] = list(v.values)[trial.params[k]]
            else:
                params[k] = trial.params[k]
        return params

    def report(self, index: int, step: int, value: float) -> None:
        if math.isfinite(value):
            self._trials[index].report(float(value), step)

    def tell(self, index: int, status: str, value: Optional[float]) -> None:
        from optuna.trial import TrialState
        trial = self._trials.pop(index, None)
        if trial is None:
            return
        if status == "ok" and value is not None and math.isfinite(value):
            self._study.tell(trial, float(value))
        elif status == "stopped":
            self._study.tell(trial, state=TrialState.PRUNED)  # its last reported value counts
        else:
            self._study.tell(trial, state=TrialState.FAIL)


def _space_kinds(space: Dict[str, Any]) -> Dict[str, Any]:
    """The space as a warm runner needs it (see ember._tune_runner.SpaceKinds)."""
    return {k: ("categorical", list(v.values)) if isinstance(v, (grid, choice)) else
            ("sampled", None) if isinstance(v, Domain) else ("plain", v) for k, v in space.items()}


def _sampler(sampler: Any) -> Sampler:
    if isinstance(sampler, Sampler):
        return sampler
    if sampler in ("random", "grid"):
        return RandomSearch()
    if sampler == "tpe":
        return TPE()
    raise ValueError(f"sampler must be 'random', 'grid', 'tpe' or a tune.Sampler, got {sampler!r}")


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
            (never started: the time budget ran out before it was drawn; a trial drawn before
            it, whose start the budget's end overtook, is "stopped").
        metric: the final value of the search's metric: the trial's returned dict's, else its
            last report's (None if it never reported it).
        progress: the last reported value of the scheduler's time attribute (e.g. epochs done).
        seconds: wall time of the trial.
        error: why it failed or was stopped.
        value: what the trial function returned (a Keras model, a dict, ...).
        reports: its ``ctx.report`` values in order.
        job_id: the Ember job it ran in (its warm runner's, or its own; "" if it never ran):
            EMBER_JOB_ID of the processes that ran it.
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
    job_id: str = ""


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
        trial_timeout: Optional[float] = None, seed: int = 0, sampler: Any = "random",
        warm_runners: bool = True, report_timeout: float = 60.0, idle_timeout: float = 3600.0,
        **cluster_options: Any) -> SearchResult:
    """Runs a hyperparameter search and returns every trial's outcome.

    Args:
        spark: a SparkSession or SparkContext.
        fn: the trial, ``fn(params, ctx) -> result`` in a node process (pickled with
            cloudpickle).  It reports progress with ``ctx.report(epoch=..., <metric>=...)``
            (``ember.keras.ProgressCallback(ctx)`` does it each epoch) and returns a Keras model
            (for best_model/best_ensemble), a dict of metrics, or a number (the metric).
        space: {name: tune.grid | choice | uniform | loguniform | randint | plain value}.
        metric: the reported (or returned) key to optimise.
        mode: "max" or "min".
        num_samples: how many times the grid is repeated with new samples.
        scheduler: tune.ASHA(...) for early stopping; default FIFO (none).
        parallelism: trials at once; default the task slots // nodes_per_trial.
        nodes_per_trial: nodes of each trial (> 1: a synchronous multi-node training; fn runs
            on each node, rank 0's result counts).
        time_budget_s: start no trial after this many seconds, and stop the running ones
            then (status "stopped"); None: no budget.
        trial_timeout: seconds a trial may run before it is aborted (status "failed").
        seed: seed of the random dimensions (and of the sampler).
        sampler: "random" (or "grid": the same), "tpe" (:class:`TPE`, a model-based search
            through Optuna), or a :class:`Sampler`.
        warm_runners: single-node trials run in warm runners: one long-lived node process per
            slot runs trial after trial, so a trial costs its own work only (no job start, no
            framework import).  Module-level state a trial leaves is seen by the next trial
            of its runner (Keras's session is cleared between trials); params go to runners as
            JSON.  A trial that raises is "failed" and its runner goes on; a runner whose
            process dies fails its trial and is replaced.  False: each trial is an Ember job
            of its own (as multi-node trials always are).
        report_timeout: seconds a warm runner's ``ctx.report`` waits for the driver's verdict
            (go on, or stop).
        idle_timeout: seconds a warm runner waits for its next trial before it gives up.
        **cluster_options: passed to each trial's (or runner's) ``Cluster.run``.

    Returns:
        a :class:`SearchResult`.
    """
    from ember._driver.spark_side import spark_side

    if mode not in ("max", "min"):
        raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
    scheduler = scheduler if scheduler is not None else FIFO()
    scheduler.setup(metric, mode)
    search = _sampler(sampler)
    slots = spark_side(spark).task_slots()
    if nodes_per_trial < 1 or nodes_per_trial > slots:
        raise ValueError(f"nodes_per_trial={nodes_per_trial} but the Spark application has {slots} task slots")
    width = int(parallelism) if parallelism else max(1, slots // nodes_per_trial)
    if width * nodes_per_trial > slots:
        raise ValueError(f"parallelism={width} trials of {nodes_per_trial} nodes need {width * nodes_per_trial} "
                         f"task slots; the Spark application has {slots}")
    total = search.setup(space, num_samples, metric, mode, seed)
    search_ = _Search(spark, fn, space, metric, scheduler, search, total, time_budget_s, trial_timeout,
                      cluster_options)
    warm = warm_runners and nodes_per_trial == 1
    if warm:
        worker = lambda slot: search_.warm_worker(slot, width, report_timeout, idle_timeout)  # noqa: E731
    else:
        worker = lambda slot: search_.cold_worker(nodes_per_trial)  # noqa: E731
    threads = [threading.Thread(target=worker, args=(i,), daemon=True, name=f"ember-tune-{i}")
               for i in range(width)]
    for t in threads:
        t.start()
    timer = None
    if search_.budget_end is not None:
        timer = threading.Timer(max(0.0, search_.budget_end - time.monotonic()), search_.stop_running)
        timer.daemon = True
        timer.start()
    for t in threads:
        t.join()  # each trial's waits have deadlines (reservation_timeout, trial_timeout, budget)
    if timer is not None:
        timer.cancel()
    return search_.result(mode)


class _Search:
    """The state of one :func:`run`: the trials, the sampler, what runs; its workers' loops."""

    def __init__(self, spark: Any, fn: Callable, space: Dict[str, Any], metric: str, scheduler: FIFO,
                 sampler: Sampler, total: int, time_budget_s: Optional[float], trial_timeout: Optional[float],
                 cluster_options: Dict[str, Any]):
        self.spark, self.fn, self.space, self.metric = spark, fn, space, metric
        self.scheduler, self.sampler, self.total = scheduler, sampler, total
        self.time_budget_s, self.trial_timeout = time_budget_s, trial_timeout
        self.cluster_options = cluster_options
        self.started = time.monotonic()
        self.budget_end = None if time_budget_s is None else self.started + time_budget_s
        self.trials: List[Trial] = []
        self.lock = threading.Lock()           # trials, running, the sampler
        self.running: Dict[int, Any] = {}      # slot or trial -> Run / Runner, for the budget's end
        self.budget_over = False
        self._steps: Dict[int, int] = {}       # trial -> how many values of the metric it reported

    # -- trials
    def next_trial(self) -> Optional[Trial]:
        with self.lock:
            if self.budget_over or len(self.trials) >= self.total or \
                    (self.budget_end is not None and time.monotonic() >= self.budget_end):
                return None
            index = len(self.trials)
            trial = Trial(index, self.sampler.ask(index), status="running")
            self.trials.append(trial)
            return trial

    def on_report(self, index: int, metrics: Dict[str, float]) -> Optional[str]:
        """A trial's report: the sampler sees its metric; the scheduler says stop (why) or None."""
        value = metrics.get(self.metric)
        if value is not None:
            with self.lock:
                step = self._steps.get(index, 0)
                self._steps[index] = step + 1
                self.sampler.report(index, step, float(value))
        return self.scheduler.on_report(index, metrics)

    def finish(self, trial: Trial, status: str, value: Any, error: str, seconds: float,
               reports: List[Dict[str, Any]], job_id: str) -> None:
        trial.status, trial.value, trial.error, trial.seconds = status, value, error, seconds
        trial.reports, trial.job_id = reports, job_id
        mine = [r for r in reports if self.metric in r]
        if isinstance(value, dict) and isinstance(value.get(self.metric), (int, float)):
            trial.metric = float(value[self.metric])
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            trial.metric = float(value)
        elif mine:
            trial.metric = float(mine[-1][self.metric])
        attr = getattr(self.scheduler, "time_attr", "epoch")
        steps = [r[attr] for r in reports if attr in r]
        trial.progress = float(max(steps)) if steps else None
        with self.lock:
            self.sampler.tell(trial.index, status, trial.metric)

    def timeout(self) -> Optional[float]:
        """How long the next trial may run: trial_timeout, and the budget's end plus a minute."""
        left = None if self.budget_end is None else max(0.0, self.budget_end - time.monotonic())
        if left is None:
            return self.trial_timeout
        return left + 60.0 if self.trial_timeout is None else min(self.trial_timeout, left + 60.0)

    def stop_running(self) -> None:
        """The budget's end: stop what runs; workers start nothing after it."""
        reason = f"the search's time budget of {self.time_budget_s:g}s ran out"
        with self.lock:
            self.budget_over = True
            for r in self.running.values():
                if isinstance(r, Run):
                    r.stop(reason)
                else:
                    r.interrupt(reason)

    def result(self, mode: str) -> SearchResult:
        trials = list(self.trials)
        trials += [Trial(len(trials) + i, p) for i, p in enumerate(self.sampler.unasked(len(trials)))]
        return SearchResult(trials, self.metric, mode, time.monotonic() - self.started)

    # -- workers
    def warm_worker(self, slot: int, width: int, report_timeout: float, idle_timeout: float) -> None:
        """One slot's loop: trial after trial in one warm runner (started at its first trial,
        replaced when its process died or a trial was ended from outside)."""
        from ember._tune_runner import Runner, encode_params

        kinds = _space_kinds(self.space)
        runner: Optional[Runner] = None
        try:
            while True:
                trial = self.next_trial()
                if trial is None:
                    return
                try:
                    params = encode_params(kinds, trial.params)
                except TypeError as e:
                    self.finish(trial, "failed", None, f"trial {trial.index}: {e}", 0.0, [], "")
                    continue
                if runner is None:
                    runner = Runner(self.spark, self.fn, kinds, slot, width, self.on_report, report_timeout,
                                    idle_timeout, self.cluster_options)
                    t0 = time.monotonic()
                    try:
                        runner.start()
                    except BaseException:  # noqa: BLE001 - the trial failed to start: record, go on
                        self.finish(trial, "failed", None, f"trial {trial.index} failed to start: its runner did not "
                                    f"start: {traceback_tail(traceback.format_exc())}", time.monotonic() - t0, [],
                                    runner.job_id)
                        runner = None
                        continue
                    with self.lock:
                        self.running[slot] = runner
                        if self.budget_over:
                            runner.interrupt(f"the search's time budget of {self.time_budget_s:g}s ran out")
                out = runner.run_trial(trial.index, params, self.timeout())
                self.finish(trial, out.status, out.value, out.error, out.seconds, out.reports, runner.job_id)
                if runner.broken:
                    with self.lock:
                        self.running.pop(slot, None)
                    runner.close()
                    runner = None
        finally:
            if runner is not None:
                with self.lock:
                    self.running.pop(slot, None)
                runner.close()

    def cold_worker(self, nodes_per_trial: int) -> None:
        """One slot's loop: each trial an Ember job of its own."""
        while True:
            trial = self.next_trial()
            if trial is None:
                return

            def on_report(run: Run, label: str, metrics: Dict[str, float]) -> None:
                reason = self.on_report(run.index, metrics)
                if reason is not None:
                    run.stop(reason)

            run_ = Run(self.spark, _trial_main, (self.fn, trial.params), trial.index, self.total,
                       num_nodes=nodes_per_trial, name=f"trial {trial.index}", on_report=on_report,
                       cluster_options=self.cluster_options)
            with self.lock:
                self.running[-1 - trial.index] = run_
                if self.budget_over:
                    run_.stop(f"the search's time budget of {self.time_budget_s:g}s ran out")
            try:
                run_.start()
                result = run_.wait(self.timeout())
            except BaseException:  # noqa: BLE001 - the trial failed to start: record, go on
                result = RunResult(trial.index, "failed", None,
                                   f"trial {trial.index} failed to start: {traceback_tail(traceback.format_exc())}",
                                   time.monotonic() - run_._started, list(run_.reports))
            finally:
                with self.lock:
                    self.running.pop(-1 - trial.index, None)
            job_id = run_.cluster.job_id if run_.cluster is not None else ""
            self.finish(trial, result.status, result.value, result.error, result.seconds, result.reports, job_id)
