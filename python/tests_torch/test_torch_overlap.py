"""ember.torch.DistributedOptimizer's overlap (issue 20, point 3): gradients reduced in buckets
from autograd hooks while backward runs.  Ranks are threads over an in-memory store (real torch,
real Ember collectives); every result is compared bit for bit with ``overlap=False`` (one fused
allreduce per dtype in step()), which the overlap path must match exactly."""
from __future__ import annotations

import pytest
import torch._dynamo  # noqa: F401  (torch.optim loads it; before TensorFlow, see test_torch_dtypes)

from test_torch_dtypes import run_threads

pytestmark = pytest.mark.timeout(300)


class Probe:
    """A communicator that records the allreduces ember.torch launches (by buffer), and what else
    happened meanwhile (``mark``)."""

    def __init__(self, comm):
        self.comm, self.events = comm, []

    def allreduce_async_(self, x, op="average", timeout=0.0):
        self.events.append(("launch", x.data_ptr()))
        return self.comm.allreduce_async_(x, op, timeout)

    def allreduce_(self, x, op="average", timeout=0.0):  # the buckets step() sends itself
        self.events.append(("launch", x.data_ptr()))
        return self.comm.allreduce_(x, op, timeout)

    def mark(self, what):
        self.events.append((what, None))

    def launches(self, opt):
        """Bucket indices of the launches so far, in launch order."""
        index = {b.flat.data_ptr(): k for k, b in enumerate(opt._reducer.buckets)}
        return [index[ptr] for what, ptr in self.events if what == "launch"]

    def __getattr__(self, name):
        return getattr(self.comm, name)


def init_(model, seed):
    """Weights from a generator of this seed (torch's global one is shared by the rank threads)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model


def cnn(seed, dtype=None):
    import torch.nn as nn

    model = init_(nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 8, 3), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 4 * 4, 16), nn.ReLU(), nn.Linear(16, 3)), seed)
    return model.to(dtype) if dtype is not None else model


def batch(rank, step, dtype=None):
    import torch

    g = torch.Generator().manual_seed(1000 * rank + step)
    x, y = torch.randn(6, 1, 8, 8, generator=g), torch.randint(0, 3, (6,), generator=g)
    return (x.to(dtype) if dtype is not None else x), y


def train(comm, overlap, steps=4, seed=0, dtype=None, clip=None, **kw):
    """`steps` SGD-with-momentum steps on this rank's data; the final state_dict."""
    import torch
    import torch.nn as nn

    import ember.torch

    model = cnn(seed + comm.rank, dtype)  # different initial weights on purpose
    ember.torch.broadcast_parameters(model, comm=comm)
    opt = ember.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                           comm=comm, overlap=overlap, **kw)
    for step in range(steps):
        x, y = batch(comm.rank, step, dtype)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x).float(), y).backward()
        if clip is not None:
            opt.synchronize()
            nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_same(a, b):
    import torch

    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("bucket_cap_mb", [25.0, 0.001])
def test_overlap_matches_fused_bit_for_bit(size, bucket_cap_mb):
    """Replicas after 4 steps (with clipping after synchronize() in a second run) are identical
    across ranks and to overlap=False's, one bucket or one per parameter; 3 ranks too (each
    element is reduced in rank order whatever bucket it travels in)."""

    def work(comm):
        return [(train(comm, True, bucket_cap_mb=bucket_cap_mb, clip=clip), train(comm, False, clip=clip))
                for clip in (None, 0.05)]

    results = run_threads(size, work)
    for runs in results:
        for overlapped, fused in runs:
            assert_same(overlapped, fused)
    for r in range(1, size):
        for (o0, _), (o_r, _) in zip(results[0], results[r]):
            assert_same(o0, o_r)


def test_buckets_follow_backward_order_and_the_cap():
    import torch
    import torch.nn as nn

    import ember.torch

    def work(comm):
        model = nn.Sequential(nn.Linear(100, 100), nn.Linear(100, 10), nn.Linear(10, 1))  # 40 KB, 4 KB, 44 B
        w = lambda i: model[i].weight  # noqa: E731
        b = lambda i: model[i].bias  # noqa: E731
        out = {}
        for cap_kb in (1, 4, 100):
            opt = ember.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), comm=comm,
                                                   bucket_cap_mb=cap_kb / 1024, overlap=True)
            out[cap_kb] = [[id(p) for p in bk.params] for bk in opt._reducer.buckets]
            del opt
        ids = lambda *ps: [id(p) for p in ps]  # noqa: E731
        # reverse order; a bucket closes at the param that brings it to the cap
        assert out[1] == [ids(b(2), w(2), b(1), w(1)), ids(b(0), w(0))]      # 4,084 B, then 40,400 B
        assert out[4] == [ids(b(2), w(2), b(1), w(1), b(0)), ids(w(0))]      # 4,484 B, then 40,000 B
        assert out[100] == [ids(b(2), w(2), b(1), w(1), b(0), w(0))]
        return True

    assert run_threads(1, work) == [True]


def test_mixed_dtypes_get_a_bucket_per_dtype_and_match_fused():
    """fp32 and bf16 parameters interleaved: buckets of one dtype each, in backward order; the
    results (op average and sum) equal overlap=False's bit for bit."""
    import torch
    import torch.nn as nn

    import ember.torch

    def model_for(rank):
        model = init_(nn.ModuleList([nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2)]), rank)
        model[0].to(torch.bfloat16), model[2].to(torch.bfloat16)
        return model

    def run(comm, overlap, op):
        model = model_for(comm.rank)
        ember.torch.broadcast_parameters(model, comm=comm)
        opt = ember.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.125), comm=comm, op=op,
                                               overlap=overlap, bucket_cap_mb=1e-4)
        grads = []
        for step in range(3):
            x = torch.full((2, 4), float(comm.rank + step + 1), dtype=torch.bfloat16)
            opt.zero_grad()
            model[2](model[1](model[0](x).float()).to(torch.bfloat16)).sum().backward()
            opt.synchronize()
            grads.append([p.grad.clone() for p in model.parameters()])
            opt.step()
        dtypes = [[p.dtype for p in b.params] for b in opt._reducer.buckets] if overlap else None
        return grads, model.state_dict(), dtypes

    def work(comm):
        return {op: (run(comm, True, op), run(comm, False, op)) for op in ("average", "sum")}

    results = run_threads(2, work)
    for res in results:
        for (g_o, s_o, dtypes), (g_f, s_f, _) in res.values():
            for step_o, step_f in zip(g_o, g_f):
                for a, b in zip(step_o, step_f):
                    assert a.dtype == b.dtype and torch.equal(a, b)
            assert_same(s_o, s_f)
            assert all(len(set(d)) == 1 for d in dtypes), dtypes
            assert {d[0] for d in dtypes} == {torch.bfloat16, torch.float32}
    assert_same(results[0]["sum"][0][1], results[1]["sum"][0][1])


def test_hooks_launch_buckets_while_backward_runs():
    """A probe: buckets are launched before the last gradient of the backward pass (the input's,
    computed after every parameter's) exists, in index order, all of them once per step."""
    import torch
    import torch.nn as nn

    import ember.torch

    def work(comm):
        probe = Probe(comm)
        model = cnn(0)
        opt = ember.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), comm=probe,
                                               bucket_cap_mb=1e-6, overlap=True)
        n = len(opt._reducer.buckets)
        seen = []
        for step in range(2):
            x, y = batch(comm.rank, step)
            x.requires_grad_(True)
            x.register_hook(lambda g: probe.mark("input grad"))
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            probe.mark("backward returned")
            opt.step()
            seen.append([w for w, _ in probe.events])
            assert probe.launches(opt) == list(range(n)), probe.launches(opt)
            probe.events.clear()
        return n, seen

    for n, seen in run_threads(2, work):
        assert n == 8  # one bucket per parameter at this cap
        for events in seen:
            first_done = events.index("input grad")
            assert events[:first_done].count("launch") >= n - 2, events  # the first conv's pair may wait
            assert events.index("backward returned") > events.index("launch")


def test_unused_parameters_do_not_hang_and_match_ranks():
    """Rank 0 uses branches a and b, rank 1 only a; c is unused everywhere.  b's gradient is the
    average of rank 0's and zeros on both ranks; c keeps grad None; a bucket
    waiting for an unused parameter holds the later ones back (launch order stays 0, 1, ...)."""
    import torch
    import torch.nn as nn

    import ember.torch

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(3, 2), nn.Linear(3, 2), nn.Linear(3, 2)

        def forward(self, x, use_b):
            y = self.a(x)
            return y + self.b(x) if use_b else y

    def work(comm):
        probe = Probe(comm)
        net = init_(Net(), 0)
        opt = ember.torch.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), comm=probe,
                                               bucket_cap_mb=1e-5, overlap=True)
        out = []
        for set_to_none in (True, False):
            opt.zero_grad(set_to_none=set_to_none)
            x = torch.full((2, 3), float(comm.rank + 1))
            net(x, use_b=comm.rank == 0).sum().backward()
            local_b = None if net.b.weight.grad is None else net.b.weight.grad.clone()
            opt.synchronize()
            out.append((local_b, net.b.weight.grad.clone(), net.c.weight.grad, net.a.weight.grad.clone()))
            assert probe.launches(opt) == list(range(len(opt._reducer.buckets)))
            probe.events.clear()
            opt.step()
        return out, {k: v.clone() for k, v in net.state_dict().items()}

    (out0, state0), (out1, state1) = run_threads(2, work)
    assert_same(state0, state1)
    for (lb0, b0, c0, a0), (lb1, b1, c1, a1), set_to_none in zip(out0, out1, (True, False)):
        assert torch.equal(a0, a1) and torch.equal(b0, b1)
        assert torch.equal(b0, lb0 / 2)  # (g + 0) / 2 exactly
        assert c0 is None and c1 is None  # no rank had one: not made up
        if set_to_none:
            assert lb1 is None
        else:  # zero_grad(set_to_none=False) left rank 1 the zeros it then sent
            assert torch.equal(lb1, torch.zeros_like(lb1))


def test_gradient_accumulation_with_and_without_no_sync():
    """Two micro-batches per step: under no_sync() the first backward launches nothing and the
    second reduces the sum; without it the sum is reduced at step (twice the launches).  Both equal
    overlap=False's accumulation bit for bit."""
    import torch
    import torch.nn as nn

    import ember.torch

    def run(comm, mode):
        probe = Probe(comm)
        model = cnn(comm.rank)
        ember.torch.broadcast_parameters(model, comm=comm)
        opt = ember.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                               comm=probe, overlap=mode != "fused", bucket_cap_mb=1e-3)
        launches = []
        for step in range(3):
            opt.zero_grad()
            for micro in range(2):
                x, y = batch(comm.rank, 10 * step + micro)
                loss = nn.functional.cross_entropy(model(x), y)
                if mode == "no_sync" and micro == 0:
                    with opt.no_sync():
                        loss.backward()
                    launches.append(len(probe.events))
                else:
                    loss.backward()
            opt.step()
            launches.append(len(probe.events))
            probe.events.clear()
        n = len(opt._reducer.buckets) if opt._reducer is not None else 0
        return model.state_dict(), launches, n

    def work(comm):
        return {mode: run(comm, mode) for mode in ("fused", "no_sync", "twice")}

    for res in run_threads(2, work):
        fused, _, _ = res["fused"]
        (no_sync, l_ns, n), (twice, l_tw, _) = res["no_sync"], res["twice"]
        assert_same(no_sync, fused)
        assert_same(twice, fused)
        assert l_ns == [0, n] * 3, l_ns
        assert l_tw == [2 * n] * 3, l_tw


def test_zero_grad_mid_round_keeps_ranks_in_step():
    """backward, then zero_grad with no step (an evaluation pass, say), where the ranks launched
    different buckets (rank 1 skips a layer): zero_grad finishes the round, later steps match."""
    import torch
    import torch.nn as nn

    import ember.torch

    def work(comm):
        net = init_(nn.ModuleList([nn.Linear(3, 3), nn.Linear(3, 1)]), 0)
        opt = ember.torch.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), comm=comm,
                                               bucket_cap_mb=1e-5, overlap=True)
        x = torch.full((2, 3), float(comm.rank + 1))
        h = net[0](x) if comm.rank == 0 else x
        net[1](h).sum().backward()
        opt.zero_grad()
        assert all(p.grad is None for p in net.parameters())
        for _ in range(2):
            opt.zero_grad(set_to_none=False)
            net[1](net[0](x)).sum().backward()
            opt.step()
        return {k: v.clone() for k, v in net.state_dict().items()}

    s0, s1 = run_threads(2, work)
    assert_same(s0, s1)


def test_sparse_gradients_raise_a_clear_error():
    import torch
    import torch.nn as nn

    import ember.torch

    def work(comm):
        emb = nn.Embedding(10, 3, sparse=True)
        errors = []
        for overlap in (True, False):
            opt = ember.torch.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=0.1), comm=comm,
                                                   overlap=overlap)
            try:
                emb(torch.tensor([1, 2])).sum().backward()
                opt.step()
            except ValueError as e:
                errors.append(str(e))
            emb.weight.grad = None
            del opt
        return errors

    (errors,) = run_threads(1, work)
    assert len(errors) == 2 and all("sparse gradients are not supported" in e for e in errors), errors


def test_attributes_pass_through_and_bad_cap():
    import torch
    import torch.nn as nn

    import ember.torch

    def work(comm):
        model = nn.Linear(2, 1)
        opt = ember.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5), comm=comm, overlap=True)
        assert opt.param_groups[0]["lr"] == 0.5 and opt.defaults["lr"] == 0.5
        opt.param_groups[0]["lr"] = 0.25
        assert opt._optimizer.param_groups[0]["lr"] == 0.25
        with pytest.raises(ValueError, match="bucket_cap_mb"):
            ember.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5), comm=comm,
                                             bucket_cap_mb=0, overlap=True)
        return True

    assert run_threads(1, work) == [True]


def test_overlap_is_off_by_default():
    """The default is the fused path (measured faster on CPU hosts, where the reduction competes
    with backward for the cores, and on an H100 shared by two ranks); overlap=True turns it on."""
    import torch
    import torch.nn as nn

    import ember.torch

    def work(comm):
        model = nn.Linear(2, 1)
        fused = ember.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5), comm=comm)
        forced = ember.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5), comm=comm,
                                                  overlap=True)
        return fused._reducer is None and forced._reducer is not None

    assert run_threads(1, work) == [True]
