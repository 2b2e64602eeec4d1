"""Shared-memory rings that cannot outlive the launcher that made them (executor side).

A launcher's feed ring is ``/dev/shm/<prefix>``, its result rings ``/dev/shm/<prefix>-results...``.
Beside them the launcher holds an exclusive flock(2) on ``/dev/shm/<prefix>.owner`` for as
long as it runs.  The kernel drops that lock when the process dies, however it dies (SIGKILL,
SIGHUP from PySpark's daemon when its executor exits, the OOM killer), so "the lock can be
taken" means "the owner is gone", with no pid that could have been reused:

* a reaper process, started by the launcher in a session of its own (signals to the
  launcher's process group do not reach it), blocks on the lock and removes the names the
  moment it gets it, then exits: whatever ends a launcher, its rings go with it;
* every launcher sweeps its host's /dev/shm when it starts (``sweep_stale``): the names of
  owner files whose lock is free go, so a later job on the host removes what a lost one left
  even where the reaper was killed too.

The owner file is locked before it gets its name (made under a temporary name, then renamed),
so a sweep never sees an owner file that is not yet locked.
"""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from typing import List, Optional

SHM_DIR = "/dev/shm"
OWNER_SUFFIX = ".owner"
OWNER_PREFIX = "ember-"  # what a sweep looks at: owner files of Ember jobs

# The reaper: waits for the owner's lock, then removes the prefix's names.  Standard library
# only, and no import of Ember: it must start fast and cannot fail on a broken environment.
_REAPER = r"""
import fcntl, os, sys
shm, prefix = sys.argv[1], sys.argv[2]
owner = os.path.join(shm, prefix + ".owner")
try:
    fd = os.open(owner, os.O_RDONLY | os.O_CLOEXEC)
except FileNotFoundError:
    fd = None  # the owner closed (or a sweep removed it) before this process looked
if fd is not None:
    fcntl.flock(fd, fcntl.LOCK_EX)  # returns once the owner is gone
for name in os.listdir(shm):
    if name == prefix or name.startswith(prefix + "-") or name == prefix + ".owner":
        try:
            os.unlink(os.path.join(shm, name))
        except OSError:
            pass
"""


def _names_of(prefix: str, shm_dir: str) -> List[str]:
    """The /dev/shm names that belong to `prefix`: its ring, its result rings, its owner file."""
    try:
        names = os.listdir(shm_dir)
    except FileNotFoundError:
        return []
    return [n for n in names if n == prefix or n.startswith(prefix + "-") or n == prefix + OWNER_SUFFIX]


def _remove(prefix: str, shm_dir: str) -> List[str]:
    removed = []
    for name in _names_of(prefix, shm_dir):
        try:
            os.unlink(os.path.join(shm_dir, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


class RingOwner:
    """Owns the shared-memory names of one prefix (a ring's name without its "/") for the
    life of this process; see the module docstring.  ``close()`` removes them and ends the
    reaper; idempotent.  Not thread-safe: one owner, one thread."""

    def __init__(self, prefix: str, shm_dir: str = SHM_DIR):
        if not prefix or "/" in prefix:
            raise ValueError(f"a shared-memory prefix is a name without '/', got {prefix!r}")
        self.prefix = prefix
        self.shm_dir = shm_dir
        self.path = os.path.join(shm_dir, prefix + OWNER_SUFFIX)
        tmp = os.path.join(shm_dir, f".{prefix}.{os.getpid()}.tmp")
        self._fd: Optional[int] = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            os.rename(tmp, self.path)  # locked before it has its name: a sweep skips it
        except BaseException:
            os.close(self._fd)
            os.unlink(tmp)
            raise
        self.reaper: Optional[subprocess.Popen] = None
        try:
            self.reaper = subprocess.Popen(
                [sys.executable, "-c", _REAPER, shm_dir, prefix], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            pass  # no reaper: the next launcher's sweep removes what a killed one leaves

    def close(self) -> None:
        """Removes the prefix's names, releases the lock; the reaper then finds nothing and ends."""
        if self._fd is None:
            return
        _remove(self.prefix, self.shm_dir)
        os.close(self._fd)
        self._fd = None
        if self.reaper is not None:
            try:
                self.reaper.wait(5.0)
            except subprocess.TimeoutExpired:
                self.reaper.kill()
                self.reaper.wait()


def sweep_stale(shm_dir: str = SHM_DIR) -> List[str]:
    """Removes the names of every owner in `shm_dir` whose process is gone (its owner file's
    lock is free); returns what it removed.  Never blocks; safe beside live owners and other
    sweeps."""
    removed: List[str] = []
    try:
        names = os.listdir(shm_dir)
    except FileNotFoundError:
        return removed
    for name in names:
        if not (name.startswith(OWNER_PREFIX) and name.endswith(OWNER_SUFFIX)):
            continue  # not an Ember job's (job ids begin with "ember-")
        try:
            fd = os.open(os.path.join(shm_dir, name), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # removed meanwhile, or not ours to open
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its owner runs
            removed += _remove(name[:-len(OWNER_SUFFIX)], shm_dir)
        finally:
            os.close(fd)
    return removed
