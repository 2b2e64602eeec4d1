"""Independent runs side by side: ``ember.run_parallel`` (TFoS's ``TFParallel.run``).

Each run is an Ember job of its own (``Cluster.run`` with one node, or more for a multi-node
trial of :mod:`ember.tune`): its own coordinator, its own barrier stage, its own ctx.  So one
run failing, or being stopped, leaves the others running, and the driver learns which run
failed and why (the node's traceback) from the same machinery that reports a failed node of
any job.

What ``fn(args, ctx)`` returns comes back to the driver through the run's coordinator (its
key/value store, authenticated with the run's secret), typed, never pickled: a JSON value
(None, numbers, strings, lists, dicts), a numpy array (``.npy`` bytes, ``allow_pickle=False``)
or a Keras model (the ``.keras`` file, loaded with ``safe_mode=True``).  Anything else must be
saved by ``fn`` (e.g. under ``ctx.absolute_path(...)``) and its path returned.
"""
from __future__ import annotations

import io
import json
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from ember import _ember
from ember._driver.console import Console
from ember._names import RUN_RESULT_KEY
from ember.cluster import Cluster
from ember.errors import Aborted, ClusterError, DeadlineExceeded, EmberError, NodeError
from ember.input_mode import InputMode

_MAX_RESULT_BYTES = 15 << 20  # the coordinator's messages hold 16 MiB
_FOREVER = 10 * 365 * 86400.0

_JSON, _NUMPY, _KERAS = b"J", b"N", b"K"


# --------------------------------------------------------------------------- results
def encode_result(value: Any) -> bytes:
    """`value` as tagged bytes: JSON, a numpy array (.npy) or a Keras model (.keras file).

    Raises:
        TypeError: `value` is none of these (the message says what to do instead).
    """
    try:
        import numpy as np
        if isinstance(value, np.ndarray):
            buf = io.BytesIO()
            np.save(buf, value, allow_pickle=False)
            return _NUMPY + buf.getvalue()
    except ImportError:
        pass
    if _is_keras_model(value):
        return _KERAS + keras_model_bytes(value)
    try:
        return _JSON + json.dumps(value, default=_json_scalar).encode()
    except (TypeError, ValueError) as e:
        raise TypeError(f"the run returned a {type(value).__name__}, which Ember cannot send back: return "
                        f"a JSON value (numbers, strings, lists, dicts), a numpy array or a Keras model, "
                        f"or save it under ctx.absolute_path(...) and return the path ({e})") from None


def decode_result(data: bytes) -> Any:
    """The value :func:`encode_result` encoded (no pickle: JSON, .npy, or a safe-mode .keras load)."""
    tag, body = data[:1], data[1:]
    if tag == _JSON:
        return json.loads(body.decode())
    if tag == _NUMPY:
        import numpy as np
        return np.load(io.BytesIO(body), allow_pickle=False)
    if tag == _KERAS:
        return load_keras_model(body)
    raise ValueError(f"not an encoded run result (tag {tag!r})")


def _json_scalar(value: Any) -> Any:
    """numpy scalars (what Keras logs hold) as Python numbers."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():
        return item()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _is_keras_model(value: Any) -> bool:
    import sys
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(value, keras.Model)


def keras_model_bytes(model: Any) -> bytes:
    """The Keras model as the bytes of its native ``.keras`` file (config, weights, optimizer)."""
    import os
    import tempfile
    with tempfile.TemporaryDirectory(prefix="ember-model-") as d:
        path = os.path.join(d, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()


def load_keras_model(data: bytes, compile: bool = False) -> Any:
    """A Keras model from the bytes of a ``.keras`` file, loaded with ``safe_mode=True`` (no
    Python code in the file is run)."""
    import os
    import tempfile

    import keras
    with tempfile.TemporaryDirectory(prefix="ember-model-") as d:
        path = os.path.join(d, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        return keras.saving.load_model(path, compile=compile, safe_mode=True)


# --------------------------------------------------------------------------- one run
class RunContext:
    """The ctx a run's ``fn(args, ctx)`` gets: the node's :class:`ember.Context`, plus the run.

    Every attribute and method of the node's Context is here (``report``, ``absolute_path``,
    ``communicator`` in a multi-node run, ...).  In a single-node run ``executor_id`` and
    ``worker_num`` are the run's index, as in TFoS's TFParallel.

    Attributes:
        run_index: this run's index, 0..num_runs-1.
        num_runs: how many runs were started together.
    """

    def __init__(self, ctx: Any, run_index: int, num_runs: int):
        self._ctx = ctx
        self.run_index = run_index
        self.num_runs = num_runs
        if ctx.num_workers == 1 and not ctx.cluster_spec.get("ps"):
            self.executor_id = run_index
            self.worker_num = run_index

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def __repr__(self) -> str:
        return f"RunContext(run {self.run_index} of {self.num_runs}, {self._ctx!r})"


def _run_main(payload, ctx) -> None:
    """main_fun of every run's node: fn(args, RunContext), then its result to the coordinator."""
    fn, args, run_index, num_runs = payload
    value = fn(args, RunContext(ctx, run_index, num_runs))
    data = encode_result(value)
    if len(data) > _MAX_RESULT_BYTES:
        raise ValueError(f"run {run_index} returned {len(data) / 2**20:.1f} MiB; results up to "
                         f"{_MAX_RESULT_BYTES >> 20} MiB come back to the driver: save larger ones under "
                         f"ctx.absolute_path(...) and return the path")
    ctx._coordinator_client().kv_set(RUN_RESULT_KEY.format(executor_id=ctx.executor_id), data)


class _RunConsole(Console):
    """The driver's console for one run: labels say which run, reports also go to `on_report`."""

    def __init__(self, prefix: str, on_report: Optional[Callable[[str, Dict[str, float]], None]]):
        super().__init__()
        self._prefix = prefix
        self._on_report = on_report

    def node_line(self, label: str, stream: str, line: str) -> None:
        super().node_line(f"{self._prefix} {label}", stream, line)

    def info(self, message: str) -> None:
        super().info(f"{self._prefix}: {message}")

    def progress(self, label: str, metrics: Dict[str, float]) -> None:
        if self._on_report is not None:
            try:
                self._on_report(label, dict(metrics))
            except Exception as e:  # noqa: BLE001 - a scheduler bug must not stop the event pump
                super().info(f"{self._prefix}: the report handler failed: {type(e).__name__}: {e}")
        super().progress(f"{self._prefix} {label}", metrics)


_console_for_next_run = threading.local()


class _RunCluster(Cluster):
    """A Cluster whose driver console is the run's (set per thread before ``run``)."""

    @staticmethod
    def _new_console() -> Console:
        return getattr(_console_for_next_run, "console", None) or Console()


@dataclass
class RunResult:
    """How one run ended.

    Attributes:
        index: the run's index.
        status: "ok", "failed" or "stopped" (by :meth:`Run.stop`, e.g. an early-stopping
            scheduler).
        value: what ``fn`` returned (status "ok"), else None.
        error: for "failed": which node failed, where, and the tail of its traceback; for
            "stopped": why.
        seconds: wall time from start to end.
        reports: every ``ctx.report`` of the run's nodes, in order ({"node": label, ...metrics}).
    """
    index: int
    status: str
    value: Any = None
    error: str = ""
    seconds: float = 0.0
    reports: List[Dict[str, Any]] = field(default_factory=list)


def traceback_tail(text: str, lines: int = 12) -> str:
    """The last `lines` non-empty lines of a traceback (the exception is the last)."""
    kept = [line for line in text.rstrip().splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


class Run:
    """One independent run: a job of `num_nodes` nodes running ``fn(args, ctx)``.

    ``start()`` returns once its nodes registered; ``wait()`` returns its :class:`RunResult`
    (it never raises for the run's own failure); ``stop(reason)`` ends it early (the driver
    tells its nodes to stop: each is ended with SIGTERM, then SIGKILL after kill_grace_secs).
    Thread-safe.
    """

    def __init__(self, spark: Any, fn: Callable[[Any, Any], Any], args: Any, index: int, num_runs: int,
                 num_nodes: int = 1, name: Optional[str] = None,
                 on_report: Optional[Callable[["Run", str, Dict[str, float]], None]] = None,
                 cluster_options: Optional[dict] = None):
        self.spark = spark
        self.fn = fn
        self.args = args
        self.index = index
        self.num_runs = num_runs
        self.num_nodes = num_nodes
        self.name = name or f"run {index}"
        self._on_report = on_report
        self._options = dict(cluster_options or {})
        self.cluster: Optional[Cluster] = None
        self.reports: List[Dict[str, Any]] = []
        self._stopped: Optional[str] = None
        self._lock = threading.Lock()
        self._started = time.monotonic()

    def _report(self, label: str, metrics: Dict[str, float]) -> None:
        with self._lock:
            self.reports.append(dict(metrics, node=label))
        if self._on_report is not None:
            self._on_report(self, label, metrics)

    def start(self) -> None:
        """Starts the run's nodes; returns once they registered.  Raises what Cluster.run raises."""
        self._started = time.monotonic()
        _console_for_next_run.console = _RunConsole(self.name, self._report)
        try:
            self.cluster = _RunCluster.run(self.spark, _run_main, (self.fn, self.args, self.index, self.num_runs),
                                           num_executors=self.num_nodes, input_mode=InputMode.TENSORFLOW,
                                           **self._options)
        finally:
            _console_for_next_run.console = None
        with self._lock:
            stop = self._stopped
        if stop is not None:  # stop() came while the nodes were starting
            self._stop_nodes()

    def stop(self, reason: str) -> None:
        """Ends the run early; its status becomes "stopped" (unless it already ended)."""
        with self._lock:
            if self._stopped is not None:
                return
            self._stopped = reason
            started = self.cluster is not None
        if started:
            self._stop_nodes()

    def _stop_nodes(self) -> None:
        server = self.cluster._gang.server
        if server is not None:
            try:
                server.stop_nodes(list(_ember.ROLES))
            except EmberError:
                pass  # the run is ending anyway

    @property
    def stopped(self) -> bool:
        return self._stopped is not None

    def wait(self, timeout: Optional[float] = None) -> RunResult:
        """Waits for the run to end and shuts it down; returns its RunResult.

        Args:
            timeout: seconds to wait (None: as long as it runs); past it the run is aborted
                and reported "failed" with a message naming the timeout.
        """
        cluster = self.cluster
        if cluster is None:
            raise RuntimeError(f"{self.name}: wait() before start()")
        deadline = None if timeout is None else time.monotonic() + timeout
        value, error = None, ""
        try:
            server = cluster._gang.server
            for executor_id in range(self.num_nodes):
                left = _FOREVER if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    server.wait_for_node_end(executor_id, left)
                except Aborted:
                    break  # a node failed: shutdown() below raises its NodeError
            data = server.kv_get(RUN_RESULT_KEY.format(executor_id=0))
            cluster.shutdown(timeout=30.0)
            if data is not None:
                value = decode_result(data)
            elif self._stopped is None:
                error = f"{self.name} ended without a result"
        except DeadlineExceeded:
            cluster._teardown(abort_reason=f"{self.name} ran past its timeout of {timeout:g}s")
            error = f"{self.name} ran past its timeout of {timeout:g}s and was aborted"
        except NodeError as e:
            error = (f"{self.name} failed: node {e.job_name}:{e.task_index} on host {e.host}:\n"
                     f"{traceback_tail(e.remote_traceback)}")
        except (ClusterError, EmberError) as e:
            error = f"{self.name} failed: {type(e).__name__}: {traceback_tail(str(e))}"
        finally:
            cluster._teardown()
        seconds = time.monotonic() - self._started
        with self._lock:
            reports = list(self.reports)
            stopped = self._stopped
        if stopped is not None and value is None:
            return RunResult(self.index, "stopped", None, stopped, seconds, reports)
        if error:
            return RunResult(self.index, "failed", None, error, seconds, reports)
        return RunResult(self.index, "ok", value, "", seconds, reports)


# --------------------------------------------------------------------------- run_parallel
class RunsFailed(EmberError):
    """Some of ``run_parallel``'s runs failed.

    Attributes:
        results: every run's :class:`RunResult`, in run order (the good ones too).
        failed: the failed runs' indices.
    """

    def __init__(self, results: List[RunResult]):
        self.results = results
        self.failed = [r.index for r in results if r.status != "ok"]
        text = "\n\n".join(r.error for r in results if r.status != "ok")
        super().__init__(f"{len(self.failed)} of {len(results)} runs failed (runs {self.failed}):\n\n{text}")

    def __reduce__(self):
        return (type(self), (self.results,))


def run_parallel(spark: Any, fn: Callable[[Any, Any], Any], args: Any = None, num_executors: Optional[int] = None,
                 timeout: Optional[float] = None, return_results: bool = False, **cluster_options: Any) -> List[Any]:
    """Runs ``fn(args, ctx)`` `num_executors` times at once, each run an independent
    single-node Ember job (TFoS's ``TFParallel.run``), and returns what the runs returned.

    Each run gets its own ctx (:class:`RunContext`): ``ctx.run_index`` (also
    ``ctx.executor_id`` / ``ctx.worker_num``, as in TFoS) and ``ctx.num_runs`` say which run it
    is; ``ctx.report(...)`` shows on the driver labelled with the run.  A failing run does not
    stop the others.

    Args:
        spark: a SparkSession or SparkContext.
        fn: called as ``fn(args, ctx)`` in a node process of its own; pickled with cloudpickle.
            It may return a JSON value, a numpy array or a Keras model (see the module doc).
        args: passed to every run (must pickle).
        num_executors: how many runs; default ``sc.defaultParallelism``.  The runs start
            together, so the Spark application needs that many free task slots.
        timeout: seconds each run may take (None: no limit); a run past it is aborted and
            counts as failed.
        return_results: return the runs' :class:`RunResult` (status, error, time, reports)
            instead of their values, and do not raise for failed runs.
        **cluster_options: passed to ``Cluster.run`` (e.g. ``reservation_timeout``).

    Returns:
        The runs' return values, in run order (or their RunResults).

    Raises:
        RunsFailed: some runs failed (after every run ended); its message names each failed
            run, its node and host, with the tail of its traceback; ``.results`` has them all.
        ClusterError: too few task slots for the runs.
    """
    from ember import config
    from ember._driver.spark_job import check_executor_python, check_slots
    from ember._driver.spark_side import spark_side

    side = spark_side(spark)
    n = int(num_executors) if num_executors is not None else side.default_parallelism()
    if n < 1:
        raise ValueError(f"run_parallel needs num_executors >= 1, got {n}")
    if not side.is_local:  # executors may still be registering: wait for them
        check_slots(side, n, config.get("slot_timeout", side, cluster_options.get("slot_timeout")))
    have = side.task_slots()
    if have is not None and have < n:
        raise ClusterError(f"run_parallel runs {n} runs at once, one Spark task slot each, but the Spark "
                           f"application has {have} (master {side.master}); add executors or cores, or run fewer")
    check_executor_python(side, n, config.get("executor_check_timeout", side))  # one error, not n failed runs
    runs = [Run(spark, fn, args, i, n) for i in range(n)]
    results: List[Optional[RunResult]] = [None] * n

    def one(run: Run) -> None:
        try:
            run.start()
        except BaseException as e:  # noqa: BLE001 - reported as this run's failure
            detail = e.remote_traceback if isinstance(e, NodeError) else traceback.format_exc()
            results[run.index] = RunResult(run.index, "failed", None,
                                           f"{run.name} failed to start: {traceback_tail(detail)}",
                                           time.monotonic() - run._started)
            return
        results[run.index] = run.wait(timeout)

    threads = [threading.Thread(target=one, args=(run,), daemon=True, name=f"ember-run-{run.index}")
               for run in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()  # each run's own waits have deadlines (reservation_timeout, timeout)
    done: List[RunResult] = [r for r in results if r is not None]
    if return_results:
        return done
    if any(r.status != "ok" for r in done):
        raise RunsFailed(done)
    return [r.value for r in done]
