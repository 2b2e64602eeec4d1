"""Child processes that cannot outlive their launcher.

Each child gets its own process group (``start_new_session``) so the launcher
can signal everything the child started, and a parent-death signal (SIGKILL,
via ``prctl(PR_SET_PDEATHSIG)``) so it dies with the launcher even when the
launcher itself is SIGKILLed, e.g. by Spark killing a task's Python worker.

The parent-death signal fires when the *thread* that forked exits, so spawn
from a thread that lives as long as the child (the Spark task's main thread).
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from typing import Dict, List, Optional

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)  # resolved before fork: preexec must not import
_prctl = _libc.prctl


def _die_with_parent(parent_pid: int):
    def preexec() -> None:  # runs in the child between fork and exec
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
    return preexec


def spawn(argv: List[str], env: Dict[str, str], **popen_kwargs) -> subprocess.Popen:
    """Starts `argv` in a new process group, with SIGKILL as its parent-death signal."""
    return subprocess.Popen(argv, env=env, start_new_session=True,
                            preexec_fn=_die_with_parent(os.getpid()), **popen_kwargs)


def has_exited(proc: subprocess.Popen) -> bool:
    """True once `proc` has exited, without reaping it.

    An unreaped child keeps its pid, so its process group id cannot be reused
    while we still signal the group.
    """
    if proc.returncode is not None:
        return True
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Sends `sig` to `proc`'s process group; a group already gone is fine."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(proc: subprocess.Popen, grace_secs: float) -> int:
    """Ends `proc` and everything in its process group, and reaps `proc`.

    SIGTERM to the group, up to `grace_secs` for the leader to exit, then
    SIGKILL to whatever is left in the group.  Returns the leader's exit code.
    """
    if not has_exited(proc):
        signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_secs
        while not has_exited(proc) and time.monotonic() < deadline:
            time.sleep(0.05)
    signal_group(proc, signal.SIGKILL)  # leftovers of the group, and the leader if it hung
    return proc.wait()


def describe_exit(returncode: Optional[int]) -> str:
    """'exit code 3' or 'killed by SIGKILL'."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"
