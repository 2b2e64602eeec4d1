"""CUDA-tensor allreduce, 2 ranks on one GPU (issue 20): Ember vs torch.distributed gloo.

The issue's goal: Ember >= 1.3x DDP-gloo on CUDA tensors at every size, 1-128 MB, float32 and
bfloat16.  Both contenders run in the same rank processes (multiprocessing spawn), so they share
processes, GPU and machine load:

* *ember*: ``ember.collective.Communicator.allreduce_`` on the CUDA tensor (the core stages it
  through pinned host chunks, include/ember/collective.h); ranks meet through a real coordinator
  (``_ember.CoordinatorServer`` in this process, ``CollectiveStore.coordinator`` in the ranks).
* *gloo*: ``torch.distributed.all_reduce`` on the same kind of tensor, gloo backend (what DDP
  uses without NCCL; gloo copies CUDA tensors to the host itself), tcp:// rendezvous on 127.0.0.1.

Per size and dtype: warm-up calls, then ``--repeats`` rounds, the contenders' order rotating;
each round times ``iters`` calls between two device synchronisations, per call; a round's time
is the slower rank's, a contender's the median over rounds.  Each round's result is checked
(every rank filled with rank+1, so the sum is exact in bf16 too).  CPU seconds per call are the
ranks' process CPU time (every thread) over the timed calls.  ``--device cpu`` runs the same
comparison on CPU tensors (a machine without a GPU; ``--quick`` for small sizes).

Last line: ``gpu_allreduce_min_ratio: ember_vs_gloo=<x> at <size> <dtype>``, the worst of
gloo time / Ember time over every size and dtype.
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

MB = 1 << 20
SIZES_MB = [1, 2, 4, 8, 16, 32, 64, 128]
QUICK_SIZES_MB = [1, 4]
GOAL = 1.3


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- a rank
def rank_main(rank, size, device, coord_port, secret, gloo_port, plan, results):
    """One rank: joins both contenders, then times every (size, dtype) of `plan`; puts
    {"rank", "rows": [...]} or {"rank", "error"} on `results`."""
    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch
        import torch.distributed as dist

        from ember import _ember
        from ember.collective import Communicator

        if device == "cuda":
            torch.cuda.set_device(0)
            torch.cuda.init()
        store = _ember.CollectiveStore.coordinator("127.0.0.1", coord_port, secret, 60.0)
        comm = Communicator.create(rank, size, secret, store, prefix="bench-gpu-allreduce",
                                   connect_timeout=60, timeout=300)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{gloo_port}", rank=rank,
                                world_size=size)
        dev = torch.device("cuda:0" if device == "cuda" else "cpu")

        def sync():
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        calls = {"ember": lambda t: comm.allreduce_(t, op="sum"),
                 "gloo": lambda t: dist.all_reduce(t, op=dist.ReduceOp.SUM)}
        rows = []
        for mb, dtype_name, warmup, iters, repeats in plan:
            dtype = getattr(torch, dtype_name)
            n = int(mb * MB) // torch.empty(0, dtype=dtype).element_size()
            buf = torch.empty(n, dtype=dtype, device=dev)
            expect = float(size * (size + 1) // 2)
            row = {"mb": mb, "dtype": dtype_name, "secs": {}, "cpu": {}, "error": {}}
            names = list(calls)
            for name in names:
                row["secs"][name], row["cpu"][name] = [], []
                try:
                    for _ in range(warmup):
                        buf.fill_(rank + 1)
                        calls[name](buf)
                    sync()
                except Exception as e:  # noqa: BLE001 - a contender that cannot run this dtype
                    row["error"][name] = f"{type(e).__name__}: {e}".splitlines()[0][:160]
            for rep in range(repeats):
                order = names[rep % len(names):] + names[:rep % len(names)]
                for name in order:
                    if name in row["error"]:
                        continue
                    comm.barrier()
                    buf.fill_(rank + 1)
                    sync()
                    cpu0, t0 = time.process_time(), time.perf_counter()
                    for _ in range(iters):
                        calls[name](buf)
                    sync()
                    t1, cpu1 = time.perf_counter(), time.process_time()
                    # after `iters` in-place sums of rank+1: (sum of ranks+1) * size**(iters-1)
                    want = expect * size ** (iters - 1)
                    got_lo, got_hi = float(buf.min()), float(buf.max())
                    if got_lo != got_hi or abs(got_lo - want) > 1e-6 * want:
                        raise AssertionError(f"{name} {mb} MB {dtype_name}: result {got_lo}..{got_hi}, "
                                             f"want {want}")
                    row["secs"][name].append((t1 - t0) / iters)
                    row["cpu"][name].append((cpu1 - cpu0) / iters)
            rows.append(row)
            del buf
        comm.barrier()
        dist.destroy_process_group()
        comm.close()
        results.put({"rank": rank, "rows": rows})
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        results.put({"rank": rank, "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"})


# ----------------------------------------------------------------------------- the parent
def machine(device: str) -> str:
    import platform
    out = [f"{platform.node()}, {os.cpu_count()} cores, python {platform.python_version()}"]
    try:
        import torch
        out.append(f"torch {torch.__version__}")
        if device == "cuda" and torch.cuda.is_available():
            out.append(torch.cuda.get_device_name(0))
    except ImportError:
        out.append("torch does not import")
    load = os.getloadavg()
    out.append(f"load avg {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}")
    return ", ".join(out)


def plan_for(sizes_mb, dtypes, repeats, min_bytes_per_round):
    """(mb, dtype, warmup, iters, repeats) per point: more calls per round for small buffers.
    Sums of rank+1 grow by `size` per call, so iters stays small enough that bf16 holds them
    exactly (2 ranks: 3 * 2**(iters-1) <= 2**8 exactly representable)."""
    out = []
    for mb in sizes_mb:
        iters = max(1, min(6, int(min_bytes_per_round // (mb * MB))))
        out += [(mb, d, 2 if mb >= 32 else 5, iters, repeats) for d in dtypes]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--sizes", default=None, help="MB, comma-separated (default 1..128 doubling)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES_MB} MB, 3 repeats")
    ap.add_argument("--timeout", type=float, default=420.0, help="seconds for the whole run")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args()

    sizes = ([float(s) for s in args.sizes.split(",")] if args.sizes
             else QUICK_SIZES_MB if args.quick else SIZES_MB)
    repeats = 3 if args.quick and args.repeats == 5 else args.repeats
    dtypes = args.dtypes.split(",")
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"--device cuda: torch {torch.__version__} sees no CUDA device; use --device cpu", flush=True)
        return 2

    from ember import _ember
    log(f"machine: {machine(args.device)}")
    load0 = os.getloadavg()
    secret = os.urandom(32)
    server = _ember.CoordinatorServer.start(secret, _ember.ClusterLayout(num_nodes=args.ranks),
                                            bind_host="127.0.0.1", port=0)
    plan = plan_for(sizes, dtypes, repeats, min_bytes_per_round=8 * MB)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    gloo_port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, args.ranks, args.device, server.port, secret, gloo_port,
                                                 plan, results), daemon=True) for r in range(args.ranks)]
    t_start = time.monotonic()
    for p in procs:
        p.start()
    got = {}
    try:
        while len(got) < args.ranks:
            left = args.timeout - (time.monotonic() - t_start)
            if left <= 0:
                raise TimeoutError(f"the ranks did not finish in {args.timeout:.0f} s (--timeout)")
            try:
                msg = results.get(timeout=min(left, 5.0))
            except Exception:  # noqa: BLE001 - queue.Empty: see whether a rank died
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"rank process(es) died: {[(p.pid, p.exitcode) for p in dead]}")
                continue
            if "error" in msg:
                raise RuntimeError(f"rank {msg['rank']} failed: {msg['error']}")
            got[msg["rank"]] = msg["rows"]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        server.close()
    load1 = os.getloadavg()

    rows = []
    for i, (mb, dtype, *_rest) in enumerate(plan):
        per_rank = [got[r][i] for r in range(args.ranks)]
        row = {"mb": mb, "dtype": dtype, "error": per_rank[0]["error"]}
        for name in ("ember", "gloo"):
            if name in row["error"]:
                continue
            # a round's time is the slowest rank's; CPU per call is summed over the ranks
            rounds = [max(rk["secs"][name][k] for rk in per_rank) for k in range(len(per_rank[0]["secs"][name]))]
            cpus = [sum(rk["cpu"][name][k] for rk in per_rank) for k in range(len(per_rank[0]["cpu"][name]))]
            row[name] = statistics.median(rounds)
            row[name + "_cpu"] = statistics.median(cpus)
        rows.append(row)

    label = "CUDA tensors (cuda:0)" if args.device == "cuda" else "CPU tensors"
    print(f"\nsum allreduce, {args.ranks} ranks on one host, {label}; median of {repeats} rounds; "
          f"algbw = bytes / time (GB = 1e9 B); CPU = ranks' CPU ms per call", flush=True)
    print(f"{'size':>8} {'dtype':>9} {'ember ms':>9} {'gloo ms':>9} {'ember GB/s':>10} {'gloo GB/s':>9} "
          f"{'ember CPU':>9} {'gloo CPU':>9} {'ratio':>6}")
    worst = None
    for row in rows:
        nbytes = row["mb"] * MB
        e, g = row.get("ember"), row.get("gloo")
        ratio = g / e if e and g else None
        cells = [f"{row['mb']:>6g}MB", f"{row['dtype']:>9}",
                 f"{e * 1e3:9.3f}" if e else f"{'n/a':>9}", f"{g * 1e3:9.3f}" if g else f"{'n/a':>9}",
                 f"{nbytes / e / 1e9:10.2f}" if e else f"{'':>10}", f"{nbytes / g / 1e9:9.2f}" if g else f"{'':>9}",
                 f"{row['ember_cpu'] * 1e3:9.2f}" if e else f"{'':>9}",
                 f"{row['gloo_cpu'] * 1e3:9.2f}" if g else f"{'':>9}",
                 f"{ratio:6.2f}" if ratio else f"{'n/a':>6}"]
        print(" ".join(cells))
        for name, err in row["error"].items():
            print(f"{'':>19}{name}: {err}")
        if ratio is not None and (worst is None or ratio < worst[0]):
            worst = (ratio, row["mb"], row["dtype"])
    print(f"load avg before {load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f}, "
          f"after {load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f}; {time.monotonic() - t_start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "rows": rows}, indent=1))
    if worst is None:
        print("gpu_allreduce_min_ratio: ember_vs_gloo=nan at none (no size ran on both)")
        return 1
    met = "met" if worst[0] >= GOAL else "NOT met"
    print(f"goal (issue 20, CUDA tensors): ember >= {GOAL}x gloo at every size: {met}"
          + ("" if args.device == "cuda" else " (this run: CPU tensors, not the goal's setting)"))
    print(f"gpu_allreduce_min_ratio: ember_vs_gloo={worst[0]:.2f} at {worst[1]:g}MB {worst[2]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
