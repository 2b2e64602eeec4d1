"""DataFeed.to_torch_dataset with real PyTorch (`make test-torch`).

Not part of `make test`: PyPI's torch wheels bring ~5 GB of CUDA libraries, so
`make test-torch` installs them into .torch-site/ on demand.  Runs the node's end
of the feed over a real shared-memory ring, as test_feed_unit.py does.
"""
import secrets
import sys
from pathlib import Path

import numpy as np
import pytest

TORCH_SITE = Path(__file__).resolve().parents[2] / ".torch-site"
sys.path.append(str(TORCH_SITE))  # after the venv: its packages win where both have one

import torch  # noqa: E402

from ember._feeder import task as feeding  # noqa: E402
from ember.feed import DataFeed  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ring():
    from ember import _ember
    # The node's feed as its launcher holds it: the ring and the feed server, the driver's way in.
    r = _ember.FeedHost.start(f"ember-test-{secrets.token_hex(6)}", 0, "worker:0", "127.0.0.1", "127.0.0.1",
                              b"s" * 32, ring_bytes=1 << 20)
    yield r
    r.close()


def _feed_epochs(ring, epochs: int, rows: int) -> None:
    from ember import _ember
    ep = ring.endpoint
    opts = feeding.feed_options(b"s" * 32, feed_timeout=10.0)
    for e in range(epochs):
        data = [(np.full(3, e * 100 + i, np.float32), i % 10) for i in range(rows)]
        feeding.feed_partition(feeding.rdd_rows_to_batches(data, chunk=7), 0, e, [ep], opts)
        _ember.feed_end_epoch([ep], e, 1, opts)


def test_each_pass_over_the_dataset_is_one_epoch_of_tensors(ring):
    _feed_epochs(ring, epochs=2, rows=10)
    ds = DataFeed(ring.endpoint.ring, node="worker:0", timeout=5).to_torch_dataset(4)
    assert isinstance(ds, torch.utils.data.IterableDataset)
    loader = torch.utils.data.DataLoader(ds, batch_size=None)
    epochs = [list(loader) for _ in range(2)]
    for e, batches in enumerate(epochs):
        assert len(batches) == 2  # 10 rows, batch 4, remainder dropped
        x, y = batches[0]["_0"], batches[0]["_1"]
        assert x.dtype == torch.float32 and tuple(x.shape) == (4, 3)
        assert y.tolist() == [0, 1, 2, 3]
        assert x[:, 0].tolist() == [e * 100.0 + i for i in range(4)]


def test_transform_shapes_what_the_model_gets(ring):
    _feed_epochs(ring, epochs=1, rows=8)
    ds = DataFeed(ring.endpoint.ring, node="worker:0", timeout=5).to_torch_dataset(
        8, transform=lambda c: (torch.from_numpy(c["_0"]).sum(dim=1), torch.from_numpy(c["_1"])))
    model = torch.nn.Linear(1, 1)
    (x, y), = list(ds)
    out = model(x.unsqueeze(1))
    assert out.shape == (8, 1) and y.tolist() == list(range(8))


def test_device_cpu_hands_out_the_same_batches_and_cuda_without_a_gpu_is_named(ring):
    from ember.torch import device_batches

    _feed_epochs(ring, epochs=2, rows=8)
    feed = DataFeed(ring.endpoint.ring, node="worker:0", timeout=5)
    batches = list(feed.to_torch_dataset(4, device="cpu"))
    assert [b["_1"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert all(b["_0"].device.type == "cpu" for b in batches)
    # Nested batches keep their shape; None passes them through untouched.
    pair = (torch.ones(2), [torch.zeros(1), "label"])
    assert list(device_batches([pair], None))[0] is pair
    moved = list(device_batches([pair], "cpu"))[0]
    assert isinstance(moved, tuple) and isinstance(moved[1], list) and moved[1][1] == "label"
    if torch.cuda.is_available():
        pytest.fail("this CPU test found a GPU: the CUDA path is tested by python/tests_gpu")
    with pytest.raises(RuntimeError, match="device cuda asked for, but torch sees no CUDA device"):
        list(device_batches(iter(list(feed.to_torch_dataset(4))), "cuda"))
