"""A small, real virtual environment for nodes, and the `ember pack` command that ships it
(test_pack.py, test_multihost.py).

The 2.4 GB dev venv (TensorFlow) takes minutes to pack (docs/deploy.md has the figure), so the
tests pack a purpose-made one: a real venv (``python -m venv`` from this venv's base Python)
into which the distributions a node needs (ember, numpy, pyarrow) are installed file by file from
this venv, as their RECORDs list them: the same files pip installed here, hard-linked where the
file system allows.  Ember is thereby installed editable, exactly as in the dev venv, so packing
it also covers how pack ships an editable Ember.  pyspark itself comes, as on any cluster, from
Spark (its python/lib/pyspark.zip on the workers' PYTHONPATH).
"""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List

NODE_DISTRIBUTIONS = ("ember", "numpy", "pyarrow")  # what `import ember` needs on a node


def _install_from_this_venv(dist_name: str, site: Path) -> None:
    """Installs distribution `dist_name` into `site` with the files this venv has for it."""
    dist = importlib.metadata.distribution(dist_name)
    for rel in dist.files or []:
        src = Path(dist.locate_file(rel))
        if ".." in rel.parts or not src.is_file():  # console scripts in bin/; RECORD-only entries
            continue
        dst = site / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:  # another file system
            shutil.copy2(src, dst)


def make_node_venv(venv: Path) -> Path:
    """Makes the node venv at `venv` (which must not exist) and returns it."""
    base_python = Path(sys.base_prefix) / "bin" / "python3"
    subprocess.run([str(base_python), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True, timeout=60).stdout.strip())
    for name in NODE_DISTRIBUTIONS:
        _install_from_this_venv(name, site)
    return venv


def pack_command(venv: Path, archive: Path) -> List[str]:
    """`ember pack` of `venv` into `archive`.  Level 0: gzip framing without compression, 2 s
    instead of 5 s for ~300 MiB on the local disk."""
    return [sys.executable, "-m", "ember._cli", "pack", "--prefix", str(venv), "-o", str(archive),
            "--compress-level", "0"]
