"""Ember from a Spark Connect client (issue 22): a real Spark Connect server (pyspark's own
distribution, tests/connect_server.py) on local[4], and clients in processes of their own that
reach it with ``SparkSession.builder.remote("sc://...")``: no SparkContext, no RDD, no JVM in
the client.

The same verbs as with a classic session: ``Cluster.run`` (InputMode.TENSORFLOW, the nodes'
collectives), InputMode.SPARK's ``train`` and ordered ``inference`` with passthrough columns, a
failing node named by the client, the executors' Python check, ``run_parallel``; nothing left
behind.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ember

from conftest import no_leftovers
from connect_server import ConnectServer, run_client

pytestmark = pytest.mark.timeout(600)
TORCH_SITE = Path(__file__).resolve().parents[2] / ".torch-site"

PRELUDE = r'''
import json, sys
from pyspark.sql import SparkSession
import ember

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
from pyspark import SparkContext
assert SparkContext._active_spark_context is None  # nothing classic in this process
def say(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
'''

TENSORFLOW_MODE = PRELUDE + r'''
def main_fun(args, ctx):
    import numpy as np
    total = ctx.allreduce(np.full(3, ctx.task_index + 1, np.float32), op="sum")
    ctx._coordinator_client().kv_set(f"test/sum/{ctx.task_index}", json.dumps(total.tolist()).encode())
    print(f"node says sum={total.tolist()}", flush=True)

cluster = ember.Cluster.run(spark, main_fun, {}, num_executors=2, input_mode=ember.InputMode.TENSORFLOW,
                            reservation_timeout=120)
kv = cluster._gang.server
cluster.shutdown(timeout=120)
say(job_id=cluster.job_id, sums=[json.loads(kv.kv_get(f"test/sum/{i}")) for i in range(2)],
    spec=cluster.cluster_spec)
'''

SPARK_MODE = PRELUDE + r'''
def main_fun(args, ctx):
    import numpy as np
    feed = ctx.get_data_feed(train_mode=True)
    seen = []
    for _ in range(2):
        seen.append(int(sum(len(b["x"]) for b in feed.epoch_batches(20))))
    ctx._coordinator_client().kv_set(f"test/seen/{ctx.task_index}", json.dumps(seen).encode())
    feed = ctx.get_data_feed(train_mode=False)
    while not feed.should_stop():
        cols = feed.next_batch_columns(7)
        if cols:
            feed.batch_results({"double_x": np.asarray(cols["x"]) * 2,
                                "tag": [f"{ctx.job_name}:{ctx.task_index}"] * len(cols["x"])})

cluster = ember.Cluster.run(spark, main_fun, {}, num_executors=2, input_mode=ember.InputMode.SPARK,
                            reservation_timeout=120)
train = spark.range(0, 200, 1, 5).selectExpr("id", "cast(id as double) as x")
import tempfile
path = tempfile.mkdtemp(prefix="ember-connect-") + "/train"
train.write.parquet(path)
cluster.train(spark.read.parquet(path), num_epochs=1)  # a plain Parquet scan: the nodes read its files
cluster.train(train, num_epochs=1)  # its rows, fed through Spark
test = spark.range(0, 37, 1, 1).selectExpr("id as x", "concat('r', cast(id as string)) as name")
test = test.repartitionByRange(9, "x").filter("x % 5 != 0 or x < 10")
out = cluster.inference(test, output_schema="double_x long, tag string").collect()
kv = cluster._gang.server
seen = [json.loads(kv.kv_get(f"test/seen/{i}")) for i in range(2)]
cluster.shutdown(timeout=120)
say(job_id=cluster.job_id, seen=seen, rows=[[r.x, r.name, r.double_x, r.tag] for r in out])
'''

FAILING_NODE = PRELUDE + r'''
def main_fun(args, ctx):
    if ctx.task_index == 1:
        raise ValueError("worker one gives up under Connect")
    import time
    time.sleep(600)

cluster = ember.Cluster.run(spark, main_fun, {}, num_executors=2, reservation_timeout=120)
try:
    cluster.shutdown(timeout=120)
except Exception as e:
    say(job_id=cluster.job_id, error=type(e).__name__, text=str(e))
else:
    say(job_id=cluster.job_id, error=None)
'''

PARALLEL_RUNS = PRELUDE + r'''
def fn(args, ctx):
    return {"run": ctx.run_index, "of": ctx.num_runs, "square": (ctx.run_index + args) ** 2}

values = ember.run_parallel(spark, fn, 1, num_executors=3, timeout=240)
say(values=values)
'''

INTERRUPTED = PRELUDE + r'''
def main_fun(args, ctx):
    import time
    time.sleep(600)

cluster = ember.Cluster.run(spark, main_fun, {}, num_executors=2, reservation_timeout=120)
print("STARTED " + cluster.job_id, flush=True)
cluster.shutdown(timeout=600)
'''

ML_PIPELINE = PRELUDE + r'''
import numpy as np
from pyspark.ml import Pipeline
from pyspark.ml.feature import VectorAssembler
from ember.ml import KerasEstimator, KerasModel

def linear_model():
    import keras
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.2), loss="mse")
    return model

rng = np.random.default_rng(3)
x = rng.uniform(-1, 1, size=(600, 2))
rows = [(i, float(a), float(b), float(3.14 * a + 1.618 * b)) for i, (a, b) in enumerate(x)]
df = spark.createDataFrame(rows, "id long, x1 double, x2 double, y double").repartition(3)
est = KerasEstimator(model=linear_model, labelCol="y", epochs=8, batchSize=32, numWorkers=2, seed=1)
fitted = Pipeline(stages=[VectorAssembler(inputCols=["x1", "x2"], outputCol="features"), est]).fit(df)
out = fitted.transform(df).orderBy("id").collect()
stage = fitted.stages[-1]
stage.write().save(sys.argv[2])
loaded = KerasModel.load(sys.argv[2])
features = fitted.stages[0].transform(df)
again = loaded.transform(features).orderBy("id").collect()
say(kernel=stage.keras_model().layers[0].get_weights()[0].ravel().tolist(),
    errors=[abs(r["prediction"] - r["y"]) for r in out], columns=fitted.transform(df).columns,
    same=[r["prediction"] for r in out] == [r["prediction"] for r in again], job_id=stage.training_summary["job_id"],
    packed="ember_pack_floats" in fitted.transform(df)._explain_string(extended=True))
'''

TORCH_MODEL = PRELUDE + r'''
import numpy as np
sys.path.append(sys.argv[3])  # .torch-site, after the venv
import torch
from ember.ml import TorchModel

torch.manual_seed(5)
net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
tm = TorchModel.from_torch(net, input_shape=[3], inputCol="f", outputCol="p", predictBatchSize=7)
df = spark.range(0, 60, 1, 3).selectExpr("id", "array(cast(id as float) / 10, 1.0f, -0.5f) AS f")
out = tm.transform(df).orderBy("id").collect()
with torch.no_grad():
    want = net.eval()(torch.from_numpy(np.array([r["f"] for r in out], np.float32))).numpy()
tm.write().save(sys.argv[2])
again = TorchModel.load(sys.argv[2]).transform(df).orderBy("id").collect()
say(ids=[r["id"] for r in out], error=float(np.abs(np.array([r["p"] for r in out]) - want).max()),
    columns=tm.transform(df).columns, same=[r["p"] for r in out] == [r["p"] for r in again],
    packed="ember_pack_floats" in tm.transform(df)._explain_string(extended=True))
'''

TFRECORDS = PRELUDE + r'''
import ember.data
df = spark.range(0, 50, 1, 3).selectExpr("id", "cast(id as float) * 0.5 as x", "array(id, id + 1) as pair",
                                         "concat('s', cast(id as string)) as name")
written = ember.data.save_as_tfrecords(df, sys.argv[2])
back = ember.data.load_tfrecords(spark, sys.argv[2]).orderBy("id").collect()
say(written=written, rows=[[r["id"], r["x"], list(r["pair"]), r["name"]] for r in back])
'''

TUNE = PRELUDE + r'''
import ember.tune as tune

def trial(params, ctx):
    for epoch in (1, 2):
        ctx.report(epoch=epoch, score=float(params["k"] * epoch))
    return {"score": float(params["k"] * 2)}

search = tune.run(spark, trial, {"k": tune.grid([1, 2, 3, 4])}, metric="score", mode="max", parallelism=2)
say(status=[t.status for t in search.trials], best=search.best_params, metric=search.best_trial.metric,
    jobs=sorted({t.job_id for t in search.trials}))
'''

RECOVERY = PRELUDE + r'''
from pathlib import Path
from test_recovery import spark_mode_ids  # worker:1 SIGKILLs itself in epoch 1, once (python/tests)

out = sys.argv[2]
cluster = ember.Cluster.run(spark, spark_mode_ids, {"out": out, "epochs": 3}, num_executors=2,
                            input_mode=ember.InputMode.SPARK, reservation_timeout=120, max_restarts=1)
cluster.train(spark.range(0, 400, 1, 4), num_epochs=3)
cluster.shutdown(timeout=120)
say(restarts=[r.node for r in cluster.restarts], jobs=[cluster.job_id, cluster.node_job_id],
    epochs=[sorted(json.loads((Path(out) / f"ids-0-{e}.json").read_text())
                   + json.loads((Path(out) / f"ids-1-{e}.json").read_text())) for e in range(3)])
'''


STREAM = PRELUDE + r'''
from pathlib import Path
def main_fun(args, ctx):
    feed = ctx.get_data_feed(train_mode=True)
    epochs = []
    while not feed.should_stop():
        rows = [int(v) for b in feed.epoch_batches(16, drop_remainder=False) for v in b["v"]]
        if rows:
            epochs.append(rows)
    ctx._coordinator_client().kv_set(f"test/epochs/{ctx.task_index}", json.dumps(epochs).encode())

work = Path(sys.argv[2])
cluster = ember.Cluster.run(spark, main_fun, {}, num_executors=2, input_mode=ember.InputMode.SPARK,
                            reservation_timeout=120)
cluster.train(spark.range(1000, 1040, 1, 2).selectExpr("id as v"), num_epochs=1)  # fed by the client
for i in range(3):  # three files: three micro-batches, fed on the server
    spark.range(i * 100, i * 100 + 100, 1, 1).selectExpr("id as v").write.parquet(str(work / "in" / f"part{i}"))
stream = spark.readStream.schema("v long").option("maxFilesPerTrigger", 1).parquet(str(work / "in" / "part*"))
query = cluster.train_stream(stream, checkpoint_location=str(work / "ckpt"))
query.processAllAvailable()
try:
    cluster.train(spark.range(0, 10), num_epochs=1)
    refused = None
except ember.ClusterError as e:
    refused = str(e)
active = query.isActive
query.stop()
cluster.train(spark.range(2000, 2020, 1, 1).selectExpr("id as v"), num_epochs=1)  # the client again
kv = cluster._gang.server
cluster.shutdown(timeout=120)
say(job_id=cluster.job_id, refused=refused, active=active, exception=str(query.exception()) if query.exception() else None,
    epochs=[json.loads(kv.kv_get(f"test/epochs/{i}")) for i in range(2)])
'''

STREAM_NODE_FAILS = PRELUDE + r'''
import time
from pathlib import Path
def main_fun(args, ctx):
    feed = ctx.get_data_feed(train_mode=True)
    while not feed.should_stop():
        for batch in feed.epoch_batches(16, drop_remainder=False):
            if ctx.task_index == 1 and any(int(v) >= 100 for v in batch["v"]):
                raise RuntimeError("worker one gives up in the second micro-batch")

work = Path(sys.argv[2])
cluster = ember.Cluster.run(spark, main_fun, {}, num_executors=2, input_mode=ember.InputMode.SPARK,
                            reservation_timeout=120)
for i in range(3):
    spark.range(i * 100, i * 100 + 100, 1, 1).selectExpr("id as v").write.parquet(str(work / "in" / f"part{i}"))
stream = spark.readStream.schema("v long").option("maxFilesPerTrigger", 1).parquet(str(work / "in" / "part*"))
query = cluster.train_stream(stream, checkpoint_location=str(work / "ckpt"))
t0 = time.monotonic()
try:
    ended, awaited = query.awaitTermination(180), None
except Exception as e:  # the query failed: what its client was told
    ended, awaited = True, f"{type(e).__name__}: {e}"
seconds = time.monotonic() - t0
error = text = None
try:
    cluster.shutdown(timeout=120)
except Exception as e:
    error, text = type(e).__name__, str(e)
say(job_id=cluster.job_id, ended=ended, awaited=awaited, seconds=seconds, active=query.isActive,
    exception=str(query.exception()) if query.exception() else None, error=error, text=text)
'''

@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    # The server loads Ember's Spark extension (as a deployment would): KerasModel.transform's
    # input then crosses packed by ember_pack_floats (test_spark_ml_pipeline...).
    # Its Python workers also find torch (.torch-site, after the venv's packages: `make setup-torch`)
    # for TorchModel's test.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(TORCH_SITE)]))
    server = ConnectServer("local[4]", tmp_path_factory.mktemp("connect") / "server.log", conf=ember.spark_conf(),
                           env=env)
    yield server
    server.stop()


def _result(proc, server) -> dict:
    found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and found, (
        f"client exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}"
        f"\n--- server log\n{server.log_tail()}")
    return json.loads(found[-1][len("RESULT "):])


def test_cluster_run_with_the_nodes_collectives_from_a_connect_client(connect_server):
    proc = run_client(TENSORFLOW_MODE, connect_server.url)
    r = _result(proc, connect_server)
    assert r["sums"] == [[3.0, 3.0, 3.0], [3.0, 3.0, 3.0]]
    assert len(r["spec"]["worker"]) == 2
    # Node output reaches the client, prefixed with the node's role.
    assert re.search(r"worker:0.*node says sum=\[3\.0, 3\.0, 3\.0\]", proc.stdout + proc.stderr)
    no_leftovers(r["job_id"])


def test_spark_mode_train_and_ordered_inference_from_a_connect_client(connect_server):
    proc = run_client(SPARK_MODE, connect_server.url)
    r = _result(proc, connect_server)
    # 200 rows in 5 partitions (files) of 40 per epoch: 100 on each node (the equal-rows rule), both
    # epochs; the first read from the files in place (the plan seen through the Connect server).
    assert r["seen"] == [[100, 100], [100, 100]]
    assert "Cluster.train: the DataFrame is a plain Parquet scan of 5 file(s)" in proc.stdout + proc.stderr
    expected = [i for i in range(37) if i % 5 != 0 or i < 10]
    assert [row[0] for row in r["rows"]] == expected  # order kept
    assert all(row[1] == f"r{row[0]}" and row[2] == 2 * row[0] for row in r["rows"])  # passthrough columns
    assert {row[3] for row in r["rows"]} <= {"worker:0", "worker:1"}
    no_leftovers(r["job_id"])


def test_a_failing_node_is_named_to_the_connect_client(connect_server):
    proc = run_client(FAILING_NODE, connect_server.url)
    r = _result(proc, connect_server)
    assert r["error"] == "NodeError", r
    assert "worker:1" in r["text"] and "worker one gives up under Connect" in r["text"]
    no_leftovers(r["job_id"])


def test_nodes_reach_the_coordinator_through_a_relay_in_the_job_when_told_to(connect_server):
    """spark.ember.coordinator.placement=job (the multi-host test has a client no executor can
    dial, where "auto" picks it): the nodes dial a relay on an executor, which the client dials
    out to.  Their collectives, output and a failure reach the client as they do directly, and
    the relay ends with the job."""
    proc = run_client(TENSORFLOW_MODE.replace("def main_fun(args, ctx):", """def main_fun(args, ctx):
    if args.get("fail") == ctx.task_index:
        raise ValueError("worker one gives up behind the relay")""") + """
try:
    ember.Cluster.run(spark, main_fun, {"fail": 1}, num_executors=2, reservation_timeout=120).shutdown(timeout=120)
except Exception as e:
    say(failed=type(e).__name__, text=str(e))
""", connect_server.url, env={"EMBER_COORDINATOR_PLACEMENT": "job"})
    out = proc.stdout + proc.stderr
    results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and len(results) == 2, f"client exited {proc.returncode}\n{out[-6000:]}"
    ran, failed = results
    assert ran["sums"] == [[3.0, 3.0, 3.0], [3.0, 3.0, 3.0]]
    assert len(re.findall(r"through a relay at [0-9.]+:\d+", out)) == 2, out[-4000:]
    assert re.search(r"worker:0.*node says sum=\[3\.0, 3\.0, 3\.0\]", out)
    assert failed["failed"] == "NodeError" and "worker:1" in failed["text"], failed
    assert "worker one gives up behind the relay" in failed["text"], failed
    no_leftovers(ran["job_id"])  # the relay carries the job's id, as its nodes do


def test_run_parallel_from_a_connect_client(connect_server):
    r = _result(run_client(PARALLEL_RUNS, connect_server.url), connect_server)
    assert r["values"] == [{"run": i, "of": 3, "square": (i + 1) ** 2} for i in range(3)]


def test_ctrl_c_in_a_connect_client_ends_the_job_on_the_server(connect_server):
    """Ctrl-C while the client waits in shutdown(): the job is aborted, its Spark operation
    interrupted by tag on the server, and no process of it is left (on the server's side)."""
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED, connect_server.url], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        line = ""
        while not line.startswith("STARTED "):
            assert proc.poll() is None and time.monotonic() < deadline, \
                f"the client did not start its nodes: {proc.communicate(timeout=30)}"
            line = proc.stdout.readline()
        job_id = line.split()[1]
        time.sleep(2.0)  # in shutdown()'s wait
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "KeyboardInterrupt" in err, err[-3000:]
    assert took < 90, f"the client took {took:.0f}s to end after Ctrl-C"
    no_leftovers(job_id, timeout=60)


def test_spark_ml_pipeline_fit_transform_save_load_from_a_connect_client(connect_server, tmp_path):
    """KerasEstimator in a Pipeline with Spark's VectorAssembler, fitted, applied (the model
    reaches the executors inside the UDF: Connect has no broadcasts), saved and loaded."""
    r = _result(run_client(ML_PIPELINE, connect_server.url, str(tmp_path / "keras")), connect_server)
    assert r["kernel"] == pytest.approx([3.14, 1.618], abs=0.01)
    assert max(r["errors"]) < 0.03
    assert r["columns"] == ["id", "x1", "x2", "y", "features", "prediction"]
    assert r["same"]
    assert r["packed"]  # the server has Ember's extension: the Vector column crossed as one buffer per row
    no_leftovers(r["job_id"])


def test_torch_model_transform_save_load_from_a_connect_client(connect_server, tmp_path):
    """TorchModel under Connect: the program travels in the UDF, the packed column reaches
    torch, every row once in order, the predictions torch's; saved and loaded."""
    assert (TORCH_SITE / "torch").is_dir(), f"no torch in {TORCH_SITE}: run `make setup-torch`"
    r = _result(run_client(TORCH_MODEL, connect_server.url, str(tmp_path / "torch"), str(TORCH_SITE)), connect_server)
    assert r["ids"] == list(range(60))
    assert r["error"] < 1e-5
    assert r["columns"] == ["id", "f", "p"]
    assert r["same"]
    assert r["packed"]


def test_dataframe_to_tfrecords_and_back_from_a_connect_client(connect_server, tmp_path):
    r = _result(run_client(TFRECORDS, connect_server.url, str(tmp_path / "records")), connect_server)
    assert r["written"] == 50
    assert r["rows"] == [[i, i * 0.5, [i, i + 1], f"s{i}"] for i in range(50)]
    assert len(list((tmp_path / "records").glob("part-r-*"))) == 3


def test_tune_from_a_connect_client(connect_server):
    r = _result(run_client(TUNE, connect_server.url), connect_server)
    assert r["status"] == ["ok"] * 4
    assert r["best"] == {"k": 4} and r["metric"] == 8.0
    for job_id in r["jobs"]:
        no_leftovers(job_id)


def test_a_killed_node_restarts_the_gang_under_connect(connect_server, tmp_path):
    """max_restarts from a Connect client: worker:1 SIGKILLed mid-epoch, the gang restarts (a new
    barrier stage, the old one's tag interrupted) and is fed the interrupted epoch again whole."""
    r = _result(run_client(RECOVERY, connect_server.url, str(tmp_path)), connect_server)
    assert r["restarts"] == ["worker:1"]
    assert r["epochs"] == [list(range(400))] * 3  # no row lost or repeated
    for job_id in r["jobs"]:
        no_leftovers(job_id)


def test_train_stream_from_a_connect_client_is_fed_on_the_server(connect_server, tmp_path):
    """train_stream under Connect: the server runs the foreachBatch function, which feeds each
    micro-batch as an epoch (the equal-rows rule, every row once); the client's train() epochs
    before and after keep their order; train() is refused while the query runs."""
    r = _result(run_client(STREAM, connect_server.url, str(tmp_path)), connect_server)
    assert r["active"] and r["exception"] is None, r
    assert r["refused"] and "still feeds this cluster" in r["refused"], r
    for epochs in r["epochs"]:  # per node: the client's epoch, three micro-batches, the client's again
        assert len(epochs) == 5, epochs
        assert all(1000 <= v < 1040 for v in epochs[0]) and len(epochs[0]) == 20, epochs
        for rows in epochs[1:4]:
            assert len(rows) == 50 and len({v // 100 for v in rows}) == 1, epochs
        assert all(2000 <= v < 2020 for v in epochs[4]) and len(epochs[4]) == 10, epochs
    streamed = sorted(v for epochs in r["epochs"] for rows in epochs[1:4] for v in rows)
    assert streamed == list(range(300))  # every row once
    no_leftovers(r["job_id"])


def test_a_node_failing_during_a_connect_train_stream_fails_the_query_and_is_named(connect_server, tmp_path):
    """worker:1 raises in the second micro-batch that the server's feeder feeds: the client's watch
    interrupts the feeder's jobs, the query fails (its exception names the failure) well before
    its deadline, and shutdown() raises NodeError naming the node and its error; nothing is left."""
    r = _result(run_client(STREAM_NODE_FAILS, connect_server.url, str(tmp_path)), connect_server)
    assert r["ended"] and not r["active"] and r["seconds"] < 150, r
    assert r["awaited"] and r["exception"], r  # the query failed; awaitTermination said so
    assert r["error"] == "NodeError", r
    assert "worker:1" in r["text"] and "worker one gives up in the second micro-batch" in r["text"], r
    no_leftovers(r["job_id"])
