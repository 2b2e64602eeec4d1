"""TFoS's ``TFNode`` on Ember: the node's side of a TensorFlowOnSpark program.

* :class:`TFNodeContext` — the ``ctx`` that ``map_fun(args, ctx)`` receives: TFoS's
  attributes (``job_name``, ``task_index``, ``worker_num``, ``num_workers``, ``executor_id``,
  ``cluster_spec``, ``defaultFS``, ``working_dir``, ``mgr``) and methods, over an
  :class:`ember.Context` (whose own methods, ``report``, ``barrier``, ``log_dir`` ..., stay
  reachable on it).
* :class:`DataFeed` — ``TFNode.DataFeed(ctx.mgr, train_mode, ...)``: ``next_batch``,
  ``should_stop``, ``batch_results``, ``terminate``, ``done_feeding``, over
  :class:`ember.DataFeed` (Arrow batches through shared memory instead of pickled rows through
  a multiprocessing.Manager queue).
* :func:`hdfs_path`, :func:`release_port`; and TFoS's TF1-only helpers
  (:func:`start_cluster_server`, :func:`export_saved_model`) failing with TFoS's own message,
  as TFoS does on TensorFlow 2.

Importing this module imports neither TensorFlow nor Spark.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Dict, List, Optional, Sequence, Union

from ember.context import absolute_path as _absolute_path

logger = logging.getLogger(__name__)

_DEFAULT_QUEUES = ("input", "output", "error")


def tfos_default_fs(default_fs: Optional[str]) -> str:
    """``fs.defaultFS`` as TFoS hands it to nodes: ``file:///`` loses its trailing slash
    (``file://``), so that ``defaultFS + "/abs/path"`` is a valid URI for every scheme."""
    fs = default_fs or "file://"
    if fs.startswith("file://") and len(fs) > 7 and fs.endswith("/"):
        fs = fs[:-1]
    return fs


def hdfs_path(ctx: Any, path: str) -> str:
    """`path` as a fully qualified URI for TensorFlow (TFoS ``TFNode.hdfs_path``).

    * a path with a scheme (``hdfs://``, ``file://``, ``s3a://``, ``gs://`` ...) is kept;
    * an absolute path is put on the default filesystem (``ctx.defaultFS``);
    * a relative path is resolved against ``/user/<user>/`` on ``hdfs://`` / ``viewfs://``,
      and against ``ctx.working_dir`` (the driver's working directory) on ``file://``.

    Unlike TFoS, any ``scheme://`` counts as a scheme (TFoS listed ten Hadoop schemes), and a
    relative local path is normalised (``a/../b`` is ``b``).

    Args:
        ctx: the node's context: this module's TFNodeContext, an ember.Context, or anything
            with ``defaultFS`` (or ``default_fs``) and ``working_dir``.
        path: the path to qualify.
    """
    default_fs = getattr(ctx, "defaultFS", None) or getattr(ctx, "default_fs", None)
    return _absolute_path(path, default_fs, ctx.working_dir)


def release_port(ctx: Any) -> None:
    """TFoS ``TFNode.release_port``: Ember always releases the node's reserved port just before
    ``map_fun`` starts (TFoS's ``release_port=True``), so there is nothing left to release;
    logs a warning as TFoS does when no socket is held."""
    sock = getattr(ctx, "tmp_socket", None)
    if sock is not None:
        sock.close()
        ctx.tmp_socket = None
        return
    logger.warning("release_port() invoked with no bound socket: Ember released the node's port "
                   "before map_fun started")


def start_cluster_server(ctx: Any, num_gpus: int = 1, rdma: bool = False):
    """TF1's ``tf.train.Server`` helper; TFoS itself refuses it on TensorFlow 2, and so does this.

    Raises:
        NotImplementedError: always.  TensorFlow 2 programs use a distribution strategy, which
            reads ``TF_CONFIG`` (set on every node by Ember), or Ember's synchronous training
            (``ember.keras.DistributedOptimizer``).
    """
    raise NotImplementedError(
        "DEPRECATED: Use higher-level APIs like `tf.keras` or `tf.estimator` (TFoS's "
        "start_cluster_server is TensorFlow 1 only). Every node has TF_CONFIG set, so "
        "tf.distribute.MultiWorkerMirroredStrategy() (or a ParameterServerStrategy with a "
        "cluster resolver) finds the cluster by itself.")


def export_saved_model(sess: Any, export_dir: str, tag_set: str, signatures: Dict[str, Any]) -> None:
    """TF1's session-based SavedModel export; TFoS itself refuses it on TensorFlow 2, and so does this.

    Raises:
        NotImplementedError: always; use ``compat.export_saved_model(model, export_dir,
            is_chief)`` for a Keras model.
    """
    raise NotImplementedError("DEPRECATED: Use TF provided APIs instead (TFoS's TFNode.export_saved_model "
                              "takes a TensorFlow 1 Session). For a Keras model use "
                              "ember.compat.tensorflowonspark.compat.export_saved_model(model, export_dir, "
                              "is_chief).")


def next_batch(mgr: Any, batch_size: int, qname: str = "input"):
    """*DEPRECATED* in TFoS: raises, as TFoS does.  Use :class:`DataFeed`."""
    raise NotImplementedError("DEPRECATED: Use TFNode.DataFeed class instead")


def batch_results(mgr: Any, results: Any, qname: str = "output"):
    """*DEPRECATED* in TFoS: raises, as TFoS does.  Use :class:`DataFeed`."""
    raise NotImplementedError("DEPRECATED: Use TFNode.DataFeed class instead")


def terminate(mgr: Any, qname: str = "input"):
    """*DEPRECATED* in TFoS: raises, as TFoS does.  Use :class:`DataFeed`."""
    raise NotImplementedError("DEPRECATED: Use TFNode.DataFeed class instead")


class TFManager:
    """What ``ctx.mgr`` is: the handle a :class:`DataFeed` is made from.

    TFoS's ``ctx.mgr`` was a multiprocessing.Manager serving pickled rows through queues.  Ember's
    node reads its feed from shared memory instead, so this object only carries the node's
    context and the job's queue names to ``DataFeed``, plus TFoS's small key/value store
    (``get``/``set``; ``get('state')`` is ``'running'`` until the feed is terminated, then
    ``'terminating'``).
    """

    def __init__(self, ctx: Any, queues: Sequence[str] = _DEFAULT_QUEUES):
        self._ctx = ctx
        self.queues = tuple(queues)
        self._values: Dict[str, Any] = {"state": "running"}

    def get(self, key: str) -> Any:
        """The value stored under `key` (None if none)."""
        return self._values.get(key)

    def set(self, key: str, value: Any) -> None:
        """Stores `value` under `key` (this node's process only)."""
        self._values[key] = value

    def get_queue(self, qname: str):
        """TFoS's raw queues do not exist on Ember.

        Raises:
            NotImplementedError: always; read the feed through ``TFNode.DataFeed(ctx.mgr)``.
        """
        raise NotImplementedError(
            f"ctx.mgr.get_queue({qname!r}): Ember feeds nodes through shared-memory rings, not "
            "multiprocessing queues; use TFNode.DataFeed(ctx.mgr, ...) (or ctx.get_data_feed()).")

    def __repr__(self) -> str:
        return f"<TFManager of {self._ctx!r}, queues {list(self.queues)}>"


def _check_queue(mgr: TFManager, qname: str, default: str, what: str) -> None:
    if qname not in mgr.queues:
        raise ValueError(f"DataFeed: {what}={qname!r} is not one of the job's queues {list(mgr.queues)} "
                         f"(TFCluster.run(..., queues=...))")
    if qname != default:
        raise NotImplementedError(
            f"DataFeed: {what}={qname!r}: Ember feeds each node one stream (TFoS's {default!r} queue); "
            f"other queue names are not supported")


class DataFeed:
    """TFoS ``TFNode.DataFeed``: this node's end of InputMode.SPARK.

    Args:
        mgr: ``ctx.mgr`` of the context ``map_fun`` received.
        train_mode: False for ``cluster.inference``: ``next_batch`` stops at partition ends and
            every row handed out must be answered with ``batch_results`` (one result per row,
            checked: too many or too few fail the feeding task with the node and partition
            named, where TFoS hung or mismatched rows).
        qname_in / qname_out: TFoS's queue names; only ``'input'`` / ``'output'`` exist.
        input_mapping: ``{column: tensor name}``; ``next_batch`` then returns
            ``{tensor: [values]}`` (tensors in the sorted order of the columns, as TFoS).

    Attributes:
        done_feeding: True once ``next_batch`` met the end of the feed (TFoS's flag).
        input_tensors: the tensor names of `input_mapping`, or None.

    Raises:
        TypeError: `mgr` is not ``ctx.mgr``.
        ValueError / NotImplementedError: an unknown or unsupported queue name.
        RuntimeError: the job is not InputMode.SPARK, or this node is not fed (ps/evaluator).
    """

    def __init__(self, mgr: TFManager, train_mode: bool = True, qname_in: str = "input",
                 qname_out: str = "output", input_mapping: Optional[Dict[str, str]] = None):
        if not isinstance(mgr, TFManager):
            raise TypeError(f"TFNode.DataFeed(mgr, ...): pass ctx.mgr of the context map_fun received, "
                            f"got {type(mgr).__name__}")
        _check_queue(mgr, qname_in, "input", "qname_in")
        _check_queue(mgr, qname_out, "output", "qname_out")
        self.mgr = mgr
        self.train_mode = bool(train_mode)
        self.qname_in = qname_in
        self.qname_out = qname_out
        self.input_tensors = ([tensor for _, tensor in sorted(input_mapping.items())]
                              if input_mapping is not None else None)
        self._done = False
        # TFoS's queues were thread-safe: a program may read in tf.data's generator thread and
        # answer (batch_results) or ask should_stop() on another, so those calls take turns.
        # terminate() takes no turn: the core's Consumer::Terminate is safe from any thread and
        # ends a read in progress (one blocked on an empty feed too) as the end of the feed.
        self._lock = threading.RLock()
        self._feed = mgr._ctx.get_data_feed(train_mode=self.train_mode, input_mapping=input_mapping)

    @property
    def done_feeding(self) -> bool:
        return self._done

    def next_batch(self, batch_size: int) -> Union[List[Any], Dict[str, List[Any]]]:
        """Up to `batch_size` rows in the form they were fed (tuples for an RDD of tuples ...),
        or ``{tensor: [values]}`` with an input_mapping.  Fewer rows only at the end of the
        feed (then ``done_feeding`` turns True) or, for inference, at a partition's end.

        Unlike TFoS, a read that waits an hour for data raises DeadlineExceeded naming the node
        instead of blocking forever.
        """
        if batch_size <= 0:
            return [] if self.input_tensors is None else {t: [] for t in self.input_tensors}
        with self._lock:
            if self._done:
                return [] if self.input_tensors is None else {t: [] for t in self.input_tensors}
            batch = self._feed.next_batch(int(batch_size))
            count = len(batch) if isinstance(batch, list) else len(next(iter(batch.values()), []))
            if count < batch_size and self._feed.should_stop():
                self._done = True
            return batch

    def should_stop(self) -> bool:
        """True once the feed ended (``cluster.shutdown()``) and every row was read, or after
        ``terminate()``."""
        if self._done:  # after terminate(): at once, without waiting for a read on another thread
            return True
        with self._lock:
            return self._done or self._feed.should_stop()

    def batch_results(self, results: Any) -> None:
        """Sends one result per row of the rows last handed out (inference): a list of values
        or tuples, a numpy array (one row per result) or a dict of columns."""
        with self._lock:
            self._feed.batch_results(results)

    def terminate(self) -> None:
        """Stops the feed early: queued rows are dropped and the driver's feeding tasks skip the
        rest of their partitions (and ``cluster.train`` stops feeding further epochs once every
        node terminated, where TFoS still sent every partition to be ignored)."""
        logger.info("terminate() invoked")
        self.mgr.set("state", "terminating")
        self._feed.terminate()
        self._done = True


class TFNodeContext:
    """The ``ctx`` of ``map_fun(args, ctx)``: TFoS's TFNodeContext over an ember.Context.

    Attributes:
        executor_id / worker_num: the node's id, 0..num_executors-1.
        job_name: "ps", "chief", "master", "evaluator" or "worker".
        task_index: the node's index within its job.
        cluster_spec: ``{job: ["host:port", ...]}``.
        num_workers: chief + master + worker nodes.
        defaultFS: the driver's ``fs.defaultFS`` (``file://`` or ``hdfs://namenode:port``).
        working_dir: the driver's working directory.
        mgr: the :class:`TFManager` a :class:`DataFeed` is made from.
        tmp_socket: always None (Ember released the node's port before map_fun started).
        ember: the underlying :class:`ember.Context`; its other attributes and methods
            (``report``, ``barrier``, ``log_dir``, ``communicator`` ...) are reachable on this
            object too.
    """

    def __init__(self, ctx: Any, queues: Sequence[str] = _DEFAULT_QUEUES):
        self.ember = ctx
        self.executor_id = ctx.executor_id
        self.worker_num = ctx.executor_id
        self.job_name = ctx.job_name
        self.task_index = ctx.task_index
        self.cluster_spec = dict(ctx.cluster_spec)
        self.num_workers = ctx.num_workers
        self.defaultFS = tfos_default_fs(ctx.default_fs)
        self.working_dir = ctx.working_dir
        self.mgr = TFManager(ctx, queues)
        self.tmp_socket = None

    def absolute_path(self, path: str) -> str:
        """``TFNode.hdfs_path(ctx, path)``."""
        return hdfs_path(self, path)

    def start_cluster_server(self, num_gpus: int = 1, rdma: bool = False):
        """``TFNode.start_cluster_server``: TensorFlow 1 only; raises NotImplementedError."""
        return start_cluster_server(self, num_gpus, rdma)

    def export_saved_model(self, sess: Any, export_dir: str, tag_set: str, signatures: Dict[str, Any]) -> None:
        """``TFNode.export_saved_model``: TensorFlow 1 only; raises NotImplementedError."""
        export_saved_model(sess, export_dir, tag_set, signatures)

    def get_data_feed(self, train_mode: bool = True, qname_in: str = "input", qname_out: str = "output",
                      input_mapping: Optional[Dict[str, str]] = None) -> DataFeed:
        """``TFNode.DataFeed(ctx.mgr, train_mode, qname_in, qname_out, input_mapping)``."""
        return DataFeed(self.mgr, train_mode, qname_in, qname_out, input_mapping)

    def release_port(self) -> None:
        """``TFNode.release_port(ctx)``: nothing to release on Ember (see :func:`release_port`)."""
        release_port(self)

    def __getattr__(self, name: str) -> Any:
        # Only for names this class lacks: Ember's own context API (report, barrier, log_dir ...).
        inner = self.__dict__.get("ember")
        if inner is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(inner, name)

    def __repr__(self) -> str:
        return (f"TFNodeContext(executor_id={self.executor_id}, job_name={self.job_name!r}, "
                f"task_index={self.task_index}, num_workers={self.num_workers})")
