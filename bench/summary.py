#!/usr/bin/env python
"""TensorBoard event-file writing speed: Ember's C++ event writer (``ember.summary``) vs TF2's
``tf.summary`` (eager), writing the same values into a temporary directory.

Per repeat (interleaved, --repeats times; medians reported), each contender opens a writer on a
fresh directory, writes, and closes it (so every event is in the file):
  scalars     --scalars (200,000) values of tag "loss" at steps 0..N-1
                ember  ember.summary.create_file_writer(d).scalar(tag, v, step)
                tf     tf.summary.create_file_writer(d) as default; tf.summary.scalar(tag, v, step)
                       (eager, one Python call per value, as Ember's)
                tf_graph  the same loop inside one tf.function (tf.range; no Python per value)
  histograms  --histograms (2,000) histograms of --hist-values (1,000) float64 values each
                ember  .histogram(tag, array, step)          (TF1's 1.1-factor buckets)
                tf     tf.summary.histogram(tag, array, step) (TF2's 30 buckets)
Reported: calls/s and MB/s of event file written (the two formats differ in size: Ember writes
TF1's simple_value / HistogramProto, TF2 a tensor with plugin metadata per value), and the
process CPU seconds per repeat.  After timing, the files of the last repeat are read back with
tf.compat.v1.train.summary_iterator and their events counted.

Last line: summary_scalars_per_sec: ember=<v> tf=<v> ratio=<ember/tf>

  .venv/bin/python bench/summary.py                       # ~2-3 min
  .venv/bin/python bench/summary.py --scalars 20000 --histograms 200 --repeats 2   # quick
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def timed(fn, d: Path):
    """(wall seconds, CPU seconds, bytes written) of fn(d) on a fresh directory d."""
    shutil.rmtree(d, ignore_errors=True)
    c0, t0 = time.process_time(), time.perf_counter()
    fn(str(d))
    t1, c1 = time.perf_counter(), time.process_time()
    return t1 - t0, c1 - c0, dir_bytes(d)


def ember_scalars(n):
    import ember.summary

    def run(d):
        with ember.summary.create_file_writer(d) as w:
            scalar = w.scalar
            for i in range(n):
                scalar("loss", 1.0 / (i + 1), i)
    return run


def tf_scalars(n):
    import tensorflow as tf

    def run(d):
        w = tf.summary.create_file_writer(d)
        with w.as_default():
            scalar = tf.summary.scalar
            for i in range(n):
                scalar("loss", 1.0 / (i + 1), step=i)
        w.close()
    return run


def tf_graph_scalars(n):
    """TF's fastest path: the whole loop inside one tf.function (graph mode, no Python per
    value).  The writer is a resource the function captures, so each run traces its own
    function (tens of ms, inside the timing)."""
    import tensorflow as tf

    def run(d, count=n):
        w = tf.summary.create_file_writer(d)

        @tf.function
        def loop(count):
            with w.as_default():
                for i in tf.range(count):
                    tf.summary.scalar("loss", 1.0 / tf.cast(i + 1, tf.float32), step=tf.cast(i, tf.int64))

        loop(tf.constant(count, tf.int64))
        w.close()
    return run


def ember_histograms(arrays):
    import ember.summary

    def run(d):
        with ember.summary.create_file_writer(d) as w:
            for i, a in enumerate(arrays):
                w.histogram("weights", a, i)
    return run


def tf_histograms(arrays):
    import tensorflow as tf

    def run(d):
        w = tf.summary.create_file_writer(d)
        with w.as_default():
            for i, a in enumerate(arrays):
                tf.summary.histogram("weights", a, step=i)
        w.close()
    return run


def count_events(d: Path) -> int:
    import tensorflow as tf
    return sum(1 for f in sorted(d.glob("events.out.tfevents.*"))
               for _ in tf.compat.v1.train.summary_iterator(str(f)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scalars", type=int, default=200_000)
    ap.add_argument("--histograms", type=int, default=2_000)
    ap.add_argument("--hist-values", type=int, default=1_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")  # tf_graph traces one function per run, on purpose
    C.log(f"machine: {C.machine_info()}")
    C.log(f"versions: tensorflow {tf.__version__}, eager={tf.executing_eagerly()}")
    rng = np.random.default_rng(0)
    arrays = [rng.normal(0.0, 1.0 + i / 1000, size=args.hist_values) for i in range(args.histograms)]
    jobs = {
        ("scalars", "ember"): ember_scalars(args.scalars),
        ("scalars", "tf"): tf_scalars(args.scalars),
        ("scalars", "tf_graph"): tf_graph_scalars(args.scalars),
        ("histograms", "ember"): ember_histograms(arrays),
        ("histograms", "tf"): tf_histograms(arrays),
    }
    calls = {"scalars": args.scalars, "histograms": args.histograms}
    results = {k: [] for k in jobs}
    root = Path(tempfile.mkdtemp(prefix="ember-bench-summary-"))
    try:
        graph = jobs[("scalars", "tf_graph")]
        warmups = [ember_scalars(100), tf_scalars(100), lambda d: graph(d, 100),
                   ember_histograms(arrays[:10]), tf_histograms(arrays[:10])]
        for fn in warmups:  # first-call costs out of the timing (TF traces its summary ops)
            fn(str(root / "warmup"))
            shutil.rmtree(root / "warmup", ignore_errors=True)
        for r in range(args.repeats):
            for key, fn in jobs.items():
                wall, cpu, nbytes = timed(fn, root / f"{key[0]}-{key[1]}")
                results[key].append((wall, cpu, nbytes))
                C.log(f"repeat {r + 1}/{args.repeats} {key[0]:10s} {key[1]:8s}: {wall:7.3f} s "
                      f"(cpu {cpu:6.3f} s), {calls[key[0]] / wall:10.0f} /s, {nbytes / wall / 1e6:7.2f} MB/s, "
                      f"{nbytes} bytes")
        for key in jobs:  # what was written is all there, as TF reads it
            n = count_events(root / f"{key[0]}-{key[1]}")
            expect = calls[key[0]] + 1  # + the file_version event
            C.log(f"read back {key[0]} {key[1]}: {n} events (expected {expect})")
            if n != expect:
                raise SystemExit(f"{key}: {n} events read back, expected {expect}")
    finally:
        shutil.rmtree(root, ignore_errors=True)

    med = {}
    print(f"\nmedians of {args.repeats} repeats; load avg now {os.getloadavg()[0]:.2f}")
    print(f"{'what':11s} {'writer':8s} {'calls/s':>11s} {'MB/s':>8s} {'wall s':>8s} {'cpu s':>8s} {'bytes':>10s}")
    for key, rs in results.items():
        wall = C.median([r[0] for r in rs])
        cpu = C.median([r[1] for r in rs])
        nbytes = rs[-1][2]
        med[key] = calls[key[0]] / wall
        print(f"{key[0]:11s} {key[1]:8s} {med[key]:11.0f} {nbytes / wall / 1e6:8.2f} {wall:8.3f} {cpu:8.3f} {nbytes:10d}")
    hist_ratio = med[("histograms", "ember")] / med[("histograms", "tf")]
    print(f"summary_histograms_per_sec: ember={med[('histograms', 'ember')]:.0f} "
          f"tf={med[('histograms', 'tf')]:.0f} ratio={hist_ratio:.2f}")
    graph = med[("scalars", "tf_graph")]
    print(f"summary_scalars_vs_tf_graph: ember={med[('scalars', 'ember')]:.0f} tf_graph={graph:.0f} "
          f"ratio={med[('scalars', 'ember')] / graph:.2f}")
    ratio = med[("scalars", "ember")] / med[("scalars", "tf")]
    print(f"summary_scalars_per_sec: ember={med[('scalars', 'ember')]:.0f} "
          f"tf={med[('scalars', 'tf')]:.0f} ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
