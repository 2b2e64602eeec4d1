"""A launcher's feed ring cannot outlive it (issue 18, item 9): however the launcher ends, its
reaper removes the ring; what a launcher killed together with its reaper left, the next
launcher's sweep removes (python/ember/_launcher/ring_owner.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from ember._launcher import ring_owner as _ring_owner

pytestmark = pytest.mark.timeout(120)

# A launcher's NodeFeed (ring + feed server) in a process of its own, which reports the ring's
# name and its reaper's pid, then waits to be killed.
_LAUNCHER = textwrap.dedent("""
    import json, sys, time
    from ember._launcher.task import NodeFeed, NodeSpec
    spec = NodeSpec(job_id=sys.argv[1], coordinator_host="127.0.0.1", coordinator_port=1, secret=b"s" * 32,
                    payload=b"", num_nodes=1, default_fs="", working_dir="/tmp", log_dir=None,
                    tensorboard=False, input_mode=1, reservation_timeout=1.0, connect_timeout=1.0,
                    kill_grace_secs=1.0, echo_logs=False, feed_ring_bytes=1 << 20)
    feed = NodeFeed(spec, 0, "worker:0", "127.0.0.1", "127.0.0.1")
    reaper = getattr(getattr(feed, "owner", None), "reaper", None)  # None before issue 18's fix
    print(json.dumps({"ring": feed.endpoint.ring.lstrip("/"), "reaper": reaper and reaper.pid}), flush=True)
    time.sleep(600)
""")


def _shm(job_id: str) -> list:
    return sorted(n for n in os.listdir("/dev/shm") if job_id in n)


def _start_launcher(job_id: str):
    proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, job_id], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    facts = json.loads(proc.stdout.readline())
    return proc, facts


def _kill(pid) -> None:
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _alive(pid) -> bool:
    """Whether `pid` runs (a zombie has ended; only its parent's wait is missing)."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_until(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_a_killed_launchers_ring_goes_with_it(sig):
    """SIGKILL (Spark killing a task's Python worker) and SIGHUP (PySpark's daemon ending its
    workers when the executor exits, as on a host cut off by a partition): the launcher runs
    no cleanup of its own, yet its 1 MiB ring leaves /dev/shm within seconds."""
    job_id = f"ember-ringtest-{uuid.uuid4().hex[:8]}"
    proc, facts = _start_launcher(job_id)
    try:
        assert facts["ring"] in _shm(job_id), _shm(job_id)
        os.kill(proc.pid, sig)
        proc.wait(10)
        assert _wait_until(lambda: not _shm(job_id), 10), f"left in /dev/shm: {_shm(job_id)}"
        # The reaper ended once it had cleaned up.
        assert _wait_until(lambda: not _alive(facts["reaper"]), 10)
    finally:
        _kill(proc.pid)
        _kill(facts["reaper"])
        _ring_owner.sweep_stale()


def test_a_later_launcher_sweeps_what_a_lost_one_left():
    """A launcher killed together with its reaper leaves its ring; the sweep every launcher
    runs at start removes it, and leaves a live launcher's ring alone."""
    lost_id, live_id = (f"ember-ringtest-{uuid.uuid4().hex[:8]}" for _ in range(2))
    lost, lost_facts = _start_launcher(lost_id)
    live, live_facts = _start_launcher(live_id)
    try:
        _kill(lost_facts["reaper"])
        _kill(lost.pid)
        lost.wait(10)
        time.sleep(0.5)
        assert lost_facts["ring"] in _shm(lost_id)  # nothing else removes it
        removed = _ring_owner.sweep_stale()
        assert lost_facts["ring"] in removed, removed
        assert _shm(lost_id) == []
        assert live_facts["ring"] in _shm(live_id), "the sweep removed a live launcher's ring"
    finally:
        for pid in (lost.pid, live.pid, lost_facts["reaper"]):
            _kill(pid)
        live.wait(10)
    # The live launcher's own reaper cleans up after it.
    assert _wait_until(lambda: not _shm(live_id), 10), _shm(live_id)


def test_a_closed_feed_leaves_nothing_and_its_reaper_ends():
    """The normal path: NodeFeed.close() removes ring and owner file; the reaper exits."""
    from ember._launcher.task import NodeFeed, NodeSpec

    job_id = f"ember-ringtest-{uuid.uuid4().hex[:8]}"
    spec = NodeSpec(job_id=job_id, coordinator_host="127.0.0.1", coordinator_port=1, secret=b"s" * 32,
                    payload=b"", num_nodes=1, default_fs="", working_dir="/tmp", log_dir=None,
                    tensorboard=False, input_mode=1, reservation_timeout=1.0, connect_timeout=1.0,
                    kill_grace_secs=1.0, echo_logs=False, feed_ring_bytes=1 << 20)
    feed = NodeFeed(spec, 0, "worker:0", "127.0.0.1", "127.0.0.1")
    assert _shm(job_id) == [f"{job_id}-0", f"{job_id}-0.owner"]
    feed.close()
    assert _shm(job_id) == []
    assert feed.owner.reaper.poll() is not None
