"""InputMode.SPARK on real Spark (local[4]: 2 node slots + 2 for feeding tasks).

TFoS parity (x² inference over 1000 rows in 10 partitions, next_batch sizes,
exceptions during and after feeding), order and passthrough columns across
uneven and empty partitions, wrong result counts, a node killed mid-feed, an
unauthenticated feed connection, and the TCP feed path.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

import ember
from conftest import no_leftovers
from ember import errors
from ember._feeder import task as feeding

pytestmark = pytest.mark.timeout(240)


# -- main functions (run on the nodes) ------------------------------------------------


def square_server(args, ctx):
    """TFoS's inference pattern: answer every row until the feed ends."""
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        batch = feed.next_batch(args.get("batch", 7))
        if batch:
            feed.batch_results([x * x for x in batch])


def column_server(args, ctx):
    """DataFrame inference: columns in, two result columns out."""
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        cols = feed.next_batch_columns(5)
        if cols:
            feed.batch_results({"double_x": cols["x"] * 2, "tag": [f"{ctx.job_name}:{ctx.task_index}"] * len(cols["x"])})


def wrong_count_server(args, ctx):
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        batch = feed.next_batch(4)
        if batch:
            feed.batch_results([0] * (len(batch) + args["extra"]))


def record_batches(args, ctx):
    """Training: next_batch sizes and sums (TFoS test_TFNode parity) and epochs."""
    feed = ctx.get_data_feed()
    seen = []
    if args.get("sizes"):
        for n in args["sizes"]:
            batch = feed.next_batch(n)
            seen.append([len(batch), sum(batch)])
        stopped = feed.should_stop()
    else:
        epochs = []
        for _ in range(args["epochs"]):
            epochs.append([int(len(b["_0"])) for b in feed.epoch_batches(args["batch"])])
        seen = epochs
        feed.next_batch(1)  # waits for the end of the feed
        stopped = feed.should_stop()
    Path(args["out"], f"{ctx.task_index}.json").write_text(json.dumps({"seen": seen, "stopped": stopped}))


def count_stream(args, ctx):
    feed = ctx.get_data_feed()
    total = 0
    while not feed.should_stop():
        cols = feed.next_batch_columns(100)
        if cols:
            total += len(cols["v"])
    Path(args["out"], "stream.json").write_text(json.dumps({"rows": total}))


def fail_while_feeding(args, ctx):
    feed = ctx.get_data_feed()
    feed.next_batch(10)
    raise RuntimeError("FAKE exception during feeding")


def fail_after_feeding(args, ctx):
    feed = ctx.get_data_feed()
    while not feed.should_stop():
        feed.next_batch(10)
    time.sleep(1)
    raise RuntimeError("FAKE exception after feeding")


def die_mid_feed(args, ctx):
    feed = ctx.get_data_feed()
    feed.next_batch(10)
    if ctx.task_index == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    while not feed.should_stop():
        feed.next_batch(10)


def train_keras_from_feed(args, ctx):
    """A real Keras model trained from the feed's tf.data.Dataset (one node)."""
    import numpy as np
    import tensorflow as tf

    feed = ctx.get_data_feed()
    ds = feed.to_tf_dataset(batch_size=16, features="x", label="y")
    model = tf.keras.Sequential([tf.keras.Input(shape=(2,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    hist = model.fit(ds, epochs=args["epochs"], verbose=0)
    w = model.layers[0].get_weights()[0].ravel().tolist()
    Path(args["out"], "keras.json").write_text(json.dumps({"loss": hist.history["loss"], "w": w}))


def train_keras_until_early_stop(args, ctx):
    """2 nodes, synchronous Keras on the feed; EarlyStopping (asking for an improvement no epoch
    makes) ends fit after its second epoch on both nodes, and StopFeedCallback ends the node's
    feed."""
    import keras
    import tensorflow as tf

    import ember.keras

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    feed = ctx.get_data_feed()
    model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    model.compile(optimizer=ember.keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    stop = keras.callbacks.EarlyStopping(monitor="loss", min_delta=1e9, patience=0)
    hist = model.fit(feed.to_tf_dataset(batch_size=16, features="x", label="y"), epochs=args["epochs"], verbose=0,
                     callbacks=[ember.keras.SyncCallback(), stop, ember.keras.StopFeedCallback(feed)])
    Path(args["out"], f"stopped-{ctx.training_rank}.json").write_text(json.dumps(hist.history["loss"]))


def train_keras_with_validation(args, ctx):
    """Keras fit with validation_data from the feed; EarlyStopping on val_loss (patience 2, asking
    for an improvement no epoch makes) ends fit after its third epoch."""
    import keras
    import tensorflow as tf

    import ember.keras

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    feed = ctx.get_data_feed()
    val_rows = [0]

    def count(cols):  # also called once on the first row, for the dataset's signature
        val_rows.append(len(cols["y"]))
        return cols["x"], cols["y"]

    model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    model.compile(optimizer=ember.keras.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=1e9, patience=2)
    hist = model.fit(feed.to_tf_dataset(batch_size=16, features="x", label="y"),
                     validation_data=feed.to_tf_dataset(batch_size=8, validation=True, transform=count),
                     epochs=args["epochs"], verbose=0,
                     callbacks=[ember.keras.SyncCallback(), stop, ember.keras.StopFeedCallback(feed)])
    Path(args["out"], f"validated-{ctx.training_rank}.json").write_text(
        json.dumps({"loss": hist.history["loss"], "val_loss": hist.history["val_loss"],
                    "val_rows": sum(val_rows[2:])}))  # [0, the signature's row, the batches...]


def die_mid_inference(args, ctx):
    """Answers one batch, then node 0 is killed (as the OOM killer would)."""
    feed = ctx.get_data_feed(train_mode=False)
    batch = feed.next_batch(5)
    feed.batch_results([x * x for x in batch])
    if ctx.task_index == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    while not feed.should_stop():
        batch = feed.next_batch(5)
        if batch:
            feed.batch_results([x * x for x in batch])


def worker0_crashes_at_once(args, ctx):
    """worker:0 dies before it reads anything (exit code 3); the others serve squares."""
    feed = ctx.get_data_feed(train_mode=False)
    if ctx.task_index == 0:
        os._exit(3)
    while not feed.should_stop():
        batch = feed.next_batch(5)
        if batch:
            feed.batch_results([x * x for x in batch])


def read_one_batch_and_return(args, ctx):
    """A node that stops early (TFoS allows it): one batch, then main_fun returns."""
    ctx.get_data_feed().next_batch(10)


# -- tests --------------------------------------------------------------------------


def _run(spark, fn, args, n=2, **kw):
    return ember.Cluster.run(spark, fn, args, num_executors=n, input_mode=ember.InputMode.SPARK,
                             reservation_timeout=60, **kw)


def test_inference_of_squares_matches_tfos(spark):
    """TFoS test_TFCluster.test_inputmode_spark: Σx² over 1000 rows in 10 partitions."""
    cluster = _run(spark, square_server, {})
    try:
        rdd = spark.sparkContext.parallelize(range(1000), 10)
        out = cluster.inference(rdd).collect()
        assert out == [x * x for x in range(1000)]  # order kept
        assert sum(out) == sum(x * x for x in range(1000))
    finally:
        cluster.shutdown(timeout=60)
    no_leftovers(cluster.job_id)


def test_dataframe_inference_keeps_columns_and_order_across_uneven_and_empty_partitions(spark):
    cluster = _run(spark, column_server, {})
    try:
        rows = [(i, f"r{i}") for i in range(37)]
        df = spark.createDataFrame(rows, "x long, name string")
        # Uneven partitions with empty ones in between.
        df = df.repartitionByRange(9, "x").filter("x % 5 != 0 or x < 10")
        out = cluster.inference(df, output_schema="double_x long, tag string").collect()
        expected = [r for r in rows if r[0] % 5 != 0 or r[0] < 10]
        assert [(r.x, r.name) for r in out] == expected
        assert all(r.double_x == 2 * r.x for r in out)
        assert {r.tag for r in out} <= {"worker:0", "worker:1"}
    finally:
        cluster.shutdown(timeout=60)


@pytest.mark.parametrize("extra,match", [(1, "exactly one result per input row"),
                                         (-1, "answered")])
def test_wrong_result_count_is_a_clear_error(spark, extra, match):
    cluster = _run(spark, wrong_count_server, {"extra": extra})
    try:
        rdd = spark.sparkContext.parallelize(range(40), 4)
        with pytest.raises(Exception, match=match) as info:
            cluster.inference(rdd, feed_timeout=30).collect()
        assert "partition" in str(info.value)
    finally:
        with pytest.raises(ember.NodeError):  # the node raised too
            cluster.shutdown(timeout=60)
    no_leftovers(cluster.job_id)


def test_next_batch_sizes_match_tfos(spark, tmp_path):
    """TFoS: 10 items, next_batch(2/4/10) gives 2/4/4 items (sums 1/14/30), then should_stop."""
    cluster = _run(spark, record_batches, {"sizes": [2, 4, 10], "out": str(tmp_path)}, n=1)
    cluster.train(spark.sparkContext.parallelize(range(10), 1))
    cluster.shutdown(timeout=60)
    got = json.loads((tmp_path / "0.json").read_text())
    assert got == {"seen": [[2, 1], [4, 14], [4, 30]], "stopped": True}


def test_uneven_partitions_give_every_node_the_same_batches_per_epoch(spark, tmp_path):
    cluster = _run(spark, record_batches, {"epochs": 2, "batch": 8, "out": str(tmp_path)})
    sizes = [0, 3, 250, 0, 1, 61]  # 315 rows: 157 per node, 1 dropped
    rdd = spark.sparkContext.parallelize(range(6), 6).flatMap(lambda p: [(float(p),)] * sizes[p])
    cluster.train(rdd, num_epochs=2)
    cluster.shutdown(timeout=60)
    seen = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]
    for s in seen:
        assert s["stopped"]
        assert s["seen"] == [[8] * 19, [8] * 19]  # 157 // 8 full batches, both epochs, both nodes


def test_keras_fit_on_the_feed(spark, tmp_path):
    import numpy as np
    x = np.random.RandomState(0).rand(512, 2).astype(np.float32)
    y = (x @ np.array([2.0, -1.0], np.float32)).astype(np.float32)
    df = spark.createDataFrame([(x[i].tolist(), float(y[i])) for i in range(512)], "x array<float>, y float")
    cluster = _run(spark, train_keras_from_feed, {"epochs": 3, "out": str(tmp_path)}, n=1)
    cluster.train(df.repartition(3), num_epochs=3)
    cluster.shutdown(timeout=120)
    got = json.loads((tmp_path / "keras.json").read_text())
    assert len(got["loss"]) == 3 and got["loss"][-1] < got["loss"][0]


def test_early_stopping_ends_the_feed_at_the_next_epoch(spark, tmp_path, capsys):
    """Keras EarlyStopping on the nodes stops cluster.train() after the epoch in which the nodes
    ended their feed: of 20 epochs asked for, the nodes train 2 and the driver feeds at most one
    more, then returns; nothing hangs and nothing is left."""
    import numpy as np
    x = np.random.RandomState(0).rand(256, 2).astype(np.float32)
    y = (x @ np.array([2.0, -1.0], np.float32)).astype(np.float32)
    df = spark.createDataFrame([(x[i].tolist(), float(y[i])) for i in range(256)], "x array<float>, y float")
    cluster = _run(spark, train_keras_until_early_stop, {"epochs": 20, "out": str(tmp_path)}, n=2)
    start = time.monotonic()
    cluster.train(df.repartition(4), num_epochs=20, feed_timeout=60)
    assert time.monotonic() - start < 50
    cluster.shutdown(timeout=120)
    losses = [json.loads((tmp_path / f"stopped-{r}.json").read_text()) for r in range(2)]
    assert len(losses[0]) == 2 and losses[0] == losses[1]  # both stopped after epoch 1, in step
    printed = capsys.readouterr()
    assert "every node ended its feed (early stopping)" in printed.out + printed.err
    # The driver feeds epoch e+1 only once every node began epoch e: at most one epoch past
    # the nodes' last (epoch 1) is fed, however fast the feed is.
    assert 2 <= cluster._feed.epochs_fed <= 3, cluster._feed.epochs_fed
    no_leftovers(cluster.job_id)


def test_validation_data_reaches_keras_fit_and_early_stopping_on_val_loss(spark, tmp_path, capsys):
    """cluster.train(df, validation_data=val_df): every node validates after each epoch on its
    equal share of val_df, which Keras sees as validation_data (val_loss, averaged over nodes by
    SyncCallback); EarlyStopping on val_loss ends training on both nodes in step."""
    import numpy as np
    rng = np.random.RandomState(0)
    x = rng.rand(256, 2).astype(np.float32)
    y = (x @ np.array([2.0, -1.0], np.float32)).astype(np.float32)
    df = spark.createDataFrame([(x[i].tolist(), float(y[i])) for i in range(256)], "x array<float>, y float")
    # Validation labels are off by 100: a val_loss of about 10^4 proves the rows are val_df's.
    xv = rng.rand(64, 2).astype(np.float32)
    yv = (xv @ np.array([2.0, -1.0], np.float32) + 100.0).astype(np.float32)
    val = spark.createDataFrame([(xv[i].tolist(), float(yv[i])) for i in range(64)], "x array<float>, y float")
    cluster = _run(spark, train_keras_with_validation, {"epochs": 20, "out": str(tmp_path)}, n=2)
    cluster.train(df.repartition(4), num_epochs=20, feed_timeout=60, validation_data=val.repartition(2))
    cluster.shutdown(timeout=120)
    runs = [json.loads((tmp_path / f"validated-{r}.json").read_text()) for r in range(2)]
    assert runs[0]["val_loss"] == runs[1]["val_loss"]  # averaged over the nodes: in step
    assert len(runs[0]["val_loss"]) == 3  # val_loss never improves by 10^9: stops after 3 epochs (patience 2)
    assert all(9000 < v < 11000 for v in runs[0]["val_loss"]), runs[0]["val_loss"]
    assert all(v < 10 for v in runs[0]["loss"]), runs[0]["loss"]
    # Each node validated on its equal half of the 64 rows, in each of the 3 epochs.
    assert [r["val_rows"] for r in runs] == [3 * 32, 3 * 32], [r["val_rows"] for r in runs]
    printed = capsys.readouterr()
    assert "validation rows" in printed.out + printed.err
    assert 3 <= cluster._feed.epochs_fed <= 4, cluster._feed.epochs_fed
    no_leftovers(cluster.job_id)


def test_a_node_that_returns_early_does_not_fail_train(spark):
    """The node ends after one batch; the rest of the feed is skipped quietly, and the end of
    the epoch, sent by the driver to a node that is gone, is skipped too."""
    cluster = _run(spark, read_one_batch_and_return, {}, n=1)

    def slow(i, rows):
        if i > 0:
            time.sleep(3)  # the node has ended before these partitions are fed
        return rows

    start = time.monotonic()
    cluster.train(spark.sparkContext.parallelize(range(4000), 4).mapPartitionsWithIndex(slow), feed_timeout=30)
    assert time.monotonic() - start < 25
    cluster.shutdown(timeout=60)
    no_leftovers(cluster.job_id)


def test_exception_during_feeding_reaches_the_driver(spark):
    cluster = _run(spark, fail_while_feeding, {})
    start = time.monotonic()
    with pytest.raises(ember.NodeError, match="FAKE exception during feeding"):
        cluster.train(spark.sparkContext.parallelize(range(100000), 4), feed_timeout=60)
        cluster.shutdown(timeout=60)
    assert time.monotonic() - start < 45
    no_leftovers(cluster.job_id)


def test_exception_after_feeding_is_raised_by_shutdown(spark):
    cluster = _run(spark, fail_after_feeding, {})
    cluster.train(spark.sparkContext.parallelize(range(1000), 4))
    with pytest.raises(ember.NodeError, match="FAKE exception after feeding"):
        cluster.shutdown(grace_secs=5, timeout=60)
    no_leftovers(cluster.job_id)


def test_node_killed_mid_feed_fails_fast_without_orphans(spark):
    cluster = _run(spark, die_mid_feed, {})
    start = time.monotonic()
    with pytest.raises((ember.NodeError, errors.EmberError)) as info:
        cluster.train(spark.sparkContext.parallelize(range(300000), 4), feed_timeout=30)
        cluster.shutdown(timeout=60)
    assert "worker:0" in str(info.value) or "SIGKILL" in str(info.value)
    assert time.monotonic() - start < 30  # well inside feed_timeout: the ring was aborted
    cluster.shutdown()  # a no-op: train() already tore the failed job down
    no_leftovers(cluster.job_id)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_node_killed_during_inference_is_named_by_collect(spark, monkeypatch, transport):
    """The error raised by the driver's collect() names the node that died (role:index and
    host) within seconds, not the feed ring or another node."""
    monkeypatch.setenv("EMBER_FEED_TRANSPORT", transport)
    cluster = _run(spark, die_mid_inference, {})
    try:
        ep = next(e for e in cluster._feed.endpoints(cluster._gang) if e.name == "worker:0")
        start = time.monotonic()
        with pytest.raises(Exception) as info:
            cluster.inference(spark.sparkContext.parallelize(range(2000), 4), feed_timeout=120).collect()
        text = str(info.value)
        assert "node worker:0" in text and ep.host in text, text[-2000:]
        assert "failed" in text and "SIGKILL" in text, text[-2000:]
        assert time.monotonic() - start < 30  # well inside feed_timeout
    finally:
        with pytest.raises(ember.NodeError, match="worker:0"):
            cluster.shutdown(timeout=60)
    no_leftovers(cluster.job_id)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_inference_after_a_node_died_names_it_and_how(spark, monkeypatch, transport):
    """Regression: a feeding task that starts after its node's ring (or feed server) is gone
    failed with "feed ring ... does not exist (has the node started?)", which named neither
    the failure nor its cause; it now asks the coordinator how the node ended."""
    monkeypatch.setenv("EMBER_FEED_TRANSPORT", transport)
    cluster = _run(spark, worker0_crashes_at_once, {})
    try:
        ep = next(e for e in cluster._feed.endpoints(cluster._gang) if e.name == "worker:0")
        assert cluster._gang.watcher.known_failure(wait=30) is not None  # worker:0 is gone now
        with pytest.raises(Exception) as info:
            # One partition: it goes to worker:0, whose ring and feed server are gone.
            cluster.inference(spark.sparkContext.parallelize(range(100), 1), feed_timeout=60).collect()
        text = str(info.value)
        assert f"node worker:0 ({ep.host})" in text and "exit code 3" in text, text[-2000:]
        assert "does not exist" not in text.split("Traceback")[0], text[-2000:]
    finally:
        with pytest.raises(ember.NodeError, match="worker:0"):
            cluster.shutdown(timeout=60)
    no_leftovers(cluster.job_id)


def test_tcp_feed_path_and_unauthenticated_feed_connection(spark, monkeypatch):
    monkeypatch.setenv("EMBER_FEED_TRANSPORT", "tcp")
    cluster = _run(spark, square_server, {"batch": 50})
    try:
        ep = cluster._feed.endpoints(cluster._gang)[0]
        with socket.create_connection((ep.host, ep.port), timeout=5) as s:  # garbage first
            s.sendall(b"\x00" * 200)
            s.settimeout(5)
            try:
                while s.recv(4096):
                    pass
            except (ConnectionResetError, socket.timeout):
                pass
        with pytest.raises((errors.Unauthenticated, errors.Unavailable)):
            ember._ember.FeedProducer.open([ep], 0, 0, 0, feeding.feed_options(b"x" * 32, transport="tcp"))
        out = cluster.inference(spark.sparkContext.parallelize(range(500), 5)).collect()
        assert out == [x * x for x in range(500)]
    finally:
        cluster.shutdown(timeout=60)
    no_leftovers(cluster.job_id)


def test_too_few_slots_for_feeding_is_a_clear_error(spark):
    cluster = _run(spark, square_server, {}, n=4)
    try:
        with pytest.raises(ember.ClusterError, match="slot"):
            cluster.inference(spark.sparkContext.parallelize(range(10), 2))
    finally:
        cluster.shutdown(timeout=60)


def test_structured_streaming_feeds_a_running_cluster(spark, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for i in range(3):  # three files -> three micro-batches
        spark.createDataFrame([(i * 100 + j,) for j in range(100)], "v long").coalesce(1) \
            .write.mode("overwrite").parquet(str(src / f"part{i}"))
    stream = (spark.readStream.schema("v long").option("maxFilesPerTrigger", 1)
              .parquet(str(src / "part*")))
    cluster = _run(spark, count_stream, {"out": str(tmp_path)}, n=1)
    query = cluster.train_stream(stream, checkpoint_location=str(tmp_path / "ckpt"),
                                 trigger={"availableNow": True})
    assert query.awaitTermination(120)
    assert query.exception() is None
    cluster.shutdown(timeout=60)
    assert json.loads((tmp_path / "stream.json").read_text()) == {"rows": 300}
