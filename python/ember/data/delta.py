"""A node's Delta Lake input (issue 23): a Delta table's snapshot, local or on HDFS, read in place
as :func:`ember.data.parquet_batches` reads Parquet.

    def main_fun(args, ctx):
        ds = ember.data.delta_dataset("hdfs:///warehouse/fashion", batch_size=64, shuffle=True,
                                      equal_batches=True, columns={"image": (784,), "label": None})
        model.fit(ds.map(lambda b: (b["image"], b["label"])), ...)

The table's transaction log (``_delta_log``) is read through Ember's FileSystem layer, so an
``hdfs://`` table needs no JVM, libhdfs or object-store client in the node: the newest checkpoint
at or below the version (Parquet, one file or several parts), then each later commit (JSON lines
of ``add``/``remove``/``metaData``/``protocol`` actions), gives the snapshot's data files and their
partition values.  Every node reads the same log and so plans the same files; the rows are then
shared among the nodes as for plain Parquet.

What is read and what is refused (deletion vectors, column mapping by name or id, ...) is
:mod:`ember._delta_log`'s, the one reader of the log.
"""
from __future__ import annotations

from typing import Optional, Tuple

from ember import errors
from ember._delta_log import DeltaSnapshot, snapshot
from ember.data import _fs
from ember.data.parquet import DEFAULT_SHUFFLE_BUFFER, Columns, ParquetBatches, PartitionFilter, _batches_of_files


def delta_snapshot(table: str, version: Optional[int] = None, *, ctx=None, resolve=None) -> DeltaSnapshot:
    """The files of Delta table ``table`` (a local path, ``file://``, ``hdfs://`` or ``webhdfs://``)
    at ``version`` (default: the newest), with each file's partition values."""
    resolve = resolve if resolve is not None else _fs.resolve_options(ctx if ctx is not None else _fs.current_context())
    return snapshot(table, version, resolve)


def delta_batches(table: str, columns: Columns = None, batch_size: int = 128, *, version: Optional[int] = None,
                  ctx=None, shard: Optional[Tuple[int, int]] = None, partition_filter: PartitionFilter = None,
                  shuffle: bool = False, shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER, seed: int = 0,
                  drop_remainder: bool = False, equal_batches: bool = False, prefetch: int = 4,
                  readers: int = 2, use_threads: bool = True) -> ParquetBatches:
    """This node's batches of Delta table ``table`` at ``version`` (default: the newest), as
    :func:`ember.data.parquet_batches` gives them (same arguments).  ``columns`` may name the
    table's partition columns; ``partition_filter`` sees each file's partition values (strings,
    None for a null), so files outside are never opened."""
    ctx = ctx if ctx is not None else _fs.current_context()
    resolve = _fs.resolve_options(ctx)
    if batch_size < 1:
        raise ValueError(f"batch_size {batch_size} is not positive")
    snap = snapshot(table, version, resolve)
    if not snap.files:
        raise errors.NotFound(f"Delta table {table} has no data file at version {snap.version}")
    if columns is None:  # the table's columns, its partition columns among them
        columns = [f["name"] for f in snap.schema.get("fields", [])] or None
    return _batches_of_files(
        [f"{table} (Delta version {snap.version})"], snap.files, snap.partition_values, columns, batch_size,
        resolve=resolve, ctx=ctx, shard=shard, partition_filter=partition_filter, shuffle=shuffle,
        shuffle_buffer=shuffle_buffer, seed=seed, drop_remainder=drop_remainder, equal_batches=equal_batches,
        prefetch=prefetch, readers=readers, use_threads=use_threads, partition_types=snap.partition_types(),
        listed_by=f"Delta table {table} at version {snap.version}")


def delta_dataset(table: str, columns: Columns = None, batch_size: int = 128, **kwargs):
    """:func:`delta_batches` as a ``tf.data.Dataset`` of ``{column: tensor}`` batches; same args."""
    return delta_batches(table, columns, batch_size, **kwargs).to_tf_dataset()


__all__ = ["DeltaSnapshot", "delta_batches", "delta_dataset", "delta_snapshot"]
