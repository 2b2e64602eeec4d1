"""Time splits of Ember's feeding tasks, for ``bench/feed.py --profile``.

Stands in for ``ember._feeder.task`` inside ``ember._driver.feed`` (the driver swaps the module
reference; the feeding closure then imports this module on the executors).  Everything is
delegated to the real module; ``feed_partition`` is wrapped to time, per task:

  spark_next  waiting for the next Arrow record batch from Spark (JVM -> Python transfer)
  encode      ember._feeder.task._ipc_parts (Arrow IPC encoding into parts that reference the rows:
              metadata only, no copy of the rows)
  write       the core producer's send_batch_parts and end_partition (FeedProducer, through
              the bindings: the ring or socket write, the one copy of the rows, plus waits while
              the ring is full)
  open        FeedProducer.open (reaching every node: opening its ring or connecting)
  total       the whole feed_partition call

and writes them as JSON into PROF_DIR (the executors run on this host).  Nothing in Ember is
edited: for the duration of the call, the feeding task's Python worker sees a timed
``_ipc_parts`` and a ``_ember`` whose FeedProducer is timed; the real ``feed_partition`` runs.
"""
from __future__ import annotations

import json
import os
import time

from ember import _ember as _real_ember
from ember._feeder import task as _orig

PROF_DIR = f"/tmp/ember-bench-feedprof-{os.getuid()}"


def __getattr__(name):  # everything but feed_partition comes from ember._feeder.task
    return getattr(_orig, name)


class _TimedProducer:
    """A FeedProducer whose writes are timed into `t`; everything else is the real one's."""

    def __init__(self, producer, t: dict):
        self._producer, self._t = producer, t

    def __getattr__(self, name):
        return getattr(self._producer, name)

    def send_batch_parts(self, node, parts, rows):
        t0 = time.perf_counter()
        try:
            return self._producer.send_batch_parts(node, parts, rows)
        finally:
            self._t["write"] += time.perf_counter() - t0
            self._t["messages"] += 1

    def end_partition(self):
        t0 = time.perf_counter()
        try:
            return self._producer.end_partition()
        finally:
            self._t["write"] += time.perf_counter() - t0
            self._t["messages"] += self._producer.num_nodes  # one end-of-partition per node


class _TimedFeedProducer:
    """Stands for the FeedProducer class: open() is timed and returns a _TimedProducer."""

    def __init__(self, t: dict):
        self._t = t

    def open(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return _TimedProducer(_real_ember.FeedProducer.open(*args, **kwargs), self._t)
        finally:
            self._t["open"] += time.perf_counter() - t0


class _TimedEmber:
    """ember._ember as _feeding sees it during a profiled call: its FeedProducer is timed."""

    def __init__(self, t: dict):
        self.FeedProducer = _TimedFeedProducer(t)

    def __getattr__(self, name):
        return getattr(_real_ember, name)


def feed_partition(batches, partition, epoch, *args, **kwargs):
    t = {"partition": partition, "epoch": epoch, "spark_next": 0.0, "encode": 0.0, "write": 0.0,
         "open": 0.0, "rows": 0, "batches": 0, "messages": 0}

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

    ipc_parts = _orig._ipc_parts

    def timed_ipc_parts(batch):
        t0 = time.perf_counter()
        try:
            return ipc_parts(batch)
        finally:
            t["encode"] += time.perf_counter() - t0

    # _feeding looks both up as module globals at call time (_send calls _ipc_parts;
    # feed_partition calls _ember.FeedProducer.open).
    _orig._ipc_parts, _orig._ember = timed_ipc_parts, _TimedEmber(t)
    cpu0, t_start = time.process_time(), time.perf_counter()
    try:
        return _orig.feed_partition(timed_batches(), partition, epoch, *args, **kwargs)
    finally:
        _orig._ipc_parts, _orig._ember = ipc_parts, _real_ember
        t["total"] = time.perf_counter() - t_start
        t["cpu"] = time.process_time() - cpu0
        os.makedirs(PROF_DIR, exist_ok=True)
        with open(os.path.join(PROF_DIR, f"task-e{epoch}-p{partition}-{os.getpid()}.json"), "w") as f:
            json.dump(t, f)
