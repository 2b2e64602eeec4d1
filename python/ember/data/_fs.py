"""Where ember.data's paths live: the core's FileSystem layer (include/ember/fs.h) configured
from the edge, a node's context or the driver's Spark Hadoop configuration."""
from __future__ import annotations

from typing import List, Sequence, Tuple, Union

from ember import _ember, _hadoop

_INFER_SAMPLE = 100  # records read to infer a schema


def current_context():
    from ember import context
    return context.current()


def resolve_options(ctx=None, spark_context=None):
    """The core's ResolveOptions: from a node's context, else the given or active SparkContext's
    Hadoop configuration (fs.defaultFS, dfs.namenode.http-address), else local files only."""
    if ctx is not None:
        return _hadoop.resolve_options(ctx.default_fs, getattr(ctx, "hdfs_http_address", ""))
    if spark_context is not None:
        return _hadoop.resolve_options(*_hadoop.spark_fs_conf(spark_context))
    return _hadoop.resolve_options(*_hadoop.active_spark_fs_conf())


# ResolveOptions from values carried to Spark tasks (made on the driver).
options_from = _hadoop.resolve_options


def expand(paths: Union[str, Sequence[str]], resolve) -> List[str]:
    """URIs of the files ``paths`` name (files, directories, globs), in order, de-duplicated,
    each with its pattern's scheme (the core's GlobUris: ``file:///d/*`` gives ``file:///d/...``,
    read locally whatever fs.defaultFS says); NotFound naming a path that matches nothing."""
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
