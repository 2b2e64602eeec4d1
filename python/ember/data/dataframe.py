"""DataFrame <-> TFRecord files of tf.Example, distributed over Spark tasks, Arrow in and out
(TFoS's ``dfutil.saveAsTFRecords`` / ``loadTFRecords``, without the tensorflow-hadoop jar).

Each Spark task encodes (or decodes) its rows in the C++ core: Arrow buffers become
tf.Example columns without an object per value.  The type mapping is in
:mod:`ember.data._schema`.  Paths are local, ``file://``, ``hdfs://`` (WebHDFS, through the
session's ``fs.defaultFS``) or ``webhdfs://``.
"""
from __future__ import annotations

import uuid
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ember import _ember
from ember._driver.spark_side import spark_side
from ember.data import _features, _fs, _schema

_READ_BATCH = 8192  # rows per Arrow batch load_tfrecords' tasks hand Spark
_SUCCESS = "_SUCCESS"
_TEMPORARY = "_temporary"


# ----------------------------------------------------------------------------- Arrow -> columns
def _bytes_values(arr: pa.Array, column: str) -> Tuple[np.ndarray, np.ndarray]:
    """(data uint8, offsets int64 from 0) of a binary/string array without nulls."""
    if arr.null_count:
        raise ValueError(f"column {column!r}: an array holds a null element; tf.Example lists cannot")
    t = arr.type
    if pa.types.is_fixed_size_binary(t):
        w = t.byte_width
        data = np.frombuffer(arr.buffers()[1], np.uint8)[arr.offset * w:(arr.offset + len(arr)) * w]
        return data, np.arange(len(arr) + 1, dtype=np.int64) * w
    big = pa.types.is_large_binary(t) or pa.types.is_large_string(t)
    offsets = np.frombuffer(arr.buffers()[1], np.int64 if big else np.int32)[arr.offset:arr.offset + len(arr) + 1]
    buf = arr.buffers()[2]
    data = np.frombuffer(buf, np.uint8) if buf is not None else np.zeros(0, np.uint8)
    start = int(offsets[0]) if len(offsets) else 0
    end = int(offsets[-1]) if len(offsets) else 0
    return data[start:end], offsets.astype(np.int64) - start


def _values(arr: pa.Array, f: _schema.Feature, column: str):
    """The core's (values, bytes_offsets) of a flat array without nulls."""
    if f.kind == _schema.BYTES:
        return _bytes_values(arr, column)
    if arr.null_count:
        raise ValueError(f"column {column!r}: an array holds a null element; tf.Example lists cannot")
    dtype = np.int64 if f.kind == _schema.INT64 else np.float32
    return np.ascontiguousarray(arr.to_numpy(zero_copy_only=False).astype(dtype, copy=False)), None


def arrow_to_columns(batch: pa.RecordBatch, features: Sequence[_schema.Feature]) -> list:
    """The encoder's columns (name, kind, values, bytes_offsets, row_splits, present) of ``batch``."""
    out = []
    n = batch.num_rows
    for f in features:
        arr = batch.column(f.name)
        present = None
        if arr.null_count:
            present = np.ascontiguousarray(pc.is_valid(arr).to_numpy(zero_copy_only=False).astype(np.uint8))
        if f.is_list:
            lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
            splits = np.zeros(n + 1, np.int64)
            np.cumsum(lengths, out=splits[1:])
            values, offsets = _values(arr.flatten(), f, f.name)
        else:
            if present is not None:
                kept = present.astype(bool)
                splits = np.zeros(n + 1, np.int64)
                np.cumsum(kept, out=splits[1:])
                arr = arr.drop_null()
            else:
                splits = np.arange(n + 1, dtype=np.int64)
            values, offsets = _values(arr, f, f.name)
        out.append((f.name, f.kind, values, offsets, splits, present))
    return out


# ----------------------------------------------------------------------------- columns -> Arrow
def columns_to_arrow(columns: list, features: Sequence[_schema.Feature], schema: pa.Schema) -> pa.RecordBatch:
    """An Arrow batch of ``schema`` from the core's decoded columns."""
    arrays = []
    for f, (name, kind, values, offsets, splits, present) in zip(features, columns):
        t = schema.field(name).type
        n = len(present)
        mask = None if present.all() else ~present.astype(bool)
        value_type = t.value_type if pa.types.is_list(t) else t
        if kind == _schema.BYTES:
            big = pa.Array.from_buffers(pa.large_binary(), len(offsets) - 1,
                                        [None, pa.py_buffer(offsets), pa.py_buffer(values)])
            try:
                flat = big.cast(pa.large_string() if pa.types.is_string(value_type) else pa.large_binary())
            except pa.ArrowInvalid as e:
                raise ValueError(f"feature {name!r} holds bytes that are not UTF-8; name it in "
                                 f"binary_features to read it as binary ({e})") from None
            flat = flat.cast(value_type)
        else:
            flat = pa.array(values, type=value_type)
        if pa.types.is_list(t):
            arrays.append(pa.ListArray.from_arrays(pa.array(splits.astype(np.int32)), flat,
                                                    mask=None if mask is None else pa.array(mask)))
            continue
        lengths = np.diff(splits)
        if (lengths[present.astype(bool)] != 1).any():
            row = int(np.argmax((lengths != 1) & present.astype(bool)))
            raise ValueError(f"feature {name!r}: a record holds {int(lengths[row])} values where the schema "
                             f"has a scalar (row {row} of a batch); read it as an array")
        if mask is None:
            arrays.append(flat)
        else:  # scatter the present rows' values, nulls elsewhere
            idx = np.cumsum(present.astype(np.int64)) - 1
            arrays.append(pc.if_else(pa.array(present.astype(bool)), flat.take(pa.array(np.maximum(idx, 0))),
                                     pa.nulls(n, value_type)) if len(flat) else pa.nulls(n, value_type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# ----------------------------------------------------------------------------- save
def _part_name(partition: int, compression: str) -> str:
    suffix = {"gzip": ".gz", "zlib": ".zlib"}.get(compression, "")
    return f"part-r-{partition:05d}{suffix}"


def save_as_tfrecords(df, path: str, columns: Optional[Sequence[str]] = None, *, mode: str = "error",
                      compression: str = "none") -> int:
    """Writes ``df`` as TFRecord files of tf.Example under directory ``path``, one
    ``part-r-NNNNN`` file per partition (empty partitions write empty files) and ``_SUCCESS``;
    returns the number of rows written.

    Args:
        df: the DataFrame; every column (or ``columns``) must map to a feature
            (:mod:`ember.data._schema`), else TypeError naming it before any task runs.
        path: output directory (local, ``hdfs://``, ``webhdfs://``, or no scheme: fs.defaultFS).
        mode: "error" (refuse an existing non-empty directory) or "overwrite".
        compression: "none", "gzip" (``.gz`` files) or "zlib".

    Each task writes a temporary file and renames it into place, so a failed or retried
    task never leaves a partial ``part-r`` file.
    """
    if mode not in ("error", "overwrite"):
        raise ValueError(f"mode {mode!r}: use 'error' or 'overwrite'")
    compression = compression.lower()
    if compression not in ("none", "gzip", "zlib"):
        raise ValueError(f"compression {compression!r}: use 'none', 'gzip' or 'zlib'")
    from pyspark.sql.pandas.types import to_arrow_schema

    features = _schema.features_of(to_arrow_schema(df.schema), columns)
    default_fs, http = spark_side(df.sparkSession).hadoop_fs_conf()
    resolve = _fs.options_from(default_fs, http)
    base = path.rstrip("/")
    existing = _list_or_none(base, resolve)
    if existing:
        if mode == "error":
            raise FileExistsError(f"{path} exists and is not empty ({len(existing)} entries); pass "
                                  f"mode='overwrite' to replace it")
        _ember.fs_delete_recursively(base, resolve)
    run = uuid.uuid4().hex[:12]
    tmp_dir = f"{base}/{_TEMPORARY}/{run}"
    names = [f.name for f in features]

    def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        tc = TaskContext.get()
        pid, attempt = tc.partitionId(), tc.attemptNumber()
        opts = _fs.options_from(default_fs, http)
        tmp = f"{tmp_dir}/{_part_name(pid, compression)}.{attempt}"
        writer = _ember.ExampleWriter.open(tmp, opts, compression)
        rows = 0
        for b in batches:
            if b.num_rows:
                writer.write(arrow_to_columns(b.select(names), features))
                rows += b.num_rows
        writer.close()
        _ember.fs_rename(tmp, f"{base}/{_part_name(pid, compression)}", opts)
        yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))

    out = df.select(*names).mapInArrow(write_partition, "rows long").collect()
    _ember.fs_delete_recursively(f"{base}/{_TEMPORARY}", resolve)
    _ember.fs_write_file(f"{base}/{_SUCCESS}", b"", resolve)
    return sum(r.rows for r in out)


def _list_or_none(path: str, resolve) -> Optional[List[str]]:
    try:
        return _ember.fs_glob(path, resolve)
    except Exception as e:  # noqa: BLE001 - NotFound: nothing there yet
        if type(e).__name__ == "NotFound":
            return None
        raise


# ----------------------------------------------------------------------------- load
def _arrow_schema(schema) -> pa.Schema:
    if schema is None or isinstance(schema, pa.Schema):
        return schema
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(schema)


def infer_features(uri: str, resolve, compression: str = "auto") -> List[_schema.Feature]:
    """Features of the first records of ``uri``: a kind each, a scalar where every record
    held exactly one value, else an array; bytes are strings (see binary_features)."""
    inferred, rows = _fs.infer(uri, resolve, compression)
    if rows == 0:
        raise ValueError(f"{uri} holds no records to infer a schema from; pass schema=")
    return [_schema.Feature(name, kind, () if (lo == hi == 1 and present == rows) else None,
                            string=kind == _schema.BYTES)
            for name, kind, lo, hi, present in inferred]


def load_tfrecords(spark, path: Union[str, Sequence[str]], schema=None, binary_features: Sequence[str] = (), *,
                   compression: str = "auto", skip_corrupt: bool = False,
                   num_partitions: Optional[int] = None):
    """A DataFrame of the tf.Examples in the TFRecord files ``path`` names (a directory, a glob,
    a file or a list), read by Spark tasks in the C++ core.

    Args:
        schema: a Spark ``StructType`` (or ``pa.Schema``); None infers one from the first
            records of the first file (TFoS infers from the first record only).
        binary_features: bytes features to read as BinaryType; the others are StringType.
        compression: "auto" (by suffix), "none", "gzip" or "zlib".
        skip_corrupt: skip corrupt records instead of failing the task.
        num_partitions: Spark partitions (default: one per file, at most the default
            parallelism × 4).

    A record whose features do not fit the schema fails its task with the file, the record's
    byte offset and the feature named.
    """
    side = spark_side(spark)
    default_fs, http = side.hadoop_fs_conf()
    resolve = _fs.options_from(default_fs, http)
    uris = _fs.expand(path, resolve)
    arrow = _arrow_schema(schema)
    if arrow is None:
        features = infer_features(uris[0], resolve, compression)
        arrow = _schema.schema_of(features, binary_features)
    else:
        features = _schema.features_from_arrow_schema(arrow)
    specs = [_features.Spec(f.name, f.kind, f.shape) for f in features]
    core = _features.core_schema(specs)
    n = num_partitions or max(1, min(len(uris), side.default_parallelism() * 4))
    from pyspark.sql.pandas.types import from_arrow_schema

    def read_files(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        opts = _fs.options_from(default_fs, http)
        for b in batches:
            for uri in (uris[i] for i in b.column("id").to_pylist()):
                ds = _ember.ExampleDataset.open([uri], opts, core, _READ_BATCH, False, 1, 0, 1,
                                                compression, skip_corrupt)
                try:
                    while (cols := ds.next()) is not None:
                        yield columns_to_arrow(cols, features, arrow)
                finally:
                    ds.close()

    # File i is read by the task holding id i: spark.range spreads them over n partitions with
    # no shuffle (the closure carries the URIs).
    files = spark.range(0, len(uris), 1, n)
    return files.mapInArrow(read_files, from_arrow_schema(arrow))
