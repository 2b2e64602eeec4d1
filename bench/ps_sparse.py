"""Parameter-server sparse rows/s (issue 21): embedding rows of 64 floats with skewed ids pulled and
pushed by 1 and 2 worker processes through one PS process, Ember's shard vs Elephas 7.3.0 and vs
numpy in one process, in one run.

Ids: Zipf(``--zipf``, 1.2) ranks folded into a ``--vocab`` (10M) vocabulary and scattered over it
by a bijection (rank * 2654435761 mod V), as hashed categorical features are.  Each worker draws
its own pool of batches (seed = worker index) before any timing, goes over the pool once (rows
are created on first touch; untimed), then cycles through it.  A batch of 4096 ids holds ~1,300
distinct ids at a = 1.2: every id is sent and counted, repeats included (no dedup on the client).

* *ember*: one ``ember.ps`` shard (``Server.start`` in a process of its own, the job's
  authenticated TCP transport), table of ``--dim`` floats, rule ``sgd``; each worker
  (``ember.ps.Client``) calls ``pull_rows(ids)`` then ``push_rows(ids, grads)`` per batch.  Run at
  every size of ``--batches``.
* *ember-dense* (a diagnostic, not a contender): the same worker pulls and pushes a dense tensor
  of batch x dim floats on the same shard: the same bytes over the same transport without the
  ids, the hash table and the scattered rows.  Its rate counts the rows those bytes would hold.
* *numpy* (the in-process ceiling): each worker process holds its own table of the pool's
  distinct rows (ids mapped to row numbers before timing: a perfect hash, for free) and does
  ``table[idx]`` then ``np.add.at(table, idx, grads)``: the same rows, no server, no wire.
* *elephas-http* / *elephas-socket*: Elephas has no sparse path.  Its asynchronous worker with
  ``frequency="batch"`` gets the whole model and sends a delta of the whole model each batch, so
  a user of Elephas with an embedding ships the whole table twice per batch.  The server holds a
  Keras ``Embedding(--elephas-vocab, dim)`` (100,000 x 64 floats = 25.6 MB, not 10M rows: 2.56 GB
  per message would take seconds per batch) in Elephas's ``HttpServer`` / ``SocketServer``
  (from ``bench/.elephas-venv``, bench/ps.py's); each worker gets the parameters, gathers its
  batch's rows, scatters the batch's row updates into a zero delta and updates
  (``bench/_elephas_sparse.py``).  Counted as Ember's: 2 x batch rows per step.

Rows/s counts each id once per pull and once per push (a step of a batch of B ids: 2B rows),
summed over the workers; each worker times its own loop of ``--seconds``, started together.
``--repeats`` rounds per configuration, the order rotating; medians.  CPU: the PS process
group's CPU seconds over the timed window (from /proc; load-independent), per million rows,
and the rows per PS CPU second they imply; the workers' CPU the same way.

Last line: ``ps_sparse_rows_ratio: ember_vs_elephas=<x> at <W> workers ember_mrows=<m>
of_numpy=<f> goal_5M=<met|NOT met>``, at the first batch size: the worst over W of Ember's
rows/s over the faster Elephas mode's; Ember's best rows/s over W (millions) and its fraction
of numpy's at that W.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from _common import log  # noqa: E402
import ps as dense_bench  # noqa: E402  (bench/ps.py: the Ember server, the Elephas venv, stop_server)

REPO = BENCH.parent
SCRAMBLE = 2654435761  # prime: rank -> rank * SCRAMBLE mod V is a bijection of [0, V)

# Shared by the Ember and numpy workers: the skewed batches of this worker.
DRAW = """
import json, sys, time
import numpy as np
mode, port, vocab, dim, batch, a, seed, seconds = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
    int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7]), float(sys.argv[8]))
pool = max(8, 262144 // batch)
rng = np.random.default_rng(seed)
ranks = (rng.zipf(a, size=pool * batch) - 1) %% vocab
batches = (ranks * %d %% vocab).astype(np.int64).reshape(pool, batch)
grads = (rng.standard_normal((batch, dim)) * 1e-4).astype(np.float32)
distinct = float(np.mean([np.unique(b).size for b in batches]))
""" % SCRAMBLE

LOOP = """
for b in batches:  # warm-up: every row of the pool exists before timing
    pull(b); push(b)
print("ready", flush=True)
sys.stdin.readline()
n = 0; pull_s = push_s = 0.0
start, cpu = time.perf_counter(), time.process_time()
while time.perf_counter() - start < seconds:
    b = batches[n % pool]
    t0 = time.perf_counter(); pull(b); t1 = time.perf_counter(); push(b); pull_s += t1 - t0
    push_s += time.perf_counter() - t1
    n += 1
print(json.dumps({"steps": n, "secs": time.perf_counter() - start, "cpu": time.process_time() - cpu,
                  "pull_s": pull_s, "push_s": push_s, "distinct": distinct}), flush=True)
"""

EMBER_WORKER = DRAW + """
import ember.ps
ps = ember.ps.Client.connect(["127.0.0.1:%%d" %% port], %r, name="bench-%%d" %% seed)
if mode == "rows":
    ps.create_table("emb", dim, rule="sgd", lr=0.01)
    pull = lambda b: ps.pull_rows("emb", b)
    push = lambda b: ps.push_rows("emb", b, grads)
else:  # the same bytes as one dense tensor
    ps.create_dense("dense", np.zeros(batch * dim, np.float32), rule="add")
    buf = np.empty(batch * dim, np.float32)
    flat = grads.reshape(-1)
    state = {}
    def pull(b):
        state["v"] = ps.pull("dense", out=buf)[1]
    def push(b):
        ps.push("dense", flat, state["v"])
""" % dense_bench.SECRET + LOOP

NUMPY_WORKER = DRAW + """
uniq, inv = np.unique(batches, return_inverse=True)
batches = inv.reshape(batches.shape)  # row numbers: a perfect hash, before timing
table = (rng.standard_normal((uniq.size, dim)) * 0.05).astype(np.float32)
grads *= -0.01
def pull(b):
    return table[b]
def push(b):
    np.add.at(table, b, grads)
""" + LOOP

_CLK = os.sysconf("SC_CLK_TCK")


def _tail(f, n: int = 800) -> str:
    f.flush()
    f.seek(0)
    return f.read()[-n:]


def group_cpu(pgid: int) -> float:
    """CPU seconds (user + system, threads included) of the live processes of group `pgid`."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            f = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(f[2]) == pgid:  # after ")": state ppid pgrp ... utime=11 stime=12
            total += (int(f[11]) + int(f[12])) / _CLK
    return total


def start_elephas(mode: str, vocab: int, dim: int, stderr):
    return dense_bench.start_elephas_server("_elephas_sparse.py", f"elephas-{mode}",
                                            ["--vocab", str(vocab), "--dim", str(dim)], stderr=stderr,
                                            why=lambda: f"; its stderr: {_tail(stderr)!r}")


def run_round(contender: str, workers: int, batch: int, args, perf_out: str = "") -> dict:
    """One round: a fresh server (none for numpy), `workers` workers started together; returns
    rows/s, per-call ms, PS and worker CPU seconds over the timed window."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    server, port, perf = None, 0, None
    # The servers' stderr (Flask logs every request) goes to a file, shown when something fails.
    server_log = tempfile.TemporaryFile("w+")
    if contender.startswith("ember"):
        server = subprocess.Popen([sys.executable, "-c", dense_bench.EMBER_SERVER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=server_log, text=True, env=env,
                                  start_new_session=True)
        port = int(server.stdout.readline() or 0)
        if not port:
            dense_bench.stop_server(server)
            raise RuntimeError(f"the Ember shard did not start: {_tail(server_log)!r}")
    elif contender.startswith("elephas"):
        server, port = start_elephas(contender.split("-")[1], args.elephas_vocab, args.dim, server_log)
    procs = []
    try:
        for w in range(workers):
            if contender.startswith("elephas"):
                cmd = [str(dense_bench.ELEPHAS_PY), str(BENCH / "_elephas_sparse.py"), "worker", "--mode",
                       contender.split("-")[1], "--port", str(port), "--vocab", str(args.elephas_vocab),
                       "--dim", str(args.dim), "--batch", str(batch), "--zipf", str(args.zipf), "--seed", str(w),
                       "--seconds", str(args.seconds)]
            else:
                script = NUMPY_WORKER if contender == "numpy" else EMBER_WORKER
                mode = "dense" if contender == "ember-dense" else "rows"
                cmd = [sys.executable, "-c", script, mode, str(port), str(args.vocab), str(args.dim), str(batch),
                       str(args.zipf), str(w), str(args.seconds)]
            procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True, env=env))
        for p in procs:
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"{contender} worker did not get ready: {line!r} {p.stderr.read()[-800:]}")
        ps_cpu0 = group_cpu(server.pid) if server else 0.0
        if perf_out and server:
            perf = subprocess.Popen(["perf", "record", "-q", "-F", "499", "-g", "-o", perf_out, "-p", str(server.pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        res = []
        for p in procs:
            out, err = p.communicate(timeout=args.seconds + 300)
            if p.returncode:
                raise RuntimeError(f"{contender} worker exited {p.returncode}: {err[-800:]} (server: "
                                   f"{_tail(server_log)!r})")
            res.append(json.loads(out.strip().splitlines()[-1]))
        ps_cpu = (group_cpu(server.pid) - ps_cpu0) if server else 0.0
    finally:
        for p in procs:  # a failed round leaves no worker behind
            if p.poll() is None:
                p.kill()
                p.wait(30)
        if perf is not None:
            perf.send_signal(2)  # SIGINT: perf writes its file and exits
            perf.wait(60)
        if server is not None:
            dense_bench.stop_server(server)
        server_log.close()
    steps = sum(r["steps"] for r in res)
    rows = 2 * batch * steps
    return {"rate": sum(2 * batch * r["steps"] / r["secs"] for r in res),
            "pull_ms": 1e3 * sum(r["pull_s"] for r in res) / steps, "push_ms": 1e3 * sum(r["push_s"] for r in res) / steps,
            "ps_cpu_per_m": ps_cpu / rows * 1e6, "worker_cpu_per_m": sum(r["cpu"] for r in res) / rows * 1e6,
            "ps_cpu": ps_cpu, "secs": max(r["secs"] for r in res), "distinct": res[0].get("distinct", 0.0)}


def perf_report(path: str, lines: int = 30) -> str:
    out = subprocess.run(["perf", "report", "-i", path, "--no-children", "--stdio", "-g", "none",
                          "--percent-limit", "1.5", "--sort", "dso,symbol"], capture_output=True, text=True, timeout=300)
    rows = [ln for ln in out.stdout.splitlines() if ln.strip() and not ln.startswith("#")]
    return "\n".join(rows[:lines]) or out.stderr[-500:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="1,2")
    p.add_argument("--batches", default="4096,65536", help="ids per call; the first is the peers' and the ratio's")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--vocab", type=int, default=10_000_000)
    p.add_argument("--elephas-vocab", type=int, default=100_000, help="rows of Elephas's table (25.6 MB at dim 64)")
    p.add_argument("--zipf", type=float, default=1.2)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--contenders", default="ember,ember-dense,numpy,elephas-http,elephas-socket")
    p.add_argument("--perf", action="store_true",
                   help="after the timed rounds, one more ember round per batch size at the most workers under "
                        "`perf record` of the shard; prints its top symbols")
    p.add_argument("--json")
    args = p.parse_args()
    contenders = args.contenders.split(",")
    batches = [int(x) for x in args.batches.split(",")]
    workers = [int(x) for x in args.workers.split(",")]
    load0 = os.getloadavg()
    log(f"machine: {os.cpu_count()} cores, load {load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f}, "
        f"python {sys.version.split()[0]}")
    if any(c.startswith("elephas") for c in contenders):
        log(f"Elephas from {dense_bench.ELEPHAS_VENV}: {dense_bench.ensure_elephas()}")
    row_bytes = args.dim * 4
    bound = dense_bench.memcpy_gbs(64 << 20)  # out of the caches: the memory-bound copy
    log(f"rows of {args.dim} floats, ids Zipf({args.zipf}) over {args.vocab:,}; Elephas's table "
        f"{args.elephas_vocab:,} rows = {args.elephas_vocab * row_bytes / 1e6:.1f} MB; memcpy of 64 MiB {bound:.2f} "
        f"GB/s ({bound * 1e9 / row_bytes / 1e6:.0f} M rows/s)")
    configs = [(c, b) for c in contenders for b in (batches if c == "ember" else batches[:1])]
    rows = {}
    for w in workers:
        for rep in range(args.repeats):
            k = rep % len(configs)
            for c, b in configs[k:] + configs[:k]:
                r = run_round(c, w, b, args)
                rows.setdefault((c, b, w), []).append(r)
                log(f"{w} workers, round {rep + 1}: {c} batch {b}: {r['rate'] / 1e6:.3f} M rows/s, pull "
                    f"{r['pull_ms']:.2f} ms, push {r['push_ms']:.2f} ms, PS CPU {r['ps_cpu']:.2f} s "
                    f"({r['ps_cpu_per_m']:.2f} s/M rows), ~{r['distinct']:.0f} distinct ids/batch")
    print(f"\n{'workers':>7} {'contender':>14} {'batch':>6} {'M rows/s':>9} {'pull ms':>8} {'push ms':>8} "
          f"{'PS CPU s/M rows':>15} {'M rows/PS CPU s':>15} {'worker CPU s/M':>14}")
    med = {}
    for w in workers:
        for c, b in configs:
            rs = rows[(c, b, w)]
            m = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            med[(c, b, w)] = m
            per_cpu = f"{1 / m['ps_cpu_per_m']:.2f}" if m["ps_cpu_per_m"] > 0 else "-"
            ps_cpu = f"{m['ps_cpu_per_m']:.3f}" if c != "numpy" else "-"
            print(f"{w:>7} {c:>14} {b:>6} {m['rate'] / 1e6:>9.3f} {m['pull_ms']:>8.2f} {m['push_ms']:>8.2f} "
                  f"{ps_cpu:>15} {per_cpu:>15} {m['worker_cpu_per_m']:>14.3f}")
    b0 = batches[0]
    worst, best_ember = None, None
    for w in workers:
        e = med.get(("ember", b0, w))
        if e is None:
            continue
        peers = [med[(c, b0, w)]["rate"] for c in contenders if c.startswith("elephas")]
        line = f"{w} workers, batch {b0}: ember {e['rate'] / 1e6:.3f} M rows/s"
        if peers:
            ratio = e["rate"] / max(peers)
            line += f"; / best elephas {ratio:.1f}x"
            if worst is None or ratio < worst[0]:
                worst = (ratio, w)
        if ("numpy", b0, w) in med:
            line += f"; of numpy {e['rate'] / med[('numpy', b0, w)]['rate']:.2f}"
        if ("ember-dense", b0, w) in med:
            d = med[("ember-dense", b0, w)]["rate"]
            line += (f"; of the same bytes as a dense tensor {e['rate'] / d:.2f} (dense: {d / 1e6:.3f} M rows/s, "
                     f"{d * row_bytes / 1e9:.2f} GB/s)")
        print(line)
        if best_ember is None or e["rate"] > best_ember[0]:
            best_ember = (e["rate"], w)
    ember_all = [m["rate"] for (c, _, _), m in med.items() if c == "ember"]
    load1 = os.getloadavg()
    print(f"load average before {load0[0]:.2f}, after {load1[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({f"{c}/{b}/{w}": v for (c, b, w), v in rows.items()}, indent=1))
    if args.perf and "ember" in contenders:
        for b in batches:
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "perf.data")
                r = run_round("ember", max(workers), b, args, perf_out=path)
                print(f"\nperf of the shard, {max(workers)} workers, batch {b} ({r['rate'] / 1e6:.3f} M rows/s "
                      f"under perf), self time by symbol:\n{perf_report(path)}")
    if ember_all:
        top = max(ember_all)
        print(f"goal (issue 21): >= 5 M rows/s per PS process: {'met' if top >= 5e6 else 'NOT met'} "
              f"(best {top / 1e6:.2f} M rows/s, any W and batch)")
    if worst is not None and best_ember is not None:
        w = best_ember[1]
        frac = (best_ember[0] / med[("numpy", b0, w)]["rate"]) if ("numpy", b0, w) in med else float("nan")
        print(f"ps_sparse_rows_ratio: ember_vs_elephas={worst[0]:.1f} at {worst[1]} workers "
              f"ember_mrows={best_ember[0] / 1e6:.2f} of_numpy={frac:.2f} "
              f"goal_5M={'met' if max(ember_all) >= 5e6 else 'NOT met'}")


if __name__ == "__main__":
    main()
