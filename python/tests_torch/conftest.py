"""PyTorch tests: torch comes from .torch-site/ (installed by `make setup-torch`), after the venv
on sys.path so that the venv's packages win where both have one; Spark's Python workers (and so
Ember's nodes) get the same path through PYTHONPATH.  The fixtures of python/tests are reused."""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TORCH_SITE = REPO / ".torch-site"
TESTS = REPO / "python" / "tests"
HERE = Path(__file__).resolve().parent

if str(TORCH_SITE) not in sys.path:
    sys.path.append(str(TORCH_SITE))
if str(TESTS) not in sys.path:
    sys.path.append(str(TESTS))  # shared helpers of python/tests (thread_ranks)
_paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
for _p in (str(HERE),):  # executors import the test modules (main functions) by name
    if _p not in _paths:
        _paths.insert(0, _p)
if str(TORCH_SITE) not in _paths:
    _paths.append(str(TORCH_SITE))
os.environ["PYTHONPATH"] = os.pathsep.join(_paths)

import importlib.util  # noqa: E402

# python/tests/conftest.py under another name (this file is "conftest" too).
_spec = importlib.util.spec_from_file_location("ember_tests_conftest", TESTS / "conftest.py")
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
spark_sessions, spark, no_leftovers = _fixtures.spark_sessions, _fixtures.spark, _fixtures.no_leftovers
