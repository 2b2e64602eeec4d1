"""Ember's collectives on CUDA tensors (issue 20): 2-3 ranks as threads of this process over an
in-memory store, all on cuda:0.  Every call on device memory must give, bit for bit, what the
same call gives on the same values in host memory (the core stages device buffers through
pinned host chunks of CommunicatorOptions.device_chunk_bytes, 4 MiB, and reduces them on the
host: nothing may change on the way).  Run by scripts/gpu_check.sh; see conftest.py."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from thread_ranks import run_threads  # python/tests (tests_gpu/conftest.py puts it on the path)

pytestmark = pytest.mark.timeout(300)

DTYPES = ["float32", "bfloat16", "float16", "int64"]
CHUNK = 4 << 20  # CommunicatorOptions.device_chunk_bytes' default


def values(dtype, n, seed):
    """`n` deterministic values of `dtype` on the host (random floats, not just small integers,
    so a reduction done in another precision or order would show)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if dtype == "int64":
        return torch.randint(-(1 << 40), 1 << 40, (n,), generator=g, dtype=torch.int64)
    return (torch.randn(n, generator=g, dtype=torch.float32) * 3).to(getattr(torch, dtype))


def bits(t):
    """`t` on the host as its raw bits, so equality is bit-exact (NaN, -0.0)."""
    import torch

    t = t.detach().cpu().contiguous()
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def assert_bit_equal(got, want, what):
    import torch

    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), (what, got.dtype, want.dtype,
                                                                               got.shape, want.shape)
    g, w = bits(got).reshape(-1), bits(want).reshape(-1)
    if not torch.equal(g, w):
        i = int((g != w).nonzero()[0])
        raise AssertionError(f"{what}: {int((g != w).sum())} of {g.numel()} elements differ, first at {i}: "
                             f"{got.reshape(-1)[i].item()!r} vs {want.reshape(-1)[i].item()!r}")


# Lengths: odd ones, one element, and buffers past one staging chunk (odd, so the last chunk is short).
def lengths(dtype):
    import torch

    item = torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    return [1, 7, 4099, (CHUNK // item) * 2 + 37]


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_device_calls_equal_host_calls(device, dtype, size):
    import torch

    ns = lengths(dtype)

    def work(comm):
        r, out = comm.rank, []
        for n in ns:
            host = values(dtype, n, seed=1000 * r + n)
            for kind, call in (("sum", lambda x: comm.allreduce_(x, op="sum")),
                               ("average", lambda x: comm.allreduce_(x, op="average")),
                               ("max", lambda x: comm.allreduce_(x, op="max")),
                               ("broadcast", lambda x: comm.broadcast_(x, root=size - 1)),
                               ("async", lambda x: comm.allreduce_async_(x, op="sum").wait())):
                if kind == "average" and dtype == "int64":
                    continue
                h, d = host.clone(), host.to(device, copy=True)  # a copy in CPU mode too
                call(h)
                call(d)
                if d.is_cuda:
                    torch.cuda.synchronize()
                assert d.device == torch.device(device)
                out.append((f"{kind} n={n}", d.cpu(), h))
            # two async calls in flight at once, ended in order
            a, b = host.to(device, copy=True), (host * 2 if dtype != "int64" else host + 1).to(device)
            ha, hb = a.cpu().clone(), b.cpu().clone()
            wa, wb = comm.allreduce_async_(a, op="sum"), comm.allreduce_async_(b, op="sum")
            wa.wait(), wb.wait()
            comm.allreduce_(ha, op="sum"), comm.allreduce_(hb, op="sum")
            out += [(f"async pair a n={n}", a.cpu(), ha), (f"async pair b n={n}", b.cpu(), hb)]
            # reduce_scatter and allgather (through the host) keep the device
            m = max(1, n // size)
            block = host[: m * size].reshape(size, m) if n >= size else values(dtype, size * m, seed=r).reshape(size, m)
            rs_d, rs_h = comm.reduce_scatter(block.to(device), op="sum"), comm.reduce_scatter(block, op="sum")
            assert rs_d.device == torch.device(device)
            out.append((f"reduce_scatter n={n}", rs_d.cpu(), rs_h))
            rows = host[: max(1, n * (r + 1) // (size + 1))]  # lengths differ between ranks
            ag_d, ag_h = comm.allgather(rows.to(device)), comm.allgather(rows)
            assert ag_d.device == torch.device(device)
            out.append((f"allgather n={n}", ag_d.cpu(), ag_h))
        return out

    results = run_threads(size, work)
    for r, out in enumerate(results):
        for what, got, want in out:
            assert_bit_equal(got, want, f"rank {r} {dtype} {what}")
    for what, got, _ in results[0]:  # and every rank holds the same result
        for r in range(1, size):
            other = dict((w, g) for w, g, _ in results[r])[what]
            if not what.startswith("reduce_scatter"):
                assert_bit_equal(other, got, f"rank {r} vs rank 0 {dtype} {what}")


def test_non_contiguous_or_offset_views(device):
    """A slice of a larger CUDA tensor is reduced where it lies and its neighbours are left alone."""
    import torch

    def work(comm):
        base = torch.full((3 * CHUNK // 4 + 11,), -1.0, device=device)
        view = base[5:-6]
        view.fill_(comm.rank + 1.0)
        comm.allreduce_(view, op="sum")
        return base.cpu()

    for base in run_threads(2, work):
        assert base[:5].eq(-1).all() and base[-6:].eq(-1).all() and base[5:-6].eq(3).all()


@pytest.mark.parametrize("overlap", [None, True, False])
def test_distributed_optimizer_on_a_cnn_keeps_replicas_identical(device, overlap):
    """ember.torch.DistributedOptimizer on a small CNN on the device, 2 ranks with different data:
    after a few steps the weights are bit-identical on both and equal (to float tolerance) to one
    model trained on the average of their gradients."""
    import torch
    import torch.nn as nn

    import ember.torch

    def make_model():
        return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
                             nn.Flatten(), nn.Linear(64, 10))

    def batch(rank, step):
        g = torch.Generator().manual_seed(100 * rank + step)
        return torch.randn(16, 1, 28, 28, generator=g), torch.randint(0, 10, (16,), generator=g)

    steps = 4

    def work(comm):
        torch.manual_seed(comm.rank)  # different initial weights: broadcast_parameters evens them
        model = make_model().to(device)
        ember.torch.broadcast_parameters(model, comm=comm)
        initial = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        opt = ember.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), comm=comm,
                                               overlap=overlap, bucket_cap_mb=0.01)  # several buckets
        if overlap is None:  # the default: the fused path (measured faster, docs/benchmarks.md)
            assert opt._reducer is None
        for step in range(steps):
            x, y = batch(comm.rank, step)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            opt.step()
        return initial, {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    (init0, final0), (init1, final1) = run_threads(2, work)
    for k in init0:
        assert_bit_equal(init1[k], init0[k], f"initial {k}")
        assert_bit_equal(final1[k], final0[k], f"after {steps} steps {k}")
    assert any(not torch.equal(init0[k], final0[k]) for k in init0), "the weights did not move"

    # the same training on one model, the two ranks' gradients averaged by hand
    model = make_model().to(device)
    model.load_state_dict(init0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        grads = []
        for rank in range(2):
            x, y = batch(rank, step)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x.to(device)), y.to(device)).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, g0, g1 in zip(model.parameters(), *grads):
            p.grad = (g0 + g1) / 2
        opt.step()
    for k, v in model.state_dict().items():
        torch.testing.assert_close(final0[k], v.detach().cpu(), rtol=1e-4, atol=1e-5)


def test_cupy_arrays_through_dlpack(device):
    """CuPy arrays are CUDA memory in DLPack: reduced and broadcast in place (the caller finishes
    its own stream's work first, as for any array Ember does not know)."""
    if device == "cpu":
        pytest.skip("EMBER_GPU_TESTS_DEVICE=cpu: CuPy arrays live on the GPU")
    cp = pytest.importorskip("cupy")

    n = CHUNK // 4 * 2 + 13

    def work(comm):
        with cp.cuda.Device(0):
            x = cp.arange(n, dtype=cp.float32) * (comm.rank + 1)
            b = cp.full((n,), comm.rank, dtype=cp.int64)
            cp.cuda.get_current_stream().synchronize()
            comm.allreduce_(x, op="sum")
            comm.broadcast_(b, root=1)
            return cp.asnumpy(x), cp.asnumpy(b)

    import numpy as np
    for x, b in run_threads(2, work):
        np.testing.assert_array_equal(x, np.arange(n, dtype=np.float32) * 3)
        np.testing.assert_array_equal(b, np.ones(n, dtype=np.int64))


def test_nvml_uuid_is_the_one_nvidia_smi_prints(needs_gpu):
    from ember import _ember

    smi = shutil.which("nvidia-smi")
    assert smi, "nvidia-smi is not on PATH"
    listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60, check=True).stdout
    found = re.search(r"^GPU 0:.*\(UUID: (GPU-[0-9a-fA-F-]+)\)", listing, re.M)
    assert found, listing
    assert _ember.gpu_uuids(["0"]) == [found.group(1)], (listing, _ember.gpu_uuids(["0"]))


def test_the_cuda_runtime_loads(device, needs_gpu):
    """With torch's CUDA initialised, the runtime Ember loads for device memory resolves."""
    from ember import _ember

    described = _ember.cuda_runtime()
    assert described.startswith("CUDA runtime ") and int(described.split()[2]) >= 11000, described
