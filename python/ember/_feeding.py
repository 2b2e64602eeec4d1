"""The Spark side of InputMode.SPARK: what feeding tasks run.

``cluster.train`` feeds each epoch as one Spark job, with no counting pass
first.  A task splits every Arrow batch of its partition into contiguous
slices, one per node, keeping the rows each node got from this partition
within one of each other (``split_rows``; the odd rows of a partition start
at node ``partition % num_nodes``, so they spread over the nodes).  It ends
the partition with an END_PARTITION marker to every node that carries what
every node got from it.  When the epoch's Spark job has ended, the driver tells
every node how many partitions it had (END_EPOCH).  Each node therefore learns
every node's epoch total, and can prove at any moment before that a lower
bound on the smallest total (``ember.feed``): every node trains on exactly
that many rows, so synchronous strategies see the same number of batches
everywhere.

``cluster.inference`` sends partition p wholly to node p % num_nodes under the
node ring's session lock, so each partition's rows reach the node contiguously
and its results come back, in order, to the task that sent them.

A node on this host is reached through its shared-memory ring; a node on
another host through its authenticated TCP feed server.
"""
from __future__ import annotations

import os
import queue
import secrets as _secrets
import threading
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa

from ember import _arrow_rows as rows_mod
from ember import _feed_protocol as proto
from ember import errors

RDD_CHUNK_ROWS = 4096          # RDD rows per Arrow batch
_RESULT_RING_BYTES = 32 << 20  # a feeding task's result ring (inference)
_POLL_SECS = 0.5               # result waits wake this often to check the node's health


@dataclass(frozen=True)
class NodeEndpoint:
    """Where a node's feed is: its ring (same host) and its TCP feed server."""
    executor_id: int
    name: str        # "worker:0"
    ring: str
    host: str
    port: int
    capacity: int = 64 << 20  # the ring's; a message may be at most half of it


@dataclass(frozen=True)
class FeedOptions:
    secret: bytes
    feed_timeout: float = 600.0      # seconds a write may make no progress
    transport: str = "auto"          # "auto" (ring if on this host), "shm" or "tcp"
    job_id: str = ""


def split_rows(rows: int, sent: Sequence[int], first: int) -> List[int]:
    """How many of the next `rows` rows of a partition go to each node.

    `sent` is what each node already got from this partition; it and the result
    keep every node within one row of the others.  The odd rows go first to the
    nodes already ahead (they must stay ahead), then in turn from node `first`.
    """
    n = len(sent)
    base, extra = divmod(sum(sent) + rows, n)
    order = sorted(range(n), key=lambda k: (-sent[k], (k - first) % n))
    target = [base] * n
    for k in order[:extra]:
        target[k] += 1
    return [t - s for t, s in zip(target, sent)]


# --------------------------------------------------------------------------- channels
class _Channel:
    """A producer's connection to one node: its ring, or its TCP feed server."""

    def __init__(self, endpoint: NodeEndpoint, options: FeedOptions, may_be_gone: bool = False):
        """`may_be_gone`: a node that cannot be reached at all (its ring is gone and its feed
        server refuses) has ended; skip it quietly and set `gone` (training only: the driver
        then checks with the coordinator that it did end)."""
        from ember import _ember
        self.endpoint = endpoint
        self.options = options
        self.ring = None
        self.client = None
        self.cancelled = False  # the node terminated its feed: writes are skipped
        self.gone = False       # the node could not be reached at all
        if options.transport in ("auto", "shm"):
            try:
                self.ring = _ember.ShmRing.open(endpoint.ring)
            except errors.NotFound:
                if options.transport == "shm":
                    raise
        if self.ring is None:
            try:
                self.client = _ember.FeedClient.connect(endpoint.host, endpoint.port, options.secret,
                                                        options.feed_timeout)
            except errors.Unavailable:
                if not may_be_gone:
                    raise
                self.gone = self.cancelled = True
        self.max_payload = _ember.ShmRing.max_payload(
            self.ring.capacity if self.ring is not None else endpoint.capacity)

    @property
    def local(self) -> bool:
        return self.ring is not None

    def write(self, kind: int, payload) -> None:
        if self.cancelled:
            return
        try:
            (self.ring or self.client).write(kind, proto.as_uint8(payload), self.options.feed_timeout)
        except errors.Cancelled:
            self.cancelled = True
        except errors.EmberError as e:
            raise type(e)(f"feeding node {self.endpoint.name} ({self.endpoint.host}): {e}") from None

    def close(self) -> None:
        for end in (self.ring, self.client):
            if end is not None:
                end.close()
        self.ring = self.client = None


def _write_batch(ch: _Channel, partition: int, epoch: int, batch: pa.RecordBatch, attempt: int = 0) -> None:
    """Writes `batch`, split so that each message fits the channel."""
    payload = proto.encode_batch(partition, epoch, batch, attempt)
    if payload.size <= ch.max_payload or batch.num_rows <= 1:
        ch.write(proto.BATCH, payload)
        return
    half = batch.num_rows // 2
    _write_batch(ch, partition, epoch, batch.slice(0, half), attempt)
    _write_batch(ch, partition, epoch, batch.slice(half), attempt)


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
                   attempt: int = 0) -> Tuple[List[int], List[bool]]:
    """Feeds one partition of one epoch to the nodes; returns the rows each node got, and
    which nodes could not be reached at all (ended early, as TFoS allows: they are skipped,
    and the driver checks with the coordinator that they did end).

    `attempt` is the Spark task attempt: when Spark retries a failed feeding task, the
    nodes keep what the failed attempt delivered (training sees those rows twice) and
    count each attempt's rows apart, so every node still hands out the same total.

    Raises the node's error (Aborted naming the node) if a node fails, and
    DeadlineExceeded if a node makes no progress for feed_timeout.
    """
    channels = [_Channel(ep, options, may_be_gone=True) for ep in endpoints]
    first = partition % len(endpoints)
    try:
        sent = [0] * len(endpoints)
        for batch in batches:
            offset = 0
            for k, n in enumerate(split_rows(batch.num_rows, sent, first)):
                if n:
                    _write_batch(channels[k], partition, epoch, batch.slice(offset, n), attempt)
                    offset += n
                    sent[k] += n
            if all(ch.cancelled for ch in channels):
                break  # every node terminated its feed: skip the rest quietly (TFoS semantics)
        end = proto.encode_end_partition(partition, epoch, sent)
        for ch in channels:
            ch.write(proto.END_PARTITION, end)
        return sent, [ch.gone for ch in channels]
    finally:
        for ch in channels:
            ch.close()


# --------------------------------------------------------------------------- inference
def _result_ring_name(options: FeedOptions, partition: int) -> str:
    return f"/ember-{options.job_id}-r{partition}-{os.getpid()}-{_secrets.token_hex(4)}"


def infer_partition(batches: Iterable[pa.RecordBatch], partition: int, endpoint: NodeEndpoint,
                    options: FeedOptions) -> Iterator[tuple]:
    """Feeds one partition to its node and yields (input batch, result batch) pairs,
    row-aligned and in input order.

    Raises ValueError if the node answers more or fewer rows than it was sent,
    naming node and partition; the node's own error if it fails.
    """
    from ember import _ember
    ch = _Channel(endpoint, options)
    result_ring = None
    if ch.local:
        result_ring = _ember.ShmRing.create(_result_ring_name(options, partition), _RESULT_RING_BYTES)
    inputs: "queue.Queue" = queue.Queue()
    writer_error: List[BaseException] = []
    sent = [0]

    def write_all():
        # Session lock, writes and unlock happen on this one thread (robust mutex rule).
        try:
            if ch.local:
                ch.ring.lock_session(options.feed_timeout)
            try:
                name = result_ring.name if result_ring is not None else ""
                ch.write(proto.BEGIN_PARTITION, proto.encode_begin_partition(partition, proto.INFERENCE_EPOCH,
                                                                             True, name))
                for batch in batches:
                    if batch.num_rows == 0:
                        continue
                    inputs.put(batch)
                    _write_batch(ch, partition, proto.INFERENCE_EPOCH, batch)
                    sent[0] += batch.num_rows
                ch.write(proto.END_PARTITION, proto.encode_end_partition(partition, proto.INFERENCE_EPOCH, sent))
            finally:
                if ch.local:
                    ch.ring.unlock_session()
        except BaseException as e:  # re-raised on the reading side
            writer_error.append(e)
        finally:
            inputs.put(None)

    writer = threading.Thread(target=write_all, name=f"ember-feed-p{partition}", daemon=True)
    writer.start()
    try:
        yield from _align_results(inputs, _ResultReader(ch, result_ring, options, endpoint, partition),
                                  partition, endpoint, writer_error, sent)
    finally:
        if result_ring is not None:
            result_ring.abort("the feeding task stopped reading results")
        writer.join(timeout=options.feed_timeout)
        if result_ring is not None:
            result_ring.close()
        ch.close()


class _ResultReader:
    """Reads RESULTS / END_RESULTS / ERROR for one partition, watching the node's health."""

    def __init__(self, ch: _Channel, result_ring, options: FeedOptions, endpoint: NodeEndpoint, partition: int):
        self.ch, self.result_ring, self.options = ch, result_ring, options
        self.endpoint, self.partition = endpoint, partition

    def next(self):
        waited = 0.0
        while True:
            try:
                if self.result_ring is not None:
                    return self.result_ring.read(_POLL_SECS)
                return self.ch.client.read(_POLL_SECS)
            except errors.DeadlineExceeded:
                waited += _POLL_SECS
                if self.ch.ring is not None:
                    self.ch.ring.health()  # raises the node's failure at once
                if waited >= self.options.feed_timeout:
                    raise errors.DeadlineExceeded(
                        f"inference: node {self.endpoint.name} ({self.endpoint.host}) sent no results for "
                        f"partition {self.partition} in {self.options.feed_timeout:.0f}s (feed_timeout)") from None


def _align_results(inputs: "queue.Queue", reader: _ResultReader, partition: int, endpoint: NodeEndpoint,
                   writer_error: List[BaseException], sent: List[int]) -> Iterator[tuple]:
    """Pairs each input batch with the same number of result rows, in order."""
    where = f"node {endpoint.name} ({endpoint.host}), partition {partition}"
    results: List[pa.RecordBatch] = []   # received, not yet paired
    queued = 0                            # rows in `results`
    answered = 0
    current: Optional[pa.RecordBatch] = None
    inputs_done = False

    def mismatch() -> ValueError:
        return ValueError(f"inference: {where} answered {answered} rows but was sent {sent[0]}: "
                          "exactly one result per input row is required")

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
        kind, payload = reader.next()
        if kind == proto.RESULTS:
            batch = proto.decode_results(payload)
            results.append(batch)
            queued += batch.num_rows
            answered += batch.num_rows
        elif kind == proto.END_RESULTS:
            total = proto.decode_end_results(payload)
            if current is not None or not inputs_done or queued or total != answered or answered != sent[0]:
                raise mismatch()
            return
        elif kind == proto.ERROR:
            raise ValueError(f"inference: {where}: {bytes(payload).decode(errors='replace')}")
        else:
            raise proto.FeedProtocolError(f"inference: {where} sent unexpected message "
                                          f"{proto.KIND_NAMES.get(kind, kind)}")
