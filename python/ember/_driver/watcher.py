"""The driver's watcher of node events and failures.

A daemon thread drains the coordinator's events: node output lines, progress
reports, registrations, and failures, which it turns into the one NodeError
the driver raises (the node's own traceback, its host, whether it was lost).
"""
from __future__ import annotations

import threading
import time
from typing import Callable, List, Optional

from ember import _ember
from ember._driver.console import Console
from ember.errors import NodeError


def is_consequence(error: NodeError) -> bool:
    """Whether a node failed only because another node or the job did: its main_fun ended in
    ember.errors.Aborted (a collective whose peer died or closed, a job the coordinator
    aborted).  Such a failure is reported only when no node's own failure explains it."""
    lines = [ln for ln in str(error.remote_traceback or "").splitlines() if ln.strip()]
    return bool(lines) and lines[-1].lstrip().startswith(("ember.errors.Aborted:", "Aborted:"))


class Watcher:
    """Shows a job's node events and keeps its first failure.  Thread-safe.

    `on_first_failure(label)` runs on the watcher's thread when the first node
    failure arrives, with the node's "role:index" (the driver stops the job then).

    A failure that is only a consequence of another (`is_consequence`: a node's collective
    saw its peer die) is held up to `root_cause_wait` seconds for the failure that caused
    it, which is then the one reported: when a node is killed, the nodes waiting on it in an
    allreduce fail at about the same moment, and the user must hear of the killed node.
    """

    def __init__(self, server, console: Console, job_id: str, on_first_failure: Callable[[str], None],
                 root_cause_wait: float = 2.0, on_departed: Optional[Callable[[int, str], None]] = None):
        self._server = server
        self._console = console
        self._on_first_failure = on_first_failure
        self._on_departed = on_departed  # (executor id, "role:index") of a worker the job goes on without
        self._root_cause_wait = root_cause_wait
        self._held: Optional[NodeError] = None  # a consequence, waiting for its cause
        self._held_label = ""
        self._held_until = 0.0
        self._failure: Optional[NodeError] = None
        self.departed: List[NodeError] = []  # workers lost within Cluster.run's min_workers
        self.replaced = 0  # replacement nodes that registered (Cluster.run's replace_lost_workers)
        self._failure_cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, daemon=True, name=f"{job_id}-events")

    @property
    def failure(self) -> Optional[NodeError]:
        """The first node failure the event stream reported, if any."""
        return self._failure

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Drains what is queued, then ends the thread (waits up to `timeout`)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)

    def known_failure(self, wait: float = 0.0) -> Optional[NodeError]:
        """The first node failure: from the event stream (waiting up to `wait` seconds for
        it), else from the coordinator's snapshot of the nodes."""
        with self._failure_cond:
            self._failure_cond.wait_for(lambda: self._failure is not None, timeout=wait)
            if self._failure is not None:
                return self._failure
        failed = [self.node_error(n.role.job_name, n.role.task_index, n.address.executor_id, n.error, info=n)
                  for n in self._server.nodes()
                  if n.state in (_ember.NodeInfo.State.FAILED, _ember.NodeInfo.State.LOST)]
        # Causes before consequences, then own failures before lost nodes.
        failed.sort(key=lambda e: (is_consequence(e), e.lost))
        return failed[0] if failed else None

    def raise_failure_or(self, error_type, message: str) -> None:
        """Raises the job's node failure if there is one (waiting a second for its event),
        else `error_type(message)`."""
        failure = self.known_failure(wait=1.0)
        if failure is not None:
            raise failure
        raise error_type(message)

    def node_error(self, job_name: str, task_index: int, executor_id: int, text: str, info=None) -> NodeError:
        if info is None:
            info = next((n for n in self._server.nodes() if n.address.executor_id == executor_id), None)
        host = info.address.host if info is not None else "(unknown host)"
        lost = info is not None and info.state == _ember.NodeInfo.State.LOST
        # The node's own words (its traceback) rather than the event's summary of them.
        remote = info.error if info is not None and info.error else text
        return NodeError(job_name, task_index, executor_id, host, remote, lost=lost)

    # ------------------------------------------------------------------ thread
    def _pump(self) -> None:
        while True:
            events = self._server.poll_events(0.2)  # blocks in the core; the tick only ends the thread
            for event in events:
                try:
                    self._handle(event)
                except Exception as e:  # noqa: BLE001 - one bad event must not stop the pump
                    self._console.info(f"could not show an event: {type(e).__name__}: {e}")
            self._release_held()
            if not events and self._stop.is_set():
                return

    def _handle(self, ev) -> None:
        kind = _ember.Event.Kind
        label = f"{ev.job_name}:{ev.task_index}" if ev.job_name else f"executor {ev.executor_id}"
        if ev.kind == kind.LOG:
            self._console.node_line(label, ev.stream, ev.text)
        elif ev.kind == kind.PROGRESS:
            self._console.progress(label, dict(ev.metrics))
        elif ev.kind == kind.REGISTERED:
            self._console.info(f"{label} registered (executor {ev.executor_id})" + (f": {ev.text}" if ev.text else ""))
            if ev.text.startswith("replaces "):
                with self._failure_cond:
                    self.replaced += 1
        elif ev.kind == kind.NODE_DONE:
            self._console.info(f"{label} done")
        elif ev.kind == kind.NODE_FAILED:
            if self._record(ev):
                self._on_first_failure(label)
        elif ev.kind == kind.NODE_DEPARTED:  # a tolerated worker loss (Cluster.run(min_workers=...))
            error = self.node_error(ev.job_name, ev.task_index, ev.executor_id, ev.text)
            with self._failure_cond:
                self.departed.append(error)
            first = [line for line in ev.text.strip().splitlines() if line.strip()]
            self._console.info(f"{first[-1].strip()[:300] if first else label + ' failed'}; the job goes on "
                               f"without it ({len(self.departed)} worker(s) lost so far, Cluster.run's min_workers)")
            if self._on_departed is not None:
                self._on_departed(ev.executor_id, label)
        elif ev.kind == kind.ABORT:
            failure = self._failure
            if failure is not None:
                self._console.info(f"job aborted: node {failure.job_name}:{failure.task_index} failed")
            else:
                self._console.info((ev.text or "job aborted").splitlines()[0])

    def _record(self, ev) -> bool:
        error = self.node_error(ev.job_name, ev.task_index, ev.executor_id, ev.text)
        with self._failure_cond:
            if self._failure is not None:
                return False
            if is_consequence(error) and self._root_cause_wait > 0:
                if self._held is None:  # the first consequence; its cause may be on its way
                    self._held, self._held_label = error, f"{ev.job_name}:{ev.task_index}"
                    self._held_until = time.monotonic() + self._root_cause_wait
                return False
            self._failure, self._held = error, None
            self._failure_cond.notify_all()
            return True

    def _release_held(self) -> None:
        """A held consequence whose cause did not arrive in time becomes the failure."""
        with self._failure_cond:
            if self._held is None or (time.monotonic() < self._held_until and not self._stop.is_set()):
                return
            self._failure, self._held = self._held, None
            label = self._held_label
            self._failure_cond.notify_all()
        self._on_first_failure(label)
