"""The one seam between Ember's driver and Spark: what the driver asks of Spark, answered by a
classic session (a SparkSession or SparkContext, over Py4J) or by a Spark Connect session
(``SparkSession.builder.remote(...)``: no SparkContext, no RDD, no JVM in this process).

Everything else in the driver holds a :class:`SparkSide` and never asks which kind it is,
except where only one kind has the thing at all (an RDD given by the user; Spark's progress
bar).  The questions:

* settings (``conf``), the master, the application id, the executors' Python;
* task slots (how many tasks can run at once: a barrier stage needs one per node);
* running ``n`` tasks, barrier or not, under a cancellable group: the classic form is
  ``sc.parallelize(range(n), n).barrier().mapPartitionsWithIndex(...)`` under ``setJobGroup``;
  the Connect form is ``spark.range(0, n, 1, n).mapInArrow(..., barrier=True)`` under a tag
  (``addTag`` / ``interruptTag``), ended by ``collect()`` as Connect's barrier jobs must be;
* the Hadoop file system settings and where executors can reach this process (the
  coordinator's address).
"""
from __future__ import annotations

import abc
import contextlib
import os
import re
import threading
from typing import Any, Callable, ContextManager, Iterator, List, Optional, Tuple

TaskFn = Callable[[int], Iterator[str]]  # a task's body: its partition index -> lines of text

# The spark.submit.pyFiles each Connect session (by id) was given as artifacts (ConnectSide).
_ADDED_PY_FILES: dict = {}
_ADDED_LOCK = threading.Lock()


def is_connect_session(spark: Any) -> bool:
    """Whether `spark` is a Spark Connect session (pyspark.sql.connect), without importing
    Connect's modules (they need grpc)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def spark_side(spark: Any) -> "SparkSide":
    """The SparkSide of a SparkSession (classic or Connect), a SparkContext, or a SparkSide."""
    if isinstance(spark, SparkSide):
        return spark
    if is_connect_session(spark):
        return ConnectSide(spark)
    sc = getattr(spark, "sparkContext", spark)
    if not hasattr(sc, "_jsc"):
        raise TypeError(f"Ember needs a SparkSession (classic or Spark Connect) or a SparkContext, "
                        f"got {type(spark).__name__}")
    return ClassicSide(sc)


def local_master_slots(master: str, cpus: Optional[int]) -> Optional[int]:
    """Task slots of a local master (``local``, ``local[N]``, ``local[N,F]``; ``local[*]``:
    `cpus`, the CPUs of the host Spark runs on, None if not known); None for any other master."""
    if master == "local":
        return 1
    m = re.fullmatch(r"local\[(\d+|\*)(?:,\s*\d+)?\]", master)
    if m is None:
        return None
    return cpus if m.group(1) == "*" else int(m.group(1))


class SparkSide(abc.ABC):
    """What the driver asks of Spark (see the module doc); ClassicSide and ConnectSide answer.
    Thread-safe."""

    connect = False

    @property
    @abc.abstractmethod
    def master(self) -> str:
        """The application's master URL."""

    @property
    @abc.abstractmethod
    def app_id(self) -> str:
        """The application's id."""

    @abc.abstractmethod
    def conf(self, key: str, default: Optional[str] = None) -> Optional[str]:
        """The application's setting `key`, or `default`."""

    @property
    @abc.abstractmethod
    def python_exec(self) -> str:
        """The Python the executors run (PYSPARK_PYTHON as Spark resolves it)."""

    @property
    def is_local(self) -> bool:
        return str(self.master).startswith("local")

    @abc.abstractmethod
    def default_parallelism(self, fresh: bool = False) -> int:
        """The application's default parallelism (`fresh`: not a recent answer kept)."""

    @abc.abstractmethod
    def task_slots(self, profile: Any = None, fresh: bool = False) -> Optional[int]:
        """How many tasks can run at once (under `profile`, a ResourceProfile); None where
        Spark does not say (Connect under a profile).  `fresh`: ask now, not a recent answer
        kept (a wait for executors to register)."""

    @abc.abstractmethod
    def run_tasks(self, n: int, fn: TaskFn, group: str, description: str, barrier: bool = False,
                  profile: Any = None) -> List[str]:
        """Runs `n` tasks, task p yielding the lines of ``fn(p)``, as one Spark job (a barrier
        stage if `barrier`; under `profile` if given) in `group`, which :meth:`cancel` ends;
        returns every task's lines.  Blocks until the job ends; raises what it raised.  `fn`
        is pickled by value where it is a closure: it should import what it needs."""

    @abc.abstractmethod
    def job_group(self, group: str, description: str) -> ContextManager[None]:
        """The Spark jobs the calling thread starts in the block run in `group` (cancel()
        ends them); other threads' jobs are not affected."""

    @abc.abstractmethod
    def cancel(self, group: str) -> None:
        """Cancels the jobs of `group` (their tasks are interrupted).  Never raises."""

    @abc.abstractmethod
    def hadoop_fs_conf(self) -> Tuple[str, str]:
        """(fs.defaultFS, the NameNode's WebHDFS host:port or "")."""

    @abc.abstractmethod
    def optimized_plan(self, df: Any) -> str:
        """`df`'s optimized logical plan as Spark prints it (a tree, one operator a line)."""

    @abc.abstractmethod
    def coordinator_host(self) -> str:
        """The address of this process that executors can reach (no coordinator_host set)."""

    def coordinator_bind(self) -> Optional[str]:
        """Where a server of this process listens by default (None: on coordinator_host())."""
        return None

    def executor_gpus(self) -> Optional[List[Tuple[str, str, List[str]]]]:
        """(executor id, host:port, GPU addresses) of every executor, or None where Spark does
        not tell this process (Connect)."""
        return None

    def driver_gpus(self) -> List[str]:
        """The GPU addresses Spark gave the driver (local mode hands them to the nodes)."""
        return []

    def register_profile(self, profile: Any) -> None:
        """Makes `profile` (a pyspark ResourceProfile) known to Spark before its first stage."""

    def thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        """A daemon thread (not started) that may start Spark jobs of its own."""
        return threading.Thread(target=target, daemon=True, name=name)


class ClassicSide(SparkSide):
    """A SparkContext, through Py4J."""

    def __init__(self, sc: Any):
        self.sc = sc

    @property
    def master(self) -> str:
        return str(self.sc.master)

    @property
    def app_id(self) -> str:
        return str(self.sc.applicationId)

    def conf(self, key: str, default: Optional[str] = None) -> Optional[str]:
        return self.sc.getConf().get(key, default)

    @property
    def python_exec(self) -> str:
        return getattr(self.sc, "pythonExec", None) or "python3"

    def default_parallelism(self, fresh: bool = False) -> int:
        return int(self.sc.defaultParallelism)

    def task_slots(self, profile: Any = None, fresh: bool = False) -> Optional[int]:
        def ask() -> int:
            jsc = self.sc._jsc.sc()
            java = profile._java_resource_profile if profile is not None else \
                jsc.resourceProfileManager().defaultResourceProfile()
            return int(jsc.maxNumConcurrentTasks(java))

        return _retrying_a_reset_gateway(ask, "the task slot count")

    def run_tasks(self, n: int, fn: TaskFn, group: str, description: str, barrier: bool = False,
                  profile: Any = None) -> List[str]:
        rdd = self.sc.parallelize(range(n), n)
        body = rdd.barrier() if barrier else rdd
        rdd = body.mapPartitionsWithIndex(lambda p, _rows: fn(p))
        if profile is not None:
            rdd = rdd.withResources(profile)
        with self.job_group(group, description):
            return [str(line) for line in rdd.collect()]

    @contextlib.contextmanager
    def job_group(self, group: str, description: str):
        keys = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
        before = {key: self.sc.getLocalProperty(key) for key in keys}
        self.sc.setJobGroup(group, description, interruptOnCancel=True)
        try:
            yield
        finally:
            for key, value in before.items():
                self.sc.setLocalProperty(key, value)

    def cancel(self, group: str) -> None:
        try:
            self.sc.cancelJobGroup(group)
        except Exception:  # noqa: BLE001 - the SparkContext may be gone already
            pass

    def hadoop_fs_conf(self) -> Tuple[str, str]:
        from ember import _hadoop
        return _hadoop.spark_fs_conf(self.sc)

    def optimized_plan(self, df: Any) -> str:
        return str(df._jdf.queryExecution().optimizedPlan().toString())

    def coordinator_host(self) -> str:
        import socket
        return self.conf("spark.driver.host") or socket.gethostname()

    def coordinator_bind(self) -> Optional[str]:
        return self.conf("spark.driver.bindAddress")

    def executor_gpus(self) -> Optional[List[Tuple[str, str, List[str]]]]:
        out = []
        executors = self.sc._jsc.sc().statusStore().executorList(True)
        for i in range(executors.size()):
            e = executors.apply(i)
            if e.id() == "driver":
                continue
            gpu = e.resources().get("gpu")
            out.append((str(e.id()), str(e.hostPort()), list(gpu.get().addresses()) if gpu.isDefined() else []))
        return out

    def driver_gpus(self) -> List[str]:
        resources = getattr(self.sc, "resources", None) or {}
        return list(resources["gpu"].addresses) if "gpu" in resources else []

    def register_profile(self, profile: Any) -> None:
        self.sc._jsc.sc().resourceProfileManager().addResourceProfile(profile._java_resource_profile)

    def thread(self, target: Callable[[], None], name: str) -> threading.Thread:
        from pyspark import InheritableThread  # PySpark pins threads: the thread's own local properties
        return InheritableThread(target, daemon=True, name=name)


class ConnectSide(SparkSide):
    """A Spark Connect session: DataFrames only, over gRPC; nothing here reaches a JVM."""

    connect = True

    # How long a counted default parallelism is taken as still true: counting it is a Spark job,
    # which would otherwise run before every train() and inference() (their slot check).
    PARALLELISM_TTL_SECS = 60.0

    def __init__(self, spark: Any):
        self.spark = spark
        self._parallelism: Optional[Tuple[float, int]] = None  # (time.monotonic(), the count)

    @property
    def master(self) -> str:
        return str(self.conf("spark.master", "") or "")

    @property
    def app_id(self) -> str:
        return str(self.conf("spark.app.id", "") or "")

    def conf(self, key: str, default: Optional[str] = None) -> Optional[str]:
        value = self.spark.conf.get(key, None)
        return default if value is None else value

    @property
    def python_exec(self) -> str:
        # The session's own setting first (ember pack's Connect form sets it beside addArtifacts).
        return (self.conf("spark.sql.execution.pyspark.python") or self.conf("spark.pyspark.python")
                or self.conf("spark.executorEnv.PYSPARK_PYTHON")
                or "python3 (the Spark Connect server's PYSPARK_PYTHON, else python3)")

    def default_parallelism(self, fresh: bool = False) -> int:
        text = self.conf("spark.default.parallelism")
        if text:
            return int(text)
        slots = local_master_slots(self.master, None)
        if slots is not None:
            return slots
        # spark.range without numPartitions has the application's default parallelism (local[*]:
        # the server's CPUs; a cluster: its executors' cores), which one small job counts.
        import time

        from pyspark.sql import functions as F
        cached = self._parallelism
        if cached is not None and not fresh and time.monotonic() - cached[0] < self.PARALLELISM_TTL_SECS:
            return cached[1]
        n = int(self.spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p")).distinct().count())
        self._parallelism = (time.monotonic(), n)
        return n

    def task_slots(self, profile: Any = None, fresh: bool = False) -> Optional[int]:
        """A local master's slots, or the application's default parallelism (its executors'
        cores) over spark.task.cpus; None under a profile (Connect does not say)."""
        if profile is not None:
            return None
        slots = local_master_slots(self.master, None)
        if slots is not None:
            return slots
        return self.default_parallelism(fresh) // max(1, int(self.conf("spark.task.cpus", "1") or 1))

    def run_tasks(self, n: int, fn: TaskFn, group: str, description: str, barrier: bool = False,
                  profile: Any = None) -> List[str]:
        def arrow_task(batches):
            import pyarrow as pa
            from pyspark import TaskContext
            for _ in batches:  # the partition's one row of spark.range: nothing to read
                pass
            lines = [str(line) for line in fn(TaskContext.get().partitionId())]
            yield pa.RecordBatch.from_pydict({"line": lines}, schema=pa.schema([("line", pa.string())]))

        self._add_submit_py_files()
        kwargs = {"barrier": True} if barrier else {}
        if profile is not None:
            kwargs["profile"] = profile
        df = self.spark.range(0, n, 1, n).mapInArrow(arrow_task, "line string", **kwargs)
        with self.job_group(group, description):
            return [row.line for row in df.collect()]  # barrier jobs must end in collect()

    def _add_submit_py_files(self) -> None:
        """The application's ``spark.submit.pyFiles`` (e.g. SPARK_API_MODE=connect with a
        builder's ``.config("spark.submit.pyFiles", ...)``, as examples/fashion_mnist/main.py
        sets it) reach a classic session's Python workers but not a Connect session's, whose
        workers see only the session's own artifacts: those of the files this client has are
        added to the session as Python artifacts (``addArtifacts(pyfile=True)``), once per session."""
        files = [f.strip() for f in (self.conf("spark.submit.pyFiles") or "").split(",") if f.strip()]
        if not files:
            return
        with _ADDED_LOCK:
            added = _ADDED_PY_FILES.setdefault(str(self.spark.session_id), set())
            for f in files:
                path = f[len("file:"):] if f.startswith("file:") else f
                if f in added or "://" in path or not os.path.isfile(path):
                    continue
                self.spark.addArtifacts(path, pyfile=True)
                added.add(f)

    @contextlib.contextmanager
    def job_group(self, group: str, description: str):
        self.spark.addTag(group)  # the calling thread's operations only
        try:
            yield
        finally:
            self.spark.removeTag(group)

    def cancel(self, group: str) -> None:
        try:
            self.spark.interruptTag(group)
        except Exception:  # noqa: BLE001 - the session may be gone already
            pass

    def optimized_plan(self, df: Any) -> str:
        text = df._explain_string(extended=True)  # the server's explain: its optimized section
        head = "== Optimized Logical Plan ==\n"
        if head not in text:
            raise ValueError("the server's explain has no optimized logical plan")
        return text.split(head, 1)[1].split("\n== ", 1)[0]

    def hadoop_fs_conf(self) -> Tuple[str, str]:
        from ember import _hadoop
        default_fs = self.conf("spark.hadoop.fs.defaultFS") or "file:///"
        return default_fs, _hadoop.namenode_http_address(default_fs, lambda key: self.conf("spark.hadoop." + key))

    def coordinator_host(self) -> str:
        """This client's address on the route to the Spark driver's host (the Connect server's
        application, whose executors reach their driver there)."""
        from ember._net import routable_address
        driver = self.conf("spark.driver.host") or getattr(self.spark.client, "host", None) or "localhost"
        return routable_address(driver, int(self.conf("spark.driver.port", "7077") or 7077))

    def register_profile(self, profile: Any) -> None:
        """Creates `profile` on the server now.  pyspark does it when the profile's id is first
        asked, with the asking thread's active session, and the nodes' stage runs on a thread of
        the gang's that has none ("SparkSession should be initialized before ResourceProfile
        creation"): so it is asked here, in this thread, with this session made active for it."""
        local = getattr(type(self.spark), "_active_session", None)  # pyspark's thread-local slot
        before = getattr(local, "session", None)
        if local is not None:
            local.session = self.spark
        try:
            profile.id
        finally:
            if local is not None:
                local.session = before


def _retrying_a_reset_gateway(call: Callable[[], Any], what: str) -> Any:
    """`call()` (a read-only question to Spark's JVM), asked once more if Py4J's connection of
    this thread was reset under it (seen once in a full test run: 'Connection reset by peer' on
    the driver's main thread, idle while the nodes' job ran on another; Py4J opens a new
    connection for the next call).  An error the JVM raised is not retried."""
    from py4j.protocol import Py4JError, Py4JJavaError

    try:
        return call()
    except Py4JJavaError:
        raise
    except Py4JError as e:
        import logging
        logging.getLogger("ember").warning("asking Spark for %s failed in Py4J (%s); asking once more", what, e)
        return call()
