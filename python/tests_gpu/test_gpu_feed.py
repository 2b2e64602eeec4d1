"""InputMode.SPARK's feed into the GPU (issue 20, point 4): while a device pass runs, the memory
Spark's tasks write the rows into is page-locked, so a batch goes to the GPU in one straight
copy.  Needs a GPU (see conftest.py); the DataFeed test needs pyarrow too."""
from __future__ import annotations

import secrets
import warnings

import numpy as np
import pytest

SECRET = b"s" * 32


def _host(ring_bytes: int = 8 << 20):
    from ember import _ember

    return _ember.FeedHost.start(f"ember-gpu-test-{secrets.token_hex(6)}", 0, "worker:0", "127.0.0.1",
                                 "127.0.0.1", SECRET, ring_bytes=ring_bytes)


def _producer(host, partition: int):
    from ember import _ember

    options = _ember.FeedOptions()
    options.secret = SECRET
    options.idle_timeout = 20.0
    return _ember.FeedProducer.open([host.endpoint], partition, 0, 0, options)


def _tensor(view):
    import torch

    with warnings.catch_warnings():  # read-only on purpose: the feed's memory
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(view)


def test_rows_in_the_page_locked_feed_copy_straight_to_the_gpu(device, needs_gpu):
    import torch
    from ember import _ember

    host = _host()
    try:
        consumer = _ember.FeedConsumer.open(host.endpoint.ring, _ember.ConsumerOptions())
        assert "CUDA runtime" in consumer.page_lock_rows()
        rng = np.random.default_rng(7)
        payloads = [rng.integers(0, 255, size=(1 << 20) + 3 * i, dtype=np.uint8) for i in range(12)]
        producer = _producer(host, 0)
        for i, p in enumerate(payloads[:6]):
            producer.send_batch(0, p, 1)
        producer.end_partition()
        stream = torch.cuda.Stream()
        for want in payloads[:6]:
            [r] = consumer.next(1, False)
            t = _tensor(r.ipc())
            assert t.is_pinned(), "a row handed out while page-locked is pageable"
            with torch.cuda.stream(stream):
                g = t.to(device, non_blocking=True)
            stream.synchronize()  # the promise: copies finish before the next read
            del r, t
            assert torch.equal(g.cpu(), torch.from_numpy(want))
        consumer.unlock_rows()
        producer = _producer(host, 1)
        for p in payloads[6:]:  # over a lap of the 8 MiB ring: the view's pages come round again
            producer.send_batch(0, p, 1)
        for want in payloads[6:]:
            [r] = consumer.next(1, False)
            t = _tensor(r.ipc())
            assert not t.is_pinned(), "unlock_rows() left the feed's memory page-locked"
            assert torch.equal(t.to(device).cpu(), torch.from_numpy(want))
        producer.end_partition()
        consumer.close()
    finally:
        host.close()


def test_leases_revoked_while_page_locked_keep_their_bytes(device, needs_gpu):
    """Rows kept past half the ring make the next read revoke their leases (their pages become
    private copies); the page-locked view is given back first, and what is read after it is
    right, on the host and on the GPU."""
    import torch
    from ember import _ember

    host = _host(4 << 20)
    try:
        consumer = _ember.FeedConsumer.open(host.endpoint.ring, _ember.ConsumerOptions())
        consumer.page_lock_rows()
        rng = np.random.default_rng(3)
        payloads = [rng.integers(0, 255, size=900 << 10, dtype=np.uint8) for _ in range(10)]
        producer = _producer(host, 0)
        kept = []
        for i, want in enumerate(payloads):
            producer.send_batch(0, want, 1)
            [r] = consumer.next(1, False)
            t = _tensor(r.ipc())
            g = t.to(device, non_blocking=True)
            torch.cuda.synchronize()
            assert torch.equal(g.cpu(), torch.from_numpy(want)), f"batch {i}"
            kept.append((r, t))  # held: past half of 4 MiB the next read revokes them
        producer.end_partition()
        for i, ((r, t), want) in enumerate(zip(kept, payloads)):
            assert torch.equal(t, torch.from_numpy(want)), f"kept batch {i} changed"
            assert torch.equal(t.to(device).cpu(), torch.from_numpy(want)), f"kept batch {i} on the GPU"
        consumer.unlock_rows()
        consumer.close()
    finally:
        host.close()


def test_a_datafeed_device_pass_lands_every_batch_on_the_gpu(device, needs_gpu):
    """The user's path: DataFeed.to_torch_dataset(device="cuda") over fed Arrow batches (an image
    column of fixed-size lists, a label), every row once and in order, equal to the host's."""
    pa = pytest.importorskip("pyarrow", reason="DataFeed reads Arrow batches")
    import torch
    from ember import _ember
    from ember._feeder import task as feeding
    from ember.feed import DataFeed

    host = _host(32 << 20)
    try:
        rows, width, batch = 512, 3 * 32 * 32, 64
        images = np.random.default_rng(5).integers(0, 255, size=(rows, width), dtype=np.uint8)
        labels = np.arange(rows, dtype=np.int64)
        col = pa.FixedSizeListArray.from_arrays(pa.array(images.reshape(-1)), width)
        record = pa.RecordBatch.from_arrays([col, pa.array(labels)], names=["image", "label"])
        options = feeding.feed_options(SECRET, feed_timeout=20.0)
        feeding.feed_partition(iter([record.slice(0, 300), record.slice(300)]), partition=0, epoch=0,
                               endpoints=[host.endpoint], options=options)
        assert _ember.feed_end_epoch([host.endpoint], 0, 1, options) == [""]
        assert _ember.feed_end_feed([host.endpoint], options) == [""]
        feed = DataFeed(host.endpoint.ring)
        got = list(feed.to_torch_dataset(batch, device=device))
        assert len(got) == rows // batch
        for i, b in enumerate(got):
            assert b["image"].device.type == "cuda" and b["label"].device.type == "cuda"
            sl = slice(i * batch, (i + 1) * batch)
            assert torch.equal(b["label"].cpu(), torch.from_numpy(labels[sl]))
            assert torch.equal(b["image"].cpu().reshape(batch, width), torch.from_numpy(images[sl]))
    finally:
        host.close()
