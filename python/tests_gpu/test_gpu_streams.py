"""Work on torch's stream and Ember's (issue 20): a collective on a CUDA tensor waits for the
work queued to write it without stopping the caller (an event, ember/device.h Device::ready),
and ``ember.torch.device_batches`` stages batches in a thread of its own.  Run by
scripts/gpu_check.sh; see conftest.py."""
from __future__ import annotations

import threading
import time

import pytest
from thread_ranks import run_threads  # python/tests (tests_gpu/conftest.py puts it on the path)

pytestmark = pytest.mark.timeout(300)


def test_an_async_allreduce_returns_while_torchs_stream_still_writes_the_buffer(device, needs_gpu):
    import torch

    cycles = int(4e8)
    torch.cuda._sleep(cycles // 10)  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    sleep_secs = time.perf_counter() - t0

    def work(comm):
        buf = torch.zeros(1 << 20, device=device)
        comm.allreduce_(buf, op="sum")  # the first call on the device sets the path up
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        buf.fill_(comm.rank + 1.0)  # queued behind the sleep
        t0 = time.perf_counter()
        handle = comm.allreduce_async_(buf, op="sum")
        launched = time.perf_counter() - t0
        handle.wait()
        after = torch.full_like(buf, -5.0)  # torch's stream goes on after wait(): sees the result
        after.copy_(buf)
        return launched, after.cpu()

    for launched, result in run_threads(2, work):
        assert result.eq(3.0).all(), result[:4]  # the fills, not the zeros before them
        assert launched < sleep_secs / 2, (f"allreduce_async_ took {launched:.3f} s to return behind a "
                                           f"{sleep_secs:.3f} s kernel: it waited for torch's stream")


def test_synchronous_calls_read_what_torchs_stream_wrote(device, needs_gpu):
    import torch

    def work(comm):
        a = torch.zeros(3 << 20, device=device)
        torch.cuda._sleep(int(5e7))
        a.fill_(comm.rank + 2.0)
        comm.allreduce_(a, op="sum")
        b = torch.zeros(1000, dtype=torch.int64, device=device)
        torch.cuda._sleep(int(5e7))
        b.fill_(10 + comm.rank)
        comm.broadcast_(b, root=1)
        return a.cpu(), b.cpu()

    for a, b in run_threads(2, work):
        assert a.eq(5.0).all() and b.eq(11).all()


def test_device_batches_in_order_from_a_staging_thread(device, needs_gpu):
    import torch

    from ember.torch import device_batches

    src = [{"x": torch.full((64, 1000), float(i)), "y": torch.arange(10) + i,
            "p": torch.full((5,), float(i)).pin_memory()} for i in range(12)]
    got = list(device_batches(iter(src), device, prefetch=2))  # 12 batches through 4 reused buffer sets
    assert len(got) == 12
    for i, b in enumerate(got):
        assert b["x"].is_cuda and b["y"].is_cuda and b["p"].is_cuda
        assert b["x"].eq(i).all() and b["p"].eq(i).all() and torch.equal(b["y"].cpu(), torch.arange(10) + i), i

    def failing():
        yield from src[:3]
        raise ValueError("bad record at offset 42")

    seen = []
    with pytest.raises(ValueError, match="offset 42"):
        for b in device_batches(failing(), device):
            seen.append(b)
    assert len(seen) == 3

    gen = device_batches(iter(src), device)
    assert next(gen)["x"].eq(0).all()
    gen.close()
    left = [t.name for t in threading.enumerate() if t.name.startswith("ember-device-batches")]
    assert not left, f"staging threads outlived their generator: {left}"
