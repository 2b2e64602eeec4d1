"""Cluster: start a job's nodes on Spark, watch them, shut them down (TFoS's TFCluster).

How a job runs:

* The driver starts a CoordinatorServer (C++, authenticated with a fresh
  32-byte secret) and launches one Spark barrier task per node, in a daemon
  thread under a job group of its own.  Each task runs ember._launcher.task, which
  registers its node, starts ``main_fun(args, ctx)`` in a child process and
  reports how it ended.
* A driver thread drains the coordinator's events: node output lines,
  registrations, progress reports, failures.
* Every wait on the driver blocks inside the C++ coordinator with a deadline
  that names what was awaited, and returns the moment its event happens, a
  node fails, or the job is aborted (the thread hosting the Spark job aborts
  the coordinator when that job fails), never on a polling tick.
* On any failure the driver aborts the job (the coordinator tells every node
  to stop) and cancels the Spark job group, then raises, or, with
  ``max_restarts``, relaunches every node as a new gang (a new coordinator and
  barrier stage, the same roles) and goes on waiting or feeding; the nodes
  restore their newest checkpoint themselves (ember.keras.restore_latest,
  ember.torch.load_latest).

The gang's lifecycle (coordinator, barrier job, watcher; start, waits, restarts,
tear-down) is ember._driver.gang.Gang's; Cluster keeps the user's verbs and
delegates to it.
"""
from __future__ import annotations

import os
import threading
import time
import uuid
import weakref
from typing import Any, Callable, List, Optional, Sequence, Union

from ember import _ember, config
from ember._driver import feed as _feed_driver
from ember._driver.console import Console
from ember._driver.gang import Gang, Launch, Restart  # noqa: F401 - Restart: Cluster.restarts' items
from ember._driver import gpus as _gpus
from ember._driver.spark_job import check_executor_python, check_slots
from ember._driver.spark_side import spark_side
from ember._names import WORKER_ROLES
from ember.errors import ClusterError, NodeError
from ember.input_mode import InputMode


def _node_program(main_fun: Any, args: Any) -> Optional[List[str]]:
    """The argv of a program node (main_fun given as a list/tuple of str), with its
    executable made absolute when it exists on the driver; None for a Python main_fun."""
    if callable(main_fun):
        return None
    if not isinstance(main_fun, (list, tuple)) or not main_fun or \
            not all(isinstance(a, str) for a in main_fun):
        raise TypeError("main_fun must be a callable main_fun(args, ctx) or a program's argv "
                        f"(a non-empty list of str), got {main_fun!r:.200}")
    if args is not None:
        raise TypeError(f"Cluster.run: args={args!r:.100} is for a Python main_fun; pass a "
                        "program's arguments in its argv list")
    argv = list(main_fun)
    if os.path.exists(argv[0]):
        argv[0] = os.path.abspath(argv[0])
    return argv


class Cluster:
    """A running Ember job: its nodes, their coordinator, and the Spark job that hosts them.

    Made by :meth:`Cluster.run`; ended by :meth:`shutdown`.  Usable as a context
    manager: leaving the block shuts the job down (aborting it on an exception).

    Attributes:
        job_id: unique id of the job (nodes carry it as EMBER_JOB_ID).
        num_nodes: how many nodes the job has.
        cluster_spec: ``{role: ["host:port", ...]}`` once every node registered.
        startup_secs: seconds from Cluster.run to every node registered.
        tensorboard_url: where TensorBoard serves, if tensorboard=True.
        input_mode: the job's InputMode.
        restarts: the relaunches so far (:class:`Restart`), with ``max_restarts``.
        node_job_id: the current gang's job id: ``job_id``, then ``<job_id>-r<k>`` after
            restart k (EMBER_JOB_ID of its processes, the prefix of its shared memory).
    """

    def __init__(self, side, num_nodes: int, layout, input_mode: InputMode, log_dir: Optional[str],
                 launch: Launch, *, max_restarts: int = 0, driver_nodes: int = 0):
        self._side = side  # ember._driver.spark_side.SparkSide: classic or Spark Connect
        self.job_id = f"ember-{uuid.uuid4().hex[:12]}"
        self.num_nodes = num_nodes
        self.layout = layout
        self.input_mode = InputMode(input_mode)
        self.log_dir = f"tensorboard_{self.job_id}" if launch.tensorboard and not log_dir else log_dir
        self._console = self._new_console()
        self._lock = threading.Lock()
        self._shutting_down = False
        self._driver_nodes = driver_nodes  # nodes whose launchers run on the driver (driver_ps_nodes)
        # InputMode.SPARK: the epoch loop.  Fed rows' array<float> columns go packed only to Python
        # nodes: a program node (an argv) reads the Arrow batches itself.
        self._feed = _feed_driver.Feed(side, self.job_id, self._console,
                                       pack_rows=not isinstance(launch.main_fun, (list, tuple)))
        self._gang = Gang(side, self.job_id, num_nodes, layout, self.input_mode, self.log_dir, self._console,
                          launch, max_restarts=max_restarts, driver_nodes=driver_nodes, on_abort=self._feed.cancel)

    @staticmethod
    def _new_console() -> Console:
        """The driver's console for this job (ember.parallel's runs have one each)."""
        return Console()

    # -- the gang's state, read through ------------------------------------------

    @property
    def cluster_spec(self) -> dict:
        return self._gang.cluster_spec

    @property
    def startup_secs(self) -> Optional[float]:
        return self._gang.startup_secs

    @property
    def tensorboard_url(self) -> Optional[str]:
        return self._gang.tensorboard_url

    @property
    def coordinator_address(self) -> Optional[str]:
        return self._gang.coordinator_address

    @property
    def restarts(self) -> List[Restart]:
        return self._gang.restarts

    @property
    def node_job_id(self) -> str:
        return self._gang.node_job_id

    # -- public API ----------------------------------------------------------

    @classmethod
    def run(cls, spark: Any, main_fun: Union[Callable[[Any, Any], Any], Sequence[str]], args: Any = None,
            num_executors: Optional[int] = None, num_ps: int = 0, tensorboard: bool = False,
            input_mode: InputMode = InputMode.TENSORFLOW, log_dir: Optional[str] = None,
            master_node: Optional[str] = None, eval_node: bool = False,
            reservation_timeout: float = 600, heartbeat_timeout: float = 30,
            slot_timeout: Optional[float] = None,
            connect_timeout: Optional[float] = None, max_restarts: int = 0,
            driver_ps_nodes: bool = False, gpus_per_node: Optional[float] = None,
            min_workers: Optional[int] = None, replace_lost_workers: int = 0) -> "Cluster":
        """Starts `num_executors` nodes, each running ``main_fun(args, ctx)``, and returns
        once all of them have registered.

        Roles are assigned as in TFoS: the first `num_ps` nodes are "ps", the next one is
        `master_node` ("chief" or "master") if given, the next one "evaluator" if
        `eval_node`, the rest "worker".  Every node gets ``TF_CONFIG``.

        Args:
            spark: a SparkSession, classic or Spark Connect (``SparkSession.builder.remote(...)``),
                or a SparkContext.
            main_fun: called as ``main_fun(args, ctx)`` in a process of its own on every
                node; pickled with cloudpickle.  Or a program's argv, e.g.
                ``["./my_trainer", "--lr=0.1"]``: that executable runs on every node with
                the C++ node API (``include/ember/node.h``) available; a path that exists on
                the driver is made absolute, anything else is run as given (found on the
                executors' PATH).  Exit status 0 means the node is done; any other fails
                the job with the tail of the program's stderr.
            args: passed to main_fun (must pickle); must be None for a program (its
                arguments belong in its argv).
            num_executors: number of nodes; default Spark's default parallelism.  Needs as
                many free task slots: the nodes run as one Spark barrier stage.
            num_ps: number of parameter-server nodes.
            tensorboard: start TensorBoard beside the chief (or worker 0) on `log_dir`.
            input_mode: InputMode.TENSORFLOW (main_fun reads its data) or InputMode.SPARK.
            log_dir: log directory for TensorBoard and ``ctx.log_dir``; resolved like
                ``ctx.absolute_path``.  Default with tensorboard: ``tensorboard_<job id>``.
            master_node: "chief" or "master" to have one such node; None for none.
            eval_node: whether one node is an "evaluator".
            reservation_timeout: seconds to wait for every node to register.
            heartbeat_timeout: seconds of silence after which a node counts as lost.
            slot_timeout: seconds to wait for enough task slots (not in local mode);
                default from ember.config.
            connect_timeout: seconds a node may take to reach the coordinator; default
                from ember.config.
            max_restarts: how many times a node's failure (its process killed or out of
                memory, main_fun raising, its executor lost) relaunches every node instead of
                failing the job.  The driver aborts the gang, waits for its Spark stage to
                end, starts a new one with the same roles, prints why and how long it took
                (``Cluster.restarts``), and goes on: shutdown() waits for the new gang, and
                train() feeds the interrupted epoch again from its start.  Nodes resume from
                their newest checkpoint themselves (``ember.keras.restore_latest``,
                ``ember.torch.load_latest``).  Past `max_restarts` the failure is raised,
                with the earlier restarts' reasons.  Restarts happen while the driver waits
                in shutdown() or train().
            driver_ps_nodes: run the `num_ps` ps nodes in the driver's host, as TFoS did: their
                launchers run on threads of this process (each node still a process of its
                own, ended with the job), and the Spark barrier stage holds only the other
                nodes, so it needs `num_executors - num_ps` task slots.
            min_workers: asynchronous training (parameter servers, ``ember.ps``) may go on
                without some workers: the job continues while at least `min_workers` training
                nodes (chief/master/worker) remain.  A "worker" node that fails or is lost
                then departs: the driver names it (``Cluster.lost_workers``), its Spark task
                ends normally, and the others are not stopped (the ps shards drop it from
                their clocks; its pushes so far stay).  A chief, master, ps or evaluator
                failure, or one loss too many, stops the job as usual (or restarts it under
                `max_restarts`).  Needs InputMode.TENSORFLOW (the nodes read their own data;
                a fed node's data would go with it), and no collectives between the workers
                (their groups are fixed at the start).  None (the default): every node is
                needed.
            replace_lost_workers: with `min_workers`, how many replacement nodes the driver may
                start for lost workers: each runs in a one-task Spark job (a free task slot),
                registers under the lost worker's role and index, runs ``main_fun`` from its
                start and joins the running job (``ember.ps`` clocks: at the slowest worker's
                clock).  ``Cluster.replaced`` counts those that joined.  Not with GPUs.

        Raises:
            ClusterError: too few task slots or GPUs, two nodes given one GPU, the executors' Python cannot import this Ember
                (checked once per application; the message says which Python and the fix),
                or the Spark job failed.
            NodeError: a node failed before every node registered.
            DeadlineExceeded: not every node registered within reservation_timeout;
                the message names the missing nodes.
            InvalidArgument: the layout is impossible (e.g. more ps than nodes).
        """
        started = time.monotonic()
        main_fun = _node_program(main_fun, args) or main_fun
        side = spark_side(spark)
        num_nodes = int(num_executors) if num_executors is not None else side.default_parallelism()
        layout = _ember.ClusterLayout(num_nodes=num_nodes, num_ps=num_ps,
                                      master_node=master_node or "", eval_node=eval_node)
        _ember.assign_role(layout, 0)  # validates the layout: InvalidArgument names the field
        driver_nodes = int(num_ps) if driver_ps_nodes else 0
        gpus = _gpus.requested(side, gpus_per_node)
        profile = _gpus.resource_profile(side, gpus)
        local_gpus = _gpus.local_gpus(side, num_nodes - driver_nodes, gpus)
        check_slots(side, num_nodes - driver_nodes, config.get("slot_timeout", side, slot_timeout), profile, gpus)
        check_executor_python(side, num_nodes - driver_nodes, config.get("executor_check_timeout", side))
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        tolerated = _tolerated_worker_losses(layout, num_nodes, input_mode, min_workers)
        if replace_lost_workers and (not tolerated or gpus):
            raise ValueError("replace_lost_workers needs min_workers below the training nodes (a job that may lose "
                             "workers), and no GPUs")
        launch = Launch(main_fun=main_fun, args=args, tensorboard=tensorboard,
                        reservation_timeout=reservation_timeout, heartbeat_timeout=heartbeat_timeout,
                        connect_timeout=config.get("connect_timeout", side, connect_timeout),
                        gpus_per_node=gpus, profile=profile, local_gpus=local_gpus,
                        tolerated_worker_losses=tolerated, replace_lost_workers=int(replace_lost_workers))
        cluster = cls(side, num_nodes, layout, input_mode, log_dir, launch, max_restarts=int(max_restarts),
                      driver_nodes=driver_nodes)
        try:
            cluster._gang.start(started=started)
        except BaseException as e:
            cluster._teardown(abort_reason=f"Cluster.run failed: {type(e).__name__}")
            raise
        return cluster

    @property
    def lost_workers(self) -> List[NodeError]:
        """The worker nodes the job went on without (``Cluster.run(min_workers=...)``), in the
        order they were lost, each a NodeError naming the node, its host and why."""
        watcher = self._gang.watcher
        return list(watcher.departed) if watcher is not None else []

    @property
    def replaced(self) -> int:
        """Replacement nodes that joined the job (``Cluster.run(replace_lost_workers=...)``)."""
        watcher = self._gang.watcher
        return watcher.replaced if watcher is not None else 0

    # -- InputMode.SPARK -----------------------------------------------------

    def _require_spark_mode(self, verb: str) -> None:
        if self.input_mode != InputMode.SPARK:
            raise ClusterError(f"Cluster.{verb} feeds data to the nodes, which needs "
                               f"Cluster.run(..., input_mode=InputMode.SPARK); this job reads its own data")
        if self._gang.closed or self._shutting_down:
            raise ClusterError(f"Cluster.{verb}: the cluster is shut down")

    def train(self, data: Any, num_epochs: int = 1, feed_timeout: Optional[float] = None, qname: str = "input",
              validation_data: Any = None) -> None:
        """Feeds a DataFrame or RDD to the training nodes (InputMode.SPARK); returns when all
        of it was delivered.

        The driver feeds an epoch once every node began the one before, so it runs at most
        one epoch ahead of the slowest node (while the nodes train on epoch e, epoch e+1 is
        being fed); a node that reads nothing for `feed_timeout` fails the call, naming it.

        With `validation_data` (a DataFrame or RDD with the training data's columns), each
        training epoch is followed by a validation epoch: nodes read it with
        ``feed.validation_batches()`` / ``feed.to_tf_dataset(..., validation=True)`` (Keras
        ``fit(validation_data=...)``), under the same equal-rows rule.  Nodes that do not
        read it skip it.

        Returns early, after the epoch in which it happened, when every training node ended its
        feed (``DataFeed.terminate()``; ``ember.keras.StopFeedCallback`` does it when Keras's
        ``EarlyStopping`` ends ``fit``).

        Every training node (chief/master/worker) trains on the same number of rows per
        epoch (each partition is spread evenly over the nodes; the few rows a node gets
        beyond the smallest node's total are dropped), so synchronous strategies never
        wait on a node that ran dry.  Each epoch is one Spark job over `data`, with no
        counting pass (cache `data` if it is expensive to compute).  Nodes read with
        ``ctx.get_data_feed()``.

        Args:
            data: a DataFrame (fed as Arrow batches) or an RDD of tuples, lists, dicts,
                values or numpy arrays.
            num_epochs: how many times to feed `data`.
            validation_data: fed after every training epoch as its validation epoch.
            feed_timeout: seconds a feeding task may wait for a node that reads nothing
                (None: the feed's default, ``FeedOptions.idle_timeout`` in ember/feed.h: 10 minutes).
            qname: ignored; accepted for TFoS compatibility.

        Raises:
            NodeError: a node failed while being fed.
            ClusterError: not InputMode.SPARK, no free task slot for the feeding tasks, or
                the feeding Spark job failed.
        """
        self._require_spark_mode("train")
        _feed_driver.check_feed_slots(self._side, self.num_nodes - self._driver_nodes)
        if num_epochs < 1:
            raise ValueError("num_epochs must be at least 1")
        self._feed.train(self._gang, data, num_epochs, feed_timeout, validation_data)

    def train_stream(self, stream_df: Any, feed_timeout: Optional[float] = None,
                     checkpoint_location: Optional[str] = None, trigger: Optional[dict] = None):
        """Feeds a Structured Streaming DataFrame to the nodes as it arrives (TFoS fed DStreams).

        Each micro-batch is fed like ``train(batch, num_epochs=1)``: one feed epoch, the
        same row count on every node.  Returns the running ``StreamingQuery``; stop it (or
        let an ``availableNow``/``once`` trigger finish) before ``shutdown()``.

        From a Spark Connect client the server runs the foreachBatch function: a feeder there
        (``ember._driver.feed.StreamFeeder``, its lines in the server's log) feeds each
        micro-batch, while the client keeps the watch over the nodes.  A node's failure then
        fails the query (``query.exception()``; ``shutdown()`` names the node), ``train()``
        is refused while the query runs, and ``shutdown()`` stops a query still running.

        Args:
            stream_df: a streaming DataFrame (``spark.readStream...``).
            feed_timeout: as for train().
            checkpoint_location: the query's checkpoint directory (Spark's option).
            trigger: keyword arguments for ``DataStreamWriter.trigger`` (e.g.
                ``{"availableNow": True}``); default: Spark's.
        """
        self._require_spark_mode("train_stream")
        if not getattr(stream_df, "isStreaming", False):
            raise TypeError("train_stream takes a streaming DataFrame; use train() for a static one")
        if self._side.connect:
            # Connect runs a foreachBatch function in a Python process of its server: a StreamFeeder
            # feeds the micro-batches there (ember._driver.feed), while this client keeps the watch.
            options = {"checkpointLocation": checkpoint_location} if checkpoint_location else {}
            return self._feed.stream_from_server(self._gang, stream_df, feed_timeout, options, trigger)

        # Py4J's callback server keeps this function until the JVM gateway closes, so it
        # holds the cluster only weakly: a shut-down cluster can then be freed.
        cluster_ref = weakref.ref(self)

        def feed_batch(batch_df, batch_id):
            cluster = cluster_ref()
            if cluster is None:
                raise ClusterError("Cluster.train_stream: the cluster was shut down and freed; "
                                   "stop the streaming query before shutdown()")
            if not batch_df.isEmpty():
                cluster.train(batch_df, num_epochs=1, feed_timeout=feed_timeout)

        writer = stream_df.writeStream.foreachBatch(feed_batch)
        if checkpoint_location:
            writer = writer.option("checkpointLocation", checkpoint_location)
        if trigger:
            writer = writer.trigger(**trigger)
        return writer.start()

    def inference(self, data: Any, feed_timeout: Optional[float] = None, output_schema: Any = None,
                  qname: str = "input") -> Any:
        """Runs the nodes' inference over a DataFrame or RDD (InputMode.SPARK).

        Partition p goes to training node p % num_nodes, whose main_fun answers every row
        through ``ctx.get_data_feed(train_mode=False)``: ``next_batch`` then
        ``batch_results``.  Exactly one result per input row; too many or too few raise an
        error naming node and partition.

        Args:
            data: a DataFrame or an RDD.
            feed_timeout: seconds a feeding task waits for a node that makes no progress
                (None: the feed's default, 10 minutes).
            output_schema: for a DataFrame, the result columns as a DDL string or StructType
                (default ``"prediction double"``); matched by name, else by position.
            qname: ignored; accepted for TFoS compatibility.

        Returns:
            For a DataFrame: a DataFrame with every input column plus the output columns, in
            input order.  For an RDD: an RDD of results in input order.  Lazy: the feed runs
            when a Spark action runs on it.
        """
        self._require_spark_mode("inference")
        _feed_driver.check_feed_slots(self._side, self.num_nodes - self._driver_nodes)
        return self._feed.inference(self._gang, data, feed_timeout, output_schema=output_schema)

    def shutdown(self, grace_secs: float = 0, timeout: Optional[float] = None) -> None:
        """Waits for the training nodes to finish, then stops the rest and tears down.

        1. waits until every chief/master/worker node returned from main_fun;
        2. keeps watching for failures for `grace_secs` more seconds (so an exception
           raised late, e.g. by an evaluator, still reaches the driver);
        3. stops the ps and evaluator nodes (which usually never return);
        4. waits for the Spark job to end and closes the coordinator.

        Idempotent: a second call (or one after a failed run) does nothing.

        Args:
            grace_secs: extra seconds to watch for failures after the workers are done.
            timeout: seconds to wait for the training nodes; None waits as long as they run.

        Raises:
            NodeError: a node failed; every other node has been stopped.
            DeadlineExceeded: `timeout` passed; the job has been aborted.
            ClusterError: the Spark job failed outside the nodes.
        """
        with self._lock:
            if self._gang.closed or self._shutting_down:
                self._feed.remove_caches()  # a job that failed while training ended without them
                return
            self._shutting_down = True
        gang = self._gang
        end_feed = (lambda: self._feed.end(gang)) if self.input_mode == InputMode.SPARK else None
        try:
            gang.finish(grace_secs, timeout, end_feed)
        except BaseException as e:
            self._teardown(abort_reason=f"Cluster.shutdown failed: {type(e).__name__}: {e}"[:500])
            raise
        self._teardown()

    def nodes(self) -> List[Any]:
        """Snapshot of the registered nodes (role, address, state, error) from the coordinator."""
        return self._gang.nodes()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.shutdown()
        else:
            self._teardown(abort_reason=f"the driver raised {exc_type.__name__}")

    def __repr__(self) -> str:
        state = "closed" if self._gang.closed else "running"
        return f"<ember.Cluster {self.job_id}: {self.num_nodes} nodes, {state}>"

    def _teardown(self, abort_reason: Optional[str] = None) -> None:
        """Ends the job and releases everything (the gang's close); idempotent.  Aborts it if
        `abort_reason`."""
        try:
            self._gang.close(abort_reason)
        finally:
            self._feed.remove_caches()  # after the nodes, which read them, are gone


def _tolerated_worker_losses(layout: Any, num_nodes: int, input_mode: Any, min_workers: Optional[int]) -> int:
    """How many "worker" nodes may be lost with the job going on (Cluster.run's min_workers)."""
    if min_workers is None:
        return 0
    roles = [_ember.assign_role(layout, e).job_name for e in range(num_nodes)]
    training = sum(r in WORKER_ROLES for r in roles)
    if not (isinstance(min_workers, int) and 1 <= min_workers <= training):
        raise ValueError(f"min_workers must be an int from 1 to the job's {training} training nodes, got {min_workers!r}")
    if InputMode(input_mode) == InputMode.SPARK:
        raise ValueError("min_workers needs InputMode.TENSORFLOW: with InputMode.SPARK a lost node's fed data "
                         "would go with it")
    return min(training - min_workers, roles.count("worker"))
