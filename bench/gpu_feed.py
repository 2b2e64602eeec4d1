"""Feed into the GPU (issue 20, point 4): batches from host memory to the model's device.

Two figures, each against its ceiling measured in the same run:

* *copy*: ``ember.torch.device_batches`` (reused page-locked buffers, ``non_blocking`` copies on a
  side stream, ``--prefetch`` batches ahead) moving large uint8 image batches (``--batch`` x
  3x224x224, ResNet-50's input) to the GPU, against the bare pinned host-to-device copy of the
  same bytes (one pinned tensor copied again and again: the bus's rate).  Goal: >= 0.8.
* *train*: the Fashion-MNIST CNN (``bench/sync_training.py``'s) trained on batches handed from
  host memory through ``device_batches``, against the same steps on batches already in GPU
  memory (the model's own rate).  Goal: >= 0.9.

The host batches come as the feed hands them out: pageable tensors that are zero-copy views of
memory the feed reuses (``DataFeed.to_torch_dataset(..., device="cuda")`` is this path), here a
pool of four distinct tensors taken in turn.  A third contender, *torch*, is PyTorch's own idiom
for the same job (``DataLoader(pin_memory=True)``'s step: ``batch.pin_memory()`` then
``.to(device, non_blocking=True)``), run in the same rounds.
Medians of ``--repeats`` rounds, the contenders alternating; CPU seconds per batch of this
process; the load average.  ``--device cpu`` runs it on CPU tensors (a machine without a GPU:
the figures then only show that the script works).

Last line: ``gpu_feed_ratio: copy=<x> train=<y> vs_torch=<z>`` (Ember over its ceilings, and over
PyTorch's own pin_memory()+to()).
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


def time_train(torch, device, steps: int, batch: int, fed: bool, prefetch: int) -> tuple:
    import torch.nn as nn

    from ember.torch import device_batches

    torch.manual_seed(0)
    model = cnn(nn).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    xs = host_batches(torch, steps, (batch, 1, 28, 28), torch.float32, 2)
    ys = (torch.randint(0, 10, (batch,)) for _ in range(steps))
    if fed:
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
    return time.perf_counter() - t0, cpu_seconds() - c0, steps * batch


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--batch", type=int, default=64, help="images per copy batch (3x224x224 uint8 each)")
    p.add_argument("--batches", type=int, default=200, help="copy batches per round")
    p.add_argument("--train-batch", type=int, default=1024, help="CNN batch size")
    p.add_argument("--steps", type=int, default=300, help="CNN steps per round")
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="small sizes, 2 repeats")
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.batches, args.train_batch, args.steps, args.repeats = 8, 6, 128, 8, 2

    import torch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"gpu_feed: --device {args.device} but torch {torch.__version__} sees no CUDA device; "
                 f"use --device cpu on a machine without a GPU")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    log(f"device {device} ({name}), torch {torch.__version__}, load {os.getloadavg()}")
    shape = (args.batch, 3, 224, 224)
    nbytes = args.batch * 3 * 224 * 224

    rows = {"copy_ember": [], "copy_torch": [], "copy_bare": [], "train_fed": [], "train_resident": []}
    cpu = {k: [] for k in rows}
    # warm-up: CUDA context, allocator, cuDNN autotuning
    time_copy_ember(torch, device, 2, shape, args.prefetch)
    time_copy_bare(torch, device, 2, shape)
    time_copy_torch(torch, device, 2, shape)
    time_train(torch, device, 3, args.train_batch, True, args.prefetch)
    time_train(torch, device, 3, args.train_batch, False, args.prefetch)
    for r in range(args.repeats):
        order = [("copy_ember", lambda: time_copy_ember(torch, device, args.batches, shape, args.prefetch)),
                 ("copy_bare", lambda: time_copy_bare(torch, device, args.batches, shape)),
                 ("copy_torch", lambda: time_copy_torch(torch, device, args.batches, shape)),
                 ("train_fed", lambda: time_train(torch, device, args.steps, args.train_batch, True, args.prefetch)),
                 ("train_resident", lambda: time_train(torch, device, args.steps, args.train_batch, False,
                                                       args.prefetch))]
        if r % 2:
            order = [order[2], order[1], order[0], order[4], order[3]]
        for key, fn in order:
            secs, cpus, units = fn()
            rows[key].append(units / secs)
            cpu[key].append(cpus / (args.batches if key.startswith("copy") else args.steps))
        log(f"round {r + 1}/{args.repeats}: " + ", ".join(f"{k} {rows[k][-1]:.4g}/s" for k in rows))

    med = {k: statistics.median(v) for k, v in rows.items()}
    copy_gbs = {k: med[k] / 1e9 for k in ("copy_ember", "copy_torch", "copy_bare")}  # uint8: bytes
    ratio_copy = med["copy_ember"] / med["copy_bare"]
    ratio_torch = med["copy_ember"] / med["copy_torch"]
    ratio_train = med["train_fed"] / med["train_resident"]
    print(f"\ncopy of {args.batch}x3x224x224 uint8 batches ({nbytes / 1e6:.1f} MB each) to {device}:")
    print(f"  ember device_batches   {copy_gbs['copy_ember']:.2f} GB/s   CPU {statistics.median(cpu['copy_ember']) * 1e3:.2f} ms/batch")
    print(f"  torch pin_memory()+to  {copy_gbs['copy_torch']:.2f} GB/s   CPU {statistics.median(cpu['copy_torch']) * 1e3:.2f} ms/batch")
    print(f"  bare pinned copy       {copy_gbs['copy_bare']:.2f} GB/s   CPU {statistics.median(cpu['copy_bare']) * 1e3:.2f} ms/batch")
    print(f"Fashion-MNIST CNN, batch {args.train_batch}, on {device}:")
    print(f"  fed through device_batches  {med['train_fed']:,.0f} samples/s")
    print(f"  batches already on device   {med['train_resident']:,.0f} samples/s")
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
