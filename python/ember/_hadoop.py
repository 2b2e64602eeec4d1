"""What Ember reads from Spark's Hadoop configuration (the edge; the core takes option structs).

``fs.defaultFS`` says where a path with no scheme lives; for ``hdfs://`` the core speaks WebHDFS
to the NameNode's HTTP address, ``dfs.namenode.http-address`` (Hadoop 3's default port 9870),
so nodes and Spark tasks need no libhdfs, no JVM and no CLASSPATH.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple
from urllib.parse import urlsplit

_DEFAULT_HTTP_PORT = 9870  # Hadoop 3's dfs.namenode.http-address port


def namenode_http_address(default_fs: str, get: Callable[[str], Optional[str]]) -> str:
    """The WebHDFS ``host:port`` that ``dfs.namenode.http-address`` gives for ``default_fs`` when
    it is ``hdfs://``, else "" (the core then takes the NameNode's host with port 9870: one rule,
    in ``ResolveFileSystem``).

    ``get`` reads a Hadoop configuration key (None if unset).  A wildcard bind address
    (``0.0.0.0:9870``, Hadoop's default) means the NameNode's own host.
    """
    parts = urlsplit(default_fs or "")
    if parts.scheme.lower() != "hdfs" or not parts.hostname:
        return ""
    configured = (get(f"dfs.namenode.http-address.{parts.netloc}") or get("dfs.namenode.http-address") or "")
    if not configured.strip():
        return ""
    host, port = parts.hostname, _DEFAULT_HTTP_PORT
    h, _, p = configured.strip().rpartition(":")
    if p.isdigit():
        port = int(p)
    if h and h not in ("0.0.0.0", "::", "[::]"):
        host = h
    return f"{host}:{port}"


def spark_fs_conf(sc) -> Tuple[str, str]:
    """(fs.defaultFS, the NameNode's WebHDFS address or "") of SparkContext ``sc``."""
    conf = sc._jsc.hadoopConfiguration()
    default_fs = conf.get("fs.defaultFS") or "file:///"
    return default_fs, namenode_http_address(default_fs, conf.get)


def active_spark_fs_conf() -> Tuple[str, str]:
    """spark_fs_conf of the active SparkContext; ("", "") without one (in a node, a Spark
    task, or a program without Spark)."""
    try:
        from pyspark import SparkContext
        sc = SparkContext._active_spark_context
    except ImportError:
        sc = None
    return spark_fs_conf(sc) if sc is not None else ("", "")


def resolve_options(default_fs: str, http_address: str):
    """The core's ResolveOptions (include/ember/fs.h) for ``default_fs`` (fs.defaultFS; "" for
    local) and its NameNode's WebHDFS ``host:port`` ("" for the core's default, port 9870),
    filed under default_fs's authority by the core's rule (``JobResolveOptions``)."""
    from ember import _ember
    return _ember.fs_job_resolve_options(default_fs or "", http_address or "")
