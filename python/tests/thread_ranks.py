"""Ranks as threads: a communicator per thread over an in-memory store (Gloo's way of testing
several ranks in one process), for the collective tests of python/tests, tests_torch and
tests_gpu."""
from __future__ import annotations

import threading

from ember import _ember
from ember.collective import Communicator

SECRET = b"0123456789abcdef-thread-ranks"


def run_threads(size, fn, timeout: float = 60, call_timeout: float = 20, connect_timeout: float = 20, **options):
    """fn(comm) on `size` ranks as threads; returns their results in rank order.  Fails naming
    each rank's exception, or the ranks still running after `timeout` seconds.  `options` go to
    Communicator.create (e.g. transport="tcp")."""
    store = _ember.CollectiveStore.in_memory()
    results, failures = [None] * size, []

    def rank(r):
        try:
            comm = Communicator.create(r, size, SECRET, store, prefix=f"ember-pytest-{id(store)}",
                                       connect_timeout=connect_timeout, timeout=call_timeout, **options)
            results[r] = fn(comm)
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append((r, e))

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    alive = [r for r, t in enumerate(threads) if t.is_alive()]
    assert not alive, f"ranks {alive} still run after {timeout} s"
    assert not failures, failures
    return results
