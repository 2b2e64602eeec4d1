"""Ember's collectives on numpy arrays and DLPack tensors (PyTorch, ...).

Inside a node, ``ctx.communicator()`` joins the job's training nodes (chief, master
and workers; rank 0 is the chief) and returns a :class:`Communicator`::

    comm = ctx.communicator()
    grads = comm.allreduce(grads)               # average over the nodes, a new array
    comm.allreduce_(buffer, op="sum")           # in place, no copy (numpy, torch CPU tensors)
    weights = comm.broadcast(weights, root=0)
    everything = comm.allgather(local_rows)     # concatenated along axis 0; lengths may differ

The work happens in the C++ core (``include/ember/collective.h``): shared memory
between the nodes of one host, a TCP ring between hosts.  Every node must make the
same calls in the same order; a mismatch raises ``ValueError`` (InvalidArgument)
naming the nodes and both calls on every node, and a node that dies or stalls makes
the others raise within the call's timeout, naming it.  After any failure the
communicator is broken and every later call raises the same error.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from ember import _ember

OPS = ("sum", "average", "avg", "mean", "min", "max")
TRANSPORTS = ("auto", "tcp")


def _op(op: str):
    names = {"sum": "SUM", "average": "AVERAGE", "avg": "AVERAGE", "mean": "AVERAGE", "min": "MIN", "max": "MAX"}
    try:
        return getattr(_ember.ReduceOp, names[op.lower()])
    except (KeyError, AttributeError):
        raise ValueError(f"op must be one of {list(OPS)}, got {op!r}") from None


def _is_numpy(x: Any) -> bool:
    return isinstance(x, np.ndarray)


def _contiguous_copy(x: Any) -> Any:
    """A C-contiguous copy of `x` of the same kind (numpy array or torch tensor)."""
    if _is_numpy(x) or np.isscalar(x):
        return np.array(x, copy=True, order="C")
    if hasattr(x, "detach") and hasattr(x, "clone"):  # torch
        return x.detach().clone(memory_format=__import__("torch").contiguous_format)
    return np.array(x, copy=True, order="C")


class Communicator:
    """The job's training nodes as ranks 0..size-1 (see the module docstring).

    Calls block until every rank took part (or ``timeout`` seconds pass: DeadlineExceeded).
    Methods ending in ``_`` work in place on a writable, C-contiguous CPU array or tensor;
    the others return a new one of the same kind and leave their input alone.
    """

    def __init__(self, native: "_ember.Communicator"):
        self._native = native

    @classmethod
    def create(cls, rank: int, size: int, secret: bytes, store: "_ember.CollectiveStore", host: str = "127.0.0.1",
               name: str = "", prefix: str = "ember-collective", transport: str = "auto",
               timeout: Optional[float] = None, connect_timeout: Optional[float] = None,
               bind_host: Optional[str] = None) -> "Communicator":
        """Joins ranks 0..size-1 meeting in `store` (every rank calls this with the same
        `prefix`, unique per communicator in a job).  Ranks with the same `host` share
        memory; others connect over TCP.  Options left out keep the core's defaults."""
        options = _ember.CommunicatorOptions()
        options.rank, options.size, options.secret, options.host = rank, size, secret, host
        options.name, options.prefix = name, prefix
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {list(TRANSPORTS)}, got {transport!r}")
        options.transport = getattr(_ember.CollectiveTransport, transport.upper())
        if timeout is not None:
            options.timeout = float(timeout)
        if connect_timeout is not None:
            options.connect_timeout = float(connect_timeout)
        if bind_host is not None:
            options.bind_host = bind_host
        return cls(_ember.Communicator.create(options, store))

    @property
    def rank(self) -> int:
        return self._native.rank

    @property
    def size(self) -> int:
        return self._native.size

    def describe(self, rank: int) -> str:
        """How errors name `rank`, e.g. ``"rank 1 (worker:0 on 10.0.0.2, pid 4711)"``."""
        return self._native.describe(rank)

    # -- reductions
    def allreduce_(self, x: Any, op: str = "average", timeout: float = 0.0) -> Any:
        """Reduces `x` over the ranks in place and returns it.  `op`: average (default), sum, min, max."""
        self._native.allreduce(x, _op(op), timeout)
        return x

    def allreduce(self, x: Any, op: str = "average", timeout: float = 0.0) -> Any:
        """The reduction of `x` over the ranks, as a new array/tensor; `x` is unchanged."""
        return self.allreduce_(_contiguous_copy(x), op, timeout)

    def allreduce_many_(self, xs: Sequence[Any], op: str = "average", timeout: float = 0.0) -> List[Any]:
        """Reduces several arrays of one dtype in place as one fused call (a model's gradients)."""
        xs = list(xs)
        self._native.allreduce_fused(xs, _op(op), timeout)
        return xs

    def allreduce_async_(self, x: Any, op: str = "average", timeout: float = 0.0) -> "_ember.CollectiveWork":
        """Starts an in-place reduction of `x`; returns a handle whose ``wait()`` ends it.
        `x` must not be touched until then.  Calls run in the order they were made."""
        return self._native.allreduce_async(x, x, _op(op), timeout)

    def reduce_scatter(self, x: Any, op: str = "average", timeout: float = 0.0) -> Any:
        """`x` holds size equal blocks along axis 0; returns the reduction of block `rank`."""
        arr = np.ascontiguousarray(x) if not hasattr(x, "detach") else x.contiguous()
        if arr.shape[0] % self.size:
            raise ValueError(f"reduce_scatter: axis 0 ({arr.shape[0]}) is not a multiple of size {self.size}")
        if _is_numpy(arr):
            out = np.empty((arr.shape[0] // self.size,) + arr.shape[1:], dtype=arr.dtype)
        else:
            out = arr.new_empty((arr.shape[0] // self.size,) + tuple(arr.shape[1:]))
        self._native.reduce_scatter(arr, out, _op(op), timeout)
        return out

    # -- data movement
    def broadcast_(self, x: Any, root: int = 0, timeout: float = 0.0) -> Any:
        """Overwrites `x` with rank `root`'s `x`, in place; returns it."""
        self._native.broadcast(x, root, timeout)
        return x

    def broadcast(self, x: Any, root: int = 0, timeout: float = 0.0) -> Any:
        """Rank `root`'s `x`, as a new array/tensor on every rank."""
        return self.broadcast_(_contiguous_copy(x), root, timeout)

    def allgather(self, x: Any, timeout: float = 0.0) -> np.ndarray:
        """Every rank's `x` concatenated along axis 0, in rank order.  Lengths along axis 0
        may differ between ranks; the other dimensions must agree.  Returns numpy."""
        arr = np.ascontiguousarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x)
        if arr.ndim == 0:
            arr = arr.reshape(1)
        data, counts = self._native.allgatherv(arr, timeout)
        row = int(np.prod(arr.shape[1:], dtype=np.int64))
        if row and any(c % row for c in counts):
            raise ValueError(f"allgather: the ranks' arrays differ in shape beyond axis 0 "
                             f"(element counts {list(counts)}, {row} per row here)")
        out = np.frombuffer(data, dtype=arr.dtype)
        return out.reshape((-1,) + arr.shape[1:]) if row else out.reshape((0,) + arr.shape[1:])

    def barrier(self, timeout: float = 0.0) -> None:
        """Returns once every rank called barrier()."""
        self._native.barrier(timeout)

    def abort(self, reason: str) -> None:
        """Breaks the communicator on every rank: their calls raise Aborted with `reason`."""
        self._native.abort(reason)

    def close(self) -> None:
        """Releases sockets and shared memory; calls in flight raise Aborted."""
        self._native = None

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, size={self.size})" if self._native else "Communicator(closed)"


# The node's default communicator: set by the node's runner (ember._node_main) to
# ``ctx.communicator``, so framework glue (ember.keras, ember.torch) finds the job's
# training nodes without being handed a context.
_default_factory = None


def set_default(factory) -> None:
    """Makes `factory()` (returning a Communicator) the process's default; None clears it."""
    global _default_factory
    _default_factory = factory


def default() -> Communicator:
    """The node's communicator over the job's training nodes (``ctx.communicator()``).
    Raises RuntimeError outside an Ember node, where one must be created explicitly."""
    if _default_factory is None:
        raise RuntimeError("no default communicator: this process is not an Ember node; create one "
                           "with ember.collective.Communicator.create(...) or pass it explicitly")
    return _default_factory()
