"""Keras integration: synchronous data-parallel ``model.fit`` on N nodes, and progress
reports to the driver.

A single-process Keras program becomes a distributed one with a wrapper around the
optimizer and one callback (Horovod's recipe, on Ember's collectives)::

    model.compile(optimizer=ember.keras.DistributedOptimizer(keras.optimizers.Adam(1e-3)), ...)
    model.fit(ds, epochs=5, callbacks=[ember.keras.SyncCallback()],
              verbose=ember.keras.verbose(2))

* ``DistributedOptimizer`` averages every step's gradients over the training nodes
  before the optimizer applies them (one fused allreduce per step, inside the
  ``tf.function`` that Keras compiles; on Keras's PyTorch backend, ``KERAS_BACKEND=torch``,
  on the torch gradient tensors in place, CUDA ones included), so every node keeps the same
  weights.
* ``SyncCallback`` broadcasts the chief's initial weights when training starts and
  averages the epoch's metrics (training and validation) at each epoch's end, so every
  node's logs, ``EarlyStopping`` and ``ModelCheckpoint`` see the job's figures.
* ``verbose(v)`` / ``is_chief()``: only the chief prints progress and saves.
* ``StopFeedCallback(feed)`` ends an InputMode.SPARK node's feed when ``fit`` stops early
  (``EarlyStopping``): the driver then stops feeding at the next epoch boundary.
* ``SummaryCallback`` writes TensorBoard scalars (per-node batch metrics; the job's epoch
  metrics, validation included, from the chief) with Ember's event writer.
* ``CheckpointCallback(dir)`` saves weights and optimizer state on the chief at epoch
  ends; ``restore_latest(model, dir)`` on every node before ``fit`` returns the
  ``initial_epoch`` to resume from.
* ``AsyncCallback(ps)`` trains asynchronously through parameter-server shards instead
  (``ember.ps``; DOWNPOUR / Elephas's asynchronous mode, or EASGD): no DistributedOptimizer,
  and no node waits for another.

Every node must run the same number of steps per epoch (InputMode.SPARK's
``epoch_batches`` / ``to_tf_dataset`` guarantee it; in InputMode.TENSORFLOW shard the
data equally, e.g. ``tf.data.Dataset.from_tensor_slices((x[rank::n], y[rank::n]))
.shuffle(...).batch(b, drop_remainder=True)`` cut to the smallest shard's batch count: Keras
3.15's ``fit`` on numpy arrays with ``steps_per_epoch`` does not restart the arrays each epoch
and stops with "Your input ran out of data").  Works with Keras 3's TensorFlow backend.

Importing this module imports Keras; ``import ember`` alone does not.
"""
from __future__ import annotations

import io
import json
import math
import sys
import time
from typing import Any, Callable, Dict, List, Optional

import keras
import numpy as np

from ember import collective
from ember import ps as _ps
from ember.checkpoint import CheckpointManager


class ProgressCallback(keras.callbacks.Callback):
    """Reports training progress to the driver through ``ctx.report``.

    Every `every_n_steps` training batches it sends the global step, the loss
    and the other batch metrics (accuracy, ...), and, when `batch_size` is
    given, the cumulative number of samples (so the driver shows samples/s).
    At each epoch's end it sends the epoch's metrics (including validation ones).

    Args:
        ctx: the node's ember.Context.
        every_n_steps: report every this many batches.
        batch_size: samples per batch on this node, for samples/s; None to omit.
    """

    def __init__(self, ctx: Any, every_n_steps: int = 10, batch_size: Optional[int] = None):
        super().__init__()
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.ctx = ctx
        self.every_n_steps = every_n_steps
        self.batch_size = batch_size
        self._step = 0
        self._epoch = 0

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._step += 1
        if self._step % self.every_n_steps == 0:
            self._report(logs)

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._report(logs, epoch_end=True)

    def _report(self, logs: Optional[Dict[str, Any]], epoch_end: bool = False) -> None:
        metrics: Dict[str, float] = {"epoch": float(self._epoch + (1 if epoch_end else 0)),
                                     "time": time.time()}
        if self.batch_size:
            metrics["samples"] = float(self._step * self.batch_size)
        metrics.update(_finite_metrics(logs))
        loss = metrics.pop("loss", None)
        self.ctx.report(step=self._step, loss=loss, **metrics)


# --------------------------------------------------------------------------- sync training
def _communicator(comm: Optional[collective.Communicator]) -> collective.Communicator:
    return comm if comm is not None else collective.default()


def is_chief(comm: Optional[collective.Communicator] = None) -> bool:
    """True on training rank 0 (the node that prints and saves); True outside a job."""
    if comm is None and collective._default_factory is None:
        return True
    return _communicator(comm).rank == 0


def verbose(level: int = 1, comm: Optional[collective.Communicator] = None) -> int:
    """`level` on the chief, 0 on the other nodes: ``model.fit(..., verbose=ember.keras.verbose(2))``."""
    return level if is_chief(comm) else 0


def _allreduce_numpy(comm_fn: Callable[[], collective.Communicator], op: str, arrays: List[np.ndarray]) -> List[np.ndarray]:
    """One fused allreduce of arrays of one dtype; returns arrays of the same shapes."""
    flat = np.concatenate([np.asarray(a).ravel() for a in arrays]) if arrays else np.empty(0, np.float32)
    comm_fn().allreduce_(flat, op)
    out, offset = [], 0
    for a in arrays:
        out.append(flat[offset:offset + a.size].reshape(a.shape))
        offset += a.size
    return out


def allreduce_gradients(grads: List[Any], comm: Optional[collective.Communicator] = None,
                        op: str = "average") -> List[Any]:
    """The gradients reduced over the training nodes (None stays None), for the Keras backend
    in use: one collective call per dtype (normally one), whatever the number of tensors.

    * TensorFlow: one graph op per dtype inside the ``tf.function`` Keras compiles;
      IndexedSlices are densified.
    * PyTorch (``KERAS_BACKEND=torch``): the gradient tensors reduced in place, CPU or CUDA
      (CUDA tensors go through Ember's GPU paths: NCCL between a host's GPUs, else staged).

    Raises:
        ValueError: another backend (JAX's jitted steps cannot call out to the collectives).
    """
    backend = keras.backend.backend()
    if backend == "torch":
        from ember import torch as ember_torch

        ember_torch.allreduce_tensors_([g for g in grads if g is not None], comm, op)
        return list(grads)
    if backend != "tensorflow":
        raise ValueError(f"ember.keras: Keras backend {backend!r} is not supported for synchronous training; "
                         f"set KERAS_BACKEND to 'tensorflow' or 'torch' before keras is imported")
    import tensorflow as tf

    present = [i for i, g in enumerate(grads) if g is not None]
    dense = [tf.convert_to_tensor(grads[i]) for i in present]
    by_dtype: Dict[Any, List[int]] = {}
    for k, g in enumerate(dense):
        by_dtype.setdefault(g.dtype, []).append(k)
    reduced: List[Any] = [None] * len(dense)
    comm_fn = (lambda: comm) if comm is not None else collective.default
    for dtype, ks in by_dtype.items():
        outs = tf.numpy_function(lambda *a: _allreduce_numpy(comm_fn, op, list(a)), [dense[k] for k in ks],
                                 Tout=[dtype] * len(ks), stateful=True, name="ember_allreduce")
        if not isinstance(outs, (list, tuple)):
            outs = [outs]
        for k, out in zip(ks, outs):
            out.set_shape(dense[k].shape)
            reduced[k] = out
    result = list(grads)
    for k, i in enumerate(present):
        result[i] = reduced[k]
    return result


def DistributedOptimizer(optimizer: "keras.optimizers.Optimizer", comm: Optional[collective.Communicator] = None,
                         op: str = "average", overlap: bool = False,
                         bucket_cap_mb: float = 25.0) -> "keras.optimizers.Optimizer":
    """Makes `optimizer` average every step's gradients over the training nodes before it
    applies them, and returns it (the same object; its class becomes a subclass of its
    own that does the allreduce, so saved models still name the original class).

    Args:
        optimizer: a Keras 3 optimizer (TensorFlow or PyTorch backend, see allreduce_gradients).
        comm: the communicator; the node's default (``ctx.communicator()``) if None.
        op: "average" (the default; data-parallel SGD) or "sum".
        overlap: PyTorch backend only: reduce the gradients in buckets of about
            `bucket_cap_mb` MiB while ``backward()`` still runs (``ember.torch.DistributedOptimizer``'s
            overlap: hooks on the variables' torch tensors, installed when Keras builds the
            optimizer), with the same results bit for bit.  Off by default, as for PyTorch: it
            has not paid on the hosts measured (docs/benchmarks.md).  Keras's TensorFlow step
            computes every gradient in one ``tape.gradient`` call: nothing to overlap there.

    Raises:
        ValueError: overlap on a backend other than PyTorch.
    """
    base = type(optimizer)
    if getattr(base, "_ember_distributed", False):
        return optimizer
    if overlap and keras.backend.backend() != "torch":
        raise ValueError(f"ember.keras.DistributedOptimizer(overlap=True) needs Keras's PyTorch backend "
                         f"(KERAS_BACKEND=torch), not {keras.backend.backend()!r}: Keras's TensorFlow step computes "
                         f"every gradient in one tape.gradient call, so there is nothing to overlap")
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb}")

    def build(self, variables):
        base.build(self, variables)
        if overlap and getattr(self, "_ember_reducer", None) is None:
            from ember import torch as ember_torch

            self._ember_reducer = ember_torch._OverlapReducer([v.value for v in variables],
                                                              ember_torch._communicator(comm), op, bucket_cap_mb)

    def apply(self, grads, trainable_variables=None):
        reducer = getattr(self, "_ember_reducer", None)
        if reducer is None:
            return base.apply(self, allreduce_gradients(list(grads), comm, op), trainable_variables)
        reducer.finish()  # the buckets backward launched, then the rest; results in each p.grad
        variables = trainable_variables if trainable_variables is not None else self._trainable_variables
        return base.apply(self, [v.value.grad for v in variables], trainable_variables)

    cls = type(base.__name__, (base,), {"apply": apply, "build": build, "_ember_distributed": True,
                                          "__module__": base.__module__, "__doc__": base.__doc__})
    optimizer.__class__ = cls
    return optimizer


class SyncCallback(keras.callbacks.Callback):
    """Keeps N nodes' ``model.fit`` in step: broadcasts the chief's weights when training
    starts, and averages the epoch's metrics over the nodes at each epoch's end (before
    later callbacks and the progress bar see them).

    Args:
        comm: the communicator; the node's default (``ctx.communicator()``) if None.
        root: the rank whose initial weights everyone starts from.
    """

    def __init__(self, comm: Optional[collective.Communicator] = None, root: int = 0):
        super().__init__()
        self.comm = comm
        self.root = root

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        comm = _communicator(self.comm)
        weights = self.model.get_weights()
        if weights:
            by_dtype: Dict[Any, List[int]] = {}
            for k, w in enumerate(weights):
                by_dtype.setdefault(w.dtype.str, []).append(k)
            for ks in by_dtype.values():
                flat = np.concatenate([weights[k].ravel() for k in ks])
                comm.broadcast_(flat, self.root)
                offset = 0
                for k in ks:
                    n = weights[k].size
                    weights[k] = flat[offset:offset + n].reshape(weights[k].shape)
                    offset += n
            self.model.set_weights(weights)

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if not logs:
            return
        keys = sorted(k for k, v in logs.items() if _is_number(v))
        if not keys:
            return
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        _communicator(self.comm).allreduce_(values, "average")
        for k, v in zip(keys, values):
            logs[k] = float(v)


class SummaryCallback(keras.callbacks.Callback):
    """TensorBoard scalars of ``model.fit``, written by Ember's C++ event writer into the node's
    own directory of the job's ``log_dir`` (``ctx.summary_writer()``; local or HDFS):

    * every node, every ``every_n_steps`` training batches: its batch metrics, tagged
      ``batch/<metric>`` at step = batches trained so far on this node;
    * the chief, at each epoch's end: the epoch's metrics, validation ones included, tagged
      ``epoch/<metric>`` (``epoch/val_loss``, ...) at step = the epoch's index.

    Put it after :class:`SyncCallback` so the epoch metrics it writes are the job's (averaged
    over the nodes): ``callbacks=[ember.keras.SyncCallback(), ember.keras.SummaryCallback()]``.

    Args:
        every_n_steps: batch metrics every this many batches; 0 for none.
        writer: an :class:`ember.summary.EventWriter`; default: the node's ``ctx.summary_writer()``
            (the job needs ``log_dir=`` or ``tensorboard=True``).
        comm: the communicator that says who the chief is (the node's default if None).
    """

    def __init__(self, every_n_steps: int = 10, writer: Any = None,
                 comm: Optional[collective.Communicator] = None):
        super().__init__()
        if every_n_steps < 0:
            raise ValueError(f"every_n_steps must be >= 0, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.comm = comm
        self._writer = writer
        self._step = 0

    def _events(self) -> Any:
        if self._writer is None:
            from ember import summary
            self._writer = summary.default()
        return self._writer

    def _write(self, prefix: str, logs: Optional[Dict[str, Any]], step: int) -> None:
        writer = self._events()
        for key, value in _finite_metrics(logs).items():
            writer.scalar(f"{prefix}/{key}", value, step)

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._step += 1
        if self.every_n_steps and self._step % self.every_n_steps == 0:
            self._write("batch", logs, self._step)

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if is_chief(self.comm):
            self._write("epoch", logs, epoch)
        self._events().flush()


class StopFeedCallback(keras.callbacks.Callback):
    """Ends the node's InputMode.SPARK feed when ``model.fit`` stops early (``EarlyStopping``,
    or any callback setting ``model.stop_training``), so the driver's ``cluster.train()`` stops
    feeding at the next epoch boundary instead of feeding the remaining epochs into a node that
    no longer reads (``DataFeed.terminate()``).  With :class:`SyncCallback` the nodes see the
    same averaged metrics, so they stop at the same epoch::

        feed = ctx.get_data_feed()
        model.fit(feed.to_tf_dataset(64, "image", "label"), epochs=50,
                  callbacks=[ember.keras.SyncCallback(), keras.callbacks.EarlyStopping(patience=2),
                             ember.keras.StopFeedCallback(feed)])

    Args:
        feed: the node's :class:`ember.feed.DataFeed` (``ctx.get_data_feed()``).
    """

    def __init__(self, feed: Any):
        super().__init__()
        self.feed = feed

    def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if getattr(self.model, "stop_training", False):
            self.feed.terminate()


def _is_number(value: Any) -> bool:
    try:
        float(value)
        return True
    except (TypeError, ValueError):
        return False


def _finite_metrics(logs: Optional[Dict[str, Any]]) -> Dict[str, float]:
    """The finite numbers of Keras's `logs` (what callbacks report and write), as floats."""
    return {k: float(v) for k, v in (logs or {}).items() if _is_number(v) and math.isfinite(float(v))}


# Checkpoints (ember.checkpoint): framework-neutral blobs, numpy arrays in .npz files
# (read with allow_pickle=False) and a JSON note; never a pickle.
_MODEL_BLOB, _OPTIMIZER_BLOB, _META_BLOB = "model.npz", "optimizer.npz", "meta.json"


def _npz_bytes(arrays: List[np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{f"a{k:06d}": np.asarray(a) for k, a in enumerate(arrays)})
    return buf.getvalue()


def _npz_arrays(data: bytes, what: str) -> List[np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        names = sorted(z.files)
        if names != [f"a{k:06d}" for k in range(len(names))]:
            raise ValueError(f"checkpoint {what}: not written by ember.keras (arrays {names[:3]}...)")
        return [z[n] for n in names]


def _optimizer_of(model: "keras.Model"):
    return getattr(model, "optimizer", None)


class CheckpointCallback(keras.callbacks.Callback):
    """Saves a checkpoint at the end of every ``every_n_epochs``-th epoch, on the chief only:
    the model's weights, the optimizer's variables (iterations and slots) and the number of
    epochs done, as checkpoint step = epochs done.  Resume with :func:`restore_latest`::

        initial_epoch = ember.keras.restore_latest(model, "hdfs:///jobs/run1/ckpt")
        model.fit(ds, epochs=10, initial_epoch=initial_epoch,
                  callbacks=[ember.keras.SyncCallback(),
                             ember.keras.CheckpointCallback("hdfs:///jobs/run1/ckpt")])

    A save is all-or-nothing (``ember.checkpoint``); the newest ``keep`` are kept.

    Args:
        directory: a path, ``file://`` or ``hdfs://`` URI.
        keep: complete checkpoints kept.
        every_n_epochs: save after epochs n, 2n, ... (counted from the first epoch, 1-based).
        comm: the communicator deciding the chief; the node's default if None.
        resolve: the core's ResolveOptions; default: from the active SparkContext, else local.
    """

    def __init__(self, directory: str, keep: int = 3, every_n_epochs: int = 1,
                 comm: Optional[collective.Communicator] = None, resolve: Any = None):
        super().__init__()
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be >= 1, not {every_n_epochs}")
        self.directory = str(directory)
        self.keep = keep
        self.every_n_epochs = every_n_epochs
        self.comm = comm
        self._resolve = resolve
        self._manager: Optional[CheckpointManager] = None

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        done = epoch + 1
        if done % self.every_n_epochs or not is_chief(self.comm):
            return
        if self._manager is None:
            self._manager = CheckpointManager(self.directory, keep=self.keep, resolve=self._resolve)
        optimizer = _optimizer_of(self.model)
        blobs = {_MODEL_BLOB: _npz_bytes(self.model.get_weights()),
                 _META_BLOB: json.dumps({"format": 1, "epochs_done": done}).encode()}
        if optimizer is not None:
            blobs[_OPTIMIZER_BLOB] = _npz_bytes([keras.ops.convert_to_numpy(v) for v in optimizer.variables])
        self._manager.save(done, blobs)


def restore_latest(model: "keras.Model", directory: str, resolve: Any = None) -> int:
    """Restores the newest complete checkpoint of ``directory`` into ``model`` (weights) and its
    compiled optimizer (variables; the optimizer is built on the model's trainable variables
    first if it is not yet), and returns the number of epochs it holds: pass it as
    ``model.fit(..., initial_epoch=...)``.  0, changing nothing, when there is no checkpoint.

    Every node calls it before ``fit`` (each reads the same checkpoint); the model must be
    built (its weights exist) and compiled as when it was saved.

    Raises:
        ember.errors.Corruption naming the file if a blob fails its check; ValueError if the
        checkpoint's arrays do not fit the model or optimizer.
    """
    restored = CheckpointManager(directory, resolve=resolve).restore()
    if restored is None:
        return 0
    step, blobs = restored
    weights = _npz_arrays(blobs[_MODEL_BLOB], f"{directory} step {step} {_MODEL_BLOB}")
    current = model.get_weights()
    if len(weights) != len(current) or any(a.shape != b.shape for a, b in zip(weights, current)):
        raise ValueError(f"checkpoint {directory} step {step}: {len(weights)} weight arrays do not fit the "
                         f"model's {len(current)} (is the model built as when it was saved?)")
    model.set_weights(weights)
    optimizer = _optimizer_of(model)
    if optimizer is not None and _OPTIMIZER_BLOB in blobs:
        values = _npz_arrays(blobs[_OPTIMIZER_BLOB], f"{directory} step {step} {_OPTIMIZER_BLOB}")
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        variables = optimizer.variables
        if len(values) != len(variables) or any(tuple(v.shape) != a.shape for v, a in zip(variables, values)):
            raise ValueError(f"checkpoint {directory} step {step}: {len(values)} optimizer arrays do not fit "
                             f"the optimizer's {len(variables)} variables (same optimizer as when saved?)")
        for v, a in zip(variables, values):
            v.assign(a)
    epochs = int(json.loads(blobs[_META_BLOB])["epochs_done"])
    # A node's stderr reaches the driver's console: a restart shows what it resumed from.
    print(f"ember: restored checkpoint step {step} of {directory} ({epochs} epochs done)", file=sys.stderr, flush=True)
    return epochs


class AsyncCallback(keras.callbacks.Callback):
    """Asynchronous training through parameter-server shards (``ember.ps``): the seeds'
    DOWNPOUR (Elephas's ``mode="asynchronous"``), ADAG, DynSGD, Hogwild and EASGD.

    Every `frequency` ("batch" or "epoch", Elephas's knob; or an int: every that many batches,
    dist-keras's communication window) the node exchanges its weights with the shards by
    `algorithm` (``ember.ps.Exchange``, docs/ps.md): ``"downpour"`` (the default) pushes the
    delta (weights now - weights pulled), which the shards add, and continues from the weights
    it pulls; ``"adag"`` divides the delta by the window; ``"dynsgd"`` has the shards scale it
    by 1 / (staleness + 1); ``"hogwild"`` adds it without a lock (Elephas's ``mode="hogwild"``;
    also ``hogwild=True``); ``"easgd"`` (also ``elastic=True``; moving rate `alpha`) pushes the
    weights, the shards move by ``alpha * (local - center)`` and the node back by as much.

    Consistency: fully asynchronous by default; ``staleness_bound=s`` drops (and counts)
    pushes based on weights more than s updates old; ``ssp=s`` holds a node at each exchange
    until the slowest is at most s exchanges behind (``ssp=0``: BSP); ``warmup=n`` makes the
    first n exchanges synchronous.  A node that ends leaves the clocks; one that dies is
    dropped when its connection closes.  ``average=True`` divides each pushed delta by the
    number of workers (`workers`, default the job's training nodes): the shards move by the
    nodes' mean delta, not their sum; with ``ssp`` (nodes in step) summed deltas overshoot and
    training ends on a swinging model (docs/ps.md, Consistency).

    The first node to start creates the shards' tensors from its initial weights (the others'
    creates change nothing), so every node starts from the same weights.  Every float weight of
    the model is shared, named by its Keras path under `prefix`.  ``pushes`` / ``rejected``
    count this node's pushes (per variable); ``ps.stats()`` gives the shards' staleness
    histogram.

        ps = ember.ps.connect(ctx)
        model.fit(ds, epochs=5, callbacks=[ember.keras.AsyncCallback(ps, frequency="batch")])
    """

    def __init__(self, ps: "_ps.Client", frequency: Any = "batch", prefix: str = "model/",
                 staleness_bound: Optional[int] = None, elastic: bool = False, alpha: float = 0.1,
                 hogwild: bool = False, algorithm: Optional[str] = None, ssp: Optional[int] = None,
                 warmup: int = 0, workers: int = 0, average: bool = False):
        super().__init__()
        if frequency == "batch":
            self._every = 1
        elif frequency == "epoch":
            self._every = None
        elif isinstance(frequency, int) and frequency > 0:
            self._every = frequency
        else:
            raise ValueError(f"AsyncCallback: frequency must be 'batch', 'epoch' or a positive int, got {frequency!r}")
        if hogwild and elastic:
            raise ValueError("AsyncCallback: hogwild (lock-free adds) and elastic do not combine")
        if algorithm is None:
            algorithm = "easgd" if elastic else "hogwild" if hogwild else "downpour"
        elif (elastic and algorithm != "easgd") or (hogwild and algorithm != "hogwild"):
            raise ValueError(f"AsyncCallback: algorithm={algorithm!r} contradicts elastic/hogwild")
        self.ps, self.prefix = ps, prefix
        self.exchange = _ps.Exchange(ps, algorithm, window=self._every or 1, alpha=alpha,
                                     staleness_bound=staleness_bound, ssp=ssp, warmup=warmup, workers=workers,
                                     average=average)
        self._since = 0

    @property
    def pushes(self) -> int:
        return self.exchange.pushes

    @property
    def rejected(self) -> int:
        return self.exchange.rejected

    def _variables(self):
        # float weights only: a layer's seed-generator state (Dropout) is an integer variable
        return {self.prefix + v.path: v for v in self.model.weights if "float" in str(v.dtype)}

    def _load(self, values: Dict[str, np.ndarray]) -> None:
        variables = self._variables()
        for name, a in values.items():
            v = variables[name]
            v.assign(a.astype(v.dtype) if a.dtype != v.dtype else a)

    def _exchange(self) -> None:
        steps, self._since = self._since, 0
        now = {name: np.asarray(v.numpy(), dtype=np.float32) for name, v in self._variables().items()}
        self._load(self.exchange.exchange(now, steps=steps or None))

    def on_train_begin(self, logs: Optional[Dict[str, Any]] = None) -> None:
        self._load(self.exchange.start({name: np.asarray(v.numpy(), dtype=np.float32)
                                        for name, v in self._variables().items()}))

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._since += 1
        if self._every is not None and self._since >= self._every:
            self._exchange()

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        if self._every is None:
            self._exchange()

    def on_train_end(self, logs: Optional[Dict[str, Any]] = None) -> None:
        if self._since:
            self._exchange()  # ends with the shards' weights (easgd: its own)
        elif self.exchange.algorithm != "easgd":  # the model ends with the shards' weights
            self._load(self.exchange.pull())
        self.exchange.finish()
