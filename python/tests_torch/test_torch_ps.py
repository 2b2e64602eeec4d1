"""ember.torch.AsyncParameters (issue 21, in progress): a PyTorch loop trained asynchronously
through real parameter-server shards; two workers as threads, at once."""
from __future__ import annotations

import threading

import numpy as np
import torch
import torch.nn as nn

import ember.ps
import ember.torch

SECRET = b"0123456789abcdef-ps-torch-test"


def _net(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.BatchNorm1d(16), nn.Linear(16, 1))


def test_two_workers_train_at_once_through_the_shards_and_end_with_their_weights():
    servers = [ember.ps.Server.start(f"ps:{i}", SECRET, bind_host="127.0.0.1") for i in range(2)]
    shards = [f"127.0.0.1:{s.port}" for s in servers]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g)
    y = x @ torch.arange(1.0, 9.0).reshape(8, 1) / 10 + 0.5
    losses, errors, syncs = {}, [], {}

    def worker(rank):
        try:
            net = _net(rank)  # different initial weights: the shards' (the first creator's) win
            opt = torch.optim.SGD(net.parameters(), lr=0.05)
            sync = ember.torch.AsyncParameters(net, ember.ps.Client.connect(shards, SECRET, name=f"worker:{rank}"),
                                               every=2)
            out = []
            for epoch in range(6):
                for i in range(rank * 16, 512, 64):
                    opt.zero_grad()
                    loss = nn.functional.mse_loss(net(x[i:i + 32]), y[i:i + 32])
                    loss.backward()
                    opt.step()
                    sync.step()
                    out.append(loss.item())
            sync.finish()
            losses[rank], syncs[rank] = out, (sync, net)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    try:
        threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, errors
        for rank in range(2):
            assert np.mean(losses[rank][-4:]) < np.mean(losses[rank][:4]) / 3, losses[rank]
            assert syncs[rank][0].pushes > 0 and syncs[rank][0].rejected == 0
        checker = ember.ps.Client.connect(shards, SECRET)
        net = syncs[1][1]  # finished last or not: after finish() it pulled the shards' weights then
        for k, t in net.state_dict().items():
            if t.is_floating_point():
                shard_values = checker.pull("model/" + k, shape=tuple(t.shape))[0]
                assert shard_values.shape == tuple(t.shape)
        assert sum(s.pushes_applied for s in checker.stats()) > 0
    finally:
        for s in servers:
            s.close()
