"""Scaling model: measured points on 1, 2 and 3 "hosts" (network namespaces) and an α-β fit.

Nothing here is part of Ember.  Needs root (network namespaces); refused, it says why and exits 2.

Hosts are network namespaces joined by a bridge (python/tests/netns_cluster.py, imported, not
copied), each with a private /dev/shm, so ranks and nodes on different hosts talk over TCP only.

Measured:
  1. allreduce: float32 sum allreduce of 4 B .. 64 MiB over Ember's TCP ring, one rank per host
     (the C++ harness bench/collective/ember_allreduce, ranks forked into the namespaces), on 1, 2
     and 3 hosts, with each host's eth0 unshaped ("veth") and shaped by tbf to 10 and 1 Gbit/s.
     This kernel has no sch_netem, so no delay is added: α is the measured veth latency.
  2. Cluster.run start-up (call to return, every node registered) and shutdown,
  3. time to detect a dead node (the last node SIGKILLs itself; from its kill to the driver's
     shutdown() raising),
  4. InputMode.SPARK feed rows/s per node (784-byte rows, cached DataFrame; and 110 KB rows),
     (2)-(4) on a Spark standalone cluster whose master and driver run on host "drv" and one
     worker per host on 1 and 2 worker hosts (unshaped veths).

Fits (least squares on relative error, so that 4 B and 64 MiB points weigh alike):
  ring allreduce  T(N, S) = 2(N-1)·α + 2(N-1)/N · S/B     per bandwidth setting
  feed epoch      T = t0 + rows_per_node·c_row + batches_per_node·c_batch
prints measured vs predicted with the relative error of every point, and a 100-node projection.

  .venv/bin/python bench/scaling.py                 # everything (~3 min on a loaded 2-core box)
  .venv/bin/python bench/scaling.py --skip-cluster  # allreduce points and fit only (~1.5 min)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, log, machine_info, median  # noqa: E402  (puts python/tests on sys.path)

KiB, MiB = 1 << 10, 1 << 20
SIZES = [4, 4 * KiB, 64 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB]
# tbf's burst must hold at least rate/HZ bytes and one GSO super-packet (64 KiB), else it stalls.
SHAPES = {"veth": None,
          "10gbit": "tbf rate 10gbit burst 4mb latency 50ms",
          "1gbit": "tbf rate 1gbit burst 512kb latency 50ms"}
RATE_GBPS = {"veth": None, "10gbit": 10.0, "1gbit": 1.0}
HOSTS3 = ("h1", "h2", "h3")
ROW_BYTES = 784
FEED_ROWS = (50_000, 250_000)
FEED_BATCHES = (100, 1000)
BIG_ROW_BYTES, BIG_ROWS, BIG_BATCH = 110_000, 3_000, 32  # ImageNet-JPEG-sized rows


# ----------------------------------------------------------------------------- allreduce points
def build_harness() -> Path:
    from allreduce import BUILD
    if not (BUILD / "build.ninja").exists():
        subprocess.run(["cmake", "-S", str(REPO / "bench" / "collective"), "-B", str(BUILD), "-G", "Ninja",
                        "-DCMAKE_BUILD_TYPE=Release"], check=True, capture_output=True)
    r = subprocess.run(["cmake", "--build", str(BUILD), "--target", "ember_allreduce"], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("building bench/collective's ember_allreduce failed:\n" + r.stdout[-2000:])
    return BUILD / "ember_allreduce"


def allreduce_points(binary: Path, shapes: List[str], host_counts: List[int], sizes: List[int],
                     repeats: int, min_iters: int, min_secs: float) -> List[dict]:
    """[{shape, n, bytes, secs}] : median over `repeats` of the harness's slowest-rank median."""
    from allreduce import Harness, fmt_size, warmup_for
    from netns_cluster import NetnsNetwork

    points = []
    for shape in shapes:
        spec = SHAPES[shape]
        net = NetnsNetwork(list(HOSTS3), subnet="10.98.0", shaping={h: spec for h in HOSTS3} if spec else None)
        try:
            net.create()
            for n in host_counts:
                if n == 1 and shape != "veth":
                    continue  # one rank sends nothing: the link's shaping cannot matter
                hosts = [net.hosts[h] for h in HOSTS3[:n]]
                # One rank sends nothing: kAuto, the single-rank path (kTcp with one rank takes it too).
                tcp = ["--tcp"] if n > 1 else []
                h = Harness(f"ember_tcp_{shape}_{n}", [str(binary), "--ranks", str(n), *tcp,
                                                      "--netns", ",".join(x.netns for x in hosts),
                                                      "--hosts", ",".join(x.address for x in hosts)])
                try:
                    if not h.wait_ready(120):
                        raise RuntimeError(f"allreduce harness on {n} hosts ({shape}) did not start: {h.error}")
                    for nbytes in sizes:
                        runs = []
                        for _ in range(repeats):
                            # One rank: a no-op call, so a time budget would mean ~10^5 refills and checks.
                            d = h.ask(f"run {nbytes} {warmup_for(nbytes)} {min_iters} {min_secs if n > 1 else 0}")
                            if d is None:
                                raise RuntimeError(f"allreduce on {n} hosts ({shape}), {fmt_size(nbytes)}: {h.error}")
                            runs.append(d["median_s"])
                        p = {"shape": shape, "n": n, "bytes": nbytes, "secs": median(runs),
                             "load": os.getloadavg()[0]}
                        points.append(p)
                        log(f"allreduce {shape:6} {n} hosts {fmt_size(nbytes):>7}: {p['secs'] * 1e6:10.1f} us "
                            f"(runs {', '.join(f'{r * 1e6:.0f}' for r in runs)}; load {p['load']:.2f})")
                finally:
                    h.close()
        finally:
            net.destroy()
            left = net.leftovers()
            if left:
                raise RuntimeError(f"namespaces of the allreduce run left behind: {left}")
    return points


def fit_ring(points: List[dict]) -> Tuple[float, float]:
    """(α seconds, B bytes/s) minimizing Σ((pred - T)/T)² over points with N >= 2."""
    import numpy as np
    pts = [p for p in points if p["n"] >= 2]
    a = np.array([[2 * (p["n"] - 1), 2 * (p["n"] - 1) / p["n"] * p["bytes"]] for p in pts])
    t = np.array([p["secs"] for p in pts])
    coef, *_ = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)
    alpha, inv_b = float(coef[0]), float(coef[1])
    return alpha, (1.0 / inv_b if inv_b > 0 else float("inf"))


def ring_time(n: int, nbytes: float, alpha: float, bw: float) -> float:
    return 0.0 if n < 2 else 2 * (n - 1) * alpha + 2 * (n - 1) / n * nbytes / bw


# ----------------------------------------------------------------------------- cluster points
def idle_node(args, ctx):
    return None


def dying_node(args, ctx):
    """The last node SIGKILLs itself after `args['delay']` s, writing the wall time of the kill
    first; the others wait in an allreduce (its peer's death ends it)."""
    import signal

    import numpy as np
    comm = ctx.communicator(timeout=60) if args["n"] > 1 else None
    if ctx.training_rank == args["n"] - 1:
        time.sleep(args["delay"])
        Path(args["out"]).write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    if comm is not None:
        comm.allreduce(np.ones(1000, np.float32))


def big_rows(batches):
    """mapInArrow function: ids -> (image binary(BIG_ROW_BYTES), label int), same bytes in every row."""
    import numpy as np
    import pyarrow as pa
    payload = np.random.default_rng(7).integers(0, 256, BIG_ROW_BYTES, dtype=np.uint8).tobytes()
    for b in batches:
        n = b.num_rows
        image = pa.array([payload] * n, pa.binary())
        yield pa.RecordBatch.from_arrays([image, pa.array(np.zeros(n, np.int32))], names=["image", "label"])


def feed_node(args, ctx):
    """Reads one epoch per entry of args['batches'] (that batch size), counting rows; writes
    {epoch: [rows, first_row_wall, last_row_wall]} for this node."""
    feed = ctx.get_data_feed()
    done = []
    for b in args["batches"]:
        rows, first, last = 0, None, None
        for cols in feed.epoch_batches(b, drop_remainder=False):
            rows += len(next(iter(cols.values())))
            last = time.time()
            first = first or last
        done.append([rows, first, last])
    Path(args["out"], f"feed-{ctx.task_index}.json").write_text(json.dumps(done))


def driver_main(inp: str, out: str) -> None:
    """Driver program (host "drv"): start-up, dead-node detection and feed on this cluster."""
    import ember
    from _common import synthetic_df, wait_executors
    from pyspark.sql import SparkSession

    conf = json.loads(Path(inp).read_text())
    n, work, repeats = conf["nodes"], Path(conf["work"]), conf["repeats"]
    builder = SparkSession.builder.appName("ember-scaling")
    for k, v in conf["spark_conf"].items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    res: Dict[str, object] = {"nodes": n}

    def save():
        Path(out).write_text(json.dumps(res))

    try:
        wait_executors(spark.sparkContext, n, timeout=180)
        # (2) start-up and shutdown of an idle gang (the first one also checks the executors' Python).
        starts, stops = [], []
        for _ in range(repeats + 1):
            t0 = time.monotonic()
            cluster = ember.Cluster.run(spark, idle_node, {}, num_executors=n, reservation_timeout=120)
            t1 = time.monotonic()
            cluster.shutdown(timeout=120)
            starts.append(t1 - t0)
            stops.append(time.monotonic() - t1)
        res.update(startup_first=starts[0], startup_secs=starts[1:], shutdown_secs=stops[1:])
        save()
        # (3) dead node.
        detects = []
        for i in range(repeats):
            stamp = work / f"killed-{i}"
            cluster = ember.Cluster.run(spark, dying_node, {"n": n, "delay": 1.0, "out": str(stamp)},
                                        num_executors=n, reservation_timeout=120)
            try:
                cluster.shutdown(timeout=120)
                raise RuntimeError("shutdown() raised nothing although a node was SIGKILLed")
            except ember.errors.EmberError as e:
                raised = time.time()
                detects.append(raised - float(stamp.read_text()))
                res["dead_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        res["detect_secs"] = detects
        save()
        # (4) feed.
        dfs = {(ROW_BYTES, r): synthetic_df(spark, r, 4 * n) for r in conf["feed_rows"]}
        big = (BIG_ROW_BYTES, conf["big_rows"])
        dfs[big] = (spark.range(0, big[1], 1, 4 * n).mapInArrow(big_rows, "image binary, label int").cache())
        dfs[big].count()
        # The first epoch (untimed, smallest DataFrame) warms the feeding path up.
        plan = [(ROW_BYTES, min(conf["feed_rows"]), conf["feed_batches"][0])]
        plan += ([(ROW_BYTES, r, b) for r in conf["feed_rows"] for b in conf["feed_batches"]]
                 + [(*big, BIG_BATCH)]) * conf["feed_repeats"]
        fed = work / "feed"
        fed.mkdir()
        cluster = ember.Cluster.run(spark, feed_node, {"batches": [b for *_, b in plan], "out": str(fed)},
                                    num_executors=n, input_mode=ember.InputMode.SPARK, reservation_timeout=120)
        calls = []
        for size, r, b in plan:
            t0 = time.time()
            cluster.train(dfs[(size, r)], num_epochs=1, feed_timeout=300)
            calls.append([size, r, b, t0, time.time()])
        cluster.shutdown(timeout=120)
        nodes = [json.loads((fed / f"feed-{i}.json").read_text()) for i in range(n)]
        epochs = []
        for k, (size, r, b, t0, t1) in enumerate(calls):
            per_node = [nd[k] for nd in nodes]
            end = max([t1] + [p[2] for p in per_node if p[2]])
            epochs.append({"row_bytes": size, "rows": r, "batch": b, "rows_per_node": [p[0] for p in per_node],
                           "secs": end - t0, "first_row_secs": min(p[1] for p in per_node if p[1]) - t0})
        res["feed_warmup"] = epochs[0]
        res["feed"] = epochs[1:]
        save()
    except Exception:  # noqa: BLE001 - reported to the parent with what was measured so far
        res["error"] = traceback.format_exc()
        save()
    finally:
        spark.stop()


def cluster_points(hosts_list: List[Tuple[str, ...]], repeats: int, feed_rows, feed_batches,
                   feed_repeats: int, work: Path) -> List[dict]:
    from netns_cluster import NetnsCluster
    fast_jvm = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    out = []
    for hosts in hosts_list:
        t0 = time.monotonic()
        nc = NetnsCluster(hosts=hosts, cores_per_worker=2, memory="2g")
        d = work / f"cluster-{len(hosts)}"
        d.mkdir(parents=True)
        with nc:
            up = time.monotonic() - t0
            log(f"standalone cluster on {len(hosts)} worker host(s) up in {up:.1f}s")
            r = nc.run_driver(Path(__file__), {"nodes": len(hosts), "work": str(d), "repeats": repeats,
                                               "feed_rows": list(feed_rows), "feed_batches": list(feed_batches),
                                               "feed_repeats": feed_repeats, "big_rows": BIG_ROWS},
                              timeout=900, spark_conf={"spark.driver.extraJavaOptions": fast_jvm,
                                                       "spark.executor.extraJavaOptions": fast_jvm,
                                                       "spark.executor.memory": "1500m"})
        if nc.leftovers:
            raise RuntimeError(f"the {len(hosts)}-host cluster left behind: {nc.leftovers}")
        r["cluster_up_secs"] = up
        r["load"] = os.getloadavg()[0]
        log(f"{len(hosts)} host(s): " + json.dumps({k: v for k, v in r.items() if k != 'feed'}))
        for e in r.get("feed", []):
            log(f"  feed {e['rows']} rows of {e.get('row_bytes', ROW_BYTES)} B batch {e['batch']}: {e['secs']:.2f}s, "
                f"{e['rows'] / len(hosts) / e['secs']:.0f} rows/s per node (per node {e['rows_per_node']})")
        if "error" in r:
            log(f"driver program failed on {len(hosts)} host(s):\n{r['error']}")
        out.append(r)
    return out


def small_epochs(c: dict) -> List[dict]:
    return [e for e in c.get("feed", []) if e.get("row_bytes", ROW_BYTES) == ROW_BYTES]


def big_rate(c: dict, t0: float) -> Tuple[float, float]:
    """Median rows/s per node of the big-row epochs: as measured, and without the fit's t0."""
    es = [e for e in c.get("feed", []) if e.get("row_bytes", ROW_BYTES) == BIG_ROW_BYTES]
    n = c["nodes"]
    return (median([e["rows"] / n / e["secs"] for e in es]),
            median([e["rows"] / n / (e["secs"] - t0) for e in es if e["secs"] > t0]))


def fit_feed(c: dict):
    """(t0, c_row, c_batch) minimizing relative error over the feed epochs of one cluster.  One
    fit per node count: every "host" shares this machine's cores, so a node's costs grow with
    the number of nodes here, which separate machines would not show."""
    import numpy as np
    rows, t = [], []
    n = c["nodes"]
    for e in small_epochs(c):
        rpn = e["rows"] / n
        rows.append([1.0, rpn, rpn / e["batch"]])
        t.append(e["secs"])
    if len(t) < 3:
        return None
    a, t = np.array(rows), np.array(t)
    coef, *_ = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)
    return tuple(float(x) for x in coef)


# ----------------------------------------------------------------------------- report
def report(points: List[dict], clusters: List[dict]) -> Tuple[dict, List[str]]:
    from allreduce import fmt_size
    lines = ["", "== allreduce: measured vs predicted, T = 2(N-1)·α + 2(N-1)/N · S/B (per setting)"]
    fits, worst = {}, 0.0
    for shape in SHAPES:
        pts = [p for p in points if p["shape"] == shape and p["n"] >= 2]
        if len(pts) < 2:
            continue
        alpha, bw = fit_ring(pts)
        fits[shape] = (alpha, bw)
        lines.append(f"-- {shape}: alpha = {alpha * 1e6:.1f} us, B = {bw * 8 / 1e9:.2f} Gbit/s"
                     + (f" (tbf rate {RATE_GBPS[shape]:g} Gbit/s)" if RATE_GBPS[shape] else ""))
        lines.append(f"   {'N':>2} {'size':>8} {'measured us':>12} {'predicted us':>13} {'rel err':>8} {'busbw GB/s':>10}")
        for p in pts:
            pred = ring_time(p["n"], p["bytes"], alpha, bw)
            err = (pred - p["secs"]) / p["secs"]
            worst = max(worst, abs(err))
            bus = p["bytes"] / p["secs"] * 2 * (p["n"] - 1) / p["n"] / 1e9
            lines.append(f"   {p['n']:>2} {fmt_size(p['bytes']):>8} {p['secs'] * 1e6:12.1f} {pred * 1e6:13.1f} "
                         f"{err * 100:7.1f}% {bus:10.3f}")
    one = [p for p in points if p["n"] == 1]
    if one:
        lines.append("-- 1 host (one rank, no network; the model's 0): "
                     + ", ".join(f"{fmt_size(p['bytes'])} {p['secs'] * 1e6:.1f} us" for p in one))

    feed_fits = {c["nodes"]: fit_feed(c) for c in clusters}
    feed_fits = {n: f for n, f in feed_fits.items() if f}
    feed_fit = feed_fits.get(min(feed_fits)) if feed_fits else None
    if clusters:
        lines += ["", "== Spark standalone cluster, 1 worker host per node (unshaped veths)"]
        for c in clusters:
            lines.append(f"-- {c['nodes']} node(s): cluster up {c['cluster_up_secs']:.1f}s; Cluster.run first "
                         f"{c.get('startup_first', float('nan')):.2f}s, then median "
                         f"{median(c.get('startup_secs', [])):.2f}s {c.get('startup_secs')}; shutdown median "
                         f"{median(c.get('shutdown_secs', [])):.2f}s; dead node detected in median "
                         f"{median(c.get('detect_secs', [])):.2f}s {c.get('detect_secs')}"
                         + ("; DRIVER PROGRAM FAILED (see log)" if "error" in c else ""))
        for c in clusters:
            n = c["nodes"]
            if n not in feed_fits:
                continue
            t0, c_row, c_batch = feed_fits[n]
            lines.append(f"-- feed fit, {n} node(s): T_epoch = {t0:.3f} s + rows/node x {c_row * 1e6:.2f} us + "
                         f"batches/node x {c_batch * 1e6:.1f} us")
            lines.append(f"   {'nodes':>5} {'rows':>7} {'batch':>5} {'measured s':>10} {'predicted s':>11} "
                         f"{'rel err':>8} {'rows/s/node':>11}")
            for e in small_epochs(c):
                rpn = e["rows"] / n
                pred = t0 + rpn * c_row + rpn / e["batch"] * c_batch
                lines.append(f"   {n:>5} {e['rows']:>7} {e['batch']:>5} {e['secs']:10.2f} {pred:11.2f} "
                             f"{(pred - e['secs']) / e['secs'] * 100:7.1f}% {rpn / e['secs']:11.0f}")
            raw, net = big_rate(c, t0)
            if raw == raw:
                secs = [round(e["secs"], 2) for e in c["feed"] if e.get("row_bytes") == BIG_ROW_BYTES]
                lines.append(f"   {BIG_ROW_BYTES} B rows ({BIG_ROWS} rows, batch {BIG_BATCH}): {secs} s per epoch, "
                             f"{raw:,.0f} rows/s per node ({raw * BIG_ROW_BYTES / 1e6:.0f} MB/s), "
                             f"{net:,.0f} rows/s ({net * BIG_ROW_BYTES / 1e6:.0f} MB/s) without t0")
    big = big_rate(clusters[0], feed_fit[0]) if clusters and feed_fit else (float("nan"),) * 2
    lines += projection(fits, clusters, feed_fit, big[1])
    return {"fits": fits, "worst": worst, "feed_fit": feed_fit}, lines


def projection(fits: dict, clusters: List[dict], feed_fit, big_bytes_rate: float = float("nan")) -> List[str]:
    n = 100
    grad = 25.6e6 * 4  # ResNet-50's float32 gradients
    out = ["", f"== projection to {n} nodes (EXTRAPOLATED from the fits above; one node per host)"]
    for shape in ("10gbit", "1gbit"):
        if shape not in fits:
            continue
        alpha, bw = fits[shape]
        link = RATE_GBPS[shape] * 1e9 / 8
        t = ring_time(n, grad, alpha, bw)
        lat = 2 * (n - 1) * alpha
        out.append(f"-- {shape}: ResNet-50 gradients ({grad / 1e6:.1f} MB) ring allreduce at {n} nodes: "
                   f"{t:.3f} s per step (latency part {lat * 1e3:.2f} ms, bandwidth part {(t - lat):.3f} s); "
                   f"on the full link rate it would be {ring_time(n, grad, alpha, link):.3f} s")
        for name, row in (("Fashion-MNIST 784 B", 784), ("ImageNet JPEG ~110 KB", 110e3),
                          ("ImageNet decoded 150 KB", 150528)):
            cap = ""
            if feed_fit and row == 784 and feed_fit[1] > 0:
                cap = (f"; the 1-node fit's per-row cost caps it at "
                       f"{1 / (feed_fit[1] + max(feed_fit[2], 0) / 100):,.0f} rows/s (batch 100)")
            elif big_bytes_rate == big_bytes_rate:
                cap = (f"; the 1-node {BIG_ROW_BYTES} B-row feed ({big_bytes_rate * BIG_ROW_BYTES / 1e6:.0f} MB/s "
                       f"without t0) caps it at {big_bytes_rate * BIG_ROW_BYTES / row:,.0f} rows/s")
            elif feed_fit:
                cap = "; the per-byte cost of such rows was not measured"
            out.append(f"   feed {name} rows: the link caps one node at {link / row:,.0f} rows/s{cap}")
    if clusters:
        by_n = {c["nodes"]: c for c in clusters if c.get("startup_secs")}
        if len(by_n) >= 2:
            (n1, c1), (n2, c2) = sorted(by_n.items())[:2]
            s1, s2 = median(c1["startup_secs"]), median(c2["startup_secs"])
            per = (s2 - s1) / (n2 - n1)
            out.append(f"-- start-up: {s1:.2f}s at {n1} node(s), {s2:.2f}s at {n2}: {per:+.2f} s per node "
                       + (f"(linear: {s1 + per * (n - n1):.1f} s at {n})" if per > 0 else
                          "(no growth measurable over 1-2 nodes: nothing to extrapolate)"))
        det = [median(c["detect_secs"]) for c in clusters if c.get("detect_secs")]
        if det:
            out.append(f"-- dead node detected in {min(det):.2f}-{max(det):.2f} s on 1-2 hosts (from the node's exit, "
                       f"not a heartbeat timeout)")
    out.append(f"-- coordinator at {n} nodes: {n} registrations per gang start, heartbeats {n} / 2 s = "
               f"{n / 2:.0f} per second (heartbeat_interval 2 s, include/ember/coordinator.h)")
    return out


# ----------------------------------------------------------------------------- main
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {list(SHAPES)}")
    p.add_argument("--hosts", default="1,2,3", help="host counts for the allreduce (1..3)")
    p.add_argument("--sizes", help="comma list of bytes (K/M suffixes), default 4 B .. 64 MiB")
    p.add_argument("--repeats", type=int, default=2, help="runs per allreduce size / cluster measurement")
    p.add_argument("--min-iters", type=int, default=5)
    p.add_argument("--min-secs", type=float, default=0.2)
    p.add_argument("--skip-allreduce", action="store_true")
    p.add_argument("--skip-cluster", action="store_true")
    p.add_argument("--cluster-hosts", default="1,2", help="worker host counts for the cluster part")
    p.add_argument("--feed-repeats", type=int, default=1)
    p.add_argument("--json", help="write every measurement here")
    p.add_argument("--report", metavar="JSON", help="measure nothing: print the fits and projection of a --json file")
    args = p.parse_args()
    if args.report:
        d = json.loads(Path(args.report).read_text())
        print("\n".join(report(d["allreduce"], d["clusters"])[1]))
        return 0

    from netns_cluster import netns_unavailable_reason
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: namespaces and harnesses are removed
    reason = netns_unavailable_reason()
    if reason:
        print(f"scaling.py needs network namespaces: {reason}", file=sys.stderr)
        return 2
    log(machine_info())
    log(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    from allreduce import parse_size
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else SIZES
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        p.error(f"unknown --shapes {unknown}; known: {list(SHAPES)}")
    points, clusters = [], []
    if not args.skip_allreduce:
        binary = build_harness()
        points = allreduce_points(binary, shapes, [int(x) for x in args.hosts.split(",")], sizes,
                                  args.repeats, args.min_iters, args.min_secs)
    if not args.skip_cluster:
        import tempfile
        with tempfile.TemporaryDirectory(prefix="ember-scaling-") as work:
            hl = [tuple(f"h{i + 1}" for i in range(int(k))) for k in args.cluster_hosts.split(",")]
            clusters = cluster_points(hl, args.repeats, FEED_ROWS, FEED_BATCHES, args.feed_repeats, Path(work))
    summary, lines = report(points, clusters)
    print("\n".join(lines))
    log(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    if args.json:
        Path(args.json).write_text(json.dumps({"allreduce": points, "clusters": clusters,
                                               "fits": summary["fits"], "feed_fit": summary["feed_fit"]}, indent=1))
    ref = summary["fits"].get("1gbit") or summary["fits"].get("10gbit") or summary["fits"].get("veth")
    if ref is None:
        print("scaling_allreduce_model: alpha_us=nan bandwidth_gbps=nan max_rel_error=nan")
        return 1
    ref_shape = next(s for s in ("1gbit", "10gbit", "veth") if s in summary["fits"])
    print(f"(last line: the fit of setting {ref_shape}; max_rel_error over every setting's points)")
    print(f"scaling_allreduce_model: alpha_us={ref[0] * 1e6:.1f} bandwidth_gbps={ref[1] * 8 / 1e9:.3f} "
          f"max_rel_error={summary['worst']:.3f}")
    failed = [c["nodes"] for c in clusters if "error" in c]
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1].endswith(".in.json"):  # NetnsCluster.run_driver in host "drv"
        import scaling  # by name, so that node functions pickle by reference
        scaling.driver_main(sys.argv[1], sys.argv[2])
    else:
        sys.exit(main())
