"""PyTorch checkpoints (ember.torch.save_checkpoint / load_latest over ember.checkpoint): a
model + optimizer round trip, and a 2-node job that a second job resumes from its checkpoint."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

import ember
import ember.checkpoint
from conftest import no_leftovers

pytestmark = pytest.mark.timeout(300)


def _model_and_optimizer(seed: int):
    import torch
    import torch.nn as nn

    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _train_steps(model, opt, n: int) -> None:
    import torch

    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        x = torch.randn(32, 8, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x)[:, 0], x.sum(1)).backward()
        opt.step()


def test_model_and_optimizer_round_trip(tmp_path):
    import torch

    import ember.torch

    directory = str(tmp_path / "ckpt")
    model, opt = _model_and_optimizer(1)
    other, other_opt = _model_and_optimizer(2)
    assert ember.torch.load_latest(directory, other, other_opt) is None  # nothing yet, nothing changed
    _train_steps(model, opt, 5)
    assert ember.torch.save_checkpoint(directory, 5, model, opt, keep=2)
    assert ember.checkpoint.CheckpointManager(directory).steps() == [5]
    assert not torch.equal(other[0].weight, model[0].weight)

    assert ember.torch.load_latest(directory, other, other_opt) == 5
    for k, v in model.state_dict().items():
        assert torch.equal(v, other.state_dict()[k]), k
    a, b = opt.state_dict(), other_opt.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for i, st in a["state"].items():
        for k, v in st.items():
            assert torch.equal(v, b["state"][i][k]), (i, k)
    # Both go on identically: the optimizer's moments and step counts came back too.
    _train_steps(model, opt, 3)
    _train_steps(other, other_opt, 3)
    for k, v in model.state_dict().items():
        assert torch.equal(v, other.state_dict()[k]), k

    # The blobs are plain state_dicts that torch.load(weights_only=True) reads.
    _, blobs = ember.checkpoint.CheckpointManager(directory).restore()
    assert sorted(blobs) == ["model.pt", "optimizer.pt"]
    torch.load(io.BytesIO(blobs["optimizer.pt"]), weights_only=True)


def torch_job(args, ctx):
    import torch
    import torch.nn as nn

    import ember.torch

    torch.set_num_threads(1)
    torch.manual_seed(10 + ctx.executor_id + args["epochs"])  # differs per node and job
    g = torch.Generator().manual_seed(ctx.executor_id)
    x = torch.randn(256, 8, generator=g)
    y = x @ torch.arange(1.0, 9.0) / 10.0
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = ember.torch.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01))
    start = ember.torch.load_latest(args["ckpt"], model, opt) or 0  # the restart's first step
    ember.torch.broadcast_parameters(model)
    out, r = Path(args["out"]), ctx.training_rank
    torch.save(model.state_dict(), out / f"restored-{r}.pt")
    losses = []
    for epoch in range(start, args["epochs"]):
        for i in range(0, 256, 32):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x[i:i + 32])[:, 0], y[i:i + 32])
            loss.backward()
            opt.step()
        losses.append(float(ctx.allreduce(torch.tensor([loss.item()]))[0]))
        ember.torch.save_checkpoint(args["ckpt"], epoch + 1, model, opt, keep=3)
    torch.save(model.state_dict(), out / f"final-{r}.pt")
    (out / f"run-{r}.json").write_text(json.dumps({"start": start, "losses": losses}))


def _run(spark, out: Path, ckpt: str, epochs: int):
    out.mkdir()
    cluster = ember.Cluster.run(spark, torch_job, {"out": str(out), "ckpt": ckpt, "epochs": epochs},
                                num_executors=2, reservation_timeout=120)
    cluster.shutdown(timeout=240)
    no_leftovers(cluster.job_id)
    return [json.loads((out / f"run-{r}.json").read_text()) for r in range(2)]


def test_a_new_job_resumes_from_the_checkpoint(spark, tmp_path):
    import torch

    ckpt = str(tmp_path / "ckpt")
    first = _run(spark, tmp_path / "first", ckpt, epochs=3)
    assert [run["start"] for run in first] == [0, 0]
    m = ember.checkpoint.CheckpointManager(ckpt)
    assert m.steps() == [1, 2, 3]
    saved = torch.load(io.BytesIO(m.restore()[1]["model.pt"]), weights_only=True)
    final0 = torch.load(tmp_path / "first" / "final-0.pt", weights_only=True)
    for k in saved:
        assert torch.equal(saved[k], final0[k]), k

    second = _run(spark, tmp_path / "second", ckpt, epochs=5)
    for r, run in enumerate(second):
        assert run["start"] == 3 and len(run["losses"]) == 2, run
        restored = torch.load(tmp_path / "second" / f"restored-{r}.pt", weights_only=True)
        for k in saved:
            assert torch.equal(restored[k], saved[k]), (r, k)  # bit for bit, on every node
    assert second[0]["losses"] == second[1]["losses"]
    assert second[0]["losses"][0] < first[0]["losses"][0], (first, second)  # continued, not restarted
    assert m.steps() == [3, 4, 5]
