"""The data feed without Spark: row conversion, the row plan, and a real shared-memory
ring between a feeding thread and a DataFeed (the node's end).  The protocol itself is
the C++ core's (src/feed, with its own gtests: codec, epoch bound, producer/consumer);
these tests run it through the Python layer."""
import secrets
import threading

import numpy as np
import pyarrow as pa
import pytest

from ember import _arrow_rows as rows_mod
from ember import _ember
from ember._feeder import task as feeding
from ember import errors
from ember.feed import DataFeed


# ------------------------------------------------------------------ row conversion
@pytest.mark.parametrize("rows", [
    [1, 2, 3],
    [(1, "a"), (2, "b")],
    [[1.5, 2], [3.5, 4]],
    [{"x": 1, "y": b"ab"}, {"x": 2, "y": b"cd"}],
])
def test_rows_round_trip_keeps_their_form(rows):
    assert rows_mod.batch_to_rows(rows_mod.rows_to_batch(rows)) == rows


def test_numpy_rows_round_trip_as_arrays():
    rows = [(np.arange(6, dtype=np.float32).reshape(2, 3) + i, i) for i in range(4)]
    back = rows_mod.batch_to_rows(rows_mod.rows_to_batch(rows))
    for (a, i), (b, j) in zip(rows, back):
        assert i == j and b.shape == (2, 3) and np.array_equal(a, b)
    cols = rows_mod.batch_to_columns(rows_mod.rows_to_batch(rows))
    assert cols["_0"].shape == (4, 2, 3) and cols["_0"].dtype == np.float32


def test_uneven_rows_are_rejected_with_the_row_named():
    with pytest.raises(ValueError, match="row 1 has 1 fields"):
        rows_mod.rows_to_batch([(1, 2), (3,)])


def test_equal_length_binary_column_is_a_zero_copy_matrix():
    col = pa.array([bytes([i] * 5) for i in range(6)]).slice(2, 3)
    arr = rows_mod.column_to_numpy(col)
    assert arr.shape == (3, 5) and arr[0, 0] == 2 and arr[2, 4] == 4


def test_spark_style_list_column_becomes_2d():
    col = pa.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], type=pa.list_(pa.float32())).slice(1)
    assert rows_mod.column_to_numpy(col).tolist() == [[3.0, 4.0], [5.0, 6.0]]


# ------------------------------------------------------------------ row split
@pytest.mark.parametrize("num_nodes", [1, 2, 3, 4])
def test_split_rows_keeps_every_node_within_one_row(num_nodes):
    rng = np.random.default_rng(num_nodes)
    for partition in range(20):
        sent = [0] * num_nodes
        for rows in rng.integers(0, 50, size=12):
            split = feeding.split_rows(int(rows), sent, partition % num_nodes)
            assert min(split) >= 0 and sum(split) == rows
            sent = [s + n for s, n in zip(sent, split)]
            assert max(sent) - min(sent) <= 1


def test_split_rows_spreads_the_odd_rows_over_the_nodes():
    # One odd row per partition: partition p gives it to node p % n, so totals stay even.
    totals = [0, 0, 0]
    for p in range(9):
        for k, n in enumerate(feeding.split_rows(7, [0, 0, 0], p % 3)):
            totals[k] += n
    assert totals == [21, 21, 21]
    assert feeding.split_rows(1, [1, 0, 0], 0) == [0, 1, 0]  # node 0 is ahead: the row goes on


# ------------------------------------------------------------------ ring + DataFeed
class _Node:
    """A node's feed as its launcher holds it (ember/feed.h FeedHost): its ring, which a
    DataFeed reads by ``name``, and the TCP feed server on it, through which the driver tells
    it END_EPOCH / END_FEED."""

    def __init__(self, k: int = 0, ring_bytes: int = 1 << 20):
        self.host = _ember.FeedHost.start(f"ember-test-{secrets.token_hex(6)}", k, f"worker:{k}", "127.0.0.1",
                                          "127.0.0.1", b"s" * 32, ring_bytes=ring_bytes)
        self.endpoint = self.host.endpoint
        self.name = self.endpoint.ring
        self.capacity = self.endpoint.ring_capacity

    def close(self):
        self.host.close()


@pytest.fixture
def two_nodes():
    """Two nodes' feeds and their endpoints."""
    rings = [_Node(k) for k in range(2)]
    yield rings, [r.endpoint for r in rings]
    for r in rings:
        r.close()

@pytest.fixture
def ring():
    r = _Node()
    yield r
    r.close()


def _endpoint(ring):
    return ring.endpoint


def _options(**kw):
    return feeding.feed_options(b"s" * 32, feed_timeout=10.0, **kw)


def _tell(rings, what, *args):
    """What the driver sends each node after a feeding job (END_EPOCH) or at shutdown (END_FEED)."""
    eps = [r.endpoint for r in rings]
    if what == "end_epoch":
        assert _ember.feed_end_epoch(eps, *args, _options()) == [""] * len(rings)  # "" for each node told
    else:
        assert _ember.feed_end_feed(eps, _options()) == [""] * len(rings)


def _end_epoch(rings, epoch, num_partitions):
    _tell(rings, "end_epoch", epoch, num_partitions)


def _feed_rdd_rows(ring, rows, epoch=0, end_feed=True):
    feeding.feed_partition(feeding.rdd_rows_to_batches(rows, chunk=3), partition=0, epoch=epoch,
                           endpoints=[_endpoint(ring)], options=_options())
    _end_epoch([ring], epoch, 1)
    if end_feed:
        _tell([ring], "end_feed")


def test_next_batch_matches_tfos(ring):
    """TFoS parity: 10 items, next_batch(2/4/10) gives 2/4/4 items (sums 1/14/30), then should_stop."""
    t = threading.Thread(target=_feed_rdd_rows, args=(ring, list(range(10))))
    t.start()
    feed = DataFeed(ring, node="worker:0", timeout=10)
    sizes, sums = [], []
    for n in (2, 4, 10):
        batch = feed.next_batch(n)
        sizes.append(len(batch))
        sums.append(sum(batch))
    t.join()
    assert sizes == [2, 4, 4] and sums == [1, 14, 30]
    assert feed.should_stop()


def test_terminate_from_another_thread_ends_a_read_waiting_for_data(ring):
    """ember.keras.StopFeedCallback terminates on Keras's thread while tf.data's generator
    thread may wait on the empty feed: the read ends as the end of the feed (its timeout is
    60 s, so a read terminate() did not end fails the test), and so does every later one."""
    feed = DataFeed(ring, node="worker:0", timeout=60)
    got, entered = [], threading.Event()

    def reader():
        entered.set()
        got.append(list(feed.epoch_batches(4)))

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    assert entered.wait(60)
    feed.terminate()
    t.join(60)
    assert not t.is_alive() and got == [[]]
    assert feed.should_stop() and feed.next_batch(3) == [] and list(feed.epoch_batches(4)) == []


def test_epoch_batches_yield_equal_full_batches_and_drop_the_remainder(ring):
    def produce():
        for epoch in range(2):
            _feed_rdd_rows(ring, [(float(i), i % 3) for i in range(10)], epoch=epoch, end_feed=(epoch == 1))
    t = threading.Thread(target=produce)
    t.start()
    feed = DataFeed(ring, node="worker:0", timeout=10)
    epochs = [[b["_0"].tolist() for b in feed.epoch_batches(4)] for _ in range(2)]
    t.join()
    assert epochs[0] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
    assert epochs[1] == epochs[0]
    assert list(feed.epoch_batches(4)) == []


def test_epoch_batches_without_drop_remainder_end_at_the_epoch(ring):
    _feed_rdd_rows(ring, [(float(i),) for i in range(10)], epoch=0, end_feed=False)
    feed = DataFeed(ring, node="worker:0", timeout=3)
    assert [len(b["_0"]) for b in feed.epoch_batches(4, drop_remainder=False)] == [4, 4, 2]


def test_a_consumer_that_stops_after_the_planned_steps_gets_the_next_epoch(ring):
    """A tf.function loop pulls exactly `steps` batches and never exhausts the generator."""
    for epoch in range(2):
        _feed_rdd_rows(ring, [(float(epoch * 100 + i),) for i in range(10)], epoch=epoch, end_feed=(epoch == 1))
    feed = DataFeed(ring, node="worker:0", timeout=3)
    first = []
    for e in range(2):
        it = feed.epoch_batches(4)
        first.append([next(it)["_0"][0] for _ in range(2)][0])  # 2 steps, then stop pulling
    assert first == [0.0, 100.0]
    assert feed.next_batch(5) == [] and feed.should_stop()


def test_every_node_yields_the_same_batches_from_uneven_partitions(two_nodes):
    """Two nodes fed 7 uneven partitions (one empty, one of 1 row) in one epoch: both yield
    min(node totals) // batch batches, of disjoint rows, while the feed is still arriving."""
    rings, eps = two_nodes
    counts = [0, 17, 1000, 3, 0, 250, 1]
    sent = []

    def produce():
        start = 0
        for p, n in enumerate(counts):
            rows = [(float(start + i),) for i in range(n)]
            sent.append(feeding.feed_partition(feeding.rdd_rows_to_batches(rows, chunk=7), p, 0, eps, _options())[0])
            start += n
        _end_epoch(rings, 0, len(counts))
        _tell(rings, "end_feed")

    got = [[], []]

    def consume(k):
        feed = DataFeed(rings[k], node=f"worker:{k}", timeout=10)
        got[k] = [b["_0"].tolist() for b in feed.epoch_batches(8)]

    threads = [threading.Thread(target=produce)] + [threading.Thread(target=consume, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    totals = [sum(s[k] for s in sent) for k in range(2)]
    assert sum(totals) == sum(counts) and max(totals) - min(totals) <= 1
    assert [len(g) for g in got] == [min(totals) // 8] * 2
    values = [v for g in got for b in g for v in b]
    assert all(len(b) == 8 for g in got for b in g)
    assert len(set(values)) == len(values)  # no row went to both nodes


def test_an_epoch_ends_only_when_the_driver_says_how_many_partitions_it_had(two_nodes):
    """The tasks' markers alone never end an epoch (AQE may run fewer or more partitions than
    planned): a node waits for END_EPOCH, and stops at the count it gives."""
    rings, eps = two_nodes
    feeding.feed_partition(feeding.rdd_rows_to_batches([(float(i),) for i in range(12)]), 0, 0, eps, _options())
    feed = DataFeed(rings[0], node="worker:0", timeout=1.5)
    it = feed.epoch_batches(4)
    assert len(next(it)["_0"]) == 4   # 5 of its 6 rows are provably usable before the epoch ends
    with pytest.raises(errors.DeadlineExceeded, match="worker:0"):
        next(it)                      # the last batch needs the epoch's end
    _end_epoch(rings, 0, 1)
    feed = DataFeed(rings[1], node="worker:1", timeout=5)
    assert [len(b["_0"]) for b in feed.epoch_batches(4, drop_remainder=False)] == [4, 2]


def test_a_node_that_gets_no_rows_of_a_tiny_epoch_still_steps_through_it(two_nodes):
    """1 row in epoch 0 (a streaming micro-batch, say) reaches only one of 2 nodes; both
    must see epoch 0 as empty and meet again in epoch 1."""
    rings, eps = two_nodes
    feeding.feed_partition(iter([rows_mod.rows_to_batch([(1.0,)])]), 0, 0, eps, _options())
    _end_epoch(rings, 0, 1)
    feeding.feed_partition(feeding.rdd_rows_to_batches([(float(i),) for i in range(10)]), 0, 1, eps, _options())
    _end_epoch(rings, 1, 1)
    _tell(rings, "end_feed")
    for k, r in enumerate(rings):
        feed = DataFeed(r, node=f"worker:{k}", timeout=5)
        assert [len(list(feed.epoch_batches(2))) for _ in range(3)] == [0, 2, 0], f"worker:{k}"


def test_a_node_that_ended_is_skipped_and_reported_gone(two_nodes):
    """Node 1's ring is gone and nothing listens on its port (it returned from main_fun):
    training feeds node 0 its share and reports node 1 gone, for the driver to check."""
    import socket
    rings, eps = two_nodes
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    ended = feeding.NodeEndpoint(1, "worker:1", "/ember-test-gone-" + secrets.token_hex(4), "127.0.0.1", closed_port)
    rows = [(float(i),) for i in range(10)]
    sent, gone, _ = feeding.feed_partition(feeding.rdd_rows_to_batches(rows), 0, 0, [eps[0], ended], _options())
    assert sent == [5, 5] and gone == [False, True]
    # Inference needs its node's answers: there, a node that cannot be reached is an error.
    with pytest.raises(errors.Unavailable, match="cannot reach"):
        list(feeding.infer_partition(feeding.rdd_rows_to_batches(rows), 0, ended, _options()))


def test_a_retried_feeding_task_does_not_unbalance_the_nodes(two_nodes):
    """Attempt 0 of partition 0 dies after writing only to node 0; Spark's attempt 1 sends the
    whole partition again.  Both nodes still yield the same batches, and node 0 trains on the
    failed attempt's rows too (at least once)."""
    rings, eps = two_nodes
    failed = rows_mod.rows_to_batch([(float(i),) for i in range(40)])
    # Attempt 0 reaches only node 0 before it dies (its producer never ends the partition).
    producer = _ember.FeedProducer.open([eps[0]], 0, 0, 0, _options())
    producer.send_batch_in_place(0, feeding._framed(failed), 40)
    producer.close()
    rows = [(float(i),) for i in range(100)]
    feeding.feed_partition(feeding.rdd_rows_to_batches(rows, chunk=10), 0, 0, eps, _options(), attempt=1)
    _end_epoch(rings, 0, 1)
    _tell(rings, "end_feed")
    feeds = [DataFeed(r, node=f"worker:{k}", timeout=5) for k, r in enumerate(rings)]
    got = [[b["_0"].tolist() for b in f.epoch_batches(8)] for f in feeds]
    assert [len(g) for g in got] == [50 // 8] * 2
    assert got[0][0] == [float(i) for i in range(8)]  # the failed attempt's rows come first


def test_read_deadline_names_the_node(ring):
    feed = DataFeed(ring, node="worker:3", timeout=1.0)
    with pytest.raises(errors.DeadlineExceeded, match="worker:3"):
        feed.next_batch(1)


def _run_inference(ring, rows, fn, chunk=3):
    """Runs a node loop (TFoS style) on a thread and feeds it one partition."""
    feed = DataFeed(ring, node="worker:0", train_mode=False, timeout=10)
    errors_seen = []

    def node():
        try:
            while not feed.should_stop():
                batch = feed.next_batch(4)
                if batch:
                    feed.batch_results(fn(batch))
        except Exception as e:  # noqa: BLE001 - recorded for the assertion
            errors_seen.append(e)

    t = threading.Thread(target=node, daemon=True)
    t.start()
    try:
        pairs = list(feeding.infer_partition(feeding.rdd_rows_to_batches(rows, chunk=chunk), 0,
                                             _endpoint(ring), _options()))
    finally:
        _tell([ring], "end_feed")
        t.join(timeout=15)
        assert not t.is_alive()
    return pairs, errors_seen


def test_inference_round_trip_keeps_order(ring):
    pairs, node_errors = _run_inference(ring, list(range(10)), lambda rows: [x * x for x in rows])
    assert not node_errors
    inputs = [x for inp, _ in pairs for x in inp.column(0).to_pylist()]
    outputs = [x for _, res in pairs for x in res.column(0).to_pylist()]
    assert inputs == list(range(10)) and outputs == [x * x for x in range(10)]


def test_inference_too_many_results_is_a_clear_error(ring):
    with pytest.raises(ValueError, match=r"worker:0.*partition 0.*one result per input row"):
        _run_inference(ring, list(range(6)), lambda rows: [0] * (len(rows) + 1))


def test_inference_too_few_results_is_a_clear_error(ring):
    with pytest.raises(ValueError, match=r"worker:0.*partition 0"):
        _run_inference(ring, list(range(8)), lambda rows: [0] * (len(rows) - 1))


def test_a_node_keeps_no_message_it_has_handed_out_whole(ring):
    """A decoded message pins its bytes in the ring; kept past half the ring, the core copies
    them out.  Once a message's last row is handed out, the DataFeed lets it go."""
    feed = DataFeed(ring, node="worker:0", train_mode=False, timeout=10)
    kept, got = [], []

    def node():
        while not feed.should_stop():
            cols = feed.next_batch_columns(4)
            if cols:
                kept.append(len(feed._decoded) + len(feed._message_columns))
                got.extend(cols["_0"].tolist())
                feed.batch_results(cols["_0"] * 2)

    t = threading.Thread(target=node, daemon=True)
    t.start()
    try:
        pairs = list(feeding.infer_partition(feeding.rdd_rows_to_batches(list(range(40)), chunk=5), 0,
                                             _endpoint(ring), _options()))
    finally:
        _tell([ring], "end_feed")
        t.join(timeout=15)
        assert not t.is_alive()
    assert got == list(range(40)) and [x for _, res in pairs for x in res.column(0).to_pylist()] == \
        [2 * x for x in range(40)]
    # 5-row messages read 4 rows at a time: at most the message begun and not finished is kept.
    assert max(kept) <= 2 and kept[-1] == 0, kept


def test_feed_timeout_reaches_the_node_side(ring):
    """The node's feed server was started with a 10-minute idle timeout; the producer's
    feed_timeout (0.5 s) travels in its connection's hello and is what the server applies."""
    ep = ring.endpoint  # its feed server's own idle timeout is the core's default, 10 minutes
    producer = _ember.FeedProducer.open([ep], 0, 0, 0, feeding.feed_options(b"s" * 32, feed_timeout=0.5,
                                                                            transport="tcp"))
    big = bytearray(_ember.BATCH_HEADER_BYTES + producer.max_batch_bytes(0))
    for _ in range(3):  # two fill the ring (nobody reads), the third blocks the server
        producer.send_batch_in_place(0, big, 1)
    import time
    time.sleep(2.0)
    with pytest.raises(errors.Aborted, match="DeadlineExceeded.*worker:0|worker:0.*DeadlineExceeded"):
        producer.send_batch_in_place(0, big, 1)
    producer.close()


def test_node_endpoint_round_trips_through_its_binary_form():
    ep = feeding.NodeEndpoint(3, "worker:1", "/job-3", "10.0.0.5", 40123, 1 << 20)
    back = feeding.NodeEndpoint.decode(ep.encode())
    assert back == ep and back.describe() == "worker:1 (10.0.0.5)"
    with pytest.raises(errors.Corruption, match="feed endpoint"):
        feeding.NodeEndpoint.decode(ep.encode()[:-1])


def test_tf_dataset_prefetched_to_a_device_yields_the_same_batches(ring):
    """feed_dataset(..., device=...) ends in tf.data's prefetch_to_device; on this CPU machine
    the device is the CPU, and the batches must be exactly the undevice'd ones."""
    rows = [(np.full(2, i, np.float32), i) for i in range(12)]
    _feed_rdd_rows(ring, rows, end_feed=False)
    feed = DataFeed(ring.endpoint.ring, node="worker:0", timeout=5)
    ds = feed.to_tf_dataset(batch_size=4, features="_0", label="_1", device="/cpu:0")
    got = [(x.numpy(), y.numpy()) for x, y in ds]
    assert [y.tolist() for _, y in got] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert got[2][0][:, 0].tolist() == [8.0, 9.0, 10.0, 11.0]
    assert ds.element_spec[0].shape.as_list() == [None, 2]
