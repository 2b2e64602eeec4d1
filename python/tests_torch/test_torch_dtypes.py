"""Every dtype the core reduces, from torch tensors (issue 18 item 4: ``ctx.allgather`` on a bf16
tensor raised ``TypeError: Got unsupported ScalarType BFloat16``).  Ranks are threads over an
in-memory store (shared memory and TCP), then real nodes on real Spark; values are exact."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch._dynamo  # noqa: F401  (see below)

import ember
from thread_ranks import run_threads  # python/tests (tests_torch/conftest.py puts it on the path)

# torch.optim imports torch._dynamo, which loads triton's LLVM; loaded after TensorFlow's (a test
# earlier in the same pytest process may import TF) it aborts the process ("LLVM ERROR: Option ...
# registered more than once").  Loaded here, at collection, it comes first, and TF after it is fine.

pytestmark = pytest.mark.timeout(300)

DTYPES = ["bfloat16", "float16", "float32", "float64", "int32", "int64"]




@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_collective_takes_every_dtype(dtype, transport):
    import torch

    dt = getattr(torch, dtype)

    def t(values):
        return torch.tensor(values, dtype=torch.float64).to(dt)

    def work(comm):
        r, out = comm.rank, {}
        x = t([float(v + r) for v in range(8)])
        out["sum"] = comm.allreduce(x, op="sum")
        out["x_unchanged"] = torch.equal(x, t([float(v + r) for v in range(8)]))
        out["average"] = comm.allreduce(t([2.0 * (r + 1), -4.0]))
        out["max"] = comm.allreduce(t([r, -r]), op="max")
        out["bcast"] = comm.broadcast(t([r * 10.0, 1.0]), root=2)
        out["gather"] = comm.allgather(torch.full((r, 2), r).to(dt))  # varying rows, rank 0 none
        out["rs"] = comm.reduce_scatter(t([[0, 1], [2, 3], [4, 5]]) * (r + 1), op="sum")
        y = t([r + 1.0] * 5)
        assert comm.allreduce_(y, op="sum") is y  # in place through DLPack
        out["in_place"] = y
        grads = [t([r] * 3), t([[2 * r] * 2] * 2)]
        comm.allreduce_many_(grads, op="sum")
        out["many"] = grads
        z = t([float(r)] * 1000)
        comm.allreduce_async_(z, op="sum").wait()
        out["async"] = z
        return out

    def same(got, values):  # the caller's kind and dtype, and exactly these values
        assert isinstance(got, torch.Tensor) and got.dtype == dt, (type(got), getattr(got, "dtype", None))
        assert torch.equal(got, t(values)), (got, values)

    for r, out in enumerate(run_threads(3, work, transport=transport)):
        same(out["sum"], [3.0 * v + 3 for v in range(8)])
        assert out["x_unchanged"]
        same(out["average"], [4.0, -4.0])
        same(out["max"], [2.0, 0.0])
        same(out["bcast"], [20.0, 1.0])
        same(out["gather"], [[1, 1], [2, 2], [2, 2]])
        same(out["rs"], [[[0, 6], [12, 18], [24, 30]][r]])
        same(out["in_place"], [6.0] * 5)
        same(out["many"][0], [3] * 3)
        same(out["many"][1], [[6, 6], [6, 6]])
        same(out["async"], [3.0] * 1000)


def test_bfloat16_is_reduced_as_bfloat16():
    """256 + 1 + 1 in bf16 is 258: the core's float32 sum rounded once (not three bf16 steps)."""
    import torch

    def work(comm):
        x = torch.tensor([[256.0, 1.0, 1.0][comm.rank]], dtype=torch.bfloat16, requires_grad=True)
        return comm.allreduce(x, op="sum"), comm.allgather(x[0])

    for total, gathered in run_threads(3, work, transport="tcp"):
        assert total.dtype == torch.bfloat16 and total.item() == 258.0
        assert gathered.dtype == torch.bfloat16 and gathered.tolist() == [256.0, 1.0, 1.0]


def test_unsupported_torch_dtype_is_named():
    import torch

    def work(comm):
        for dtype in (torch.uint8, torch.bool, torch.complex64, torch.int16):
            for call in (comm.allreduce, comm.allgather, comm.broadcast):
                with pytest.raises(ValueError, match=f"bfloat16, float16, int32 or int64 arrays; got {str(dtype)[6:]}"):
                    call(torch.zeros(2, dtype=dtype))
        return True

    assert run_threads(1, work) == [True]


def test_distributed_optimizer_with_a_bfloat16_model_on_threads():
    """ember.torch on a model with bf16 and float32 layers (one fused allreduce per dtype): the
    gradients are the bf16 average of the ranks' gradients, and the replicas stay identical."""
    import torch
    import torch.nn as nn

    import ember.torch

    def work(comm):
        r = comm.rank
        torch.manual_seed(r)  # different initial weights on purpose
        model = nn.ModuleList([nn.Linear(4, 8).to(torch.bfloat16), nn.Linear(8, 1)])
        ember.torch.broadcast_parameters(model, comm=comm)
        initial = {k: v.clone() for k, v in model.state_dict().items()}
        opt = ember.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.125), comm=comm)
        local, averaged = [], []
        for step in range(3):
            x = torch.full((2, 4), float(r + step + 1), dtype=torch.bfloat16)
            opt.zero_grad()
            model[1](model[0](x).float()).sum().backward()
            local.append([p.grad.clone() for p in model.parameters()])
            opt.synchronize()
            averaged.append([p.grad.clone() for p in model.parameters()])
            opt.step()
        return initial, local, averaged, model.state_dict()

    (init0, local0, avg0, final0), (init1, local1, avg1, final1) = run_threads(2, work)
    for k in init0:
        assert torch.equal(init0[k], init1[k]), k  # rank 0's weights everywhere
        assert torch.equal(final0[k], final1[k]), k
        assert final0[k].dtype == init0[k].dtype
    assert [p.dtype for p in avg0[0]] == [torch.bfloat16] * 2 + [torch.float32] * 2
    for step in range(3):
        assert not torch.equal(local0[step][0], local1[step][0])  # the ranks saw different data
        for g0, g1, a0, a1 in zip(local0[step], local1[step], avg0[step], avg1[step]):
            want = ((g0.float() + g1.float()).to(g0.dtype) / 2)  # the core: sum rounded once, then halved
            assert torch.equal(a0, want) and torch.equal(a1, want), (a0, want)


# ----------------------------------------------------------------------------- real nodes
def node_torch_bfloat16(args, ctx):
    import torch
    import torch.nn as nn

    import ember.torch

    r = ctx.training_rank
    x = torch.full((r + 1, 2), float(r + 1), dtype=torch.bfloat16)
    gathered = ctx.allgather(x)  # the call
    total = ctx.allreduce(torch.tensor([r + 1.0, 0.5], dtype=torch.bfloat16), op="sum")
    bcast = ctx.broadcast(torch.tensor([r + 7.0], dtype=torch.bfloat16), root=1)
    torch.manual_seed(r)
    model = nn.Linear(3, 2).to(torch.bfloat16)
    ember.torch.broadcast_parameters(model)
    opt = ember.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.25))
    for step in range(3):
        opt.zero_grad()
        model(torch.full((4, 3), float(r + step), dtype=torch.bfloat16)).sum().backward()
        opt.step()
    result = {
        "gather": [str(gathered.dtype), type(gathered).__name__] + gathered.float().tolist(),
        "sum": [str(total.dtype)] + total.float().tolist(),
        "bcast": [str(bcast.dtype)] + bcast.float().tolist(),
        "weights": [str(model.weight.dtype)] + model.weight.float().tolist() + model.bias.float().tolist(),
    }
    Path(args["out"], f"node-{r}.json").write_text(json.dumps(result))


def test_torch_bfloat16_between_nodes(spark, tmp_path):
    cluster = ember.Cluster.run(spark, node_torch_bfloat16, {"out": str(tmp_path)}, num_executors=2,
                                reservation_timeout=120)
    cluster.shutdown(timeout=240)
    res = [json.loads((tmp_path / f"node-{r}.json").read_text()) for r in range(2)]
    for out in res:
        assert out["gather"] == ["torch.bfloat16", "Tensor", [1.0, 1.0], [2.0, 2.0], [2.0, 2.0]]
        assert out["sum"] == ["torch.bfloat16", 3.0, 1.0]
        assert out["bcast"] == ["torch.bfloat16", 8.0]
        assert out["weights"][0] == "torch.bfloat16"
    assert res[0]["weights"] == res[1]["weights"]  # replicas identical after bf16 steps
