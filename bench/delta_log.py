#!/usr/bin/env python
"""Delta table snapshot resolution (issue 23): Ember's own read of the transaction log vs
delta-rs's ``deltalake`` package (the well-kept library for it), on the same table.

What is timed is what a node does before it reads a row: from the table's path to the snapshot's
data files and their partition values.

  ember      ember.data.delta_snapshot(path): lists _delta_log through Ember's FileSystem layer,
             reads the newest checkpoint (Arrow) and the JSON commits after it
  deltalake  deltalake.DeltaTable(path).file_uris() and get_add_actions() (partition values), in
             an environment of its own (bench/.delta-site, pip --target) since its wheel is 52 MB
             that Ember does not need; one subprocess per round, timing its calls after a warm-up

The table: --commits appends of one small partitioned file each (deltalake writes them), a
checkpoint every --checkpoint-every commits (default: 350 and 100, so the snapshot is the checkpoint
of version 299 plus the 50 JSON commits after it, as a long-lived table's is).  Both read it through the page cache.

Last line: delta_snapshot_ms: ember=<v> deltalake=<v> ember_vs_deltalake=<speed ratio>

  .venv/bin/python bench/delta_log.py                 # ~1 min (the install once: ~1 min more)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

SITE = Path(__file__).resolve().parent / ".delta-site"
DELTALAKE = ["deltalake==1.6.6"]

# Runs in deltalake's environment: makes the table (write), or times one round (read).
HELPER = r"""
import json, sys, time
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
what, path = sys.argv[1], sys.argv[2]
if what == "write":
    commits, every = int(sys.argv[3]), int(sys.argv[4])
    for c in range(commits):
        t = pa.table({"label": pa.array(range(c * 10, c * 10 + 10), pa.int64()),
                      "part": pa.array([c % 4] * 10, pa.int32())})
        write_deltalake(path, t, mode="append", partition_by=["part"])
        if (c + 1) % every == 0:
            DeltaTable(path).create_checkpoint()
    print(json.dumps({"version": DeltaTable(path).version()}))
else:
    def once():
        dt = DeltaTable(path)
        files = dt.file_uris()
        parts = dt.get_add_actions(flatten=True).column("partition.part").to_pylist()
        return len(files), len(parts)
    once()
    secs = []
    for _ in range(int(sys.argv[3])):
        t0 = time.perf_counter()
        n = once()
        secs.append(time.perf_counter() - t0)
    print(json.dumps({"files": n[0], "secs": secs}))
"""


def ensure_deltalake() -> str:
    if not (SITE / "deltalake").exists():
        C.log(f"installing {' '.join(DELTALAKE)} into {SITE} (pip --target)")
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                               "--target", str(SITE), *DELTALAKE], capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(SITE, ignore_errors=True)
            return f"pip install failed: {proc.stderr.strip()[-400:]}"
    return ""


def helper(*args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(SITE))
    proc = subprocess.run([sys.executable, "-c", HELPER, *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=1200)
    if proc.returncode != 0:
        raise RuntimeError(f"deltalake helper {args[0]} failed: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--commits", type=int, default=350)
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--calls", type=int, default=5, help="timed calls per round")
    a = p.parse_args(argv)
    C.log(C.machine_info())
    why = ensure_deltalake()
    if why:
        raise SystemExit(f"deltalake cannot run here: {why}")
    d = Path(tempfile.mkdtemp(prefix="ember-bench-delta-")) / "t"
    try:
        made = helper("write", d, a.commits, a.checkpoint_every)
        logs = sorted(os.listdir(d / "_delta_log"))
        C.log(f"table {d}: version {made['version']}, {len(logs)} log files "
              f"({sum(1 for n in logs if 'checkpoint.parquet' in n)} checkpoints)")
        import ember

        want = len(ember.data.delta_snapshot(str(d)).files)
        ember_ms, dl_ms = [], []
        cpu = 0.0
        for r in range(a.repeats):
            c0 = time.process_time()
            secs = []
            for _ in range(a.calls):
                t0 = time.perf_counter()
                snap = ember.data.delta_snapshot(str(d))
                secs.append(time.perf_counter() - t0)
                assert len(snap.files) == want
            cpu += time.process_time() - c0
            ember_ms.append(1000 * C.median(secs))
            got = helper("read", d, a.calls)
            assert got["files"] == want, (got, want)
            dl_ms.append(1000 * C.median(got["secs"]))
            C.log(f"round {r + 1}: ember {ember_ms[-1]:.1f} ms, deltalake {dl_ms[-1]:.1f} ms ({want} files)")
        C.log(f"ember {cpu / (a.repeats * a.calls) * 1000:.1f} CPU ms per snapshot; load {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(d.parent, ignore_errors=True)
    e, dl = C.median(ember_ms), C.median(dl_ms)
    print(f"delta_snapshot_ms: ember={e:.1f} deltalake={dl:.1f} ember_vs_deltalake={dl / e:.3f}", flush=True)


if __name__ == "__main__":
    main()
