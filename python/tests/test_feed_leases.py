"""The node reads fed batches in place from its ring (ring leases, include/ember/feed.h
RowRange): numpy columns point into shared memory.  A node that keeps what it got must
neither stall its feeders nor see its arrays change when the ring reuses the bytes."""
import threading

import numpy as np
import pytest

from ember._feeder import task as feeding
from ember.feed import DataFeed

from test_feed_unit import _Node, _end_epoch, _endpoint, _options, _tell


@pytest.fixture
def small_ring():
    r = _Node(ring_bytes=64 << 10)
    yield r
    r.close()


def _row(i):
    return (bytes([(i * 7 + k) % 251 for k in range(1000)]), i)


def _feed_one_epoch(ring, n):
    """Feeds rows 0..n-1 (30-row messages) as one epoch, then ends the feed, on a thread: the
    thread and the list its error goes to."""
    errors = []

    def produce():
        try:
            feeding.feed_partition(feeding.rdd_rows_to_batches([_row(i) for i in range(n)], chunk=30), partition=0,
                                   epoch=0, endpoints=[_endpoint(ring)], options=_options())
            _end_epoch([ring], 0, 1)
            _tell([ring], "end_feed")
        except Exception as e:  # reported by the test thread
            errors.append(e)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    return t, errors


def test_a_node_keeping_every_batch_of_an_epoch_bigger_than_its_ring_finishes(small_ring):
    n = 3000  # ~3 MB of rows through a 64 KiB ring
    t, errors = _feed_one_epoch(small_ring, n)
    feed = DataFeed(small_ring, node="worker:0", timeout=20)
    kept = list(feed.epoch_batches(10))  # every batch stays alive: slices of the messages read in place
    t.join(timeout=30)
    assert not t.is_alive() and not errors, errors
    assert len(kept) == n // 10
    labels = np.concatenate([b["_1"] for b in kept])
    assert labels.tolist() == list(range(n))
    images = np.concatenate([b["_0"] for b in kept])
    want = np.array([np.frombuffer(_row(i)[0], dtype=np.uint8) for i in range(n)])
    assert images.shape == want.shape and np.array_equal(images, want)
    # The kept batches are views of the received bytes (read-only), not copies.
    assert all(not b["_0"].flags.writeable and not b["_0"].flags.owndata for b in kept)


def test_epoch_batches_keep_no_message_handed_out_whole(small_ring):
    """Training's reads let a message go once its rows are handed out, as inference's do: a kept
    decoded message pins its ring bytes.  30-row messages cut into batches of 7 span messages."""
    n = 600
    t, errors = _feed_one_epoch(small_ring, n)
    feed = DataFeed(small_ring, node="worker:0", timeout=20)
    labels, kept = [], []
    for b in feed.epoch_batches(7, drop_remainder=False):
        labels.extend(b["_1"].tolist())
        kept.append(len(feed._decoded) + len(feed._message_columns))
    t.join(timeout=30)
    assert not t.is_alive() and not errors, errors
    assert labels == list(range(n))
    # At most the message being cut (decoded, and its columns) and, while a batch joined across
    # two messages is handed out, the one before it; nothing at the end.  (8 before: the last 4
    # messages, decoded and as columns.)
    assert max(kept) <= 3, kept
    assert len(feed._decoded) + len(feed._message_columns) == 0
