"""Synchronous data-parallel PyTorch on Ember's nodes (real Spark, real torch): ember.torch's
DistributedOptimizer keeps replicas identical, and an unchanged torch.distributed (gloo) program
runs on the environment Ember sets on every node."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import ember
from conftest import no_leftovers

pytestmark = pytest.mark.timeout(300)


def torch_train(args, ctx):
    import torch
    import torch.nn as nn

    import ember.torch

    torch.set_num_threads(1)
    torch.manual_seed(10 + ctx.executor_id)  # different initial weights on purpose
    g = torch.Generator().manual_seed(ctx.executor_id)
    x = torch.randn(256, 8, generator=g)
    y = x @ torch.arange(1.0, 9.0) / 10.0
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    ember.torch.broadcast_parameters(model)
    opt = ember.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    losses = []
    metrics = ember.torch.MetricsWriter()
    for epoch in range(30):
        for i in range(0, 256, 32):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x[i:i + 32])[:, 0], y[i:i + 32])
            loss.backward()
            opt.step()
        metrics.step(epoch, loss=loss.item())
        averaged = metrics.epoch(epoch, loss=loss.item())
        losses.append(float(ctx.allreduce(torch.tensor([loss.item()]))[0]))
        assert abs(averaged["loss"] - losses[-1]) < 1e-6, (averaged, losses[-1])
    torch.save(model.state_dict(), Path(args["out"]) / f"model-{ctx.training_rank}.pt")
    Path(args["out"], f"losses-{ctx.training_rank}.json").write_text(json.dumps(losses))


def test_distributed_optimizer_keeps_replicas_identical(spark, tmp_path):
    import torch

    cluster = ember.Cluster.run(spark, torch_train, {"out": str(tmp_path)}, num_executors=2, reservation_timeout=120,
                                log_dir=str(tmp_path / "logs"))
    cluster.shutdown(timeout=240)
    s0, s1 = (torch.load(tmp_path / f"model-{r}.pt") for r in range(2))
    for k in s0:
        assert torch.equal(s0[k], s1[k]), k
    losses = json.loads((tmp_path / "losses-0.json").read_text())
    assert losses == json.loads((tmp_path / "losses-1.json").read_text())
    assert losses[-1] < losses[0] * 0.2, losses
    # MetricsWriter: each node its own batch loss; the chief the averaged epoch loss.
    import tensorflow as tf
    tags = []
    for i in range(2):
        (path,) = (tmp_path / "logs" / f"worker_{i}").glob("events.out.tfevents.*")
        scalars: dict = {}
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for v in event.summary.value:
                scalars.setdefault(v.tag, []).append((event.step, v.simple_value))
        assert [s for s, _ in scalars["batch/loss"]] == list(range(30))
        tags.append(set(scalars))
        if i == 0:
            assert [s for s, _ in scalars["epoch/loss"]] == list(range(30))
            assert max(abs(v - want) for (_, v), want in zip(scalars["epoch/loss"], losses)) < 1e-6
    assert "epoch/loss" not in tags[1]


def plain_torch_distributed(args, ctx):
    """A torch.distributed program that knows nothing of Ember but its environment."""
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    env = {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    Path(args["out"], f"dist-{dist.get_rank()}.json").write_text(json.dumps({"sum": t.item(), "env": env}))
    dist.destroy_process_group()


def test_unchanged_torch_distributed_program_runs(spark, tmp_path):
    cluster = ember.Cluster.run(spark, plain_torch_distributed, {"out": str(tmp_path)}, num_executors=2,
                                reservation_timeout=120)
    cluster.shutdown(timeout=240)
    res = [json.loads((tmp_path / f"dist-{r}.json").read_text()) for r in range(2)]
    for r, out in enumerate(res):
        assert out["sum"] == 3.0
        assert out["env"]["RANK"] == str(r) and out["env"]["WORLD_SIZE"] == "2"
        assert out["env"]["LOCAL_RANK"] == str(r)  # both nodes on this host
    assert res[0]["env"]["MASTER_ADDR"] == res[1]["env"]["MASTER_ADDR"]


def test_unchanged_torch_distributed_program_runs_as_an_executable(spark, tmp_path):
    """The same program as a script (not a main_fun): its node gets the same environment."""
    import sys

    program = str(Path(__file__).resolve().parent / "torch_dist_program.py")
    cluster = ember.Cluster.run(spark, [sys.executable, program, str(tmp_path)], num_executors=2,
                                reservation_timeout=120)
    cluster.shutdown(timeout=240)
    res = [json.loads((tmp_path / f"dist-{r}.json").read_text()) for r in range(2)]
    master = tuple(cluster.cluster_spec["worker"][0].rsplit(":", 1))
    for r, out in enumerate(res):
        assert out["sum"] == 3.0
        assert (out["env"]["RANK"], out["env"]["WORLD_SIZE"], out["env"]["LOCAL_RANK"]) == (str(r), "2", str(r))
        assert (out["env"]["MASTER_ADDR"], out["env"]["MASTER_PORT"]) == master
    no_leftovers(cluster.job_id)


def test_torch_tensors_through_the_communicator_in_place():
    import threading

    import torch

    from ember import _ember
    from ember.collective import Communicator

    store = _ember.CollectiveStore.in_memory()
    out = [None, None]

    def rank(r):
        comm = Communicator.create(r, 2, b"0123456789abcdef-torch", store, prefix="ember-pytest-torch",
                                   connect_timeout=20, timeout=20)
        t = torch.full((5,), float(r + 1))
        comm.allreduce_(t, op="sum")            # in place through DLPack: no copy
        b = torch.arange(4, dtype=torch.bfloat16) * (r + 1)
        out[r] = (t, comm.allreduce(b, op="max"), comm.broadcast(torch.tensor([r * 10]), root=1))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for t, b, c in out:
        assert torch.equal(t, torch.full((5,), 3.0))
        assert b.dtype == torch.bfloat16 and torch.equal(b, torch.arange(4, dtype=torch.bfloat16) * 2)
        assert c.item() == 10
