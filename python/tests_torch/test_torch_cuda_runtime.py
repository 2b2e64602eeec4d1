"""The CUDA runtime the collectives load at run time (ember/device.h), against the real
libcudart that PyTorch's wheel brings: on this CPU machine it loads (every call Ember resolves
exists in it) though no GPU is there.  The CUDA paths themselves run on a GPU host
(scripts/gpu_check.sh, python/tests_gpu/)."""
from __future__ import annotations

import glob
import os

import pytest

from ember import _ember
from ember.errors import NotFound


def torch_cudart() -> str:
    import torch

    site = os.path.dirname(os.path.dirname(torch.__file__))
    found = sorted(glob.glob(os.path.join(site, "nvidia", "**", "libcudart.so.*"), recursive=True))
    assert found, f"PyTorch's wheel brings no libcudart under {site}/nvidia"
    return found[0]


def test_the_real_cuda_runtime_resolves_every_call_ember_uses():
    path = torch_cudart()
    described = _ember.cuda_runtime([path])
    assert described.startswith("CUDA runtime ") and path in described, described
    version = int(described.split()[2])
    assert version >= 11000, described


def test_the_real_nccl_resolves_every_call_ember_uses():
    import torch

    site = os.path.dirname(os.path.dirname(torch.__file__))
    found = sorted(glob.glob(os.path.join(site, "nvidia", "**", "libnccl.so.*"), recursive=True))
    assert found, f"PyTorch's wheel brings no libnccl under {site}/nvidia"
    described = _ember.nccl_library([found[0]])
    assert described.startswith("NCCL 2.") and found[0] in described, described
    with pytest.raises(NotFound, match="libember-no-such-nccl.so.*nvidia-nccl"):
        _ember.nccl_library(["libember-no-such-nccl.so"])


def test_a_missing_runtime_names_what_was_tried():
    with pytest.raises(NotFound, match="libember-no-such-cudart.so.*nvidia-cuda-runtime-cu12"):
        _ember.cuda_runtime(["libember-no-such-cudart.so"])


def test_cpu_tensors_still_take_the_host_path():
    import numpy as np
    import torch

    from ember.collective import Communicator

    store = _ember.CollectiveStore.in_memory()
    comm = Communicator.create(0, 1, b"0123456789abcdef-test", store, prefix=f"ember-cudart-{os.getpid()}")
    t = torch.arange(10, dtype=torch.float32)
    comm.allreduce_(t, "sum")
    assert np.array_equal(t.numpy(), np.arange(10, dtype=np.float32))
    comm.close()
