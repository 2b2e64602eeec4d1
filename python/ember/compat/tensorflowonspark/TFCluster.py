"""TFoS's ``TFCluster`` on Ember: start a TensorFlow cluster on Spark, feed it, shut it down.

    cluster = TFCluster.run(sc, main_fun, args, num_executors, num_ps, tensorboard,
                            TFCluster.InputMode.SPARK, master_node="chief")
    cluster.train(rdd, num_epochs)
    predictions = cluster.inference(rdd)
    cluster.shutdown()

Each call maps onto :class:`ember.Cluster` (``run`` / ``train`` / ``inference`` /
``shutdown``); ``map_fun`` receives TFoS's context (:class:`TFNode.TFNodeContext`).  Where
Ember behaves better than TFoS, the TFoS program sees it without a change: a failed node
raises ``ember.NodeError`` (its traceback attached) from the call the driver is in, instead of
``sys.exit(1)`` after stopping the SparkContext; every wait has a deadline naming what it
waited for; inference checks that there is exactly one result per row.  docs/migration.md
lists every difference.

Keras 2 programs (``tf.keras`` before TF 2.16) run on today's TensorFlow with the ``tf-keras``
package and ``TF_USE_LEGACY_KERAS=1`` in the nodes' environment: set it on the driver
(``export TF_USE_LEGACY_KERAS=1``; ``run`` hands the driver's value to every node) or with
``spark.executorEnv.TF_USE_LEGACY_KERAS=1``.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence

from ember import _ember
from ember.compat.tensorflowonspark import TFNode

logger = logging.getLogger(__name__)

# Driver environment variables handed to every node (the node's own value wins): what a TFoS
# program of the Keras 2 era needs on today's TensorFlow.
FORWARDED_ENV = ("TF_USE_LEGACY_KERAS",)
_DEFAULT_QUEUES = ["input", "output", "error"]


class InputMode(object):
    """How data reaches the nodes (TFoS's enum; the same values as ``ember.InputMode``)."""
    TENSORFLOW = 0  #: map_fun reads its own data (e.g. tf.data over TFRecords).
    SPARK = 1       #: the driver feeds an RDD to the nodes (``cluster.train`` / ``inference``).


class _NodeMain:
    """The function Ember runs on every node: prepares what TFoS prepared, then calls the
    user's ``map_fun(tf_args, ctx)`` with a TFoS context.  Pickled by cloudpickle with the
    user's function inside."""

    def __init__(self, map_fun: Callable[[Any, Any], Any], queues: Sequence[str], env: Dict[str, str]):
        self.map_fun = map_fun
        self.queues = list(queues)
        self.env = dict(env)

    def __call__(self, args: Any, ctx: Any) -> Any:
        for key, value in self.env.items():  # before map_fun first touches tf.keras
            os.environ.setdefault(key, value)
        spec = dict(ctx.cluster_spec)
        if "master" in spec or "chief" in spec:  # TFoS's TF_CONFIG: tf.estimator wants "environment"
            os.environ["TF_CONFIG"] = json.dumps({"cluster": spec,
                                                  "task": {"type": ctx.job_name, "index": ctx.task_index},
                                                  "environment": "cloud"})
        if isinstance(args, list):  # TFoS: an argv list becomes the node's sys.argv
            sys.argv = args
        return self.map_fun(args, TFNode.TFNodeContext(ctx, self.queues))


def _is_dstream(data: Any) -> bool:
    return type(data).__name__ in ("DStream", "TransformedDStream")


class TFCluster(object):
    """A running TFoS-style cluster (made by :func:`run`), over an :class:`ember.Cluster`.

    Attributes:
        sc: the SparkContext.
        defaultFS: the driver's ``fs.defaultFS`` as TFoS gives it (``file://``, ``hdfs://nn:8020``).
        working_dir: the driver's working directory.
        num_executors: number of nodes.
        cluster_id: the job's id (``ember.Cluster.job_id``).
        cluster_info: one dict per node (``executor_id``, ``host``, ``port``, ``job_name``,
            ``task_index``, ``tb_port``), sorted by executor_id.
        cluster_meta: ``{"id", "cluster_template", "num_executors", "default_fs",
            "working_dir", "release_port"}``.
        input_mode: the job's InputMode.
        queues: the queue names given to run().
        ember_cluster: the :class:`ember.Cluster` underneath (Ember's API: ``train_stream``,
            ``restarts``, ``tensorboard_url`` ...).
    """

    sc = None
    defaultFS = None
    working_dir = None
    num_executors = None
    nodeRDD = None  # TFoS's RDD of node tasks; Ember's nodes are one barrier stage it owns
    cluster_id = None
    cluster_info = None
    cluster_meta = None
    input_mode = None
    queues = None
    server = None  # TFoS's reservation.Server; Ember's coordinator is in ember_cluster
    ember_cluster = None

    def _check_feed(self, verb: str, qname: str) -> None:
        if self.input_mode != InputMode.SPARK:
            raise ValueError(f"TFCluster.{verb}() requires InputMode.SPARK; this cluster was started "
                             f"with InputMode.TENSORFLOW (map_fun reads its own data)")
        if qname not in self.queues:
            raise ValueError(f"Unknown queue: {qname!r}; the cluster's queues are {self.queues}")
        if qname != "input":
            raise NotImplementedError(f"TFCluster.{verb}(qname={qname!r}): Ember feeds each node one "
                                      f"stream, TFoS's 'input' queue; other queues are not supported")

    def train(self, dataRDD: Any, num_epochs: int = 0, feed_timeout: Optional[float] = None, qname: str = "input") -> None:
        """*InputMode.SPARK*: feeds `dataRDD` to the worker nodes `num_epochs` times; returns
        once every epoch was delivered (``ember.Cluster.train``).

        As in TFoS, ``num_epochs=0`` means "unspecified" and feeds 10 epochs; the nodes see
        one stream of rows (``DataFeed.next_batch``), and a node that has trained enough
        calls ``DataFeed.terminate()``.  Unlike TFoS, once every node has terminated the
        remaining epochs are not fed at all (TFoS sent them to be dropped), and each epoch
        gives every node the same number of rows.

        Args:
            dataRDD: an RDD (or a DataFrame, fed as Arrow batches; an Ember extension).
            num_epochs: times to feed `dataRDD`; 0 for TFoS's default of 10.
            feed_timeout: seconds a feeding task waits for a node that reads nothing, after
                which it fails naming the node (TFoS: the same, per partition; None: the feed's
                default, 10 minutes).
            qname: TFoS's queue name; only ``'input'``.

        Raises:
            ValueError: not InputMode.SPARK, a negative num_epochs, or an unknown queue.
            NotImplementedError: a DStream (use ``ember_cluster.train_stream`` with Structured
                Streaming) or a queue other than ``'input'``.
            ember.NodeError: a node failed.
        """
        self._check_feed("train", qname)
        if num_epochs < 0:
            raise ValueError(f"num_epochs cannot be negative, got {num_epochs}")
        if _is_dstream(dataRDD):
            raise NotImplementedError(
                "TFCluster.train(DStream): Spark Streaming's DStreams are not supported by Ember; feed a "
                "Structured Streaming DataFrame with cluster.ember_cluster.train_stream(stream_df) instead")
        epochs = num_epochs if num_epochs > 0 else 10  # TFoS: "an arbitrarily large number"
        self.ember_cluster.train(dataRDD, num_epochs=epochs, feed_timeout=feed_timeout)

    def inference(self, dataRDD: Any, feed_timeout: Optional[float] = None, qname: str = "input",
                  output_schema: Any = None) -> Any:
        """*InputMode.SPARK*: the nodes' answers for every row of `dataRDD`, as an RDD in input
        order (``ember.Cluster.inference``); lazy, like TFoS's: the feed runs with the first
        Spark action on it.  The nodes answer through ``DataFeed.batch_results``.

        Args:
            dataRDD: an RDD; or a DataFrame (an Ember extension), which gives a DataFrame of
                every input column plus `output_schema`'s columns.
            feed_timeout: seconds a feeding task waits for a node that makes no progress
                (None: the feed's default, 10 minutes).
            qname: TFoS's queue name; only ``'input'``.
            output_schema: for a DataFrame only: the result columns (DDL string or StructType;
                default ``"prediction double"``).

        Raises:
            ValueError: not InputMode.SPARK or an unknown queue.
        """
        self._check_feed("inference", qname)
        return self.ember_cluster.inference(dataRDD, feed_timeout=feed_timeout, output_schema=output_schema)

    def shutdown(self, ssc: Any = None, grace_secs: float = 0, timeout: float = 259200) -> None:
        """Waits for the worker nodes to finish, then stops the ps/evaluator nodes and tears the
        cluster down (``ember.Cluster.shutdown``).  In InputMode.SPARK it first ends the feed:
        ``DataFeed.should_stop()`` turns True on the nodes once they read what was fed.

        Args:
            ssc: TFoS's StreamingContext; DStreams are not supported (must be None).
            grace_secs: seconds to keep watching for a late failure (e.g. an evaluator's) after
                the workers finished.
            timeout: seconds to wait for the workers (default 3 days, as TFoS); ``-1`` (or any
                value <= 0) waits without limit.  When it passes Ember aborts the job and
                raises ``ember.DeadlineExceeded`` (TFoS stopped the SparkContext and called
                ``sys.exit(1)``).

        Raises:
            ember.NodeError: a node failed (every other node has been stopped); TFoS exited
                the driver with status 1 instead.
            ember.errors.DeadlineExceeded: `timeout` passed.
        """
        if ssc is not None:
            raise NotImplementedError("TFCluster.shutdown(ssc=...): Spark Streaming's DStreams are not "
                                      "supported by Ember; stop the StreamingContext yourself, or use "
                                      "Structured Streaming with cluster.ember_cluster.train_stream")
        wait = float(timeout) if timeout is not None and timeout > 0 else None
        self.ember_cluster.shutdown(grace_secs=grace_secs, timeout=wait)

    def tensorboard_url(self) -> Optional[str]:
        """Where TensorBoard serves (``tensorboard=True``), or None."""
        return self.ember_cluster.tensorboard_url if self.ember_cluster is not None else None


def _cluster_template(num_executors: int, num_ps: int, master_node: Optional[str],
                      eval_node: bool) -> Dict[str, List[int]]:
    """TFoS's {job: [executor ids]}: ps first, then the master/chief, the evaluator, workers (the
    core's role assignment, include/ember/roles.h, which the coordinator follows)."""
    layout = _ember.ClusterLayout(num_nodes=num_executors, num_ps=num_ps, master_node=master_node or "",
                                  eval_node=eval_node)
    template: Dict[str, List[int]] = {}
    for executor_id in range(num_executors):
        template.setdefault(_ember.assign_role(layout, executor_id).job_name, []).append(executor_id)
    return template


def _check_arguments(sc: Any, num_executors: Any, num_ps: Any, input_mode: Any, driver_ps_nodes: bool,
                     master_node: Optional[str], eval_node: bool, queues: Any) -> None:
    """TFoS's checks of run()'s arguments, as errors that say what to change."""
    if isinstance(num_executors, bool) or not isinstance(num_executors, int) or num_executors < 1:
        raise ValueError(f"num_executors must be a positive int (the number of TensorFlow nodes), "
                         f"got {num_executors!r}")
    if isinstance(num_ps, bool) or not isinstance(num_ps, int) or num_ps < 0:
        raise ValueError(f"num_ps must be an int >= 0, got {num_ps!r}")
    if input_mode not in (InputMode.TENSORFLOW, InputMode.SPARK):
        raise ValueError(f"input_mode must be TFCluster.InputMode.TENSORFLOW (0) or InputMode.SPARK (1), "
                         f"got {input_mode!r}")
    if master_node not in (None, "chief", "master"):
        raise ValueError(f"master_node must be None, 'chief' or 'master', got {master_node!r}")
    if eval_node and input_mode != InputMode.TENSORFLOW:
        raise ValueError("running evaluator nodes is only supported in InputMode.TENSORFLOW")
    if driver_ps_nodes and input_mode != InputMode.TENSORFLOW:
        raise ValueError("running PS nodes on driver locally is only supported in InputMode.TENSORFLOW")
    trainers = num_executors - num_ps - (1 if eval_node else 0)
    if num_ps + (1 if eval_node else 0) + (1 if master_node else 0) > num_executors or trainers < 1:
        raise ValueError(f"TensorFlow cluster requires at least one worker or master/chief node: "
                         f"num_executors={num_executors} leaves none after num_ps={num_ps}"
                         + (", an evaluator" if eval_node else "") + (f", the {master_node}" if master_node else ""))
    if (not isinstance(queues, (list, tuple)) or not all(isinstance(q, str) for q in queues)
            or "input" not in queues or "output" not in queues):
        raise ValueError(f"queues must be a list of names holding 'input' and 'output' (TFoS's default "
                         f"{_DEFAULT_QUEUES}), got {queues!r}")


def run(sc: Any, map_fun: Callable[[Any, Any], Any], tf_args: Any, num_executors: int, num_ps: int,
        tensorboard: bool = False, input_mode: int = InputMode.TENSORFLOW, log_dir: Optional[str] = None,
        driver_ps_nodes: bool = False, master_node: Optional[str] = None, reservation_timeout: float = 600,
        queues: Sequence[str] = _DEFAULT_QUEUES, eval_node: bool = False, release_port: bool = True) -> TFCluster:
    """Starts `num_executors` TensorFlow nodes on Spark, each running ``map_fun(tf_args, ctx)``
    (TFoS ``TFCluster.run``, on ``ember.Cluster.run``); returns once every node registered.

    Roles as in TFoS: the first `num_ps` nodes are "ps", then `master_node` ("chief" or
    "master") if given, then an "evaluator" if `eval_node`, the rest "worker".  Every node has
    ``TF_CONFIG`` (TFoS set it only with a chief/master; then it also carries TFoS's
    ``"environment": "cloud"``).  The nodes run as one Spark barrier stage, each in a process
    of its own, in both input modes (TFoS ran InputMode.SPARK nodes in the background of a
    reused Python worker); InputMode.SPARK needs free task slots beside them for feeding.

    Args:
        sc: a SparkContext (or SparkSession).
        map_fun: ``map_fun(args, ctx)``; ctx is a :class:`TFNode.TFNodeContext`.
        tf_args: passed to map_fun; a list becomes the node's ``sys.argv`` too (as TFoS).
        num_executors: number of nodes (TFoS: executors), ps nodes included.
        num_ps: number of parameter-server nodes.
        tensorboard: start TensorBoard beside the chief (or worker 0) on `log_dir`.
        input_mode: ``InputMode.TENSORFLOW`` or ``InputMode.SPARK``.
        log_dir: TensorBoard's log directory (default ``tensorboard_<job id>`` in the
            driver's working directory).
        driver_ps_nodes: run the ps nodes in the driver's host, as TFoS did (each a process of
            its own, started by a launcher thread of the driver); the Spark stage then needs
            ``num_executors - num_ps`` task slots.  InputMode.TENSORFLOW only, as TFoS.
        master_node: None, "chief" or "master".
        reservation_timeout: seconds to wait for every node to register; the error names the
            nodes that did not.
        queues: TFoS's queue names; must hold 'input' and 'output' (only those two are used).
        eval_node: one node is an "evaluator" (InputMode.TENSORFLOW only, as TFoS).
        release_port: accepted for compatibility: Ember always releases the node's reserved
            port just before map_fun starts, and ``ctx.release_port()`` does nothing.

    Raises:
        ValueError: an argument TFoS would refuse (the message says which and why).
        ember.ClusterError / ember.NodeError / DeadlineExceeded: as ``ember.Cluster.run``.
    """
    import ember

    sc = getattr(sc, "sparkContext", sc)  # TFoS's API is the classic SparkContext's
    if not hasattr(sc, "_jsc"):
        raise TypeError(f"TFCluster.run needs a SparkContext (TFoS's API), got {type(sc).__name__}; "
                        f"with Spark Connect use ember.Cluster.run(spark, ...)")
    _check_arguments(sc, num_executors, num_ps, input_mode, driver_ps_nodes, master_node, eval_node, queues)
    if not release_port:
        logger.info("release_port=False: Ember releases each node's port before map_fun starts; "
                    "ctx.release_port() has nothing to do")
    env = {key: os.environ[key] for key in FORWARDED_ENV if os.environ.get(key)}
    node_main = _NodeMain(map_fun, queues, env)
    inner = ember.Cluster.run(sc, node_main, tf_args, num_executors=num_executors, num_ps=num_ps,
                              tensorboard=tensorboard, input_mode=ember.InputMode(input_mode), log_dir=log_dir,
                              master_node=master_node, eval_node=eval_node,
                              reservation_timeout=reservation_timeout, driver_ps_nodes=bool(driver_ps_nodes))
    cluster = TFCluster()
    cluster.sc = sc
    cluster.ember_cluster = inner
    cluster.defaultFS = TFNode.tfos_default_fs(sc._jsc.hadoopConfiguration().get("fs.defaultFS"))
    cluster.working_dir = os.getcwd()
    cluster.num_executors = num_executors
    cluster.cluster_id = inner.job_id
    cluster.input_mode = input_mode
    cluster.queues = list(queues)
    cluster.cluster_info = sorted(
        ({"executor_id": n.address.executor_id, "host": n.address.host, "port": n.address.port,
          "job_name": n.role.job_name, "task_index": n.role.task_index, "tb_port": 0}
         for n in inner.nodes()), key=lambda node: node["executor_id"])
    cluster.cluster_meta = {"id": inner.job_id,
                            "cluster_template": _cluster_template(num_executors, num_ps, master_node, eval_node),
                            "num_executors": num_executors, "default_fs": cluster.defaultFS,
                            "working_dir": cluster.working_dir, "release_port": release_port}
    return cluster
