"""Tests of Ember's collectives on CUDA memory: they need a GPU and are run by
scripts/gpu_check.sh only (on a GPU host; `make test` never collects this folder: pyproject's
testpaths is python/tests, and test-torch names python/tests_torch).

Without a GPU every test FAILS (it does not skip): a run that checked nothing must not read as
a pass.  EMBER_GPU_TESTS_DEVICE=cpu runs the same tests on CPU tensors instead, to check their
logic on a machine without a GPU (the tests that need the GPU itself then skip, saying so)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TORCH_SITE = REPO / ".torch-site"  # the dev machine's torch (`make setup-torch`); GPU hosts have their own
if TORCH_SITE.is_dir() and str(TORCH_SITE) not in sys.path:
    sys.path.append(str(TORCH_SITE))
if str(REPO / "python" / "tests") not in sys.path:
    sys.path.append(str(REPO / "python" / "tests"))  # shared helpers (thread_ranks)

CPU_MODE = os.environ.get("EMBER_GPU_TESTS_DEVICE", "cuda") == "cpu"


def _no_gpu_reason():
    try:
        import torch
    except ImportError as e:
        return f"torch does not import ({e})"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
    return None


@pytest.fixture(autouse=True, scope="session")
def _gpu_or_fail():
    if CPU_MODE:
        return
    reason = _no_gpu_reason()
    if reason is not None:
        pytest.fail(f"python/tests_gpu needs a GPU: {reason}.  These tests are run by scripts/gpu_check.sh "
                    f"on a GPU host only (EMBER_GPU_TESTS_DEVICE=cpu checks their logic on CPU tensors).",
                    pytrace=False)


@pytest.fixture(scope="session")
def device():
    """The device under test: "cuda:0", or "cpu" with EMBER_GPU_TESTS_DEVICE=cpu."""
    if CPU_MODE:
        return "cpu"
    import torch

    torch.cuda.init()  # loads torch's libcudart, which Ember's loader then finds by its soname
    return "cuda:0"


@pytest.fixture
def needs_gpu():
    """For tests of the GPU itself (NVML, the CUDA runtime): skipped in CPU mode only."""
    if CPU_MODE:
        pytest.skip("EMBER_GPU_TESTS_DEVICE=cpu: this test needs the GPU itself")
