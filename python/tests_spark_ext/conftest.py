"""Ember's Spark extension tests (issue 23, point 4) run in a pytest process of their own (`make
test-py` runs them after python/tests).  A jar on the driver's classpath and spark.sql.extensions
take effect only in the JVM a session starts, and python/tests' modules start theirs first: a
session asked for later in that JVM would silently lack Ember's functions (seen in a fresh
`make test`).  The fixtures of python/tests are reused."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
HERE = Path(__file__).resolve().parent
TORCH_SITE = Path(__file__).resolve().parents[2] / ".torch-site"  # `make setup-torch`: TorchModel's test

if str(TESTS) not in sys.path:
    sys.path.append(str(TESTS))  # shared helpers of python/tests
if str(TORCH_SITE) not in sys.path:
    sys.path.append(str(TORCH_SITE))  # after the venv, as python/tests_torch has it
_paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
if str(HERE) not in _paths:  # executors import this directory's node functions by module name
    _paths.insert(0, str(HERE))
if str(TORCH_SITE) not in _paths:
    _paths.append(str(TORCH_SITE))
os.environ["PYTHONPATH"] = os.pathsep.join(_paths)

# python/tests/conftest.py under another name (this file is "conftest" too).
_spec = importlib.util.spec_from_file_location("ember_tests_conftest", TESTS / "conftest.py")
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
spark_sessions, no_leftovers, LOCAL_MASTER = _fixtures.spark_sessions, _fixtures.no_leftovers, _fixtures.LOCAL_MASTER
