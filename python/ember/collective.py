"""Ember's collectives on numpy arrays, PyTorch and TensorFlow tensors.

Inside a node, ``ctx.communicator()`` joins the job's training nodes (chief, master
and workers; rank 0 is the chief) and returns a :class:`Communicator`::

    comm = ctx.communicator()
    grads = comm.allreduce(grads)               # average over the nodes, a new array
    comm.allreduce_(buffer, op="sum")           # in place, no copy (numpy, torch CPU tensors)
    weights = comm.broadcast(weights, root=0)
    everything = comm.allgather(local_rows)     # concatenated along axis 0; lengths may differ

Every dtype the core reduces works from every framework: float32, float64, float16,
bfloat16 (``torch.bfloat16``, ``tf.bfloat16``, numpy's ``ml_dtypes.bfloat16``), int32 and
int64; results keep the caller's dtype and kind (numpy in, numpy out; torch in, torch
out; TensorFlow in, TensorFlow out).  Any other dtype raises ValueError naming it.

The work happens in the C++ core (``include/ember/collective.h``): shared memory
between the nodes of one host, a TCP ring between hosts.  Every node must make the
same calls in the same order; a mismatch raises ``ValueError`` (InvalidArgument)
naming the nodes and both calls on every node, and a node that dies or stalls makes
the others raise within the call's timeout, naming it.  After any failure the
communicator is broken and every later call raises the same error.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

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


def _is_torch(x: Any) -> bool:
    return hasattr(x, "detach") and hasattr(x, "clone")


def _is_tf(x: Any) -> bool:
    return type(x).__module__.startswith("tensorflow") and hasattr(x, "numpy")


def _supported() -> str:
    names = [name.lower() for name in _ember.CollectiveDataType.__members__]
    return ", ".join(names[:-1]) + " or " + names[-1]


def _bits(x: Any) -> Tuple[Any, Any]:
    """(what the binding takes for `x`, the dtype its elements are read as; None: its own).
    numpy's bfloat16 (ml_dtypes, as TensorFlow and JAX hand it out) crosses neither the
    buffer protocol nor numpy's DLPack, so it goes as its uint16 bits: a view, not a copy,
    and the core still reduces bfloat16 values.  torch and TF describe bfloat16 in DLPack."""
    if _is_numpy(x) and x.dtype.kind == "V" and x.dtype.fields is None:  # an ml_dtypes type
        if x.dtype.name == "bfloat16":
            return x.view(np.uint16), _ember.CollectiveDataType.BFLOAT16
        raise ValueError(f"collectives take {_supported()} arrays; got {x.dtype.name}")
    return x, None


def _same(x: Any) -> Any:
    return x


def _ready(x: Any) -> Any:
    """For a CUDA tensor: a torch CUDA event recorded now on torch's current stream, after the
    work queued to write `x`.  The core reads device memory on a stream of its own, once that
    event passed (ember/device.h ``Device::ready``), waiting in the thread that runs the call:
    an async call returns at once and torch's stream runs on.  None for anything else (the
    caller keeps the event alive until the call ended)."""
    if _is_torch(x) and getattr(x, "is_cuda", False):
        import torch
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(x.device))
        return event
    return None


def _handle(event: Any) -> Optional[int]:
    return None if event is None else event.cuda_event


def _on_host(x: Any) -> Tuple[Any, Callable[[Any], Any]]:
    """`x` in host memory for a call that stages nothing itself, and the function taking the
    result back to `x`'s device (a CUDA tensor goes through .cpu())."""
    if _is_torch(x) and getattr(x, "is_cuda", False):
        device = x.device
        return x.detach().cpu(), lambda y: y.to(device)
    return x, _same


def _working_copy(x: Any) -> Tuple[Any, Callable[[Any], Any]]:
    """A C-contiguous copy of `x` for a call to work on in place, and the function turning
    the result into `x`'s kind: torch stays torch; a TF tensor (immutable) is worked on as
    numpy and comes back as a TF tensor of its dtype; anything else becomes numpy."""
    if _is_torch(x):
        return x.detach().clone(memory_format=__import__("torch").contiguous_format), _same
    if _is_tf(x):
        import tensorflow as tf
        return np.array(x.numpy(), copy=True, order="C"), tf.convert_to_tensor
    return np.array(x, copy=True, order="C"), _same


def communicator_options(transport: str = "auto", timeout: Optional[float] = None,
                         connect_timeout: Optional[float] = None) -> "_ember.CommunicatorOptions":
    """The core's CommunicatorOptions with the caller's transport ("auto" or "tcp") and timeouts
    (seconds); those left None keep the core's defaults.  Raises ValueError for another
    transport."""
    options = _ember.CommunicatorOptions()
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {list(TRANSPORTS)}, got {transport!r}")
    options.transport = getattr(_ember.CollectiveTransport, transport.upper())
    if timeout is not None:
        options.timeout = float(timeout)
    if connect_timeout is not None:
        options.connect_timeout = float(connect_timeout)
    return options


class Communicator:
    """The job's training nodes as ranks 0..size-1 (see the module docstring).

    Calls block until every rank took part (or ``timeout`` seconds pass: DeadlineExceeded).
    Methods ending in ``_`` work in place on a writable, C-contiguous array or tensor;
    the others return a new one of the same kind and leave their input alone.  CUDA
    tensors (torch, or anything DLPack-exports CUDA memory) are reduced and broadcast where
    they are, staged through page-locked host memory by the core (the CUDA runtime is loaded
    at the first such call); every rank must pass the same kind of memory to a call.
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
        options = communicator_options(transport, timeout=timeout, connect_timeout=connect_timeout)
        options.rank, options.size, options.secret, options.host = rank, size, secret, host
        options.name, options.prefix = name, prefix
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
        event = _ready(x)
        bits, dtype = _bits(x)
        self._native.allreduce(bits, _op(op), timeout, dtype=dtype, ready=_handle(event))
        return x

    def allreduce(self, x: Any, op: str = "average", timeout: float = 0.0) -> Any:
        """The reduction of `x` over the ranks, as a new array/tensor; `x` is unchanged."""
        y, back = _working_copy(x)
        return back(self.allreduce_(y, op, timeout))

    def allreduce_many_(self, xs: Sequence[Any], op: str = "average", timeout: float = 0.0) -> List[Any]:
        """Reduces several arrays of one dtype in place as one fused call (a model's gradients)."""
        xs = list(xs)
        if any(_is_torch(x) and getattr(x, "is_cuda", False) for x in xs):
            for x in xs:  # device memory is reduced buffer by buffer, each staged (ember/device.h)
                self.allreduce_(x, op, timeout)
            return xs
        bits = [_bits(x) for x in xs]
        dtypes = {dtype for _, dtype in bits}
        if len(dtypes) > 1:
            raise ValueError("allreduce_many_: every array must have one dtype")
        self._native.allreduce_fused([b for b, _ in bits], _op(op), timeout, dtype=dtypes.pop() if bits else None)
        return xs

    def allreduce_async_(self, x: Any, op: str = "average", timeout: float = 0.0) -> "_ember.CollectiveWork":
        """Starts an in-place reduction of `x`; returns a handle whose ``wait()`` ends it.
        `x` must not be touched until then.  Calls run in the order they were made."""
        event = _ready(x)
        bits, dtype = _bits(x)
        return self._native.allreduce_async((x, event), bits, _op(op), timeout, dtype=dtype, ready=_handle(event))

    def reduce_scatter(self, x: Any, op: str = "average", timeout: float = 0.0) -> Any:
        """`x` holds size equal blocks along axis 0; returns the reduction of block `rank`."""
        x, back = _on_host(x)
        if _is_torch(x):
            arr = x.contiguous()
        elif _is_tf(x):
            import tensorflow as tf
            arr, back = np.ascontiguousarray(x.numpy()), tf.convert_to_tensor
        else:
            arr = np.ascontiguousarray(x)
        if arr.shape[0] % self.size:
            raise ValueError(f"reduce_scatter: axis 0 ({arr.shape[0]}) is not a multiple of size {self.size}")
        if _is_torch(arr):
            out = arr.new_empty((arr.shape[0] // self.size,) + tuple(arr.shape[1:]))
        else:
            out = np.empty((arr.shape[0] // self.size,) + arr.shape[1:], dtype=arr.dtype)
        (arr_bits, dtype), (out_bits, _) = _bits(arr), _bits(out)
        self._native.reduce_scatter(arr_bits, out_bits, _op(op), timeout, dtype=dtype)
        return back(out)

    # -- data movement
    def broadcast_(self, x: Any, root: int = 0, timeout: float = 0.0) -> Any:
        """Overwrites `x` with rank `root`'s `x`, in place; returns it."""
        event = _ready(x)
        bits, dtype = _bits(x)
        self._native.broadcast(bits, root, timeout, dtype=dtype, ready=_handle(event))
        return x

    def broadcast(self, x: Any, root: int = 0, timeout: float = 0.0) -> Any:
        """Rank `root`'s `x`, as a new array/tensor on every rank."""
        y, back = _working_copy(x)
        return back(self.broadcast_(y, root, timeout))

    def allgather(self, x: Any, timeout: float = 0.0) -> Any:
        """Every rank's `x` concatenated along axis 0, in rank order.  Lengths along axis 0
        may differ between ranks; the other dimensions must agree.  Returns the kind `x` is
        (a torch tensor on `x`'s device, a TF tensor, or numpy for anything else)."""
        if _is_torch(x):
            import torch

            t = x.detach().cpu().contiguous()
            t = t.reshape(1) if t.dim() == 0 else t
            data, counts = self._native.allgatherv(t, timeout)
            flat = (torch.frombuffer(bytearray(data), dtype=torch.uint8).view(t.dtype) if data
                    else torch.empty(0, dtype=t.dtype))
            return flat.reshape(self._gathered_shape(tuple(t.shape), counts)).to(x.device)
        back = _same
        if _is_tf(x):
            import tensorflow as tf
            x, back = x.numpy(), tf.convert_to_tensor
        arr = np.ascontiguousarray(x)
        arr = arr.reshape(1) if arr.ndim == 0 else arr
        bits, dtype = _bits(arr)
        data, counts = self._native.allgatherv(bits, timeout, dtype=dtype)
        return back(np.frombuffer(data, dtype=arr.dtype).reshape(self._gathered_shape(arr.shape, counts)))

    @staticmethod
    def _gathered_shape(shape: Tuple[int, ...], counts: Sequence[int]) -> Tuple[int, ...]:
        """The shape of the ranks' arrays of `counts` elements, each `shape` beyond axis 0."""
        row = int(np.prod(shape[1:], dtype=np.int64))
        if row and any(c % row for c in counts):
            raise ValueError(f"allgather: the ranks' arrays differ in shape beyond axis 0 "
                             f"(element counts {list(counts)}, {row} per row here)")
        return ((sum(counts) // row) if row else 0,) + tuple(shape[1:])

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


# The node's default communicator: set by the node's runner (ember._node.main) to
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
