"""The parameter server (issue 21, in progress; docs/ps.md): shards that hold dense tensors and
sparse embedding tables, updated by the asynchronous algorithms' server-side rules, and the
worker's client.  The core does the work (include/ember/ps.h); this module converts arrays.

    # In a job (Cluster.run(..., num_ps=2)): main_fun on a ps node serves, on a worker connects.
    if ctx.job_name == "ps":
        ember.ps.serve(ctx)                                       # until Cluster.shutdown stops it
    ps = ember.ps.connect(ctx)                                    # every shard of the job

    # Or by hand: ember.ps.Server.start("ps:0", secret); ember.ps.Client.connect(["host:port"], secret)
    ps.create_dense("dense/kernel", w0, rule="add")               # every worker may; first wins
    w, versions = ps.pull("dense/kernel")                         # values (w0's shape), versions
    ps.push("dense/kernel", delta, versions)                      # based on what was pulled
    ps.create_table("emb", dim=64, seed=1, rule="sgd", lr=0.05)
    rows = ps.pull_rows("emb", ids)                               # (len(ids), 64), made on first touch
    ps.push_rows("emb", ids, grads)

Rules: ``assign``, ``add`` (DOWNPOUR / Elephas deltas, Hogwild with ``hogwild=True``), ``sgd``
(``scale_by_staleness=True``: DynSGD), ``adam``, ``elastic`` (EASGD: push the worker's weights,
``result.reply`` is the elastic difference to subtract).  ``staleness_bound=s`` rejects (and
counts) updates based on a version more than s updates old.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from ember import _ember
from ember._names import PS_SHARD_KEY, WORKER_ROLES

RULES = ("assign", "add", "sgd", "adam", "elastic")


def rule_options(rule: str = "sgd", lr: float = 0.01, *, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-7, alpha: float = 0.1, scale_by_staleness: bool = False,
                 staleness_bound: Optional[int] = None, hogwild: bool = False) -> "_ember.PsRuleOptions":
    """A dense tensor's update rule and its knobs (docs/ps.md)."""
    o = _ember.PsRuleOptions()
    o.rule = rule
    o.lr, o.beta1, o.beta2, o.epsilon, o.alpha = lr, beta1, beta2, epsilon, alpha
    o.scale_by_staleness = scale_by_staleness
    o.staleness_bound = -1 if staleness_bound is None else int(staleness_bound)
    o.hogwild = hogwild
    return o


def _floats(x: Any) -> np.ndarray:
    a = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    return a.reshape(-1)


class Server:
    """One shard, served over the job's authenticated TCP transport until ``close()``."""

    def __init__(self, native: "_ember.PsServer") -> None:
        self._native = native

    @classmethod
    def start(cls, name: str, secret: bytes, bind_host: str = "0.0.0.0", port: int = 0) -> "Server":
        return cls(_ember.PsServer.start(name, secret, bind_host=bind_host, port=port))

    @property
    def port(self) -> int:
        return self._native.port

    def stats(self):
        return self._native.stats()

    def snapshot(self) -> Dict[str, bytes]:
        """The shard's state as {name: bytes}, one entry per tensor and table."""
        return self._native.snapshot()

    def restore(self, blobs: Dict[str, bytes]) -> None:
        """Replaces the shard's state with a snapshot's (``ember.errors.Corruption`` naming the
        entry if one is malformed; the shard is then unchanged)."""
        self._native.restore(dict(blobs))

    def checkpoint_to(self, directory: str, every_secs: float = 60.0, keep: int = 3, resolve: Any = None):
        """Restores the latest checkpoint in `directory` (local or ``hdfs://``; Ember's checkpoint
        manager, atomic saves), then saves a snapshot every `every_secs` seconds on a daemon
        thread.  Returns the step restored (None: none there).  ``close()`` saves once more."""
        import threading

        from ember.checkpoint import CheckpointManager

        import json

        # Snapshot names hold '/' (Keras paths); checkpoint blobs are plain names: b0, b1, ...
        # with an index blob mapping them back.
        manager = CheckpointManager(directory, keep=keep, resolve=resolve)
        restored = manager.latest()
        if restored is not None:
            _, saved = manager.restore(restored)
            index = json.loads(bytes(saved["index.json"]).decode())
            self.restore({name: saved[blob] for blob, name in index.items()})
        stop, lock, step = threading.Event(), threading.Lock(), [restored or 0]
        self._checkpoint = (manager, stop, step)

        def save() -> None:  # the interval thread's, save()'s and close()'s: one at a time
            with lock:
                step[0] += 1
                snap = self.snapshot()
                index = {f"b{i}": name for i, name in enumerate(sorted(snap))}
                blobs = {blob: snap[name] for blob, name in index.items()}
                blobs["index.json"] = json.dumps(index).encode()
                manager.save(step[0], blobs)

        def loop() -> None:
            while not stop.wait(every_secs):
                save()

        self._save = save
        threading.Thread(target=loop, name="ember-ps-checkpoint", daemon=True).start()
        return restored

    def save(self) -> None:
        """Saves a checkpoint now (after :meth:`checkpoint_to`)."""
        if getattr(self, "_checkpoint", None) is None:
            raise RuntimeError("ember.ps.Server.save: call checkpoint_to(directory) first")
        self._save()

    def close(self) -> None:
        checkpoint = getattr(self, "_checkpoint", None)
        if checkpoint is not None:
            checkpoint[1].set()
            self._save()  # the updates since the last interval
            self._checkpoint = None
        self._native.close()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Client:
    """A worker's connections to every shard (``"host:port"`` in shard order, the same list on
    every worker).  Calls raise ``ember.errors`` exceptions naming the shard, the tensor and the
    call; a shard that died fails every later call that needs it."""

    def __init__(self, native: "_ember.PsClient") -> None:
        self._native = native
        self._shapes: Dict[str, Tuple[int, ...]] = {}
        self.job_workers = 0  # training nodes of the job (set by connect(ctx)): Exchange's default
        self._dims: Dict[str, int] = {}

    @classmethod
    def connect(cls, shards: Sequence[str], secret: bytes, name: str = "worker", timeout: float = 60.0,
                connect_timeout: float = 60.0, transport: str = "auto",
                ring_bytes: Optional[int] = None) -> "Client":
        """Connects to every shard ("host:port", in shard order).  `transport` "auto": a shard on
        this host is reached through two shared-memory rings of `ring_bytes` each (None: 32 MiB;
        a larger message goes over the connection), the others over TCP; "tcp": TCP only."""
        if transport not in ("auto", "tcp"):
            raise ValueError(f"ember.ps: transport must be 'auto' or 'tcp', not {transport!r}")
        if ring_bytes is not None and ring_bytes <= 0:
            raise ValueError(f"ember.ps: ring_bytes must be positive, not {ring_bytes}")
        return cls(_ember.PsClient.connect(list(shards), secret, name=name, timeout=timeout,
                                           connect_timeout=connect_timeout,
                                           shm_ring_bytes=0 if transport == "tcp" else ring_bytes))

    @property
    def num_shards(self) -> int:
        return self._native.num_shards

    def shared_memory(self, shard: int) -> bool:
        """Whether shard `shard` is reached through shared memory (it runs on this host)."""
        return self._native.shared_memory(shard)

    def create_dense(self, name: str, initial: Any, rule: str = "sgd", **options) -> None:
        """Creates tensor `name` (any shape; float32 on the shards) with `initial` values.
        Creating it again with the same size and rule changes nothing."""
        a = np.asarray(initial, dtype=np.float32)
        self._native.create_dense(name, _floats(a), rule_options(rule, **options))
        self._shapes[name] = a.shape

    def pull(self, name: str, shape: Optional[Tuple[int, ...]] = None, out: Optional[np.ndarray] = None):
        """(values, versions): the tensor's values in its shape (given at create, or `shape`), and
        the versions to hand to the push based on them."""
        shape = tuple(shape) if shape is not None else self._shapes.get(name)
        if out is None:
            if shape is None:
                raise ValueError(f"pull({name!r}): give its shape (this client did not create it)")
            out = np.empty(shape, dtype=np.float32)
        versions = self._native.pull_dense(name, out.reshape(-1))
        return out, versions

    def push(self, name: str, update: Any, versions) -> "_ember.PsPushResult":
        """Applies `update` (the tensor's size) by the tensor's rule, based on `versions` (from
        the pull it was computed from).  ``result.applied`` / ``rejected`` count slices;
        ``result.reply`` holds the elastic difference for the elastic rule."""
        return self._native.push_dense(name, _floats(update), versions)

    def pull_many(self, names: Sequence[str], shapes: Optional[Sequence[Tuple[int, ...]]] = None):
        """Several tensors in one round trip (one request per shard): ([values], [versions]) in
        `names`' order, each in its shape (given at create, or `shapes`)."""
        shapes = list(shapes) if shapes is not None else [self._shapes.get(n) for n in names]
        for name, shape in zip(names, shapes):
            if shape is None:
                raise ValueError(f"pull_many({name!r}): give its shape (this client did not create it)")
        outs = [np.empty(shape, dtype=np.float32) for shape in shapes]
        versions = self._native.pull_dense_many(list(names), [o.reshape(-1) for o in outs])
        return outs, versions

    def push_many(self, names: Sequence[str], updates: Sequence[Any], versions: Sequence[Any]):
        """Several pushes in one round trip: one result per tensor, in order (a shard checks
        every tensor's name and size before it applies any)."""
        return self._native.push_dense_many(list(names), [_floats(u) for u in updates], list(versions))

    def create_table(self, name: str, dim: int, seed: int = 0, init_scale: float = 0.05, rule: str = "sgd",
                     lr: float = 0.01) -> None:
        """Creates the sparse table `name` of `dim`-float rows on every shard."""
        o = _ember.PsTableOptions()
        o.dim, o.seed, o.init_scale, o.rule, o.lr = int(dim), int(seed), float(init_scale), rule, float(lr)
        self._native.create_table(name, o)
        self._dims[name] = int(dim)

    def _dim(self, name: str, dim: Optional[int]) -> int:
        dim = dim if dim is not None else self._dims.get(name)
        if dim is None:
            raise ValueError(f"table {name!r}: give dim= (this client did not create it)")
        return int(dim)

    def pull_rows(self, name: str, ids: Any, dim: Optional[int] = None) -> np.ndarray:
        """The rows of `ids` (any int sequence; repeats allowed) as a (len(ids), dim) array."""
        d = self._dim(name, dim)
        ids = np.ascontiguousarray(np.asarray(ids, dtype=np.int64).reshape(-1))
        out = np.empty((ids.size, d), dtype=np.float32)
        self._native.pull_rows(name, ids, d, out.reshape(-1))
        return out

    def push_rows(self, name: str, ids: Any, update: Any, dim: Optional[int] = None) -> None:
        """Applies one (dim,) update per id by the table's rule (a repeated id: each in turn)."""
        d = self._dim(name, dim)
        ids = np.ascontiguousarray(np.asarray(ids, dtype=np.int64).reshape(-1))
        self._native.push_rows(name, ids, d, _floats(update))

    def stats(self):
        """Every shard's counters: pushes applied and rejected, the staleness histogram, rows."""
        return self._native.stats()

    def clock(self, clock: int, staleness: Optional[int] = None, warmup: int = 0, workers: int = 0):
        """SSP / BSP: ticks this worker to `clock` (its iteration count) and waits until the
        slowest live worker is at least ``clock - bound``: bound 0 (BSP) while ``clock <=
        warmup``, then `staleness` (None: fully asynchronous, no wait).  Nobody passes before
        `workers` distinct workers ticked.  Returns the clock result: ``.clock`` is the clock to
        continue from (a worker joining late starts at the slowest live worker's), ``.min_clock``
        the slowest's, ``.waited_us`` the wait.  The wait has the call timeout; its error names
        the slowest worker.  Shard 0 keeps the clocks."""
        return self._native.clock(int(clock), -1 if staleness is None else int(staleness), int(warmup), int(workers))

    def leave(self) -> None:
        """This worker has ended: the others no longer wait for it at their clocks.  (A worker
        whose connection drops, e.g. its process died, leaves by itself.)"""
        self._native.leave()


ALGORITHMS = ("downpour", "adag", "dynsgd", "hogwild", "easgd")


class Exchange:
    """The worker's half of the asynchronous algorithms over named float32 arrays: what
    ``ember.keras.AsyncCallback`` and ``ember.torch.AsyncParameters`` do with their model's
    weights (docs/ps.md).  Every `window` local steps the worker calls :meth:`exchange` with its
    weights and continues from the arrays it returns:

    * ``downpour``: pushes the delta (weights - weights pulled), added on the shards; pulls.
    * ``adag``: the delta divided by `window` (dist-keras's ADAG normalisation); pulls.
    * ``dynsgd``: the delta, scaled on the shards by 1 / (staleness + 1); pulls.
    * ``hogwild``: the delta, added with no lock on the shards; pulls.
    * ``easgd`` (EASGD / AEASGD; EAMSGD with a momentum optimizer locally): pushes the weights;
      the shards move by ``alpha * (local - center)`` and the worker by the same amount back;
      no pull.

    ``average=True`` (every algorithm but easgd) divides the pushed delta by `workers` as well:
    a round of exchanges moves the shards by the workers' mean delta, not their sum (model
    averaging).  Summed deltas overshoot wherever each worker's window already reaches the
    loss's valley floor, so the shards' weights swing between exchanges; while the workers
    exchange in step (``ssp``, BSP, or equal speeds) that swing is where training ends
    (docs/ps.md, Consistency).

    ``staleness_bound=s`` drops (and counts) pushes based on weights more than s updates old.
    ``ssp=s`` makes a worker wait at each exchange until the slowest is at most s exchanges
    behind (``ssp=0``: BSP); ``warmup=n`` makes the first n exchanges synchronous whatever
    `ssp` (TensorSpark's warm-up).  `workers`: how many workers must have started before any
    passes its first clock (default: the job's training nodes, for a client from
    :func:`connect`).  A worker that ends calls :meth:`finish`; one that dies is dropped from
    the clocks when its connection closes, and a replacement joins at the slowest's clock.
    """

    def __init__(self, ps: Client, algorithm: str = "downpour", window: int = 1, alpha: float = 0.1,
                 staleness_bound: Optional[int] = None, ssp: Optional[int] = None, warmup: int = 0,
                 workers: int = 0, average: bool = False) -> None:
        if algorithm not in ALGORITHMS:
            raise ValueError(f"ember.ps: algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
        if not (isinstance(window, int) and window > 0):
            raise ValueError(f"ember.ps: window must be a positive int, got {window!r}")
        if ssp is not None and ssp < 0:
            raise ValueError(f"ember.ps: ssp must be >= 0 (0: BSP) or None, got {ssp!r}")
        if warmup < 0:
            raise ValueError(f"ember.ps: warmup must be >= 0, got {warmup!r}")
        self.ps, self.algorithm, self.window, self.alpha = ps, algorithm, window, alpha
        self.staleness_bound, self.ssp, self.warmup = staleness_bound, ssp, warmup
        self.workers = workers or getattr(ps, "job_workers", 0)
        if average and algorithm == "easgd":
            raise ValueError("ember.ps: average divides a delta; easgd pushes weights (its alpha sets the step)")
        if average and self.workers < 1:
            raise ValueError("ember.ps: average=True needs the number of workers (workers=, or a client from "
                             "ember.ps.connect(ctx))")
        self.average = average
        self.pushes = self.rejected = 0
        self.clock = 0
        self.waited_secs = 0.0
        self._base: Dict[str, Tuple[np.ndarray, Any]] = {}
        self._clocked = ssp is not None or warmup > 0

    def start(self, named: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """Creates the tensors from `named` (the first worker's values win) and returns the
        shards' values to start from."""
        rule = "elastic" if self.algorithm == "easgd" else "add"
        for name, a in named.items():
            self.ps.create_dense(name, a, rule=rule, alpha=self.alpha, staleness_bound=self.staleness_bound,
                                 hogwild=self.algorithm == "hogwild",
                                 scale_by_staleness=self.algorithm == "dynsgd")
        if self._clocked:  # the start is clock 0: a late joiner learns where the others are
            self.clock = self.ps.clock(0, self.ssp, self.warmup, self.workers).clock
        return self._pull(named)

    def _pull(self, named: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        names = list(named)
        values, versions = self.ps.pull_many(names, [np.shape(named[n]) for n in names])  # one round trip
        out = {}
        for name, v, ver in zip(names, values, versions):
            self._base[name] = (v, ver)
            out[name] = v
        return out

    def exchange(self, named: Dict[str, np.ndarray], steps: Optional[int] = None) -> Dict[str, np.ndarray]:
        """Pushes what `named` (the worker's weights now) changed over `steps` local steps
        (default `window`), ticks the clock (SSP/BSP), and returns the weights to continue
        from."""
        out = {}
        names = list(named)
        locals_ = [np.asarray(named[n], dtype=np.float32) for n in names]
        if self.algorithm == "easgd":
            updates = locals_
        else:
            updates = [local - self._base[n][0] for n, local in zip(names, locals_)]
            divisor = (steps or self.window if self.algorithm == "adag" else 1) * (self.workers if self.average else 1)
            if divisor != 1:
                for u in updates:
                    u /= divisor
        results = self.ps.push_many(names, updates, [self._base[n][1] for n in names])  # one round trip
        for name, local, result in zip(names, locals_, results):
            if self.algorithm == "easgd":
                moved = local - np.asarray(result.reply, dtype=np.float32).reshape(local.shape)
                self._base[name] = (moved, result.versions)
                out[name] = moved
            self.pushes += 1
            self.rejected += result.rejected
        if self._clocked:
            r = self.ps.clock(self.clock + 1, self.ssp, self.warmup, self.workers)
            self.clock = r.clock
            self.waited_secs += r.waited_us / 1e6
        return out if self.algorithm == "easgd" else self._pull(named)

    def pull(self, named: Optional[Dict[str, np.ndarray]] = None) -> Dict[str, np.ndarray]:
        """The shards' values now (every algorithm but easgd continues from them): of the arrays
        `named` names, in their shapes, or by default of every array :meth:`start` was given."""
        if named is None:
            named = {name: base for name, (base, _) in self._base.items()}
        return self._pull(named)

    def finish(self) -> None:
        """This worker is done: the others stop waiting for it at their clocks."""
        if self._clocked:
            self.ps.leave()


def serve(ctx, block: bool = True, port: int = 0, checkpoint_dir: Optional[str] = None,
          checkpoint_secs: float = 60.0) -> Server:
    """Serves this ps node's shard (``ps:<task_index>``) in a job started with ``num_ps`` and
    publishes its address for :func:`connect`.  Call it from ``main_fun`` on the ps nodes (with
    ``driver_ps_nodes=True`` they run on the driver's host).  Blocks until the node is stopped
    (``Cluster.shutdown`` stops the ps nodes, as TFoS did), unless `block` is False: then it
    returns the Server.  The shard listens on the node's bind address; peers must prove the
    job's secret.  With `checkpoint_dir` the shard restores its latest checkpoint there
    (``<checkpoint_dir>/ps-<task_index>``) before serving and saves one every `checkpoint_secs`
    seconds: a ps node restarted under ``max_restarts`` resumes from it (updates since the last
    save are lost)."""
    if ctx.job_name != "ps":
        raise ValueError(f"ember.ps.serve: {ctx.job_name}:{ctx.task_index} is not a ps node "
                         f"(workers call ember.ps.connect(ctx))")
    host, _, _ = ctx.cluster_spec["ps"][ctx.task_index].rpartition(":")
    _, _, secret, _ = ctx._coordinator
    bind = getattr(ctx._node, "bind_host", "") or "0.0.0.0"
    server = Server.start(f"ps:{ctx.task_index}", secret, bind_host=bind, port=port)
    if checkpoint_dir:
        server.checkpoint_to(f"{checkpoint_dir.rstrip('/')}/ps-{ctx.task_index}", every_secs=checkpoint_secs)
    ctx._coordinator_client().kv_set(PS_SHARD_KEY.format(task_index=ctx.task_index),
                                     f"{host}:{server.port}".encode())
    if not block:
        return server
    import time
    while True:  # the node's process ends when the driver stops it
        time.sleep(3600)


def connect(ctx, timeout: float = 600.0, call_timeout: float = 60.0, transport: str = "auto",
            ring_bytes: Optional[int] = None) -> Client:
    """A :class:`Client` to every shard of the job (its ``num_ps`` ps nodes, in task order),
    waiting up to `timeout` seconds for each to be served (:func:`serve`).  Shards on this
    node's host are reached through shared memory unless `transport` is "tcp"
    (:meth:`Client.connect`)."""
    import ember.errors

    num_ps = len(ctx.cluster_spec.get("ps", []))
    if num_ps == 0:
        raise ValueError("ember.ps.connect: the job has no ps nodes (Cluster.run(..., num_ps=k))")
    _, _, secret, _ = ctx._coordinator
    client = ctx._coordinator_client()
    addresses = []
    for i in range(num_ps):
        try:
            addresses.append(client.kv_get(PS_SHARD_KEY.format(task_index=i), timeout).decode())
        except ember.errors.DeadlineExceeded as e:
            raise ember.errors.DeadlineExceeded(
                f"ember.ps.connect: ps node ps:{i} ({ctx.cluster_spec['ps'][i]}) did not serve its shard "
                f"within {timeout:.0f} s: does main_fun call ember.ps.serve(ctx) on ps nodes?") from e
    ps = Client.connect(addresses, secret, name=f"{ctx.job_name}:{ctx.task_index}", timeout=call_timeout,
                        connect_timeout=timeout, transport=transport, ring_bytes=ring_bytes)
    ps.job_workers = sum(len(ctx.cluster_spec.get(role, [])) for role in WORKER_ROLES)
    return ps
