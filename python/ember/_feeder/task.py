"""The Spark side of InputMode.SPARK: what feeding tasks run.

The protocol lives in the C++ core (``include/ember/feed.h``): how rows are split
over the nodes, the end-of-partition accounting, sessions, the exactly-one-result
checks and the choice of shared memory or TCP.  This module is Spark glue only:
Arrow record batches in, Arrow IPC streams to the core's producers (in parts that
reference the batches' own buffers: the core copies them once, into the node's ring),
result batches out, paired with their inputs.

``cluster.train`` feeds each epoch as one Spark job.  For a plain Parquet scan the tasks send
references to the files' rows instead of the rows (``FileRows``, split the same way), and the
nodes read them in place.  A task splits every Arrow
batch of its partition into contiguous slices, one per node, by the counts the
core's producer gives (``FeedProducer.split``: every node within one row of the
others), and the producer ends the partition at every node with every node's
count.  ``cluster.inference`` sends partition p wholly to node p % num_nodes; its
results come back, in order, to the task that sent them.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa

from ember import _arrow_rows as rows_mod
from ember import _ember
from ember import errors
from ember._names import NODE_END_KEY
from ember._feeder import worker
from ember._parquet_io import FileRows

RDD_CHUNK_ROWS = 4096  # RDD rows per Arrow batch

NodeEndpoint = _ember.NodeEndpoint
FeedOptions = _ember.FeedOptions

_TRANSPORTS = {"auto": _ember.Transport.AUTO, "shm": _ember.Transport.SHM, "tcp": _ember.Transport.TCP}


def feed_options(secret: bytes, feed_timeout: Optional[float] = None, transport: Optional[str] = None) -> FeedOptions:
    """The producers' options: `feed_timeout` is FeedOptions.idle_timeout (seconds a wait may make
    no progress, on this side and at the node's feed server); what is not given keeps the core's default."""
    options = FeedOptions()
    options.secret = secret
    if feed_timeout is not None:
        options.idle_timeout = float(feed_timeout)
    if transport is not None:
        if transport not in _TRANSPORTS:
            raise ValueError(f"feed transport must be one of {sorted(_TRANSPORTS)}, got {transport!r}")
        options.transport = _TRANSPORTS[transport]
    return options


def split_rows(rows: int, sent: Sequence[int], first: int) -> List[int]:
    """How many of the next `rows` rows of a partition go to each node (the core's SplitRows)."""
    return _ember.split_rows(rows, list(sent), first)


def _framed(batch: pa.RecordBatch) -> pa.Buffer:
    """`batch` as one contiguous Arrow IPC stream behind BATCH_HEADER_BYTES of room the core
    fills in (for ``send_batch_in_place``; the feed itself sends ``_ipc_parts``)."""
    sink = pa.BufferOutputStream()
    sink.write(bytes(_ember.BATCH_HEADER_BYTES))
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


class _PartsSink:
    """A write-only file for pyarrow's IPC writer that keeps what it is handed: small metadata
    pieces, and the record batch's own buffers by reference (pyarrow hands those over without
    a copy).  The core copies the parts once, straight into the node's ring."""

    __slots__ = ("parts", "size", "closed")

    def __init__(self):
        self.parts: List = []
        self.size = 0
        self.closed = False

    def write(self, data) -> None:
        self.parts.append(data)
        self.size += len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _ipc_parts(batch: pa.RecordBatch) -> _PartsSink:
    """`batch` as an Arrow IPC stream (schema, batch, end of stream) in parts, not copied."""
    sink = _PartsSink()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink


def _send(send: Callable[[list, int], None], max_bytes: int, batch: pa.RecordBatch) -> None:
    """Sends `batch` as IPC parts, halved until each message fits `max_bytes` of IPC; a plain
    scan's FileRows as its reference (the node reads the rows)."""
    if isinstance(batch, FileRows):
        send(batch.ipc_parts(), batch.num_rows)
        return
    stream = _ipc_parts(batch)
    if stream.size <= max_bytes or batch.num_rows <= 1:
        send(stream.parts, batch.num_rows)  # one row too large: the core's InvalidArgument says so
        return
    half = batch.num_rows // 2
    _send(send, max_bytes, batch.slice(0, half))
    _send(send, max_bytes, batch.slice(half))


def rdd_rows_to_batches(rows: Iterable, chunk: int = RDD_CHUNK_ROWS) -> Iterator[pa.RecordBatch]:
    """Groups RDD rows into Arrow record batches of up to `chunk` rows."""
    buf: List = []
    for row in rows:
        buf.append(row)
        if len(buf) >= chunk:
            yield rows_mod.rows_to_batch(buf)
            buf = []
    if buf:
        yield rows_mod.rows_to_batch(buf)


# --------------------------------------------------------------------------- training
def feed_partition(batches: Iterable[pa.RecordBatch], partition: int, epoch: int,
                   endpoints: Sequence[NodeEndpoint], options: FeedOptions,
                   attempt: int = 0) -> Tuple[List[int], List[bool], List[bool]]:
    """Feeds one partition of one epoch to the nodes; returns the rows each node got, which
    nodes could not be reached at all (ended early, as TFoS allows: they are skipped, and the
    driver checks with the coordinator that they did end), and which had ended their feed
    (``DataFeed.terminate()``: early stopping).

    `attempt` is the Spark task attempt: when Spark retries a failed feeding task, the
    nodes keep what the failed attempt delivered (training sees those rows twice) and
    count each attempt's rows apart, so every node still hands out the same total.

    Raises the node's error (Aborted naming the node) if a node fails, and
    DeadlineExceeded if a node makes no progress for feed_timeout.
    """
    worker.settle()
    producer = _ember.FeedProducer.open(list(endpoints), partition, epoch, attempt, options)
    try:
        for batch in batches:
            offset = 0
            for k, n in enumerate(producer.split(batch.num_rows)):
                if n:
                    _send(lambda m, r, k=k: producer.send_batch_parts(k, m, r), producer.max_batch_bytes(k),
                          batch.slice(offset, n))
                    offset += n
            if producer.all_cancelled():
                break  # every node terminated its feed: skip the rest quietly (TFoS semantics)
        producer.end_partition()
        nodes = range(producer.num_nodes)
        return list(producer.sent), [producer.gone(k) for k in nodes], [producer.cancelled(k) for k in nodes]
    finally:
        producer.close()


def file_rows(uris: Sequence[str], columns: Sequence[str], fs_conf: Tuple[str, str]) -> Iterator[FileRows]:
    """A plain Parquet scan's files as FileRows, one per file (footers read here, in the task):
    what :func:`feed_partition` splits over the nodes instead of rows.  `fs_conf` is the driver's
    (fs.defaultFS, WebHDFS address)."""
    from ember import _hadoop
    resolve = _hadoop.resolve_options(*fs_conf)
    for uri in uris:
        rows = FileRows.of_file(uri, columns, resolve)
        if rows.num_rows:
            yield rows


# --------------------------------------------------------------------------- inference
def _read_ipc(data, what: str) -> pa.RecordBatch:
    try:
        return pa.ipc.open_stream(pa.py_buffer(data)).read_next_batch()
    except (pa.ArrowInvalid, StopIteration, OSError) as e:
        raise errors.Corruption(f"{what}: malformed Arrow IPC stream: {e}") from e


def node_end(coordinator: Optional[Tuple[str, int, bytes]], endpoint: NodeEndpoint,
             timeout: float = 10.0) -> Optional[str]:
    """How the node behind `endpoint` ended, in the words its launcher gave its feed (and
    published in the coordinator's store, NODE_END_KEY); None if that cannot be learned.
    `coordinator` is (host, port, secret)."""
    if coordinator is None:
        return None
    host, port, secret = coordinator
    try:
        client = _ember.CoordinatorClient.connect(host, port, secret, connect_timeout=timeout)
    except errors.EmberError:
        return None
    try:
        return client.kv_get(NODE_END_KEY.format(executor_id=endpoint.executor_id), timeout).decode()
    except errors.Aborted as e:
        return str(e)  # the job was aborted: the reason names the node that failed
    except errors.EmberError:
        return None
    finally:
        client.close()


def infer_partition(batches: Iterable[pa.RecordBatch], partition: int, endpoint: NodeEndpoint,
                    options: FeedOptions, coordinator: Optional[Tuple[str, int, bytes]] = None) -> Iterator[tuple]:
    """Feeds one partition to its node and yields (input batch, result batch) pairs,
    row-aligned and in input order.

    Raises ValueError if the node answers more or fewer rows than it was sent,
    naming node and partition; the node's own error (naming it) if it fails, also when
    the node was already gone when this task started (asked of `coordinator`, which is
    (host, port, secret)).
    """
    worker.settle()
    try:
        producer = _ember.InferenceProducer.open(endpoint, partition, options)
    except (errors.NotFound, errors.Unavailable) as e:
        how = node_end(coordinator, endpoint)
        if how is None:
            raise
        raise errors.Aborted(f"inference: node {endpoint.describe()}, partition {partition}: {how}") from e
    inputs: "queue.Queue" = queue.Queue()
    writer_error: List[BaseException] = []

    def write_all():
        # begin, writes and end on this one thread (the session lock is a robust mutex).
        try:
            try:
                producer.begin()
                for batch in batches:
                    if batch.num_rows == 0:
                        continue
                    inputs.put(batch)
                    _send(producer.send_batch_parts, producer.max_batch_bytes(), batch)
                producer.end()
            finally:
                producer.release_session()
        except BaseException as e:  # re-raised on the reading side
            writer_error.append(e)
            producer.close()  # wakes the reader
        finally:
            inputs.put(None)

    writer = threading.Thread(target=write_all, name=f"ember-feed-p{partition}", daemon=True)
    writer.start()
    try:
        yield from _align_results(inputs, producer, partition, endpoint, writer_error)
    finally:
        producer.close()
        writer.join(timeout=options.idle_timeout)


def _align_results(inputs: "queue.Queue", producer, partition: int, endpoint: NodeEndpoint,
                   writer_error: List[BaseException]) -> Iterator[tuple]:
    """Pairs each input batch with the same number of result rows, in order (the core
    has checked the counts)."""
    where = f"inference: node {endpoint.describe()}, partition {partition}"
    results: List[pa.RecordBatch] = []   # received, not yet paired
    queued = 0                            # rows in `results`
    current: Optional[pa.RecordBatch] = None
    inputs_done = False
    answers_done = False
    while True:
        if current is None and not inputs_done:
            item = inputs.get()  # the writer queues a batch before sending it, then None at its end
            if item is None:
                inputs_done = True
                if writer_error:
                    raise writer_error[0]
            else:
                current = item
            continue
        if current is not None and queued >= current.num_rows:
            table = pa.Table.from_batches(results).combine_chunks()
            paired = table.slice(0, current.num_rows).to_batches()
            rest = table.slice(current.num_rows)
            results = rest.to_batches() if rest.num_rows else []
            queued -= current.num_rows
            yield current, paired[0]
            current = None
            continue
        if answers_done:
            return
        try:
            res = producer.next_result()
        except errors.EmberError:
            if writer_error:
                raise writer_error[0] from None
            raise
        if res is None:
            answers_done = True  # every row answered: pair what is queued, then stop
            continue
        batch = _read_ipc(res.ipc(), where)
        if batch.num_rows != res.rows:
            raise ValueError(f"{where}: a result message says {res.rows} rows but holds {batch.num_rows}")
        results.append(batch)
        queued += batch.num_rows
