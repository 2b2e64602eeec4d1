"""Time splits of Ember's feeding tasks, for ``bench/feed.py --profile``.

Stands in for ``ember._feeding`` inside ``ember._feed_driver`` (the driver swaps the module
reference; the feeding closure then imports this module on the executors).  Everything is
delegated to the real module; ``feed_partition`` is wrapped to time, per task:

  spark_next  waiting for the next Arrow record batch from Spark (JVM -> Python transfer)
  encode      ember._feed_protocol.encode_batch (Arrow IPC encoding: a copy of the rows)
  write       _Channel.write (the ring write: a copy, plus waits while the ring is full)
  total       the whole feed_partition call

and writes them as JSON into PROF_DIR (the executors run on this host).  Nothing in Ember is
edited; the patches live only in the feeding task's Python worker for the duration of the call.
"""
from __future__ import annotations

import json
import os
import time

from ember import _feed_protocol as _proto
from ember import _feeding as _orig

PROF_DIR = f"/tmp/ember-bench-feedprof-{os.getuid()}"


def __getattr__(name):  # everything but feed_partition comes from ember._feeding
    return getattr(_orig, name)


def feed_partition(batches, partition, epoch, *args, **kwargs):
    t = {"partition": partition, "epoch": epoch, "spark_next": 0.0, "encode": 0.0, "write": 0.0,
         "rows": 0, "batches": 0, "messages": 0}

    def timed_batches():
        it = iter(batches)
        while True:
            t0 = time.perf_counter()
            try:
                b = next(it)
            except StopIteration:
                t["spark_next"] += time.perf_counter() - t0
                return
            t["spark_next"] += time.perf_counter() - t0
            t["rows"] += b.num_rows
            t["batches"] += 1
            yield b

    enc, write = _proto.encode_batch, _orig._Channel.write

    def timed_encode(*a):
        t0 = time.perf_counter()
        try:
            return enc(*a)
        finally:
            t["encode"] += time.perf_counter() - t0

    def timed_write(self, kind, payload):
        t0 = time.perf_counter()
        try:
            return write(self, kind, payload)
        finally:
            t["write"] += time.perf_counter() - t0
            t["messages"] += 1

    _proto.encode_batch, _orig._Channel.write = timed_encode, timed_write
    cpu0, t_start = time.process_time(), time.perf_counter()
    try:
        return _orig.feed_partition(timed_batches(), partition, epoch, *args, **kwargs)
    finally:
        _proto.encode_batch, _orig._Channel.write = enc, write
        t["total"] = time.perf_counter() - t_start
        t["cpu"] = time.process_time() - cpu0
        os.makedirs(PROF_DIR, exist_ok=True)
        with open(os.path.join(PROF_DIR, f"task-e{epoch}-p{partition}-{os.getpid()}.json"), "w") as f:
            json.dump(t, f)
