"""Allreduce bus bandwidth and latency: Ember's collectives vs Gloo vs torch.distributed (gloo).

float32 sum allreduce (--dtype: bfloat16, float16 too), in place, ranks as separate processes on
this host (2 and 4 by default).
Contenders, interleaved per size (every repeat runs each once, in rotating order):

* ember_shm: ember::collective::Communicator, Transport::kAuto (shared memory on one host);
  C++ harness bench/collective/ember_allreduce.cc.
* ember_tcp: the same with Transport::kTcp (its TCP ring over loopback).
* gloo_<variant>: Debian's libgloo, TCP device on loopback, FileStore rendezvous;
  bench/collective/gloo_allreduce.cc.  Variants (--gloo-variants): ``allreduce`` (gloo::allreduce,
  Algorithm::RING, what torch's backend calls), ``ring_chunked`` (AllreduceRingChunked),
  ``ring`` (AllreduceRing).  The *gloo* figure (ratios, last line) is the best variant per size.
* torch: ``torch.distributed.all_reduce`` with the gloo backend, if torch imports (from
  .torch-site/ when it is installed there); skipped with the reason otherwise.

Every rank refills its buffer before each call and checks every element after it (both untimed):
a wrong sum fails the contender.  Per size: warm-up calls, then max(--min-iters, --min-secs /
warm-up median) timed calls, each timed alone; a run's time is the slowest rank's median, a
contender's the median over --repeats runs.  busbw = bytes / time * 2(N-1)/N.  memcpy bandwidth
(64 MiB) is measured between sizes in the same run.

The last line: ``allreduce_busbw_64MiB: ember=<GB/s> gloo=<GB/s> ratio=<v>`` (2 ranks, 64 MiB,
ember_shm vs the best Gloo variant).  --netns adds 2 ranks in two network namespaces joined by
a veth pair (created and removed here; needs root): ember_tcp vs Gloo over real TCP.

Without Debian's libgloo (a GPU image, say) the Gloo harness is not built and torch's gloo is
the peer; the last line is then ``allreduce_busbw_64MiB: ranks=<first --ranks> ember=<GB/s>
torch=<GB/s> ratio=<v>`` (``--gloo-variants ""`` does the same where Gloo is built).  Every run
with torch checks the big-host goals (issue 20): ember_shm >= 1.5x torch's gloo at every size
from 64 KiB, busbw >= 0.5 of memcpy at the largest size.  --one-thread adds ember_shm_1t (one
thread per rank; the default splits copies and reductions of 1 MiB and more over the host's cores
divided by its ranks, at most 8) and prints the gain.

--dtype bfloat16|float16: the same, over 16-bit elements (the same bytes, half the elements).
Debian's Gloo harness is float32 only, so its variants are left out and torch's gloo (which
reduces bfloat16 and float16) is the peer; the last line is then
``allreduce_busbw_64MiB_<dtype>: ember=<GB/s> torch=<GB/s> ratio=<v>``.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, log, machine_info, median  # noqa: E402

BUILD = REPO / "build" / "bench-collective"
TORCH_SITE = REPO / ".torch-site"
KiB, MiB = 1 << 10, 1 << 20
DEFAULT_SIZES = [4, 4 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB]
QUICK_SIZES = [4, 64 * KiB, 1 * MiB, 64 * MiB]
MEMCPY_BYTES = 64 * MiB
NETNS = ("ember-bench-a", "ember-bench-b")
NETNS_HOSTS = ("10.213.7.1", "10.213.7.2")
REPLY_TIMEOUT = 600.0


def fmt_size(n: int) -> str:
    if n >= MiB and n % MiB == 0:
        return f"{n // MiB} MiB"
    if n >= KiB and n % KiB == 0:
        return f"{n // KiB} KiB"
    return f"{n} B"


def parse_size(s: str) -> int:
    s = s.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": KiB, "M": MiB, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if mult > 1 else s) * mult


# ----------------------------------------------------------------------------- harness processes
class Harness:
    """One contender's harness process (C++ or the torch one below): forks the ranks, then answers
    one JSON line per command (protocol in bench/collective/harness.h)."""

    def __init__(self, name: str, argv: List[str], env: Optional[dict] = None):
        self.name = name
        self.error: Optional[str] = None
        self._err = tempfile.TemporaryFile(mode="w+")
        self._buf = b""
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     text=True, bufsize=1, env=env, start_new_session=True)

    def _reply(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                line = line.decode(errors="replace").strip()
                if line.startswith("{"):  # anything else on stdout is not ours
                    d = json.loads(line)
                    if "error" in d:
                        raise RuntimeError(d["error"])
                    return d
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer in {timeout:.0f}s")
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise RuntimeError(f"harness exited (rc {self.proc.wait()}): {self.stderr_tail()}")
                self._buf += chunk

    def stderr_tail(self, n: int = 600) -> str:
        self._err.seek(0)
        return self._err.read()[-n:].strip()

    def wait_ready(self, timeout: float = 180.0) -> bool:
        try:
            self._reply(timeout)
            return True
        except (RuntimeError, TimeoutError) as e:
            self.fail(str(e))
            return False

    def ask(self, cmd: str) -> Optional[dict]:
        if self.error:
            return None
        try:
            self.proc.stdin.write(cmd + "\n")
            self.proc.stdin.flush()
            return self._reply(REPLY_TIMEOUT)
        except (RuntimeError, TimeoutError, OSError, ValueError) as e:
            self.fail(f"{cmd!r}: {e}")
            return None

    def fail(self, why: str) -> None:
        self.error = why
        log(f"{self.name}: FAILED, dropped from the run: {why}")
        self.close()

    def cpu_seconds(self) -> float:
        """CPU time of the harness and its rank processes (live ones) so far."""
        total = 0.0
        pids = [self.proc.pid]
        try:
            pids += [int(p) for p in Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()]
        except OSError:
            pass
        tck = os.sysconf("SC_CLK_TCK")
        for pid in pids:
            try:
                f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(f[11]) + int(f[12])) / tck
            except (OSError, IndexError):
                pass
        return total

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


# ----------------------------------------------------------------------------- torch harness
def _torch_rank(rank: int, size: int, init: str, conn, dtype_name: str = "float32") -> None:  # runs in a spawned process
    import datetime
    import statistics
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=120))
    except Exception as e:  # noqa: BLE001
        conn.send(f"err rank {rank}: {e}")
        return
    conn.send("ready")
    s = size * (size + 1) // 2
    dtype = getattr(torch, dtype_name)
    esize = torch.empty(0, dtype=dtype).element_size()
    count = -1
    while True:
        cmd = conn.recv().split()
        if cmd[0] == "quit":
            break
        nbytes, warmup, min_iters, min_secs = int(cmd[1]), int(cmd[2]), int(cmd[3]), float(cmd[4])
        if max(1, nbytes // esize) != count:
            count = max(1, nbytes // esize)
            # Small integers: every sum is exact in each dtype (bfloat16: up to 256).
            base = (torch.arange(count, dtype=torch.int64) % 13 + 1).to(dtype)
            data = torch.empty(count, dtype=dtype)
            want = torch.empty(count, dtype=dtype)

        def once(k: int) -> float:
            c = float(k % 13)
            torch.add(base, c, out=data).mul_(rank + 1)
            t0 = time.perf_counter()
            dist.all_reduce(data)
            t = time.perf_counter() - t0
            torch.add(base, c, out=want).mul_(s)
            if not torch.equal(data, want):
                i = int((data != want).nonzero()[0])
                raise RuntimeError(f"rank {rank}: wrong sum at element {i} of {count}, call {k}: "
                                   f"got {float(data[i])}, want {float(want[i])}")
            return t

        try:
            warm = [once(k) for k in range(max(1, warmup))]
            slowest = torch.tensor([statistics.median(warm)], dtype=torch.float32)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            iters = min(200000, max(min_iters, int(-(-min_secs // max(float(slowest[0]), 1e-9)))))
            times = [once(warmup + k) for k in range(iters)]
            conn.send(f"ok {statistics.median(times):.9g} {iters}")
        except Exception as e:  # noqa: BLE001
            conn.send(f"err {e}")
            break
    dist.destroy_process_group()


def torch_harness_main(ranks: int, dtype: str = "float32") -> int:
    """The torch contender's harness: the C++ harnesses' stdin/stdout protocol, ranks spawned
    with multiprocessing, meeting through a FileStore."""
    import multiprocessing as mp
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="ember-allreduce-torch-")
    init = f"file://{tmp}/store"
    procs, conns = [], []
    for r in range(ranks):
        a, b = ctx.Pipe()
        p = ctx.Process(target=_torch_rank, args=(r, ranks, init, b, dtype), daemon=True)
        p.start()
        procs.append(p)
        conns.append(a)

    def collect() -> Optional[List[str]]:
        out = []
        for r, c in enumerate(conns):
            try:
                out.append(c.recv())
            except EOFError:
                out.append(f"err rank {r} died")
        bad = [x for x in out if x.startswith("err")]
        if bad:
            print(json.dumps({"error": bad[0][4:]}), flush=True)
            return None
        return out

    rc = 0
    if collect() is None:
        rc = 1
    else:
        print(json.dumps({"ready": True, "ranks": ranks}), flush=True)
        for line in sys.stdin:
            w = line.split()
            if not w:
                continue
            if w[0] == "quit":
                break
            for c in conns:
                c.send(line)
            got = collect()
            if got is None:
                rc = 1
                break
            med = [float(x.split()[1]) for x in got]
            print(json.dumps({"bytes": int(w[1]), "iters": int(got[0].split()[2]), "median_s": max(med),
                              "rank_median_s": med}), flush=True)
    for c in conns:
        try:
            c.send("quit")
        except OSError:
            pass
    for p in procs:
        p.join(timeout=30 if rc == 0 else 1)
        if p.is_alive():
            p.kill()
    shutil.rmtree(tmp, ignore_errors=True)
    return rc


def torch_env() -> tuple[Optional[dict], str]:
    """(environment for the torch harness, description) or (None, reason it is skipped)."""
    env = dict(os.environ)
    if (TORCH_SITE / ".installed").exists():
        env["PYTHONPATH"] = os.pathsep.join([str(TORCH_SITE), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", "import torch, torch.distributed as d; "
                        "print(torch.__version__, d.is_gloo_available())"],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"torch does not import ({tail}); .torch-site/.installed " + (
            "exists" if (TORCH_SITE / ".installed").exists() else "missing (make .torch-site/.installed)")
    version, gloo = r.stdout.split()
    if gloo != "True":
        return None, f"torch {version} has no gloo backend"
    return env, f"torch {version}"


# ----------------------------------------------------------------------------- build
def build() -> Dict[str, Optional[str]]:
    """Builds the harnesses; {target: None if built, else why not}."""
    if not (BUILD / "build.ninja").exists():
        subprocess.run(["cmake", "-S", str(REPO / "bench" / "collective"), "-B", str(BUILD), "-G", "Ninja",
                        "-DCMAKE_BUILD_TYPE=Release"], check=True, capture_output=True)
    out = {}
    for target in ("gloo_allreduce", "ember_allreduce"):
        r = subprocess.run(["cmake", "--build", str(BUILD), "--target", target], capture_output=True, text=True)
        if r.returncode == 0:
            out[target] = None
        else:
            errs = [ln for ln in r.stdout.splitlines() if "error" in ln.lower()] or r.stdout.splitlines()[-5:]
            out[target] = "build failed: " + " | ".join(errs[:4])[:600]
    return out


# ----------------------------------------------------------------------------- netns
def netns_up() -> None:
    netns_down()
    a, b = NETNS
    cmds = [f"ip netns add {a}", f"ip netns add {b}",
            f"ip link add ebv-a netns {a} type veth peer name ebv-b netns {b}",
            f"ip -n {a} addr add {NETNS_HOSTS[0]}/24 dev ebv-a", f"ip -n {b} addr add {NETNS_HOSTS[1]}/24 dev ebv-b",
            f"ip -n {a} link set ebv-a up", f"ip -n {b} link set ebv-b up",
            f"ip -n {a} link set lo up", f"ip -n {b} link set lo up"]
    for c in cmds:
        subprocess.run(c.split(), check=True, capture_output=True)


def netns_down() -> None:
    for ns in NETNS:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# ----------------------------------------------------------------------------- measuring
def warmup_for(nbytes: int) -> int:
    return 50 if nbytes <= 64 * KiB else 10 if nbytes <= 4 * MiB else 3


def busbw(nbytes: int, secs: float, ranks: int) -> float:
    return nbytes / secs * 2 * (ranks - 1) / ranks / 1e9 if secs == secs and secs > 0 else float("nan")


def measure(harnesses: List[Harness], ranks: int, sizes: List[int], args, memcpy: Optional[Harness],
            results: dict) -> None:
    """Runs every size on every harness, interleaved; fills results[name][size] = [median_s per repeat]."""
    for h in harnesses:
        results.setdefault(h.name, {})
    for nbytes in sizes:
        for rep in range(args.repeats):
            k = rep % len(harnesses)
            for h in harnesses[k:] + harnesses[:k]:
                d = h.ask(f"run {nbytes} {warmup_for(nbytes)} {args.min_iters} {args.min_secs}")
                if d is not None:
                    results[h.name].setdefault(nbytes, []).append(d["median_s"])
            if memcpy is not None:
                d = memcpy.ask(f"memcpy {MEMCPY_BYTES} 10")
                if d is not None:
                    results.setdefault("memcpy_gbps", []).append(d["gbps"])
        load = os.getloadavg()[0]
        results.setdefault("load", {})[nbytes] = load
        parts = []
        for h in harnesses:
            t = median(results[h.name].get(nbytes, []))
            parts.append(f"{h.name} {t * 1e6:.1f}us")
        log(f"{ranks} ranks {fmt_size(nbytes)}: " + ", ".join(parts) + f" (load {load:.2f})")


def start(specs: List[tuple], timeout: float = 180.0) -> List[Harness]:
    hs = [Harness(name, argv, env) for name, argv, env in specs]
    return [h for h in hs if h.wait_ready(timeout)]


def idle_cpu(hs: List[Harness], secs: float = 1.0) -> Dict[str, float]:
    """CPU seconds each harness uses while idle between commands (a spinning one loads the others)."""
    before = {h.name: h.cpu_seconds() for h in hs}
    time.sleep(secs)
    return {h.name: h.cpu_seconds() - before[h.name] for h in hs}


def best_gloo(res: dict, nbytes: int, variants: List[str]) -> tuple[float, str]:
    cands = [(median(res.get(f"gloo_{v}", {}).get(nbytes, [])), v) for v in variants]
    cands = [c for c in cands if c[0] == c[0]]
    return min(cands) if cands else (float("nan"), "-")


def table(res: dict, ranks: int, sizes: List[int], cols: List[str], variants: List[str], memcpy: float,
          dtype: str = "float32") -> List[str]:
    main_cols = [c for c in cols if not c.startswith("gloo_")] + ["gloo"]
    main_cols.insert(len(main_cols) - 1 - ("torch" in main_cols), main_cols.pop())  # gloo before torch

    def secs(c: str, n: int) -> float:
        return best_gloo(res, n, variants)[0] if c == "gloo" else median(res.get(c, {}).get(n, []))

    def cell(t: float, n: int) -> str:
        return f" {busbw(n, t, ranks):7.3f} {t * 1e6:10.1f} |" if t == t else f" {'-':>18} |"

    def ratio(a: float, b: float) -> float:
        return a / b if a == a and b == b else float("nan")

    head = (f"{'size':>8} |" + "".join(f" {c if c != 'gloo' else 'gloo (best)':>18} |" for c in main_cols)
            + f" {'gloo variant':>12} | {'shm/gloo':>8} | {'tcp/gloo':>8} | {'shm/torch':>9} | {'shm/memcpy':>10} | load")
    units = f"{'':>8} |" + "".join(f" {'GB/s':>7} {'µs':>10} |" for _ in main_cols)
    lines = [f"== {ranks} ranks: busbw GB/s and median µs per {dtype} sum allreduce; memcpy {memcpy:.2f} GB/s",
             head, units, "-" * len(head)]
    for n in sizes:
        gt, gv = best_gloo(res, n, variants)
        et, ct, tt = secs("ember_shm", n), secs("ember_tcp", n), secs("torch", n)
        frac = busbw(n, et, ranks) / memcpy if memcpy == memcpy else float("nan")
        lines.append(f"{fmt_size(n):>8} |" + "".join(cell(secs(c, n), n) for c in main_cols)
                     + f" {gv:>12} | {ratio(gt, et):8.2f} | {ratio(gt, ct):8.2f} | {ratio(tt, et):9.2f} | {frac:10.2f} |"
                     f" {res.get('load', {}).get(n, float('nan')):.2f}")
    gcols = [c for c in cols if c.startswith("gloo_")]
    if len(gcols) > 1:
        lines.append(f"   Gloo variants, median µs: {'size':>8} |" + "".join(f" {c:>17} |" for c in gcols))
        for n in sizes:
            lines.append(f"   {'':26}{fmt_size(n):>8} |" + "".join(f" {secs(c, n) * 1e6:17.1f} |" for c in gcols))
    return lines


def goals(res: dict, ranks: int, sizes: List[int], variants: List[str]) -> List[str]:
    def ratio(n):
        gt, _ = best_gloo(res, n, variants)
        et = median(res.get("ember_shm", {}).get(n, []))
        return gt / et if et == et and gt == gt else float("nan")

    out = []
    mid = [n for n in sizes if 64 * KiB <= n <= 4 * MiB]
    if mid:
        worst = min(mid, key=lambda n: ratio(n) if ratio(n) == ratio(n) else -1)
        out.append(f"goal ember_shm >= 3x gloo busbw, 64 KiB..4 MiB: lowest {ratio(worst):.2f}x at {fmt_size(worst)} "
                   f"-> {'met' if ratio(worst) >= 3 else 'NOT met'}")
    if 64 * MiB in sizes:
        r = ratio(64 * MiB)
        out.append(f"goal ember_shm >= 1.5x gloo at 64 MiB: {r:.2f}x -> {'met' if r >= 1.5 else 'NOT met'}")
    if 4 in sizes:
        gt, _ = best_gloo(res, 4, variants)
        et = median(res.get("ember_shm", {}).get(4, []))
        v = et / gt if et == et and gt == gt else float("nan")
        out.append(f"goal 4-byte latency <= 0.3x gloo: ember {et * 1e6:.1f} µs / gloo {gt * 1e6:.1f} µs = {v:.2f}x "
                   f"-> {'met' if v <= 0.3 else 'NOT met'}")
    slow = [fmt_size(n) for n in sizes if ratio(n) == ratio(n) and ratio(n) < 1]
    if slow:
        out.append(f"ember_shm slower than gloo at: {', '.join(slow)}")
    return [f"   [{ranks} ranks] {x}" for x in out]


def goals_vs_torch(res: dict, ranks: int, sizes: List[int], memcpy: float) -> List[str]:
    """Issue 20's big-host goals: ember_shm >= 1.5x torch's gloo at every size from 64 KiB, and a
    busbw of at least half this host's memcpy bandwidth at the largest size."""
    def ratio(n):
        et, tt = median(res.get("ember_shm", {}).get(n, [])), median(res.get("torch", {}).get(n, []))
        return tt / et if et == et and tt == tt else float("nan")

    out = []
    bw = [n for n in sizes if n >= 64 * KiB and ratio(n) == ratio(n)]
    if bw:
        worst = min(bw, key=ratio)
        out.append(f"goal ember_shm >= 1.5x torch gloo at every size from 64 KiB: lowest {ratio(worst):.2f}x at "
                   f"{fmt_size(worst)} -> {'met' if ratio(worst) >= 1.5 else 'NOT met'}")
    n = max(sizes)
    frac = busbw(n, median(res.get("ember_shm", {}).get(n, [])), ranks) / memcpy if memcpy == memcpy else float("nan")
    if frac == frac:
        out.append(f"goal ember_shm busbw >= 0.5 of memcpy at {fmt_size(n)}: {frac:.2f} -> "
                   f"{'met' if frac >= 0.5 else 'NOT met'}")
    if "ember_shm_1t" in res:
        gains = [f"{fmt_size(n)} {median(res['ember_shm_1t'].get(n, [])) / median(res['ember_shm'].get(n, [])):.2f}x"
                 for n in sizes if n >= 1 * MiB]
        if gains:
            out.append(f"threads per rank (ember_shm) vs one (ember_shm_1t): {', '.join(gains)}")
    return [f"   [{ranks} ranks] {x}" for x in out]


# ----------------------------------------------------------------------------- main
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", help="comma list, e.g. 4,4K,64K,1M,64M (bytes unless K/M)")
    p.add_argument("--ranks", default="2,4", help="comma list of rank counts (default 2,4)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--min-secs", type=float, default=0.2)
    p.add_argument("--quick", action="store_true", help=f"sizes {','.join(fmt_size(s) for s in QUICK_SIZES)}, 1 repeat")
    p.add_argument("--gloo-variants", default="allreduce,ring_chunked,ring")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--no-tcp", action="store_true", help="leave out ember_tcp")
    p.add_argument("--one-thread", action="store_true",
                   help="also ember_shm_1t: one thread per rank (the default splits big copies over the cores)")
    p.add_argument("--netns", action="store_true", help="also 2 ranks in two network namespaces (veth; root)")
    p.add_argument("--json", help="write every measurement here")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="element type (default float32); 16-bit: Debian's Gloo is left out, torch is the peer")
    p.add_argument("--torch-harness", type=int, metavar="RANKS", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.torch_harness:
        return torch_harness_main(args.torch_harness, args.dtype)

    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else (QUICK_SIZES if args.quick else DEFAULT_SIZES)
    if args.quick and not args.sizes:
        args.repeats = 1
    rank_counts = [int(r) for r in args.ranks.split(",")]
    variants = [v for v in args.gloo_variants.split(",") if v]
    if args.dtype != "float32":
        variants = []  # the Gloo harness reduces float32 only
    dt = ["--dtype", args.dtype]
    t_start = time.monotonic()
    log(machine_info())
    built = build()
    for target, why in built.items():
        if why:
            log(f"{target}: {why}")
    tenv, tdesc = (None, "--no-torch") if args.no_torch else torch_env()
    log(f"torch contender: {tdesc}" if tenv else f"torch contender SKIPPED: {tdesc}")
    if built["gloo_allreduce"]:
        if not tenv or built["ember_allreduce"]:
            return 1
        log("the Gloo harness is not built (Debian: libgloo-dev): torch.distributed's gloo is the peer")
        variants = []
    ember_bin, gloo_bin = str(BUILD / "ember_allreduce"), str(BUILD / "gloo_allreduce")

    all_res: Dict[str, dict] = {}
    report: List[str] = []
    memcpy_all: List[float] = []
    for ranks in rank_counts:
        specs = []
        if not built["ember_allreduce"]:
            specs += [("ember_shm", [ember_bin, "--ranks", str(ranks), *dt], None)]
            if args.one_thread:
                specs.append(("ember_shm_1t", [ember_bin, "--ranks", str(ranks), "--threads", "1", *dt], None))
            if not args.no_tcp:
                specs.append(("ember_tcp", [ember_bin, "--ranks", str(ranks), "--tcp", *dt], None))
        specs += [(f"gloo_{v}", [gloo_bin, "--ranks", str(ranks), "--variant", v], None) for v in variants]
        if tenv:
            specs.append(("torch", [sys.executable, __file__, "--torch-harness", str(ranks), *dt], tenv))
        memcpy = Harness("memcpy", [gloo_bin, "--ranks", "1", "--variant", "allreduce"] if variants
                         else [ember_bin, "--ranks", "1"])
        hs = start(specs)
        memcpy.wait_ready()
        idle = idle_cpu(hs)
        spinning = {k: v for k, v in idle.items() if v > 0.05}
        if spinning:
            log(f"WARNING: idle harnesses use CPU (s per s): {spinning}")
        res: dict = {}
        measure(hs, ranks, sizes, args, memcpy, res)
        for h in hs + [memcpy]:
            h.close()
        memcpy_all += res.get("memcpy_gbps", [])
        all_res[str(ranks)] = res
        cols = [s[0] for s in specs]
        report += table(res, ranks, sizes, cols, variants, median(res.get("memcpy_gbps", [])), args.dtype)
        report += [f"   {s[0]} failed: {h.error}" for s in specs for h in hs if h.name == s[0] and h.error]
        report += [f"   {s[0]} did not start" for s in specs if s[0] not in [h.name for h in hs]]
        if tenv:
            report += goals_vs_torch(res, ranks, sizes, median(res.get("memcpy_gbps", [])))
        if args.dtype == "float32":
            if variants:
                report += goals(res, ranks, sizes, variants)
        else:  # Debian's Gloo harness is float32 only: 16-bit goals are against torch's gloo
            report.append(f"   [{ranks} ranks] {args.dtype}: Gloo's C++ harness is float32 only; "
                          f"the goals above are float32's, the ratio below is against torch gloo")
        report.append("")

    if args.netns:
        try:
            netns_up()
            ns_args = ["--ranks", "2", "--netns", ",".join(NETNS), "--hosts", ",".join(NETNS_HOSTS)]
            specs = []
            if not built["ember_allreduce"]:
                specs.append(("ember_tcp", [ember_bin, *ns_args, "--tcp", *dt], None))
            specs += [(f"gloo_{v}", [gloo_bin, *ns_args, "--variant", v], None) for v in variants]
            hs = start(specs)
            res = {}
            measure(hs, 2, sizes, args, None, res)
            for h in hs:
                h.close()
            all_res["netns2"] = res
            lines = table(res, 2, sizes, [s[0] for s in specs], variants, float("nan"), args.dtype)
            report.append(lines[0].replace("== 2 ranks", "== 2 ranks in two network namespaces (veth pair, TCP)"))
            report += lines[1:]
            report += [f"   {h.name} failed: {h.error}" for h in hs if h.error]
            bw = [n for n in sizes if n >= 4 * KiB]
            rs = {n: best_gloo(res, n, variants)[0] / median(res.get("ember_tcp", {}).get(n, [float("nan")])) for n in bw}
            rs = {n: r for n, r in rs.items() if r == r}
            if rs:
                worst = min(rs, key=rs.get)
                report.append(f"   [netns] goal ember_tcp >= 1.0x gloo busbw (4 KiB..): lowest {rs[worst]:.2f}x at "
                              f"{fmt_size(worst)} -> {'met' if rs[worst] >= 1.0 else 'NOT met'}; below 1.0 at: "
                              f"{', '.join(fmt_size(n) for n, r in rs.items() if r < 1.0) or 'none'}")
            report.append("")
        except subprocess.CalledProcessError as e:
            report.append(f"== netns: SKIPPED, could not set up namespaces: {e.cmd}: {e.stderr}")
        finally:
            netns_down()

    print()
    print("\n".join(report))
    log(f"memcpy {fmt_size(MEMCPY_BYTES)}: median {median(memcpy_all):.2f} GB/s over {len(memcpy_all)} runs")
    log(f"done in {time.monotonic() - t_start:.0f} s; {machine_info()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine_info(), "sizes": sizes, "results": all_res,
                                               "gloo_variants": variants, "dtype": args.dtype}, indent=1,
                                              default=str))
    r2 = all_res.get("2", {})
    if not variants and args.dtype == "float32":  # no Gloo harness: the line against torch's gloo
        first = rank_counts[0]
        rf = all_res.get(str(first), {})
        n = 64 * MiB if 64 * MiB in sizes else max(sizes)
        et, tt = median(rf.get("ember_shm", {}).get(n, [])), median(rf.get("torch", {}).get(n, []))
        eb, tb = busbw(n, et, first), busbw(n, tt, first)
        print(f"allreduce_busbw_{fmt_size(n).replace(' ', '')}: ranks={first} ember={eb:.3f} torch={tb:.3f} "
              f"ratio={eb / tb if tb == tb else float('nan'):.2f}")
        return 0
    if args.dtype != "float32":
        et, tt = median(r2.get("ember_shm", {}).get(64 * MiB, [])), median(r2.get("torch", {}).get(64 * MiB, []))
        eb, tb = busbw(64 * MiB, et, 2), busbw(64 * MiB, tt, 2)
        print(f"allreduce_busbw_64MiB_{args.dtype}: ember={eb:.3f} torch={tb:.3f} "
              f"ratio={eb / tb if tb == tb else float('nan'):.2f}")
        return 0
    et = median(r2.get("ember_shm", {}).get(64 * MiB, []))
    gt, _ = best_gloo(r2, 64 * MiB, variants)
    eb, gb = busbw(64 * MiB, et, 2), busbw(64 * MiB, gt, 2)
    print(f"allreduce_busbw_64MiB: ember={eb:.3f} gloo={gb:.3f} ratio={eb / gb if gb == gb else float('nan'):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
