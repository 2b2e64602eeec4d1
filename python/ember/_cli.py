"""The ``ember`` command (a console script of the package).

    ember records count|head|verify|schema [options] <path>...
    ember pack [-o ARCHIVE] [--force] [--prefix VENV] [--compress-level N] [--python-prefix DIR]

``pack`` packs the current virtual environment for ``spark.archives`` (ember/_pack.py) and prints
the Spark settings that ship it.

``records`` runs the C++ tool shipped in the package (``ember/bin/ember``, tools/ember_cli.cc) on
local, ``hdfs://`` or ``webhdfs://`` paths.  This wrapper is the edge where configuration is read:
unless given on the command line, ``--default-fs`` and ``--namenode-http`` come from the Hadoop
configuration in ``$HADOOP_CONF_DIR`` (or ``$HADOOP_HOME/etc/hadoop``): ``fs.defaultFS`` from
core-site.xml, ``dfs.namenode.http-address`` from hdfs-site.xml, as Spark would see them.
"""
from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Dict, List, Optional

from ember import _hadoop

USAGE = """usage: ember records count|head|verify|schema [--compression=auto|none|gzip|zlib]
                     [--default-fs=URI] [--namenode-http=[AUTHORITY=]HOST:PORT] [-n N] <path>...

  count    records per file and in total (every CRC checked)
  head     the first N (default 5) records, as tf.Examples
  verify   check every CRC; counts and the first bad offset
  schema   features inferred from the first N (default 1000) records

A path is a file, a directory (its files, skipping _* and .*) or a glob, local or hdfs://.
fs.defaultFS and dfs.namenode.http-address are read from $HADOOP_CONF_DIR unless given.

       ember pack [-o ARCHIVE] [--force] [--prefix VENV] [--compress-level N] [--python-prefix DIR]

  pack     pack the current virtual environment (venv-pack) into ARCHIVE (default
           ember-env.tar.gz) and print the Spark settings that ship it to the executors
           (spark.archives=ARCHIVE#environment, PYSPARK_PYTHON=./environment/bin/python)"""


def native_tool() -> Path:
    """The C++ tool installed beside the native module."""
    from ember import _ember
    return Path(_ember.__file__).resolve().parent / "bin" / "ember"


def hadoop_conf_dir(environ=os.environ) -> Optional[Path]:
    if environ.get("HADOOP_CONF_DIR"):
        return Path(environ["HADOOP_CONF_DIR"])
    if environ.get("HADOOP_HOME"):
        return Path(environ["HADOOP_HOME"]) / "etc" / "hadoop"
    return None


def read_hadoop_conf(conf_dir: Optional[Path]) -> Dict[str, str]:
    """``name -> value`` of core-site.xml and hdfs-site.xml in ``conf_dir`` (missing files: {})."""
    conf: Dict[str, str] = {}
    if conf_dir is None:
        return conf
    for name in ("core-site.xml", "hdfs-site.xml"):
        path = conf_dir / name
        if not path.is_file():
            continue
        try:
            root = ET.parse(path).getroot()
        except ET.ParseError as e:
            raise SystemExit(f"ember: cannot parse {path}: {e}")
        for prop in root.iter("property"):
            key, value = prop.findtext("name"), prop.findtext("value")
            if key and value is not None:
                conf[key.strip()] = value.strip()
    return conf


def records_argv(args: List[str], conf: Dict[str, str]) -> List[str]:
    """The native tool's argv for ``ember records <args>``: the user's, plus the Hadoop settings
    the user did not give."""
    given = {a.split("=", 1)[0] for a in args if a.startswith("--")}
    extra = []
    default_fs = next((a.split("=", 1)[1] for a in args if a.startswith("--default-fs=")), None)
    if default_fs is None and conf.get("fs.defaultFS"):
        default_fs = conf["fs.defaultFS"]
        extra.append(f"--default-fs={default_fs}")
    if "--namenode-http" not in given and default_fs:
        http = _hadoop.namenode_http_address(default_fs, conf.get)
        if http:
            extra.append(f"--namenode-http={http}")
    return ["records", *args[:1], *extra, *args[1:]]


def pack_main(args: List[str]) -> int:
    """``ember pack``: the archive, its size and time, then the Spark settings."""
    import argparse

    from ember._pack import DEFAULT_OUTPUT, PackError, pack

    parser = argparse.ArgumentParser(prog="ember pack", description="Pack the current virtual environment "
                                     "for spark.archives and print the Spark settings that ship it.")
    parser.add_argument("-o", "--output", default=DEFAULT_OUTPUT, help="archive to write (.tar.gz, .tgz, .tar, .zip)")
    parser.add_argument("--force", action="store_true", help="overwrite the archive if it exists")
    parser.add_argument("--prefix", help="the virtual environment to pack (default: the current one)")
    parser.add_argument("--compress-level", type=int, default=4, choices=range(10), metavar="0-9",
                        help="gzip level (default 4; lower is faster and bigger)")
    parser.add_argument("--python-prefix", help="where the base Python lives on the executors, if elsewhere")
    opts = parser.parse_args(args)
    print(f"ember pack: packing {opts.prefix or sys.prefix} into {opts.output} "
          f"(a few minutes for a multi-GB environment)...", file=sys.stderr, flush=True)
    try:
        result = pack(opts.output, prefix=opts.prefix, force=opts.force, compress_level=opts.compress_level,
                      python_prefix=opts.python_prefix)
    except PackError as e:
        print(f"ember pack: {e}", file=sys.stderr)
        return 1
    print(f"ember pack: {result.summary()}\n")
    print(result.settings())
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "pack":
        return pack_main(argv[1:])
    if argv[0] != "records":
        print(f"ember: unknown command {argv[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    tool = native_tool()
    if not os.access(tool, os.X_OK):
        print(f"ember: the native tool {tool} is missing; reinstall the ember package "
              f"(pip install -e . builds it)", file=sys.stderr)
        return 2
    full = [str(tool), *records_argv(argv[1:], read_hadoop_conf(hadoop_conf_dir()))]
    sys.stdout.flush()
    os.execv(full[0], full)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
