"""Arrow / Spark types <-> tf.Example features (the type mapping of save_as_tfrecords and
load_tfrecords, in one place).

A feature is one of tf.Example's three lists: ``bytes``, ``float`` (float32) or ``int64``.  Its
shape here says how a column holds it: ``()`` a scalar (exactly one value per row), ``None`` a
list of any length (an Arrow list column).

=====================================================  ============  =========================
Arrow / Spark type                                     feature       read back as
=====================================================  ============  =========================
bool, int8..int64, uint8..uint32 (Boolean, Byte,       int64         int64 (LongType)
Short, Integer, Long)
float16/32/64 (Float, Double)                          float         float32 (FloatType)
string (StringType)                                    bytes, UTF-8  string (StringType)
binary, fixed_size_binary (BinaryType)                 bytes         binary if named in
                                                                     ``binary_features``, else
                                                                     string (as TFoS)
list / large_list / fixed_size_list of the above       same, a list  array of the same
(ArrayType)
=====================================================  ============  =========================

A null row omits the feature from its Example; an empty list writes an empty list (read back
as an empty array, not null).  Double is written as float32 (tf.Example has no float64),
as TFoS and TensorFlow do.  Other types (dates, timestamps, decimals, maps, structs, nested
lists) are refused with the column's name: cast them first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

import pyarrow as pa

BYTES, FLOAT, INT64 = "bytes", "float", "int64"
KINDS = (BYTES, FLOAT, INT64)


@dataclass(frozen=True)
class Feature:
    """One tf.Example feature as a column: ``kind`` in KINDS; ``shape`` () scalar or None list;
    ``string``: bytes that are UTF-8 text (read back as string, not binary)."""
    name: str
    kind: str
    shape: Optional[Tuple[int, ...]] = ()
    string: bool = False

    @property
    def is_list(self) -> bool:
        return self.shape is None


def _kind_of(t: pa.DataType, column: str) -> Tuple[str, bool]:
    if pa.types.is_boolean(t) or pa.types.is_integer(t):
        if pa.types.is_uint64(t):
            raise TypeError(f"column {column!r}: uint64 does not fit tf.Example's int64; cast it to int64")
        return INT64, False
    if pa.types.is_floating(t):
        return FLOAT, False
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return BYTES, True
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return BYTES, False
    raise TypeError(f"column {column!r}: type {t} has no tf.Example feature; cast it to a number, "
                    f"string, binary or an array of those")


def feature_of(field: pa.Field) -> Feature:
    """The feature a column of Arrow type ``field.type`` is written as; TypeError naming it if none."""
    t = field.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        inner = t.value_type
        if pa.types.is_list(inner) or pa.types.is_large_list(inner) or pa.types.is_fixed_size_list(inner):
            raise TypeError(f"column {field.name!r}: nested arrays ({t}) have no tf.Example feature; "
                            f"flatten them first")
        kind, string = _kind_of(inner, field.name)
        return Feature(field.name, kind, None, string)
    kind, string = _kind_of(t, field.name)
    return Feature(field.name, kind, (), string)


def features_of(schema: pa.Schema, columns: Optional[Sequence[str]] = None) -> List[Feature]:
    """The features of ``schema``'s columns (all, or ``columns`` in that order)."""
    names = list(columns) if columns is not None else schema.names
    missing = [c for c in names if c not in schema.names]
    if missing:
        raise KeyError(f"no column {missing[0]!r}; the columns are {schema.names}")
    return [feature_of(schema.field(c)) for c in names]


def arrow_type(f: Feature, binary: bool) -> pa.DataType:
    """The Arrow type a feature is read back as (``binary``: bytes stay binary)."""
    if f.kind == INT64:
        value = pa.int64()
    elif f.kind == FLOAT:
        value = pa.float32()
    else:
        value = pa.binary() if binary or not f.string else pa.string()
    return value if f.shape == () else pa.list_(value)


def schema_of(features: Iterable[Feature], binary_features: Sequence[str] = ()) -> pa.Schema:
    """The Arrow schema load_tfrecords gives ``features`` (nullable: a record may lack one)."""
    binary = set(binary_features)
    return pa.schema([pa.field(f.name, arrow_type(f, f.name in binary)) for f in features])


def features_from_arrow_schema(schema: pa.Schema) -> List[Feature]:
    """Features to read for an explicit schema (load_tfrecords(schema=...)): each column's
    feature as save_as_tfrecords would write it."""
    return [feature_of(schema.field(i)) for i in range(len(schema))]
