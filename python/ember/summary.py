"""TensorBoard event files written by Ember's C++ core (``include/ember/summary.h``).

    import ember.summary
    with ember.summary.create_file_writer("hdfs://nn:8020/logs/run1") as w:
        w.scalar("loss", 0.25, step=1)
        w.histogram("weights", layer.kernel.numpy(), step=1)
        w.text("notes", "**lr** = 0.1", step=1)

Files are TensorBoard's and TensorFlow's own format (``events.out.tfevents.*``: TFRecords of
``tensorflow.Event``), read by ``tensorboard --logdir`` and ``tf.compat.v1.train.summary_iterator``;
no TensorFlow is needed to write them.  The log directory may be local (a path or ``file://``)
or on HDFS (``hdfs://``), resolved by the core's FileSystem layer.  Inside a node, use
``ctx.summary_writer()``: it writes in the node's own directory of the job's ``log_dir``.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ember import _ember, _hadoop

__all__ = ["EventWriter", "create_file_writer", "resolve_options", "default", "set_default"]

# In a node, the node's writer (``ctx.summary_writer``), so framework glue (ember.keras,
# ember.torch) finds it without being handed a context.
_default_factory = None


def set_default(factory) -> None:
    """Makes `factory()` (returning an EventWriter) the process's default; None clears it."""
    global _default_factory
    _default_factory = factory


def default() -> "EventWriter":
    """The node's event writer (``ctx.summary_writer()``).  Raises RuntimeError outside an
    Ember node, where one must be made with :func:`create_file_writer`."""
    if _default_factory is None:
        raise RuntimeError("no default event writer: this process is not an Ember node; make one with "
                           "ember.summary.create_file_writer(log_dir) and pass it as writer=")
    return _default_factory()


def resolve_options(default_fs: str = "", hdfs_http_address: str = "") -> Any:
    """The core's ResolveOptions for ``default_fs`` (Hadoop's ``fs.defaultFS``) and the
    NameNode's WebHDFS ``host:port``.  With neither given: the active SparkContext's Hadoop
    configuration if there is one, else local paths (and ``hdfs://host:port`` URIs reached at
    ``host:9870``)."""
    if not default_fs and not hdfs_http_address:
        default_fs, hdfs_http_address = _hadoop.active_spark_fs_conf()
    return _hadoop.resolve_options(default_fs, hdfs_http_address)


def _png_size(data: bytes):
    """(height, width, channels) from a PNG's IHDR chunk, or None if `data` is not a PNG."""
    if len(data) < 26 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return None
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    channels = {0: 1, 2: 3, 3: 3, 6: 4}.get(data[25])  # grey, RGB, palette, RGBA
    return (height, width, channels) if channels else None


class EventWriter:
    """Writes one TensorBoard event file in ``log_dir`` (created if missing).

    Thread-safe: several threads may add summaries at once.  Events become visible to
    TensorBoard every ``flush_secs`` (from a thread of the core), on :meth:`flush` and on
    :meth:`close`.  A context manager: ``with EventWriter(d) as w: ...`` closes it.

    Args:
        log_dir: directory of the event file: a path, ``file://`` or ``hdfs://`` URI.
        flush_secs: how often written events are flushed; 0 for only flush()/close().
            None keeps the core's default (EventWriterOptions).
        filename_suffix: appended to the file's name (TF's ``filename_suffix``).
        resolve: the core's ResolveOptions (see :func:`resolve_options`); default: from the
            active SparkContext, else local.

    Raises:
        ember.errors.EmberError (EmberIOError, NotFound, ...) if the directory or file cannot
        be created, naming its URI.
    """

    def __init__(self, log_dir: str, flush_secs: Optional[float] = None, filename_suffix: str = "",
                 resolve: Any = None):
        options = _ember.EventWriterOptions()
        if flush_secs is not None:
            options.flush_period = float(flush_secs)
        options.file_suffix = filename_suffix
        if resolve is None:
            resolve = resolve_options()
        self._writer = _ember.EventWriter.open(str(log_dir), resolve, options)

    @property
    def uri(self) -> str:
        """The event file's URI."""
        return self._writer.uri

    @property
    def events_written(self) -> int:
        """Events written so far, the first (file version) one included."""
        return self._writer.events_written

    def scalar(self, tag: str, value: float, step: int) -> None:
        """Adds ``value`` (stored as float32, as TensorBoard's scalars) at ``step``.

        Raises InvalidArgument (a ValueError) after close(); after a failed write, that
        error (EmberIOError, naming the file) on every call."""
        self._writer.add_scalar(tag, float(value), int(step))

    def histogram(self, tag: str, values: Any, step: int) -> None:
        """Adds a histogram of ``values`` (any array-like, flattened; TF1's buckets).

        Raises InvalidArgument (a ValueError) naming ``tag`` if a value is NaN or infinite."""
        arr = np.ascontiguousarray(np.asarray(values, dtype=np.float64).reshape(-1))
        self._writer.add_histogram(tag, arr, int(step))

    def text(self, tag: str, text: str, step: int) -> None:
        """Adds ``text`` (markdown, shown by TensorBoard's text dashboard)."""
        self._writer.add_text(tag, str(text), int(step))

    def image(self, tag: str, encoded: bytes, step: int, height: Optional[int] = None,
              width: Optional[int] = None, channels: Optional[int] = None) -> None:
        """Adds an image from a PNG or JPEG file's bytes; for PNG the size and channels are
        read from its header when not given (JPEG needs them)."""
        size = _png_size(encoded)
        if height is None or width is None or channels is None:
            if size is None:
                raise ValueError(f"image {tag!r}: give height, width and channels (not a PNG)")
            height, width, channels = (height or size[0], width or size[1], channels or size[2])
        self._writer.add_image(tag, bytes(encoded), int(height), int(width), int(channels), int(step))

    def flush(self) -> None:
        """Makes everything added so far visible to readers."""
        self._writer.flush()

    def close(self) -> None:
        """Flushes and closes the file; idempotent.  Adding after close raises ValueError."""
        self._writer.close()

    def __enter__(self) -> "EventWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EventWriter({self.uri!r})"


def create_file_writer(log_dir: str, flush_secs: Optional[float] = None, filename_suffix: str = "",
                       resolve: Any = None) -> EventWriter:
    """An :class:`EventWriter` for ``log_dir`` (``tf.summary.create_file_writer``'s place)."""
    return EventWriter(log_dir, flush_secs=flush_secs, filename_suffix=filename_suffix, resolve=resolve)
