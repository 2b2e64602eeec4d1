"""Where ember.data's paths live: the core's FileSystem layer (include/ember/fs.h) configured
from the edge, a node's context or the driver's Spark Hadoop configuration."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

from ember import _ember, _hadoop

_INFER_SAMPLE = 100  # records read to infer a schema


def current_context():
    from ember import context
    return context.current()


def resolve_options(ctx=None, spark_context=None):
    """The core's ResolveOptions: from a node's context, else the active SparkContext's Hadoop
    configuration (fs.defaultFS, dfs.namenode.http-address), else local files only."""
    opts = _ember.ResolveOptions()
    default_fs, http = "", ""
    if ctx is not None:
        default_fs, http = ctx.default_fs, getattr(ctx, "hdfs_http_address", "")
    else:
        sc = spark_context
        if sc is None:
            try:
                from pyspark import SparkContext
                sc = SparkContext._active_spark_context
            except ImportError:
                sc = None
        if sc is not None:
            default_fs, http = _hadoop.spark_fs_conf(sc)
    opts.default_fs = default_fs or ""
    if http:
        from urllib.parse import urlsplit
        opts.hdfs_http_addresses = {urlsplit(default_fs).netloc: http}
    return opts


def options_from(default_fs: str, http_address: str):
    """ResolveOptions from values carried to Spark tasks (made on the driver)."""
    opts = _ember.ResolveOptions()
    opts.default_fs = default_fs or ""
    if http_address:
        from urllib.parse import urlsplit
        opts.hdfs_http_addresses = {urlsplit(default_fs).netloc: http_address}
    return opts


def expand(paths: Union[str, Sequence[str]], resolve) -> List[str]:
    """URIs of the files ``paths`` name (files, directories, globs), in order, de-duplicated;
    NotFound naming a path that matches nothing."""
    items = [paths] if isinstance(paths, str) else list(paths)
    if not items:
        raise ValueError("no paths given")
    out: List[str] = []
    seen = set()
    for p in items:
        for uri in _ember.fs_glob(str(p), resolve):
            if uri not in seen:
                seen.add(uri)
                out.append(uri)
    return out


def infer(uri: str, resolve, compression: str) -> Tuple[List[Tuple[str, str, int, int, int]], int]:
    """What the first records of ``uri`` hold: ([(name, kind, min_len, max_len, present)], rows)."""
    return _ember.infer_example_schema(uri, resolve, compression, _INFER_SAMPLE)
