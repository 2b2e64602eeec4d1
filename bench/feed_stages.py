#!/usr/bin/env python
"""Capacity of each stage of Ember's feed path, in isolation (no Spark), rows/s on one core.

Complements bench/feed.py when it misses its goal: which stage of the path costs what.
Fashion-MNIST-shaped record batches (784-byte binary image + int label), --rows-per-message
rows per message (what one feeding task sends one node for one Spark Arrow batch: Spark's
10,000-row batches split over 2 nodes):

  encode      ember._feed_protocol.encode_batch (Arrow IPC stream into a new buffer)
  ring        ShmRing write (a producer process) -> read (this process), nothing else
  decode      ember._feed_protocol.decode_batch of a received payload
  consume     DataFeed over a real ring: epoch_batches(--batch) -> numpy columns, the node's
              whole read path (ring read, decode, slicing, batch_to_columns)
  slice       RecordBatch.slice into --batch-row pieces alone
  batch_to_columns   the per-batch numpy conversion alone, per --batch rows
  memcpy      numpy copy of the same bytes (what a copy costs on this machine)
  *_tf_malloc ring / consume again after glibc's mmap threshold is pinned at 128 KiB, as
              tf.data's generator datasets do (to_tf_dataset builds one)

Each stage is repeated --repeats times, medians printed.  Timings are wall clock on a shared
machine: compare stages within one run.

  .venv/bin/python bench/feed_stages.py
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

IMAGE = 784


def make_batch(rows: int, seed: int = 0) -> pa.RecordBatch:
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, rows * IMAGE, dtype=np.uint8)
    offsets = np.arange(0, (rows + 1) * IMAGE, IMAGE, dtype=np.int32)
    image = pa.Array.from_buffers(pa.binary(), rows, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    return pa.RecordBatch.from_arrays([image, pa.array(np.arange(rows, dtype=np.int32) % 10)],
                                      names=["image", "label"])


def timed(fn, repeats: int) -> float:
    """Median seconds of fn() over `repeats` runs, after one untimed run."""
    fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def _producer(ring_name: str, payloads, kind: int, ends) -> None:
    """Writes the payloads, then the (kind, payload) markers in `ends`."""
    from ember import _ember
    ring = _ember.ShmRing.open(ring_name)
    for p in payloads:
        ring.write(kind, p, 60.0)
    for end_kind, end_payload in ends:
        ring.write(end_kind, end_payload, 60.0)
    ring.close()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000, help="rows per stage run")
    p.add_argument("--rows-per-message", type=int, default=5000)
    p.add_argument("--batch", type=int, default=100, help="consumer batch (next_batch size)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ring-bytes", type=int, default=64 << 20)
    args = p.parse_args(argv)

    from ember import _ember
    from ember import _arrow_rows as rows_mod
    from ember import _feed_protocol as proto
    from ember.feed import DataFeed

    nmsg = args.rows // args.rows_per_message
    rows = nmsg * args.rows_per_message
    batch = make_batch(args.rows_per_message)
    payload = proto.encode_batch(0, 0, batch)
    payload_np = proto.as_uint8(payload)
    print(f"{rows} rows as {nmsg} messages of {args.rows_per_message} rows ({payload.size / 2**20:.2f} MiB); "
          f"consumer batch {args.batch}; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    res = {}

    def each(f):  # results are dropped at once, as on the feed path
        def run():
            for _ in range(nmsg):
                f()
        return run

    res["memcpy"] = timed(each(lambda: np.copy(payload_np)), args.repeats)
    res["encode"] = timed(each(lambda: proto.encode_batch(0, 0, batch)), args.repeats)
    res["decode"] = timed(each(lambda: proto.decode_batch(payload_np)), args.repeats)

    # One ring for all runs, as a node has one for the whole job (a fresh ring would add its
    # first-touch page faults to the first run).
    name = f"/ember-bench-stages-{os.getpid()}"
    ring = _ember.ShmRing.create(name, args.ring_bytes)
    epoch = [0]

    def ring_run(consume: bool):
        e = epoch[0]
        epoch[0] += 1
        pay = proto.as_uint8(proto.encode_batch(0, e, batch))
        ends = [(proto.END_PARTITION, proto.as_uint8(proto.encode_end_partition(0, e, [rows]))),
                (proto.END_EPOCH, proto.as_uint8(proto.encode_end_epoch(e, 1)))]  # what the driver sends
        prod = mp.get_context("fork").Process(target=_producer, args=(name, [pay] * nmsg, proto.BATCH, ends))
        t = time.perf_counter()
        prod.start()
        if consume:
            n = 0
            for cols in feed.epoch_batches(args.batch):
                n += len(cols["label"])
            assert n == rows, (n, rows)
        else:
            for _ in range(nmsg + len(ends)):
                ring.read(10.0)
        secs = time.perf_counter() - t
        prod.join()
        return secs

    feed = DataFeed(ring, "bench")
    ring_run(False)
    res["ring"] = statistics.median([ring_run(False) for _ in range(args.repeats)])
    res["consume"] = statistics.median([ring_run(True) for _ in range(args.repeats)])
    # tf.data sets M_TRIM_THRESHOLD=128 KiB when it builds a generator dataset (to_tf_dataset does),
    # which freezes glibc's mmap threshold at 128 KiB: every ring read's buffer is then a fresh
    # mmap, faulted in page by page.  Same consume path with that setting:
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-1, 128 << 10)  # M_TRIM_THRESHOLD
    libc.mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD (what the trim setting implies)
    res["consume_tf_malloc"] = statistics.median([ring_run(True) for _ in range(args.repeats)])
    res["ring_tf_malloc"] = statistics.median([ring_run(False) for _ in range(args.repeats)])
    libc.mallopt(-3, 64 << 20)
    ring.close()
    small = [batch.slice(i, args.batch) for i in range(0, args.rows_per_message - args.batch + 1, args.batch)]
    per = len(small) * args.batch
    t_btc = timed(lambda: [rows_mod.batch_to_columns(b) for b in small], args.repeats)
    t_slice = timed(lambda: [batch.slice(i, args.batch) for i in range(0, args.rows_per_message, args.batch)],
                    args.repeats)
    res["batch_to_columns"] = t_btc * rows / per
    res["slice"] = t_slice * nmsg

    print(f"{'stage':18s} {'seconds':>8s} {'rows/s':>12s} {'MiB/s':>8s}")
    for k in ("memcpy", "encode", "ring", "decode", "slice", "batch_to_columns", "consume",
              "ring_tf_malloc", "consume_tf_malloc"):
        s = res[k]
        print(f"{k:18s} {s:8.3f} {rows / s:12.0f} {rows * (IMAGE + 4) / s / 2**20:8.0f}")
    print(f"feed_stage_rows_per_sec: " + " ".join(f"{k}={rows / res[k]:.0f}" for k in
                                                   ("encode", "ring", "consume", "ring_tf_malloc",
                                                    "consume_tf_malloc")))


if __name__ == "__main__":
    main()
