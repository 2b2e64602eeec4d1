"""A node's Parquet input (issue 23): its shard of a Parquet dataset, local or on HDFS, as numpy
batches, a ``tf.data.Dataset`` or a PyTorch ``IterableDataset``, in the forms
:func:`ember.data.tfrecord_batches` gives.

    def main_fun(args, ctx):
        ds = ember.data.parquet_dataset(
            "hdfs:///warehouse/fashion/train", batch_size=64, shuffle=True, equal_batches=True,
            columns={"image": ember.data.RawBytes((28, 28)), "label": None})
        model.fit(ds.map(lambda b: (b["image"], b["label"])), ...)

Arrow's own Parquet reader (pyarrow) decodes the pages; Ember finds the files through its
FileSystem layer (``hdfs://`` over WebHDFS: no libhdfs, no JVM, no CLASSPATH in the node),
assigns row groups to the nodes, shuffles and batches.

The plan: every node reads every file's footer (row groups and their row counts) and makes the
same assignment of row groups to nodes, largest first to the node with the fewest rows so far
(ties to the lower index), so the nodes' row counts differ by at most one row group.  With fewer
row groups than nodes, each row group is cut into one row range per node instead.  Since every
node knows every node's rows, ``equal_batches=True`` gives each node the same number of full
batches per pass (what synchronous training's allreduce needs), without a word between them.

Columns, by their Parquet/Arrow type (``columns`` may give a form per column):

=========================================  ===============================  ==================
column                                     numpy batch                      tf.data element
=========================================  ===============================  ==================
int, float, bool                           ``[B]``                          ``[B]``
fixed-size list (``FixedSizeList<float>``)  ``[B, k]`` (a view: no copy)     ``[B, k]``
list (Spark's ``array<float>``), with a    ``[B, *shape]`` (a view)         ``[B, *shape]``
shape: ``{"x": (28, 28)}``
list, no shape                             ``(values, row_splits)``         ``tf.RaggedTensor``
binary with ``RawBytes(shape, dtype)``     ``dtype [B, *shape]`` (a view)   ``[B, *shape]``
binary / string                            object array of bytes / str      ``tf.string [B]``
a Hive partition key (``.../date=2026-      int64, float64 or str per row    ``[B]``
11-27/part-0.parquet``) named in columns
=========================================  ===============================  ==================

Nulls are refused (a clear error naming the file, row group and column), as a FixedLenFeature
without a default is in tf.Example.
"""
from __future__ import annotations

import collections
import concurrent.futures
import heapq
import itertools
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from ember import _ember, errors
from ember._parquet_io import kept_open
from ember._parquet_io import local_path as _local_path
from ember._parquet_io import parquet_file as _parquet_file
from ember.data import _fs
from ember.data._features import RawBytes
from ember.data.tfrecord import _shard_of, _unsharded, _with_ragged

Paths = Union[str, Sequence[str]]
Columns = Union[None, Sequence[str], Dict[str, Any]]
PartitionFilter = Union[None, Dict[str, Any], Callable[[Dict[str, str]], bool]]

DEFAULT_SHUFFLE_BUFFER = 8192  # rows pooled across row groups when shuffling
_OPEN_FILES = 8  # files a reader thread keeps open (footers read once) within a pass


# ----------------------------------------------------------------------------- files
def _partition_of(uri: str) -> Dict[str, str]:
    """The Hive-style ``key=value`` directories of ``uri`` (``.../date=2026-11-27/part-0``)."""
    out = {}
    for part in uri.split("://", 1)[-1].split("/")[:-1]:
        key, sep, value = part.partition("=")
        if sep and key:
            out[key] = value
    return out


@dataclass(frozen=True)
class _Piece:
    """Rows [start, stop) of row group `group` of file `file` (an index into the plan's files)."""
    file: int
    group: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def _assign(pieces: List[_Piece], count: int) -> List[List[_Piece]]:
    """Each node's pieces: largest first to the node with the fewest rows so far (ties: the lower
    node, then the piece earlier in the files), each node's in file order."""
    nodes: List[List[_Piece]] = [[] for _ in range(count)]
    heap = [(0, i) for i in range(count)]
    for p in sorted(pieces, key=lambda p: (-p.rows, p.file, p.group, p.start)):
        rows, i = heapq.heappop(heap)
        nodes[i].append(p)
        heapq.heappush(heap, (rows + p.rows, i))
    return [sorted(n, key=lambda p: (p.file, p.group, p.start)) for n in nodes]


# ----------------------------------------------------------------------------- columns
def _typed_partition_values(values: List[Optional[str]], kind: Optional[Callable] = None):
    """A partition key's values typed by ``kind`` (a Delta table's schema) or as Spark and pyarrow
    infer them from paths: int64, float64, else str.  None (a null) stays None."""
    if kind is not None:
        return [None if v is None else kind(v) for v in values]
    for kind in (int, float):
        try:
            return [kind(v) for v in values]
        except (ValueError, TypeError):
            continue
    return values


@dataclass
class _Column:
    name: str
    form: Any = None          # None, RawBytes, or a shape tuple
    partition: bool = False   # a Hive partition key, not a column of the files


def _fail(uri: str, group: int, column: str, what: str) -> "errors.InvalidArgument":
    return errors.InvalidArgument(f"{uri}, row group {group}, column {column!r}: {what}")


def _to_numpy(arr, col: _Column, uri: str, group: int):
    """One column of a row group as numpy (see the module's table); no copy where Arrow's buffers
    already hold the values as numpy wants them."""
    import pyarrow as pa

    if arr.null_count:
        raise _fail(uri, group, col.name, f"{arr.null_count} null value(s); ember.data reads no nulls "
                    "(fill or drop them first, e.g. DataFrame.fillna / dropna)")
    t = arr.type
    form = col.form
    if isinstance(form, RawBytes):
        if not (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)):
            raise _fail(uri, group, col.name, f"RawBytes reads a binary column, not {t}")
        dtype = np.dtype(form.dtype)
        width = int(np.prod(form.shape, dtype=np.int64)) * dtype.itemsize
        if pa.types.is_fixed_size_binary(t):
            if t.byte_width != width:
                raise _fail(uri, group, col.name, f"values of {t.byte_width} bytes, RawBytes{form.shape} of "
                            f"{form.dtype} wants {width}")
            data = np.frombuffer(arr.buffers()[1], np.uint8)[arr.offset * width:(arr.offset + len(arr)) * width]
        else:
            offsets = np.frombuffer(arr.buffers()[1], np.int64 if pa.types.is_large_binary(t) else np.int32)
            offsets = offsets[arr.offset:arr.offset + len(arr) + 1]
            lengths = np.diff(offsets)
            bad = np.flatnonzero(lengths != width)
            if bad.size:
                raise _fail(uri, group, col.name, f"row {int(bad[0])} of the row group holds {int(lengths[bad[0]])} "
                            f"bytes, RawBytes{form.shape} of {form.dtype} wants {width}")
            data = np.frombuffer(arr.buffers()[2], np.uint8)[offsets[0]:offsets[-1]] if len(arr) else \
                np.zeros(0, np.uint8)
        return data.view(dtype).reshape(len(arr), *form.shape)
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        values, splits, inner_shape = _flatten_lists(arr)
        if values.null_count:
            raise _fail(uri, group, col.name, "null values inside the lists; ember.data reads no nulls")
        flat = values.to_numpy(zero_copy_only=False)
        rows = len(arr)
        if form is not None:
            shape = tuple(int(d) for d in form)
            per_row = int(np.prod(shape, dtype=np.int64))
            lengths = np.diff(splits)
            bad = np.flatnonzero(lengths != per_row)
            if bad.size:
                raise _fail(uri, group, col.name, f"row {int(bad[0])} of the row group holds {int(lengths[bad[0]])} "
                            f"values, shape {shape} wants {per_row}")
            return flat.reshape(rows, *shape)
        if inner_shape is not None:
            return flat.reshape(rows, *inner_shape)
        return flat, splits
    if form is not None:
        raise _fail(uri, group, col.name, f"a shape or RawBytes applies to list and binary columns, not {t}")
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
    return arr.to_numpy(zero_copy_only=False)


def _flatten_lists(arr):
    """(the innermost values, row_splits over them (int64), the per-row shape if every level is a
    fixed-size list, else None).  Nested fixed-size lists give [rows, d1, d2, ...]; a variable
    list (Spark's array<...>) gives splits, of fixed-size lists too (splits count the innermost
    values).  Lists of variable lists are refused."""
    import pyarrow as pa

    def fixed_levels(level):
        shape = []
        while pa.types.is_fixed_size_list(level.type):
            shape.append(level.type.list_size)
            level = level.flatten()  # only the values the rows refer to (honours slicing)
        if pa.types.is_list(level.type) or pa.types.is_large_list(level.type):
            raise errors.InvalidArgument(f"lists of variable-length lists ({arr.type}) are not read")
        return level, shape

    rows = len(arr)
    if pa.types.is_fixed_size_list(arr.type):
        values, shape = fixed_levels(arr)
        per_row = int(np.prod(shape, dtype=np.int64))
        return values, np.arange(rows + 1, dtype=np.int64) * per_row, tuple(shape)
    offsets = np.asarray(arr.offsets, dtype=np.int64)  # rows + 1 of them, for this (sliced) array
    values, inner = fixed_levels(arr.flatten())
    return values, (offsets - offsets[0]) * int(np.prod(inner, dtype=np.int64)), None


# A batch: {name: ndarray or (values, row_splits)}.
Batch = Dict[str, Any]


def _rows(batch: Batch) -> int:
    for v in batch.values():
        return len(v[1]) - 1 if isinstance(v, tuple) else len(v)
    return 0


def _take(batch: Batch, index) -> Batch:
    """Rows `index` (a slice or an array of row numbers) of `batch`."""
    out = {}
    for k, v in batch.items():
        if not isinstance(v, tuple):
            out[k] = v[index]
            continue
        values, splits = v
        if isinstance(index, slice):
            start, stop, _ = index.indices(len(splits) - 1)
            out[k] = (values[splits[start]:splits[stop]], splits[start:stop + 1] - splits[start])
        else:
            lengths = np.diff(splits)[index]
            new_splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            pieces = [values[splits[i]:splits[i + 1]] for i in index]
            out[k] = (np.concatenate(pieces) if pieces else values[:0], new_splits)
    return out


def _concat(batches: List[Batch]) -> Batch:
    if len(batches) == 1:
        return batches[0]
    out = {}
    for k, first in batches[0].items():
        if not isinstance(first, tuple):
            out[k] = np.concatenate([b[k] for b in batches])
            continue
        values = np.concatenate([b[k][0] for b in batches])
        splits, base = [np.zeros(1, np.int64)], 0
        for b in batches:
            s = b[k][1]
            splits.append(s[1:] + base)
            base += int(s[-1])
        out[k] = (values, np.concatenate(splits))
    return out


# ----------------------------------------------------------------------------- the batches
class ParquetBatches:
    """Re-iterable batches of a node's shard of a Parquet dataset: each ``iter()`` is one pass
    (epoch) and yields ``{column: numpy}`` (the module's table gives the forms).

    Made by :func:`parquet_batches`; :meth:`to_tf_dataset` and :meth:`to_torch_dataset` wrap it
    for the frameworks.  ``rows`` and ``batches_per_pass`` say what one pass holds;
    ``node_rows`` every node's rows (the plan is the same on every node).
    """

    def __init__(self, uris: List[str], columns: List[_Column], batch_size: int, *, resolve,
                 shard: Tuple[int, int], drop_remainder: bool, equal_batches: bool, shuffle: bool,
                 shuffle_buffer: int, seed: int, prefetch: int, partitions: List[Dict[str, str]],
                 plan: List[List[_Piece]], use_threads: bool, readers: int,
                 partition_types: Optional[Dict[str, Callable]] = None):
        self.uris = uris
        self.columns = columns
        self.batch_size = batch_size
        self.shard = shard
        self._resolve = resolve
        self._drop_remainder = drop_remainder or equal_batches
        self._equal = equal_batches
        self._shuffle = shuffle
        self._shuffle_buffer = shuffle_buffer
        self._seed = seed
        self._prefetch = prefetch
        self._partitions = partitions
        self._plan = plan
        self._pieces = plan[shard[0]]
        self._use_threads = use_threads
        self._readers = max(1, readers)
        self.node_rows = [sum(p.rows for p in node) for node in plan]
        self._epoch = 0
        types = partition_types or {}
        self._typed = {c.name: _typed_partition_values([p[c.name] for p in partitions], types.get(c.name))
                       for c in columns if c.partition}
        self.stats: Dict[str, int] = {}  # the last pass's counters (row_groups, rows, batches)

    @property
    def rows(self) -> int:
        """This node's rows per pass (before any batches are dropped)."""
        return self.node_rows[self.shard[0]]

    @property
    def batches_per_pass(self) -> int:
        """The batches each pass yields on this node (with ``equal_batches``: on every node)."""
        size = self.batch_size
        if self._equal:
            return min(r // size for r in self.node_rows)
        return self.rows // size if self._drop_remainder else -(-self.rows // size)

    # -- reading
    def _read(self, piece: _Piece, opened: Optional[Dict[int, Any]] = None) -> Batch:
        """Rows of one piece; `opened` keeps the reader's last few open files (their footers read once)."""
        import pyarrow as pa

        uri = self.uris[piece.file]
        names = [c.name for c in self.columns if not c.partition]
        opened = {} if opened is None else opened
        try:
            # a shuffled order comes back to files: keep a few open
            pf = kept_open(piece.file, opened, _OPEN_FILES, lambda: _parquet_file(uri, self._resolve))
            table = pf.read_row_group(piece.group, columns=names, use_threads=self._use_threads)
        except errors.EmberError:
            raise
        except (pa.ArrowException, OSError) as e:
            raise errors.Corruption(f"{uri}, row group {piece.group} (columns {names}): {e}") from e
        if piece.start or piece.stop < table.num_rows:
            table = table.slice(piece.start, piece.rows)
        batch: Batch = {}
        for col in self.columns:
            if col.partition:
                value = self._typed[col.name][piece.file]
                if value is None:
                    raise _fail(uri, piece.group, col.name, "a null partition value; ember.data reads no nulls "
                                "(leave the partition out with partition_filter)")
                batch[col.name] = np.full(piece.rows, value, dtype=object if isinstance(value, str) else None)
                continue
            chunked = table.column(col.name)
            arr = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
            batch[col.name] = _to_numpy(arr, col, uri, piece.group)
        return batch

    def _pieces_read(self, order: List[_Piece]) -> Iterator[Batch]:
        """The pieces' batches in order.  With `prefetch`, that many row groups are read ahead by
        `readers` threads side by side (Arrow decodes without the GIL; each thread keeps its own
        open file); a read waits at most the file system's own timeouts."""
        if self._prefetch <= 0:
            opened: Dict[int, Any] = {}
            for p in order:
                yield self._read(p, opened)
            return
        local = threading.local()

        def read(p: _Piece) -> Batch:
            if not hasattr(local, "opened"):
                local.opened = {}
            return self._read(p, local.opened)

        ahead = iter(order)
        with concurrent.futures.ThreadPoolExecutor(max_workers=self._readers,
                                                   thread_name_prefix="ember-parquet") as pool:
            pending = collections.deque(pool.submit(read, p) for p in itertools.islice(ahead, self._prefetch))
            try:
                while pending:
                    batch = pending.popleft().result()
                    for p in itertools.islice(ahead, 1):
                        pending.append(pool.submit(read, p))
                    yield batch
            finally:
                for f in pending:  # the pass ended early: reads not begun are dropped
                    f.cancel()

    def __iter__(self) -> Iterator[Batch]:
        epoch = self._epoch
        self._epoch += 1
        index, _ = self.shard
        rng = np.random.default_rng([self._seed, epoch, index])
        order = list(self._pieces)
        if self._shuffle:
            order = [order[i] for i in rng.permutation(len(order))]
        limit = self.batches_per_pass if self._equal else None
        size = self.batch_size
        pending: List[Batch] = []  # rows short of a batch, carried to the next piece
        pending_rows = 0
        stats = {"row_groups": 0, "rows": 0, "batches": 0}

        def batches_of(batch: Batch) -> Iterator[Batch]:
            """Full batches of the pending rows and `batch`: views of `batch` where a batch lies
            within it, a copy only for the batch that joins a remainder to its head."""
            nonlocal pending, pending_rows
            n, pos = _rows(batch), 0
            if pending_rows:
                need = size - pending_rows
                if n < need:
                    pending.append(batch)
                    pending_rows += n
                    return
                pending.append(_take(batch, slice(0, need)))
                yield _concat(pending)
                pending, pending_rows, pos = [], 0, need
            while n - pos >= size:
                yield _take(batch, slice(pos, pos + size))
                pos += size
            if pos < n:
                pending, pending_rows = [_take(batch, slice(pos, n))], n - pos

        def done() -> bool:
            return limit is not None and stats["batches"] >= limit

        pool: Optional[Batch] = None  # shuffling: rows mixed before they are batched
        reader = self._pieces_read(order)
        try:
            for piece in reader:
                stats["row_groups"] += 1
                stats["rows"] += _rows(piece)
                if self._shuffle:
                    pool = piece if pool is None else _concat([pool, piece])
                    n = _rows(pool)
                    if n <= self._shuffle_buffer:
                        continue
                    pool = _take(pool, rng.permutation(n))
                    piece, pool = _take(pool, slice(0, n - self._shuffle_buffer)), \
                        _take(pool, slice(n - self._shuffle_buffer, n))
                for b in batches_of(piece):
                    if done():
                        return
                    stats["batches"] += 1
                    yield b
            tail = []
            if pool is not None and _rows(pool):
                tail = list(batches_of(_take(pool, rng.permutation(_rows(pool)))))
            if pending_rows and not self._drop_remainder:
                tail.append(_concat(pending))
            for b in tail:
                if done():
                    return
                stats["batches"] += 1
                yield b
        finally:
            reader.close()
            self.stats = stats

    def to_tf_dataset(self):
        """A ``tf.data.Dataset`` of ``{column: tensor}`` batches; each pass over it is one pass
        over this node's row groups.  Variable-length lists are ``tf.RaggedTensor``."""
        import tensorflow as tf

        first = self._probe()
        signature = {name: _tf_spec(tf, value) for name, value in first.items()}
        ragged = [name for name, value in first.items() if isinstance(value, tuple)]
        return _unsharded(tf, tf.data.Dataset.from_generator(_with_ragged(tf, self, ragged),
                                                             output_signature=signature))

    def _probe(self) -> Batch:
        """One row of the dataset in its numpy form (for the tf.data signature): the first row
        group that has rows (this node's, else any)."""
        for p in list(self._pieces) + [p for node in self._plan for p in node]:
            if p.rows:
                return _take(self._read(_Piece(p.file, p.group, p.start, p.start + 1)), slice(0, 1))
        raise errors.NotFound(f"no rows in {len(self.uris)} Parquet file(s)")

    def to_torch_dataset(self, transform=None, device=None, prefetch: int = 2):
        """A ``torch.utils.data.IterableDataset`` of ``{column: tensor}`` batches, or of what
        ``transform`` makes of each numpy batch (as :meth:`TFRecordBatches.to_torch_dataset`)."""
        import torch

        from ember.torch import device_batches

        batches = self

        def to_tensors(batch):
            # Arrow's buffers are read-only to numpy: those batches are copied for torch's tensors.
            return {k: torch.from_numpy(v if v.flags.writeable else v.copy())
                    if isinstance(v, np.ndarray) and v.dtype != object else v for k, v in batch.items()}

        class _Batches(torch.utils.data.IterableDataset):
            def __iter__(self):
                host = (transform(batch) if transform is not None else to_tensors(batch) for batch in batches)
                return iter(device_batches(host, device, prefetch))

        return _Batches()


def _tf_spec(tf, value):
    if isinstance(value, tuple):
        return tf.RaggedTensorSpec((None, None), tf.as_dtype(value[0].dtype), ragged_rank=1,
                                   row_splits_dtype=tf.int64)
    if value.dtype == object:
        return tf.TensorSpec((None,), tf.string)
    return tf.TensorSpec((None, *value.shape[1:]), tf.as_dtype(value.dtype))


# ----------------------------------------------------------------------------- the entry points
def _column_specs(columns: Columns, schema, partition_keys: Sequence[str], uri: str) -> List[_Column]:
    if columns is None:
        names = list(schema.names)
        forms: Dict[str, Any] = {}
    elif isinstance(columns, dict):
        names, forms = list(columns), dict(columns)
    elif isinstance(columns, str):
        raise TypeError("columns: a list of names or a {name: form} dict, not a string")
    else:
        names, forms = list(columns), {}
    if not names:
        raise errors.InvalidArgument("columns: no column named")
    out = []
    for name in names:
        if name in schema.names:
            out.append(_Column(name, forms.get(name)))
        elif name in partition_keys:
            out.append(_Column(name, None, partition=True))
        else:
            raise errors.InvalidArgument(f"{uri}: no column {name!r} (it has {list(schema.names)}"
                                         + (f", partition keys {list(partition_keys)}" if partition_keys else "") + ")")
    return out


def _keep(partition: Dict[str, str], where: PartitionFilter) -> bool:
    if where is None:
        return True
    if callable(where):
        return bool(where(dict(partition)))
    for key, wanted in where.items():
        if key not in partition:
            return False
        allowed = {str(w) for w in wanted} if isinstance(wanted, (list, tuple, set, frozenset)) else {str(wanted)}
        if partition[key] not in allowed:
            return False
    return True


def parquet_batches(paths: Paths, columns: Columns = None, batch_size: int = 128, *, ctx=None,
                    shard: Optional[Tuple[int, int]] = None, partition_filter: PartitionFilter = None,
                    shuffle: bool = False, shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER, seed: int = 0,
                    drop_remainder: bool = False, equal_batches: bool = False, prefetch: int = 4,
                    readers: int = 2, use_threads: bool = True) -> ParquetBatches:
    """This node's batches of a Parquet dataset, as numpy.

    Args:
        paths: a file, a directory (its visible files, those of its Hive-style partition
            directories too; ``_*`` and ``.*`` names skipped, as Spark's readers skip them), a glob
            (``hdfs:///t/date=2026-*``) or a list of them; local paths, ``file://``, ``hdfs://``
            (through the job's ``fs.defaultFS``) or ``webhdfs://``.
        columns: the columns to read (projection: only their column chunks are fetched), as a list
            of names or ``{name: form}`` (None: as stored; a shape tuple for a list column;
            :class:`ember.data.RawBytes` for a binary column); default every column of the files.
            A Hive partition key may be named too.
        batch_size: rows per batch (per node).
        ctx: the node's context (default: the current node's); gives the shard and how to reach HDFS.
        shard: ``(index, count)``; default ``(ctx.training_rank, ctx.num_workers)`` in a training
            node, else everything.
        partition_filter: which Hive partitions to read, ``{key: value or [values]}`` or a function
            of the partition's ``{key: value}`` strings; files outside are never opened.
        shuffle: a new order every pass (seeded by ``seed``, the pass and the node): the node's row
            groups in a shuffled order, their rows mixed in a pool of ``shuffle_buffer`` rows.
        drop_remainder: drop a last smaller batch.
        equal_batches: every node yields the same number of full batches per pass (the smallest
            node's), for synchronous training; implies ``drop_remainder``.
        prefetch: row groups read ahead (0: none, each read when its rows are due).
        readers: threads reading those row groups side by side.
        use_threads: Arrow decodes a row group's columns on its own threads too.
    """
    ctx = ctx if ctx is not None else _fs.current_context()
    resolve = _fs.resolve_options(ctx)
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size} is not positive")
    if shuffle_buffer < 0:
        raise ValueError(f"shuffle_buffer {shuffle_buffer} is negative")
    items = [paths] if isinstance(paths, str) else list(paths)
    if not items:
        raise ValueError("no paths given")
    uris: List[str] = []
    for p in items:
        for uri in _ember.fs_glob(str(p), resolve, recursive=True):
            if uri not in uris:
                uris.append(uri)
    return _batches_of_files(items, uris, [_partition_of(u) for u in uris], columns, batch_size, resolve=resolve,
                             ctx=ctx, shard=shard, partition_filter=partition_filter, shuffle=shuffle,
                             shuffle_buffer=shuffle_buffer, seed=seed, drop_remainder=drop_remainder,
                             equal_batches=equal_batches, prefetch=prefetch, readers=readers,
                             use_threads=use_threads)


def _footer(uri: str, resolve, listed_by: Optional[str]):
    """``uri``'s ParquetFile (its footer read); NotFound naming who listed a file that is not there."""
    try:
        return _parquet_file(uri, resolve)
    except (errors.NotFound, errors.Corruption) as e:
        local = _local_path(uri)
        gone = isinstance(e, errors.NotFound) or (local is not None and not os.path.exists(local))
        if not gone:
            raise
        where = f"; {listed_by} lists it (removed by VACUUM or by hand?)" if listed_by else ""
        raise errors.NotFound(f"{uri}: no such Parquet file{where}") from e


def _batches_of_files(items, uris: List[str], partitions: List[Dict[str, Optional[str]]], columns: Columns,
                      batch_size: int, *, resolve, ctx, shard, partition_filter: PartitionFilter, shuffle: bool,
                      shuffle_buffer: int, seed: int, drop_remainder: bool, equal_batches: bool, prefetch: int,
                      readers: int, use_threads: bool, partition_types: Optional[Dict[str, Callable]] = None,
                      listed_by: Optional[str] = None) -> ParquetBatches:
    """The plan for Parquet files already found (a directory's, a glob's, a Delta snapshot's):
    the partition filter, the footers (the files' schemas checked against the first's), the
    row groups, this node's share.  ``partitions`` holds each file's partition values as strings
    (None: a null value); ``partition_types`` types them (default: as Spark infers from paths)."""
    kept = [(u, part) for u, part in zip(uris, partitions) if _keep(part, partition_filter)]
    if not kept:
        raise errors.NotFound(f"no Parquet file of {items} is in the partitions {partition_filter!r} "
                              f"({len(uris)} file(s) outside them)")
    uris, partitions = [u for u, _ in kept], [p for _, p in kept]
    keys = sorted(set().union(*partitions)) if partitions else []

    pieces: List[_Piece] = []
    specs: Optional[List[_Column]] = None
    want_schema = None
    first_uri = uris[0]
    for i, uri in enumerate(uris):
        pf = _footer(uri, resolve, listed_by)
        schema = pf.schema_arrow
        if specs is None:
            specs = _column_specs(columns, schema, keys, uri)
            want_schema = {c.name: schema.field(c.name).type for c in specs if not c.partition}
        else:
            for name, t in want_schema.items():
                if name not in schema.names:
                    raise errors.InvalidArgument(f"{uri}: no column {name!r}, which {first_uri} has "
                                                 f"(it has {list(schema.names)})")
                if schema.field(name).type != t:
                    raise errors.InvalidArgument(f"{uri}: column {name!r} is {schema.field(name).type}, "
                                                 f"{first_uri} has {t}: the files' schemas differ")
        for c in specs:
            if c.partition and c.name not in partitions[i]:
                raise errors.InvalidArgument(f"{uri}: no partition key {c.name!r} in its path")
        meta = pf.metadata
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            if n:
                pieces.append(_Piece(i, g, 0, n))
    index, count = _shard_of(ctx, shard)
    total = sum(p.rows for p in pieces)
    if total == 0:
        raise errors.NotFound(f"the Parquet dataset {items} has no rows ({len(uris)} file(s))")
    if len(pieces) < count:
        # Fewer row groups than nodes: each row group is cut into one row range per node.
        cut = []
        for p in pieces:
            bounds = [p.start + (p.rows * k) // count for k in range(count + 1)]
            cut += [_Piece(p.file, p.group, a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
        pieces = cut
    plan = _assign(pieces, count)
    return ParquetBatches(uris, specs, int(batch_size), resolve=resolve, shard=(index, count),
                          drop_remainder=drop_remainder, equal_batches=equal_batches, shuffle=shuffle,
                          shuffle_buffer=int(shuffle_buffer), seed=int(seed), prefetch=int(prefetch),
                          partitions=partitions, plan=plan, use_threads=use_threads, readers=int(readers),
                          partition_types=partition_types)


def parquet_dataset(paths: Paths, columns: Columns = None, batch_size: int = 128, **kwargs):
    """:func:`parquet_batches` as a ``tf.data.Dataset`` of ``{column: tensor}`` batches; same args."""
    return parquet_batches(paths, columns, batch_size, **kwargs).to_tf_dataset()


__all__ = ["ParquetBatches", "parquet_batches", "parquet_dataset", "DEFAULT_SHUFFLE_BUFFER"]
