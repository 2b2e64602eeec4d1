"""The Spark side of a job: task slots, and the barrier job that hosts the nodes.

``NodesJob`` runs one Spark barrier task per node (``ember._launcher.run_partition``) in a
daemon thread under a job group of its own, so the driver can cancel exactly that job
(with ``driver_ps_nodes``, the ps nodes' launchers run on driver threads instead).
When the job ends it calls back, so the driver's waits (which block in the coordinator)
can be woken at once if it failed.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import threading
import time
from typing import Any, Callable, List, Optional

from ember._driver.spark_side import SparkSide, spark_side
from ember._launcher.task import NodeLauncher, NodeSpec, run_partition, run_replacement
from ember.errors import ClusterError, DeadlineExceeded


def check_slots(spark: Any, needed: int, timeout: float, profile=None, gpus_per_node: float = 0.0) -> None:
    """Returns once `needed` task slots exist; raises ClusterError after `timeout`.

    A barrier stage without enough slots makes Spark retry for minutes, so look
    first.  local[N] has all its slots from the start; on a cluster, executors
    register a little after the context starts, hence the wait.  Spark has no
    event for "an executor registered" that Python can wait on, so this one wait
    looks again every half second (it never waits on Ember's own state).  Where Spark
    does not say (Spark Connect on a cluster master) it returns at once: the nodes'
    reservation_timeout then names the nodes that never started.
    """
    side = spark_side(spark)
    local = side.is_local
    start = time.monotonic()
    fresh = False
    while True:
        have = side.task_slots(profile, fresh)
        if have is None or have >= needed:
            return
        waited = time.monotonic() - start
        if local or waited >= timeout:
            break
        time.sleep(min(0.5, timeout - waited))
        fresh = True  # executors may have registered since
    if gpus_per_node > 0 and not local:
        from ember._driver.gpus import too_few
        raise ClusterError(too_few(side, needed, gpus_per_node, have))
    if local:
        advice = f"Use local[{needed}] or more"
        where = f"master {side.master}"
    else:
        advice = ("Add executors or cores (spark.executor.instances, spark.executor.cores, "
                  "spark.task.cpus), or raise slot_timeout if executors are still starting")
        where = f"master {side.master}, after waiting {waited:.0f}s"
    raise ClusterError(
        f"Cluster.run needs {needed} free task slots (one per node, Spark barrier execution) "
        f"but the Spark application has {have} ({where}). {advice}.")


def spark_error_summary(error: BaseException, side: Optional[SparkSide] = None) -> str:
    """The Python traceback inside a Spark job failure, or the start of its text; with `side`,
    what to do when the executors' Python cannot import Ember."""
    text = str(error)
    m = re.search(r"Traceback \(most recent call last\):.*?(?=\n\s*at [\w$.]+\(|\Z)", text, re.S)
    if m:
        tb = m.group(0).strip()
        last = tb.splitlines()[-1]
        summary = f"{last}\n(Python traceback of the Spark task:)\n{tb[-4000:]}"
    else:
        summary = text[:2000]
    return (ember_import_hint(side, summary) if side is not None else "") + summary


_STAGE_FAILURE = re.compile(r"Job aborted due to stage failure: (.*?)(?=\n\s*at [\w$.]+\(|\nDriver stacktrace:|\Z)",
                            re.S)


def spark_failure_reason(error: BaseException) -> Optional[str]:
    """What Spark said of a failed job, in one line: its stage failure ("... ExecutorLostFailure
    (executor 1 exited ...) Reason: worker lost: Not receiving heartbeat for 60 seconds"), or
    None when it was cancelled (by the driver: not Spark's own reason) or says nothing."""
    text = str(error)
    m = _STAGE_FAILURE.search(text)
    if m is None:
        return None
    reason = " ".join(m.group(1).split())
    return reason[:1000] or None


_NO_EMBER = re.compile(r"ModuleNotFoundError: No module named 'ember(\._ember)?'|ImportError: .*ember[./]_ember")


def ember_import_hint(side: SparkSide, summary: str) -> str:
    """When `summary` (a failed Spark job's text) says Spark's Python workers could not import
    Ember: which Python they run and the fix (a paragraph ending in a blank line); else "".
    The check before the first nodes (check_executor_python) catches this; this hint covers
    executors that join later (e.g. dynamic allocation on a host without Ember)."""
    if not _NO_EMBER.search(summary):
        return ""
    return executor_python_advice(side, None, "see the Python error below") + "\n\n"


def executor_python_advice(side: SparkSide, seen: Optional[dict], why: str) -> str:
    """The one message for "Spark's Python workers cannot import this Ember": which Python they
    run (`seen`: what the check's task reported, or None), `why`, and the fix."""
    import os
    import sys

    python = side.python_exec
    how = ("PYSPARK_PYTHON is unset, so it is python3 from the executors' PATH"
           if not os.environ.get("PYSPARK_PYTHON") else "from PYSPARK_PYTHON")
    runs = f"`{python}` ({how})"
    if seen:
        runs += f", which is {seen.get('python')} (Python {seen.get('version')}) on host {seen.get('host')}"
    text = (f"Spark's Python workers cannot import Ember. They run {runs}; this driver runs "
            f"`{sys.executable}`, with Ember {_version()}. Why: {why}. Fix: set PYSPARK_PYTHON "
            f"(spark-submit: --conf spark.pyspark.python) to a Python that has this Ember installed "
            f"on every executor, before the SparkSession starts; or ship this environment to the "
            f"executors: `ember pack` makes the archive and prints the settings "
            f"(spark.archives=<archive>#environment, PYSPARK_PYTHON=./environment/bin/python; "
            f"docs/deploy.md).")
    if side.is_local and not side.connect:
        text += (f" In local mode the executors are this process's machine, and the driver's own "
                 f"interpreter is the one to use: PYSPARK_PYTHON={sys.executable}.")
    return text


def _version() -> str:
    import ember
    return getattr(ember, "__version__", "?")


def _ember_probe():
    """The function of the check's tasks.  Defined inside a function so that cloudpickle ships
    it by value: shipped by reference, unpickling it would import ember._driver.spark_job, and a
    Python without Ember would fail before it could say why.  Only the standard library."""

    def probe(_partition):
        import json
        import socket
        import sys
        import traceback

        out = {"python": sys.executable, "version": sys.version.split()[0], "host": socket.gethostname()}
        try:
            import ember
            out["ember_version"] = getattr(ember, "__version__", None)
            out["ember_file"] = getattr(ember, "__file__", None)
        except BaseException as e:  # noqa: BLE001 - the reason is the answer
            out["error"] = "".join(traceback.format_exception_only(type(e), e)).strip()
            yield json.dumps(out)
            return
        try:
            from ember import _ember
            out["native_file"] = getattr(_ember, "__file__", None)
            out["native_names"] = sorted(n for n in dir(_ember) if not n.startswith("_"))
        except BaseException as e:  # noqa: BLE001 - the reason is the answer
            out["native_error"] = "".join(traceback.format_exception_only(type(e), e)).strip()
        yield json.dumps(out)

    return probe


def _probe_problem(seen: dict, version: str, native_names: set) -> Optional[str]:
    """Why the Ember a check task saw is not this driver's, or None."""
    if seen.get("error"):
        return seen["error"]
    if seen.get("ember_version") != version:
        return (f"it imports Ember {seen.get('ember_version')} from {seen.get('ember_file')}, "
                f"not this driver's Ember {version}")
    if seen.get("native_error"):
        return f"its Ember {version} ({seen.get('ember_file')}) has no loadable native module: {seen['native_error']}"
    missing = sorted(native_names - set(seen.get("native_names") or ()))
    if missing:
        return (f"its native module {seen.get('native_file')} is another build of Ember "
                f"{version}: it lacks {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    return None


_checked: set = set()   # (application id, pythonExec) whose executors passed the check
_checked_lock = threading.Lock()


def check_executor_python(spark: Any, num_tasks: int, timeout: float) -> None:
    """Returns once Spark's Python workers import this driver's Ember: the same version, and a
    native module ember._ember that loads and has every name this driver's has.

    Every entry point that launches nodes calls it first (Cluster.run, run_parallel; tune and
    the ml stages through them).  It runs one Spark job of `num_tasks` tiny tasks (the slots the
    nodes will use, so it looks at the executors they will likely run on), once per application
    and executors' Python: later calls return at once.  Thread-safe; concurrent callers wait
    for the one check.

    Raises:
        ClusterError: the executors' Python cannot import this Ember; the message says which
            Python they run, why, and the fix.
        DeadlineExceeded: the check's job did not end within `timeout` seconds (it is cancelled).
    """
    import ember
    from ember import _ember

    side = spark_side(spark)
    key = (side.app_id, side.python_exec)
    with _checked_lock:
        if key in _checked:
            return
        version = getattr(ember, "__version__", "?")
        native = {n for n in dir(_ember) if not n.startswith("_")}
        seen_all = _run_probe(side, max(1, int(num_tasks)), timeout)
        bad = [(s, p) for s in seen_all if (p := _probe_problem(s, version, native)) is not None]
        if bad:
            seen, why = bad[0]
            hosts = sorted({s.get("host") for s, _ in bad})
            where = f" ({len(bad)} of {len(seen_all)} check tasks failed, on {', '.join(map(str, hosts))})"
            raise ClusterError(executor_python_advice(side, seen, why + where) + " No node was launched.")
        _checked.add(key)


def _run_probe(side: SparkSide, n: int, timeout: float) -> list:
    """What each of `n` tasks' Python reported (a list of dicts), within `timeout` seconds."""
    import json
    import uuid

    group = f"ember-check-{uuid.uuid4().hex[:12]}"
    outcome: dict = {}
    done = threading.Event()

    def job() -> None:
        try:
            lines = side.run_tasks(n, _ember_probe(), group, "Ember: can the executors' Python import Ember?")
            outcome["seen"] = [json.loads(line) for line in lines]
        except BaseException as e:  # noqa: BLE001 - raised below
            outcome["error"] = e
        finally:
            done.set()

    side.thread(job, group).start()
    if not done.wait(timeout):
        side.cancel(group)
        raise DeadlineExceeded(
            f"the check that Spark's Python workers import Ember ({n} tiny tasks, Spark job group "
            f"{group}) did not end within {timeout:g}s; look at the Spark UI for why its tasks do "
            f"not run, or raise spark.ember.executorCheckTimeout")
    if "error" in outcome:
        e = outcome["error"]
        raise ClusterError(executor_python_advice(
            side, None, f"the check's Spark job failed: {spark_error_summary(e)}") + " No node was launched.") from e
    return outcome["seen"]


class NodesJob:
    """The nodes of one gang: a Spark barrier job running one task per node, and, with
    `driver_nodes`, the first that many nodes (executor ids 0..driver_nodes-1, the ps nodes of
    ``driver_ps_nodes``) run by launchers on threads of the driver process, as TFoS ran them.

    Thread-safe.  `on_end(job)` runs once the Spark job has ended (successfully, failed, or
    cancelled), and when a launcher on the driver fails.
    """

    def __init__(self, side: SparkSide, job_id: str, num_nodes: int, on_end: Callable[["NodesJob"], None],
                 driver_nodes: int = 0, profile=None):
        if not 0 <= driver_nodes < num_nodes:
            raise ValueError(f"driver_nodes must be in [0, {num_nodes}), got {driver_nodes}")
        self._side = side
        self.job_id = job_id
        self.num_nodes = num_nodes
        self.driver_nodes = driver_nodes
        self._profile = profile  # the barrier stage's ResourceProfile (GPUs per task), or None
        self._on_end = on_end
        self._thread: Optional[threading.Thread] = None
        self._driver_threads: List[threading.Thread] = []
        self._replacements: List[threading.Thread] = []  # one-task Spark jobs replacing lost workers
        self._spark_done = threading.Event()
        self.error: Optional[BaseException] = None
        self._driver_error: Optional[str] = None
        self.cancelled = False

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def done(self) -> bool:
        return self._spark_done.is_set() and not any(t.is_alive() for t in self._driver_threads + self._replacements)

    def replace(self, spec: NodeSpec, executor_id: int, on_error: Callable[[BaseException], None]) -> None:
        """Starts a one-task Spark job (in this job's group, so cancel() ends it too) whose
        task runs a new node under `executor_id`, a worker the job went on without; the
        coordinator lets it take the lost node's place.  `on_error` gets the Spark job's
        failure (the node's own failure reaches the coordinator as any node's does)."""
        def main() -> None:
            try:
                self._side.run_tasks(1, functools.partial(run_replacement, spec, executor_id), self.job_id,
                                     f"Ember job {self.job_id}: a replacement for executor {executor_id}")
            except BaseException as e:  # noqa: BLE001 - reported through on_error
                if not self.cancelled:
                    on_error(e)

        t = self._side.thread(main, f"{self.job_id}-replace-{executor_id}")
        self._replacements.append(t)
        t.start()

    def start(self, spec: NodeSpec) -> None:
        side, first, n = self._side, self.driver_nodes, self.num_nodes - self.driver_nodes
        driver_spec = dataclasses.replace(spec, echo_logs=False)  # the driver's console shows node output
        for executor_id in range(first):
            def launch(executor_id: int = executor_id) -> None:
                # A node's parent-death signal follows the thread that spawned it: this thread
                # lives until the node has ended.
                try:
                    NodeLauncher(driver_spec, executor_id).run()
                except BaseException as e:  # noqa: BLE001 - reported through on_end and the waits
                    if self.error is None and not self.cancelled:
                        self._driver_error = f"executor {executor_id} on the driver: {type(e).__name__}: {e}"
                        self.error = e
                        self._on_end(self)
            t = threading.Thread(target=launch, daemon=True, name=f"{self.job_id}-driver-node-{executor_id}")
            self._driver_threads.append(t)
            t.start()

        def spark_main() -> None:
            try:
                side.run_tasks(n, functools.partial(run_partition, spec, first), self.job_id,
                               f"Ember job {self.job_id}: {n} nodes", barrier=True, profile=self._profile)
            except BaseException as e:  # noqa: BLE001 - reported by the waits on the driver
                if self.error is None:
                    self.error = e
            finally:
                self._spark_done.set()
                self._on_end(self)

        self._thread = side.thread(spark_main, f"{self.job_id}-spark")
        self._thread.start()

    def failure_text(self) -> str:
        if self._driver_error is not None:
            return f"the launcher of a node on the driver (driver_ps_nodes) failed: {self._driver_error}"
        return f"the Spark job running the {self.num_nodes - self.driver_nodes} nodes failed: " \
               f"{spark_error_summary(self.error, self._side)}"

    def cancel(self) -> None:
        """Cancels the job group (its tasks are interrupted); idempotent.  Nodes on the
        driver end when the coordinator aborts the job, which callers do first."""
        if self.cancelled or self._thread is None or self.done:
            return
        self.cancelled = True
        self._side.cancel(self.job_id)

    def wait(self, timeout: float) -> bool:
        """Waits up to `timeout` seconds for the Spark job and the nodes on the driver to end;
        whether they did."""
        if self._thread is None:
            return True
        deadline = time.monotonic() + timeout
        if not self._spark_done.wait(timeout):
            return False
        for t in self._driver_threads + self._replacements:
            t.join(max(0.0, deadline - time.monotonic()))
        return self.done

    def join(self, timeout: float) -> None:
        """Waits for the job to end after every node reported done; raises if it does not
        end within `timeout` or failed (other than by our own cancel)."""
        if self._thread is None:
            return
        if not self.wait(timeout):
            where = (f"the Spark job running them (look at the Spark UI for job group {self.job_id})"
                     if not self._spark_done.is_set() else
                     f"the launchers of the {self.driver_nodes} nodes on the driver")
            raise DeadlineExceeded(
                f"every node reported done, but {where} did not end within {timeout:g}s.")
        if self.error is not None and not self.cancelled:
            raise ClusterError(f"every node reported done, but {self.failure_text()}") from self.error
