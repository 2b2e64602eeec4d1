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

from ember._launcher import NodeLauncher, NodeSpec, run_partition
from ember.errors import ClusterError, DeadlineExceeded


def spark_context(spark: Any):
    """The SparkContext of a SparkSession or SparkContext."""
    sc = getattr(spark, "sparkContext", spark)
    if not hasattr(sc, "_jsc"):
        raise TypeError(f"Cluster.run needs a SparkSession or SparkContext, got {type(spark).__name__}")
    return sc


def task_slots(sc) -> int:
    """How many tasks the Spark application can run at once (what a barrier stage needs)."""
    jsc = sc._jsc.sc()
    return int(jsc.maxNumConcurrentTasks(jsc.resourceProfileManager().defaultResourceProfile()))


def check_slots(sc, needed: int, timeout: float) -> None:
    """Returns once `needed` task slots exist; raises ClusterError after `timeout`.

    A barrier stage without enough slots makes Spark retry for minutes, so look
    first.  local[N] has all its slots from the start; on a cluster, executors
    register a little after the context starts, hence the wait.  Spark has no
    event for "an executor registered" that Python can wait on, so this one wait
    looks again every half second (it never waits on Ember's own state).
    """
    local = sc.master.startswith("local")
    start = time.monotonic()
    while True:
        have = task_slots(sc)
        if have >= needed:
            return
        waited = time.monotonic() - start
        if local or waited >= timeout:
            break
        time.sleep(min(0.5, timeout - waited))
    if local:
        advice = f"Use local[{needed}] or more"
        where = f"master {sc.master}"
    else:
        advice = ("Add executors or cores (spark.executor.instances, spark.executor.cores, "
                  "spark.task.cpus), or raise slot_timeout if executors are still starting")
        where = f"master {sc.master}, after waiting {waited:.0f}s"
    raise ClusterError(
        f"Cluster.run needs {needed} free task slots (one per node, Spark barrier execution) "
        f"but the Spark application has {have} ({where}). {advice}.")


def spark_error_summary(error: BaseException, sc=None) -> str:
    """The Python traceback inside a Spark job failure, or the start of its text; with `sc`,
    what to do when the executors' Python cannot import Ember."""
    text = str(error)
    m = re.search(r"Traceback \(most recent call last\):.*?(?=\n\s*at [\w$.]+\(|\Z)", text, re.S)
    if m:
        tb = m.group(0).strip()
        last = tb.splitlines()[-1]
        summary = f"{last}\n(Python traceback of the Spark task:)\n{tb[-4000:]}"
    else:
        summary = text[:2000]
    return (ember_import_hint(sc, summary) if sc is not None else "") + summary


_NO_EMBER = re.compile(r"ModuleNotFoundError: No module named 'ember(\._ember)?'|ImportError: .*ember[./]_ember")


def ember_import_hint(sc, summary: str) -> str:
    """When `summary` says Spark's Python workers could not import Ember: which Python they
    run, and the fix (a paragraph ending in a blank line); else ""."""
    if not _NO_EMBER.search(summary):
        return ""
    import os
    import sys

    python = getattr(sc, "pythonExec", None) or "python3"
    how = ("PYSPARK_PYTHON is unset, so it is python3 from the executors' PATH"
           if not os.environ.get("PYSPARK_PYTHON") else "from PYSPARK_PYTHON")
    text = (f"Spark's Python workers cannot import Ember. They run `{python}` ({how}); this "
            f"driver runs `{sys.executable}`, with Ember {_version()}. Fix: set PYSPARK_PYTHON "
            f"(or spark.pyspark.python) to a Python that has this Ember installed on every executor, "
            f"before the SparkSession starts, or ship this environment to the executors with "
            f"spark.archives (Spark's \"Python package management\").")
    if str(sc.master).startswith("local"):
        text += (f" In local mode the driver's own interpreter is the one to use: "
                 f"PYSPARK_PYTHON={sys.executable}.")
    return text + "\n\n"


def _version() -> str:
    import ember
    return getattr(ember, "__version__", "?")


class NodesJob:
    """The nodes of one gang: a Spark barrier job running one task per node, and, with
    `driver_nodes`, the first that many nodes (executor ids 0..driver_nodes-1, the ps nodes of
    ``driver_ps_nodes``) run by launchers on threads of the driver process, as TFoS ran them.

    Thread-safe.  `on_end(job)` runs once the Spark job has ended (successfully, failed, or
    cancelled), and when a launcher on the driver fails.
    """

    def __init__(self, sc, job_id: str, num_nodes: int, on_end: Callable[["NodesJob"], None],
                 driver_nodes: int = 0):
        if not 0 <= driver_nodes < num_nodes:
            raise ValueError(f"driver_nodes must be in [0, {num_nodes}), got {driver_nodes}")
        self._sc = sc
        self.job_id = job_id
        self.num_nodes = num_nodes
        self.driver_nodes = driver_nodes
        self._on_end = on_end
        self._thread: Optional[threading.Thread] = None
        self._driver_threads: List[threading.Thread] = []
        self._spark_done = threading.Event()
        self.error: Optional[BaseException] = None
        self._driver_error: Optional[str] = None
        self.cancelled = False

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def done(self) -> bool:
        return self._spark_done.is_set() and not any(t.is_alive() for t in self._driver_threads)

    def start(self, spec: NodeSpec) -> None:
        from pyspark import InheritableThread

        sc, first, n = self._sc, self.driver_nodes, self.num_nodes - self.driver_nodes
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
                sc.setJobGroup(self.job_id, f"Ember job {self.job_id}: {n} nodes", interruptOnCancel=True)
                sc.parallelize(range(n), n).barrier().mapPartitions(
                    functools.partial(run_partition, spec, first)).collect()
            except BaseException as e:  # noqa: BLE001 - reported by the waits on the driver
                if self.error is None:
                    self.error = e
            finally:
                self._spark_done.set()
                self._on_end(self)

        self._thread = InheritableThread(spark_main, daemon=True, name=f"{self.job_id}-spark")
        self._thread.start()

    def failure_text(self) -> str:
        if self._driver_error is not None:
            return f"the launcher of a node on the driver (driver_ps_nodes) failed: {self._driver_error}"
        return f"the Spark job running the {self.num_nodes - self.driver_nodes} nodes failed: " \
               f"{spark_error_summary(self.error, self._sc)}"

    def cancel(self) -> None:
        """Cancels the job group (its tasks are interrupted); idempotent.  Nodes on the
        driver end when the coordinator aborts the job, which callers do first."""
        if self.cancelled or self._thread is None or self.done:
            return
        self.cancelled = True
        try:
            self._sc.cancelJobGroup(self.job_id)
        except Exception:  # noqa: BLE001 - the SparkContext may be gone already
            pass

    def wait(self, timeout: float) -> bool:
        """Waits up to `timeout` seconds for the Spark job and the nodes on the driver to end;
        whether they did."""
        if self._thread is None:
            return True
        deadline = time.monotonic() + timeout
        if not self._spark_done.wait(timeout):
            return False
        for t in self._driver_threads:
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
