"""A Delta Lake table's transaction log, read through Ember's FileSystem layer (issue 23): the
snapshot at a version, its data files and their partition values, or a refusal naming why.

Below the layers that use it: ``ember.data.delta`` (a node's batches of a table) and the driver's
check of whether ``cluster.train``'s DataFrame is a plain scan (a Delta table's files are read in
place only where its snapshot can be).

The newest checkpoint at or below the version (Parquet, one file or several parts), then each
later commit (JSON lines of ``add``/``remove``/``metaData``/``protocol`` actions), gives the
snapshot; files are keyed by (path, deletion vector), as the protocol reconciles them.

Read as Delta's protocol says, or refused with the reason: reader versions 1-3; of the reader
features, ``deletionVectors`` (only while no live file carries one: rows deleted through a deletion
vector would otherwise come back), ``columnMapping`` in mode ``none``, ``timestampNtz``,
``vacuumProtocolCheck`` and ``v2Checkpoint`` (through classic checkpoints or the commits).  The
rest (column mapping by name or id, type widening, variant) is refused naming the feature.
"""
from __future__ import annotations

import json
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ember import _ember, errors
from ember._parquet_io import local_path as _local_path
from ember._parquet_io import open_file as _open

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_CHECKPOINT_PART = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")

# Reader features a snapshot can be read with, each under the condition the module's text gives.
_FEATURES = {"deletionVectors", "columnMapping", "timestampNtz", "vacuumProtocolCheck", "v2Checkpoint"}

# Partition values are strings in the log; their columns' Delta types type them.
_PARTITION_KINDS: Dict[str, Callable[[str], Any]] = {
    "byte": int, "short": int, "integer": int, "long": int, "float": float, "double": float,
    "boolean": lambda v: v.lower() == "true", "string": str,
}


@dataclass
class DeltaSnapshot:
    """A Delta table at one version: its data files (URIs) and each file's partition values."""
    table: str
    version: int
    files: List[str]
    partition_values: List[Dict[str, Optional[str]]]
    partition_columns: List[str]
    schema: Dict[str, Any]            # the table's schema, as the log's schemaString holds it
    protocol: Dict[str, Any] = field(default_factory=dict)

    def partition_types(self) -> Dict[str, Callable[[str], Any]]:
        types = {f["name"]: f["type"] for f in self.schema.get("fields", [])}
        return {c: _PARTITION_KINDS.get(types.get(c), str) for c in self.partition_columns}


def _file_id(action: Dict[str, Any]) -> Tuple[str, str]:
    """An add's or remove's logical file: its path and its deletion vector's unique id, if any."""
    dv = action.get("deletionVector")
    if not dv:
        return action["path"], ""
    dv_id = f"{dv.get('storageType', '')}{dv.get('pathOrInlineDv', '')}"
    if dv.get("offset") is not None:
        dv_id += f"@{dv['offset']}"
    return action["path"], dv_id


def _read_whole(uri: str, resolve) -> bytes:
    local = _local_path(uri)
    if local is not None:
        with open(local, "rb") as f:
            return f.read()
    f = _ember.fs_open_random_access(uri, resolve)
    return f.read_at(0, f.size)


_MAPS = {"partitionValues", "configuration", "options", "tags"}  # the actions' map fields


def _maps_as_dicts(value: Dict[str, Any]) -> Dict[str, Any]:
    """A checkpoint's action as the commits' JSON has it: Arrow gives a map as (key, value) pairs."""
    for key, v in value.items():
        if key in _MAPS and isinstance(v, list):
            value[key] = dict(v)
        elif isinstance(v, dict):
            _maps_as_dicts(v)
    return value


def _checkpoint_actions(uris: List[str], resolve) -> List[Dict[str, Any]]:
    """The add/remove/metaData/protocol actions of a checkpoint's parts, as the commits' JSON has
    them; of add and remove only the fields a snapshot needs are read (not their stats)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out: List[Dict[str, Any]] = []
    for uri in uris:
        try:
            pf = pq.ParquetFile(_open(uri, resolve))
            schema = pf.schema_arrow
            wanted = []
            for action, fields in (("add", ("path", "partitionValues", "deletionVector")),
                                   ("remove", ("path", "deletionVector"))):
                if action in schema.names:
                    have = {f.name for f in schema.field(action).type}
                    wanted += [f"{action}.{f}" for f in fields if f in have]
            wanted += [n for n in ("metaData", "protocol") if n in schema.names]
            table = pf.read(columns=wanted)
        except errors.EmberError:
            raise
        except (pa.ArrowException, OSError) as e:
            raise errors.Corruption(f"{uri}: not a readable Delta checkpoint: {e}") from e
        for name in ("metaData", "protocol"):
            if name in table.column_names:
                out += [{name: _maps_as_dicts(v)} for v in table.column(name).to_pylist() if v is not None]
        for name in ("add", "remove"):
            if name not in table.column_names:
                continue
            col = table.column(name).combine_chunks()
            col = col.filter(col.is_valid())
            fields = {f.name: col.field(f.name).to_pylist() for f in col.type}
            dvs = fields.get("deletionVector") or [None] * len(fields["path"])
            for i, path in enumerate(fields["path"]):
                action = {"path": path, "deletionVector": dvs[i]}
                if name == "add":
                    action["partitionValues"] = dict(fields["partitionValues"][i] or [])
                out.append({name: action})
    return out


def _commit_actions(uri: str, resolve) -> List[Dict[str, Any]]:
    out = []
    for n, line in enumerate(_read_whole(uri, resolve).decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError as e:
            raise errors.Corruption(f"{uri}, line {n}: not a JSON action ({e})") from e
        if not isinstance(action, dict):
            raise errors.Corruption(f"{uri}, line {n}: not a JSON object")
        out.append(action)
    return out


def _check_protocol(table: str, version: int, protocol: Dict[str, Any], meta: Dict[str, Any]) -> None:
    reader = int(protocol.get("minReaderVersion", 1))
    if reader > 3:
        raise errors.InvalidArgument(f"Delta table {table} (version {version}) needs reader version {reader}; "
                                   "ember.data reads versions 1 to 3")
    features = set(protocol.get("readerFeatures") or []) if reader == 3 else set()
    unknown = sorted(features - _FEATURES)
    if unknown:
        raise errors.InvalidArgument(f"Delta table {table} (version {version}) uses reader feature(s) {unknown}, "
                                   f"which ember.data does not read (it reads {sorted(_FEATURES)})")
    mode = (meta.get("configuration") or {}).get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise errors.InvalidArgument(f"Delta table {table} (version {version}) maps columns by {mode!r} "
                                   "(delta.columnMapping.mode); ember.data reads tables whose Parquet "
                                   "columns carry the table's names (mode 'none')")


def _listed(pattern: str, resolve) -> List[str]:
    try:
        return _ember.fs_glob(pattern, resolve)
    except errors.NotFound:
        return []


def _log_files(table: str, resolve) -> Tuple[str, List[str]]:
    """(the table's URI as the core resolves it, the URIs of its ``_delta_log`` files): one listing."""
    root = str(table).rstrip("/")
    logs = _listed(root + "/_delta_log/0*", resolve)  # commits and checkpoints: 20-digit versions
    if not any(u.endswith(".json") for u in logs):
        raise errors.NotFound(f"{table}: not a Delta table (no commit in {root}/_delta_log)")
    return logs[0][:logs[0].rindex("/_delta_log/")], logs


def snapshot(table: str, version: Optional[int], resolve) -> DeltaSnapshot:
    """The files of Delta table ``table`` (a local path, ``file://``, ``hdfs://`` or ``webhdfs://``)
    at ``version`` (None: the newest), with each file's partition values; ``resolve``: the core's
    ResolveOptions."""
    root, listing = _log_files(table, resolve)
    log = root + "/_delta_log/"
    commits: Dict[int, str] = {}
    checkpoints: Dict[int, Dict[Tuple[int, int], str]] = {}
    for uri in listing:
        name = uri[len(log):] if uri.startswith(log) else uri.rsplit("/", 1)[-1]
        m = _COMMIT.match(name)
        if m:
            commits[int(m.group(1))] = uri
            continue
        m = _CHECKPOINT.match(name)
        if m:
            checkpoints.setdefault(int(m.group(1)), {})[(1, 1)] = uri
            continue
        m = _CHECKPOINT_PART.match(name)
        if m:
            checkpoints.setdefault(int(m.group(1)), {})[(int(m.group(2)), int(m.group(3)))] = uri
    newest = max(list(commits) + list(checkpoints))
    if version is None:
        version = newest
    version = int(version)
    if version < 0 or version > newest:
        raise errors.NotFound(f"Delta table {table} has no version {version} (its versions end at {newest})")
    # The newest complete checkpoint at or below the version, then the commits after it.
    base, parts = -1, []
    for v in sorted((v for v in checkpoints if v <= version), reverse=True):
        got = checkpoints[v]
        if (1, 1) in got:
            base, parts = v, [got[(1, 1)]]
            break
        total = {n for _, n in got}
        if len(total) == 1:
            n = total.pop()
            if all((i, n) in got for i in range(1, n + 1)):
                base, parts = v, [got[(i, n)] for i in range(1, n + 1)]
                break
    missing = [v for v in range(base + 1, version + 1) if v not in commits]
    if missing:
        raise errors.NotFound(
            f"Delta table {table}: version {version} cannot be rebuilt, commit {missing[0]} is not in {log} "
            f"(and no checkpoint at or above it is); the log's retention may have removed it, read a newer version")
    actions = _checkpoint_actions(parts, resolve) if parts else []
    for v in range(base + 1, version + 1):
        actions += _commit_actions(commits[v], resolve)
    live: Dict[Tuple[str, str], Dict[str, Any]] = {}  # by (path, deletion vector): the protocol's file id
    protocol: Dict[str, Any] = {}
    meta: Dict[str, Any] = {}
    for action in actions:
        if "add" in action:
            add = action["add"]
            live[_file_id(add)] = add
        elif "remove" in action:
            live.pop(_file_id(action["remove"]), None)
        elif "metaData" in action:
            meta = action["metaData"]
        elif "protocol" in action:
            protocol = action["protocol"]
    if not meta:
        raise errors.Corruption(f"Delta table {table} (version {version}): no metaData action in its log")
    _check_protocol(table, version, protocol, meta)
    with_dv = [p for (p, _), a in live.items() if a.get("deletionVector")]
    if with_dv:
        raise errors.InvalidArgument(
            f"Delta table {table} (version {version}): {len(with_dv)} file(s) carry deletion vectors "
            f"(e.g. {with_dv[0]}), whose deleted rows ember.data would read back; rewrite them first "
            "(REORG TABLE ... APPLY (PURGE)) or turn delta.enableDeletionVectors off before deleting")
    try:
        schema = json.loads(meta.get("schemaString") or "{}")
    except ValueError as e:
        raise errors.Corruption(f"Delta table {table} (version {version}): its schemaString is not JSON ({e})") from e
    files, values = [], []
    for key in sorted(live):
        rel = urllib.parse.unquote(key[0])
        files.append(rel if "://" in rel else f"{root}/{rel}")
        values.append(dict(live[key].get("partitionValues") or {}))
    return DeltaSnapshot(table=str(table), version=version, files=files, partition_values=values,
                         partition_columns=list(meta.get("partitionColumns") or []), schema=schema,
                         protocol=protocol)
