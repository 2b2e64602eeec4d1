"""Warm trial runners of :mod:`ember.tune`: long-lived node processes that run trial after trial.

A runner is a one-node run of :mod:`ember.parallel` (an Ember job of its own: its coordinator,
its barrier task, its node process) whose ``fn`` is :func:`_runner_main`, a loop that takes
tasks from the driver.  The trial function and the search space reach it once, in the run's
payload (cloudpickled user code, as for any node); each trial then costs only its own work:
no Spark stage, no process start, no framework import.  A search starts one runner per slot
and replaces a runner whose process died.

Driver and runner talk through the runner job's coordinator key/value store, authenticated
with the job's secret (the driver writes through a CoordinatorClient of its own).  Values are
JSON, except a trial's return value, which is :func:`ember.parallel.encode_result`'s typed
bytes; nothing is unpickled.

  ember/tune/task/<n>          driver -> runner: task n: {"trial": i, "params": {...}} (choice and
                               grid values as their index in the space; plain values omitted:
                               the runner has the space) or {"quit": true}
  ember/tune/verdict/<n>/<k>   driver -> runner: the answer to the k-th ``ctx.report`` of task n:
                               {"stop": null or why}
  ember/tune/value             runner -> driver: task n's return value, written before its outcome
                               (one key, overwritten: the coordinator keeps no old models)
  ember/tune/outcome/<n>       runner -> driver: {"status": "ok"|"failed"|"stopped", "error": ...,
                               "pid": ...}.  The driver writes it itself ("forced": true) to end
                               its own wait when it ends a trial from outside (the time budget);
                               the runner is then ended and replaced.

A trial's ``ctx.report(...)`` sends the progress (with ``tune_trial`` = i and ``tune_report`` = k)
and waits for the driver's verdict on it, so an early-stopping decision takes effect at the
report that caused it: a stop raises :class:`TrialStopped` in the trial, which unwinds it, and
the runner takes the next task.  Every wait has a deadline: the runner's for its next task
(`idle_timeout`) and for a verdict (`report_timeout`), the driver's for an outcome (the trial's
timeout); a runner whose process dies wakes the driver's wait at once (the job's abort).
"""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ember import _ember
from ember._names import TUNE_OUTCOME_KEY, TUNE_TASK_KEY, TUNE_VALUE_KEY, TUNE_VERDICT_KEY
from ember.errors import Aborted, DeadlineExceeded, EmberError
from ember.parallel import Run, decode_result, encode_result, traceback_tail

TRIAL_METRIC, REPORT_METRIC = "tune_trial", "tune_report"  # added to a trial's reports
_MAX_VALUE_BYTES = 15 << 20  # the coordinator's messages hold 16 MiB


class TrialStopped(BaseException):
    """Raised by a warm runner's ``ctx.report`` when the driver stops the trial (early stopping).

    A BaseException, like ``KeyboardInterrupt``: a trial's ``except Exception`` does not swallow
    it.  The runner catches it and reports the trial "stopped" with its reason.
    """


# --------------------------------------------------------------------------- parameters
# The search space as a runner needs it (made by ember.tune, which owns the Domain classes):
# {name: ("categorical", [values]) | ("sampled", None) | ("plain", value)}.
SpaceKinds = Dict[str, Tuple[str, Any]]


def encode_params(kinds: SpaceKinds, params: Dict[str, Any]) -> Dict[str, Any]:
    """A trial's params as JSON for its runner: categorical (grid/choice) values by their index
    in the space, sampled values as they are, plain values left out (the runner has them).

    Raises:
        TypeError: a sampled value does not survive JSON (a custom Domain's), naming the parameter.
    """
    out: Dict[str, Any] = {}
    for key, (kind, values) in kinds.items():
        value = params[key]
        if kind == "categorical":
            index = next((i for i, v in enumerate(values) if v is value), None)
            out[key] = {"index": index if index is not None else values.index(value)}
        elif kind == "sampled":
            try:
                same = json.loads(json.dumps(value)) == value
            except (TypeError, ValueError):
                same = False
            if not same:
                raise TypeError(f"parameter {key!r} = {value!r:.100} ({type(value).__name__}) cannot go to a warm "
                                f"runner as JSON; make its Domain return numbers or strings, or pass "
                                f"warm_runners=False")
            out[key] = {"value": value}
    return out


def decode_params(kinds: SpaceKinds, encoded: Dict[str, Any]) -> Dict[str, Any]:
    """The params :func:`encode_params` encoded."""
    params = {}
    for key, (kind, values) in kinds.items():
        if kind == "plain":
            params[key] = values
        elif kind == "categorical":
            params[key] = values[encoded[key]["index"]]
        else:
            params[key] = encoded[key]["value"]
    return params


# --------------------------------------------------------------------------- the node side
class TrialContext:
    """The ctx a trial gets in a warm runner: the node's context (every attribute and method),
    with a ``report`` that waits for the driver's verdict on each report.

    Attributes:
        trial_index: the trial's index in the search.
    """

    def __init__(self, ctx: Any, client: Any, trial_index: int, task: int, report_timeout: float):
        self._ctx = ctx
        self._client = client
        self.trial_index = trial_index
        self._task = task
        self._reports = 0
        self._report_timeout = report_timeout

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def report(self, step: Optional[float] = None, loss: Optional[float] = None, **metrics: float) -> None:
        """Sends progress to the driver (as ``Context.report``) and waits for its verdict.

        Raises:
            TrialStopped: the driver stopped the trial (the search's scheduler or time budget).
            DeadlineExceeded: no verdict within report_timeout seconds.
        """
        k = self._reports
        self._reports += 1
        self._ctx.report(step=step, loss=loss, **metrics, **{TRIAL_METRIC: self.trial_index, REPORT_METRIC: k})
        key = TUNE_VERDICT_KEY.format(n=self._task, k=k)
        try:
            verdict = json.loads(self._client.kv_get(key, self._report_timeout))
        except DeadlineExceeded as e:
            raise DeadlineExceeded(f"trial {self.trial_index} waited {self._report_timeout:g}s (report_timeout) "
                                   f"for the driver's verdict on its report {k} ({key}): {e}") from None
        if verdict.get("stop"):
            raise TrialStopped(verdict["stop"])

    def __repr__(self) -> str:
        return f"TrialContext(trial {self.trial_index}, {self._ctx!r})"


def _forget_framework_state() -> None:
    """Clears what a trial leaves in the frameworks' global state (Keras's graph and layer names).

    Without a full garbage collection: with TensorFlow loaded one takes ~0.3 s, a tenth of a
    small trial; the interpreter's own collections free the old models' cycles soon enough."""
    keras = sys.modules.get("keras")
    if keras is not None:
        try:
            keras.backend.clear_session(free_memory=False)
        except TypeError:  # a Keras whose clear_session has no free_memory argument
            keras.backend.clear_session()
        except Exception:  # noqa: BLE001 - best effort: the next trial still runs
            pass


def _run_task(fn: Callable, space: SpaceKinds, task: Dict[str, Any], n: int, ctx: Any, client: Any,
              report_timeout: float) -> Dict[str, Any]:
    """Runs one trial; returns its outcome (its value already stored under TUNE_VALUE_KEY)."""
    index = int(task["trial"])
    where = f"runner pid {os.getpid()} on host {socket.gethostname()}"
    try:
        params = decode_params(space, task["params"])
        value = fn(params, TrialContext(ctx, client, index, n, report_timeout))
        data = encode_result(value)
        if len(data) > _MAX_VALUE_BYTES:
            raise ValueError(f"trial {index} returned {len(data) / 2**20:.1f} MiB; results up to "
                             f"{_MAX_VALUE_BYTES >> 20} MiB come back to the driver: save larger ones under "
                             f"ctx.absolute_path(...) and return the path")
        client.kv_set(TUNE_VALUE_KEY, data)
        return {"status": "ok"}
    except TrialStopped as e:
        return {"status": "stopped", "error": str(e)}
    except (Exception, SystemExit):  # noqa: BLE001 - the trial's failure, reported; the runner goes on
        return {"status": "failed",
                "error": f"trial {index} failed ({where}):\n{traceback_tail(traceback.format_exc())}"}
    finally:
        _forget_framework_state()


def _runner_main(args: Any, ctx: Any) -> None:
    """The runner node's loop: task after task until the driver says quit."""
    fn, space, idle_timeout, report_timeout = args
    client = ctx._coordinator_client()  # the node's authenticated connection to its coordinator
    n = 0
    while True:
        key = TUNE_TASK_KEY.format(n=n)
        try:
            task = json.loads(client.kv_get(key, idle_timeout))
        except DeadlineExceeded as e:
            raise DeadlineExceeded(f"the tune runner waited {idle_timeout:g}s (idle_timeout) for its next "
                                   f"task ({key}) from the driver: {e}") from None
        if task.get("quit"):
            return None
        outcome = _run_task(fn, space, task, n, ctx, client, report_timeout)
        outcome["pid"] = os.getpid()
        client.kv_set(TUNE_OUTCOME_KEY.format(n=n), json.dumps(outcome).encode())
        n += 1


# --------------------------------------------------------------------------- the driver side
@dataclass
class Outcome:
    """How a trial on a runner ended (the driver's view).

    status: "ok", "failed" or "stopped"; value: what the trial returned (status ok);
    error: why it failed or stopped; seconds: from dispatch to outcome; reports: its
    ``ctx.report`` values; pid: the runner process that ran it (None if unknown).
    """
    status: str
    value: Any = None
    error: str = ""
    seconds: float = 0.0
    reports: List[Dict[str, Any]] = field(default_factory=list)
    pid: Optional[int] = None


class Runner:
    """The driver's handle on one warm runner; see the module docstring.

    `on_report(trial_index, metrics)` is called for each report of the runner's current trial
    (on the runner job's event thread) and returns None to go on, or why to stop the trial.
    ``run_trial`` is called by one thread at a time; ``interrupt`` from any thread.
    """

    def __init__(self, spark: Any, fn: Callable, space: SpaceKinds, slot: int, num_slots: int,
                 on_report: Callable[[int, Dict[str, float]], Optional[str]], report_timeout: float,
                 idle_timeout: float, cluster_options: Dict[str, Any]):
        self._on_report = on_report
        self._run = Run(spark, _runner_main, (fn, space, float(idle_timeout), float(report_timeout)), slot,
                        num_slots, num_nodes=1, name=f"tune runner {slot}", on_report=self._report,
                        cluster_options=cluster_options)
        self._connect_timeout = float(cluster_options.get("connect_timeout") or 30.0)
        self._client = None
        self._lock = threading.Lock()
        self._n = 0                          # the next task's number
        self._current: Optional[int] = None  # the running task's trial index
        self._reports: List[Dict[str, Any]] = []
        self.broken = False                  # must be ended and replaced (its trial was ended from outside)
        self._ended: Optional[str] = None    # set once its run was waited for: "" or what went wrong
        self._interrupted: Optional[str] = None  # why interrupt() was called

    @property
    def job_id(self) -> str:
        return self._run.cluster.job_id if self._run.cluster is not None else ""

    def start(self) -> None:
        """Starts the runner's node and connects to its coordinator.  Raises what Cluster.run raises."""
        self._run.start()
        cluster = self._run.cluster
        host, port = cluster.coordinator_address.rsplit(":", 1)
        try:
            self._client = _ember.CoordinatorClient.connect(host, int(port), cluster._gang.secret,
                                                            connect_timeout=self._connect_timeout)
        except BaseException:
            self.broken = True
            self.close(30.0)
            raise

    def _report(self, run: Run, label: str, metrics: Dict[str, float]) -> None:
        """A report of the runner's node: record it, ask on_report, answer with the verdict."""
        if TRIAL_METRIC not in metrics or REPORT_METRIC not in metrics:
            return  # not a trial's report (a runner reports nothing of its own)
        index, k = int(metrics.pop(TRIAL_METRIC)), int(metrics.pop(REPORT_METRIC))
        with self._lock:
            n = self._n - 1
            current = self._current == index
            if current:
                self._reports.append(dict(metrics, node=label))
        stop = None if current else f"trial {index} is no longer run by this runner"
        try:
            if current:
                stop = self._on_report(index, metrics)
        finally:  # the trial waits for this answer: give it even if on_report raised
            try:
                self._client.kv_set(TUNE_VERDICT_KEY.format(n=n, k=k), json.dumps({"stop": stop}).encode())
            except EmberError:
                pass  # the runner is gone; its trial's outcome says so

    def run_trial(self, index: int, params: Dict[str, Any], timeout: Optional[float]) -> Outcome:
        """Runs trial `index` (params from encode_params) and returns its Outcome; never raises for
        the trial's own failure.  Past `timeout` seconds the trial is "failed" and the runner
        marked broken; a runner whose process died is marked broken, the trial "failed" with
        the node's error."""
        server = self._run.cluster._gang.server
        with self._lock:
            if self._interrupted is not None:  # the search's budget ended before the trial got here
                return Outcome("stopped", error=self._interrupted)
            n = self._n
            self._n += 1
            self._current = index
            self._reports = []
        started = time.monotonic()
        status, error, value, pid = "failed", "", None, None
        try:
            self._client.kv_set(TUNE_TASK_KEY.format(n=n), json.dumps({"trial": index, "params": params}).encode())
            raw = server.wait_for_key(TUNE_OUTCOME_KEY.format(n=n), 10 * 365 * 86400.0 if timeout is None else timeout)
            outcome = json.loads(raw)
            status, error, pid = outcome["status"], outcome.get("error", ""), outcome.get("pid")
            if outcome.get("forced"):
                self.broken = True
            elif status == "ok":
                value = decode_result(server.kv_get(TUNE_VALUE_KEY))
        except DeadlineExceeded:
            self.broken = True
            error = f"trial {index} ran past its timeout of {timeout:g}s and was aborted"
        except (Aborted, EmberError) as e:  # the runner's node failed (its process died) or its job ended
            self.broken = True
            result = self._run.wait(30.0)
            self._ended = result.error if result.status == "failed" else ""
            why = result.error or f"{type(e).__name__}: {e}"
            error = f"trial {index}: its runner process ended while it ran: {why}"
        except Exception as e:  # noqa: BLE001 - e.g. a value that does not decode: the trial's failure
            error = f"trial {index}: its result could not be read on the driver: {type(e).__name__}: {e}"
        with self._lock:
            self._current = None
            reports = self._reports
            self._reports = []
        return Outcome(status if not error or status != "ok" else "failed", value, error,
                       time.monotonic() - started, reports, pid)

    def interrupt(self, reason: str) -> None:
        """Ends the running trial's wait on the driver with status "stopped" (`reason`), and
        makes ``run_trial`` run no trial after it (each "stopped" at once); the runner is
        ended afterwards.  Thread-safe."""
        with self._lock:
            if self._interrupted is None:
                self._interrupted = reason
            if self._current is None or self._client is None:
                return  # run_trial starts nothing after this
            n = self._n - 1
        data = json.dumps({"status": "stopped", "error": reason, "forced": True}).encode()
        try:
            self._client.kv_set(TUNE_OUTCOME_KEY.format(n=n), data)
        except EmberError:
            pass  # the runner's job is ending anyway: run_trial's wait wakes on its abort

    def close(self, timeout: float = 60.0) -> str:
        """Ends the runner: tells it to quit (or stops it, when broken) and waits for its job to
        end; returns "" or what went wrong (for the search's log)."""
        if self._run.cluster is None:
            return ""
        if self._ended is not None:  # run_trial already waited for it (its process died)
            self._close_client()
            return self._ended
        if not self.broken and self._client is not None:
            try:
                self._client.kv_set(TUNE_TASK_KEY.format(n=self._n), json.dumps({"quit": True}).encode())
            except EmberError:
                self.broken = True
        if self.broken:
            self._run.stop("the tune runner is replaced: its trial was ended from outside or its process died")
        result = self._run.wait(timeout)
        self._close_client()
        self._ended = result.error if result.status == "failed" else ""
        return self._ended

    def _close_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
