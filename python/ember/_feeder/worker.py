"""What Ember's code does once in each Spark Python worker it runs in (:func:`settle`): the
worker's per-task costs that are not Spark's work on the rows, made small.

**Zip directories.**  pyspark's worker calls ``importlib.invalidate_caches()`` when a task
starts (``worker_util.setup_spark_files``), and Python's ``zipimporter.invalidate_caches`` then
reads the whole central directory of its archive again (Python 3.11; 3.13 drops it, to be read
at the next import).  Spark puts pyspark.zip, py4j's zip and spark-core's jar (5,266 entries) on
every worker's path: about 90 ms of CPU per task on the 2-core test host, 0.7 us a row of a
125,000-row partition.  :func:`settle` swaps each zip importer in ``sys.path_importer_cache``
for one that re-reads its directory only when the archive's size, mtime or inode changed, which
is what invalidating is for.  Imports are unchanged: the importers are zipimporters, built from
the same paths and the directories already read.

**The cyclic garbage collector.**  A worker that has imported TensorFlow and loaded a model
holds about 300,000 objects the collector tracks; each full collection walks them all (143 ms
on that host), and the allocations of a feeding loop set one off again and again (a third of a
feeding worker's samples in a profile).  :func:`settle` runs the young collections and then
``gc.freeze()``: the objects alive then (modules, the model) are left out of every later
collection; objects made afterwards are collected as before.

Spark reuses a worker for the tasks that follow (``spark.python.worker.reuse``, on by
default); those, Ember's or not, start and run without these costs.
"""
from __future__ import annotations

import gc
import os
import sys
import zipimport
from typing import Optional, Tuple

_settled = False


def _stamp(path: str) -> Optional[Tuple[int, int, int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino


class _ZipImporter(zipimport.zipimporter):
    """A zipimporter whose invalidate_caches re-reads the archive only when it changed."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._ember_stamp = _stamp(self.archive)

    def invalidate_caches(self) -> None:
        stamp = _stamp(self.archive)
        if stamp != self._ember_stamp:
            self._ember_stamp = stamp
            super().invalidate_caches()


def keep_zip_directories() -> int:
    """Swaps the zip importers of this process's path for :class:`_ZipImporter`; returns how
    many it swapped."""
    swapped = 0
    for path, finder in list(sys.path_importer_cache.items()):
        if type(finder) is zipimport.zipimporter:
            try:
                sys.path_importer_cache[path] = _ZipImporter(path)
            except (zipimport.ZipImportError, OSError):
                continue  # left as it was
            swapped += 1
    return swapped


def settle() -> bool:
    """Once per process, in a task (after its model is loaded, where it loads one): the zip
    importers swapped and the objects alive frozen out of the cyclic collector's walks.
    Returns whether it did so now."""
    global _settled
    if _settled:
        return False
    _settled = True
    keep_zip_directories()
    gc.collect(1)  # the young generations (cheap); then what is alive stays
    gc.freeze()
    return True
