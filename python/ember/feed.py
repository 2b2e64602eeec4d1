"""The node's end of InputMode.SPARK: ``ctx.get_data_feed()`` returns a DataFeed.

Spark tasks write Arrow record batches into the node's shared-memory ring
(through the node's TCP feed server when they run on another host).  A
DataFeed reads them back as TFoS-style rows (``next_batch``), as numpy
columns (``next_batch_columns``, zero-copy where Arrow allows), as a
``tf.data.Dataset`` (:mod:`ember.tf`) or as a PyTorch ``IterableDataset``
(:mod:`ember.torch`), and sends inference results back in input order
(``batch_results``).

The protocol is the C++ core's consumer (``include/ember/feed.h``): it decodes
every message, keeps the partition sessions, the equal-rows bound of every
epoch (every node hands out exactly the smallest node total, so synchronous
strategies see the same number of batches everywhere) and the exactly-one-
result rule.  This class turns the row ranges it hands out into Arrow batches
(the received bytes, wrapped without a copy) and results into Arrow IPC bytes.
"""
from __future__ import annotations

import collections
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np
import pyarrow as pa

from ember import _arrow_rows as rows_mod
from ember import _parquet_io, errors

_DECODED_CACHE = 4  # received batches kept decoded (a batch is handed out over several calls; few,
                    # since a kept batch pins ring bytes: see FeedConsumer in include/ember/feed.h)
_RUN_BATCHES = 64    # epoch_batches asks the core for up to this many batches per call


class DataFeed:
    """Reads what ``cluster.train()`` / ``cluster.inference()`` feed to this node.

    Not thread-safe: use one DataFeed from one thread, except ``terminate()``, which any
    thread may call, also while another is reading (it ends that read as the end of the feed).

    Args:
        ring: the node's feed ring: its name (``NodeEndpoint.ring``), or an object whose ``name``
            is it.
        node: the node's name for error messages, e.g. ``"worker:1"``.
        train_mode: False for inference: ``next_batch`` stops at partition ends and
            every row handed out must be answered through ``batch_results``.
        input_mapping: optional {column: tensor name}; ``next_batch`` then returns
            {tensor name: [values]} (TFoS's input_mapping), column names matched by name.
        timeout: seconds a read may wait for data before raising DeadlineExceeded.
        result_timeout: seconds a result write may block on a full result ring.
        resolve: the core's ResolveOptions for the files of a plain Parquet scan, which
            ``cluster.train`` has the node read in place (``hdfs://`` through fs.defaultFS).
    """

    def __init__(self, ring, node: str = "node", train_mode: bool = True,
                 input_mapping: Optional[Dict[str, str]] = None, timeout: float = 3600.0,
                 result_timeout: float = 600.0, resolve=None):
        from ember import _ember
        options = _ember.ConsumerOptions()
        options.node = node
        options.train_mode = train_mode
        options.read_timeout = timeout
        options.result_timeout = result_timeout
        self._consumer = _ember.FeedConsumer.open(ring if isinstance(ring, str) else ring.name, options)
        self._node = node
        self._resolve = resolve  # how to reach the files of a plain Parquet scan (ResolveOptions; None: local)
        self._files: Dict[str, Any] = {}  # their open files, the last few
        self._input_mapping = dict(input_mapping) if input_mapping else None
        self._decoded: "collections.OrderedDict[int, pa.RecordBatch]" = collections.OrderedDict()
        # message id -> the whole message's numpy columns (None: some column is not a plain
        # array there, so each slice is converted by itself).
        self._message_columns: "collections.OrderedDict[int, Optional[Dict[str, np.ndarray]]]" = \
            collections.OrderedDict()

    # ------------------------------------------------------------- settings
    @property
    def train_mode(self) -> bool:
        return self._consumer.train_mode

    @train_mode.setter
    def train_mode(self, value: bool) -> None:
        self._consumer.train_mode = bool(value)

    @property
    def _timeout(self) -> float:
        return self._consumer.read_timeout

    @_timeout.setter
    def _timeout(self, seconds: float) -> None:
        self._consumer.read_timeout = float(seconds)

    # ------------------------------------------------------------- rows
    def _record_batch(self, r) -> pa.RecordBatch:
        batch = self._decoded.get(r.message_id)
        if batch is None:
            try:
                reader = pa.ipc.open_stream(pa.py_buffer(r.ipc()))
                ref = _parquet_io.file_rows_ref(reader.schema)
                if ref is None:
                    batch = reader.read_next_batch()
            except (pa.ArrowInvalid, StopIteration, OSError) as e:
                raise errors.Corruption(f"node {self._node}: a fed batch of partition {r.partition} is not a "
                                        f"valid Arrow IPC stream: {e}") from e
            if ref is not None:  # a plain Parquet scan's rows: read here, in place
                batch = _parquet_io.read_file_rows(ref, self._resolve, self._files)
                if r.offset + r.rows > batch.num_rows:
                    raise errors.Corruption(f"node {self._node}: {ref['uri']} gave {batch.num_rows} rows where the "
                                            f"feed counted at least {r.offset + r.rows}")
            self._decoded[r.message_id] = batch
            if len(self._decoded) > _DECODED_CACHE:
                self._decoded.popitem(last=False)
        return batch

    def _message_columns_of(self, r) -> Optional[Dict[str, np.ndarray]]:
        """The whole message's {column: numpy array} of range `r`, converted once; None if some
        column is not a plain array there (a slice may still be regular: convert it alone)."""
        try:
            return self._message_columns[r.message_id]
        except KeyError:
            pass
        cols = rows_mod.batch_to_columns(self._record_batch(r))
        if any(a.dtype == object for a in cols.values()):
            cols = None
        self._message_columns[r.message_id] = cols
        if len(self._message_columns) > _DECODED_CACHE:
            self._message_columns.popitem(last=False)
        return cols

    def _columns(self, ranges) -> Dict[str, np.ndarray]:
        """The rows of `ranges` as {column: numpy array}.  Rows from one message (the common
        case: a message holds thousands of rows, a batch a hundred) are numpy slices of that
        message's columns, converted once; only batches that span messages are concatenated."""
        if len(ranges) == 1:
            r = ranges[0]
            cols = self._message_columns_of(r)
            if cols is not None:
                out = {k: v[r.offset:r.offset + r.rows] for k, v in cols.items()}
                self._forget_finished(ranges)
                return out
        out = self._joined([(r, r.offset, r.rows) for r in ranges])
        self._forget_finished(ranges)
        return out

    def _forget_finished(self, ranges) -> None:
        """Drops the decoded batch and columns of each message whose last row `ranges` handed out.
        A kept message pins its bytes in the ring (only the caller's slices need them now), and
        pinned bytes past half the ring make the core copy them out (FeedConsumer in
        include/ember/feed.h): with a few large messages kept, that was every byte once more."""
        for r in ranges:
            batch = self._decoded.get(r.message_id)
            if batch is not None and r.offset + r.rows >= batch.num_rows:
                del self._decoded[r.message_id]
                self._message_columns.pop(r.message_id, None)

    def _joined(self, pieces) -> Dict[str, np.ndarray]:
        """{column: numpy array} of `pieces`, (range, first row, rows) each, one after another."""
        batch = self._concat(pieces)
        return {} if batch is None else rows_mod.batch_to_columns(batch)

    def _cut(self, ranges, batch_size: int) -> Iterator[Dict[str, np.ndarray]]:
        """The rows of `ranges` (whole batches, or an epoch's last smaller one) as batches of
        `batch_size` rows: numpy slices of a message's columns where a batch lies in one
        message, joined where it spans two."""
        pending: list = []  # (range, first row, rows) of a batch that spans messages
        need = batch_size
        for r in ranges:
            off = r.offset
            end = off + r.rows
            if pending:  # finish the batch begun in the previous range
                k = min(need, end - off)
                pending.append((r, off, k))
                off += k
                need -= k
                if need:
                    continue
                yield self._joined(pending)
                self._forget_finished([p[0] for p in pending if p[0] is not r])  # joined: copied
                pending, need = [], batch_size
            if end - off >= batch_size:
                cols = self._message_columns_of(r)
                if cols is not None:
                    while end - off >= batch_size:
                        stop = off + batch_size
                        yield {name: v[off:stop] for name, v in cols.items()}
                        off = stop
                while end - off >= batch_size:  # ragged message: each batch converted alone
                    yield self._joined([(r, off, batch_size)])
                    off += batch_size
            if off < end:
                pending.append((r, off, end - off))
                need = batch_size - (end - off)
            else:
                self._forget_finished([r])
        if pending:
            yield self._joined(pending)
            self._forget_finished([p[0] for p in pending])

    def _concat(self, pieces) -> Optional[pa.RecordBatch]:
        slices = [self._record_batch(r).slice(offset, rows) for r, offset, rows in pieces]
        if not slices:
            return None
        if len(slices) == 1:
            return slices[0]
        return pa.Table.from_batches(slices).combine_chunks().to_batches()[0]

    def _next(self, batch_size: int) -> Optional[pa.RecordBatch]:
        ranges = self._consumer.next(batch_size, not self.train_mode)
        batch = self._concat([(r, r.offset, r.rows) for r in ranges])
        self._forget_finished(ranges)
        return batch

    # -------------------------------------------------------------- TFoS API
    def next_batch(self, batch_size: int) -> Union[List[Any], Dict[str, List[Any]]]:
        """Up to `batch_size` rows, in the form they were fed (TFoS ``DataFeed.next_batch``).

        Returns fewer rows only at the end of the feed, or, for inference, at the end
        of a partition.  With an ``input_mapping`` returns {tensor: [values]}.
        """
        batch = self._next(batch_size)
        if self._input_mapping is not None:
            cols = {}
            names = batch.schema.names if batch is not None else []
            for col, tensor in sorted(self._input_mapping.items()):
                if batch is None:
                    cols[tensor] = []
                    continue
                if col not in names:
                    raise KeyError(f"input_mapping names column {col!r}, but the fed data has columns {names}")
                cols[tensor] = rows_mod.column_values(batch, names.index(col))
            return cols
        return [] if batch is None else rows_mod.batch_to_rows(batch)

    def next_batch_columns(self, batch_size: int) -> Dict[str, np.ndarray]:
        """Up to `batch_size` rows as {column: numpy array}; an empty dict at end of feed.

        Zero-copy when the rows come from one Arrow batch and the column layout
        allows it (numbers, fixed-size or equal-length lists and binaries).
        """
        return self._columns(self._consumer.next(batch_size, not self.train_mode))

    def should_stop(self) -> bool:
        """True once the feed has ended (the driver called shutdown) and every row was read."""
        return self._consumer.should_stop()

    def batch_results(self, results: Any) -> None:
        """Sends one result per input row of the last rows handed out (inference).

        `results` may be a list (of values, tuples or dicts), a numpy array, a dict of
        columns or a pyarrow RecordBatch.  Raises ValueError if there are more results
        than rows awaiting an answer; the feeding task then fails with the same message.
        """
        batch = rows_mod.results_to_batch(results)
        offset = 0
        for k in self._consumer.plan_results(batch.num_rows):
            self._consumer.send_results(_ipc_bytes(batch.slice(offset, k)), k)
            offset += k

    def terminate(self) -> None:
        """Stops the feed early (TFoS ``DataFeed.terminate``): queued data is dropped and
        feeding tasks skip the rest of their partitions quietly.  Safe from any thread: a read
        in progress on another thread (one waiting on an empty feed too) ends as at the end of
        the feed, and so does every later read."""
        self._consumer.terminate()

    # ------------------------------------------------------------- iteration
    def epoch_batches(self, batch_size: int, drop_remainder: bool = True) -> Iterator[Dict[str, np.ndarray]]:
        """Yields the next epoch's data as {column: numpy array} batches of `batch_size` rows.

        Every node hands out the same number of rows per epoch: the smallest number
        any node received (nodes differ by at most a few rows; the extra are dropped).
        With `drop_remainder` (the default, needed by synchronous multi-node training)
        every node yields exactly ``that // batch_size`` batches; without it, a last
        smaller batch too.  A batch is handed out as soon as this node can prove every
        node will get its rows, so training starts while Spark is still feeding.
        Ends at the epoch's end or the end of the feed.  A consumer may stop pulling
        early: the next call starts at the next epoch.  Validation epochs
        (``cluster.train(validation_data=...)``) not read with validation_batches are
        skipped.
        """
        return self._epoch(batch_size, drop_remainder, validation=False)

    def validation_batches(self, batch_size: int, drop_remainder: bool = False) -> Iterator[Dict[str, np.ndarray]]:
        """Yields the validation rows fed after the training epoch just read
        (``cluster.train(df, validation_data=val_df)``), as epoch_batches does.

        Every node gets the same number of validation rows (the equal-rows rule), so
        per-node metrics averaged over nodes (``ember.keras.SyncCallback``) are the
        metrics over all of them.  Call it after each training epoch.

        Raises:
            InvalidArgument: the next rows fed are a training epoch's (the driver was given
                no validation_data).
        """
        return self._epoch(batch_size, drop_remainder, validation=True)

    def _epoch(self, batch_size: int, drop_remainder: bool, validation: bool) -> Iterator[Dict[str, np.ndarray]]:
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        if self._consumer.begin_epoch(validation) is None:
            return
        while True:  # one core call per run of batches (up to _RUN_BATCHES), cut here
            ranges = self._consumer.next_epoch_batches(batch_size, _RUN_BATCHES, drop_remainder)
            if not ranges:
                return
            yield from self._cut(ranges, batch_size)

    def _peek_columns(self) -> Optional[Dict[str, np.ndarray]]:
        """The first queued row's columns, reading ahead; None at end of feed."""
        r = self._consumer.peek_row()
        return None if r is None else self._columns([r])

    def to_tf_dataset(self, batch_size: int, features: Optional[Union[str, Sequence[str]]] = None,
                      label: Optional[str] = None, drop_remainder: Optional[bool] = None, transform=None,
                      validation: bool = False, device: Optional[str] = None):
        """A ``tf.data.Dataset`` over the feed; each pass over it is one epoch of ``cluster.train``
        (with `validation`, the validation epoch that follows it: Keras's ``validation_data``).

        See :func:`ember.tf.feed_dataset` for the arguments.
        """
        from ember import tf as ember_tf
        return ember_tf.feed_dataset(self, batch_size, features=features, label=label,
                                     drop_remainder=drop_remainder, transform=transform, validation=validation,
                                     device=device)

    def to_torch_dataset(self, batch_size: int, drop_remainder: bool = True, transform=None,
                         validation: bool = False, device=None, prefetch: int = 2):
        """A ``torch.utils.data.IterableDataset``; each pass is one epoch (see epoch_batches), or
        with `validation` the validation epoch that follows it; with ``device="cuda"`` the
        batches land on the GPU through pinned memory, `prefetch` ahead.

        See :func:`ember.torch.feed_dataset` for the arguments.
        """
        from ember import torch as ember_torch
        return ember_torch.feed_dataset(self, batch_size, drop_remainder=drop_remainder, transform=transform,
                                        validation=validation, device=device, prefetch=prefetch)


def _ipc_bytes(batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()
