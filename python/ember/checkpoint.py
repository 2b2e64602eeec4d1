"""Checkpoints written and verified by Ember's C++ core (``include/ember/checkpoint.h``).

    import ember.checkpoint
    m = ember.checkpoint.CheckpointManager("hdfs://nn:8020/jobs/run1/ckpt", keep=3)
    m.save(step, {"model.npz": model_bytes, "optimizer.npz": opt_bytes})
    restored = m.restore()          # None, or (step, {name: bytes}) of the newest complete one

A checkpoint is a step number and named byte strings.  ``save`` writes them into a
temporary directory and makes the whole checkpoint visible with one rename (atomic on the
local file system and on HDFS), then deletes all but the newest ``keep``.  ``restore``
reads only complete checkpoints and checks every blob's size and CRC32C, raising
:class:`ember.errors.Corruption` naming the damaged file.  The directory may be local (a
path or ``file://``) or on HDFS (``hdfs://``).  Framework helpers on top:
``ember.keras.CheckpointCallback`` / ``restore_latest`` and ``ember.torch.save_checkpoint``
/ ``load_latest``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from ember import _ember
from ember.summary import resolve_options

__all__ = ["CheckpointManager"]


class CheckpointManager:
    """A directory of checkpoints (created if missing).

    One process saves into a directory at a time (the chief); any number may restore.
    Thread-safe.  The GIL is released while the core writes or reads.

    Args:
        directory: a path, ``file://`` or ``hdfs://`` URI.
        keep: how many complete checkpoints each save leaves (the newest by step), >= 1.
        sync: make every file durable before the checkpoint becomes visible (default True).
        resolve: the core's ResolveOptions (see :func:`ember.summary.resolve_options`);
            default: from the active SparkContext, else local.

    Raises:
        ValueError (InvalidArgument) if keep < 1; ember.errors.EmberError naming the URI if
        the directory cannot be created.
    """

    def __init__(self, directory: str, keep: int = 3, sync: bool = True, resolve: Any = None):
        options = _ember.CheckpointOptions()
        options.keep = int(keep)
        options.sync = bool(sync)
        if resolve is None:
            resolve = resolve_options()
        self._m = _ember.CheckpointManager.open(str(directory), resolve, options)

    @property
    def uri(self) -> str:
        """The directory's URI."""
        return self._m.uri

    def save(self, step: int, blobs: Mapping[str, bytes]) -> None:
        """Saves ``blobs`` as the checkpoint of ``step`` (>= 0), all or nothing; a checkpoint
        of the same step is replaced.  Names: 1-128 characters of ``[A-Za-z0-9._-]``, not
        starting with ".", not "MANIFEST".

        Raises ValueError for a bad step or name; the file system's error (EmberIOError, ...)
        naming the step and directory, in which case the checkpoints are as before."""
        self._m.save(int(step), {str(k): bytes(v) for k, v in blobs.items()})

    def steps(self) -> List[int]:
        """The steps of the complete checkpoints, oldest first."""
        return list(self._m.steps())

    def latest(self) -> Optional[int]:
        """The newest complete checkpoint's step, or None."""
        return self._m.latest()

    def restore(self, step: Optional[int] = None,
                fall_back_to_older: bool = False) -> Optional[Tuple[int, Dict[str, bytes]]]:
        """``(step, {name: bytes})`` of the newest complete checkpoint (or of ``step``), every
        blob verified; None when there is none (of that step).

        Raises ember.errors.Corruption naming the file when a blob is damaged or missing,
        unless ``fall_back_to_older``: then the next older complete checkpoint is restored."""
        from ember import errors

        try:
            got_step, blobs = self._m.restore(None if step is None else int(step), bool(fall_back_to_older))
        except errors.NotFound:
            return None
        return int(got_step), dict(blobs)

    def __repr__(self) -> str:
        return f"CheckpointManager({self.uri!r})"
