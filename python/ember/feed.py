"""The node's end of InputMode.SPARK: ``ctx.get_data_feed()`` returns a DataFeed.

Spark tasks write Arrow record batches into the node's shared-memory ring
(through the node's TCP feed server when they run on another host).  A
DataFeed reads them back as TFoS-style rows (``next_batch``), as numpy
columns (``next_batch_columns``, zero-copy where Arrow allows), as a
``tf.data.Dataset`` or as a PyTorch ``IterableDataset``, and sends inference
results back in input order (``batch_results``).

Epochs: every feeding task ends each partition with an END_PARTITION marker
sent to every node, carrying the rows every node got from that partition
(always within one of each other); once the epoch's Spark job has ended the
driver sends END_EPOCH with the number of partitions it had.  So each node
knows every node's epoch total at the end of the epoch, and before that a
lower bound on the smallest total (``_Epoch``).
Every node hands out exactly the smallest total, so ``to_tf_dataset`` yields
the same number of full batches per epoch on every node and synchronous
strategies never wait on a node that ran dry.  No counting pass is needed.
"""
from __future__ import annotations

import collections
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

import numpy as np
import pyarrow as pa

from ember import _arrow_rows as rows_mod
from ember import _feed_protocol as proto
from ember import errors

# How long one blocking ring read waits before the DataFeed re-checks its
# overall deadline; short so that an abort or terminate is seen promptly.
_READ_SLICE_SECS = 1.0


def _keep_freed_memory() -> None:
    """Undoes the malloc setting TensorFlow applies when it builds a generator dataset.

    tf.data sets glibc's M_TRIM_THRESHOLD to 128 KiB, which also freezes the mmap
    threshold there: every activation, gradient and feed buffer over 128 KiB becomes a
    fresh mmap, page-faulted in and unmapped per step.  Measured in bench/e2e_feed.py,
    that halved a node's training speed; raising both thresholds restores it.
    A no-op where glibc is not the allocator.
    """
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 64 << 20)
    mallopt(m_trim_threshold, 256 << 20)


class _Session:
    """One partition being fed to this node (inference: its rows get answers)."""

    def __init__(self, partition: int, epoch: int, result_ring=None):
        self.partition = partition
        self.epoch = epoch
        self.result_ring = result_ring
        self.received = 0    # rows that arrived
        self.handed = 0      # rows given to the user
        self.answered = 0    # results sent back
        self.rows: Optional[int] = None  # total, known at END_PARTITION

    @property
    def ended(self) -> bool:
        return self.rows is not None


class _Epoch:
    """What this node knows of one epoch of ``cluster.train``.

    Feeding tasks keep the rows each node gets from a partition within one of each
    other, so while partition p is still arriving every other node will get at least
    ``received[p] - 1`` rows of it.  ``usable`` is therefore a lower bound on the
    smallest epoch total over all nodes, exact once every partition has ended.

    A retried feeding task (Spark task attempt) sends its partition again from the
    start; its rows are counted apart from the failed attempt's, and the partition
    is credited with its largest attempt.  Any attempt gives every node at least
    ``floor(rows / nodes)`` rows of the partition, so the bound still holds as long
    as the partition has the same rows on every attempt (cache non-deterministic
    input).
    """

    def __init__(self):
        self.num_partitions: Optional[int] = None  # from the driver's END_EPOCH
        self.ended_partitions: set = set()
        self.node_totals: List[int] = []  # per node, over the ended partitions
        self.open_rows: Dict[int, Dict[int, int]] = {}  # partition -> {attempt: rows}, not yet ended

    @property
    def complete(self) -> bool:
        return self.num_partitions is not None and len(self.ended_partitions) >= self.num_partitions

    @property
    def usable(self) -> int:
        ended = min(self.node_totals) if self.node_totals else 0
        return ended + sum(max(0, max(a.values()) - 1) for a in self.open_rows.values())

    def add_rows(self, partition: int, rows: int, attempt: int = 0) -> None:
        if partition in self.ended_partitions:
            return  # a late duplicate attempt: its rows are extra, never counted
        attempts = self.open_rows.setdefault(partition, {})
        attempts[attempt] = attempts.get(attempt, 0) + rows

    def end_partition(self, partition: int, node_rows: Sequence[int]) -> None:
        if partition in self.ended_partitions:
            return
        if not self.node_totals:
            self.node_totals = [0] * len(node_rows)
        self.node_totals = [t + r for t, r in zip(self.node_totals, node_rows)]
        self.ended_partitions.add(partition)
        self.open_rows.pop(partition, None)


class DataFeed:
    """Reads what ``cluster.train()`` / ``cluster.inference()`` feed to this node.

    Not thread-safe: use one DataFeed from one thread.

    Args:
        ring: the node's feed ring (``ember._ember.ShmRing``, consumer end).
        node: the node's name for error messages, e.g. ``"worker:1"``.
        train_mode: False for inference: ``next_batch`` stops at partition ends and
            every row handed out must be answered through ``batch_results``.
        input_mapping: optional {column: tensor name}; ``next_batch`` then returns
            {tensor name: [values]} (TFoS's input_mapping), column names matched by name.
        timeout: seconds a read may wait for data before raising DeadlineExceeded.
        result_timeout: seconds a result write may block on a full result ring.
    """

    def __init__(self, ring, node: str = "node", train_mode: bool = True,
                 input_mapping: Optional[Dict[str, str]] = None, timeout: float = 3600.0,
                 result_timeout: float = 600.0):
        self._ring = ring
        self._node = node
        self.train_mode = train_mode
        self._input_mapping = dict(input_mapping) if input_mapping else None
        self._timeout = timeout
        self._result_timeout = result_timeout
        # Arrival-ordered events: ("rows", session, epoch, RecordBatch) and
        # ("end", session, epoch); a "rows" event's batch shrinks as it is consumed.
        self._events: collections.deque = collections.deque()
        self._sessions: Dict[tuple, _Session] = {}   # (partition, epoch) -> session
        self._open_sessions: collections.deque = collections.deque()  # awaiting answers, in order
        self._epochs: Dict[int, _Epoch] = {}
        self._end_of_feed = False
        self._terminated = False
        self._finished_epochs: set = set()    # epochs an epoch_batches() call has claimed
        self._current_epoch: Optional[int] = None  # the one being yielded now

    # ----------------------------------------------------------------- reading
    def _read_message(self) -> bool:
        """Reads one message into the event queue; False at end of feed."""
        if self._end_of_feed:
            return False
        waited = 0.0
        while True:
            try:
                kind, payload = self._ring.read(_READ_SLICE_SECS)
                break
            except errors.DeadlineExceeded:
                waited += _READ_SLICE_SECS
                if waited >= self._timeout:
                    raise errors.DeadlineExceeded(
                        f"node {self._node}: no data arrived from Spark for {self._timeout:.0f}s. "
                        "Call cluster.train()/cluster.inference() on the driver, or pass a larger "
                        "timeout to ctx.get_data_feed()") from None
        self._handle(kind, payload)
        return True

    def _session(self, partition: int, epoch: int) -> _Session:
        key = (partition, epoch)
        session = self._sessions.get(key)
        if session is None:  # training: no BEGIN_PARTITION, sessions only track markers
            session = self._sessions[key] = _Session(partition, epoch)
        return session

    def _epoch(self, epoch: int) -> _Epoch:
        e = self._epochs.get(epoch)
        if e is None:
            e = self._epochs[epoch] = _Epoch()
        return e

    def _handle(self, kind: int, payload) -> None:
        if kind == proto.BATCH:
            partition, epoch, attempt, batch = proto.decode_batch(payload)
            if batch.num_rows:
                session = self._session(partition, epoch)
                session.received += batch.num_rows
                if epoch != proto.INFERENCE_EPOCH:
                    self._epoch(epoch).add_rows(partition, batch.num_rows, attempt)
                self._events.append(("rows", session, epoch, batch))
        elif kind == proto.END_PARTITION:
            partition, epoch, node_rows = proto.decode_end_partition(payload)
            session = self._session(partition, epoch)
            session.rows = session.received
            if epoch != proto.INFERENCE_EPOCH:
                self._epoch(epoch).end_partition(partition, node_rows)
            self._events.append(("end", session, epoch))
            if self._sessions.get((partition, epoch)) is session and session.result_ring is None:
                del self._sessions[(partition, epoch)]
            self._maybe_finish(session)
        elif kind == proto.BEGIN_PARTITION:
            partition, epoch, wants_results, ring_name = proto.decode_begin_partition(payload)
            ring = None
            if wants_results:
                from ember import _ember
                ring = _ember.ShmRing.open(ring_name)
            session = _Session(partition, epoch, ring)
            self._sessions[(partition, epoch)] = session
            if ring is not None:
                self._open_sessions.append(session)
        elif kind == proto.END_EPOCH:
            epoch, num_partitions = proto.decode_end_epoch(payload)
            self._epoch(epoch).num_partitions = num_partitions
        elif kind == proto.END_FEED:
            self._end_of_feed = True
        else:
            raise proto.FeedProtocolError(
                f"node {self._node}: unexpected feed message kind {proto.KIND_NAMES.get(kind, kind)}")

    # ------------------------------------------------------------ row taking
    def _take(self, n: int, stop_at_partition: bool, epoch: Optional[int] = None) -> List[pa.RecordBatch]:
        """Takes up to n rows; stops early at end of feed, at a partition end if
        `stop_at_partition` and rows were taken, and before rows of another epoch
        than `epoch` (when given)."""
        if epoch is None:
            self._current_epoch = None  # rows outside epoch_batches(): claimed epochs' rest is dropped
        if not self.train_mode:
            self._check_answered()
        out: List[pa.RecordBatch] = []
        count = 0
        while count < n:
            if not self._events:
                if not self._read_message():
                    break
                continue
            event = self._events[0]
            if self._stale(event):
                self._events.popleft()
                continue
            if event[0] == "end":
                self._events.popleft()
                if stop_at_partition and count > 0:
                    break
                if not self.train_mode:
                    self._check_answered()  # that partition is now fully handed out
                continue
            _, session, ev_epoch, batch = event
            if epoch is not None and ev_epoch != epoch:
                break
            if not self.train_mode:
                self._check_previous_answered(session)
            k = min(n - count, batch.num_rows)
            out.append(batch.slice(0, k))
            session.handed += k
            count += k
            if k == batch.num_rows:
                self._events.popleft()
            else:
                self._events[0] = ("rows", session, ev_epoch, batch.slice(k))
        return out

    def _check_answered(self) -> None:
        """Asking for more rows while a partition whose every row was handed out still
        lacks answers breaks "one result per row": fail that partition now (its feeding
        task would otherwise wait for answers that never come)."""
        for s in list(self._open_sessions):
            if s.ended and s.handed == s.rows and s.answered < s.handed:
                msg = (f"node {self._node} answered {s.answered} of the {s.rows} rows of partition "
                       f"{s.partition} and asked for more rows: inference needs exactly one result per "
                       "input row (call batch_results for every batch)")
                self._fail_session(s, msg)
                raise ValueError(msg)

    def _check_previous_answered(self, session: _Session) -> None:
        for older in self._open_sessions:
            if older is session:
                return
            if older.ended and older.answered < older.handed:
                msg = (f"node {self._node} answered {older.answered} of the {older.rows} rows of "
                       f"partition {older.partition} before taking rows of partition {session.partition}: "
                       "inference needs exactly one result per input row (call batch_results for every batch)")
                self._fail_session(older, msg)
                raise ValueError(msg)

    @staticmethod
    def _concat(slices: List[pa.RecordBatch]) -> Optional[pa.RecordBatch]:
        if not slices:
            return None
        if len(slices) == 1:
            return slices[0]
        return pa.Table.from_batches(slices).combine_chunks().to_batches()[0]

    # -------------------------------------------------------------- TFoS API
    def next_batch(self, batch_size: int) -> Union[List[Any], Dict[str, List[Any]]]:
        """Up to `batch_size` rows, in the form they were fed (TFoS ``DataFeed.next_batch``).

        Returns fewer rows only at the end of the feed, or, for inference, at the end
        of a partition.  With an ``input_mapping`` returns {tensor: [values]}.
        """
        batch = self._concat(self._take(batch_size, stop_at_partition=not self.train_mode))
        if self._input_mapping is not None:
            cols = {}
            names = batch.schema.names if batch is not None else []
            for col, tensor in sorted(self._input_mapping.items()):
                if batch is None:
                    cols[tensor] = []
                    continue
                if col not in names:
                    raise KeyError(f"input_mapping names column {col!r}, but the fed data has columns {names}")
                cols[tensor] = batch.column(names.index(col)).to_pylist()
            return cols
        return [] if batch is None else rows_mod.batch_to_rows(batch)

    def next_batch_columns(self, batch_size: int) -> Dict[str, np.ndarray]:
        """Up to `batch_size` rows as {column: numpy array}; an empty dict at end of feed.

        Zero-copy when the rows come from one Arrow batch and the column layout
        allows it (numbers, fixed-size or equal-length lists and binaries).
        """
        batch = self._concat(self._take(batch_size, stop_at_partition=not self.train_mode))
        return {} if batch is None else rows_mod.batch_to_columns(batch)

    def should_stop(self) -> bool:
        """True once the feed has ended (the driver called shutdown) and every row was read."""
        if self._terminated:
            return True
        return self._end_of_feed and not any(e[0] == "rows" and not self._stale(e) for e in self._events)

    def batch_results(self, results: Any) -> None:
        """Sends one result per input row of the last rows handed out (inference).

        `results` may be a list (of values, tuples or dicts), a numpy array, a dict of
        columns or a pyarrow RecordBatch.  Raises ValueError if there are more results
        than rows awaiting an answer; the feeding task then fails with the same message.
        """
        batch = rows_mod.results_to_batch(results)
        n = batch.num_rows
        offset = 0
        while offset < n:
            session = next((s for s in self._open_sessions if s.answered < s.handed), None)
            if session is None:
                pending = sum(s.handed - s.answered for s in self._open_sessions)
                msg = (f"node {self._node} sent {n} results but only {pending + offset} input rows "
                       "were awaiting an answer: inference needs exactly one result per input row")
                if self._open_sessions:
                    self._fail_session(self._open_sessions[-1], msg)
                raise ValueError(msg)
            k = min(n - offset, session.handed - session.answered)
            self._send(session, proto.RESULTS, proto.encode_results(batch.slice(offset, k)))
            session.answered += k
            offset += k
            self._maybe_finish(session)

    def _send(self, session: _Session, kind: int, payload) -> None:
        """Writes to the session's feeding task.  If that task is gone (it failed, or Spark
        killed it; Spark will run the partition again), the answers have nowhere to go:
        they are dropped and the node carries on."""
        if session.result_ring is None:
            return
        try:
            session.result_ring.write(kind, proto.as_uint8(payload), self._result_timeout)
        except errors.Aborted:
            session.result_ring.close()
            session.result_ring = None

    def _maybe_finish(self, session: _Session) -> None:
        if session.ended and session.answered == session.rows and session in self._open_sessions:
            self._send(session, proto.END_RESULTS, proto.encode_end_results(session.rows))
            self._close_session(session)

    def _fail_session(self, session: _Session, message: str) -> None:
        try:
            self._send(session, proto.ERROR, message.encode())
        finally:
            self._close_session(session)

    def _close_session(self, session: _Session) -> None:
        if session.result_ring is not None:
            session.result_ring.close()
            session.result_ring = None
        self._sessions.pop((session.partition, session.epoch), None)
        try:
            self._open_sessions.remove(session)
        except ValueError:
            pass

    def terminate(self) -> None:
        """Stops the feed early (TFoS ``DataFeed.terminate``): queued data is dropped and
        feeding tasks skip the rest of their partitions quietly."""
        self._terminated = True
        self._events.clear()
        self._ring.terminate()

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
        early: the next call starts at the next epoch.
        """
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        epoch = self._next_epoch()
        if epoch is None:
            return
        info = self._epochs[epoch]
        # From now on, whatever this consumer leaves of the epoch is dropped.
        self._finished_epochs.add(epoch)
        self._current_epoch = epoch
        taken = 0
        while True:
            while not info.complete and info.usable - taken < batch_size:
                if self._terminated or not self._read_message():
                    return  # terminated, or the feed ended in the middle of the epoch
            left = info.usable - taken
            if left < (batch_size if drop_remainder else 1):
                break
            want = min(batch_size, left)
            batch = self._concat(self._take(want, stop_at_partition=False, epoch=epoch))
            got = 0 if batch is None else batch.num_rows
            if got < want:
                if self._terminated:
                    return
                raise errors.Internal(
                    f"node {self._node}: epoch {epoch} holds {left} unread rows by its markers but only "
                    f"{got} arrived (a feed protocol error; please report it)")
            taken += got
            yield rows_mod.batch_to_columns(batch)
        self._current_epoch = None

    def _stale(self, event) -> bool:
        """An event of an epoch a consumer already finished (its dropped remainder)."""
        return event[2] in self._finished_epochs and event[2] != self._current_epoch

    def _next_epoch(self) -> Optional[int]:
        """The next training epoch this node has news of (rows or a partition's end: a node
        may get no rows of a tiny epoch, yet must step through it like its peers), reading
        ahead as needed; None at end of feed."""
        self._current_epoch = None
        while True:
            while self._events and self._stale(self._events[0]):
                self._events.popleft()
            for event in self._events:
                if event[2] != proto.INFERENCE_EPOCH and not self._stale(event):
                    return event[2]
            if self._terminated or not self._read_message():
                return None

    def to_tf_dataset(self, batch_size: int, features: Optional[Union[str, Sequence[str]]] = None,
                      label: Optional[str] = None, drop_remainder: bool = True, transform=None):
        """A ``tf.data.Dataset`` over the feed; each pass over it is one epoch of ``cluster.train``.

        Args:
            batch_size: rows per batch on this node (per-replica batch).
            features: column name or list of names for the model input (default: every
                column but `label`); a list gives a dict of tensors.
            label: column holding the label, or None for no label.
            drop_remainder: yield only full batches, the same count on every node.
            transform: optional function(dict of numpy columns) -> (x, y) or x, applied on
                this side of TensorFlow (e.g. reshape image bytes, scale to [0, 1]).

        Use ``model.fit(ds, epochs=num_epochs)`` with the num_epochs given to cluster.train.
        Auto-sharding is off: every node already gets its own share of the data.
        """
        import tensorflow as tf

        first = self._peek_columns()
        if first is None:
            raise ValueError(f"node {self._node}: the feed ended before any data arrived")

        def shape_batch(cols: Dict[str, np.ndarray]):
            if transform is not None:
                return transform(cols)
            names = [c for c in cols if c != label] if features is None else features
            x = cols[names] if isinstance(names, str) else (
                cols[names[0]] if len(names) == 1 else {n: cols[n] for n in names})
            return x if label is None else (x, cols[label])

        def spec(value):
            if isinstance(value, dict):
                return {k: spec(v) for k, v in value.items()}
            if isinstance(value, tuple):
                return tuple(spec(v) for v in value)
            arr = np.asarray(value)
            return tf.TensorSpec(shape=(None,) + arr.shape[1:], dtype=tf.as_dtype(arr.dtype))

        signature = spec(shape_batch(first))

        def gen():
            _keep_freed_memory()  # runs after TF's generator dataset set its malloc options
            for cols in self.epoch_batches(batch_size, drop_remainder):
                yield shape_batch(cols)

        ds = tf.data.Dataset.from_generator(gen, output_signature=signature)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return ds.with_options(options)

    def _peek_columns(self) -> Optional[Dict[str, np.ndarray]]:
        """The first queued rows' columns (one row), reading ahead; None at end of feed."""
        while self._next_epoch() is not None:
            for event in self._events:
                if event[0] == "rows" and not self._stale(event):
                    return rows_mod.batch_to_columns(event[3].slice(0, 1))
            if self._terminated or not self._read_message():
                break
        return None

    def to_torch_dataset(self, batch_size: int, drop_remainder: bool = True, transform=None):
        """A ``torch.utils.data.IterableDataset``; each pass is one epoch (see epoch_batches).

        Yields dicts of tensors (or whatever `transform` returns from a dict of numpy
        columns).  Use it with ``DataLoader(ds, batch_size=None)`` in the node's own
        process (``num_workers=0``: the feed is one reader).  The tensors share the
        feed's read-only Arrow memory (no copy): do not write into them in place.
        """
        import warnings

        import torch

        feed = self

        def to_tensors(cols):
            with warnings.catch_warnings():  # read-only on purpose: zero-copy from the feed
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in cols.items()
                        if v.dtype != object}

        class _FeedDataset(torch.utils.data.IterableDataset):
            def __iter__(self):
                for cols in feed.epoch_batches(batch_size, drop_remainder):
                    yield transform(cols) if transform is not None else to_tensors(cols)

        return _FeedDataset()
