"""Feature specs for reading tf.Example: TensorFlow's own (``tf.io.FixedLenFeature``,
``tf.io.VarLenFeature``), Ember's :class:`RawBytes`, or ``(kind, shape)`` tuples; and the numpy
form of a decoded batch.

=============================================  ==========================  ==================
spec                                           numpy batch                 tf.data element
=============================================  ==========================  ==================
``FixedLenFeature([], tf.int64)``              int64 ``[B]``               ``tf.int64 [B]``
``FixedLenFeature([k], tf.float32)``           float32 ``[B, k]``          ``tf.float32``
``FixedLenFeature([], tf.string)``             object array of bytes       ``tf.string [B]``
``RawBytes((28, 28), "uint8")``                uint8 ``[B, 28, 28]``       ``tf.uint8``
                                               (the bytes, no copy: what
                                               ``tf.io.decode_raw`` gives)
``VarLenFeature(tf.int64)`` / ``("int64",      ``(values, row_splits)``    ``tf.RaggedTensor``
None)``
=============================================  ==========================  ==================

A record lacking a FixedLenFeature takes its ``default_value`` (or fails, naming the feature, as
``tf.io.parse_example`` does); a VarLenFeature is then an empty row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ember.data import _schema

_NUMPY = {_schema.INT64: np.int64, _schema.FLOAT: np.float32}


@dataclass(frozen=True)
class RawBytes:
    """A bytes feature holding one fixed-size raw array per record (an image's pixels): read
    straight into a numpy array of ``shape`` and ``dtype`` per row, without a copy."""
    shape: Tuple[int, ...]
    dtype: str = "uint8"


@dataclass(frozen=True)
class Spec:
    """How one feature is read: ``kind`` (bytes/float/int64); ``shape`` of a row, None for a
    variable-length list; ``raw``: bytes reinterpreted as ``raw_dtype``; ``default``."""
    name: str
    kind: str
    shape: Optional[Tuple[int, ...]]
    raw_dtype: Optional[str] = None
    default: Any = None

    @property
    def fixed_length(self) -> int:
        """Values per row the core checks: a fixed shape's size (a raw array is one bytes value);
        -1 for any number (variable lists, or a FixedLenFeature with a default: missing rows
        are filled in here)."""
        if self.shape is None:
            return -1
        if self.raw_dtype is not None:
            return 1
        return int(np.prod(self.shape, dtype=np.int64))


def _kind_of_tf_dtype(dtype: Any, name: str) -> str:
    s = getattr(dtype, "name", str(dtype))
    if s in ("int64", "int32", "int16", "int8", "uint8", "bool"):
        return _schema.INT64
    if s in ("float32", "float64", "float16", "bfloat16"):
        return _schema.FLOAT
    if s == "string":
        return _schema.BYTES
    raise TypeError(f"feature {name!r}: dtype {s} is not one of tf.Example's (int64, float32, string)")


def to_specs(features: Dict[str, Any]) -> List[Spec]:
    """Specs from ``{name: FixedLenFeature | VarLenFeature | RawBytes | (kind, shape)}``."""
    specs = []
    for name, f in features.items():
        if isinstance(f, RawBytes):
            specs.append(Spec(name, _schema.BYTES, tuple(f.shape), raw_dtype=np.dtype(f.dtype).name))
        elif isinstance(f, tuple) and len(f) == 2 and f[0] in _schema.KINDS:
            specs.append(Spec(name, f[0], None if f[1] is None else tuple(f[1])))
        elif type(f).__name__ == "FixedLenFeature":
            specs.append(Spec(name, _kind_of_tf_dtype(f.dtype, name), tuple(int(d) for d in f.shape),
                              default=f.default_value))
        elif type(f).__name__ == "VarLenFeature":
            specs.append(Spec(name, _kind_of_tf_dtype(f.dtype, name), None))
        else:
            raise TypeError(f"feature {name!r}: {f!r} is not a tf.io.FixedLenFeature, tf.io.VarLenFeature, "
                            f"ember.data.RawBytes or (kind, shape) tuple")
    return specs


def specs_from_inferred(inferred: Sequence[Tuple[str, str, int, int, int]], sample_rows: int) -> List[Spec]:
    """Specs for what a sample held: (name, kind, min_len, max_len, present_rows) per feature;
    one value in every row → a scalar, else a variable-length list."""
    specs = []
    for name, kind, lo, hi, present in inferred:
        scalar = lo == hi == 1 and present == sample_rows
        specs.append(Spec(name, kind, () if scalar else None))
    return specs


def core_schema(specs: Sequence[Spec]) -> List[Tuple[str, str, int, int]]:
    """The core's schema: (name, kind, fixed_length, value_bytes); fixed_length -1 also where a
    default fills gaps; value_bytes: a raw array's size in bytes (the core checks every record's),
    else -1."""
    return [(s.name, s.kind, -1 if s.default is not None else s.fixed_length, _raw_bytes(s)) for s in specs]


def _raw_bytes(s: Spec) -> int:
    if s.raw_dtype is None:
        return -1
    return int(np.prod(s.shape, dtype=np.int64)) * np.dtype(s.raw_dtype).itemsize


def _fill_fixed(spec: Spec, values: np.ndarray, row_splits: np.ndarray, present: np.ndarray) -> np.ndarray:
    n = len(present)
    per_row = spec.fixed_length
    lengths = np.diff(row_splits)
    missing = lengths == 0
    if not missing.any():
        if (lengths != per_row).any():
            bad = int(np.argmax(lengths != per_row))
            raise ValueError(f"feature {spec.name!r}: a record of this batch (row {bad}) holds "
                             f"{int(lengths[bad])} values, the spec's shape {spec.shape} needs {per_row}")
        return values.reshape((n, *spec.shape))
    default = np.broadcast_to(np.asarray(spec.default, dtype=values.dtype), spec.shape).reshape(-1)
    out = np.empty((n, per_row), dtype=values.dtype)
    have = ~missing
    if (lengths[have] != per_row).any():
        raise ValueError(f"feature {spec.name!r}: a record holds a number of values other than the "
                         f"{per_row} its shape {spec.shape} needs")
    out[have] = values.reshape(-1, per_row) if per_row else values.reshape(-1, 0)
    out[missing] = default
    return out.reshape((n, *spec.shape))


def to_numpy(spec: Spec, column: tuple) -> Any:
    """A decoded column (the core's tuple) in the numpy form of the table above."""
    _, kind, values, offsets, row_splits, present = column
    if spec.default is None and spec.shape is not None and not present.all():
        row = int(np.argmin(present))
        raise ValueError(f"feature {spec.name!r} is missing from a record (row {row} of this batch) "
                         f"and its FixedLenFeature has no default_value")
    if kind != _schema.BYTES:
        if spec.shape is None:
            return values, row_splits
        if spec.default is None:  # the core checked every row's count, and all are present
            return values.reshape((len(present), *spec.shape))
        return _fill_fixed(spec, values, row_splits, present)
    if spec.raw_dtype is not None:  # one value per row, its size checked by the core
        return values.view(spec.raw_dtype).reshape((len(present), *spec.shape))
    items = np.empty(len(offsets) - 1, dtype=object)
    mv = memoryview(values)
    for j in range(len(items)):
        items[j] = bytes(mv[offsets[j]:offsets[j + 1]])
    if spec.shape is None:
        return items, row_splits
    if not present.all():
        default = spec.default if spec.default is not None else b""
        out = np.empty(len(present) * max(spec.fixed_length, 1), dtype=object)
        out[:] = default
        have = np.repeat(present.astype(bool), max(spec.fixed_length, 1))
        out[have] = items
        items = out
    return items.reshape((len(present), *spec.shape))
