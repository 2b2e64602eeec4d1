"""The driver's Watcher picks the failure to report: a node's own failure over a failure that
is only its consequence (an ember.errors.Aborted raised in a peer's collective).  A fake
coordinator feeds it events (unit test of the driver's logic; the real thing runs in
test_multihost.py and test_recovery.py)."""
from __future__ import annotations

import queue
import threading
import types

from ember import _ember
from ember._driver.console import Console
from ember._driver.watcher import Watcher, is_consequence
from ember.errors import NodeError

ABORTED = ("Traceback (most recent call last):\n  File \"node.py\", line 3, in main_fun\n"
           "ember.errors.Aborted: rank 1 (worker:1 on 10.0.0.2, pid 7) closed the connection during allreduce #1")
KILLED = "the node's process was killed by SIGKILL"


class FakeServer:
    def __init__(self):
        self.events: "queue.Queue" = queue.Queue()

    def poll_events(self, timeout):
        try:
            return [self.events.get(timeout=timeout)]
        except queue.Empty:
            return []

    def nodes(self):
        return []


def failed(task_index, text):
    return types.SimpleNamespace(kind=_ember.Event.Kind.NODE_FAILED, job_name="worker", task_index=task_index,
                                 executor_id=task_index, text=text, stream=0, metrics={})


def watch(root_cause_wait):
    server, stopped = FakeServer(), []
    w = Watcher(server, Console(), "job", stopped.append, root_cause_wait=root_cause_wait)
    w.start()
    return server, w, stopped


def test_a_consequence_waits_for_its_cause():
    server, w, stopped = watch(root_cause_wait=30.0)
    try:
        server.events.put(failed(0, ABORTED))  # worker:0's allreduce saw worker:1 go
        server.events.put(failed(1, KILLED))   # then worker:1's launcher reports its death
        failure = w.known_failure(wait=20.0)
        assert (failure.task_index, failure.remote_traceback) == (1, KILLED)
        assert stopped == ["worker:1"]
    finally:
        w.stop()


def test_a_consequence_without_a_cause_is_reported_after_the_wait():
    server, w, stopped = watch(root_cause_wait=0.5)
    try:
        server.events.put(failed(0, ABORTED))
        failure = w.known_failure(wait=20.0)
        assert failure.task_index == 0 and is_consequence(failure)
        assert stopped == ["worker:0"]
    finally:
        w.stop()


def test_what_counts_as_a_consequence():
    def error(text):
        return NodeError("worker", 0, 0, "h", text)
    assert is_consequence(error(ABORTED))
    assert is_consequence(error("Aborted: communicator closed"))
    assert not is_consequence(error(KILLED))
    assert not is_consequence(error("Traceback ...\nValueError: ember.errors.Aborted: is only mentioned"))
    assert not is_consequence(error(""))
