"""TFoS's ``dfutil``: Spark DataFrames <-> TFRecord files of tf.Example.

Thin over :func:`ember.data.save_as_tfrecords` / :func:`ember.data.load_tfrecords`, which
encode and decode in the C++ core from Arrow batches (no tensorflow-hadoop jar, no
TensorFlow in the Spark tasks, no Python object per value).  What a TFoS program sees is
TFoS's: ``part-r-NNNNN`` files, a DataFrame whose columns are the features in sorted order,
``int64`` as LongType, ``float`` as DoubleType, bytes as StringType unless named in
``binary_features``, lists of more than one value as arrays.
"""
from __future__ import annotations

import weakref
from typing import Any, Sequence

#: DataFrames made by :func:`loadTFRecords` -> the directory they were read from (TFoS's
#: ``loadedDF``; held weakly, so a DataFrame no longer used is not kept alive by it).
loadedDF: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def isLoadedDF(df: Any) -> bool:
    """True if `df` was made by :func:`loadTFRecords` (TFoS's pipeline then reads its TFRecord
    files directly instead of converting the DataFrame again)."""
    try:
        return df in loadedDF
    except TypeError:  # not weak-referenceable: not one of ours
        return False


def saveAsTFRecords(df: Any, output_dir: str) -> None:
    """Writes `df` as TFRecord files of tf.Example under `output_dir`, one ``part-r-NNNNN`` per
    partition plus ``_SUCCESS`` (TFoS ``dfutil.saveAsTFRecords``).

    Types as TFoS: booleans and integers -> int64, float/double -> float (float32), string and
    binary -> bytes, arrays of those -> lists.  A column of another type fails with its name
    before any task runs (TFoS failed inside a task).  As with TFoS (Hadoop's output format),
    an existing non-empty `output_dir` is an error.

    Args:
        df: the DataFrame.
        output_dir: a local path, ``file://``, ``hdfs://`` (WebHDFS through the session's
            ``fs.defaultFS``) or a path on ``fs.defaultFS``.
    """
    from ember.data import save_as_tfrecords

    save_as_tfrecords(df, output_dir)


def loadTFRecords(sc: Any, input_dir: str, binary_features: Sequence[str] = ()) -> Any:
    """A DataFrame of the tf.Examples under `input_dir` (TFoS ``dfutil.loadTFRecords``).

    The schema is inferred from the first records (TFoS: the first record only): one column
    per feature, sorted by name; int64 -> LongType, float -> DoubleType, bytes -> StringType
    (BinaryType if named in `binary_features`); a feature holding more than one value -> an
    array.  The DataFrame is remembered (:func:`isLoadedDF`, ``loadedDF[df]`` is `input_dir`).

    Args:
        sc: a SparkContext (or SparkSession).
        input_dir: the directory (or glob, or file) of TFRecord files; files whose names
            start with ``_`` or ``.`` (``_SUCCESS``) are skipped, as by Hadoop.
        binary_features: features to read as binary rather than UTF-8 strings.
    """
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, DoubleType, FloatType

    from ember.data import load_tfrecords

    spark = sc if isinstance(sc, SparkSession) else SparkSession(sc)
    raw = load_tfrecords(spark, input_dir, binary_features=list(binary_features))
    columns = []
    for field in sorted(raw.schema.fields, key=lambda f: f.name):
        col = F.col(f"`{field.name}`")
        if isinstance(field.dataType, FloatType):
            col = col.cast(DoubleType())
        elif isinstance(field.dataType, ArrayType) and isinstance(field.dataType.elementType, FloatType):
            col = col.cast(ArrayType(DoubleType()))
        columns.append(col.alias(field.name))
    df = raw.select(*columns)
    loadedDF[df] = input_dir
    return df
