#!/usr/bin/env python
"""cluster.train(df) of a plain Parquet scan (issue 23, point 3): the nodes read the files in place
vs the same DataFrame's rows fed through Spark, vs Spark's own bare drain of it (the floor of any
path through Spark's Python workers).

Data: --rows rows of {image: binary of --row-bytes random bytes (an encoded or raw image), label:
long} written once by Arrow's writer into --files Parquet files (row groups of --row-group rows),
read back through the page cache; the DataFrame is ``spark.read.parquet(dir)``, not cached (a
table as it lies on disk).  A Spark standalone cluster of 2 workers x 2 cores on this host, 2
nodes; each node drains ``feed.epoch_batches(--batch)`` and counts rows and bytes.

  files  cluster.train(df): a plain scan, so the feeding tasks (one per file) send row-group
         references and each node reads its rows with Arrow (the default, spark.ember.feed.source=auto)
  rows   the same call with spark.ember.feed.source=spark: the executors read the files, Spark hands
         the rows to its Python workers, which feed them to the nodes (InputMode.SPARK as before)
  bare   df.mapInArrow(count) over the same DataFrame: Spark handing the rows to Python at all

Time of a train call: from the call to the later of (train returns, the last node's last row), as
bench/feed.py times it.  The three take turns, --repeats rounds; medians.  CPU seconds of every
process of the cluster are reported per contender (cpu_snapshot).

Last line: feed_files_rows_per_sec: files=<v> rows=<v> bare=<v> files_vs_rows=<r> files_vs_bare=<r>

  .venv/bin/python bench/feed_files.py                  # defaults: 8,000 rows of 100 KB (800 MB), 3 rounds
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (sets PYTHONPATH/PYSPARK_PYTHON before Spark starts)


def drain(args, ctx):
    """A node: drains every epoch cluster.train feeds; one JSON line per epoch (rows, bytes, end time)."""
    import json
    import time

    feed = ctx.get_data_feed()
    while not feed.should_stop():
        rows = nbytes = 0
        for b in feed.epoch_batches(args["batch"]):
            rows += len(b["label"])
            nbytes += b["image"].nbytes
        if rows == 0:
            break
        with open(f"{args['out']}/{ctx.task_index}.jsonl", "a") as f:
            f.write(json.dumps({"rows": rows, "bytes": nbytes, "end": time.time()}) + "\n")


def write_data(d: Path, rows: int, row_bytes: int, files: int, row_group: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(3)
    per = -(-rows // files)
    for f in range(files):
        n = min(per, rows - f * per)
        flat = rng.integers(0, 256, size=n * row_bytes, dtype=np.uint8)
        offsets = np.arange(0, (n + 1) * row_bytes, row_bytes, dtype=np.int32)
        image = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(flat)])
        table = pa.table({"image": image, "label": pa.array(np.arange(f * per, f * per + n, dtype=np.int64))})
        pq.write_table(table, str(d / f"part-{f:05d}.parquet"), row_group_size=row_group, compression="none")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=8000)
    p.add_argument("--row-bytes", type=int, default=100_000)
    p.add_argument("--files", type=int, default=8)
    p.add_argument("--row-group", type=int, default=250)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    C.log(C.machine_info())
    import ember

    data = Path(tempfile.mkdtemp(prefix="ember-bench-feed-files-"))
    out = Path(tempfile.mkdtemp(prefix="ember-bench-feed-files-out-"))
    cluster = C.start_standalone(num_workers=2, cores_per_worker=2, memory="3g")
    rates = {"files": [], "rows": [], "bare": []}
    cpu = {k: [] for k in rates}
    try:
        write_data(data, a.rows, a.row_bytes, a.files, a.row_group)
        mb = sum(f.stat().st_size for f in data.iterdir()) / 1e6
        C.log(f"{a.rows:,} rows of {a.row_bytes:,} bytes in {a.files} files ({mb:,.0f} MB), row groups of {a.row_group}")
        spark = C.session(cluster, "bench-feed-files")
        C.wait_executors(spark.sparkContext, 2)
        df = spark.read.parquet(str(data))
        c = ember.Cluster.run(spark, drain, {"batch": a.batch, "out": str(out)}, num_executors=2,
                              input_mode=ember.InputMode.SPARK, reservation_timeout=180)
        seen = 0

        def node_lines():
            lines = []
            for k in range(2):
                f = out / f"{k}.jsonl"
                lines.append([json.loads(x) for x in f.read_text().splitlines()] if f.exists() else [])
            return lines

        def train(source: str) -> float:
            nonlocal seen
            os.environ["EMBER_FEED_SOURCE"] = source
            t0 = time.time()
            c.train(df, num_epochs=1)
            returned = time.time()
            C.wait_for(lambda: all(len(x) > seen for x in node_lines()), 600, "both nodes ending the epoch")
            ends = [x[seen]["end"] for x in node_lines()]
            got = sum(x[seen]["rows"] for x in node_lines())
            seen += 1
            assert got >= a.rows - 2 * a.batch, got
            return max(returned, *ends) - t0

        def bare() -> float:
            def count(batches):
                import pyarrow as pa
                n = 0
                for b in batches:
                    n += b.num_rows
                yield pa.RecordBatch.from_pydict({"n": [n]})
            t0 = time.time()
            got = sum(r.n for r in df.mapInArrow(count, "n long").collect())
            assert got == a.rows, got
            return time.time() - t0

        contenders = {"files": lambda: train("auto"), "rows": lambda: train("spark"), "bare": bare}
        for name, run in contenders.items():  # warm-up: page cache, Python workers, the nodes' imports
            run()
        for r in range(a.repeats):
            for name, run in contenders.items():
                before = C.cpu_snapshot(cluster)
                secs = run()
                used = C.cpu_delta(before, C.cpu_snapshot(cluster))
                rates[name].append(a.rows / secs)
                cpu[name].append(used.get("total", 0.0))
                C.log(f"{name} round {r + 1}: {a.rows / secs:,.0f} rows/s ({a.rows * a.row_bytes / secs / 1e6:,.0f} MB/s), "
                      f"{C.fmt_cpu(used)}")
        c.shutdown(timeout=300)
        os.environ.pop("EMBER_FEED_SOURCE", None)
        spark.stop()
        C.log(f"load {os.getloadavg()[0]:.2f}")
    finally:
        cluster.stop()
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    med = {k: C.median(v) for k, v in rates.items()}
    for k in med:
        C.log(f"{k}: median {med[k]:,.0f} rows/s ({med[k] * a.row_bytes / 1e6:,.0f} MB/s), "
              f"median CPU {C.median(cpu[k]):.2f} s per pass")
    print(f"feed_files_rows_per_sec: files={med['files']:.0f} rows={med['rows']:.0f} bare={med['bare']:.0f} "
          f"files_vs_rows={med['files'] / med['rows']:.3f} files_vs_bare={med['files'] / med['bare']:.3f}", flush=True)


if __name__ == "__main__":
    main()
