"""Parameter server over TCP between hosts (issue 21): a dense pull + push of a large tensor by a
worker on one "host" from 1 and 2 shards on other hosts, against the link's own TCP bandwidth,
measured in the same run.

Nothing here is part of Ember.  Needs root (network namespaces); refused, it says why and exits 2.

**Hosts.**  Three network namespaces joined by a bridge (python/tests/netns_cluster.py's
``NetnsNetwork``, imported, not copied): ``w`` (the worker), ``pa`` and ``pb`` (one shard each,
``ember.ps.Server.start`` in a process of its own).  Programs run through ``ip netns exec`` with a
private /dev/shm, so the worker and the shards meet over TCP only.  Each shard host has its own
link: with ``--shapes 1gbit`` both directions of it are limited by tbf (the host's eth0 egress and
the bridge port's egress towards it); the worker's link is left unshaped, as a worker host with a
NIC at least as fast as the two shard links together.  So 2 shards can move twice what 1 moves
only if the client drives both links at once.  ``veth``: nothing is shaped.

**The link's bandwidth** is measured, not assumed: a veth on one machine has no line rate, its
"bandwidth" is what a TCP stream gets through it with these CPUs and this load; a tbf-shaped link
has a rate, and a TCP stream gets its payload share of it (1448 of every 1514 bytes on the wire).
A small Python TCP program (4 MiB ``sendall`` / ``recv_into``, no dependency) measures, each
round:

* *up* / *down*: one stream worker -> shard host / shard host -> worker for ``--seconds``; up is
  timed until the receiver acknowledged the last byte, down at the receiver.  **The link** is the
  median of these one-way rates to host pa.
* the same streams to pa and pb at once (the topology's check: two links should carry 2x);
* *exchange*: the PS's access pattern without the PS: send N bytes, receive N bytes back, repeat
  (N = the tensor's bytes; with 2 peers N/2 to each, one thread per peer, unsynchronised: a bound
  for the 2-shard client).

**The PS.**  One worker process ``ember.ps.Client.connect`` s to shard pa (1 shard) or pa and pb
(2 shards; the client cuts a tensor of >= 65,536 elements into one contiguous slice per shard),
creates one float32 tensor per size (``--floats``: 4.2, 10 and 67 MB by default; rule ``add``),
warms up, then for ``--seconds`` pulls it (into a reused buffer) and pushes a delta of its size,
one after the other.  bytes/s = (pulled + pushed bytes) / s, i.e. 2 x tensor bytes per update.
With pull and push one after the other each direction of a link is busy at most half the time,
so against the one-way stream rate the fraction is at most 1 (bar tbf's bucket: it fills while a
direction is idle, and the next message's first 128 KiB then pass at veth speed).  At the
end the worker pulls once more and checks that every element holds updates x delta (both shards
applied every push).

*2 thr* (a diagnostic, not Ember's API as a user calls it): the same two shards, but one
single-shard client per shard, each slice a tensor of its own, both slices pulled (then pushed)
at once from a thread per shard: what a client that drives its shards concurrently would get.

Rounds: ``--repeats`` of every measurement per shape, their order rotating; medians.  CPU: the
worker's own CPU seconds, each shard process's (from /proc) and the machine's busy and softirq
seconds (from /proc/stat; the veth, bridge and tbf work runs in softirq, charged to no process),
all per update; load average before and after.

Last line: ``ps_tcp: link_fraction_per_shard=<x> shards2_vs_1=<y> at <shape> <MB> ...`` with the
goals (>= 0.8 of the link per shard, the worse of 1 shard and 2 shards' per-shard share; 2 shards
>= 1.8x one) met or NOT met, on the last shape and size measured (1gbit and 67 MB by default: a
real link rate, and the size least flattered by socket buffers), the others in brackets.

  .venv/bin/python bench/ps_tcp.py                          # veth and 1gbit, 3 repeats (~10 min)
  .venv/bin/python bench/ps_tcp.py --shapes 1gbit --repeats 1 --seconds 2   # a quick look
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SECRET = b"bench-ps-tcp-secret-0123456789abcdef"
# tbf's burst must hold one GSO super-packet (64 KiB).  A bucket fills while its direction is idle
# and the next message's first `burst` bytes then pass at veth speed: the PS and the exchange
# alternate directions, so a large bucket flatters them against a continuous stream (512 KiB, as
# bench/scaling.py uses, gave 4.2 MB exchanges 1.13x the stream's rate; 128 KiB streams at 0.95
# of the rate like 512 KiB did, and adds at most 128 KiB per message).
SHAPES = {"veth": None, "10gbit": "tbf rate 10gbit burst 4mb latency 50ms",
          "1gbit": "tbf rate 1gbit burst 128kb latency 50ms"}
RATE_GBPS = {"veth": None, "10gbit": 10.0, "1gbit": 1.0}
HOSTS = ("w", "pa", "pb")
SUBNET = "10.97.0"
CHUNK = 4 << 20
ROLES = ("tcp-peer", "tcp-client", "ps-shard", "ps-worker")


# ----------------------------------------------------------------------------- in the namespaces
_CLK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def proc_cpu(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / _CLK


def machine_cpu() -> Dict[str, float]:
    """Seconds since boot, over all cores: busy (everything but idle and iowait) and softirq."""
    f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice
    return {"busy": (sum(f[:8]) - f[3] - f[4]) / _CLK, "softirq": f[6] / _CLK}


def _recv_exact(sock: socket.socket, view: memoryview, n: int) -> None:
    got = 0
    while got < n:
        k = sock.recv_into(view[got:n])
        if k == 0:
            raise ConnectionError("peer closed")
        got += k


def role_tcp_peer(addr: str) -> None:
    """Plain TCP peer on a shard host: prints its port, serves connections (a thread each) until
    stdin closes.  A connection starts with op (1 byte) and n (8 bytes): U sinks until EOF and
    replies the count; D sends until the client closes; X repeats receive n, send n back."""
    lsock = socket.socket()
    lsock.bind((addr, 0))
    lsock.listen(8)
    print(lsock.getsockname()[1], flush=True)

    def serve(conn: socket.socket) -> None:
        buf = bytearray(max(CHUNK, 9))
        view = memoryview(buf)
        try:
            _recv_exact(conn, view, 9)
            op, n = chr(buf[0]), struct.unpack("<Q", bytes(buf[1:9]))[0]
            if op == "U":
                total = 0
                while True:
                    k = conn.recv_into(view)
                    if k == 0:
                        break
                    total += k
                conn.sendall(struct.pack("<Q", total))
            elif op == "D":
                data = memoryview(bytes(CHUNK))
                while True:
                    conn.sendall(data)
            elif op == "X":
                big = bytearray(n)
                bview = memoryview(big)
                while True:
                    _recv_exact(conn, bview, n)
                    conn.sendall(bview)
        except (ConnectionError, OSError):
            pass
        finally:
            conn.close()

    def accept() -> None:
        while True:
            try:
                conn, _ = lsock.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    sys.stdin.read()


def role_tcp_client(op: str, peers: List[str], nbytes: int, seconds: float) -> None:
    """One thread per peer (host:port) runs `op` for `seconds`; prints {bytes, secs} summed /
    maxed over the peers (bytes counted once per direction moved)."""
    results: List[Optional[tuple]] = [None] * len(peers)
    errors: List[BaseException] = []
    barrier = threading.Barrier(len(peers))

    def run(i: int, peer: str) -> None:
        try:
            host, port = peer.rsplit(":", 1)
            s = socket.create_connection((host, int(port)), timeout=60)
            s.settimeout(120)
            s.sendall(op.encode() + struct.pack("<Q", nbytes))
            barrier.wait()
            t0 = time.perf_counter()
            moved = 0
            if op == "U":
                data = memoryview(bytes(CHUNK))
                while time.perf_counter() - t0 < seconds:
                    s.sendall(data)
                    moved += CHUNK
                s.shutdown(socket.SHUT_WR)
                ack = bytearray(8)
                _recv_exact(s, memoryview(ack), 8)
                assert struct.unpack("<Q", ack)[0] == moved, "the peer counted other bytes"
            elif op == "D":
                view = memoryview(bytearray(CHUNK))
                while time.perf_counter() - t0 < seconds:
                    k = s.recv_into(view)
                    if k == 0:
                        raise ConnectionError("peer closed")
                    moved += k
            else:
                out = memoryview(bytes(nbytes))
                back = memoryview(bytearray(nbytes))
                while time.perf_counter() - t0 < seconds:
                    s.sendall(out)
                    _recv_exact(s, back, nbytes)
                    moved += 2 * nbytes
            results[i] = (moved, time.perf_counter() - t0)
            s.close()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate(peers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    print(json.dumps({"bytes": sum(r[0] for r in results), "secs": max(r[1] for r in results),
                      "per_peer": [r[0] / r[1] for r in results]}), flush=True)


def role_ps_shard(name: str, addr: str) -> None:
    import ember.ps
    server = ember.ps.Server.start(name, SECRET, bind_host=addr)
    print(server.port, flush=True)
    sys.stdin.read()
    server.close()


def role_ps_worker(shards: List[str], tensor: str, floats: int, seconds: float, shard_pids: List[int],
                   threads: bool) -> None:
    """Pulls then pushes a `floats`-element tensor for `seconds`; prints rates, times and CPU.
    `threads`: instead of one client over every shard, one single-shard client per shard, each
    with its own slice as a tensor of its own, both slices pulled (then pushed) at once from a
    thread per shard: what a client driving its shards concurrently could do (a diagnostic)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    import ember.ps
    delta = np.full(floats, 1.0, np.float32)
    out = np.empty(floats, np.float32)
    if threads:
        cuts = [floats * i // len(shards) for i in range(len(shards) + 1)]
        parts = [(ember.ps.Client.connect([s], SECRET, name=f"bench-w{i}", timeout=120), f"{tensor}-{i}",
                  slice(cuts[i], cuts[i + 1])) for i, s in enumerate(shards)]
    else:
        parts = [(ember.ps.Client.connect(shards, SECRET, name="bench-w", timeout=120), tensor, slice(0, floats))]
    for ps, name, sl in parts:
        ps.create_dense(name, np.zeros(sl.stop - sl.start, np.float32), rule="add")
    pool = ThreadPoolExecutor(len(parts))
    versions: List = [None] * len(parts)

    def pull(i: int) -> None:
        ps, name, sl = parts[i]
        _, versions[i] = ps.pull(name, out=out[sl])

    def push(i: int) -> None:
        ps, name, sl = parts[i]
        ps.push(name, delta[sl], versions[i])

    def each(fn) -> None:
        if len(parts) == 1:
            fn(0)
        else:
            list(pool.map(fn, range(len(parts))))

    each(pull)
    base = out.copy()
    pulls, pushes = [], []

    def update() -> None:
        t0 = time.perf_counter()
        each(pull)
        t1 = time.perf_counter()
        each(push)
        pulls.append(t1 - t0)
        pushes.append(time.perf_counter() - t1)

    for _ in range(2):  # warm-up: connections, buffers, TCP windows
        update()
    warm = len(pulls)
    shard0, m0 = [proc_cpu(p) for p in shard_pids], machine_cpu()
    n, cpu, start = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        update()
        n += 1
    secs, cpu = time.perf_counter() - start, time.process_time() - cpu
    m1, shard_cpu = machine_cpu(), sum(proc_cpu(p) - c for p, c in zip(shard_pids, shard0))
    each(pull)
    expected = base + float(n + warm)  # the only writer: every element got every push
    if not np.array_equal(out, expected):
        bad = np.flatnonzero(out != expected)
        raise SystemExit(f"wrong values after {n + warm} pushes: {bad.size} elements differ, first at "
                         f"{bad[0]} ({out[bad[0]]} != {expected[bad[0]]})")
    pool.shutdown()
    print(json.dumps({"updates": n, "secs": secs, "cpu": cpu, "shard_cpu": shard_cpu,
                      "busy": m1["busy"] - m0["busy"], "softirq": m1["softirq"] - m0["softirq"],
                      "pull_ms": statistics.median(pulls[warm:]) * 1e3,
                      "push_ms": statistics.median(pushes[warm:]) * 1e3}), flush=True)


def role_main(argv: List[str]) -> None:
    role = argv[0]
    if role == "tcp-peer":
        role_tcp_peer(argv[1])
    elif role == "tcp-client":
        role_tcp_client(argv[1], argv[2].split(","), int(argv[3]), float(argv[4]))
    elif role == "ps-shard":
        role_ps_shard(argv[1], argv[2])
    elif role == "ps-worker":
        role_ps_worker(argv[1].split(","), argv[2], int(argv[3]), float(argv[4]), [int(x) for x in argv[5].split(",")],
                       argv[6] == "threads")


# ----------------------------------------------------------------------------- the driver
class Bench:
    """One shape's network, its shard and TCP-peer processes, and the measurements on it."""

    def __init__(self, shape: str, seconds: float) -> None:
        from netns_cluster import NetnsNetwork  # python/tests (on sys.path through _common)
        spec = SHAPES[shape]
        shaped = {h: spec for h in HOSTS[1:]} if spec else None
        self.shape, self.spec, self.seconds = shape, spec, seconds
        self.net = NetnsNetwork(list(HOSTS), subnet=SUBNET, shaping=shaped)
        path = [str(REPO / "python"), os.environ.get("PYTHONPATH", "")]
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
        self.servers: List[subprocess.Popen] = []
        self.shards: Dict[str, str] = {}   # host -> "addr:port" of its ember.ps shard
        self.shard_pids: Dict[str, int] = {}
        self.peers: Dict[str, str] = {}    # host -> "addr:port" of its plain TCP peer

    def up(self) -> None:
        self.net.create()
        if self.spec:  # the other direction: the bridge port's egress towards the shard host
            for h in HOSTS[1:]:
                subprocess.run(["ip", "netns", "exec", self.net.switch, "tc", "qdisc", "add", "dev", f"v-{h}"[:15],
                                "root", *self.spec.split()], check=True, capture_output=True, timeout=30)
        for i, h in enumerate(HOSTS[1:]):
            host = self.net.hosts[h]
            proc, port = self._serve(host, ["ps-shard", f"ps:{i}", host.address])
            self.shards[h], self.shard_pids[h] = f"{host.address}:{port}", proc.pid
            _, port = self._serve(host, ["tcp-peer", host.address])
            self.peers[h] = f"{host.address}:{port}"

    def _serve(self, host, args: List[str]):
        proc = subprocess.Popen([*host.prefix, sys.executable, str(Path(__file__).resolve()), *args],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=self.env,
                                start_new_session=True)
        self.servers.append(proc)
        line = proc.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"{args[0]} on {host.netns} did not start (printed {line!r}, exit {proc.poll()})")
        return proc, int(line)

    def down(self) -> List[str]:
        """Stops the servers, kills whatever is left in the namespaces, deletes them; returns
        what is still there (should be nothing)."""
        for p in self.servers:
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in self.servers:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.net.destroy()  # SIGKILLs any process still in the namespaces
        for p in self.servers:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        return self.net.leftovers()

    def _worker(self, args: List[str]) -> dict:
        w = self.net.hosts["w"]
        proc = subprocess.Popen([*w.prefix, sys.executable, str(Path(__file__).resolve()), *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env,
                                start_new_session=True)
        limit = self.seconds + 180
        try:
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise RuntimeError(f"{args[0]} {args[1]} on host w ran past {limit:.0f} s") from None
        if proc.returncode:
            raise RuntimeError(f"{args[0]} {args[1]} on host w exited {proc.returncode}: {err[-1500:]}")
        return json.loads(out.strip().splitlines()[-1])

    def tcp(self, op: str, hosts: List[str], nbytes: int) -> dict:
        r = self._worker(["tcp-client", op, ",".join(self.peers[h] for h in hosts), str(nbytes // len(hosts)),
                          str(self.seconds)])
        r["gbps"] = r["bytes"] * 8 / r["secs"] / 1e9
        return r

    def ps(self, hosts: List[str], floats: int, threads: bool = False) -> dict:
        r = self._worker(["ps-worker", ",".join(self.shards[h] for h in hosts),
                          f"{'h' if threads else 't'}{len(hosts)}-{floats}", str(floats), str(self.seconds),
                          ",".join(str(self.shard_pids[h]) for h in hosts), "threads" if threads else "client"])
        n = max(1, r["updates"])
        r.update(rate=r["updates"] / r["secs"], gbps=r["updates"] * 2 * floats * 4 * 8 / r["secs"] / 1e9,
                 worker_cpu_ms=r["cpu"] / n * 1e3, shard_cpu_ms=r["shard_cpu"] / n * 1e3,
                 machine_busy_ms=r["busy"] / n * 1e3, softirq_ms=r["softirq"] / n * 1e3)
        return r


def measurements(sizes: List[int]) -> List[str]:
    """Round names: one-way streams (up/down, 1 or 2 links) once, then per tensor size the plain
    exchange and the PS with 1 and 2 shards ("exch2@<floats>", "ps1@<floats>", ...)."""
    out = ["up1", "down1", "up2", "down2"]
    for f in sizes:
        out += [f"exch1@{f}", f"ps1@{f}", f"exch2@{f}", f"ps2@{f}", f"pst2@{f}"]
    return out


def measure(b: Bench, what: str) -> dict:
    kind, _, floats = what.partition("@")
    hosts = ["pa"] if kind.endswith("1") else ["pa", "pb"]
    if kind.startswith("ps"):
        return b.ps(hosts, int(floats), threads=kind == "pst2")
    return b.tcp({"up": "U", "down": "D", "exch": "X"}[kind[:-1]], hosts, int(floats or 0) * 4)


def run_shape(shape: str, sizes: List[int], seconds: float, repeats: int) -> Dict[str, List[dict]]:
    b = Bench(shape, seconds)
    rows: Dict[str, List[dict]] = {}
    names = measurements(sizes)
    try:
        b.up()
        log(f"{shape}: hosts w {b.net.hosts['w'].address}, pa {b.net.hosts['pa'].address}, "
            f"pb {b.net.hosts['pb'].address}; shards {b.shards['pa']}, {b.shards['pb']}"
            + (f"; pa/pb links both ways: {b.spec}" if b.spec else "; unshaped"))
        for rep in range(repeats):
            k = rep * len(names) // repeats  # rotate the order
            for what in names[k:] + names[:k]:
                r = measure(b, what)
                rows.setdefault(what, []).append(r)
                extra = (f" {r['rate']:.2f} updates/s, pull {r['pull_ms']:.1f} ms push {r['push_ms']:.1f} ms, "
                         f"CPU ms/update worker {r['worker_cpu_ms']:.1f} shards {r['shard_cpu_ms']:.1f} "
                         f"softirq {r['softirq_ms']:.1f} machine {r['machine_busy_ms']:.1f}"
                         if what.startswith("ps") else "")
                log(f"{shape} round {rep + 1}: {what:13} {r['gbps']:6.3f} Gbit/s{extra}; load {os.getloadavg()[0]:.2f}")
    finally:
        left = b.down()
        if left:
            log(f"LEFT BEHIND after {shape}: {left}")
        else:
            log(f"{shape}: namespaces deleted, nothing left behind")
    return rows


def med(rows: List[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def report(shape: str, rows: Dict[str, List[dict]], sizes: List[int]) -> List[dict]:
    link = statistics.median(r["gbps"] for r in rows["up1"] + rows["down1"])
    rate = RATE_GBPS[shape]
    up1, down1, up2, down2 = (med(rows[k], "gbps") for k in ("up1", "down1", "up2", "down2"))
    print(f"\n== {shape}" + (f" (tbf {rate:g} Gbit/s on each shard host's link, both ways; worker's link unshaped)"
                             if rate else " (unshaped veths: the rate is what the CPUs give TCP)"))
    print(f"plain TCP, one stream to pa: up {up1:.3f}, down {down1:.3f} Gbit/s -> the link: {link:.3f} Gbit/s "
          f"(median of both){f', {link / rate:.2f} of the tbf rate' if rate else ''}")
    print(f"plain TCP, to pa and pb at once: up {up2:.3f}, down {down2:.3f} Gbit/s ({up2 / up1:.2f}x, "
          f"{down2 / down1:.2f}x one link)")
    print(f"{'tensor MB':>9} {'shards':>6} {'updates/s':>9} {'Gbit/s':>7} {'of link':>7} {'per shard':>9} "
          f"{'plain exch':>10} {'pull ms':>8} {'push ms':>8} {'worker':>7} {'shards':>7} {'softirq':>7} "
          f"{'machine':>8}  (last 4: CPU ms per update)")
    out = []
    for f in sizes:
        got = {}
        for n, key, label in ((1, "ps1", "1"), (2, "ps2", "2"), (2, "pst2", "2 thr")):
            rs, ex = rows[f"{key}@{f}"], med(rows[f"exch{n}@{f}"], "gbps")
            gbps = med(rs, "gbps")
            got[key] = gbps
            print(f"{f * 4 / 1e6:>9.1f} {label:>6} {med(rs, 'rate'):>9.2f} {gbps:>7.3f} {gbps / link:>7.2f} "
                  f"{gbps / n / link:>9.2f} {ex:>10.3f} {med(rs, 'pull_ms'):>8.1f} {med(rs, 'push_ms'):>8.1f} "
                  f"{med(rs, 'worker_cpu_ms'):>7.1f} {med(rs, 'shard_cpu_ms'):>7.1f} {med(rs, 'softirq_ms'):>7.1f} "
                  f"{med(rs, 'machine_busy_ms'):>8.1f}")
        out.append({"shape": shape, "floats": f, "link_gbps": link, "ps1_gbps": got["ps1"], "ps2_gbps": got["ps2"],
                    "pst2_gbps": got["pst2"], "frac1": got["ps1"] / link, "frac2": got["ps2"] / 2 / link,
                    "ratio": got["ps2"] / got["ps1"], "ratio_threads": got["pst2"] / got["ps1"]})
    print("2 shards / 1 shard: " + ", ".join(f"{s['floats'] * 4 / 1e6:.1f} MB {s['ratio']:.2f}x" for s in out)
          + "; with a thread and a client per shard (\"2 thr\", a diagnostic): "
          + ", ".join(f"{s['ratio_threads']:.2f}x" for s in out))
    return out


def parse_floats(text: str) -> List[int]:
    units = {"Ki": 1 << 10, "Mi": 1 << 20}
    out = []
    for x in text.split(","):
        unit = next((u for u in units if x.endswith(u)), None)
        out.append(int(x[:-2]) * units[unit] if unit else int(x))
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ROLES:
        role_main(sys.argv[1:])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="veth,1gbit", help=f"comma-separated, of {', '.join(SHAPES)}; the last one "
                   "decides the goals")
    p.add_argument("--floats", default="1Mi,2500000,16Mi",
                   help="tensor sizes in float32 (1Mi = 4.2 MB; 2500000: bench/ps.py's 10 MB model); the last one "
                   "decides the goals")
    p.add_argument("--seconds", type=float, default=3.0, help="per measurement round")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()
    sizes = parse_floats(args.floats)
    sys.path.insert(0, str(BENCH))
    from _common import machine_info  # noqa: E402  (puts python/tests on sys.path)
    from netns_cluster import netns_unavailable_reason, sweep_stale
    reason = netns_unavailable_reason()
    if reason:
        print(f"ps_tcp: SKIPPED: {reason}")
        sys.exit(2)
    swept = sweep_stale()
    if swept:
        log(f"deleted namespaces of earlier killed runs: {', '.join(swept)}")

    def stop(signum, _frame):  # SIGTERM / SIGHUP: unwind through the finally blocks
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)

    load0 = os.getloadavg()
    log(f"machine: {machine_info()}")
    log("TCP buffers (new namespaces start from these): " + ", ".join(
        f"{k} {Path('/proc/sys/net/ipv4/' + k).read_text().split()}" for k in ("tcp_wmem", "tcp_rmem")))
    log("tensors: " + ", ".join(f"{f} float32 = {f * 4 / 1e6:.1f} MB" for f in sizes)
        + "; an update pulls and pushes the tensor once")
    cpu0 = os.times()
    all_rows, summaries = {}, []
    for shape in args.shapes.split(","):
        rows = run_shape(shape, sizes, args.seconds, args.repeats)
        all_rows[shape] = rows
        summaries += report(shape, rows, sizes)
    load1 = os.getloadavg()
    t = os.times()
    print(f"\nload average before {load0[0]:.2f}/{load0[1]:.2f}/{load0[2]:.2f}, after "
          f"{load1[0]:.2f}/{load1[1]:.2f}/{load1[2]:.2f}; the run's processes used "
          f"{t.children_user + t.children_system - cpu0.children_user - cpu0.children_system:.1f} CPU s "
          f"(worker and TCP programs; shards and peers are not reaped children when killed)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": all_rows, "summaries": summaries}, indent=1))
    s = summaries[-1]
    frac = min(s["frac1"], s["frac2"])
    sizes_txt = " ".join(f"{x['shape']}/{x['floats'] * 4 / 1e6:.1f}MB={min(x['frac1'], x['frac2']):.2f},"
                         f"{x['ratio']:.2f}x" for x in summaries[:-1])
    print(f"ps_tcp: link_fraction_per_shard={frac:.2f} (1 shard {s['frac1']:.2f}, 2 shards {s['frac2']:.2f}) "
          f"shards2_vs_1={s['ratio']:.2f} at {s['shape']} {s['floats'] * 4 / 1e6:.1f} MB "
          f"goal_0.8={'met' if frac >= 0.8 else 'NOT met'} goal_1.8x={'met' if s['ratio'] >= 1.8 else 'NOT met'}"
          + (f" [others: {sizes_txt}]" if sizes_txt else ""))


if __name__ == "__main__":
    main()
