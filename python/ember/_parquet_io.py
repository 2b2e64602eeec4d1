"""Parquet files through Ember's FileSystem layer, below every layer that reads them: a file as
Arrow's reader wants it (a local path, or Ember's RandomAccessFile for ``hdfs://``), its footer
with errors named, and the file-rows reference InputMode.SPARK sends instead of rows when a
DataFrame is a plain Parquet scan (the node reads the rows in place: issue 23).

A reference travels as an Arrow IPC stream of no rows whose schema metadata holds
``ember.file_rows``: JSON ``{"uri", "columns", "ranges": [[row group, first row, end row], ...]}``.
The feed's core counts the rows the producer declares (the ranges'); the node's DataFeed reads
them when it decodes the message, and rows the file no longer has are an error naming it.
"""
from __future__ import annotations

import io
import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ember import _ember, errors

FILE_ROWS_KEY = b"ember.file_rows"


class _RandomAccess(io.RawIOBase):
    """A file of Ember's FileSystem layer (``_ember.RandomAccessFile``) as the seekable Python
    file Arrow's ``PythonFile`` reads: footers and column chunks at their offsets."""

    def __init__(self, f):
        super().__init__()
        self._f = f
        self._size = int(f.size)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self._f.uri}: seek to {base + offset}")
        self._pos = base + offset
        return self._pos

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = max(0, self._size - self._pos)
        data = self._f.read_at(self._pos, n) if n else b""
        self._pos += len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def local_path(uri: str) -> Optional[str]:
    """The local path of ``uri`` (``/x``, ``file:///x``, or Hadoop's ``file:/x``), else None."""
    if uri.startswith("file://"):
        return uri[len("file://"):]
    if uri.startswith("file:/"):
        return uri[len("file:"):]
    return uri if uri.startswith("/") else None


def open_file(uri: str, resolve):
    """What ``pyarrow.parquet.ParquetFile`` reads ``uri`` from: a local path as it is (Arrow's
    own local file), any other URI through Ember's FileSystem layer."""
    import pyarrow as pa

    local = local_path(uri)
    if local is not None:
        return local
    return pa.PythonFile(_RandomAccess(_ember.fs_open_random_access(uri, resolve)), mode="r")


def parquet_file(uri: str, resolve):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(open_file(uri, resolve))
    except errors.EmberError:
        raise
    except (pa.ArrowException, OSError) as e:
        raise errors.Corruption(f"{uri}: not a readable Parquet file: {e}") from e


class FileRows:
    """Rows of one Parquet file, as row-group ranges: what a feeding task sends for a plain scan.
    Has what the feed's split needs of a batch: ``num_rows`` and ``slice``."""

    __slots__ = ("uri", "columns", "ranges", "num_rows")

    def __init__(self, uri: str, columns: Sequence[str], ranges: List[Tuple[int, int, int]]):
        self.uri = uri
        self.columns = list(columns)
        self.ranges = [(int(g), int(a), int(b)) for g, a, b in ranges if b > a]
        self.num_rows = sum(b - a for _, a, b in self.ranges)

    @classmethod
    def of_file(cls, uri: str, columns: Sequence[str], resolve) -> "FileRows":
        """Every row of ``uri``, its projected columns checked against the footer."""
        meta = parquet_file(uri, resolve)
        names = meta.schema_arrow.names
        missing = [c for c in columns if c not in names]
        if missing:
            raise errors.InvalidArgument(f"{uri}: no column {missing[0]!r} (it has {list(names)})")
        md = meta.metadata
        return cls(uri, columns, [(g, 0, md.row_group(g).num_rows) for g in range(md.num_row_groups)])

    def slice(self, offset: int, n: int) -> "FileRows":
        out, skip, need = [], offset, n
        for g, a, b in self.ranges:
            if need <= 0:
                break
            rows = b - a
            if skip >= rows:
                skip -= rows
                continue
            first = a + skip
            last = min(b, first + need)
            out.append((g, first, last))
            need -= last - first
            skip = 0
        return FileRows(self.uri, self.columns, out)

    def ipc_parts(self) -> list:
        """The reference as an Arrow IPC stream of no rows (schema, end of stream)."""
        import pyarrow as pa

        text = json.dumps({"uri": self.uri, "columns": self.columns, "ranges": self.ranges}).encode()
        schema = pa.schema([], metadata={FILE_ROWS_KEY: text})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema):
            pass
        return [sink.getvalue()]


def file_rows_ref(schema) -> Optional[Dict[str, Any]]:
    """The file-rows reference a decoded message's schema carries, else None."""
    meta = schema.metadata or {}
    text = meta.get(FILE_ROWS_KEY)
    if text is None:
        return None
    try:
        ref = json.loads(text)
        uri, columns, ranges = str(ref["uri"]), [str(c) for c in ref["columns"]], ref["ranges"]
        ranges = [(int(g), int(a), int(b)) for g, a, b in ranges]
    except (ValueError, KeyError, TypeError) as e:
        raise errors.Corruption(f"a fed file-rows reference is malformed: {e}") from e
    return {"uri": uri, "columns": columns, "ranges": ranges}


def kept_open(key, opened: Dict[Any, Any], keep: int, open_it):
    """``opened[key]``, opened with ``open_it()`` if need be; ``opened`` keeps the ``keep`` most
    recently used (a reader's open files: their footers read once)."""
    if key in opened:
        opened[key] = opened.pop(key)  # the most recently used last
    else:
        while len(opened) >= keep:
            del opened[next(iter(opened))]
        opened[key] = open_it()
    return opened[key]


def read_file_rows(ref: Dict[str, Any], resolve, opened: Dict[str, Any], keep: int = 4):
    """The rows ``ref`` names, read from its file as one RecordBatch; ``opened`` keeps the last
    ``keep`` files open (their footers read once)."""
    import pyarrow as pa

    uri = ref["uri"]
    pf = kept_open(uri, opened, keep, lambda: parquet_file(uri, resolve))
    pieces = []
    for g, a, b in ref["ranges"]:
        try:
            table = pf.read_row_group(g, columns=ref["columns"])
        except (pa.ArrowException, OSError) as e:
            raise errors.Corruption(f"{uri}, row group {g} (columns {ref['columns']}): {e}") from e
        if a < 0 or b > table.num_rows:
            raise errors.Corruption(f"{uri}, row group {g}: rows {a}..{b} asked, it has {table.num_rows} "
                                    "(the file changed while the job read it?)")
        pieces.append(table.slice(a, b - a))
    if not pieces:
        raise errors.Corruption(f"{uri}: a fed file-rows reference names no rows")
    table = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
    batches = table.combine_chunks().to_batches()
    return batches[0] if len(batches) == 1 else pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
