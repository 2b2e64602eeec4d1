"""Shared pieces of the benchmarks in bench/: Spark standalone cluster, TFoS install, data, stats.

Nothing here is part of Ember.  Import it from a bench script *before* pyspark starts a JVM:
importing sets PYSPARK_PYTHON and PYTHONPATH (bench/ and python/tests/) so that executors and
Ember nodes can import this module and the StandaloneCluster harness by name.
"""
from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
TESTS_DIR = REPO / "python" / "tests"
TFOS_VERSION = "2.2.5"
# TFoS 2.2.5 is pure Python (needs packaging, setuptools' pkg_resources, six, pyspark,
# tensorflow): it runs on the main venv's pinned versions.  It is installed with pip's
# --target into this directory, not into the main venv, and put on sys.path / the
# executors' PYTHONPATH only for the TFoS application.
TFOS_SITE = BENCH_DIR / ".tfos-site"

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
_paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
for _p in (str(TESTS_DIR), str(BENCH_DIR)):
    if _p not in _paths:
        _paths.insert(0, _p)
os.environ["PYTHONPATH"] = os.pathsep.join(_paths)
for _p in (str(TESTS_DIR), str(BENCH_DIR)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

IMAGE_BYTES = 784  # 28 x 28 uint8, Fashion-MNIST's shape


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a peer that must be told its port up front)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def fmt_rate(v: float) -> str:
    return f"{v:.0f}" if v == v else "nan"


def machine_info() -> str:
    load = os.getloadavg()
    return (f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, "
            f"load avg {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}, python {platform.python_version()}, "
            f"{datetime.datetime.now().isoformat(timespec='seconds')}")


def versions() -> str:
    import pyarrow
    import pyspark
    out = [f"pyspark {pyspark.__version__}", f"pyarrow {pyarrow.__version__}"]
    try:
        from importlib.metadata import version
        out.append(f"tensorflow-cpu {version('tensorflow-cpu')}")
    except Exception:  # noqa: BLE001
        pass
    return ", ".join(out)


# ----------------------------------------------------------------------------- TFoS
def ensure_tfos() -> str:
    """Installs tensorflowonspark==2.2.5 into bench/.tfos-site (once) and makes it importable
    here; returns a description of the environment it runs in."""
    pkg = TFOS_SITE / "tensorflowonspark" / "TFCluster.py"
    if not pkg.exists():
        log(f"installing tensorflowonspark=={TFOS_VERSION} into {TFOS_SITE} (pip --target, no deps)")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-deps", "--target", str(TFOS_SITE), f"tensorflowonspark=={TFOS_VERSION}"],
                       check=True)
    if str(TFOS_SITE) not in sys.path:
        sys.path.insert(0, str(TFOS_SITE))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import tensorflowonspark
    return (f"tensorflowonspark {tensorflowonspark.__version__} from {TFOS_SITE} on the main venv's "
            f"pinned versions ({versions()}, python {platform.python_version()})")


# ----------------------------------------------------------------------------- Spark
def pythonpath_with(*dirs) -> str:
    """PYTHONPATH for executors: `dirs` first, then this process's (spark.executorEnv.PYTHONPATH
    replaces the inherited one)."""
    return os.pathsep.join([str(d) for d in dirs] + [os.environ.get("PYTHONPATH", "")])


def own_python_workers(spark, column: str, *udfs) -> None:
    """Makes Spark's own UDFs `udfs` (called once here, on `column`) run in Python workers of their
    own, as in an application without Ember.  Spark pools its Python workers by (python,
    environment), and a UDF takes the context's environment when it is first called (its Java
    side is made then and kept).  Ember settles each worker it runs in once (ember._feeder.worker:
    no per-task re-read of Spark's zips, the loaded modules out of the collector's walks), which
    would speed up a later UDF in that worker too."""
    from pyspark.sql import functions as F

    env = spark.sparkContext.environment
    env["EMBER_BENCH_WORKERS"] = "spark-only"
    try:
        for udf in udfs:
            udf(F.col(column))
    finally:
        del env["EMBER_BENCH_WORKERS"]


def start_standalone(num_workers: int = 2, cores_per_worker: int = 2, memory: str = "3g"):
    from spark_cluster import StandaloneCluster
    cluster = StandaloneCluster(num_workers=num_workers, cores_per_worker=cores_per_worker,
                                memory=memory, daemon_memory="512m", start_timeout=120)
    cluster.start()
    return cluster


def session(cluster, app: str, **conf: str):
    base = {"spark.sql.shuffle.partitions": "4", "spark.executor.memory": "2g",
            "spark.python.worker.reuse": "true"}
    base.update(conf)
    spark = cluster.session(app, **base)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def wait_executors(sc, n: int, timeout: float = 90.0) -> None:
    """Waits until `n` executors registered (standalone executors start after the context)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # getExecutorInfos includes the driver
        if len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1 >= n:
            return
        time.sleep(0.25)
    raise RuntimeError(f"only {len(sc._jsc.sc().statusTracker().getExecutorInfos()) - 1} of {n} executors registered")


def run_as_connect_client(master: str, conf: Dict[str, str], script_args: List[str], marker: str):
    """Starts a Spark Connect server (pyspark's own distribution) whose application runs on
    `master` with `conf`, runs ``python <script_args> --remote <url>`` as its client, echoes the
    client's log lines (marked), and returns the JSON the client printed after `marker`.  The
    server is stopped on every path."""
    import json
    import tempfile

    from connect_server import ConnectServer  # python/tests (on sys.path above)

    log_path = Path(tempfile.mkdtemp(prefix="ember-bench-connect-")) / "server.log"
    server = ConnectServer(master, log_path, conf=conf)
    try:
        log(f"Spark Connect: server {server.url} on {master} (log {log_path}); the client: {' '.join(script_args)}")
        proc = subprocess.run([sys.executable] + script_args + ["--remote", server.url], stdout=subprocess.PIPE,
                              text=True, timeout=7200)
        for line in proc.stdout.splitlines():  # its log lines, marked as the Connect client's
            if line.startswith("["):
                print(f"{line}   (Connect client)", flush=True)
        found = [line for line in proc.stdout.splitlines() if line.startswith(marker + " ")]
        if proc.returncode or not found:
            raise RuntimeError(f"the Connect client exited {proc.returncode}: {proc.stdout[-3000:]}\n"
                               f"server log:\n{server.log_tail()}")
        return json.loads(found[-1][len(marker) + 1:])
    finally:
        server.stop()


# ----------------------------------------------------------------------------- data
def synthetic_images(batches, seed: int = 7):
    """mapInArrow function: spark.range ids -> (image binary(784), label int), deterministic
    per id batch (random bytes, like Fashion-MNIST's uint8 pixels)."""
    import numpy as np
    import pyarrow as pa
    for b in batches:
        ids = b.column(0).to_numpy()
        n = len(ids)
        if n == 0:
            continue
        rng = np.random.default_rng([seed, int(ids[0])])
        data = rng.integers(0, 256, size=n * IMAGE_BYTES, dtype=np.uint8)
        offsets = np.arange(0, (n + 1) * IMAGE_BYTES, IMAGE_BYTES, dtype=np.int32)
        image = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        label = pa.array((ids % 10).astype(np.int32))
        yield pa.RecordBatch.from_arrays([image, label], names=["image", "label"])


def synthetic_df(spark, rows: int, partitions: int):
    """A cached Fashion-MNIST-shaped DataFrame (image binary, label int), materialized."""
    df = (spark.range(0, rows, 1, partitions)
          .mapInArrow(synthetic_images, "image binary, label int")
          .cache())
    n = df.count()
    assert n == rows, (n, rows)
    return df


def cached_fraction(sc) -> str:
    infos = sc._jsc.sc().getRDDStorageInfo()
    parts = []
    for info in infos:
        parts.append(f"{info.numCachedPartitions()}/{info.numPartitions()} partitions cached, "
                     f"{info.memSize() / 2**20:.0f} MiB in memory, {info.diskSize() / 2**20:.0f} MiB on disk")
    return "; ".join(parts) or "nothing cached"


_CLK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> Optional[tuple]:
    """(cmdline, cpu seconds incl. reaped children) of a live process, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, IndexError):
        return None
    # fields after ")": state=0 ppid=1 ... utime=11 stime=12 cutime=13 cstime=14
    return cmd, sum(int(x) for x in stat[11:15]) / _CLK


def _kind(cmd: str) -> str:
    if "CoarseGrainedExecutorBackend" in cmd:
        return "executor_jvm"
    if "ember._node.main" in cmd:
        return "ember_node"
    if "pyspark.daemon" in cmd or "pyspark.worker" in cmd:
        return "python_worker"  # TFoS's node and manager processes are forks of these
    if "deploy.master" in cmd or "deploy.worker" in cmd:
        return "spark_daemons"
    return "other"


def cpu_snapshot(cluster) -> Dict[str, float]:
    """CPU seconds used so far by each kind of process of the standalone cluster (executor JVMs,
    Python workers, Ember nodes, ...) and by the driver (this process and its JVM).

    Differences between two snapshots measure a run's CPU cost, which unlike wall time does not
    depend on what else the (shared) machine is doing.  Processes that exited in between are
    counted through their parent's reaped-children time where the parent lives on."""
    out: Dict[str, float] = {}
    me = os.getpid()
    pids = set(cluster.processes())
    for entry in os.listdir("/proc"):  # the driver JVM: a child of this process
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == me:
                pids.add(int(entry))
    for pid in pids:
        got = _proc_cpu(pid)
        if got is None:
            continue
        cmd, secs = got
        kind = "driver" if "SparkSubmit" in cmd else _kind(cmd)
        out[kind] = out.get(kind, 0.0) + secs
    t = os.times()
    out["driver"] = out.get("driver", 0.0) + t.user + t.system
    return out


def cpu_delta(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, float]:
    keys = set(before) | set(after)
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in keys}
    d = {k: v for k, v in d.items() if abs(v) >= 0.005}
    d["total"] = sum(d.values())
    return d


def fmt_cpu(d: Dict[str, float]) -> str:
    order = ["executor_jvm", "python_worker", "ember_node", "driver", "spark_daemons", "other"]
    parts = [f"{k} {d[k]:.2f}" for k in order if k in d]
    return f"cpu {d.get('total', 0):.2f}s ({', '.join(parts)})"


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g}s for {what}")
        time.sleep(0.05)
