#!/usr/bin/env python
"""Parquet read speed (issue 23): Ember's node-side reader vs a bare pyarrow.dataset scan of the
same files, and vs Petastorm's batch reader where it runs on this stack.

Data: --rows rows of {image: array<float> of 784 (Spark's ArrayType(FloatType), a Parquet list),
label: int64}, written once into a temporary directory as --files files with row groups of
--row-group rows (then read through the page cache: every file is read once before any timing).
Each contender reads every row into numpy batches of --batch rows (image float32 [B, 784],
label int64 [B]), --repeats times, taking turns (one round = each contender once); medians and
bests are reported.

  ember      ember.data.parquet_batches(dir, {"image": (784,), "label": None}, B): one object,
             iterated once per round as a training loop iterates it once per epoch
  bare       pyarrow.dataset.dataset(dir).to_batches(columns, batch_size=B), each batch's columns
             to numpy as a user would (image: the list's flattened values reshaped to [B, 784])
  decode     the floor, not a contender: every row group read by Arrow's ParquetFile.read_row_group
             on 2 threads (one row group each, as Ember's 2 readers), into Arrow tables only, no
             batching, no numpy: what any reader of these files pays to decode them
  petastorm  petastorm.make_batch_reader(file:// URL, schema_fields=[image, label]) (0.12.1, its
             last release), its batches re-cut to B rows; in an environment of its own
             (bench/.petastorm-site: pyarrow 12, numpy 1.26, pip --target) since it needs
             pyarrow's legacy ParquetDataset (validate_schema=, pyarrow.filesystem), gone from
             pyarrow >= 15; one subprocess per round, which
             times one pass after a warm-up pass.  If it cannot be installed or run here, the
             reason is printed and the ratio to it is left out.

Last line: parquet_rows_per_sec: ember=<v> bare=<v> decode=<v> [petastorm=<v>] ember_vs_bare=<r>
           ember_vs_decode=<r> [ember_vs_petastorm=<r>]

  .venv/bin/python bench/parquet.py                       # ~2 min
  .venv/bin/python bench/parquet.py --rows 50000 --repeats 2   # quick
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
PETASTORM_SITE = Path(__file__).resolve().parent / ".petastorm-site"
# Petastorm's last release needs pyarrow's legacy ParquetDataset, which pyarrow >= 15 no longer has: it runs in
# an environment of its own (pip --target, no deps: these pins, then the venv's pyspark, six, ...),
# in a subprocess per round.
PETASTORM = ["petastorm==0.12.1", "pyarrow==12.0.1", "numpy==1.26.4", "pandas==2.1.4", "pytz==2024.2",
             "diskcache==5.6.3", "dill==0.3.9", "future==1.0.0", "fsspec==2024.10.0", "psutil==6.1.0", "pyzmq==26.2.0"]
WIDTH = 784


def write_data(d: Path, rows: int, files: int, row_group: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(7)
    per = -(-rows // files)
    for f in range(files):
        n = min(per, rows - f * per)
        if n <= 0:
            break
        x = rng.random((n, WIDTH), dtype=np.float32)
        image = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * WIDTH), pa.array(x.ravel()))
        table = pa.table({"image": image, "label": pa.array(np.arange(f * per, f * per + n, dtype=np.int64))})
        pq.write_table(table, str(d / f"part-{f:05d}.parquet"), row_group_size=row_group)


def read_ember(path: str, batch: int):
    import ember

    data = ember.data.parquet_batches(path, {"image": (WIDTH,), "label": None}, batch, shard=(0, 1))

    def run() -> int:
        n = 0
        for b in data:
            assert b["image"].shape[1] == WIDTH
            n += len(b["label"])
        return n
    return run


def read_bare(path: str, batch: int):
    import pyarrow.dataset as pads

    def run() -> int:
        n = 0
        for rb in pads.dataset(path, format="parquet").to_batches(columns=["image", "label"], batch_size=batch):
            image = rb.column(0).flatten().to_numpy(zero_copy_only=False).reshape(-1, WIDTH)
            label = rb.column(1).to_numpy()
            assert image.shape[0] == len(label)
            n += len(label)
        return n
    return run


def read_decode(path: str, batch: int):
    import concurrent.futures

    import pyarrow.parquet as pq

    files = sorted(str(p) for p in Path(path).iterdir())
    jobs = [(f, g) for f in files for g in range(pq.ParquetFile(f).metadata.num_row_groups)]

    def one(job) -> int:
        f, g = job
        return pq.ParquetFile(f).read_row_group(g, columns=["image", "label"], use_threads=False).num_rows

    def run() -> int:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            return sum(pool.map(one, jobs))
    return run


def ensure_petastorm() -> str:
    """'' once petastorm runs in its own environment (bench/.petastorm-site), else why not."""
    if not (PETASTORM_SITE / "petastorm").exists():
        C.log(f"installing {' '.join(PETASTORM)} into {PETASTORM_SITE} (pip --target, no deps)")
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                               "--no-deps", "--target", str(PETASTORM_SITE), *PETASTORM],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(PETASTORM_SITE, ignore_errors=True)
            return f"pip install failed: {proc.stderr.strip()[-400:]}"
    proc = subprocess.run([sys.executable, "-c", "import petastorm, pyarrow; print(pyarrow.__version__)"],
                          capture_output=True, text=True, env=_petastorm_env())
    if proc.returncode != 0:
        return f"import petastorm: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
    return ""


def _petastorm_env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(PETASTORM_SITE), os.environ.get("PYTHONPATH", "")]))


# One round of Petastorm in its own environment: a warm-up pass, then one timed pass; prints the
# rows and seconds of the timed one.
PETASTORM_ROUND = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore", FutureWarning)
import numpy as np
from petastorm import make_batch_reader
path, batch, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

def one_pass():
    n = pending = 0
    with make_batch_reader("file://" + path, schema_fields=["image", "label"], num_epochs=1,
                           shuffle_row_groups=False) as reader:  # its default pool: 10 threads
        for b in reader:
            image = np.stack(b.image) if b.image.dtype == object else b.image
            assert image.shape[-1] == width
            pending += len(b.label)
            while pending >= batch:  # cut into batches of B, as the others give
                pending -= batch
                n += batch
    return n + pending

one_pass()
t0 = time.perf_counter()
rows = one_pass()
print(json.dumps({"rows": rows, "secs": time.perf_counter() - t0}))
"""


def read_petastorm(path: str, batch: int):
    """A round of Petastorm: the subprocess's own timing of its pass (its start-up not counted)."""
    def run() -> tuple:
        proc = subprocess.run([sys.executable, "-c", PETASTORM_ROUND, path, str(batch), str(WIDTH)],
                              capture_output=True, text=True, env=_petastorm_env(), timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"petastorm's round failed: {proc.stderr.strip()[-600:]}")
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        return got["rows"], got["secs"]
    return run


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--row-group", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--skip-petastorm", action="store_true")
    a = p.parse_args(argv)
    C.log(C.machine_info())
    d = Path(tempfile.mkdtemp(prefix="ember-bench-parquet-"))
    try:
        write_data(d, a.rows, a.files, a.row_group)
        mb = sum(f.stat().st_size for f in d.iterdir()) / 1e6
        C.log(f"{a.rows:,} rows x {WIDTH} floats in {a.files} files ({mb:,.0f} MB), row groups of {a.row_group:,}")
        contenders = {"ember": read_ember(str(d), a.batch), "bare": read_bare(str(d), a.batch),
                      "decode": read_decode(str(d), a.batch)}
        why = "skipped (--skip-petastorm)" if a.skip_petastorm else ensure_petastorm()
        if why:
            C.log(f"petastorm: not run: {why}")
        for name, run in contenders.items():  # warm-up: the page cache, imports, Arrow's pools
            got = run()
            assert got == a.rows, (name, got)
        if not why:  # Petastorm warms up inside each of its rounds (a process of its own)
            contenders["petastorm"] = read_petastorm(str(d), a.batch)
        rates = {name: [] for name in contenders}
        cpu = {name: 0.0 for name in contenders}
        for r in range(a.repeats):
            for name, run in contenders.items():
                c0, t0 = time.process_time(), time.perf_counter()
                got = run()
                secs = time.perf_counter() - t0
                cpu[name] += time.process_time() - c0
                if isinstance(got, tuple):  # timed by its own process
                    got, secs = got
                assert got == a.rows, (name, got)
                rates[name].append(a.rows / secs)
                C.log(f"{name} round {r + 1}: {a.rows:,} rows in {secs:.2f}s = {C.fmt_rate(a.rows / secs)} rows/s")
        for name in contenders:
            spent = f"{cpu[name] / a.repeats:.2f} CPU s per pass" if name != "petastorm" else "its own process"
            C.log(f"{name}: median {C.fmt_rate(C.median(rates[name]))} rows/s, best {C.fmt_rate(max(rates[name]))}, "
                  f"{spent}; load {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    med = {name: C.median(v) for name, v in rates.items()}
    line = " ".join(f"{name}={med[name]:.0f}" for name in med) + f" ember_vs_bare={med['ember'] / med['bare']:.3f}"
    line += f" ember_vs_decode={med['ember'] / med['decode']:.3f}"
    if "petastorm" in med:
        line += f" ember_vs_petastorm={med['ember'] / med['petastorm']:.3f}"
    print(f"parquet_rows_per_sec: {line}", flush=True)


if __name__ == "__main__":
    main()
