"""Encoding of the data feed's messages (see src/feed/messages.h and docs/wire.md).

Every message is a (kind, payload) pair that travels through a node's shared
memory ring or over an authenticated TCP feed connection.  Record batches are
Arrow IPC streams; nothing here pickles or evaluates bytes.
"""
from __future__ import annotations

import struct
from typing import Sequence, Tuple

import numpy as np
import pyarrow as pa

BATCH = 1
END_PARTITION = 2
END_FEED = 3
BEGIN_PARTITION = 4
RESULTS = 5
END_RESULTS = 6
ERROR = 7
END_EPOCH = 8

KIND_NAMES = {BATCH: "BATCH", END_PARTITION: "END_PARTITION", END_FEED: "END_FEED",
              BEGIN_PARTITION: "BEGIN_PARTITION", RESULTS: "RESULTS", END_RESULTS: "END_RESULTS",
              ERROR: "ERROR", END_EPOCH: "END_EPOCH"}

BEGIN_WANTS_RESULTS = 1
# Epoch number of inference partitions: never one of train()'s epochs, which count from 0.
INFERENCE_EPOCH = 0xFFFFFFFF

_BATCH_HEAD = struct.Struct("<III")         # partition, epoch, task attempt
_END_PARTITION = struct.Struct("<III")      # partition, epoch, nodes; then i64 rows per node
_END_EPOCH = struct.Struct("<II")           # epoch, partitions the epoch had
_BEGIN_HEAD = struct.Struct("<IIII")        # partition, epoch, flags, name length
_END_RESULTS = struct.Struct("<q")          # rows answered


class FeedProtocolError(ValueError):
    """A feed message does not have the layout its kind requires."""


def _ipc_bytes(batch: pa.RecordBatch, head: bytes = b"") -> pa.Buffer:
    sink = pa.BufferOutputStream()
    if head:
        sink.write(head)
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def _read_ipc(buf: pa.Buffer, what: str) -> pa.RecordBatch:
    try:
        return pa.ipc.open_stream(buf).read_next_batch()
    except (pa.ArrowInvalid, StopIteration, OSError) as e:
        raise FeedProtocolError(f"{what}: malformed Arrow IPC stream of {buf.size} bytes: {e}") from e


def as_buffer(payload) -> pa.Buffer:
    """Wraps a received payload (numpy uint8 array, bytes) as an Arrow buffer without copying."""
    if isinstance(payload, pa.Buffer):
        return payload
    return pa.py_buffer(payload)


def encode_batch(partition: int, epoch: int, batch: pa.RecordBatch, attempt: int = 0) -> pa.Buffer:
    """`attempt`: the Spark task attempt feeding the partition (a retried task sends it again)."""
    return _ipc_bytes(batch, _BATCH_HEAD.pack(partition, epoch, attempt))


def decode_batch(payload) -> Tuple[int, int, int, pa.RecordBatch]:
    """Returns (partition, epoch, task attempt, record batch)."""
    buf = as_buffer(payload)
    if buf.size < _BATCH_HEAD.size:
        raise FeedProtocolError(f"BATCH message of {buf.size} bytes is shorter than its header")
    partition, epoch, attempt = _BATCH_HEAD.unpack(buf.slice(0, _BATCH_HEAD.size).to_pybytes())
    return partition, epoch, attempt, _read_ipc(buf.slice(_BATCH_HEAD.size), f"BATCH of partition {partition}")


def encode_end_partition(partition: int, epoch: int, node_rows: Sequence[int]) -> bytes:
    """`node_rows[k]`: the rows of this partition sent to node k (inference: the one node)."""
    return _END_PARTITION.pack(partition, epoch, len(node_rows)) + struct.pack(f"<{len(node_rows)}q", *node_rows)


def decode_end_partition(payload) -> Tuple[int, int, Tuple[int, ...]]:
    """Returns (partition, epoch, rows sent to each node)."""
    data = bytes(payload)
    if len(data) < _END_PARTITION.size:
        raise FeedProtocolError(f"END_PARTITION message of {len(data)} bytes is shorter than its header")
    partition, epoch, num_nodes = _END_PARTITION.unpack(data[:_END_PARTITION.size])
    if num_nodes < 1 or len(data) != _END_PARTITION.size + 8 * num_nodes:
        raise FeedProtocolError(f"END_PARTITION of partition {partition} counts {num_nodes} nodes but carries "
                                f"{len(data) - _END_PARTITION.size} bytes of row counts")
    rows = struct.unpack(f"<{num_nodes}q", data[_END_PARTITION.size:])
    if min(rows) < 0:
        raise FeedProtocolError(f"END_PARTITION of partition {partition} has a negative row count")
    return partition, epoch, rows


def encode_end_epoch(epoch: int, num_partitions: int) -> bytes:
    return _END_EPOCH.pack(epoch, num_partitions)


def decode_end_epoch(payload) -> Tuple[int, int]:
    """Returns (epoch, partitions the epoch had)."""
    data = bytes(payload)
    if len(data) != _END_EPOCH.size:
        raise FeedProtocolError(f"END_EPOCH message has {len(data)} bytes, expected {_END_EPOCH.size}")
    return _END_EPOCH.unpack(data)


def encode_begin_partition(partition: int, epoch: int, wants_results: bool, result_ring: str) -> bytes:
    name = result_ring.encode()
    flags = BEGIN_WANTS_RESULTS if wants_results else 0
    return _BEGIN_HEAD.pack(partition, epoch, flags, len(name)) + name


def decode_begin_partition(payload) -> Tuple[int, int, bool, str]:
    data = bytes(payload)
    if len(data) < _BEGIN_HEAD.size:
        raise FeedProtocolError(f"BEGIN_PARTITION message of {len(data)} bytes is shorter than its header")
    partition, epoch, flags, n = _BEGIN_HEAD.unpack(data[:_BEGIN_HEAD.size])
    if len(data) != _BEGIN_HEAD.size + n:
        raise FeedProtocolError(f"BEGIN_PARTITION of partition {partition} names a {n}-byte ring "
                                f"but carries {len(data) - _BEGIN_HEAD.size} bytes")
    return partition, epoch, bool(flags & BEGIN_WANTS_RESULTS), data[_BEGIN_HEAD.size:].decode()


def encode_results(batch: pa.RecordBatch) -> pa.Buffer:
    return _ipc_bytes(batch)


def decode_results(payload) -> pa.RecordBatch:
    return _read_ipc(as_buffer(payload), "RESULTS")


def encode_end_results(rows: int) -> bytes:
    return _END_RESULTS.pack(rows)


def decode_end_results(payload) -> int:
    data = bytes(payload)
    if len(data) != _END_RESULTS.size:
        raise FeedProtocolError(f"END_RESULTS message has {len(data)} bytes, expected {_END_RESULTS.size}")
    return _END_RESULTS.unpack(data)[0]


def as_uint8(buf) -> np.ndarray:
    """A bytes-like object as a uint8 numpy view (what the ring's write() takes), no copy."""
    return np.frombuffer(buf, dtype=np.uint8)
