"""Ember's exceptions.

Every error Ember raises is an :class:`EmberError` (a ``RuntimeError``).  The
native core reports failures as a status code; each code has its own class,
defined by the native module and re-exported here, and some also derive from
the builtin exception a Python programmer would catch for that case:

==================  ================================  =====================
class               raised when                       also a
==================  ================================  =====================
InvalidArgument     the caller passed something wrong ``ValueError``
NotFound            something asked for does not exist
AlreadyExists       something to create exists already
DeadlineExceeded    a wait ran out of time            ``TimeoutError``
Unavailable         a peer cannot be reached          ``ConnectionError``
Unauthenticated     a peer did not prove the secret
Aborted             the job was aborted
EmberIOError        the operating system said no      ``OSError``
Corruption          malformed bytes (file or network)
OutOfRange          end of data
Cancelled           the operation was cancelled
Internal            a bug in Ember
==================  ================================  =====================

The Python layer adds :class:`ClusterError` (the cluster cannot be started or
used: too few Spark task slots, the Spark job died) and :class:`NodeError` (a
node's ``main_fun`` failed; carries the node's role, host and traceback).
"""
from __future__ import annotations

from ember._ember import (  # noqa: F401  (re-exports)
    Aborted,
    AlreadyExists,
    Cancelled,
    Corruption,
    DeadlineExceeded,
    EmberError,
    EmberIOError,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    Unauthenticated,
    Unavailable,
)

__all__ = [
    "EmberError", "InvalidArgument", "NotFound", "AlreadyExists", "DeadlineExceeded",
    "Unavailable", "Unauthenticated", "Aborted", "EmberIOError", "Corruption", "OutOfRange",
    "Cancelled", "Internal", "ClusterError", "NodeError",
]


class ClusterError(EmberError):
    """The cluster could not be started or kept running (not a node's own failure).

    Examples: the Spark application has too few task slots for one node per
    slot, or the Spark job that runs the nodes failed outside ``main_fun``.
    """


class NodeError(EmberError):
    """A node failed: its ``main_fun`` raised, its process died, or it was lost.

    Attributes:
        job_name: the node's role ("worker", "chief", "ps", ...).
        task_index: its index within the role.
        executor_id: its Spark partition id (0..num_nodes-1).
        host: the host it ran on.
        remote_traceback: the node's traceback text (or what is known of the failure).
        lost: whether the node was lost (no heartbeat, connection dropped) rather than failed.
        detail: what happened next, e.g. why the restart this failure caused did not start
            (the message's last paragraph); "" if nothing.
    """

    def __init__(self, job_name: str, task_index: int, executor_id: int, host: str,
                 remote_traceback: str, lost: bool = False, detail: str = ""):
        self.job_name = job_name
        self.task_index = task_index
        self.executor_id = executor_id
        self.host = host
        self.remote_traceback = remote_traceback
        self.lost = lost
        self.detail = detail
        what = "was lost" if lost else "failed"
        message = (f"node {job_name}:{task_index} (executor {executor_id}) on host {host} {what}:\n"
                   f"{remote_traceback.rstrip()}" + (f"\n{detail}" if detail else ""))
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (self.job_name, self.task_index, self.executor_id, self.host,
                             self.remote_traceback, self.lost, self.detail))
