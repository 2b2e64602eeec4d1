"""Feed into the GPU (issue 20, point 4): batches from host memory to the model's device.

Two figures, each against its ceiling measured in the same run:

* *copy*: large uint8 image batches (``--batch`` x 3x224x224, ResNet-50's input) read in place
  from the real feed's memory -- a node's shared-memory ring (``FeedHost``) that a producer
  (``FeedProducer``, a Spark task's end) filled before the clock starts -- and moved to the GPU by
  ``ember.torch.device_batches`` with the ring page-locked for the pass, as
  ``DataFeed.to_torch_dataset(device="cuda")`` does: one straight copy per batch.  Against the
  bare pinned host-to-device copy of the same bytes (one pinned tensor copied again and again:
  the bus's rate).  Goal: >= 0.8.
* *train*: the Fashion-MNIST CNN (``bench/sync_training.py``'s) trained on batches read from the
  page-locked feed (its default 64 MiB ring, which a producer thread keeps filling during the
  run, as Spark's tasks do), against the same steps on batches already in GPU memory (the
  model's own rate).  Goal: >= 0.9.

Two more contenders run in the same rounds: ``device_batches`` over *pageable* host tensors
(staged through its reused page-locked buffers: batches a ``transform`` makes, and what
``device_batches`` does for user data), and PyTorch's own idiom for the job
(``DataLoader(pin_memory=True)``'s step: ``batch.pin_memory()`` then ``.to(device,
non_blocking=True)``); the CNN fed from pageable memory too.  The time page-locking the ring
takes (``cudaHostRegister``, once per pass) is printed apart.
Medians of ``--repeats`` rounds, the contenders alternating; CPU seconds per batch of this
process; the load average.  ``--device cpu`` runs it on CPU tensors (a machine without a GPU:
nothing is page-locked, and the figures only show that the script works).

Last line: ``gpu_feed_ratio: copy=<x> train=<y> vs_torch=<z>`` (the page-locked feed over its
ceilings, and over PyTorch's own pin_memory()+to()).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "python", REPO / ".torch-site"):  # this checkout's ember; the dev machine's torch
    if _p.is_dir() and str(_p) not in sys.path:
        sys.path.append(str(_p))


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_POOLS = {}


def host_batches(torch, n: int, shape, dtype, seed: int):
    """`n` pageable host batches of `shape`: a pool of four distinct tensors taken in turn, as
    the feed hands out zero-copy views of the memory it reuses (the copy into page-locked
    memory is part of the path measured; making the data is not)."""
    key = (tuple(shape), dtype, seed)
    if key not in _POOLS:
        g = torch.Generator().manual_seed(seed)
        _POOLS[key] = [torch.randint(0, 255, shape, generator=g, dtype=torch.uint8) if dtype == torch.uint8
                       else torch.rand(shape, generator=g) for _ in range(4)]
    pool = _POOLS[key]
    for i in range(n):
        yield pool[i % len(pool)]


def time_copy_ember(torch, device, batches: int, shape, prefetch: int) -> tuple:
    from ember.torch import device_batches

    sync(torch, device)
    c0, t0 = cpu_seconds(), time.perf_counter()
    total = 0
    for b in device_batches(host_batches(torch, batches, shape, torch.uint8, 1), device, prefetch):
        total += b.numel()
    sync(torch, device)
    return time.perf_counter() - t0, cpu_seconds() - c0, total


class FeedSource:
    """The real feed's memory: a node's shared-memory ring (``FeedHost``, as its launcher makes it)
    that a producer (a Spark task's end, ``FeedProducer``) fills with the batches' bytes, and the
    node's consumer reading them in place, page-locked for the pass as
    ``DataFeed.to_torch_dataset(device="cuda")`` does."""

    def __init__(self, torch, nbytes: int, ring_bytes: int):
        import secrets

        import numpy as np

        from ember import _ember

        self.torch, self.nbytes, self._ember = torch, nbytes, _ember
        self.secret = secrets.token_bytes(32)
        self.host = _ember.FeedHost.start(f"ember-bench-{os.getpid()}-{secrets.token_hex(4)}", 0, "worker:0",
                                          "127.0.0.1", "127.0.0.1", self.secret, ring_bytes=ring_bytes)
        self.consumer = _ember.FeedConsumer.open(self.host.endpoint.ring, _ember.ConsumerOptions())
        self.payload = np.random.default_rng(1).integers(0, 255, nbytes, dtype=np.uint8)
        self.partition = 0
        self.locked = False
        self.fits = max(1, int(ring_bytes * 0.45) // (nbytes + 4096))  # under half: no lease revoked

    def producer(self):
        options = self._ember.FeedOptions()
        options.secret = self.secret
        options.idle_timeout = 120.0
        self.partition += 1
        return self._ember.FeedProducer.open([self.host.endpoint], self.partition, 0, 0, options)

    def fill(self, n: int, payload=None) -> None:
        prod = self.producer()
        for _ in range(n):
            prod.send_batch(0, self.payload if payload is None else payload, 1)
        prod.end_partition()

    def fill_in_background(self, n: int, payload=None):
        import threading

        t = threading.Thread(target=self.fill, args=(n, payload), daemon=True)
        t.start()
        return t

    def lock(self) -> float:
        """Page-locks the feed's memory: the seconds it took (cudaHostRegister of the ring, at
        the first read after it)."""
        self.fill(1)
        t0 = time.perf_counter()
        self.consumer.page_lock_rows()
        for _ in self.batches(1, (self.nbytes,), self.torch.uint8):
            pass
        secs = time.perf_counter() - t0
        self.locked = True
        return secs

    def unlock(self) -> None:
        self.consumer.unlock_rows()
        self.locked = False

    def batches(self, n: int, shape, dtype):
        import warnings

        for _ in range(n):
            [r] = self.consumer.next(1, False)
            with warnings.catch_warnings():  # read-only on purpose: the feed's memory
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                t = self.torch.from_numpy(r.ipc()).view(dtype).view(shape)
            yield t

    def close(self) -> None:
        self.consumer.close()
        self.host.close()


def time_copy_feed(torch, device, src: FeedSource, batches: int, shape, prefetch: int) -> tuple:
    """``device_batches`` over batches read in place from the page-locked feed: the batches are in
    the feed's memory before the clock starts (as when Spark's tasks are ahead of the model)."""
    from ember.torch import device_batches

    secs = cpus = 0.0
    total = 0
    left = batches
    while left > 0:  # as many as the ring holds at a time, the fill untimed
        k = min(left, src.fits)
        src.fill(k)
        sync(torch, device)
        c0, t0 = cpu_seconds(), time.perf_counter()
        for b in device_batches(src.batches(k, shape, torch.uint8), device, prefetch):
            total += b.numel()
        sync(torch, device)
        secs, cpus = secs + time.perf_counter() - t0, cpus + cpu_seconds() - c0
        left -= k
    return secs, cpus, total


def time_copy_torch(torch, device, batches: int, shape) -> tuple:
    """PyTorch's own idiom: DataLoader(pin_memory=True)'s pin of each batch, then a
    non_blocking copy (on CPU: the plain .to())."""
    sync(torch, device)
    c0, t0 = cpu_seconds(), time.perf_counter()
    total = 0
    for b in host_batches(torch, batches, shape, torch.uint8, 1):
        if device.type == "cuda":
            b = b.pin_memory()
        out = b.to(device, non_blocking=True)
        total += out.numel()
    sync(torch, device)
    return time.perf_counter() - t0, cpu_seconds() - c0, total


def time_copy_bare(torch, device, batches: int, shape) -> tuple:
    src = torch.empty(shape, dtype=torch.uint8, pin_memory=device.type == "cuda")
    sync(torch, device)
    c0, t0 = cpu_seconds(), time.perf_counter()
    total = 0
    for _ in range(batches):
        out = src.to(device, non_blocking=True)
        total += out.numel()
    sync(torch, device)
    return time.perf_counter() - t0, cpu_seconds() - c0, total


def cnn(nn):
    return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def time_train(torch, device, steps: int, batch: int, fed: bool, prefetch: int, src: "FeedSource" = None) -> tuple:
    """The CNN's steps on batches fed through device_batches (from `src`, the page-locked feed,
    which a producer thread keeps filling as Spark's tasks would, or else from pageable host
    memory), or with `fed` False on batches already in GPU memory."""
    import torch.nn as nn

    from ember.torch import device_batches

    torch.manual_seed(0)
    model = cnn(nn).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    shape = (batch, 1, 28, 28)
    xs = host_batches(torch, steps, shape, torch.float32, 2)
    ys = (torch.randint(0, 10, (batch,)) for _ in range(steps))
    producer = None
    if fed and src is not None:
        payload = next(host_batches(torch, 1, shape, torch.float32, 2)).numpy().view("uint8").reshape(-1)
        producer = src.fill_in_background(steps, payload)
        xs = src.batches(steps, shape, torch.float32)
        data = device_batches(zip(xs, ys), device, prefetch)
    elif fed:
        data = device_batches(zip(xs, ys), device, prefetch)
    else:  # the ceiling: every batch already in device memory before the clock starts
        data = [(x.to(device), y.to(device)) for x, y in zip(xs, ys)]
    sync(torch, device)
    c0, t0 = cpu_seconds(), time.perf_counter()
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
    sync(torch, device)
    elapsed, cpus = time.perf_counter() - t0, cpu_seconds() - c0
    if producer is not None:
        producer.join(timeout=60)
    return elapsed, cpus, steps * batch


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--batch", type=int, default=64, help="images per copy batch (3x224x224 uint8 each)")
    p.add_argument("--batches", type=int, default=200, help="copy batches per round")
    p.add_argument("--train-batch", type=int, default=1024, help="CNN batch size")
    p.add_argument("--steps", type=int, default=300, help="CNN steps per round")
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--ring-mb", type=int, default=1024, help="the copy contender's feed ring, MiB")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="small sizes, 2 repeats")
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.batches, args.train_batch, args.steps, args.repeats, args.ring_mb = 8, 6, 128, 8, 2, 16

    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"gpu_feed: --device {args.device} but torch {torch.__version__} sees no CUDA device; "
                 f"use --device cpu on a machine without a GPU")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    log(f"device {device} ({name}), torch {torch.__version__}, load {os.getloadavg()}")
    shape = (args.batch, 3, 224, 224)
    nbytes = args.batch * 3 * 224 * 224

    rows = {"copy_feed": [], "copy_ember": [], "copy_torch": [], "copy_bare": [], "train_feed": [], "train_fed": [],
            "train_resident": []}
    cpu = {k: [] for k in rows}
    copy_src = FeedSource(torch, nbytes, args.ring_mb << 20)
    train_src = FeedSource(torch, args.train_batch * 28 * 28 * 4, 64 << 20)  # the feed's default ring
    lock_ms = []
    if device.type == "cuda":
        lock_ms = [copy_src.lock() * 1e3, train_src.lock() * 1e3]
        log(f"page-locking the feed's rings took {lock_ms[0]:.1f} ms ({args.ring_mb} MiB) and {lock_ms[1]:.1f} ms "
            f"(64 MiB), with the first read")
    # warm-up: CUDA context, allocator, cuDNN autotuning
    time_copy_feed(torch, device, copy_src, 2, shape, args.prefetch)
    time_copy_ember(torch, device, 2, shape, args.prefetch)
    time_copy_bare(torch, device, 2, shape)
    time_copy_torch(torch, device, 2, shape)
    time_train(torch, device, 3, args.train_batch, True, args.prefetch, train_src)
    time_train(torch, device, 3, args.train_batch, True, args.prefetch)
    time_train(torch, device, 3, args.train_batch, False, args.prefetch)
    for r in range(args.repeats):
        order = [("copy_feed", lambda: time_copy_feed(torch, device, copy_src, args.batches, shape, args.prefetch)),
                 ("copy_ember", lambda: time_copy_ember(torch, device, args.batches, shape, args.prefetch)),
                 ("copy_bare", lambda: time_copy_bare(torch, device, args.batches, shape)),
                 ("copy_torch", lambda: time_copy_torch(torch, device, args.batches, shape)),
                 ("train_feed", lambda: time_train(torch, device, args.steps, args.train_batch, True, args.prefetch,
                                                   train_src)),
                 ("train_fed", lambda: time_train(torch, device, args.steps, args.train_batch, True, args.prefetch)),
                 ("train_resident", lambda: time_train(torch, device, args.steps, args.train_batch, False,
                                                       args.prefetch))]
        if r % 2:
            order = order[3::-1] + order[:3:-1]
        for key, fn in order:
            secs, cpus, units = fn()
            rows[key].append(units / secs)
            cpu[key].append(cpus / (args.batches if key.startswith("copy") else args.steps))
        log(f"round {r + 1}/{args.repeats}: " + ", ".join(f"{k} {rows[k][-1]:.4g}/s" for k in rows))

    copy_src.close()
    train_src.close()
    med = {k: statistics.median(v) for k, v in rows.items()}
    copy_gbs = {k: med[k] / 1e9 for k in ("copy_feed", "copy_ember", "copy_torch", "copy_bare")}  # uint8: bytes
    ratio_copy = med["copy_feed"] / med["copy_bare"]
    ratio_torch = med["copy_feed"] / med["copy_torch"]
    ratio_train = med["train_feed"] / med["train_resident"]
    print(f"\ncopy of {args.batch}x3x224x224 uint8 batches ({nbytes / 1e6:.1f} MB each) to {device}:")
    for key, label in (("copy_feed", "ember feed, page-locked"), ("copy_ember", "ember device_batches, pageable"),
                       ("copy_torch", "torch pin_memory()+to"), ("copy_bare", "bare pinned copy")):
        print(f"  {label:32} {copy_gbs[key]:6.2f} GB/s   CPU {statistics.median(cpu[key]) * 1e3:.2f} ms/batch")
    if lock_ms:
        print(f"  (page-locking the feed's {args.ring_mb} MiB ring, once per pass: {lock_ms[0]:.1f} ms)")
    print(f"Fashion-MNIST CNN, batch {args.train_batch}, on {device}:")
    print(f"  fed from the page-locked feed      {med['train_feed']:,.0f} samples/s")
    print(f"  fed from pageable host memory      {med['train_fed']:,.0f} samples/s")
    print(f"  batches already on device          {med['train_resident']:,.0f} samples/s")
    print(f"goal copy >= 0.8 of pinned: {ratio_copy:.2f} -> {'met' if ratio_copy >= 0.8 else 'NOT met'}; "
          f"goal train >= 0.9 of resident: {ratio_train:.2f} -> {'met' if ratio_train >= 0.9 else 'NOT met'}"
          + ("" if device.type == "cuda" else " (CPU run: not the goal's setting)"))
    print(f"load average {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": str(device), "name": name, "median": med,
                                               "rows": rows, "cpu": cpu}, indent=1))
    print(f"gpu_feed_ratio: copy={ratio_copy:.2f} train={ratio_train:.2f} vs_torch={ratio_torch:.2f}")


if __name__ == "__main__":
    main()
