"""Synchronous training on GPUs (issue 20, point 3): ``ember.torch.DistributedOptimizer`` vs DDP.

Ranks are processes (multiprocessing spawn) sharing the GPU, as two nodes on one GPU would
(``gpus_per_node=0.5``); each trains the same model on its own synthetic batches, in rotating
blocks of ``--steps`` steps, four ways:

* *local*: no synchronisation (the ceiling),
* *fused*: ``DistributedOptimizer(overlap=False)``: one reduction per dtype in ``step()``,
* *overlap*: ``DistributedOptimizer(overlap=True)``: buckets reduced while backward runs,
* *ddp*: ``torch.nn.parallel.DistributedDataParallel`` over gloo (NCCL refuses two ranks on one
  GPU: "Duplicate GPU detected").

Models: ``cnn`` (the Fashion-MNIST CNN, 0.9 MB of gradients) and ``resnet50`` (torchvision, 102 MB of
gradients; bfloat16 autocast, channels_last) where torchvision imports.  A block's time is the
slower rank's; medians over blocks.  *hidden* = (fused - overlap) / (fused - local): the share of
the fused path's synchronisation time that overlap hides.  Goals: Ember (the better of fused and
overlap) >= 1.1x DDP-gloo samples/s; hidden >= 0.5.  ``--device cpu`` runs the same on CPU (a
machine without a GPU: only checks the script).

Last line: ``gpu_training: <model> ember_vs_ddp=<x> hidden=<y> ...`` for each model.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for _p in (REPO / "python", REPO / ".torch-site"):  # this checkout's ember; the dev machine's torch
    if _p.is_dir() and str(_p) not in sys.path:
        sys.path.append(str(_p))

MODES = ("local", "fused", "overlap", "ddp")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(model_name: str, torch, nn):
    if model_name == "cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)), (1, 28, 28)
    import torchvision
    return torchvision.models.resnet50(num_classes=1000), (3, 224, 224)


def rank_main(rank, size, device, coord_port, secret, gloo_port, plan, results, shm_threads=0):
    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch
        import torch.distributed as dist
        import torch.nn as nn

        import ember.torch
        from ember import _ember
        from ember.collective import Communicator, communicator_options

        dev = torch.device("cuda:0" if device == "cuda" else "cpu")
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        store = _ember.CollectiveStore.coordinator("127.0.0.1", coord_port, secret, 60.0)
        options = communicator_options(timeout=300, connect_timeout=60)
        options.rank, options.size, options.secret, options.prefix = rank, size, secret, "bench-gpu-training"
        options.shm_threads = shm_threads  # 0: the core's default (usable cores / ranks, at most 8)
        comm = Communicator(_ember.Communicator.create(options, store))
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{gloo_port}", rank=rank, world_size=size)

        def sync():
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        out = {}
        for model_name, batch, steps, blocks in plan:
            torch.manual_seed(0)
            base, shape = build(model_name, torch, nn)
            g = torch.Generator(device=dev).manual_seed(rank)
            x = torch.randn((batch, *shape), generator=g, device=dev)
            y = torch.randint(0, 10, (batch,), generator=g, device=dev)
            big = model_name != "cnn"
            if big and dev.type == "cuda":
                x = x.to(memory_format=torch.channels_last)
            runs = {}
            for mode in MODES:
                model = build(model_name, torch, nn)[0].to(dev)
                if big and dev.type == "cuda":
                    model = model.to(memory_format=torch.channels_last)
                model.load_state_dict(base.state_dict())
                opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
                if mode in ("fused", "overlap"):
                    opt = ember.torch.DistributedOptimizer(opt, comm=comm, overlap=mode == "overlap")
                if mode == "ddp":
                    model = nn.parallel.DistributedDataParallel(model)
                runs[mode] = (model, opt)
            loss_fn = nn.CrossEntropyLoss()

            def step(mode):
                model, opt = runs[mode]
                opt.zero_grad(set_to_none=True)
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=big):
                    loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()

            for mode in MODES:  # warm-up: cuDNN autotuning, buckets, gloo connections
                for _ in range(3):
                    step(mode)
            sync()
            times = {m: [] for m in MODES}
            for b in range(blocks):
                order = MODES[b % 4:] + MODES[:b % 4]
                for mode in order:
                    comm.barrier()
                    sync()
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        step(mode)
                    sync()
                    times[mode].append((time.perf_counter() - t0) / steps)
            out[model_name] = times
            del runs
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        comm.barrier()
        dist.destroy_process_group()
        comm.close()
        results.put({"rank": rank, "times": out})
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        results.put({"rank": rank, "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"})


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--models", default="cnn,resnet50")
    p.add_argument("--blocks", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="cnn only, small blocks")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--shm-threads", type=int, default=0,
                   help="threads per rank for the host half of Ember's reductions (0: the core's default)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    models = args.models.split(",")
    if args.device == "cpu" or args.quick:
        models = ["cnn"]
    try:
        import torchvision  # noqa: F401
    except ImportError:
        models = [m for m in models if m == "cnn"]
        log("torchvision does not import: resnet50 left out")
    cnn_batch = 256 if args.device == "cuda" else 64
    plan = [("cnn", cnn_batch, 5 if args.quick else 20, 2 if args.quick else args.blocks)]
    if "resnet50" in models:
        plan.append(("resnet50", 64, 5, args.blocks))

    from ember import _ember
    log(f"device {args.device}, {args.ranks} ranks, plan {plan}, shm threads {args.shm_threads or 'auto'}, "
        f"load {os.getloadavg()}")
    secret = os.urandom(32)
    server = _ember.CoordinatorServer.start(secret, _ember.ClusterLayout(num_nodes=args.ranks),
                                            bind_host="127.0.0.1", port=0)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    gloo_port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, args.ranks, args.device, server.port, secret, gloo_port,
                                                 plan, results, args.shm_threads), daemon=True) for r in range(args.ranks)]
    start = time.monotonic()
    for proc in procs:
        proc.start()
    got = {}
    try:
        while len(got) < args.ranks:
            left = args.timeout - (time.monotonic() - start)
            if left <= 0:
                raise TimeoutError(f"the ranks did not finish in {args.timeout:.0f} s (--timeout)")
            try:
                msg = results.get(timeout=min(left, 5.0))
            except Exception:  # noqa: BLE001 - queue.Empty: see whether a rank died
                dead = [q for q in procs if q.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"rank process(es) died: {[(q.pid, q.exitcode) for q in dead]}")
                continue
            if "error" in msg:
                raise RuntimeError(f"rank {msg['rank']} failed: {msg['error']}")
            got[msg["rank"]] = msg["times"]
    finally:
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
        server.close()

    lines, figures = [], {}
    for model_name, batch, steps, blocks in plan:
        med = {}
        for mode in MODES:
            per_block = [max(got[r][model_name][mode][b] for r in range(args.ranks)) for b in range(blocks)]
            med[mode] = statistics.median(per_block)
        ember_best = min(med["fused"], med["overlap"])
        ratio = med["ddp"] / ember_best
        sync_time = med["fused"] - med["local"]
        hidden = (med["fused"] - med["overlap"]) / sync_time if sync_time > 0 else float("nan")
        figures[model_name] = {"ms_per_step": {m: v * 1e3 for m, v in med.items()}, "ember_vs_ddp": ratio,
                               "hidden": hidden, "batch": batch}
        print(f"\n{model_name}, batch {batch} per rank, {args.ranks} ranks on {args.device}: ms per step "
              + ", ".join(f"{m} {med[m] * 1e3:.2f}" for m in MODES))
        print(f"  samples/s: ember {args.ranks * batch / ember_best:,.0f}, ddp {args.ranks * batch / med['ddp']:,.0f};"
              f" goal ember >= 1.1x ddp: {ratio:.2f} -> {'met' if ratio >= 1.1 else 'NOT met'};"
              f" goal overlap hides >= 0.5 of sync: {hidden:.2f} -> {'met' if hidden >= 0.5 else 'NOT met'}")
        lines.append(f"{model_name} ember_vs_ddp={ratio:.2f} hidden={hidden:.2f}")
    print(f"load average {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "figures": figures, "raw": got}, indent=1))
    print("gpu_training: " + " ".join(lines))


if __name__ == "__main__":
    main()
