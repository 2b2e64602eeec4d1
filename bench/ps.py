"""Parameter-server throughput (issue 21): dense pull + push of a ~10 MB model by 2 and 4 worker
processes on this host, Ember's shard vs Elephas 7.3.0's asynchronous parameter server, in one run.

* *ember*: one ``ember.ps`` shard (the C++ server) in a process of its own; each worker
  (``ember.ps.Client``) pulls the model's two tensors (a 1000 x N/1000 kernel and its bias,
  float32) and pushes a delta of the same size, rule ``add`` (Elephas's asynchronous update: the
  server adds under a lock).  The workers share the shard's host, so they reach it through
  shared-memory rings (``transport="auto"``, the default).
* *ember-tcp*: the same over the job's authenticated TCP transport only (``transport="tcp"``: as
  workers on other hosts reach a shard), for comparison.
* *elephas-http* / *elephas-socket*: Elephas's ``HttpServer`` (Flask) and ``SocketServer`` holding
  the same Keras model (Dense 1000 -> N/1000), and its ``HttpClient`` / ``SocketClient`` in each
  worker: ``get_parameters()`` then ``update_parameters(delta)``.  Elephas pins TensorFlow < 2.20,
  numpy < 2 and pyspark <= 4.0.0, so it runs from its own virtual environment,
  ``bench/.elephas-venv`` (created here with ``pip install elephas==7.3.0`` the first time).

An update is one pull plus one push of the whole model.  Each round runs one contender with W
workers for ``--seconds`` (each worker counts its own updates; the round's rate is their sum);
``--repeats`` rounds per contender and W, the contenders' order rotating; medians.  CPU is the
workers' own CPU seconds per update over their timed loops (the servers' is not counted).  Bytes/s counts 2 x model bytes per
update, against this host's memcpy bandwidth (the shared-memory bound; goal >= 0.5).

Last line: ``ps_updates_ratio: ember_vs_elephas=<x> at <W> workers`` (the worst over W of Ember's
rate over the faster Elephas mode's).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from _common import free_port, log  # noqa: E402
REPO = BENCH.parent
ELEPHAS_VENV = BENCH / ".elephas-venv"
ELEPHAS_PY = ELEPHAS_VENV / "bin" / "python"
ELEPHAS_VERSION = "7.3.0"
SECRET = b"bench-ps-secret-0123456789abcdef"

EMBER_SERVER = """
import sys, ember.ps
s = ember.ps.Server.start("ps:0", %r, bind_host="127.0.0.1")
print(s.port, flush=True)
sys.stdin.read()
s.close()
""" % SECRET

EMBER_WORKER = """
import json, sys, time
import numpy as np
import ember.ps
port, floats, seconds, transport = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
units = max(1, floats // 1000)
ps = ember.ps.Client.connect(["127.0.0.1:%%d" %% port], %r, name="bench", transport=transport)
assert ps.shared_memory(0) == (transport == "auto")
shapes = {"kernel": (1000, units), "bias": (units,)}
for name, shape in shapes.items():
    ps.create_dense(name, np.zeros(shape, np.float32), rule="add")
delta = {name: np.full(shape, 1e-7, np.float32) for name, shape in shapes.items()}
bufs = {name: np.empty(shape, np.float32) for name, shape in shapes.items()}
def update():
    for name in shapes:
        _, versions = ps.pull(name, out=bufs[name])
        ps.push(name, delta[name], versions)
update()  # warm-up
n, start, cpu = 0, time.perf_counter(), time.process_time()
while time.perf_counter() - start < seconds:
    update()
    n += 1
print(json.dumps({"updates": n, "secs": time.perf_counter() - start, "cpu": time.process_time() - cpu}), flush=True)
""" % SECRET


def ensure_elephas() -> str:
    if not ELEPHAS_PY.exists():
        log(f"creating {ELEPHAS_VENV} with elephas=={ELEPHAS_VERSION} (its own TensorFlow, numpy, pyspark)")
        subprocess.run([sys.executable, "-m", "venv", str(ELEPHAS_VENV)], check=True)
        subprocess.run([str(ELEPHAS_PY), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        f"elephas=={ELEPHAS_VERSION}"], check=True)
    out = subprocess.run([str(ELEPHAS_PY), "-c", "import importlib.metadata as m; print(', '.join("
                          "f'{p} {m.version(p)}' for p in ('elephas', 'tensorflow', 'keras', 'numpy', 'flask')))"],
                         capture_output=True, text=True, timeout=300)
    if out.returncode:
        raise RuntimeError(f"{ELEPHAS_PY} cannot report its packages: {out.stderr[-500:]}")
    return out.stdout.strip()


def stop_server(proc) -> None:
    """Closes the server's stdin (it stops), then ends its whole process group (Elephas's
    Flask server runs in a child process of its own): nothing outlives the round."""
    import signal
    try:
        proc.stdin.close()
        proc.wait(30)
    except (subprocess.TimeoutExpired, OSError):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def start_server(contender: str, floats: int):
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    if contender.startswith("ember"):
        proc = subprocess.Popen([sys.executable, "-c", EMBER_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=env, start_new_session=True)
        port = int(proc.stdout.readline())
        return proc, port
    return start_elephas_server("_elephas_ps.py", contender, ["--floats", str(floats)])


def start_elephas_server(script: str, contender: str, extra: list, stderr=None, why=lambda: ""):
    """Starts `script`'s Elephas server (in the Elephas venv) on a free port and waits up to
    300 s for its "ready"; returns (process, port).  `why()` adds to the error if it does not
    start (e.g. the tail of its stderr)."""
    port = free_port()
    proc = subprocess.Popen([str(ELEPHAS_PY), str(BENCH / script), "server", "--mode", contender.split("-")[1],
                             "--port", str(port), *extra], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=stderr, text=True, start_new_session=True)
    seen, line = [], ""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # Flask prints its banner on stdout first
        line = proc.stdout.readline()
        if not line or line.strip() == "ready":
            break
        seen.append(line)
    if line.strip() != "ready":
        stop_server(proc)
        raise RuntimeError(f"{contender}: the server did not start (printed {''.join(seen)[-500:]!r}){why()}")
    return proc, port


def run_round(contender: str, workers: int, floats: int, seconds: float) -> tuple:
    server, port = start_server(contender, floats)
    cpu = 0.0
    try:
        if contender.startswith("ember"):
            cmd = [sys.executable, "-c", EMBER_WORKER, str(port), str(floats), str(seconds),
                   "tcp" if contender == "ember-tcp" else "auto"]
            env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
        else:
            cmd = [str(ELEPHAS_PY), str(BENCH / "_elephas_ps.py"), "worker", "--mode", contender.split("-")[1],
                   "--port", str(port), "--seconds", str(seconds)]
            env = None
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for _ in range(workers)]
        rate, updates = 0.0, 0
        for p in procs:
            out, err = p.communicate(timeout=seconds + 300)
            if p.returncode:
                raise RuntimeError(f"{contender} worker exited {p.returncode}: {err[-800:]}")
            r = json.loads(out.strip().splitlines()[-1])
            rate += r["updates"] / r["secs"]
            updates += r["updates"]
            cpu += r["cpu"]
    finally:
        stop_server(server)
    return rate, cpu / max(1, updates)


def memcpy_gbs(nbytes: int) -> float:
    import numpy as np
    a = np.ones(nbytes // 4, np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(20):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="2,4")
    p.add_argument("--floats", type=int, default=2_500_000, help="model size in float32 (2.5M: 10 MB)")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--contenders", default="ember,ember-tcp,elephas-http,elephas-socket")
    p.add_argument("--json")
    args = p.parse_args()
    contenders = args.contenders.split(",")
    load0 = os.getloadavg()
    log(f"machine: {os.cpu_count()} cores, load {load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f}, "
        f"python {sys.version.split()[0]}")
    if any(c.startswith("elephas") for c in contenders):
        log(f"Elephas from {ELEPHAS_VENV}: {ensure_elephas()}")
    model_bytes = (args.floats // 1000) * 1001 * 4
    bound = memcpy_gbs(model_bytes)
    log(f"model {model_bytes / 1e6:.1f} MB; memcpy {bound:.2f} GB/s")
    rows = {}
    for w in [int(x) for x in args.workers.split(",")]:
        for rep in range(args.repeats):
            order = contenders[rep % len(contenders):] + contenders[:rep % len(contenders)]
            for c in order:
                rate, cpu = run_round(c, w, args.floats, args.seconds)
                rows.setdefault((c, w), []).append((rate, cpu))
                log(f"{w} workers, round {rep + 1}: {c} {rate:.1f} updates/s, {cpu * 1e3:.1f} ms CPU/update")
    print(f"\n{'workers':>7} {'contender':>15} {'updates/s':>10} {'GB/s':>7} {'of memcpy':>9} {'worker CPU ms/upd':>17}")
    worst = None
    for w in sorted({w for _, w in rows}):
        med = {}
        for c in contenders:
            rates = [r for r, _ in rows[(c, w)]]
            med[c] = statistics.median(rates)
            cpu = statistics.median([x for _, x in rows[(c, w)]])
            gbs = med[c] * 2 * model_bytes / 1e9
            print(f"{w:>7} {c:>15} {med[c]:>10.1f} {gbs:>7.2f} {gbs / bound:>9.2f} {cpu * 1e3:>17.1f}")
        peers = [med[c] for c in contenders if c.startswith("elephas")]
        if "ember" in med and peers:
            ratio = med["ember"] / max(peers)
            print(f"{w:>7} {'ember / best elephas':>26}: {ratio:.1f}x")
            if worst is None or ratio < worst[0]:
                worst = (ratio, w)
    load1 = os.getloadavg()
    print(f"load average before {load0[0]:.2f}, after {load1[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({f"{c}/{w}": v for (c, w), v in rows.items()}, indent=1))
    if worst is not None:
        print(f"goal (issue 21): ember >= 50x elephas: {'met' if worst[0] >= 50 else 'NOT met'}")
        print(f"ps_updates_ratio: ember_vs_elephas={worst[0]:.1f} at {worst[1]} workers")


if __name__ == "__main__":
    main()
