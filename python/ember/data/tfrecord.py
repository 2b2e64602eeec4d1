"""A node's TFRecord input: Ember's C++ reader as numpy batches, a ``tf.data.Dataset`` or a
PyTorch ``IterableDataset``, local or on HDFS, sharded over the job's nodes.

    def main_fun(args, ctx):
        ds = ember.data.tfrecord_dataset(
            "hdfs:///data/fashion/train", batch_size=64,
            features={"image": ember.data.RawBytes((28, 28)), "label": tf.io.FixedLenFeature([], tf.int64)})
        model.fit(ds.map(lambda b: (b["image"], b["label"])), ...)

The files are read and decoded (CRC checks, tf.Example → columns) by the core on a background
thread; Python only wraps finished batches.  HDFS is reached over WebHDFS: no libhdfs, no JVM
and no CLASSPATH in the node.
"""
from __future__ import annotations

import copy
import random
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from ember import _ember
from ember.data import _features, _fs
from ember.tf import _keep_freed_memory

Paths = Union[str, Sequence[str]]

# Rows the core decodes per tf.data generator element when batches are smaller (see
# TFRecordBatches.to_tf_dataset).
_CHUNK_ROWS = 1024


def _shard_of(ctx, shard: Optional[Tuple[int, int]]) -> Tuple[int, int]:
    if shard is not None:
        index, count = int(shard[0]), int(shard[1])
        if count < 1 or not 0 <= index < count:
            raise ValueError(f"shard {shard!r}: want (index, count) with 0 <= index < count")
        return index, count
    if ctx is not None and getattr(ctx, "training_rank", None) is not None:
        return int(ctx.training_rank), int(ctx.num_workers)
    return 0, 1


class TFRecordBatches:
    """Re-iterable batches of a node's shard of TFRecord files: each ``iter()`` is one pass
    (epoch) and yields ``{feature: numpy}`` (see :mod:`ember.data._features` for the forms).

    Made by :func:`tfrecord_batches`; :meth:`to_tf_dataset` and :meth:`to_torch_dataset`
    wrap it for the frameworks.
    """

    def __init__(self, uris: List[str], specs: List[_features.Spec], batch_size: int, *,
                 resolve, shard: Tuple[int, int], drop_remainder: bool, compression: str,
                 skip_corrupt: bool, prefetch: int, shuffle_files: bool, seed: int,
                 decode_threads: Optional[int] = None, keep_mapped_bytes: int = 2 << 30):
        self.uris = uris
        self.specs = specs
        self.batch_size = batch_size
        self.shard = shard
        self._resolve = resolve
        self._drop_remainder = drop_remainder
        self._compression = compression
        self._skip_corrupt = skip_corrupt
        self._prefetch = prefetch
        # None: the core's default (DatasetOptions::decode_threads).
        self._threads = {} if decode_threads is None else {"decode_threads": int(decode_threads)}
        self._shuffle_files = shuffle_files
        self._seed = seed
        self._epoch = 0
        # Local files stay mapped from one pass to the next while this object lives, up to
        # keep_mapped_bytes: later epochs skip the kernel's mapping work (ember/fs.h MappingCache).
        self._mappings = _ember.MappingCache(max(0, int(keep_mapped_bytes)))
        self.stats: Dict[str, int] = {}  # the last pass's counters (files, records, rows, skipped_records)

    def _plan(self) -> Tuple[List[str], int, int]:
        """This pass's files and record-level shard: whole files per node when there are at least
        as many files as nodes (tf.data's FILE policy), else every count-th record (DATA)."""
        files = list(self.uris)
        if self._shuffle_files:
            random.Random(self._seed + self._epoch).shuffle(files)
        index, count = self.shard
        if count > 1 and len(files) >= count:
            return files[index::count], 1, 0
        return files, count, index

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        files, num_shards, shard_index = self._plan()
        self._epoch += 1
        ds = _ember.ExampleDataset.open(
            files, self._resolve, _features.core_schema(self.specs), self.batch_size, self._drop_remainder,
            num_shards, shard_index, self._prefetch, self._compression, self._skip_corrupt, **self._threads,
            mapping_cache=self._mappings)
        try:
            while True:
                columns = ds.next()
                if columns is None:
                    return
                yield {s.name: _features.to_numpy(s, c) for s, c in zip(self.specs, columns)}
        finally:
            self.stats = dict(ds.stats)
            ds.close()

    def to_tf_dataset(self):
        """A ``tf.data.Dataset`` of ``{feature: tensor}`` batches; each pass over it is one pass
        over the files.  Variable-length features are ``tf.RaggedTensor``."""
        import tensorflow as tf

        ragged = [s.name for s in self.specs if s.shape is None]
        per_chunk = 1 if ragged else max(1, _CHUNK_ROWS // self.batch_size)
        if per_chunk == 1:
            signature = {s.name: _tf_spec(tf, s) for s in self.specs}
            ds = tf.data.Dataset.from_generator(_with_ragged(tf, self, ragged), output_signature=signature)
        else:
            # Python's cost per generator element (~0.3 ms here, on the cores training runs
            # on) is paid once per chunk of `per_chunk` batches: the core decodes a chunk,
            # numpy views it as [batches, batch_size, ...] and unbatch() hands out the batches.
            size, drop = self.batch_size, self._drop_remainder
            chunks = copy.copy(self)
            chunks.batch_size, chunks._drop_remainder = size * per_chunk, False
            signature = {s.name: _tf_spec(tf, s, chunked=True) for s in self.specs}

            def gen():
                _keep_freed_memory()
                for batch in chunks:
                    rows = len(next(iter(batch.values())))
                    full = rows // size
                    if full:
                        yield {k: v[:full * size].reshape(full, size, *v.shape[1:]) for k, v in batch.items()}
                    if rows > full * size and not drop:
                        yield {k: v[None, full * size:] for k, v in batch.items()}

            ds = tf.data.Dataset.from_generator(gen, output_signature=signature).unbatch()
        return _unsharded(tf, ds)

    def to_torch_dataset(self, transform=None, device=None, prefetch: int = 2):
        """A ``torch.utils.data.IterableDataset`` of ``{feature: tensor}`` batches, or of what
        ``transform`` makes of each numpy batch.  Tensors share the decoded buffers (no copy);
        variable-length features stay ``(values, row_splits)`` numpy pairs and bytes features
        object arrays.  Use with ``DataLoader(ds, batch_size=None)``.  With ``device="cuda"``
        the tensors land on the GPU through pinned memory, `prefetch` batches ahead
        (``ember.torch.device_batches``)."""
        import torch

        from ember.torch import device_batches

        batches = self

        def to_tensors(batch):
            return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) and v.dtype != object else v
                    for k, v in batch.items()}

        class _Batches(torch.utils.data.IterableDataset):
            def __iter__(self):
                host = (transform(batch) if transform is not None else to_tensors(batch) for batch in batches)
                return iter(device_batches(host, device, prefetch))

        return _Batches()


def _with_ragged(tf, batches, ragged: List[str]):
    """A tf.data generator function over `batches` ({name: numpy} dicts, re-iterable) whose
    `ragged` columns, (values, row_splits) pairs, become ``tf.RaggedTensor``."""
    def gen():
        _keep_freed_memory()  # runs after TF's generator dataset set its malloc options
        for batch in batches:
            for name in ragged:
                values, splits = batch[name]
                batch[name] = tf.RaggedTensor.from_row_splits(values, splits, validate=False)
            yield batch
    return gen


def _unsharded(tf, ds):
    """`ds`, already this node's shard: a tf.distribute strategy must not shard it again (it
    would fall back to keeping every n-th batch of a generator)."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return ds.with_options(options)


def _tf_spec(tf, s: _features.Spec, chunked: bool = False):
    """A batch's spec ([B, ...]); ``chunked``: a chunk of batches ([N, B, ...], fixed shapes)."""
    lead = (None, None) if chunked else (None,)
    if s.raw_dtype is not None:
        return tf.TensorSpec((*lead, *s.shape), tf.as_dtype(s.raw_dtype))
    dtype = {"int64": tf.int64, "float": tf.float32, "bytes": tf.string}[s.kind]
    if s.shape is None:
        return tf.RaggedTensorSpec((None, None), dtype, ragged_rank=1, row_splits_dtype=tf.int64)
    return tf.TensorSpec((*lead, *s.shape), dtype)


def tfrecord_batches(paths: Paths, features: Optional[Dict[str, Any]] = None, batch_size: int = 128, *,
                     ctx=None, shard: Optional[Tuple[int, int]] = None, drop_remainder: bool = False,
                     compression: str = "auto", skip_corrupt: bool = False, prefetch: int = 2,
                     shuffle_files: bool = False, seed: int = 0,
                     decode_threads: Optional[int] = None, keep_mapped_bytes: int = 2 << 30) -> TFRecordBatches:
    """This node's batches of TFRecord files of tf.Example, as numpy.

    Args:
        paths: a file, a directory (its files, skipping ``_*`` and ``.*``), a glob
            (``hdfs:///data/part-*``) or a list of them; local paths, ``file://``,
            ``hdfs://`` (through the job's ``fs.defaultFS``) or ``webhdfs://``.
        features: ``{name: spec}`` (see :mod:`ember.data._features`); None infers them from the
            first records of the first file (one value in every record → a scalar).
        batch_size: rows per batch (per node).
        ctx: the node's context (default: the current node's); gives the shard and how to
            reach HDFS.
        shard: ``(index, count)``; default ``(ctx.training_rank, ctx.num_workers)`` in a
            training node, else everything.  With at least ``count`` files each node reads
            whole files (``files[index::count]``), else every ``count``-th record.
        drop_remainder: drop a last smaller batch (synchronous training).
        compression: "auto" (by file suffix: .gz, .zlib), "none", "gzip" or "zlib".
        skip_corrupt: skip corrupt records (counted in ``.stats``) instead of failing.
        prefetch: batches the core decodes ahead on its own thread.
        shuffle_files: a new file order each pass (seeded by ``seed`` and the pass).
        decode_threads: threads decoding batches side by side (files are still read in
            order and batches come out in order); default 2.
        keep_mapped_bytes: uncompressed local files are read in place (``mmap``); up to this
            many bytes of them stay mapped from one pass (epoch) to the next while the returned
            object lives, so later passes skip the kernel's mapping work (docs/benchmarks.md,
            issue 8: 1.2-1.3x the read speed).  Their pages read so far count in the process's
            RSS between passes too, which a memory monitor counting RSS (YARN's pmem check)
            sees; 0 maps each file anew every pass.
    """
    ctx = ctx if ctx is not None else _fs.current_context()
    resolve = _fs.resolve_options(ctx)
    uris = _fs.expand(paths, resolve)
    if features is None:
        specs = _features.specs_from_inferred(*_fs.infer(uris[0], resolve, compression))
    else:
        specs = _features.to_specs(features)
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size} is not positive")
    return TFRecordBatches(uris, specs, int(batch_size), resolve=resolve, shard=_shard_of(ctx, shard),
                           drop_remainder=drop_remainder, compression=compression, skip_corrupt=skip_corrupt,
                           prefetch=int(prefetch), shuffle_files=shuffle_files, seed=int(seed),
                           decode_threads=decode_threads, keep_mapped_bytes=keep_mapped_bytes)


def tfrecord_dataset(paths: Paths, features: Optional[Dict[str, Any]] = None, batch_size: int = 128,
                     **kwargs):
    """:func:`tfrecord_batches` as a ``tf.data.Dataset`` of ``{feature: tensor}`` batches (the
    drop-in for ``tf.data.TFRecordDataset(files).batch(n).map(parse_example)``); same args."""
    return tfrecord_batches(paths, features, batch_size, **kwargs).to_tf_dataset()
