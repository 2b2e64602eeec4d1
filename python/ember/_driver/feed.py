"""The driver's side of InputMode.SPARK: ``Cluster.train``'s epoch loop (:class:`Feed`, the one
owner of the job's epoch state), ``Cluster.inference``, end of feed.

Feeding runs as ordinary Spark jobs beside the nodes' barrier stage, so it needs
task slots the nodes do not hold (e.g. ``local[4]`` for 2 nodes).  Partitions
reach nodes by an explicit plan made here (no executor-identity files): see
ember._feeder.task for how rows are spread and why every node gets the same count.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple, Union

import pyarrow as pa

from ember import _arrow_rows, _ember, _hadoop, _jvm, config, errors
from ember._driver.console import Console
from ember._driver.scan import FileScan, parquet_scan
from ember._driver.spark_job import spark_error_summary
from ember._feeder import task as feeding
from ember._names import FEED_ENDPOINT_KEY, WORKER_ROLES

_SENT_SCHEMA = "partition int, node int, rows long, gone boolean, stopped boolean"


def _is_dataframe(data: Any) -> bool:
    return hasattr(data, "mapInArrow") and hasattr(data, "schema")


def _is_rdd(data: Any) -> bool:
    return hasattr(data, "mapPartitionsWithIndex") and hasattr(data, "getNumPartitions")


def check_feed_slots(side, num_nodes: int) -> None:
    """Feeding tasks need slots the nodes' barrier tasks do not hold (not checked where Spark
    does not say how many there are: Spark Connect on a cluster master)."""
    have = side.task_slots()
    if have is not None and have <= num_nodes:
        # A count kept from before every executor registered (Connect counts with a job and keeps
        # the answer a while) must not fail the job: ask again before refusing.
        have = side.task_slots(fresh=True)
    if have is not None and have <= num_nodes:
        raise errors.ClusterError(
            f"InputMode.SPARK feeds the {num_nodes} nodes from Spark tasks that run beside them, but "
            f"the application's {have} task slots are all held by the nodes (master {side.master}). "
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


def _sent_batch(p: int, sent, gone, stopped) -> pa.RecordBatch:
    """A feeding task's report (_SENT_SCHEMA): the rows it sent each node, who was gone or stopped."""
    return pa.RecordBatch.from_pydict(
        {"partition": [p] * len(sent), "node": list(range(len(sent))), "rows": list(sent), "gone": list(gone),
         "stopped": list(stopped)},
        schema=pa.schema([("partition", pa.int32()), ("node", pa.int32()), ("rows", pa.int64()),
                          ("gone", pa.bool_()), ("stopped", pa.bool_())]))


class PackedRows(NamedTuple):
    """A DataFrame fed as rows whose array<float> `columns` Ember's Spark extension packs (one
    little-endian float32 binary per row, written into Arrow with one copy instead of element
    by element); the batches say so (_arrow_rows.PACKED_KEY) and the nodes see float32 again."""
    df: Any
    columns: Tuple[str, ...]


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _float_array_columns(df: Any) -> Tuple[str, ...]:
    """The names of `df`'s array<float> columns."""
    from pyspark.sql.types import ArrayType, FloatType

    return tuple(f.name for f in df.schema.fields
                 if isinstance(f.dataType, ArrayType) and isinstance(f.dataType.elementType, FloatType))


def packable_columns(df: Any) -> Tuple[str, ...]:
    """The array<float> columns of `df` that ember_pack_floats can pack: () when it has none,
    its column names repeat, or the session lacks Ember's extension (ember.spark_conf())."""
    names = df.columns
    packed = _float_array_columns(df)
    if not packed or len(set(names)) != len(names) or not _jvm.has_pack_floats(df.sparkSession):
        return ()
    return packed


def pack_rows(df: Any) -> Tuple[Any, Tuple[str, ...]]:
    """`df` with its array<float> columns packed by ember_pack_floats, and their names; `df`
    and () when :func:`packable_columns` finds none."""
    packed = packable_columns(df)
    if not packed:
        return df, ()
    return df.select(*_packed_columns(df, packed)), packed


def _packed_columns(df: Any, packed: Sequence[str]) -> List[Any]:
    """`df`'s columns as Columns, those named in `packed` through ember_pack_floats."""
    from pyspark.sql import functions as F

    return [F.call_function(_jvm.PACK_FLOATS, F.col(_quoted(c))).alias(c) if c in packed else F.col(_quoted(c))
            for c in df.columns]


def _feed_epoch(data: Any, epoch: int, eps: List[feeding.NodeEndpoint], opts: feeding.FeedOptions,
                ended: Callable[[feeding.NodeEndpoint], bool]) -> Tuple[List[int], set, int]:
    """Feeds `data` once as epoch number `epoch` (one Spark job) and ends the epoch at every
    node; returns the rows each node got, the nodes that ended their feed (or returned), and
    the partition count."""
    num_nodes = len(eps)
    if isinstance(data, FileScan):  # one task per file sends references to its rows
        files, columns, fs_conf = data.files, data.columns, data.fs_conf

        def feed_files(batches, epoch=epoch):
            from pyspark import TaskContext
            task = TaskContext.get()
            p = task.partitionId()
            uris = [files[int(i)] for b in batches for i in b.column(0).to_pylist()]
            sent, gone, stopped = feeding.feed_partition(feeding.file_rows(uris, columns, fs_conf), p, epoch, eps,
                                                         opts, task.attemptNumber())
            yield _sent_batch(p, sent, gone, stopped)
        tasks = data.spark.range(0, len(files), 1, len(files))
        sent = [tuple(r) for r in tasks.mapInArrow(feed_files, _SENT_SCHEMA).collect()]
    elif isinstance(data, PackedRows) or _is_dataframe(data):
        df, meta = (data.df, _arrow_rows.packed_meta(data.columns)) if isinstance(data, PackedRows) else (data, None)

        def feed_df(batches, epoch=epoch):
            from pyspark import TaskContext
            task = TaskContext.get()
            p = task.partitionId()
            batches = (_arrow_rows.mark_packed(b, meta) for b in batches)
            sent, gone, stopped = feeding.feed_partition(batches, p, epoch, eps, opts, task.attemptNumber())
            yield _sent_batch(p, sent, gone, stopped)
        sent = [tuple(r) for r in df.mapInArrow(feed_df, _SENT_SCHEMA).collect()]
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


def feed_epoch(data: Any, epoch: int, eps: List[feeding.NodeEndpoint], opts: feeding.FeedOptions,
               ended: Callable[[feeding.NodeEndpoint], bool], validation_data: Any = None,
               after_epoch: Optional[int] = None, console=None,
               on_fed: Optional[Callable[[int], None]] = None) -> Optional[int]:
    """One epoch of :meth:`Feed.train`'s loop: waits until every node began `after_epoch` (the
    last epoch fed to these nodes; None if none), so the driver runs at most one epoch ahead
    and an early stop is seen at the next epoch boundary; feeds `data` as epoch `epoch` (one
    Spark job), then `validation_data`, if given, as its validation epoch.  Returns the rows
    the nodes train on in this epoch (the same number on each), or None when every node ended
    its feed (``DataFeed.terminate()``: early stopping) before or during it.

    `on_fed(epoch)` is called once the epoch's data went out (a number the nodes know).
    `ended(endpoint)` says whether a node whose feed server cannot be reached has ended (it
    returned from main_fun early, as TFoS allows): it is then skipped."""
    num_nodes = len(eps)
    if after_epoch is not None and len(_await_epoch(eps, after_epoch, opts, ended)) == num_nodes:
        # Every node ended its feed (DataFeed.terminate(), e.g. Keras EarlyStopping through
        # ember.keras.StopFeedCallback) or returned: the rest of the epochs go unfed.
        return None
    per_node, stopped, num_partitions = _feed_epoch(data, epoch, eps, opts, ended)
    if on_fed is not None:
        on_fed(epoch)
    if len(stopped) == num_nodes:
        return None
    used = min(per_node) * num_nodes
    if console is not None:
        total = sum(per_node)
        console.info(f"epoch {epoch}: fed {total} rows in {num_partitions} partitions to {num_nodes} nodes; "
                     f"each trains on {min(per_node)}"
                     + (f" ({total - used} left over)" if total != used else ""))
    if validation_data is not None:
        v_nodes, v_stopped, v_partitions = _feed_epoch(validation_data, validation_epoch(epoch), eps, opts,
                                                       ended)
        if len(v_stopped) == num_nodes:
            return None
        if console is not None:
            console.info(f"epoch {epoch}: fed {sum(v_nodes)} validation rows in {v_partitions} partitions; "
                         f"each node validates on {min(v_nodes)}")
    return used


# ------------------------------------------------------------------------ streaming under Connect
# Epoch numbers reserved for one train_stream under Spark Connect: its feeder numbers its epochs
# itself, on the server, and the client, which cannot see how many it fed, goes on past the range.
STREAM_EPOCHS = 1 << 20


class StreamFeeder:
    """The foreachBatch function of ``Cluster.train_stream`` from a Spark Connect client.

    Spark Connect runs a foreachBatch function in a Python process of its server, one process per
    query, kept for the query's life; this object is pickled there (by reference to this class:
    the server's Python has Ember, as the executors' has).  It feeds each non-empty micro-batch as
    one epoch with :func:`feed_epoch`, as ``train(batch, num_epochs=1)`` does in a classic driver:
    to the endpoints the client gave it, with its options, epochs numbered from `first_epoch`
    within the range the client reserved, the next one fed only once every node began the last.

    Its Spark jobs carry the feed's job-group tag in the client's session (the process joins that
    session): the client's abort (a node failed) interrupts them, and the query then fails with
    the error.  A node that cannot be reached is an error here: this process cannot ask the
    coordinator whether it returned (the client names a failed node)."""

    def __init__(self, endpoints: List[feeding.NodeEndpoint], options: feeding.FeedOptions, group: str,
                 job_id: str, first_epoch: int, after_epoch: Optional[int]):
        self._endpoints = endpoints
        self._options = options
        self._group = group
        self._job_id = job_id
        self._next = first_epoch
        self._end = first_epoch + STREAM_EPOCHS
        self._after = after_epoch

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        from ember._driver.spark_side import spark_side

        if batch_df.isEmpty():
            return
        if self._next >= self._end:
            raise errors.ClusterError(
                f"Cluster.train_stream (job {self._job_id}): this query fed the {STREAM_EPOCHS} epochs reserved "
                "for it; stop it and call train_stream again")
        epoch = self._next
        self._next += 1
        console = Console(live=False)  # the Connect server's log
        console.info(f"job {self._job_id}: feeding micro-batch {batch_id} as epoch {epoch}")
        side = spark_side(batch_df.sparkSession)
        with side.job_group(self._group, f"Ember job {self._job_id}: feeding micro-batch {batch_id}"):
            used = feed_epoch(batch_df, epoch, self._endpoints, self._options, self._unreachable,
                              after_epoch=self._after, console=console)
        self._after = epoch
        if used is None:
            console.info(f"job {self._job_id}: every node ended its feed; nothing more is fed (the query goes on)")

    def _unreachable(self, endpoint: feeding.NodeEndpoint) -> bool:
        raise errors.Unavailable(
            f"Cluster.train_stream (job {self._job_id}): node {endpoint.describe()} cannot be reached from the "
            f"Spark Connect server's streaming feeder (feed server {endpoint.host}:{endpoint.port}): the node "
            "ended or failed; the client names a failed node (Cluster.shutdown())")


class Feed:
    """The driver's feed of one job (InputMode.SPARK): the one epoch loop (:meth:`train`), the
    feed endpoints, and the epoch state kept across train() calls and restarts.

    Epochs are numbered across train() calls: numbers never repeat within a job (nodes tell
    epochs apart by them), and after a restart the interrupted epoch is fed again from its
    start under a new number.  The endpoints and the last epoch fed belong to one gang (its
    ``node_job_id``): a restart's new gang has new endpoints and has been fed nothing.

    Each epoch runs on a thread of its own under the feed's Spark job group, and the driver
    waits for that thread or a failure, whichever comes first: the epoch's own waits on the
    nodes (the feeding tasks' sends, which may be blocked on a node behind a partition; the
    epoch boundaries, which ask every node's feed server) have deadlines of feed_timeout,
    minutes by default, and a node failure must not wait for them.  :meth:`cancel` (the gang's
    ``on_abort``) cancels the job group and wakes that wait; the thread then ends by itself.

    The `gang` passed to the methods is the job's ember._driver.gang.Gang (its coordinator,
    watcher, secret, restarts).  One train() runs at a time; cancel() is thread-safe.
    """

    def __init__(self, side, job_id: str, console, pack_rows: bool = True):
        self._side = side  # ember._driver.spark_side.SparkSide
        self.pack_rows = pack_rows  # Python nodes: rows' array<float> columns may be fed packed (_rows)
        self._job_id = job_id
        self._console = console
        self.epochs_fed = 0  # the next epoch's number
        self._last_epoch: Optional[int] = None  # the last epoch fed to the gang _last_epoch_of
        self._last_epoch_of = ""
        self._endpoints: Optional[List[feeding.NodeEndpoint]] = None  # those of the gang _endpoints_of
        self._endpoints_of = ""
        self._train_lock = threading.Lock()  # one train() at a time (streaming batches too)
        self._lock = threading.Lock()
        # The feeding Spark jobs run under this job group: a node failure cancels it, since its
        # tasks may be blocked sending to a node that is gone (a network partition).
        self._group = f"{job_id}-feed"
        self._woken: Optional[threading.Event] = None  # set to end the driver's wait for an epoch
        # train_stream queries a Connect server feeds (StreamFeeder); guarded by _lock (cancel() reads it).
        self._server_streams: List[Any] = []
        # Parquet copies to remove when the job ends (_cache): (directory, fs conf or None); _lock
        self._caches: List[Tuple[str, Optional[Tuple[str, str]]]] = []
        self._copies_made = 0

    def endpoints(self, gang) -> List[feeding.NodeEndpoint]:
        """The current gang's feed endpoints (a restart's new gang has new ones)."""
        if self._endpoints is None or self._endpoints_of != gang.node_job_id:
            self._endpoints = feed_endpoints(gang.server, gang.nodes())
            self._endpoints_of = gang.node_job_id
        return self._endpoints

    def options(self, gang, feed_timeout: Optional[float]) -> feeding.FeedOptions:
        return feeding.feed_options(secret=gang.secret, feed_timeout=feed_timeout,
                                    transport=str(config.get("feed_transport", self._side)))

    def train(self, gang, data: Any, num_epochs: int, feed_timeout: Optional[float] = None,
              validation_data: Any = None) -> None:
        """``Cluster.train``'s loop: feeds `data` for `num_epochs` epochs (each followed by
        `validation_data`'s validation epoch if given), one at a time; returns early when every
        node ended its feed.  A node failure restarts the gang while restarts are left
        (``gang.recover``) and feeds the interrupted epoch again; otherwise the job is closed
        and the failure raised."""
        for what, d in (("Cluster.train", data), ("validation_data", validation_data)):
            if d is not None and not (_is_dataframe(d) or _is_rdd(d)):
                raise TypeError(f"{what} takes a DataFrame or an RDD, got {type(d).__name__}")
        if data is None:
            raise TypeError("Cluster.train takes a DataFrame or an RDD, got None")
        data = self._source(data, "Cluster.train", num_epochs)
        if validation_data is not None:
            validation_data = self._source(validation_data, "validation_data", num_epochs)
        with self._train_lock:
            self._refuse_while_the_server_streams("Cluster.train")
            done = 0
            while done < num_epochs:
                epoch = self.epochs_fed
                self.epochs_fed += 1
                fed: List[int] = []
                try:
                    eps, opts = self.endpoints(gang), self.options(gang, feed_timeout)
                    after = self._last_epoch if self._last_epoch_of == gang.node_job_id else None
                    used = self._on_thread(gang, epoch, lambda: feed_epoch(
                        data, epoch, eps, opts, lambda ep: gang.node_ended(ep.executor_id),
                        validation_data=validation_data, after_epoch=after, console=self._console,
                        on_fed=fed.append))
                except Exception as e:  # noqa: BLE001 - a node's failure explains a failed feed best
                    failure = gang.watcher.known_failure(wait=2.0)
                    if failure is None:
                        if type(e).__name__ == "Py4JJavaError" or \
                                type(e).__module__.startswith("pyspark.errors.exceptions.connect"):
                            raise errors.ClusterError(f"Cluster.train: the feeding Spark job failed: "
                                                      f"{spark_error_summary(e, self._side)}") from e
                        raise
                    try:
                        gang.recover(failure)
                    except BaseException:
                        # The job is over: stop everything now, so shutdown() has nothing left to do.
                        gang.close(abort_reason=f"node {failure.job_name}:{failure.task_index} failed")
                        self.remove_caches()
                        raise
                    self._console.info(f"feeding epoch {epoch}, which the failure interrupted, again "
                                       f"from its start (as epoch {self.epochs_fed})")
                    continue
                if fed:
                    self._last_epoch, self._last_epoch_of = fed[-1], gang.node_job_id
                else:  # stopped before feeding: the number was never used
                    self.epochs_fed -= 1
                if used is None:  # every node ended its feed (early stopping): nothing more to feed
                    left = num_epochs - done - (1 if fed else 0)
                    self._console.info(f"epoch {epoch}: every node ended its feed (early stopping); not feeding "
                                       f"the remaining {left} of the {num_epochs} epochs of this train() call")
                    return
                done += 1

    def _source(self, data: Any, what: str, epochs: int) -> Any:
        """What feeds `data`: a plain Parquet scan's files (the nodes read them in place); for any
        other DataFrame fed ``epochs`` >= 2 times where spark.ember.feed.cacheDir is set, the files
        of a Parquet copy written once (:meth:`_cache`); else `data` itself (its rows through
        Spark).  The choice is logged (spark.ember.feed.source=spark: always the rows)."""
        if not _is_dataframe(data):
            return data
        if config.get("feed_source", self._side) == "spark":
            return self._rows(data, what, "")
        scan, why = parquet_scan(data, self._side)
        if scan is None:
            cached, why_not = self._cache(data, what, epochs, why)
            if cached is not None:
                return cached
            return self._rows(data, what, f": {why}{why_not}")
        self._console.info(f"{what}: the DataFrame is a plain Parquet scan of {len(scan.files)} file(s): the "
                           f"nodes read its columns {scan.columns} in place (spark.ember.feed.source=spark "
                           "feeds its rows instead)")
        return scan

    def _rows(self, data: Any, what: str, why: str) -> Any:
        """`data` fed as rows through Spark: as :class:`PackedRows` where Ember's Spark extension
        can pack its array<float> columns and the nodes are Python (a program node reads the
        Arrow batches itself); logged, with `why` (the rows were chosen over a scan or a copy)."""
        df, packed = pack_rows(data) if self.pack_rows else (data, ())
        self._console.info(f"{what}: feeding the DataFrame's rows through Spark{why}"
                           + (f"; its array<float> column(s) {list(packed)} packed by Ember's Spark extension"
                              if packed else ""))
        return PackedRows(df, packed) if packed else data

    def _cache(self, data: Any, what: str, epochs: int, why: str) -> Tuple[Optional[FileScan], str]:
        """Petastorm's converter idea: a DataFrame that is not a plain scan, fed >= 2 epochs, is
        written once as Parquet under spark.ember.feed.cacheDir (a directory every node can read:
        HDFS, or storage every host mounts), and its files are read in place each epoch; the copy
        is removed when the job ends (:meth:`remove_caches`).  (None, why not) where that does not
        apply: no cacheDir, one epoch (one pass of the rows costs less than writing and reading a
        copy), or a column the nodes' Parquet reading does not take."""
        cache_dir = config.get("feed_cache_dir", self._side)
        if not cache_dir:
            return None, ""
        if epochs < 2:
            return None, f" (one epoch: not worth a Parquet copy under {cache_dir})"
        bad = [f"{f.name} ({f.dataType.simpleString()})" for f in data.schema.fields
               if not _cacheable(f.dataType)]
        if bad:
            return None, f" (not copied under {cache_dir}: column {bad[0]} is not a number, string, binary or " \
                         "array of those)"
        with self._lock:
            self._copies_made += 1
            path = f"{str(cache_dir).rstrip('/')}/{self._job_id}-feed-{self._copies_made}"
            entry = (path, None)
            self._caches.append(entry)  # from now on: a failed write leaves nothing behind either
        started = time.monotonic()
        try:
            data.write.mode("errorifexists").parquet(path)
            scan, why_copy = parquet_scan(data.sparkSession.read.parquet(path), self._side)
        except BaseException as e:
            self._discard(entry)
            if isinstance(e, Exception):
                raise errors.ClusterError(f"{what}: writing its Parquet copy to {path} (spark.ember.feed.cacheDir) "
                                          f"failed: {spark_error_summary(e, self._side)}") from e
            raise
        if scan is None:  # e.g. the driver cannot open the written files: remove them, feed the rows
            self._discard(entry)
            return None, f" (its Parquet copy under {cache_dir} cannot be read in place: {why_copy})"
        directory = scan.files[0].rsplit("/", 1)[0]  # as the nodes will name the files
        with self._lock:
            kept = entry in self._caches  # not if the job ended meanwhile (remove_caches)
            if kept:
                self._caches[self._caches.index(entry)] = (directory, scan.fs_conf)
        if not kept:
            self._remove(directory, scan.fs_conf)
            raise errors.ClusterError(f"{what}: the job ended while its Parquet copy was being written")
        self._console.info(f"{what}: the DataFrame is not a plain Parquet scan ({why}): written once as Parquet "
                           f"to {directory} ({len(scan.files)} file(s), {time.monotonic() - started:.1f} s), which "
                           f"the nodes read in place each of the {epochs} epochs; removed when the job ends "
                           "(spark.ember.feed.cacheDir)")
        return scan, ""

    def remove_caches(self) -> None:
        """Removes the Parquet copies :meth:`_cache` wrote (at the job's end, whatever its outcome)."""
        with self._lock:
            caches, self._caches = self._caches, []
        for directory, fs_conf in caches:
            self._remove(directory, fs_conf)

    def _discard(self, entry: Tuple[str, None]) -> None:
        """A copy that will not be used: off the list, and removed now."""
        with self._lock:
            if entry in self._caches:
                self._caches.remove(entry)
        self._remove(*entry)

    def _remove(self, directory: str, fs_conf: Optional[Tuple[str, str]]) -> None:
        try:
            fs_conf = fs_conf or self._side.hadoop_fs_conf()
            _ember.fs_delete_recursively(directory, _hadoop.resolve_options(*fs_conf))
        except errors.NotFound:  # nothing there (a write that failed before making it)
            pass
        except Exception as e:  # noqa: BLE001 - the job's outcome stands; say what is left behind
            self._console.info(f"could not remove the feed's Parquet copy {directory}: {type(e).__name__}: {e}; "
                               "remove it by hand")

    def _on_thread(self, gang, epoch: int, work: Callable[[], Optional[int]]) -> Optional[int]:
        """Runs `work` (one epoch) on a thread of its own under the feed's job group and returns
        what it returns, or raises the job's failure the moment one is known (see the class doc)."""
        watcher = gang.watcher
        if watcher.failure is not None:  # failed before the feed started
            raise watcher.failure
        box: dict = {}
        woken = threading.Event()

        def run() -> None:
            try:  # job groups are per thread: this one's jobs only
                with self._side.job_group(self._group, f"Ember job {self._job_id}: feeding epoch {epoch}"):
                    box["value"] = work()
            except BaseException as e:  # noqa: BLE001 - raised on the caller's thread
                box["error"] = e
            finally:
                woken.set()

        with self._lock:
            self._woken = woken
        self._side.thread(run, f"{self._job_id}-feed-{epoch}").start()
        try:
            woken.wait()  # the epoch ended, or a node failed (cancel)
        except BaseException:  # e.g. KeyboardInterrupt: the feed must not go on by itself
            self.cancel()
            raise
        finally:
            with self._lock:
                self._woken = None
        if "error" in box:
            raise box["error"]
        if "value" in box:
            return box["value"]
        failure = watcher.known_failure(wait=2.0)
        if failure is not None:
            raise failure
        gang.raise_if_failed(spark_must_run=False)  # the nodes' Spark job failed
        raise errors.ClusterError(f"Cluster.train: the job was aborted while feeding epoch {epoch}")

    def cancel(self) -> None:
        """Ends train()'s epoch, if one runs: cancels its Spark job (whose tasks may be blocked
        sending to a node that is gone: a partitioned host answers nothing) and wakes the driver's
        wait for it.  Thread-safe (the watcher calls it, through the gang's on_abort)."""
        with self._lock:
            woken, streaming = self._woken, bool(self._server_streams)
        if woken is None and not streaming:
            return
        self._side.cancel(self._group)  # a StreamFeeder's jobs on the Connect server carry the group too
        if woken is not None:
            woken.set()

    def inference(self, gang, data: Any, feed_timeout: Optional[float], output_schema: Any = None):
        """``Cluster.inference``: see :func:`inference`."""
        host, port = gang.coordinator_address.rsplit(":", 1)
        return inference(data, self.endpoints(gang), self.options(gang, feed_timeout),
                         output_schema=output_schema, coordinator=(host, int(port), gang.secret),
                         pack=self.pack_rows, ring_bytes=gang.feed_ring_bytes)

    def stream_from_server(self, gang, stream_df: Any, feed_timeout: Optional[float], writer_options: dict,
                           trigger: Optional[dict]) -> Any:
        """``Cluster.train_stream`` from a Spark Connect client: starts the query with a
        :class:`StreamFeeder` as its foreachBatch function, which the Connect server runs.  The
        client reserves the feeder's epoch numbers and feeds nothing itself while it runs."""
        with self._train_lock:
            self._refuse_while_the_server_streams("Cluster.train_stream")
            if gang.watcher.failure is not None:
                raise gang.watcher.failure
            first = self.epochs_fed
            if first + STREAM_EPOCHS >= _ember.validation_epoch(0):
                raise errors.ClusterError("Cluster.train_stream: this job has used up its epoch numbers")
            after = self._last_epoch if self._last_epoch_of == gang.node_job_id else None
            feeder = StreamFeeder(self.endpoints(gang), self.options(gang, feed_timeout), self._group, self._job_id,
                                  first, after)
            writer = stream_df.writeStream.foreachBatch(feeder)
            for key, value in writer_options.items():
                writer = writer.option(key, value)
            if trigger:
                writer = writer.trigger(**trigger)
            query = writer.start()
            # Whatever the feeder fed, its numbers stay below the range's end; the last epoch it fed
            # is not known here, so the next train() does not wait for the nodes to begin it.
            self.epochs_fed = first + STREAM_EPOCHS
            self._last_epoch, self._last_epoch_of = None, ""
            with self._lock:
                self._server_streams.append(query)
        self._console.info(f"train_stream: the Spark Connect server feeds each micro-batch of query {query.id} "
                           f"(its lines are in the server's log)")
        return query

    def _refuse_while_the_server_streams(self, what: str) -> None:
        with self._lock:
            queries = list(self._server_streams)
        active = [q for q in queries if _query_active(q)]  # asks the server: outside the lock
        with self._lock:
            self._server_streams = active
        if active:
            raise errors.ClusterError(
                f"{what}: streaming query {active[0].id} (train_stream) still feeds this cluster from the Spark "
                "Connect server; stop it (query.stop(), or let an availableNow/once trigger finish) first")

    def stop_server_streams(self, timeout: float = 60.0) -> None:
        """Stops the train_stream queries a Connect server still runs (``Cluster.shutdown``), each
        within `timeout` seconds; a query that does not stop is named in the log."""
        with self._lock:
            queries = list(self._server_streams)
        for query in queries:
            if not _query_active(query):
                continue
            self._console.info(f"stopping streaming query {query.id} (train_stream) before the shutdown")
            stopper = threading.Thread(target=query.stop, name=f"{self._job_id}-stop-stream", daemon=True)
            stopper.start()
            stopper.join(timeout)
            if stopper.is_alive():
                self._console.info(f"streaming query {query.id} did not stop within {timeout:g}s; going on")
        with self._lock:  # kept while they stop: a node failure meanwhile still interrupts their jobs
            self._server_streams = []

    def end(self, gang, timeout: float = 30.0) -> None:
        """Tells the current gang's fed nodes that no more data will come (``Cluster.shutdown``),
        once any train_stream query a Connect server runs has stopped."""
        self.stop_server_streams()
        end_feed(self.endpoints(gang), gang.secret, timeout=timeout)


def _cacheable(t: Any) -> bool:
    """Whether a Parquet copy keeps a column of type `t` as the rows feed would give it."""
    from pyspark.sql.types import ArrayType, BinaryType, BooleanType, DecimalType, NumericType, StringType
    if isinstance(t, ArrayType):
        return _cacheable(t.elementType) and not isinstance(t.elementType, ArrayType)
    return isinstance(t, (NumericType, StringType, BinaryType, BooleanType)) and not isinstance(t, DecimalType)


def _query_active(query: Any) -> bool:
    try:
        return bool(query.isActive)
    except Exception:  # noqa: BLE001 - the session is gone: so is its query
        return False


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


def _result_columns(res: pa.RecordBatch, fields: pa.Schema, where: str) -> List[pa.Array]:
    """A node's result batch as the output schema's columns: by name where the node named them,
    else by position; each cast to the schema's type."""
    if res.num_columns < len(fields):
        raise ValueError(f"inference: {where} returned {res.num_columns} result columns, the output schema has "
                         f"{len(fields)}: {', '.join(f'{f.name} {f.type}' for f in fields)}")
    names = res.schema.names
    return [_cast_column(res.column(names.index(f.name)) if f.name in names else res.column(i), f.type, f.name, where)
            for i, f in enumerate(fields)]


def _feeding_task(eps: List[feeding.NodeEndpoint], opts: feeding.FeedOptions,
                  coordinator: Optional[Tuple[str, int, bytes]], packed: Sequence[str], result: pa.Schema,
                  out: pa.Schema, with_inputs: bool) -> Callable[[Any], Any]:
    """A feeding task of inference: its partition's record batches to the partition's node (those
    of `packed` marked packed), the node's answers out as `out`: the result columns, after the
    input columns `with_inputs`."""
    meta = _arrow_rows.packed_meta(packed)

    def infer(batches):
        from pyspark import TaskContext
        p = TaskContext.get().partitionId()
        ep = eps[p % len(eps)]
        where = f"node {ep.name}, partition {p}"
        batches = (_arrow_rows.mark_packed(b, meta) for b in batches)
        for inp, res in feeding.infer_partition(batches, p, ep, opts, coordinator):
            cols = _result_columns(res, result, where)
            yield pa.RecordBatch.from_arrays(list(inp.columns) + cols if with_inputs else cols, schema=out)
    return infer


def _joins_by_position(df: Any) -> bool:
    """Whether Spark can keep `df`'s rows and join the nodes' results to them by position
    (InferByPosition.scala): a classic session with Ember's extension, column names unique."""
    from ember._driver.spark_side import is_connect_session

    return (not is_connect_session(df.sparkSession) and len(set(df.columns)) == len(df.columns)
            and _jvm.has_pack_floats(df.sparkSession))


def inference(data: Any, endpoints: Sequence[feeding.NodeEndpoint], options: feeding.FeedOptions,
              output_schema=None, coordinator: Optional[Tuple[str, int, bytes]] = None, pack: bool = False,
              ring_bytes: int = 64 << 20):
    """DataFrame in: a DataFrame with every input column plus the output columns, in input
    order.  RDD in: an RDD of the node's results, in input order.  Lazy, like any Spark
    transformation: the feed runs when an action runs.  `coordinator` (host, port, secret)
    lets a task that finds its node gone say how the node ended.

    With Ember's Spark extension in a classic session, Spark keeps each row and appends the
    nodes' results by position (:func:`ember._jvm.infer_by_position`): only the fed columns
    go to Python and only the results come back.  Otherwise (Spark Connect, no extension) the
    feeding tasks are a ``mapInArrow`` that hands every column back.  With `pack` (Python
    nodes) and the extension, array<float> columns reach the nodes packed (:func:`pack_rows`;
    on the ``mapInArrow`` way, ember_unpack_floats restores them in the output).  `ring_bytes`:
    the nodes' feed ring; the joined way sends batches of an eighth of it (a node keeps its
    last batch while it reads the next, and batches that fill much of the ring make it copy
    the kept one at each wrap)."""
    eps, opts = list(endpoints), options
    num_nodes = len(eps)
    if _is_dataframe(data):
        from pyspark.sql import functions as F
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        out_fields = _output_fields(output_schema)
        clash = set(data.columns) & set(out_fields.fieldNames())
        if clash:
            raise ValueError(f"output columns {sorted(clash)} already exist in the input DataFrame")
        arrow_result = to_arrow_schema(out_fields)
        if _joins_by_position(data):
            packed = _float_array_columns(data) if pack else ()  # the checks of packable_columns just passed
            infer_joined = _feeding_task(eps, opts, coordinator, packed, arrow_result, arrow_result, False)
            return _jvm.infer_by_position(data, infer_joined, _packed_columns(data, packed), out_fields,
                                          max(1, ring_bytes // 8), "cluster.inference")

        in_names = data.columns
        fed, packed = pack_rows(data) if pack else (data, ())
        full = StructType(list(fed.schema.fields) + list(out_fields.fields))
        infer_df = _feeding_task(eps, opts, coordinator, packed, arrow_result, to_arrow_schema(full), True)
        out = fed.mapInArrow(infer_df, full)
        if not packed:
            return out
        return out.select(*[F.call_function(_jvm.UNPACK_FLOATS, F.col(_quoted(c))).alias(c) if c in packed
                            else F.col(_quoted(c)) for c in in_names + out_fields.fieldNames()])
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
