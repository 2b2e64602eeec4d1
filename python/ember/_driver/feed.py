"""The driver's side of InputMode.SPARK: ``Cluster.train``, ``Cluster.inference``, end of feed.

Feeding runs as ordinary Spark jobs beside the nodes' barrier stage, so it needs
task slots the nodes do not hold (e.g. ``local[4]`` for 2 nodes).  Partitions
reach nodes by an explicit plan made here (no executor-identity files): see
ember._feeder.task for how rows are spread and why every node gets the same count.
"""
from __future__ import annotations

import time
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import pyarrow as pa

from ember import _ember
from ember._feeder import task as feeding
from ember import errors
from ember._names import FEED_ENDPOINT_KEY, WORKER_ROLES

_SENT_SCHEMA = "partition int, node int, rows long, gone boolean, stopped boolean"


def _is_dataframe(data: Any) -> bool:
    return hasattr(data, "mapInArrow") and hasattr(data, "schema")


def _is_rdd(data: Any) -> bool:
    return hasattr(data, "mapPartitionsWithIndex") and hasattr(data, "getNumPartitions")


def check_feed_slots(sc, num_nodes: int, task_slots) -> None:
    """Feeding tasks need slots the nodes' barrier tasks do not hold."""
    have = task_slots(sc)
    if have <= num_nodes:
        raise errors.ClusterError(
            f"InputMode.SPARK feeds the {num_nodes} nodes from Spark tasks that run beside them, but "
            f"the application's {have} task slots are all held by the nodes (master {sc.master}). "
            f"Use local[{num_nodes * 2}] or add executors/cores so at least one slot is free.")


def feed_endpoints(server, nodes, timeout: float = 60.0) -> List[feeding.NodeEndpoint]:
    """The feed endpoints of the training nodes (chief/master/worker), by executor id.

    The launchers store them (``NodeEndpoint.encode()``) right after registration; waits up
    to `timeout` for them.
    """
    deadline = time.monotonic() + timeout
    out = []
    for n in sorted(nodes, key=lambda n: n.address.executor_id):
        if n.role.job_name not in WORKER_ROLES:
            continue
        key = FEED_ENDPOINT_KEY.format(executor_id=n.address.executor_id)
        try:  # blocks in the core; returns at once if a node fails or the job is aborted
            value = server.wait_for_key(key, max(0.0, deadline - time.monotonic()))
        except errors.DeadlineExceeded:
            raise errors.DeadlineExceeded(
                f"node {n.role.job_name}:{n.role.task_index} on {n.address.host} did not publish its "
                f"feed endpoint within {timeout:g}s; was the cluster started with "
                f"input_mode=InputMode.SPARK?") from None
        out.append(feeding.NodeEndpoint.decode(value))
    if not out:
        raise errors.ClusterError("InputMode.SPARK needs at least one chief/master/worker node to feed")
    return out


# ------------------------------------------------------------------------ training
def validation_epoch(epoch: int) -> int:
    """The number of the validation epoch fed after training epoch `epoch` (include/ember/feed.h)."""
    return _ember.validation_epoch(epoch)


def _feed_epoch(sc, data: Any, epoch: int, eps: List[feeding.NodeEndpoint], opts: feeding.FeedOptions,
                ended: Callable[[feeding.NodeEndpoint], bool]) -> Tuple[List[int], set, int]:
    """Feeds `data` once as epoch number `epoch` (one Spark job) and ends the epoch at every
    node; returns the rows each node got, the nodes that ended their feed (or returned), and
    the partition count."""
    num_nodes = len(eps)
    if _is_dataframe(data):
        def feed_df(batches, epoch=epoch):
            from pyspark import TaskContext
            task = TaskContext.get()
            p = task.partitionId()
            sent, gone, stopped = feeding.feed_partition(batches, p, epoch, eps, opts, task.attemptNumber())
            yield pa.RecordBatch.from_pydict(
                {"partition": [p] * len(sent), "node": list(range(len(sent))), "rows": sent, "gone": gone,
                 "stopped": stopped},
                schema=pa.schema([("partition", pa.int32()), ("node", pa.int32()), ("rows", pa.int64()),
                                  ("gone", pa.bool_()), ("stopped", pa.bool_())]))
        sent = [tuple(r) for r in data.mapInArrow(feed_df, _SENT_SCHEMA).collect()]
    else:
        def feed_rdd(p, rows, epoch=epoch):
            from pyspark import TaskContext
            sent, gone, stopped = feeding.feed_partition(feeding.rdd_rows_to_batches(rows), p, epoch, eps, opts,
                                                         TaskContext.get().attemptNumber())
            return [(p, k, n, g, st) for k, (n, g, st) in enumerate(zip(sent, gone, stopped))]
        sent = data.mapPartitionsWithIndex(feed_rdd).collect()
    # The job ran every partition it had (each reported once per node): only now is the
    # count certain (AQE may coalesce), so the driver, not the tasks, closes the epoch.
    num_partitions = len({p for p, _, _, _, _ in sent})
    for k in sorted({k for _, k, _, gone, _ in sent if gone}):
        if not ended(eps[k]):
            raise errors.Unavailable(
                f"feeding tasks could not reach node {eps[k].name} (its ring {eps[k].ring} is not on their "
                f"host and its feed server {eps[k].host}:{eps[k].port} refused), yet the node is still "
                "running; check that executors can reach each other (firewall, bind address)")
    unreachable = _ember.feed_end_epoch(eps, epoch, num_partitions, opts)
    for k, missed in enumerate(unreachable):
        if missed and not ended(eps[k]):
            raise errors.Unavailable(
                f"the driver could not tell node {eps[k].describe()} that epoch {epoch} ended, yet the node "
                f"is still running: {missed}")
    per_node = [0] * num_nodes
    for _, k, n, _, _ in sent:
        per_node[k] += n
    stopped = {k for _, k, _, gone, st in sent if st or gone}
    return per_node, stopped, num_partitions


def _await_epoch(eps: List[feeding.NodeEndpoint], epoch: int, opts: feeding.FeedOptions,
                 ended: Callable[[feeding.NodeEndpoint], bool]) -> set:
    """Waits until every node began training epoch `epoch` (so the driver never runs more
    than one epoch ahead of the slowest node); returns the nodes that ended their feed instead."""
    stopped = set()
    for k, state in enumerate(_ember.feed_await_epoch(eps, epoch, opts)):
        if state == "begun":
            continue
        if state == "gone" and not ended(eps[k]):
            raise errors.Unavailable(
                f"the driver could not ask node {eps[k].describe()} whether it began epoch {epoch} (its feed "
                f"server {eps[k].host}:{eps[k].port} refused), yet the node is still running; check that the "
                "driver can reach the executors (firewall, bind address)")
        stopped.add(k)
    return stopped


def train(sc, data: Any, num_epochs: int, endpoints: Sequence[feeding.NodeEndpoint],
          options: feeding.FeedOptions, console=None, first_epoch: int = 0,
          node_gone: Optional[Callable[[feeding.NodeEndpoint], bool]] = None,
          validation_data: Any = None, after_epoch: Optional[int] = None,
          on_fed: Optional[Callable[[int], None]] = None) -> Optional[int]:
    """Feeds `data` to the nodes for `num_epochs` epochs, numbered from `first_epoch`
    (epoch numbers never repeat within a job: nodes tell epochs apart by them), each
    followed by `validation_data` as that epoch's validation epoch if given; returns the
    rows the nodes train on in the last epoch (the same number on each), or None when
    every node ended its feed (``DataFeed.terminate()``: early stopping), after which no
    further epoch is fed.

    Before feeding an epoch the driver waits until every node began the one before
    (`after_epoch` for the first: the last epoch fed to these nodes, None if none), so it
    runs at most one epoch ahead and an early stop is seen at the next epoch boundary.

    `on_fed(epoch)` is called once each epoch's data went out (a number the nodes know).

    `node_gone(endpoint)` says whether a node whose feed server cannot be reached has
    ended (it returned from main_fun early, as TFoS allows): it is then skipped."""
    for what, d in (("Cluster.train", data), ("validation_data", validation_data)):
        if d is not None and not (_is_dataframe(d) or _is_rdd(d)):
            raise TypeError(f"{what} takes a DataFrame or an RDD, got {type(d).__name__}")
    if data is None:
        raise TypeError("Cluster.train takes a DataFrame or an RDD, got None")
    if num_epochs < 1:
        raise ValueError("num_epochs must be at least 1")
    eps, opts = list(endpoints), options
    num_nodes = len(eps)
    ended = node_gone or (lambda ep: False)
    used = 0

    def early_stop(epoch: int) -> None:
        if console is not None:
            console.info(f"epoch {epoch}: every node ended its feed (early stopping); not feeding the "
                         f"remaining {first_epoch + num_epochs - epoch} epochs of this train() call")

    previous = after_epoch
    for epoch in range(first_epoch, first_epoch + num_epochs):
        if previous is not None and len(_await_epoch(eps, previous, opts, ended)) == num_nodes:
            # Every node ended its feed (DataFeed.terminate(), e.g. Keras EarlyStopping through
            # ember.keras.StopFeedCallback) or returned: the rest of the epochs go unfed.
            early_stop(epoch)
            return None
        per_node, stopped, num_partitions = _feed_epoch(sc, data, epoch, eps, opts, ended)
        previous = epoch
        if on_fed is not None:
            on_fed(epoch)
        if len(stopped) == num_nodes:
            early_stop(epoch + 1)
            return None
        used = min(per_node) * num_nodes
        if console is not None:
            total = sum(per_node)
            console.info(f"epoch {epoch}: fed {total} rows in {num_partitions} partitions to {num_nodes} nodes; "
                         f"each trains on {min(per_node)}"
                         + (f" ({total - used} left over)" if total != used else ""))
        if validation_data is not None:
            v_nodes, v_stopped, v_partitions = _feed_epoch(sc, validation_data, validation_epoch(epoch), eps, opts,
                                                           ended)
            if len(v_stopped) == num_nodes:
                early_stop(epoch + 1)
                return None
            if console is not None:
                console.info(f"epoch {epoch}: fed {sum(v_nodes)} validation rows in {v_partitions} partitions; "
                             f"each node validates on {min(v_nodes)}")
    return used


# ------------------------------------------------------------------------ inference
def _output_fields(output_schema: Union[str, Any, None]):
    from pyspark.sql.types import StructType, _parse_datatype_string
    if output_schema is None:
        output_schema = "prediction double"
    if isinstance(output_schema, str):
        output_schema = _parse_datatype_string(output_schema)
    if not isinstance(output_schema, StructType):
        raise TypeError("output_schema must be a DDL string like 'prediction double' or a StructType")
    return output_schema


def _cast_column(col: pa.Array, target: pa.DataType, name: str, where: str) -> pa.Array:
    if col.type == target:
        return col
    try:
        return col.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise ValueError(f"inference: {where}: result column {name!r} of type {col.type} cannot be "
                         f"converted to the output schema's {target}: {e}") from None


def inference(sc, data: Any, endpoints: Sequence[feeding.NodeEndpoint], options: feeding.FeedOptions,
              output_schema=None, coordinator: Optional[Tuple[str, int, bytes]] = None):
    """DataFrame in: a DataFrame with every input column plus the output columns, in input
    order.  RDD in: an RDD of the node's results, in input order.  Lazy, like any Spark
    transformation: the feed runs when an action runs.  `coordinator` (host, port, secret)
    lets a task that finds its node gone say how the node ended."""
    eps, opts = list(endpoints), options
    num_nodes = len(eps)
    if _is_dataframe(data):
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        out_fields = _output_fields(output_schema)
        clash = set(data.columns) & set(out_fields.fieldNames())
        if clash:
            raise ValueError(f"output columns {sorted(clash)} already exist in the input DataFrame")
        full = StructType(list(data.schema.fields) + list(out_fields.fields))
        arrow_out = to_arrow_schema(full)
        n_in = len(data.schema.fields)

        def infer_df(batches):
            from pyspark import TaskContext
            p = TaskContext.get().partitionId()
            ep = eps[p % num_nodes]
            for inp, res in feeding.infer_partition(batches, p, ep, opts, coordinator):
                where = f"node {ep.name}, partition {p}"
                if res.num_columns < len(out_fields.fields):
                    raise ValueError(f"inference: {where} returned {res.num_columns} result columns, the "
                                     f"output schema has {len(out_fields.fields)}: {out_fields.simpleString()}")
                cols = list(inp.columns)
                names = res.schema.names
                for i, field in enumerate(arrow_out.field(j) for j in range(n_in, len(arrow_out))):
                    col = res.column(names.index(field.name)) if field.name in names else res.column(i)
                    cols.append(_cast_column(col, field.type, field.name, where))
                yield pa.RecordBatch.from_arrays(cols, schema=arrow_out)
        return data.mapInArrow(infer_df, full)
    if _is_rdd(data):
        from ember import _arrow_rows as rows_mod

        def infer_rdd(p, rows):
            ep = eps[p % num_nodes]
            for _, res in feeding.infer_partition(feeding.rdd_rows_to_batches(rows), p, ep, opts, coordinator):
                yield from rows_mod.batch_to_rows(res)
        return data.mapPartitionsWithIndex(infer_rdd)
    raise TypeError(f"Cluster.inference takes a DataFrame or an RDD, got {type(data).__name__}")


def end_feed(endpoints: Sequence[feeding.NodeEndpoint], secret: bytes, timeout: float) -> None:
    """Tells every fed node that no more data will come (its DataFeed.should_stop() turns True).
    A node that cannot be reached has ended (its launcher reports how)."""
    _ember.feed_end_feed(list(endpoints), feeding.feed_options(secret, feed_timeout=timeout))
