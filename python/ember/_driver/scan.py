"""Is a DataFrame a plain Parquet scan?  ``Cluster.train`` then has the nodes read its files in
place (issue 23): the feeding tasks send references to the files' rows, not the rows, so the data
never crosses Spark's JVM-to-Python hop.

Plain means: the optimized logical plan is a Parquet relation, or a projection of its columns
(``Project`` of bare attributes) over one: no filter, no computed column, no join, no sample.
Every row of every input file is then what the DataFrame holds, in file order; a partition
column (not in the files) or a column the first file lacks falls back to the rows feed.  The
plan is read as Spark prints it, from a classic session or a Connect server alike.

A Delta table prints as a Parquet relation too, yet its files alone may not be its rows (a
deletion vector hides rows; column mapping renames columns).  So files under a ``_delta_log`` are
read in place only where Ember's own reader of the log (:mod:`ember._delta_log`) reads the newest
snapshot, and only if that snapshot's files are the DataFrame's (not an older version's).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from ember import _delta_log, _ember, _hadoop, _parquet_io, errors

_ATTR = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)#\d+L?$")
_RELATION = re.compile(r"^Relation (?:\S+)?\[(.*)\] parquet$")


@dataclass
class FileScan:
    """The files of a plain Parquet scan and the columns to read: what the feeding tasks send."""
    spark: Any
    files: List[str]
    columns: List[str]
    fs_conf: Tuple[str, str]


def _attrs(text: str) -> Optional[List[str]]:
    names = []
    for item in text.split(","):
        m = _ATTR.match(item.strip())
        if m is None:
            return None
        names.append(m.group(1))
    return names


def parquet_scan(df: Any, side) -> Tuple[Optional[FileScan], str]:
    """(the scan, "") when `df` is a plain Parquet scan, else (None, why not)."""
    try:
        plan = side.optimized_plan(df)
    except Exception as e:  # noqa: BLE001 - any failure to see the plan means: feed the rows
        return None, f"its plan could not be read ({type(e).__name__}: {e})"
    lines = [line.strip() for line in plan.strip().splitlines() if line.strip()]
    columns: Optional[List[str]] = None
    if len(lines) == 2 and lines[0].startswith("Project [") and lines[0].endswith("]") \
            and lines[1].startswith("+- "):
        columns = _attrs(lines[0][len("Project ["):-1])
        if columns is None:
            return None, "it computes columns (its plan projects expressions)"
        relation = lines[1][3:]
    elif len(lines) == 1:
        relation = lines[0]
    else:
        ops = [line.lstrip("+- :").split(" ", 1)[0] for line in lines]
        other = next((op for op in ops if op not in ("Project", "Relation")), ops[0] if ops else "empty")
        return None, f"its plan is more than a scan ({other})"
    m = _RELATION.match(relation)
    if m is None:
        return None, f"it is not a Parquet scan ({relation.split('[', 1)[0].strip()[:60]})"
    stored = _attrs(m.group(1))
    if stored is None:
        return None, "its column names need quoting"
    columns = columns if columns is not None else stored
    files = sorted(str(f) for f in df.inputFiles())
    if not files:
        return None, "it has no input files"
    fs_conf = side.hadoop_fs_conf()
    resolve = _hadoop.resolve_options(*fs_conf)
    table = _delta_table(files, resolve)
    if table is not None:
        try:
            snap = _delta_log.snapshot(table, None, resolve)
        except errors.EmberError as e:
            return None, f"it is a Delta table whose files are not its rows as they lie: {e}"
        if {_plain(f) for f in snap.files} != {_plain(f) for f in files}:
            return None, (f"it reads a version of Delta table {table} other than its newest ({snap.version}): "
                          "time travel, or the table changed since the DataFrame was made")
    try:
        first = _parquet_io.parquet_file(files[0], resolve)
    except Exception as e:  # noqa: BLE001 - a file the driver cannot open: let Spark read it
        return None, f"its first file could not be opened here ({type(e).__name__}: {e})"
    missing = [c for c in columns if c not in first.schema_arrow.names]
    if missing:
        return None, f"its column {missing[0]!r} is not in the files (a partition column)"
    return FileScan(spark=df.sparkSession, files=files, columns=columns, fs_conf=fs_conf), ""


def _plain(uri: str) -> str:
    return _parquet_io.local_path(uri) or uri


def _delta_table(files: List[str], resolve) -> Optional[str]:
    """The Delta table whose data `files` are (a ``_delta_log`` in their common directory, past
    its ``key=value`` partition directories), else None."""
    dirs = [f.rsplit("/", 1)[0].split("/") for f in files]
    common = dirs[0]
    for d in dirs[1:]:
        n = 0
        while n < min(len(common), len(d)) and common[n] == d[n]:
            n += 1
        common = common[:n]
    while common and "=" in common[-1]:
        common = common[:-1]
    if not common:
        return None
    root = "/".join(common)
    try:
        return root if _ember.fs_glob(root + "/_delta_log/0*.json", resolve) else None
    except errors.NotFound:
        return None
