"""Ember's data layer: TFRecord files and tf.Example, read and written by the C++ core.

* :func:`tfrecord_dataset` — for nodes (InputMode.TENSORFLOW): a node's shard of TFRecord files,
  local or on HDFS (WebHDFS: no libhdfs, no CLASSPATH), as numpy batches, a ``tf.data.Dataset``
  or a PyTorch ``IterableDataset``.
* :func:`parquet_dataset` / :func:`parquet_batches` — a node's shard of a Parquet dataset (Arrow's
  own reader decodes; row groups assigned to nodes, balanced by rows), local or on HDFS, in the
  same forms.
* :func:`delta_dataset` / :func:`delta_batches` — a Delta Lake table's snapshot (at a version),
  its log read through the same FileSystem layer, its Parquet files read as above.
* :func:`save_as_tfrecords` / :func:`load_tfrecords` — DataFrame <-> TFRecord files of
  tf.Example, distributed over Spark tasks, Arrow in and out (TFoS's ``dfutil`` without the
  tensorflow-hadoop jar).

The type mapping is in :mod:`ember.data._schema`.
"""

from ember.data._features import RawBytes  # noqa: E402
from ember.data.dataframe import load_tfrecords, save_as_tfrecords  # noqa: E402
from ember.data.delta import DeltaSnapshot, delta_batches, delta_dataset, delta_snapshot  # noqa: E402
from ember.data.parquet import ParquetBatches, parquet_batches, parquet_dataset  # noqa: E402
from ember.data.tfrecord import TFRecordBatches, tfrecord_batches, tfrecord_dataset  # noqa: E402

__all__ = ["DeltaSnapshot", "ParquetBatches", "RawBytes", "TFRecordBatches", "delta_batches", "delta_dataset",
           "delta_snapshot", "load_tfrecords", "parquet_batches", "parquet_dataset", "save_as_tfrecords",
           "tfrecord_batches", "tfrecord_dataset"]
