"""PyTorch: the data feed as a Dataset (InputMode.SPARK), and synchronous data-parallel training."""
from __future__ import annotations

import contextlib
import sys

import numpy as np
from typing import Optional


def feed_dataset(feed, batch_size: int, drop_remainder: bool = True, transform=None, validation: bool = False,
                 device=None, prefetch: int = 2):
    """A ``torch.utils.data.IterableDataset`` over `feed` (an :class:`ember.feed.DataFeed`);
    each pass is one epoch (see ``DataFeed.epoch_batches``), or with `validation` the
    validation epoch fed after the training epoch just read (``DataFeed.validation_batches``;
    pass ``drop_remainder=False`` to evaluate every validation row).

    Yields dicts of tensors (or whatever `transform` returns from a dict of numpy
    columns).  Use it with ``DataLoader(ds, batch_size=None)`` in the node's own
    process (``num_workers=0``: the feed is one reader).  The tensors share the
    feed's read-only Arrow memory (no copy): do not write into them in place.

    With ``device="cuda"`` (or ``"cuda:0"``, a ``torch.device``) the batches land on that
    GPU, `prefetch` batches ahead on a stream of their own, so the copies overlap the
    model's work (see :func:`device_batches`).  While such a pass runs, the feed's own
    memory, where Spark's tasks write the rows, is page-locked (``cudaHostRegister``): a
    batch of plain columns goes from there to the GPU in one straight copy at the bus's
    speed, with no staging copy on the host.  (Batches a `transform` makes, and batches
    joined from several fed messages, are staged through reused page-locked buffers.)
    """
    import warnings

    import torch

    def to_tensors(cols):
        with warnings.catch_warnings():  # read-only on purpose: zero-copy from the feed
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in cols.items()
                    if v.dtype != object}

    class _FeedDataset(torch.utils.data.IterableDataset):
        def __iter__(self):
            read = feed.validation_batches if validation else feed.epoch_batches
            batches = (transform(cols) if transform is not None else to_tensors(cols)
                       for cols in read(batch_size, drop_remainder))
            if not _is_cuda(device):
                return iter(device_batches(batches, device, prefetch))
            return _page_locked_pass(feed, batches, device, prefetch)

    return _FeedDataset()


def _is_cuda(device) -> bool:
    if device is None:
        return False
    import torch
    return torch.device(device).type == "cuda"


def _page_locked_pass(feed, batches, device, prefetch: int):
    """device_batches over a feed's batches with the feed's memory page-locked for the pass
    (device_batches keeps each batch's rows until its copies finished; the core synchronizes
    the device before it gives page-locked memory back), unlocked once the pass ends."""
    import logging

    import torch

    locked = False
    if torch.cuda.is_available():
        torch.cuda.init()  # the runtime Ember loads is torch's, with its context made
        try:
            feed._consumer.page_lock_rows()
            locked = True
        except Exception as e:  # noqa: BLE001 - the staging copy still works, only slower
            logging.getLogger("ember").warning("feed memory not page-locked (%s); batches are staged through "
                                               "page-locked buffers instead", e)
    try:
        yield from device_batches(batches, device, prefetch)
    finally:
        if locked:
            feed._consumer.unlock_rows()


def device_batches(batches, device=None, prefetch: int = 2):
    """The batches of `batches` (dicts, tuples or lists of CPU tensors, or single tensors) on
    `device`, in order.  For a CUDA device a staging thread takes each batch from `batches`,
    copies its tensors into page-locked host buffers (reused: the set of a batch whose copy to
    the GPU finished takes the next) and from there to the GPU with ``non_blocking=True`` on a
    side stream, up to `prefetch` batches ahead of the one handed out: reading the source, the
    copy into page-locked memory and the copy to the GPU all overlap the consumer's own work
    (PyTorch's ``DataLoader(pin_memory=True)`` pins in a thread the same way).  The consumer's
    stream waits for a batch's copies only when it is handed out.  A batch's GPU tensors
    belong to the consumer (``record_stream``): keep them as long as needed.  Tensors already
    page-locked (``pin_memory()``, or a page-locked feed's rows) are copied straight from their
    own memory, with no staging copy: each source batch is kept (referenced) until its copies
    finished; do not write into such tensors until their batch is handed out.
    `batches` is read in the staging thread (one reader, in order); an error it raises is
    raised here, in the consumer, when the batches before it were handed out.  Closing the
    generator early stops the thread after the batch it is reading.
    Other devices (None, "cpu"): the batches as they are.

    Raises:
        RuntimeError: a CUDA device where torch has no CUDA (naming the device).
    """
    import queue
    import threading

    import torch

    if device is None:
        yield from batches
        return
    device = torch.device(device)
    if device.type != "cuda":
        yield from (_map_tensors(b, lambda t: t.to(device)) for b in batches)
        return
    if not torch.cuda.is_available():
        raise RuntimeError(f"device_batches: device {device} asked for, but torch sees no CUDA device "
                           f"(torch {torch.__version__}, CUDA_VISIBLE_DEVICES="
                           f"{__import__('os').environ.get('CUDA_VISIBLE_DEVICES')!r})")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    prefetch = max(1, int(prefetch))
    stream = torch.cuda.Stream(device)
    slots = [dict() for _ in range(prefetch + 2)]  # page-locked buffers of each batch in flight
    slot_done = [None] * len(slots)                # the event after a slot's last copy to the GPU
    slot_source = [None] * len(slots)              # the batch a slot's copies read from
    handoff = queue.Queue(maxsize=prefetch)
    stop = threading.Event()
    end = object()

    def stage(batch, n):
        slot = n % len(slots)
        if slot_done[slot] is not None:
            slot_done[slot].synchronize()  # its previous batch has left the page-locked buffers
            slot_source[slot] = None
        pinned = slots[slot]
        counter = iter(range(1 << 30))

        def copy(t):
            key = next(counter)
            if t.device.type != "cpu" or t.is_pinned():
                return t.to(device, non_blocking=True)
            buf = pinned.get(key)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = pinned[key] = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            buf.copy_(t)
            return buf.to(device, non_blocking=True)

        with torch.cuda.stream(stream):
            out = _map_tensors(batch, copy)
            event = torch.cuda.Event()
            event.record(stream)
        slot_done[slot] = event
        slot_source[slot] = batch  # kept until its copies finished: a feed's rows go back when dropped
        return out, event

    def put(item) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def stager():
        try:
            with torch.cuda.device(device):
                for n, batch in enumerate(batches):
                    if stop.is_set() or not put(stage(batch, n)):
                        return
            put(end)
        except BaseException as e:  # noqa: BLE001 - raised in the consumer
            put(_Raised(e))

    thread = threading.Thread(target=stager, name=f"ember-device-batches-{device}", daemon=True)
    thread.start()
    try:
        while True:
            try:
                item = handoff.get(timeout=1.0)
            except queue.Empty:
                if thread.is_alive():
                    continue  # the source is slow: its own deadlines apply
                raise RuntimeError("device_batches: the staging thread ended without handing over a batch, "
                                   "an end or an error") from None
            if item is end:
                return
            if isinstance(item, _Raised):
                raise item.error
            out, event = item
            current = torch.cuda.current_stream(device)
            current.wait_event(event)
            _map_tensors(out, lambda t: (t.record_stream(current), t)[1])
            yield out
    finally:
        stop.set()
        while True:  # frees a stager blocked on a full queue, and what it staged
            try:
                handoff.get_nowait()
            except queue.Empty:
                break
        thread.join(timeout=5.0)


class _Raised:
    """An exception of the staging thread, carried to the consumer."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _map_tensors(batch, fn):
    """`batch` with fn applied to each torch tensor in it (dict, tuple, list, or a tensor)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: _map_tensors(v, fn) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_map_tensors(v, fn) for v in batch)
    return batch


# --------------------------------------------------------------------------- sync training
# Synchronous data-parallel PyTorch on Ember's collectives (Horovod's recipe):
#
#     model = Net()
#     ember.torch.broadcast_parameters(model)                       # everyone starts from rank 0
#     optimizer = ember.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
#     for x, y in loader:                                           # this node's share of the data
#         optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()
#
# The gradients are reduced in buckets while backward() runs (overlap=True, DDP's design) and
# step() waits for them; accumulate micro-batches under `with optimizer.no_sync():`.
#
# Unchanged torch.distributed programs run too: every training node has MASTER_ADDR,
# MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK set (init_process_group("gloo") works).

def _communicator(comm):
    from ember import collective
    return comm if comm is not None else collective.default()


def _flat_groups(tensors):
    """Groups tensors by dtype, in order: {dtype: [tensor, ...]}."""
    groups = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return groups


def _fused_in_place(tensors, call) -> None:
    """Runs `call(flat)` once per dtype on the tensors packed into one contiguous buffer, then
    copies the result back (a lone contiguous tensor is passed as it is, without a copy)."""
    import torch

    for group in _flat_groups([t for t in tensors if t is not None]).values():
        if len(group) == 1 and group[0].is_contiguous():
            call(group[0].detach())
            continue
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        call(flat)
        offset = 0
        for t in group:
            n = t.numel()
            t.detach().copy_(flat[offset:offset + n].view_as(t))
            offset += n


def allreduce_tensors_(tensors, comm=None, op: str = "average") -> None:
    """Reduces tensors (CPU or CUDA) over the training nodes, in place, one fused call per dtype."""
    comm = _communicator(comm)
    _fused_in_place(tensors, lambda flat: comm.allreduce_(flat, op))


def broadcast_tensors_(tensors, root: int = 0, comm=None) -> None:
    """Overwrites CPU tensors with rank `root`'s, in place, one call per dtype."""
    comm = _communicator(comm)
    _fused_in_place(tensors, lambda flat: comm.broadcast_(flat, root))


def broadcast_parameters(module, root: int = 0, comm=None) -> None:
    """Copies rank `root`'s parameters and buffers (a Module, or a state_dict) to every node."""
    state = module.state_dict() if hasattr(module, "state_dict") and hasattr(module, "parameters") else module
    import torch

    broadcast_tensors_([t for t in state.values() if isinstance(t, torch.Tensor) and t.numel() > 0], root, comm)


def broadcast_optimizer_state(optimizer, root: int = 0, comm=None) -> None:
    """Copies rank `root`'s optimizer state tensors (momentum, Adam moments, ...) to every node.
    Every node must have the same state layout (e.g. after the same number of steps)."""
    import torch

    tensors = [v for state in optimizer.state.values() for v in state.values()
               if isinstance(v, torch.Tensor) and v.numel() > 0]
    broadcast_tensors_(tensors, root, comm)


class _Bucket:
    """Gradients of one dtype reduced as one flat buffer: the params' gradients in order, then one
    used-flag per param (1 where this rank had a gradient), so after the reduction a nonzero flag
    says some rank had one.  The buffer lives as long as the optimizer and is reused."""

    def __init__(self, params):
        import torch

        self.params = params
        self.offsets, n = [], 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        self.numel = n
        # On the params' device: a GPU model's buckets are reduced where they are (staged by the core).
        self.flat = torch.zeros(n + len(params), dtype=params[0].dtype, device=params[0].device)
        self.reset()

    def reset(self) -> None:
        self.filled = [False] * len(self.params)  # this round's gradient (or zeros) is in flat
        self.pending = len(self.params)
        self.work = None

    def segment(self, i: int):
        o = self.offsets[i]
        return self.flat[o:o + self.params[i].numel()].view(self.params[i].shape)

    def fill(self, i: int, grad) -> None:
        """Copies `grad` (None: zeros, flag 0) into param i's place."""
        if grad is None:
            self.segment(i).zero_()
        else:
            self.segment(i).copy_(grad)
        self.flat[self.numel + i] = 0 if grad is None else 1
        self.filled[i] = True
        self.pending -= 1

    def write_back(self) -> None:
        """Reduced gradients into p.grad; a param with no local gradient gets the reduced one
        only where some rank had a gradient (otherwise it stays None, as it is on every rank)."""
        import torch

        flags = self.flat[self.numel:].tolist()
        for i, p in enumerate(self.params):
            if p.grad is not None:
                p.grad.copy_(self.segment(i))
            elif flags[i] != 0:
                p.grad = torch.empty_like(p).copy_(self.segment(i))


class _OverlapReducer:
    """Reduces gradients in buckets from autograd hooks while backward runs (PyTorch DDP's design).

    A round is one reduction of every bucket, in bucket index order on every rank (the
    communicator runs async calls in issue order, so the order is the protocol):

    * a param's post-accumulate-grad hook copies its gradient into its bucket; a bucket whose
      gradients are all in, and whose predecessors have been launched, is launched with
      ``allreduce_async_``;
    * ``finish()`` waits for the launched buckets, then reduces the rest in order with blocking
      calls (they run in this thread, with no hand-off to the communicator's): buckets waiting
      for params that got no gradient, whose missing gradients are taken from ``p.grad`` where
      it exists (``zero_grad(set_to_none=False)``) and are zeros otherwise, with their
      used-flag 0; or every bucket, in a round with no backward pass (gradients set by hand,
      or every backward under ``no_sync()``).  Then it writes the results into ``p.grad``.

    An autograd engine callback counts the backward passes of a round.

    A second backward pass in one round (gradient accumulation without ``no_sync()``) is not
    reduced as it runs: the round's results are thrown away at ``finish()`` and a second round
    reduces the accumulated ``p.grad``.  Every rank must run the same number of backward passes
    between two steps (as under DDP).  Not thread-safe: one training thread."""

    def __init__(self, params, comm, op: str, bucket_cap_mb: float):
        import weakref

        import torch

        if bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb must be positive, got {bucket_cap_mb}")
        self.comm, self.op = comm, op
        self.buckets = self._buckets(params, int(bucket_cap_mb * 1024 * 1024))
        self.where = {id(p): (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self.no_sync = False
        self._reset_round()
        me = weakref.ref(self)  # the hooks must not keep a dropped optimizer alive

        def hook(p):
            reducer = me()
            if reducer is not None:
                reducer._on_grad(p)

        handles = [p.register_post_accumulate_grad_hook(hook) for b in self.buckets for p in b.params]
        weakref.finalize(self, _remove_hooks, handles)
        self._queue_callback = torch.autograd.Variable._execution_engine.queue_callback

    @staticmethod
    def _buckets(params, cap_bytes: int):
        """Params in reverse registration order (the order backward produces their gradients),
        cut into buckets of one dtype and device of about `cap_bytes` (a bucket closes at the param that
        reaches it); buckets are numbered by their first param.  Every rank computes the same
        buckets from the same model."""
        seen, ordered = set(), []
        for p in params:
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                ordered.append(p)
        order, open_, sizes = [], {}, {}
        for p in reversed(ordered):
            kind = (p.dtype, p.device)  # one dtype and one device per bucket
            if kind not in open_:
                open_[kind] = []
                sizes[kind] = 0
                order.append(open_[kind])
            open_[kind].append(p)
            sizes[kind] += p.numel() * p.element_size()
            if sizes[kind] >= cap_bytes:
                del open_[kind]
        return [_Bucket(group) for group in order]

    def _reset_round(self) -> None:
        for b in self.buckets:
            b.reset()
        self.launched = 0           # buckets launched this round (0..launched-1)
        self.passes = 0             # backward passes ended this round
        self.accumulating = False   # a second backward pass came in this round
        self.callback_queued = False

    @property
    def in_round(self) -> bool:
        return (self.launched > 0 or self.passes > 0 or self.callback_queued
                or any(b.pending < len(b.params) for b in self.buckets))

    def _on_grad(self, p) -> None:
        import torch

        if self.no_sync:
            return
        if p.grad is not None and p.grad.is_sparse:
            raise ValueError(_SPARSE_ERROR)
        if self.passes > 0:
            self.accumulating = True
            return
        if not self.callback_queued:
            self._queue_callback(self._end_of_backward)
            self.callback_queued = True
        b, i = self.where[id(p)]
        if b.filled[i]:  # a param twice in one pass cannot happen; a stale round would be a bug
            return
        with torch.no_grad():
            b.fill(i, p.grad)
        self._launch(complete_missing=False)

    def _end_of_backward(self) -> None:
        self.callback_queued = False
        self.passes += 1

    def _launch(self, complete_missing: bool) -> None:
        """Launches buckets in index order, from the first not launched, while they are full,
        asynchronously; with `complete_missing`, every one left, after filling its missing
        gradients, as a blocking call (the caller waits for it anyway)."""
        import torch

        while self.launched < len(self.buckets):
            b = self.buckets[self.launched]
            if b.pending and not complete_missing:
                return
            with torch.no_grad():
                for i, p in enumerate(b.params):
                    if not b.filled[i]:
                        if p.grad is not None and p.grad.is_sparse:
                            raise ValueError(_SPARSE_ERROR)
                        b.fill(i, p.grad)
            if complete_missing:
                self.comm.allreduce_(b.flat, self.op)
            else:
                b.work = self.comm.allreduce_async_(b.flat, self.op)
            self.launched += 1

    def _wait(self) -> None:
        # The async calls first: a blocking call issued with none queued runs in this thread.
        for b in self.buckets:
            if b.work is not None:
                b.work.wait()
                b.work = None
        self._launch(complete_missing=True)

    def finish(self) -> None:
        """Ends the round: every bucket reduced and written into ``p.grad``."""
        import torch

        self._wait()
        if self.accumulating:  # reduce what the passes accumulated, from p.grad
            self._reset_round()
            self._wait()
        with torch.no_grad():
            for b in self.buckets:
                b.write_back()
        self._reset_round()

    def abandon(self) -> None:
        """Ends a round without using it (zero_grad mid-round), so every rank stays in step."""
        if self.in_round:
            self._wait()
        self._reset_round()


def _remove_hooks(handles) -> None:
    for h in handles:
        h.remove()


_SPARSE_ERROR = "DistributedOptimizer: sparse gradients are not supported; use dense embeddings"


class DistributedOptimizer:
    """Wraps a ``torch.optim.Optimizer`` so that every parameter's gradient is averaged over
    the training nodes before it steps.  Everything else is the wrapped optimizer's (attributes
    pass through).

    With ``overlap=True`` gradients are reduced while ``backward()`` still runs,
    as PyTorch's DistributedDataParallel does: the parameters (those with ``requires_grad`` at
    construction) are cut into buckets of one dtype and about ``bucket_cap_mb`` MiB, in reverse
    order (the order backward produces their gradients), and a post-accumulate-grad hook
    launches a bucket's asynchronous allreduce as soon as its gradients are in.  ``step()`` (or
    ``synchronize()``) waits for them and writes the results into ``p.grad``.  The results are
    bit-identical to ``overlap=False`` (each element is reduced in rank order whatever buffer it
    travels in).  What to know:

    * Every rank must run the same number of backward passes between two steps, each reaching at
      least one parameter (as under DDP): the ranks then issue the same buckets in one order.
    * Unused parameters do not hang: ``step()``/``synchronize()`` sends their buckets with zeros
      (and a per-parameter flag), and a parameter no rank had a gradient for keeps
      ``grad=None``; one that some ranks had gets their reduction.  A bucket waiting for an
      unused parameter holds back the buckets after it until then.
    * Gradient accumulation: run the backward passes but the last under ``with opt.no_sync():``
      (hooks off; the last pass reduces the sum).  Several backward passes without it work too,
      but reduce twice (the passes' reduction is thrown away and the sum is reduced at step).
    * Change gradients (clipping) after ``synchronize()``, not between backward and step: the
      reduction started from the gradients as backward left them and overwrites ``p.grad``.
    * ``zero_grad()`` in the middle of a round (backward with no step) finishes its reductions
      and drops them, so every rank stays in step.
    * Parameters not bucketed (added with ``add_param_group`` later, or made trainable later)
      are reduced in ``synchronize()`` the ``overlap=False`` way.

    With ``overlap=False`` (the default: measured faster so far, docs/benchmarks.md: on a CPU
    host the reduction competes with backward for the cores; on an H100 shared by two ranks,
    ResNet-50 took 100 ms a step with overlap and 86 ms without), ``step()`` reduces every
    gradient after backward with one fused allreduce per dtype.  Either way, sparse gradients raise ``ValueError`` (with overlap, from
    ``backward()``).  Overlap needs ``Tensor.register_post_accumulate_grad_hook`` (torch >= 2.1):
    older torch raises ``RuntimeError`` at construction unless ``overlap=False``.

    Args:
        optimizer: the optimizer over this node's model.
        comm: the communicator; the node's default (``ctx.communicator()``) if None.
        op: "average" (data-parallel SGD) or "sum".
        overlap: reduce in buckets during backward (True) or all at once in step() (False);
            None means False (kept for callers that passed it).
        bucket_cap_mb: the bucket size with overlap, MiB (DDP's default 25).
    """

    def __init__(self, optimizer, comm=None, op: str = "average", overlap: Optional[bool] = None,
                 bucket_cap_mb: float = 25.0):
        self.__dict__["_optimizer"] = optimizer
        self.__dict__["_comm"] = comm
        self.__dict__["_op"] = op
        if not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb}")
        overlap = bool(overlap)
        reducer = None
        if overlap:
            import torch

            if not hasattr(torch.Tensor, "register_post_accumulate_grad_hook"):
                raise RuntimeError("DistributedOptimizer(overlap=True) needs torch >= 2.1 "
                                   "(Tensor.register_post_accumulate_grad_hook); pass overlap=False")
            params = [p for group in optimizer.param_groups for p in group["params"]]
            reducer = _OverlapReducer(params, _communicator(comm), op, bucket_cap_mb)
        self.__dict__["_reducer"] = reducer

    def synchronize(self) -> None:
        """Averages the gradients now (step() does it; call this to clip them first).  With
        overlap, waits for the reductions backward started and launches the rest."""
        params = [p for group in self._optimizer.param_groups for p in group["params"]]
        reducer = self._reducer
        if reducer is not None:
            reducer.finish()
            params = [p for p in params if id(p) not in reducer.where]
        grads = [p.grad for p in params if p.grad is not None]
        if grads and any(g.is_sparse for g in grads):
            raise ValueError(_SPARSE_ERROR)
        allreduce_tensors_(grads, self._comm, self._op)
        self.__dict__["_synchronized"] = True

    def step(self, closure=None):
        if not self.__dict__.pop("_synchronized", False):
            self.synchronize()
        return self._optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.__dict__.pop("_synchronized", None)
        if self._reducer is not None:
            self._reducer.abandon()
        self._optimizer.zero_grad(set_to_none=set_to_none)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside do not reduce (gradient accumulation, as DDP's ``no_sync``):
        the first backward after it, or ``step()``, reduces the accumulated gradients."""
        reducer = self._reducer
        if reducer is None:
            yield
            return
        previous, reducer.no_sync = reducer.no_sync, True
        try:
            yield
        finally:
            reducer.no_sync = previous

    def __getattr__(self, name):
        return getattr(self._optimizer, name)

    def __setattr__(self, name, value):
        setattr(self._optimizer, name, value)

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self._optimizer!r})"


class MetricsWriter:
    """TensorBoard scalars of a PyTorch training loop, written by Ember's C++ event writer into
    the node's own directory of the job's ``log_dir`` (``ctx.summary_writer()``)::

        metrics = ember.torch.MetricsWriter()
        for epoch in range(epochs):
            for step, (x, y) in enumerate(loader):
                ...
                metrics.step(global_step, loss=loss.item())       # this node's, batch/<name>
            val = metrics.epoch(epoch, loss=train_loss, val_loss=v)  # the job's, epoch/<name>

    Args:
        writer: an :class:`ember.summary.EventWriter`; default: the node's ``ctx.summary_writer()``.
        comm: the communicator used to average epoch metrics and to tell the chief (the node's
            default if None).
    """

    def __init__(self, writer=None, comm=None):
        self._writer = writer
        self._comm = comm

    def _events(self):
        if self._writer is None:
            from ember import summary
            self._writer = summary.default()
        return self._writer

    def step(self, step: int, **metrics: float) -> None:
        """Writes this node's metrics at ``step``, tagged ``batch/<name>``."""
        writer = self._events()
        for name, value in metrics.items():
            writer.scalar(f"batch/{name}", float(value), int(step))

    def epoch(self, epoch: int, **metrics: float) -> dict:
        """Averages ``metrics`` over the training nodes (every node must call it with the same
        names), writes them on the chief tagged ``epoch/<name>`` at ``epoch``, flushes, and
        returns the averages (the same on every node)."""
        names = sorted(metrics)
        values = np.array([float(metrics[k]) for k in names], dtype=np.float64)
        comm = _communicator(self._comm)
        if values.size:
            comm.allreduce_(values, "average")
        averaged = dict(zip(names, (float(v) for v in values)))
        writer = self._events()
        if comm.rank == 0:
            for name, value in averaged.items():
                writer.scalar(f"epoch/{name}", value, int(epoch))
        writer.flush()
        return averaged


# Checkpoints (ember.checkpoint): state_dicts saved with torch.save and read back with
# torch.load(weights_only=True), so restoring never unpickles arbitrary objects.
_MODEL_BLOB, _OPTIMIZER_BLOB = "model.pt", "optimizer.pt"


def is_chief(comm=None) -> bool:
    """True on training rank 0 (the node that saves); True outside a job."""
    from ember import collective

    if comm is None and collective._default_factory is None:
        return True
    return _communicator(comm).rank == 0


def _manager(directory_or_manager, keep: int = 3, resolve=None):
    from ember.checkpoint import CheckpointManager

    if isinstance(directory_or_manager, CheckpointManager):
        return directory_or_manager
    return CheckpointManager(str(directory_or_manager), keep=keep, resolve=resolve)


def _state_bytes(state) -> bytes:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def save_checkpoint(directory_or_manager, step: int, model, optimizer=None, keep: int = 3,
                    comm=None, resolve=None) -> bool:
    """On the chief only, saves ``model``'s state_dict (and ``optimizer``'s) as checkpoint
    ``step`` of a directory (path, ``file://`` or ``hdfs://`` URI) or an
    ``ember.checkpoint.CheckpointManager``, all or nothing, keeping the newest ``keep``.
    Returns True where it saved, False on the other nodes.  Resume with :func:`load_latest`."""
    if not is_chief(comm):
        return False
    blobs = {_MODEL_BLOB: _state_bytes(model.state_dict())}
    if optimizer is not None:
        blobs[_OPTIMIZER_BLOB] = _state_bytes(optimizer.state_dict())
    _manager(directory_or_manager, keep, resolve).save(int(step), blobs)
    return True


def load_latest(directory_or_manager, model, optimizer=None, resolve=None):
    """Loads the newest complete checkpoint into ``model`` (and ``optimizer``) and returns its
    step, or None (changing nothing) when there is none.  Every node calls it before
    training; tensors are loaded on the CPU with ``weights_only=True``.

    Raises ember.errors.Corruption naming the file if a blob fails its check."""
    import io

    import torch

    restored = _manager(directory_or_manager, resolve=resolve).restore()
    if restored is None:
        return None
    step, blobs = restored
    model.load_state_dict(torch.load(io.BytesIO(blobs[_MODEL_BLOB]), map_location="cpu", weights_only=True))
    if optimizer is not None:
        if _OPTIMIZER_BLOB not in blobs:
            raise ValueError(f"checkpoint step {step} has no optimizer state ({sorted(blobs)})")
        optimizer.load_state_dict(
            torch.load(io.BytesIO(blobs[_OPTIMIZER_BLOB]), map_location="cpu", weights_only=True))
    # A node's stderr reaches the driver's console: a restart shows what it resumed from.
    print(f"ember: restored checkpoint step {step} of {directory_or_manager}", file=sys.stderr, flush=True)
    return step


class AsyncParameters:
    """Asynchronous training of a PyTorch module through parameter-server shards (``ember.ps``):
    the twin of ``ember.keras.AsyncCallback``, with the same algorithms (``"downpour"``,
    ``"adag"``, ``"dynsgd"``, ``"hogwild"``, ``"easgd"``; ``elastic=True`` is ``"easgd"``) and
    consistency knobs (``staleness_bound``, ``ssp``, ``warmup``; ``ember.ps.Exchange``).  Call
    ``step()`` after each ``optimizer.step()``: every `every` steps it exchanges the module's
    weights with the shards.  The first node creates the shards' tensors from its parameters
    and buffers (floating point ones, named by ``state_dict`` keys under `prefix`); every node
    starts from the shards' weights.

        ps = ember.ps.connect(ctx)
        sync = ember.torch.AsyncParameters(model, ps, every=1)
        for x, y in batches:
            opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
            sync.step()
        sync.finish()   # the last push; the model ends with the shards' weights
    """

    def __init__(self, module, ps, every: int = 1, prefix: str = "model/", staleness_bound=None,
                 elastic: bool = False, alpha: float = 0.1, algorithm: Optional[str] = None,
                 ssp: Optional[int] = None, warmup: int = 0, workers: int = 0):
        from ember import ps as _ps

        if not (isinstance(every, int) and every > 0):
            raise ValueError(f"AsyncParameters: every must be a positive int, got {every!r}")
        if algorithm is None:
            algorithm = "easgd" if elastic else "downpour"
        elif elastic and algorithm != "easgd":
            raise ValueError(f"AsyncParameters: algorithm={algorithm!r} contradicts elastic=True")
        self.module, self.ps, self.every, self.prefix = module, ps, every, prefix
        self.exchange = _ps.Exchange(ps, algorithm, window=every, alpha=alpha, staleness_bound=staleness_bound,
                                     ssp=ssp, warmup=warmup, workers=workers)
        self._since = 0
        self._load(self.exchange.start(self._numpy()))

    @property
    def pushes(self) -> int:
        return self.exchange.pushes

    @property
    def rejected(self) -> int:
        return self.exchange.rejected

    def _tensors(self):
        return {self.prefix + k: t for k, t in self.module.state_dict(keep_vars=True).items()
                if t.is_floating_point()}

    def _numpy(self):
        return {name: t.detach().float().cpu().numpy() for name, t in self._tensors().items()}

    def _load(self, values) -> None:
        import torch

        tensors = self._tensors()
        with torch.no_grad():
            for name, a in values.items():
                t = tensors[name]
                t.copy_(torch.from_numpy(a).to(t.device, t.dtype))

    def step(self) -> None:
        """After ``optimizer.step()``: exchanges with the shards every `every` calls."""
        self._since += 1
        if self._since >= self.every:
            self._since = 0
            self._load(self.exchange.exchange(self._numpy()))

    def finish(self) -> None:
        """Pushes what is left since the last exchange (the module ends with the shards'
        weights; easgd: its own) and leaves the clocks."""
        if self._since:
            steps, self._since = self._since, 0
            self._load(self.exchange.exchange(self._numpy(), steps=steps))
        elif self.exchange.algorithm != "easgd":
            self._load(self.exchange.pull())
        self.exchange.finish()
