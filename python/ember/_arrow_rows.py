"""Rows and columns <-> Arrow record batches, for the data feed.

Bulk data crosses process and host boundaries only as Arrow IPC, never as
pickle.  RDD rows (tuples, lists, dicts, scalars, numpy arrays) are turned into
columns here; the shape of the original rows is kept in the schema metadata so
a node's ``next_batch`` can hand back rows of the same form, as TFoS did.
Column access (``batch_to_columns``) is zero-copy wherever Arrow's layout
allows it: numbers, fixed-size lists, equal-length lists and binaries.
"""
from __future__ import annotations

import functools
import json
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import pyarrow as pa

FORM_KEY = b"ember.form"      # "tuple", "list", "dict", "scalar" or "columns" (a DataFrame)
SHAPES_KEY = b"ember.shapes"  # JSON {column: [dims]} for columns that held numpy arrays
# JSON [column, ...]: array<float> columns the driver fed packed by Ember's Spark extension
# (ember_pack_floats: one little-endian float32 binary per row); handed out as float32 again.
PACKED_KEY = b"ember.packed"


def mark_packed(batch: pa.RecordBatch, meta: Optional[Dict[bytes, bytes]]) -> pa.RecordBatch:
    """`batch` with `meta` (:func:`packed_meta`) added to its schema metadata (no data copied)."""
    if not meta:
        return batch
    return batch.replace_schema_metadata({**(batch.schema.metadata or {}), **meta})


def packed_meta(columns: Sequence[str]) -> Optional[Dict[bytes, bytes]]:
    """The schema metadata that says `columns` are packed (None for none)."""
    return {PACKED_KEY: json.dumps(list(columns)).encode()} if columns else None


def _packed(schema: pa.Schema) -> List[str]:
    meta = schema.metadata or {}
    return _parse_shapes(meta[PACKED_KEY]) if PACKED_KEY in meta else []


def unpack_floats(col: pa.Array, shape: Optional[List[int]]) -> np.ndarray:
    """A packed column (binary rows of little-endian float32) as a float32 (rows, width) matrix
    viewed in place when every row has one width; else an object array of float32 rows."""
    n = len(col)
    if n and col.null_count == 0:
        off_type = np.int64 if pa.types.is_large_binary(col.type) else np.int32
        offsets = np.frombuffer(col.buffers()[1], dtype=off_type)[col.offset:col.offset + n + 1]
        widths = np.diff(offsets)
        if (widths == widths[0]).all() and widths[0] % 4 == 0 and offsets[0] % 4 == 0:
            data = np.frombuffer(col.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]].view("<f4")
            return data.reshape([n] + (list(shape) if shape else [int(widths[0]) // 4]))
    return np.array([None if v is None else np.frombuffer(v, "<f4") for v in col.to_pylist()], dtype=object)


def column_values(batch: pa.RecordBatch, i: int) -> List[Any]:
    """Column `i` of `batch` as Python values (a packed column's rows as lists of floats, as
    its array<float> would give)."""
    col = batch.column(i)
    if batch.schema.names[i] in _packed(batch.schema):
        return [None if v is None else np.frombuffer(v, "<f4").tolist() for v in col.to_pylist()]
    return col.to_pylist()


def _column_from_values(values: Sequence[Any], name: str):
    """Returns (pyarrow array, element shape or None) for one column of row values."""
    first = values[0]
    if isinstance(first, np.ndarray):
        try:
            stacked = np.stack(values)
        except ValueError as e:
            raise ValueError(f"column {name}: numpy arrays of different shapes in one partition ({e})") from e
        shape = list(stacked.shape[1:])
        if not shape:
            return pa.array(stacked), None
        flat = np.ascontiguousarray(stacked).reshape(len(values), -1)
        return pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), flat.shape[1]), shape
    if isinstance(first, np.generic):
        return pa.array(np.asarray(values)), None
    try:
        return pa.array(list(values)), None
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ValueError(f"column {name}: values cannot be stored as one Arrow column "
                         f"(first value {first!r}): {e}") from e


def rows_to_batch(rows: Sequence[Any]) -> pa.RecordBatch:
    """Converts a non-empty list of RDD rows into one record batch.

    Rows must all have the form of the first one: a tuple or list (columns
    ``_0``, ``_1``, ...), a dict (one column per key) or a single value.

    Raises:
        ValueError: rows of different widths/keys, or values Arrow cannot hold;
            the message names the column.
    """
    if not rows:
        raise ValueError("rows_to_batch needs at least one row")
    first = rows[0]
    if isinstance(first, dict):
        form, names = "dict", list(first.keys())
        try:
            cols = [[r[k] for r in rows] for k in names]
        except (KeyError, TypeError) as e:
            raise ValueError(f"dict rows must all have the keys {names}: {e!r}") from e
    elif isinstance(first, (tuple, list)):
        form = "tuple" if isinstance(first, tuple) else "list"
        width = len(first)
        names = [f"_{i}" for i in range(width)]
        for i, r in enumerate(rows):
            if len(r) != width:
                raise ValueError(f"row {i} has {len(r)} fields, row 0 has {width}")
        cols = [[r[j] for r in rows] for j in range(width)]
    else:
        form, names, cols = "scalar", ["_0"], [list(rows)]
    arrays, shapes = [], {}
    for name, values in zip(names, cols):
        arr, shape = _column_from_values(values, name)
        arrays.append(arr)
        if shape is not None:
            shapes[name] = shape
    meta = {FORM_KEY: form.encode(), SHAPES_KEY: json.dumps(shapes).encode()}
    return pa.RecordBatch.from_arrays(arrays, names=names).replace_schema_metadata(meta)


def results_to_batch(results: Any, num_rows: Optional[int] = None) -> pa.RecordBatch:
    """Converts what a node passes to ``batch_results`` into a record batch.

    Accepts a numpy array (1-D: one column; N-D: one fixed-size-list column),
    a dict of columns, a pyarrow RecordBatch/Table, or a list of rows (see
    rows_to_batch).  An empty list gives an empty batch.
    """
    if isinstance(results, pa.RecordBatch):
        return results
    if isinstance(results, pa.Table):
        return results.combine_chunks().to_batches()[0] if results.num_rows else \
            pa.RecordBatch.from_pylist([], schema=results.schema)
    if isinstance(results, dict):
        arrays, names, shapes = [], [], {}
        for name, col in results.items():
            col = np.asarray(col) if not isinstance(col, (pa.Array, pa.ChunkedArray)) else col
            if isinstance(col, np.ndarray) and col.ndim > 1:
                arr, shape = _column_from_values(list(col), name)
                shapes[name] = shape
            else:
                arr = pa.array(col)
            arrays.append(arr)
            names.append(str(name))
        meta = {FORM_KEY: b"dict", SHAPES_KEY: json.dumps(shapes).encode()}
        return pa.RecordBatch.from_arrays(arrays, names=names).replace_schema_metadata(meta)
    if isinstance(results, np.ndarray):
        if results.ndim == 0:
            raise ValueError("batch_results got a 0-d array; pass one result per input row")
        if len(results) == 0:
            return pa.RecordBatch.from_arrays([pa.array([], pa.float64())], names=["_0"])
        if results.ndim == 1:
            meta = {FORM_KEY: b"scalar", SHAPES_KEY: b"{}"}
            return pa.RecordBatch.from_arrays([pa.array(results)], names=["_0"]).replace_schema_metadata(meta)
        return rows_to_batch(list(results))
    results = list(results)
    if not results:
        return pa.RecordBatch.from_arrays([pa.array([], pa.float64())], names=["_0"])
    return rows_to_batch(results)


def _shapes(schema: pa.Schema) -> Dict[str, List[int]]:
    meta = schema.metadata or {}
    return _parse_shapes(meta.get(SHAPES_KEY, b"{}"))


@functools.lru_cache(maxsize=64)
def _parse_shapes(text: bytes) -> Any:
    """SHAPES_KEY's (or PACKED_KEY's) JSON, parsed once per distinct metadata: every fed batch
    of a job carries the same.  Callers must not modify the result (it is shared)."""
    return json.loads(text)


def column_to_numpy(col: pa.Array, shape: Optional[List[int]] = None) -> np.ndarray:
    """One Arrow column as a numpy array, zero-copy where the layout allows.

    Fixed-size lists, and lists or binaries whose rows all have one length,
    become 2-D (or `shape`-d) arrays; other types fall back to object arrays.
    """
    n = len(col)
    t = col.type
    if pa.types.is_fixed_size_list(t):
        values = col.flatten().to_numpy(zero_copy_only=False)
        dims = shape if shape is not None else [t.list_size]
        return values.reshape([n] + list(dims))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        lengths = col.value_lengths().to_numpy(zero_copy_only=False) if n else np.zeros(0, np.int64)
        if n and col.null_count == 0 and (lengths == lengths[0]).all():
            values = col.flatten().to_numpy(zero_copy_only=False)
            return values.reshape([n] + (list(shape) if shape else [int(lengths[0])]))
        return np.array(col.to_pylist(), dtype=object)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        if n and col.null_count == 0:
            if pa.types.is_fixed_size_binary(t):
                data = np.frombuffer(col.buffers()[1], dtype=np.uint8)
                width = t.byte_width
                return data[col.offset * width:(col.offset + n) * width].reshape(n, width)
            off_type = np.int64 if pa.types.is_large_binary(t) else np.int32
            offsets = np.frombuffer(col.buffers()[1], dtype=off_type)[col.offset:col.offset + n + 1]
            widths = np.diff(offsets)
            if (widths == widths[0]).all():
                data = np.frombuffer(col.buffers()[2], dtype=np.uint8)
                return data[offsets[0]:offsets[-1]].reshape(n, int(widths[0]))
        return np.array(col.to_pylist(), dtype=object)
    arr = col.to_numpy(zero_copy_only=False)
    if shape:
        arr = arr.reshape([n] + list(shape))
    return arr


def batch_to_columns(batch: pa.RecordBatch) -> Dict[str, np.ndarray]:
    """A record batch as {column name: numpy array}, zero-copy where possible."""
    shapes, packed = _shapes(batch.schema), _packed(batch.schema)
    return {name: unpack_floats(batch.column(i), shapes.get(name)) if name in packed
            else column_to_numpy(batch.column(i), shapes.get(name))
            for i, name in enumerate(batch.schema.names)}


def batch_to_rows(batch: pa.RecordBatch) -> List[Any]:
    """A record batch as a list of rows in the form they were fed (TFoS ``next_batch``).

    RDD rows come back as tuples, lists, dicts or single values, with numpy
    arrays where numpy arrays went in.  DataFrame rows come back as tuples of
    column values in column order.
    """
    meta = batch.schema.metadata or {}
    form = meta.get(FORM_KEY, b"columns").decode()
    shapes = _shapes(batch.schema)
    cols = []
    for i, name in enumerate(batch.schema.names):
        col = batch.column(i)
        if name in shapes:
            cols.append(list(column_to_numpy(col, shapes[name])))
        else:
            cols.append(column_values(batch, i))
    if form == "scalar":
        return cols[0]
    if form == "dict":
        names = batch.schema.names
        return [dict(zip(names, r)) for r in zip(*cols)]
    if form == "list":
        return [list(r) for r in zip(*cols)]
    return list(zip(*cols))
