"""The node context (`ctx`) handed to ``main_fun(args, ctx)`` on every node."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Dict, List, Optional

from ember import _ember
from ember._node import env as _node_env
from ember._names import WORKER_ROLES  # noqa: F401  (roles that train; re-exported: users know it here)
from ember.input_mode import InputMode

logger = logging.getLogger(__name__)


_current: Optional["Context"] = None  # set by the node process (ember._node.main)


def current() -> Optional["Context"]:
    """The Context of the node this process runs, or None outside a node."""
    return _current


def absolute_path(path: str, default_fs: Optional[str], working_dir: str) -> str:
    """A fully qualified URI for `path`, with TFoS ``hdfs_path`` semantics: the core's one rule of
    where a path lives (``QualifyPath`` in include/ember/fs.h), which its file systems follow.

    * a path with a scheme (``hdfs://nn/x``, ``file:///x``, ``file:/x``, ``s3a://b/x``) is kept
      as is;
    * an absolute path is put on the default filesystem: ``file:///`` + ``/tmp/x`` is
      ``file:///tmp/x``, ``hdfs://nn:8020`` + ``/data`` is ``hdfs://nn:8020/data``;
    * a relative path is resolved against `working_dir` on ``file://``, and against the user's
      home, ``/user/<user>/``, on any other filesystem (``hdfs://``, ``viewfs://``, ...).

    Args:
        path: the path to qualify.
        default_fs: Hadoop's ``fs.defaultFS`` (``file:///`` if None or empty).
        working_dir: absolute local directory relative paths resolve against on ``file://``.

    Raises:
        ValueError: an empty path, or a default_fs that is not a URI.
    """
    from ember import _hadoop
    return _ember.fs_qualify(path, _hadoop.resolve_options(default_fs or "", ""), working_dir)


def _node_field(name: str, empty: Any = ""):
    """A Context attribute that is field `name` of its NodeContext; `empty` stands for "" there."""
    def get(self):
        value = getattr(self._node, name)
        return empty if value == "" else value

    def set(self, value):
        setattr(self._node, name, "" if value is empty else value)
    return property(get, set)


class Context:
    """What a node knows about itself and the job; passed as ``ctx`` to ``main_fun``.

    Attributes:
        executor_id: the node's id, 0..num_nodes-1 (its Spark partition).
        worker_num: alias of executor_id (TFoS name).
        job_name: the node's role: "ps", "chief", "master", "evaluator" or "worker".
        task_index: index of the node within its role.
        cluster_spec: ``{role: ["host:port", ...]}`` for every node of the job.
        num_workers: number of training nodes (chief + master + worker), as in TFoS.
        default_fs: the driver's Hadoop ``fs.defaultFS`` (e.g. ``file:///``).
        hdfs_http_address: the NameNode's WebHDFS ``host:port`` (the driver's
            ``dfs.namenode.http-address``) when default_fs is ``hdfs://``, else "".
        working_dir: the driver's working directory.
        log_dir: fully qualified log directory (TensorBoard), or None.
        input_mode: the job's InputMode.
        job_id: the job's id (also in the node's environment as EMBER_JOB_ID).
        gpus: the node's GPUs as its CUDA_VISIBLE_DEVICES lists them (Cluster.run's
            ``gpus_per_node``); inside the node they are devices 0..len(gpus)-1
            (``cuda:0`` ...).  Empty when no GPU was asked.
    """

    def __init__(self, executor_id: int, job_name: str, task_index: int,
                 cluster_spec: Dict[str, List[str]], default_fs: str, working_dir: str,
                 log_dir: Optional[str] = None, input_mode: InputMode = InputMode.TENSORFLOW,
                 job_id: str = "", coordinator: Optional[tuple] = None,
                 feed_ring: Optional[str] = None, hdfs_http_address: str = ""):
        node = _ember.NodeContext()
        node.executor_id, node.job_name, node.task_index = executor_id, job_name, task_index
        node.cluster_spec = cluster_spec
        node.default_fs, node.working_dir = default_fs or "", working_dir
        node.hdfs_http_address = hdfs_http_address
        node.log_dir = absolute_path(log_dir, default_fs, working_dir) if log_dir else ""
        node.input_mode = int(InputMode(input_mode))
        node.job_id = job_id
        if coordinator is not None:  # (host, port, secret, connect_timeout)
            node.coordinator_host, node.coordinator_port, node.secret, node.connect_timeout = coordinator
        node.feed_ring = feed_ring or ""
        self._wrap(node)

    @classmethod
    def from_node_context(cls, node: Any) -> "Context":
        """The Context of a node process, from the launcher's start-up message.

        Args:
            node: an ``ember._ember.NodeContext`` (the typed message of docs/wire.md,
                "Node start-up"); the Context wraps it.
        """
        ctx = cls.__new__(cls)
        ctx._wrap(node)
        return ctx

    def _wrap(self, node: Any) -> None:
        self._node = node
        self._cluster_spec = dict(node.cluster_spec)  # converted once: read often, as a dict
        self._client = None
        self._client_lock = threading.Lock()

    executor_id = _node_field("executor_id")
    job_name = _node_field("job_name")
    task_index = _node_field("task_index")
    default_fs = _node_field("default_fs")
    hdfs_http_address = _node_field("hdfs_http_address")
    working_dir = _node_field("working_dir")
    job_id = _node_field("job_id")
    log_dir = _node_field("log_dir", empty=None)
    input_mode = property(lambda self: InputMode(self._node.input_mode),
                          lambda self, mode: setattr(self._node, "input_mode", int(InputMode(mode))))

    @property
    def cluster_spec(self) -> Dict[str, List[str]]:
        return self._cluster_spec

    @cluster_spec.setter
    def cluster_spec(self, spec: Dict[str, List[str]]) -> None:
        self._node.cluster_spec = spec
        self._cluster_spec = dict(self._node.cluster_spec)

    @property
    def _coordinator(self) -> Optional[tuple]:
        """(host, port, secret, connect_timeout) of the job's coordinator, or None."""
        n = self._node
        return (n.coordinator_host, n.coordinator_port, n.secret, n.connect_timeout) if n.coordinator_host else None

    @property
    def _feed_ring(self) -> Optional[str]:
        """InputMode.SPARK: the name of this node's feed ring, or None."""
        return self._node.feed_ring or None

    @property
    def gpus(self) -> List[str]:
        return list(self._node.gpus)

    @property
    def worker_num(self) -> int:
        return self.executor_id

    @property
    def num_workers(self) -> int:
        return self._node.num_workers

    def absolute_path(self, path: str) -> str:
        """`path` as a fully qualified URI; see :func:`ember.context.absolute_path`."""
        return absolute_path(path, self.default_fs, self.working_dir)

    def report(self, step: Optional[float] = None, loss: Optional[float] = None,
               **metrics: float) -> None:
        """Sends progress to the driver, which shows a live line per node.

        Pass a cumulative ``samples`` count to get samples/s on the driver.  Values
        must be numbers.  Raises EmberError if the coordinator cannot be reached.
        """
        values: Dict[str, float] = {}
        if step is not None:
            values["step"] = float(step)
        if loss is not None:
            values["loss"] = float(loss)
        for key, value in metrics.items():
            if value is not None:
                values[key] = float(value)
        values.setdefault("time", time.time())
        self._coordinator_client().report(values)

    def get_data_feed(self, train_mode: bool = True, input_mapping: Optional[Dict[str, str]] = None,
                      timeout: float = 3600.0):
        """This node's end of InputMode.SPARK (TFoS ``TFNode.DataFeed(ctx.mgr, ...)``).

        Args:
            train_mode: False for ``cluster.inference``: every row handed out must be
                answered with ``batch_results``.
            input_mapping: optional {column: tensor name} for ``next_batch``.
            timeout: seconds a read may wait for data before raising DeadlineExceeded.

        Returns:
            an :class:`ember.feed.DataFeed`.

        Raises:
            RuntimeError: the job does not use InputMode.SPARK, or this node is not a
                training node (ps and evaluator nodes are not fed).
        """
        if self._feed_ring is None:
            if self.input_mode != InputMode.SPARK:
                raise RuntimeError("ctx.get_data_feed() needs Cluster.run(..., input_mode=InputMode.SPARK); "
                                   "this job uses InputMode.TENSORFLOW, where main_fun reads its own data")
            raise RuntimeError(f"node {self.job_name}:{self.task_index} is not fed: only chief, master and "
                               "worker nodes receive data in InputMode.SPARK")
        from ember.feed import DataFeed
        if getattr(self, "_feed", None) is None:
            from ember import _hadoop
            self._feed = DataFeed(self._feed_ring, node=f"{self.job_name}:{self.task_index}",
                                  train_mode=train_mode, input_mapping=input_mapping, timeout=timeout,
                                  resolve=_hadoop.resolve_options(self.default_fs, getattr(self, "hdfs_http_address", "")))
        else:  # one ring per node: a second call re-configures the same feed
            self._feed.train_mode = train_mode
            self._feed._input_mapping = dict(input_mapping) if input_mapping else None
            self._feed._timeout = timeout
        return self._feed

    def summary_writer(self, flush_secs: Optional[float] = None):
        """This node's TensorBoard event writer (:class:`ember.summary.EventWriter`), written by
        the C++ core into ``<log_dir>/<job_name>_<task_index>`` (e.g. ``.../worker_1``): one
        directory per node, so nodes never share a file and TensorBoard shows each as a run.
        The log dir may be on HDFS.  Later calls return the same writer; it is flushed and
        closed when ``main_fun`` returns.

        Args:
            flush_secs: how often events are flushed for TensorBoard (the core's default if None).

        Raises:
            RuntimeError: the job has no log dir (pass ``log_dir=`` to ``Cluster.run``).
        """
        with self._client_lock:
            writer = getattr(self, "_summary_writer", None)
            if writer is not None:
                return writer
            if not self.log_dir:
                raise RuntimeError("ctx.summary_writer() needs a log directory: pass log_dir=... "
                                   "(or tensorboard=True) to Cluster.run")
            from ember import summary
            node_dir = _ember.summary_node_log_dir(self.log_dir, self.job_name, self.task_index)
            resolve = summary.resolve_options(self.default_fs, self.hdfs_http_address)
            self._summary_writer = summary.EventWriter(node_dir, flush_secs=flush_secs, resolve=resolve)
            return self._summary_writer

    @property
    def training_rank(self) -> Optional[int]:
        """This node's rank among the training nodes (chief/master first, then workers by
        task index), as collectives number them; None for ps and evaluator nodes."""
        return self._node.training_rank

    @property
    def is_chief(self) -> bool:
        """True on the node that saves and prints for the job: training rank 0."""
        return self.training_rank == 0

    def torch_distributed_env(self) -> Dict[str, str]:
        """What ``torch.distributed.init_process_group`` reads from the environment, for this
        training node: MASTER_ADDR/MASTER_PORT (rank 0's host and its reserved port), RANK,
        WORLD_SIZE and LOCAL_RANK (this node's index among training nodes on its host), as
        Spark's TorchDistributor sets them.  Empty for ps and evaluator nodes.  Every training
        node's process has them in its environment (a main_fun node and an executable alike:
        ember/_node/env.py)."""
        return _node_env.torch_distributed_env(self.cluster_spec, self.job_name, self.task_index)

    def communicator(self, timeout: Optional[float] = None, transport: str = "auto",
                     connect_timeout: Optional[float] = None) -> "Communicator":
        """The job's training nodes as one :class:`ember.collective.Communicator`
        (rank = ``training_rank``, size = ``num_workers``).  Every training node must call
        this (the first call on each meets the others); later calls return the same one.

        Args:
            timeout: seconds each collective call may take (the core's default if None).
            transport: "auto" (shared memory on one host, TCP between hosts) or "tcp".
            connect_timeout: seconds to wait for the other nodes to join.
        """
        from ember.collective import Communicator, communicator_options
        with self._client_lock:
            if getattr(self, "_communicator", None) is not None:
                return self._communicator
        # rank, size, host, bind address, name and prefix: the core's rule (Node::OpenCommunicator)
        options = _ember.node_communicator_options(
            self._node, communicator_options(transport, timeout=timeout, connect_timeout=connect_timeout))
        if self._coordinator is None:
            raise RuntimeError("this Context is not connected to a job's coordinator")
        host, port, secret, ctimeout = self._coordinator
        store = _ember.CollectiveStore.coordinator(host, port, secret, ctimeout)
        comm = Communicator(_ember.Communicator.create(options, store))
        with self._client_lock:
            self._communicator = comm
        return comm

    def allreduce(self, x: Any, op: str = "average") -> Any:
        """``ctx.communicator().allreduce(x, op)``: `x` reduced over the training nodes."""
        return self.communicator().allreduce(x, op)

    def broadcast(self, x: Any, root: int = 0) -> Any:
        """``ctx.communicator().broadcast(x, root)``: rank `root`'s `x` on every training node."""
        return self.communicator().broadcast(x, root)

    def allgather(self, x: Any) -> Any:
        """``ctx.communicator().allgather(x)``: every training node's `x`, concatenated along axis 0."""
        return self.communicator().allgather(x)

    def barrier(self, name: str, timeout: float = 600.0) -> None:
        """Waits until every node of the job has called ``barrier(name)``.

        Raises DeadlineExceeded after `timeout` seconds, Aborted if the job aborts.
        """
        self._coordinator_client().barrier(name, timeout)

    def _coordinator_client(self):
        with self._client_lock:
            if self._client is None:
                if self._coordinator is None:
                    raise RuntimeError("this Context is not connected to a job's coordinator")
                host, port, secret, connect_timeout = self._coordinator
                client = _ember.CoordinatorClient.connect(host, port, secret,
                                                          connect_timeout=connect_timeout)
                client.attach(self.executor_id)
                self._client = client
            return self._client

    def _close(self) -> None:
        with self._client_lock:
            writer, self._summary_writer = getattr(self, "_summary_writer", None), None
            comm, self._communicator = getattr(self, "_communicator", None), None
            if comm is not None:
                comm.close()
            if self._client is not None:
                self._client.close()
                self._client = None
        if writer is not None:  # last: a failed final flush (naming the file) fails the node
            writer.close()

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_node"] = _ember.encode_node_startup(self._node)  # the typed message, not a pickle
        state["_client"] = None
        state["_communicator"] = None
        state["_summary_writer"] = None
        state.pop("_client_lock", None)
        state.pop("_feed", None)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        state = dict(state, _node=_ember.decode_node_startup(state["_node"]))
        self.__dict__.update(state)
        self._client_lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"Context(executor_id={self.executor_id}, job_name={self.job_name!r}, "
                f"task_index={self.task_index}, num_workers={self.num_workers})")
