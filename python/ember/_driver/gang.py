"""The gang: a job's nodes on Spark as the driver holds them, from start to stop.

A gang is one launch of every node of a job: a CoordinatorServer (C++, authenticated with a
fresh 32-byte secret), the Spark barrier stage whose tasks run the nodes' launchers (a daemon
thread under a job group of its own: spark_job.NodesJob), and the watcher draining the
coordinator's events.  ``Cluster`` holds one Gang for the job's life; the Gang replaces its
coordinator, barrier stage and watcher on each restart (``max_restarts``), so the job's verbs
see one object throughout.

Every wait here blocks inside the C++ coordinator with a deadline that names what was awaited,
and returns the moment its event happens, a node fails, or the job is aborted (the thread
hosting the Spark job aborts the coordinator when that job fails), never on a polling tick.
On a node failure the gang aborts the job (the coordinator tells every node to stop), cancels
the Spark job group and calls ``on_abort`` (the feed's cancel: its tasks may be blocked sending
to a node that is gone).
"""
from __future__ import annotations

import atexit
import dataclasses
import json
import os
import secrets
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

from ember import _ember, config
from ember._driver import relay
from ember._driver.console import Console
from ember._driver.gpus import check_nodes as check_gpu_nodes
from ember._driver.spark_job import NodesJob, spark_failure_reason
from ember._driver.watcher import Watcher
from ember._launcher.task import NodeSpec
from ember._names import SUPPORT_ROLES, TENSORBOARD_URL_KEY, WORKER_ROLES
from ember.errors import Aborted, ClusterError, DeadlineExceeded, NodeError
from ember.input_mode import InputMode

_FOREVER = 10 * 365 * 86400.0  # seconds: "no deadline" for the core's waits
_STOP_TIMEOUT = 30.0  # seconds stopped ps/evaluator nodes get to report done (besides kill grace)
_open_gangs: "weakref.WeakSet[Gang]" = weakref.WeakSet()


@dataclass(frozen=True)
class Restart:
    """One relaunch of a job's nodes after a node failed (``Cluster.restarts``).

    Attributes:
        node: the failed node, "role:index".
        host: where it ran.
        reason: the first line of its error ("was lost" for a node whose heartbeat stopped).
        failed_at: when the driver learnt of the failure (time.time()).
        stop_secs: seconds to stop the failed gang (abort, Spark job ended, coordinator closed).
        relaunch_secs: seconds from then until every node of the new gang registered; None
            when the new gang never did (``error`` says why).
        node_job_id: the new gang's job id (EMBER_JOB_ID of its processes).
        error: why the new gang did not start (Spark's reason first), or None.
    """
    node: str
    host: str
    reason: str
    failed_at: float
    stop_secs: float
    relaunch_secs: Optional[float]
    node_job_id: str
    error: Optional[str] = None


@dataclass(frozen=True)
class Launch:
    """What every gang of a job starts from: the first one and each restart's.

    Attributes:
        main_fun: the nodes' ``main_fun`` (a callable), or a program's argv (a list of str).
        args: main_fun's args (None for a program).
        tensorboard: start TensorBoard beside the chief (or worker 0).
        reservation_timeout: seconds for every node to register.
        heartbeat_timeout: seconds of silence after which a node counts as lost.
        connect_timeout: seconds a node may take to reach the coordinator.
        gpus_per_node: GPUs each node of the barrier stage asks (0: none; 1/k: shared).
        profile: the barrier stage's pyspark ResourceProfile, or None (ember._driver.gpus).
        local_gpus: local mode: the driver's GPUs the nodes share out, or None.
        tolerated_worker_losses: "worker" nodes the job may lose and go on (min_workers).
        replace_lost_workers: how many replacement nodes the driver may start for lost workers.
    """
    main_fun: Any
    args: Any
    tensorboard: bool
    reservation_timeout: float
    heartbeat_timeout: float
    connect_timeout: float
    gpus_per_node: float = 0.0
    profile: Any = None
    local_gpus: Optional[List[str]] = None
    tolerated_worker_losses: int = 0
    replace_lost_workers: int = 0


def _failure_reason(failure: NodeError) -> str:
    """One line for why a node failed: a traceback's last line (the exception), else the
    launcher's first (how the process ended: "... ended with SIGKILL ...")."""
    if failure.lost:
        return "lost: no heartbeat"
    lines = [line for line in failure.remote_traceback.strip().splitlines() if line.strip()] or ["failed"]
    line = lines[-1] if lines[0].startswith("Traceback") else lines[0].split("; its last stderr lines:")[0]
    return line.strip()[:300]


class Gang:
    """A job's nodes: their coordinator, the Spark barrier stage hosting them, the watcher of
    their events; started by :meth:`start`, relaunched by :meth:`recover`, ended by
    :meth:`close`.  Waits and ``close`` may be called from any thread; ``start`` and
    ``recover`` from one thread at a time (the job's verbs).

    Attributes (read by ``Cluster``'s properties of the same names):
        node_job_id: the current gang's job id: ``job_id``, then ``<job_id>-r<k>`` after
            restart k.
        server: the current CoordinatorServer (None before the first start).
        secret: the current gang's 32-byte secret.
        coordinator_address: "host:port" the nodes connect to.
        cluster_spec: ``{role: ["host:port", ...]}`` once every node registered.
        startup_secs: seconds from the start to every node registered.
        tensorboard_url: where TensorBoard serves, if asked for.
        watcher: the current gang's Watcher (its first failure).
        job: the current gang's Spark job (NodesJob).
        restarts: the relaunches so far.
        closed: whether :meth:`close` ran.
    """

    def __init__(self, side, job_id: str, num_nodes: int, layout, input_mode: InputMode, log_dir: Optional[str],
                 console: Console, launch: Launch, *, max_restarts: int = 0, driver_nodes: int = 0,
                 on_abort: Callable[[], None] = lambda: None):
        self._side = side  # ember._driver.spark_side.SparkSide
        self.job_id = job_id
        self.num_nodes = num_nodes
        self.layout = layout
        self.input_mode = InputMode(input_mode)
        self.log_dir = log_dir
        self._console = console
        self._launch = launch
        self._max_restarts = int(max_restarts)
        self._driver_nodes = driver_nodes  # nodes whose launchers run on the driver (driver_ps_nodes)
        self._on_abort = on_abort
        self.node_job_id = job_id
        self.server = None
        self.secret = b""
        self.coordinator_address: Optional[str] = None
        self.endpoint: Optional[relay.Endpoint] = None  # where the nodes dial: this process or a relay
        self.cluster_spec: dict = {}
        self.startup_secs: Optional[float] = None
        self.tensorboard_url: Optional[str] = None
        self.watcher: Optional[Watcher] = None  # node events and failures
        self.job: Optional[NodesJob] = None      # the Spark job hosting the nodes
        self.restarts: List[Restart] = []
        self._replacements = 0  # replacement nodes started (Launch.replace_lost_workers)
        self._spec: Optional[NodeSpec] = None
        self.closed = False
        self._lock = threading.Lock()
        _open_gangs.add(self)

    # -- start-up ------------------------------------------------------------

    def start(self, started: float) -> None:
        """Starts a gang: a coordinator, the Spark barrier stage of the nodes; returns once
        every node registered (`started`: time.monotonic() the reservation_timeout counts
        from).  Called again by recover for each restart."""
        from pyspark import cloudpickle

        side, launch = self._side, self._launch
        argv = list(launch.main_fun) if isinstance(launch.main_fun, list) else None  # see cluster._node_program
        try:
            payload = b"" if argv else cloudpickle.dumps((launch.main_fun, launch.args))
        except Exception as e:  # noqa: BLE001 - any pickling failure means the same to the user
            raise TypeError(f"Cluster.run cannot send main_fun and args to the nodes: they do not "
                            f"pickle ({type(e).__name__}: {e})") from e
        self.secret = secrets.token_bytes(32)
        how = relay.placement(side, config.get("coordinator_placement", side))
        host = config.get("coordinator_host", side) or side.coordinator_host()
        # Listen where the nodes are told to connect (docs/network.md), as Spark's driver does;
        # only the relay's agent, in this process, connects when the nodes dial a relay.
        bind = (config.get("coordinator_bind", side) or side.coordinator_bind()
                or ("127.0.0.1" if how == "job" else host))
        self.server = _ember.CoordinatorServer.start(
            self.secret, self.layout, bind_host=bind, port=config.get("coordinator_port", side),
            heartbeat_timeout=float(launch.heartbeat_timeout),
            tolerated_worker_losses=int(launch.tolerated_worker_losses))
        local = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(bind, bind)
        self.endpoint = relay.place(side, how, self.secret, host, self.server.port, local,
                                    self.node_job_id, config.get("node_bind", side) or "",
                                    float(launch.connect_timeout))
        if self.endpoint.relayed:
            self._console.info(f"the nodes reach the coordinator through a relay {self.endpoint.where} "
                               f"(spark.ember.coordinator.placement)")
        host, port = self.endpoint.host, self.endpoint.port
        self.coordinator_address = f"{host}:{port}"
        default_fs, hdfs_http_address = side.hadoop_fs_conf()
        spec = NodeSpec(
            job_id=self.node_job_id, coordinator_host=host, coordinator_port=port,
            secret=self.secret, payload=payload,
            num_nodes=self.num_nodes, default_fs=default_fs, hdfs_http_address=hdfs_http_address,
            working_dir=os.getcwd(),
            log_dir=self.log_dir, tensorboard=launch.tensorboard, input_mode=int(self.input_mode),
            reservation_timeout=float(launch.reservation_timeout), connect_timeout=float(launch.connect_timeout),
            kill_grace_secs=float(config.get("kill_grace_secs", side)),
            feed_ring_bytes=int(config.get("feed_ring_bytes", side)),
            node_bind=config.get("node_bind", side) or "",
            gpus_per_node=float(launch.gpus_per_node), local_gpus=launch.local_gpus,
            tolerated_worker_losses=int(launch.tolerated_worker_losses),
            # In local mode the tasks' stderr is this process's, except under Spark Connect.
            echo_logs=side.connect or not side.is_local, argv=argv)

        self._spec = spec
        self.watcher = Watcher(self.server, self._console, self.node_job_id, self._on_node_failure,
                               on_departed=self._on_worker_departed)
        self.watcher.start()
        self.job = NodesJob(side, self.node_job_id, self.num_nodes, self._wake_waits_after_spark,
                            driver_nodes=self._driver_nodes, profile=launch.profile)
        self.job.start(spec)
        self._wait_for_registration(started, launch.reservation_timeout)
        self.startup_secs = time.monotonic() - started
        self.cluster_spec = json.loads(self.server.cluster_spec_json())
        self._console.info(f"all {self.num_nodes} nodes registered in {self.startup_secs:.1f}s "
                           f"(job {self.node_job_id}, coordinator {self.coordinator_address}"
                           f"{', from a Spark Connect session' if side.connect else ''})")
        if launch.gpus_per_node > 0:
            self._check_gpus(launch.gpus_per_node)
        if launch.tensorboard:
            self._fetch_tensorboard_url()

    def _check_gpus(self, amount: float) -> None:
        """Every node of the barrier stage has its GPUs, and no two hold one (ember._driver.gpus);
        the console names each node's GPUs."""
        ids = list(range(self._driver_nodes, self.num_nodes))
        labels = {}
        for e in ids:
            role = _ember.assign_role(self.layout, e)
            labels[e] = f"{role.job_name}:{role.task_index} (executor {e})"
        for line in check_gpu_nodes(self.server, ids, labels, amount):
            self._console.info(line)

    def _wait_for_registration(self, started: float, reservation_timeout: float) -> None:
        # One blocking wait in the core: it returns the moment the last node registers, a node
        # fails, or the Spark job fails (the Spark thread aborts the coordinator then).
        try:
            self.server.wait_for_registration(max(0.0, started + reservation_timeout - time.monotonic()))
        except DeadlineExceeded as e:
            raise DeadlineExceeded(
                f"Cluster.run waited {reservation_timeout:g}s (reservation_timeout) for all "
                f"{self.num_nodes} nodes to register: {e}. Look at the executors' logs for "
                f"why a node did not start, check that executors can reach the driver at "
                f"{self.coordinator_address}, or raise reservation_timeout.") from None
        except Aborted:
            self.raise_if_failed(spark_must_run=True)
            self.watcher.raise_failure_or(ClusterError, "the job was aborted before every node registered")

    def _wake_waits_after_spark(self, job: NodesJob) -> None:
        """The Spark job hosting the nodes ended: when that was a failure (or it ended before
        every node registered), abort the coordinator so every wait on the driver (all of them
        block in the core) returns at once; they then raise the Spark job's error."""
        server = self.server
        if server is None or self.closed or job is not self.job:  # an earlier gang's job
            return
        if job.error is not None and not job.cancelled:
            server.abort(job.failure_text()[:2000])
            self._on_abort()
        elif not server.cluster_spec_json():  # the coordinator never saw every node register
            server.abort(f"the Spark job running the {self.num_nodes} nodes ended before every node registered")

    def _fetch_tensorboard_url(self, timeout: float = 60.0) -> None:
        # The node that runs TensorBoard stores its URL right after registration.
        try:
            value = self.server.wait_for_key(TENSORBOARD_URL_KEY, timeout)
        except DeadlineExceeded:
            self._console.info(f"TensorBoard did not report its address within {timeout:g}s")
            return
        except Aborted:
            self.raise_if_failed(spark_must_run=False)
            self.watcher.raise_failure_or(ClusterError, "the job was aborted before TensorBoard started")
        self.tensorboard_url = value.decode()
        self._console.info(f"TensorBoard: {self.tensorboard_url}")

    @property
    def feed_ring_bytes(self) -> int:
        """The size of each node's feed ring, as the nodes were launched with it."""
        if self._spec is None:
            raise RuntimeError("the gang has not started: its nodes have no feed ring yet")
        return self._spec.feed_ring_bytes

    # -- watching --------------------------------------------------------------

    def nodes(self) -> List[Any]:
        """Snapshot of the registered nodes (role, address, state, error) from the coordinator."""
        return list(self.server.nodes()) if self.server is not None else []

    def node_ended(self, executor_id: int, wait: float = 5.0) -> bool:
        """Whether node `executor_id` returned from main_fun, waiting up to `wait` seconds for
        the coordinator to hear of it (a launcher closes its feed server and reports the end at
        about the same time).  A failed node is not "ended": the caller raises, and train()
        turns that into the node's NodeError."""
        try:
            info = self.server.wait_for_node_end(executor_id, wait)
        except (DeadlineExceeded, Aborted):
            return False
        return info.state == _ember.NodeInfo.State.DONE

    def _on_node_failure(self, label: str) -> None:
        """The watcher saw the first node failure: stop the Spark job (the coordinator has
        already told every node to abort)."""
        if not self.closed:
            self._console.info(f"{label} failed; stopping the job")
            self._on_abort()
            if self.job is not None:
                self.job.cancel()

    def _on_worker_departed(self, executor_id: int, label: str) -> None:
        """A worker the job goes on without (min_workers): start a replacement node for it while
        Cluster.run's replace_lost_workers allows (each replacement counts, so a node that keeps
        failing is not replaced for ever)."""
        if self.closed or self.job is None or self._replacements >= self._launch.replace_lost_workers:
            return
        self._replacements += 1
        job, k, n = self.job, self._replacements, self._launch.replace_lost_workers

        def on_error(e: BaseException) -> None:
            self._console.info(f"the replacement for {label} did not run: {spark_failure_reason(e) or e}")

        self._console.info(f"starting a replacement for {label} (replacement {k} of {n})")
        job.replace(self._spec, executor_id, on_error)

    def raise_if_failed(self, spark_must_run: bool) -> None:
        """Raises the first node failure, or the Spark job's, if there is one."""
        if self.watcher is not None and self.watcher.failure is not None:
            relay_error = self.endpoint.relay_error() if self.endpoint is not None else None
            if relay_error and relay_error not in getattr(self.watcher.failure, "__notes__", ()):
                self.watcher.failure.add_note(relay_error)
            raise self.watcher.failure
        if self.job is None or not self.job.done:
            return
        error = self.job.error
        if error is None and not spark_must_run:
            return
        failure = self.watcher.known_failure(wait=1.0)
        if failure is not None:
            raise failure
        if error is None:
            raise ClusterError(f"the Spark job running the {self.num_nodes} nodes ended before "
                               f"every node registered")
        raise ClusterError(self.job.failure_text()) from error

    def wait_nodes(self, roles: Sequence[str], deadline: Optional[float],
                   what: Callable[[], str], advice: str) -> None:
        """One blocking wait in the core until every node of `roles` is done; it returns at
        once when a node fails or the job is aborted (the Spark thread aborts it when the
        Spark job fails)."""
        self.raise_if_failed(spark_must_run=False)
        left = _FOREVER if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            self.server.wait_for_nodes(list(roles), left)
        except DeadlineExceeded as e:
            raise DeadlineExceeded(f"{what()}: {e}. {advice}.") from None
        except Aborted as e:
            self.raise_if_failed(spark_must_run=False)
            self.watcher.raise_failure_or(ClusterError, f"the job was aborted: {e}")

    def finish(self, grace_secs: float, timeout: Optional[float], end_feed: Optional[Callable[[], None]]) -> None:
        """``Cluster.shutdown``'s waits: every training node returned from main_fun (each
        failure restarts the gang while restarts are left; `end_feed`, if given, runs before
        each wait while no node failed), `grace_secs` more of watching for failures, then the
        ps/evaluator nodes stopped and the Spark job joined.  Raises as shutdown documents."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                if end_feed is not None and self.watcher.failure is None:
                    end_feed()  # TFoS semantics: the feed ends at shutdown; DataFeed.should_stop() turns True
                self.wait_nodes(
                    list(WORKER_ROLES), deadline,
                    lambda: (f"Cluster.shutdown waited {timeout:g}s (timeout) for the training nodes "
                             f"(chief/master/worker) to return from main_fun"),
                    "Pass a larger timeout (or None), or look at the nodes' output for why they "
                    "have not finished")
                break
            except NodeError as failure:
                self.recover(failure)  # raises when no restart is left
        if grace_secs > 0:  # watch for late failures (e.g. an evaluator's) for grace_secs
            try:
                self.server.wait_for_nodes([], float(grace_secs))
            except DeadlineExceeded:
                pass  # ps/evaluator nodes still run: expected, they are stopped next
            except Aborted as e:
                self.watcher.raise_failure_or(ClusterError, f"the job was aborted: {e}")
        self.raise_if_failed(spark_must_run=False)
        self.server.stop_nodes(list(SUPPORT_ROLES))
        stop_wait = _STOP_TIMEOUT + 2 * config.get("kill_grace_secs", self._side)
        self.wait_nodes(
            [], time.monotonic() + stop_wait,
            lambda: f"Cluster.shutdown waited {stop_wait:g}s for the stopped ps/evaluator nodes to end",
            "Look at those nodes' output; their launcher ends them with SIGTERM then SIGKILL")
        self.job.join(stop_wait)

    # -- restarts ----------------------------------------------------------------

    def recover(self, failure: NodeError) -> None:
        """Relaunches every node after `failure`, or raises it when no restart is left (with
        the earlier restarts' reasons attached)."""
        label = f"{failure.job_name}:{failure.task_index}"
        reason = _failure_reason(failure)
        if len(self.restarts) >= self._max_restarts or self.closed:
            if self.restarts:
                failure.add_note("earlier restarts of this job: " + "; ".join(
                    f"{r.node} on {r.host}: {r.reason}" for r in self.restarts))
            raise failure
        k = len(self.restarts) + 1
        self._console.info(f"node {label} on {failure.host} failed ({reason}); restarting all "
                           f"{self.num_nodes} nodes (restart {k} of {self._max_restarts})")
        failed_at = time.time()
        t0 = time.monotonic()
        self.stop(abort_reason=f"restart {k}: node {label} failed")
        t1 = time.monotonic()
        self.node_job_id = f"{self.job_id}-r{k}"
        # Recorded before the new gang starts: a restart that fails to start still happened.
        self.restarts.append(Restart(node=label, host=failure.host, reason=reason, failed_at=failed_at,
                                     stop_secs=t1 - t0, relaunch_secs=None, node_job_id=self.node_job_id))
        try:
            self.start(started=t1)
        except Exception as e:  # noqa: BLE001 - every failure to start means the same here
            raise self._restart_failed(failure, k, e) from e
        t2 = time.monotonic()
        self.restarts[-1] = dataclasses.replace(self.restarts[-1], relaunch_secs=t2 - t1)
        self._console.info(f"restart {k}: the failed gang stopped in {t1 - t0:.1f}s, the new one "
                           f"({self.node_job_id}) registered {t2 - t1:.1f}s later; nodes resume from "
                           f"their newest checkpoint")

    def _restart_failed(self, failure: NodeError, k: int, error: Exception) -> NodeError:
        """The error for restart `k` (after `failure`) whose new gang did not start: the failure
        that caused the restart first (e.g. the node on a partitioned host), then what Spark
        said of the new gang's job, then the new gang's own error; recorded in ``restarts``."""
        job = self.job
        if job is not None and isinstance(error, NodeError) and error.lost:
            # A node of the new gang whose connection dropped usually went with its Spark task:
            # wait briefly for the Spark job's own reason (e.g. its executor's host was lost).
            job.wait(10.0)
        spark = spark_failure_reason(job.error) if job is not None and job.error is not None else None
        new_gang = str(error).strip()
        why = (f"Spark failed the new gang's job: {spark}; then {new_gang}" if spark else new_gang)
        self.restarts[-1] = dataclasses.replace(self.restarts[-1], error=why[:2000])
        label = f"{failure.job_name}:{failure.task_index}"
        raised = NodeError(failure.job_name, failure.task_index, failure.executor_id, failure.host,
                           failure.remote_traceback, lost=failure.lost,
                           detail=f"restart {k} of {self._max_restarts} (after node {label} on host {failure.host} "
                                  f"{'was lost' if failure.lost else 'failed'}) did not start: {why}")
        if len(self.restarts) > 1:
            raised.add_note("earlier restarts of this job: " + "; ".join(
                f"{r.node} on {r.host}: {r.reason}" for r in self.restarts[:-1]))
        return raised

    # -- tear-down ---------------------------------------------------------------

    def stop(self, abort_reason: Optional[str] = None) -> None:
        """Ends the current gang (coordinator, Spark stage, watcher); aborts it if
        `abort_reason`.  The Gang stays open (a restart starts the next one)."""
        try:
            if abort_reason is not None:
                if self.server is not None:
                    self.server.abort(abort_reason)
                self._on_abort()
                if self.job is not None:
                    self.job.cancel()
            if self.job is not None:
                # Give the launchers time to end their nodes while the coordinator still serves.
                self.job.wait(15.0 + 2 * float(config.get("kill_grace_secs", self._side)))
        finally:
            if self.watcher is not None:
                self.watcher.stop(timeout=5.0)
            self._console.clear_progress()
            if self.server is not None:
                self.server.close()
            if self.endpoint is not None:
                self.endpoint.close()

    def close(self, abort_reason: Optional[str] = None) -> None:
        """Ends the job's nodes and releases everything; idempotent.  Aborts them if `abort_reason`."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        try:
            self.stop(abort_reason)
        finally:
            _open_gangs.discard(self)


@atexit.register
def _abort_open_gangs() -> None:
    for gang in list(_open_gangs):
        gang.close(abort_reason="the driver program exited without Cluster.shutdown()")
