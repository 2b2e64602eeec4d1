"""ember._feeder.worker: what Ember does once in each Spark Python worker.  The zip importers
re-read an archive's directory only when it changed (imports unchanged, a changed archive still
seen); settle() runs once and freezes what is alive out of the cyclic collector's walks.  The
same on a real Spark worker is in python/tests_spark_ext (after KerasModel.transform)."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import zipfile
import zipimport

from ember._feeder import worker


def _zip(path, modules):
    with zipfile.ZipFile(path, "w") as z:
        for name, value in modules.items():
            z.writestr(f"{name}.py", f"VALUE = {value!r}\n")


def test_a_zip_is_read_again_only_when_it_changed(tmp_path, monkeypatch):
    archive = str(tmp_path / "mods.zip")
    _zip(archive, {"ember_zip_mod_a": 1})
    monkeypatch.syspath_prepend(archive)
    import ember_zip_mod_a
    assert ember_zip_mod_a.VALUE == 1
    assert type(sys.path_importer_cache[archive]) is zipimport.zipimporter

    reads = []
    real = zipimport._read_directory
    monkeypatch.setattr(zipimport, "_read_directory", lambda p: reads.append(p) or real(p))
    importlib.invalidate_caches()
    assert archive in reads  # what Spark's worker pays at every task's start, for every zip

    assert worker.keep_zip_directories() >= 1
    assert isinstance(sys.path_importer_cache[archive], worker._ZipImporter)
    reads.clear()
    importlib.invalidate_caches()
    assert archive not in reads  # unchanged: not read again

    _zip(archive, {"ember_zip_mod_a": 1, "ember_zip_mod_b": 2})  # changed (size, mtime)
    os.utime(archive, ns=(1, 1))
    importlib.invalidate_caches()
    assert archive in reads
    import ember_zip_mod_b  # the new module is found
    assert ember_zip_mod_b.VALUE == 2
    for name in ("ember_zip_mod_a", "ember_zip_mod_b"):
        sys.modules.pop(name, None)


def test_settle_runs_once_and_freezes_what_is_alive():
    code = textwrap.dedent("""
        import gc
        from ember._feeder import worker
        assert gc.get_freeze_count() == 0
        assert worker.settle() is True
        frozen = gc.get_freeze_count()
        assert frozen > 1000, frozen  # the modules imported so far
        assert worker.settle() is False
        assert gc.get_freeze_count() == frozen
        junk = [[i] for i in range(10)]
        del junk
        assert gc.collect() >= 0 and gc.isenabled()  # collections go on for what comes after
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
