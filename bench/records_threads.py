#!/usr/bin/env python
"""Ember's TFRecord read at 1, 2 and 3 decode threads against the bare read of the same file:
the step-by-step figures of issue 8 (docs/benchmarks.md).

Data: --mb (default 400) MB of Fashion-MNIST-shaped records written once by Ember (as
bench/records.py writes them), read through the page cache into batches of --batch numpy rows,
every CRC checked (ember.data.tfrecord_batches(..., decode_threads=N): one dataset per N, one
pass over it per repeat, as a training loop makes one pass per epoch).  The contenders run
--repeats times, interleaved; medians of MB/s and of the process's CPU seconds per pass.

Last line: records_threads_mb_per_sec: ember2=<v> bare=<v> ratio=<ember2/bare>

  .venv/bin/python bench/records_threads.py          # ~1 min
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import records as R  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=400)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    import tensorflow as tf

    import ember.data
    from ember import _ember
    from ember.data import _fs
    C.log(C.machine_info())
    tmp = Path(tempfile.mkdtemp(prefix="ember-bench-threads-"))
    try:
        path = str(tmp / "data.tfrecord")
        n = int(args.mb * 1e6 / (R.RECORD_BYTES + 40))
        w = _ember.ExampleWriter.open(path, _fs.options_from("", ""), "none")
        for i in range(0, n, 100_000):
            im, la = R.make_rows(min(100_000, n - i), seed=i)
            w.write(R.columns(im, la))
        w.close()
        size = os.path.getsize(path)
        R.bare_read(path)  # into the page cache
        spec = {"image": ember.data.RawBytes((R.RECORD_BYTES,)), "label": tf.io.FixedLenFeature([], tf.int64)}

        # One dataset per thread count, iterated once per pass as training iterates it once per
        # epoch (from its second pass on the file is still mapped: fs::MappingCache).
        datasets = {t: ember.data.tfrecord_batches(path, spec, args.batch, shard=(0, 1), decode_threads=t)
                    for t in (1, 2, 3)}

        def ember_read(threads: int) -> int:
            rows = 0
            for b in datasets[threads]:
                rows += len(b["label"])
            return rows

        res: dict = {}
        for _ in range(args.repeats):
            for name in ("ember1", "ember2", "ember3", "bare"):
                t, c = time.perf_counter(), time.process_time()
                if name == "bare":
                    R.bare_read(path)
                else:
                    assert ember_read(int(name[-1])) == n
                secs, cpu = time.perf_counter() - t, time.process_time() - c
                res.setdefault(name, []).append((size / 1e6 / secs, cpu))
        print(f"\n{size / 1e6:.0f} MB, {n} records, batch {args.batch}; medians of {args.repeats} passes")
        med = {}
        for name, runs in res.items():
            med[name] = C.median([r[0] for r in runs])
            print(f"  {name:7s} {med[name]:8.0f} MB/s  cpu {C.median([r[1] for r in runs]):.3f} s per pass")
        C.log(C.machine_info())
        print(f"records_threads_mb_per_sec: ember2={med['ember2']:.0f} bare={med['bare']:.0f} "
              f"ratio={med['ember2'] / med['bare']:.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
