#!/usr/bin/env python
"""Capacity of each stage of Ember's feed path, in isolation (no Spark), rows/s on one core.

Complements bench/feed.py when it misses its goal: which stage of the path costs what.
Fashion-MNIST-shaped record batches (784-byte binary image + int label), --rows-per-message
rows per message (what one feeding task sends one node for one Spark Arrow batch: Spark's
10,000-row batches split over 2 nodes).  The node's side is set up as the launcher does (a
ring, a TCP feed server on it for the driver's end-of-epoch); a producer process stands for
the feeding task and the driver, and this process for the node:

  encode      ember._feeder.task._framed (Arrow IPC stream behind the core's header room, into a
              new buffer: what a feeding task does per slice)
  ring        the core's producer and consumer through the bindings, no Arrow: FeedProducer
              send_batch_in_place of encoded messages + end_partition (producer process), the
              driver's feed_end_epoch, FeedConsumer begin_epoch/next_epoch_batch of one
              message's rows at a time (this process)
  decode      Arrow IPC decode of a received message, as DataFeed does it
  consume     DataFeed over the same path: epoch_batches(--batch) -> numpy columns, the node's
              whole read path (ring read and protocol, decode, slicing, batch_to_columns)
  slice       RecordBatch.slice into --batch-row pieces alone
  batch_to_columns   the per-batch numpy conversion alone, per --batch rows
  memcpy      numpy copy of the same bytes (what a copy costs on this machine)
  *_tf_malloc ring / consume again after glibc's mmap threshold is pinned at 128 KiB, as
              tf.data's generator datasets do (to_tf_dataset builds one)

Each stage is repeated --repeats times, medians printed.  Timings are wall clock on a shared
machine: compare stages within one run.  ring, consume and their _tf_malloc runs time from the
producer's go to the consumer's end of the epoch (the producer process is started once, before).

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


def _producer(conn, rows_per_message: int) -> None:
    """The feeding task and the driver, in one process started before any timing.

    Per command ("feed", endpoint, options, epoch, nmsg): feeds the encoded message nmsg times
    as one partition of `epoch` through the core's FeedProducer, exactly as
    ember._feeder.task.feed_partition sends a slice, then ends the epoch as the driver does.
    Answers each command when done; None ends.
    """
    from ember import _ember
    from ember._feeder import task as _feeding

    rows = rows_per_message
    message = _feeding._framed(make_batch(rows))  # writable: the core fills its header in place
    while (cmd := conn.recv()) is not None:
        _, endpoint, options, epoch, nmsg = cmd
        producer = _ember.FeedProducer.open([endpoint], 0, epoch, 0, options)
        try:
            for _ in range(nmsg):
                producer.send_batch_in_place(0, message, rows)
            producer.end_partition()
        finally:
            producer.close()
        _ember.feed_end_epoch([endpoint], epoch, 1, options)
        conn.send(True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000, help="rows per stage run")
    p.add_argument("--rows-per-message", type=int, default=5000)
    p.add_argument("--batch", type=int, default=100, help="consumer batch (epoch_batches size)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--ring-bytes", type=int, default=64 << 20)
    args = p.parse_args(argv)

    from ember import _arrow_rows as rows_mod
    from ember import _ember
    from ember._feeder import task as _feeding
    from ember.feed import DataFeed

    nmsg = args.rows // args.rows_per_message
    rows = nmsg * args.rows_per_message
    batch = make_batch(args.rows_per_message)
    message = _feeding._framed(batch)
    message_np = np.frombuffer(message, dtype=np.uint8)
    print(f"{rows} rows as {nmsg} messages of {args.rows_per_message} rows ({message.size / 2**20:.2f} MiB); "
          f"consumer batch {args.batch}; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    res = {}

    def each(f):  # results are dropped at once, as on the feed path
        def run():
            for _ in range(nmsg):
                f()
        return run

    res["memcpy"] = timed(each(lambda: np.copy(message_np)), args.repeats)
    res["encode"] = timed(each(lambda: _feeding._framed(batch)), args.repeats)

    # The producer process is forked first, while this process has no threads (the feed server
    # below starts some).
    conn, child_conn = mp.Pipe()
    prod = mp.get_context("fork").Process(target=_producer, args=(child_conn, args.rows_per_message),
                                          daemon=True)
    prod.start()
    # One ring for all runs, as a node has one for the whole job (a fresh ring would add its
    # first-touch page faults to the first run); made as the launcher makes it.
    secret = os.urandom(32)
    host = _ember.FeedHost.start(f"ember-bench-stages-{os.getpid()}", 0, "bench", "127.0.0.1", "127.0.0.1",
                                 secret, ring_bytes=args.ring_bytes)
    endpoint = host.endpoint
    options = _feeding.feed_options(secret, transport="shm")
    feed = None
    try:
        feed = DataFeed(endpoint.ring, "bench", timeout=60.0)
        consumer = feed._consumer  # the FeedConsumer inside DataFeed: the ring's one reader
        epoch = [0]
        last = []  # a received RowRange, for decode

        def feed_run(consume: bool) -> float:
            e = epoch[0]
            epoch[0] += 1
            t = time.perf_counter()
            conn.send(("feed", endpoint, options, e, nmsg))
            n = 0
            if consume:
                for cols in feed.epoch_batches(args.batch):
                    n += len(cols["label"])
            else:
                assert consumer.begin_epoch() == e
                while ranges := consumer.next_epoch_batch(args.rows_per_message, True):
                    n += sum(r.rows for r in ranges)
                    last[:] = ranges
            secs = time.perf_counter() - t
            conn.recv()
            assert n == rows, (n, rows)
            return secs

        feed_run(False)
        res["ring"] = statistics.median([feed_run(False) for _ in range(args.repeats)])
        res["consume"] = statistics.median([feed_run(True) for _ in range(args.repeats)])
        received = last[0]
        res["decode"] = timed(each(lambda: pa.ipc.open_stream(pa.py_buffer(received.ipc())).read_next_batch()),
                              args.repeats)
        # tf.data sets M_TRIM_THRESHOLD=128 KiB when it builds a generator dataset (to_tf_dataset
        # does), which freezes glibc's mmap threshold at 128 KiB: every received message's buffer
        # is then a fresh mmap, faulted in page by page.  Same paths with that setting:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 128 << 10)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 128 << 10)  # M_MMAP_THRESHOLD (what the trim setting implies)
        res["consume_tf_malloc"] = statistics.median([feed_run(True) for _ in range(args.repeats)])
        res["ring_tf_malloc"] = statistics.median([feed_run(False) for _ in range(args.repeats)])
        libc.mallopt(-3, 64 << 20)
    finally:
        if feed is not None:
            feed._consumer.close()
        host.close()  # aborts the ring: a producer still writing fails and exits
        try:
            conn.send(None)
        except OSError:
            pass
        prod.join(timeout=30)
        if prod.is_alive():
            prod.kill()
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
    print("feed_stage_rows_per_sec: " + " ".join(f"{k}={rows / res[k]:.0f}" for k in
                                                  ("encode", "ring", "consume", "ring_tf_malloc",
                                                   "consume_tf_malloc")), flush=True)


if __name__ == "__main__":
    main()
