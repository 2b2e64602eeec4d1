#!/usr/bin/env python
"""Feed throughput: rows/s delivered into each node's consumer, which only drains batches.

Three contenders on one Spark standalone cluster (2 workers on this host, started by the
script), over a cached Fashion-MNIST-shaped DataFrame (image: 784-byte binary, label: int),
2 nodes:

  ember  Cluster.run(..., input_mode=InputMode.SPARK) + cluster.train(df); each node drains
         feed.epoch_batches(batch) and counts rows.  Headline time: from the call of
         cluster.train to the later of (train returns, the last node consumed its last row).
         train() runs one Spark job per epoch and no counting pass.
  tfos   TensorFlowOnSpark 2.2.5: TFCluster.run(..., InputMode.SPARK) + cluster.train(df.rdd,
         num_epochs=1); each node drains TFNode.DataFeed(ctx.mgr).next_batch(batch) until
         should_stop.  train() returns once every row was consumed (queue.join).  TFoS needs
         one 1-core executor per node: its own Spark application (spark.executor.cores=1).
  bare   Spark's own df.mapInArrow(drain, "n long") over the same cached DataFrame, counting
         rows: the rate at which Spark hands this data to Python at all (the limit).

Each contender runs --repeats times (ember and bare interleaved); medians are reported.

With --connect, ember and bare run once more, the same way, from a Spark Connect client
(``SparkSession.builder.remote``) of a Spark Connect server (pyspark's own distribution) that runs
its application on the same standalone cluster, after the classic application has stopped: the
``connect`` column, over the same synthetic data (made and cached by that application).

The last line is:
  feed_rows_per_sec: ember=<v> tfos=<v> bare=<v> ratio_vs_tfos=<v> ratio_vs_bare=<v>
(with --connect: ... ember_connect=<v> connect_vs_classic=<v>, Ember's feed from a Connect client
over Ember's from the classic session).

  .venv/bin/python bench/feed.py                 # defaults: 1,000,000 rows, 3 repeats
  .venv/bin/python bench/feed.py --rows 200000 --tfos-rows 50000 --repeats 1   # quick
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402  (sets PYTHONPATH/PYSPARK_PYTHON before Spark starts)


# ----------------------------------------------------------------------------- node code
def ember_drain(args, ctx):
    """Ember node: drain every epoch, count rows, write one JSON file per epoch."""
    import cProfile
    import io
    import json
    import pstats
    import time
    from pathlib import Path

    feed = ctx.get_data_feed()
    epoch = 0
    while True:
        prof = None
        if args.get("profile") and epoch == args["profile_epoch"]:
            prof = cProfile.Profile()
            prof.enable()
        rows, batches, t_first = 0, 0, None
        for cols in feed.epoch_batches(args["batch"]):
            if t_first is None:
                t_first = time.time()
            rows += len(cols["label"])
            batches += 1
        t_end = time.time()
        if prof is not None:
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
            Path(args["out"], f"ember-profile-{ctx.task_index}.txt").write_text(s.getvalue())
        if t_first is None:  # end of feed: no further epoch
            break
        Path(args["out"], f"ember-{ctx.task_index}-{epoch}.json").write_text(json.dumps(
            {"rows": rows, "batches": batches, "t_first": t_first, "t_end": t_end}))
        epoch += 1


def tfos_drain(args, ctx):
    """TFoS node (runs in TFoS's background process): drain next_batch until should_stop."""
    import json
    import time
    from pathlib import Path

    from tensorflowonspark import TFNode

    feed = TFNode.DataFeed(ctx.mgr, train_mode=True)
    rows, batches, t_last = 0, 0, None
    while not feed.should_stop():
        batch = feed.next_batch(args["batch"])
        if batch:
            rows += len(batch)
            batches += 1
            t_last = time.time()
    Path(args["out"], f"tfos-{ctx.executor_id}.json").write_text(json.dumps(
        {"rows": rows, "batches": batches, "t_last": t_last}))


def bare_drain(batches):
    import time

    import pyarrow as pa
    t0 = time.perf_counter()
    n = 0
    for b in batches:
        n += b.num_rows
    yield pa.RecordBatch.from_pydict({"n": [n], "secs": [time.perf_counter() - t0]},
                                     schema=pa.schema([("n", pa.int64()), ("secs", pa.float64())]))


# ----------------------------------------------------------------------------- contenders
def _cpu(cluster) -> dict:
    """CPU snapshot of the standalone cluster's processes; {} in the Connect client (which does
    not know them)."""
    return C.cpu_snapshot(cluster) if cluster is not None else {}


def run_bare(df, cluster) -> dict:
    cpu0 = _cpu(cluster)
    t0 = time.time()
    res = df.mapInArrow(bare_drain, "n long, secs double").collect()
    secs = time.time() - t0
    cpu = C.cpu_delta(cpu0, _cpu(cluster))
    rows = sum(r.n for r in res)
    return {"rows": rows, "secs": secs, "rate": rows / secs, "task_secs": sum(r.secs for r in res), "cpu": cpu}


class EmberBench:
    def __init__(self, spark, args, out: Path, cluster):
        import ember
        from ember._driver import feed as _feed_driver

        self.out = out
        self.spark_cluster = cluster
        if args.profile:  # time splits of the feeding tasks (see bench/_feedprof.py)
            import _feedprof
            shutil.rmtree(_feedprof.PROF_DIR, ignore_errors=True)
            _feed_driver.feeding = _feedprof
        t = time.time()
        self.cluster = ember.Cluster.run(
            spark, ember_drain, {"batch": args.batch_size, "out": str(out), "profile": args.profile,
                              "profile_epoch": args.warmup},
            num_executors=2, input_mode=ember.InputMode.SPARK, reservation_timeout=180)
        C.log(f"ember: 2 nodes up in {time.time() - t:.1f}s")
        self.epoch = 0

    def run(self, df) -> dict:
        cpu0 = _cpu(self.spark_cluster)
        t0 = time.time()
        self.cluster.train(df, num_epochs=1)
        t1 = time.time()
        files = [self.out / f"ember-{i}-{self.epoch}.json" for i in range(2)]
        C.wait_for(lambda: all(f.exists() for f in files), 600, "both Ember nodes to finish the epoch")
        time.sleep(0.05)
        nodes = [json.loads(f.read_text()) for f in files]
        cpu = C.cpu_delta(cpu0, _cpu(self.spark_cluster))
        self.epoch += 1
        rows = sum(n["rows"] for n in nodes)
        end = max([t1] + [n["t_end"] for n in nodes])
        secs = end - t0
        return {"rows": rows, "secs": secs, "rate": rows / secs, "train_secs": t1 - t0,
                "consumed_lag_secs": max(n["t_end"] for n in nodes) - t1,
                "node_rows": [n["rows"] for n in nodes], "cpu": cpu}

    def close(self):
        self.cluster.shutdown(timeout=120)


def run_tfos(cluster, args, out: Path) -> tuple:
    """Own Spark application: 2 executors x 1 core (TFoS: one node per 1-core executor)."""
    env = C.ensure_tfos()
    C.log(f"tfos: {env}")
    spark = C.session(cluster, "bench-feed-tfos", **{
        "spark.executor.cores": "1", "spark.cores.max": "2", "spark.task.cpus": "1",
        "spark.executorEnv.PYTHONPATH": C.pythonpath_with(C.TFOS_SITE), **args.spark_conf})
    sc = spark.sparkContext
    C.wait_executors(sc, 2)
    df = C.synthetic_df(spark, args.tfos_rows, args.partitions)
    C.log(f"tfos data: {args.tfos_rows} rows in {args.partitions} partitions; {C.cached_fraction(sc)}")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from tensorflowonspark import TFCluster
    t = time.time()
    tcluster = TFCluster.run(sc, tfos_drain, {"batch": args.batch_size, "out": str(out)}, num_executors=2,
                             num_ps=0, input_mode=TFCluster.InputMode.SPARK, reservation_timeout=180)
    C.log(f"tfos: 2 nodes up in {time.time() - t:.1f}s")
    runs = []
    for w in range(args.warmup):
        t0 = time.time()
        tcluster.train(df.rdd, num_epochs=1)
        C.log(f"tfos  warm-up {w + 1}: {time.time() - t0:.2f}s (not counted)")
    for r in range(args.repeats):
        cpu0 = C.cpu_snapshot(cluster)
        t0 = time.time()
        tcluster.train(df.rdd, num_epochs=1)
        secs = time.time() - t0
        cpu = C.cpu_delta(cpu0, C.cpu_snapshot(cluster))
        runs.append({"rows": args.tfos_rows, "secs": secs, "rate": args.tfos_rows / secs, "cpu": cpu})
        C.log(f"tfos  repeat {r + 1}: {args.tfos_rows} rows in {secs:.2f}s = {runs[-1]['rate']:.0f} rows/s "
              f"({C.fmt_cpu(cpu)})")
    tcluster.shutdown(timeout=600)
    files = [out / f"tfos-{i}.json" for i in range(2)]
    try:
        C.wait_for(lambda: all(f.exists() for f in files), 60, "both TFoS nodes to report")
        nodes = [json.loads(f.read_text()) for f in files]
        got = sum(n["rows"] for n in nodes)
        C.log(f"tfos nodes consumed {[n['rows'] for n in nodes]} rows (expected {args.tfos_rows * (args.repeats + args.warmup)})")
        if got != args.tfos_rows * (args.repeats + args.warmup):
            raise RuntimeError(f"TFoS nodes consumed {got} rows, fed {args.tfos_rows * (args.repeats + args.warmup)}")
    except TimeoutError as e:
        C.log(f"tfos: {e}")
    spark.stop()
    return runs, env


def print_profile(out: Path, bare: list) -> None:
    import _feedprof
    tasks = [json.loads(f.read_text()) for f in Path(_feedprof.PROF_DIR).glob("task-*.json")]
    epochs = sorted({t["epoch"] for t in tasks})
    print("\nfeeding-task time splits, summed over the tasks of each timed epoch (seconds):")
    print("  epoch  tasks   total   spark_next  encode   write   other   cpu     rows")
    for e in epochs:
        ts = [t for t in tasks if t["epoch"] == e]
        tot = {k: sum(t[k] for t in ts) for k in ("total", "spark_next", "encode", "write", "cpu", "rows")}
        other = tot["total"] - tot["spark_next"] - tot["encode"] - tot["write"]
        print(f"  {e:5d}  {len(ts):5d}  {tot['total']:6.2f}  {tot['spark_next']:10.2f}  {tot['encode']:6.2f}  "
              f"{tot['write']:6.2f}  {other:6.2f}  {tot['cpu']:6.2f}  {tot['rows']}")
    print(f"bare drain tasks, summed (seconds): {[round(b['task_secs'], 2) for b in bare]}")
    for f in sorted(out.glob("ember-profile-*.txt")):
        print(f"--- node cProfile {f.name}\n{f.read_text()}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="rows fed to Ember and the bare drain")
    p.add_argument("--tfos-rows", type=int, default=100_000,
                   help="rows fed to TFoS (fewer: it feeds one pickled RPC per row; rates compare)")
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=100, help="rows per next_batch on each node")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of each contender first")
    p.add_argument("--skip-tfos", action="store_true")
    p.add_argument("--profile", action="store_true",
                   help="time splits of the feeding tasks and cProfile of the nodes' first timed epoch")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark conf for every application (experiments)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--connect", action="store_true",
                   help="also run ember and bare from a Spark Connect client (a Connect server on the cluster)")
    p.add_argument("--remote", help=argparse.SUPPRESS)  # internal: be that Connect client, of this server URL
    args = p.parse_args(argv)
    args.spark_conf = dict(kv.split("=", 1) for kv in args.conf)
    if args.remote:
        return connect_client(args)

    C.log(f"machine: {C.machine_info()}")
    C.log(f"versions: {C.versions()}")
    out = Path(tempfile.mkdtemp(prefix="ember-bench-feed-"))
    cluster = C.start_standalone(num_workers=2, cores_per_worker=2, memory="3g")
    results = {"args": vars(args), "machine": C.machine_info()}
    try:
        C.log(f"standalone cluster {cluster.master_url}: 2 workers x 2 cores")
        spark = C.session(cluster, "bench-feed-ember", **args.spark_conf)
        sc = spark.sparkContext
        C.wait_executors(sc, 2)
        t = time.time()
        df = C.synthetic_df(spark, args.rows, args.partitions)
        C.log(f"data: {args.rows} rows x ({C.IMAGE_BYTES}-byte image + int label) in {args.partitions} "
              f"partitions, generated+cached in {time.time() - t:.1f}s; {C.cached_fraction(sc)}")
        emb, bare = run_ember_and_bare(spark, args, out, cluster, df)
        if args.profile:
            print_profile(out, bare)
        spark.stop()
        results.update(ember=emb, bare=bare)
        if args.connect:
            results["connect"] = connect_runs(cluster, args)
        tfos = []
        if not args.skip_tfos:
            tfos, env = run_tfos(cluster, args, out)
            results.update(tfos=tfos, tfos_env=env)
    finally:
        cluster.stop()
        shutil.rmtree(out, ignore_errors=True)

    e_rate = C.median([r["rate"] for r in emb])
    b_rate = C.median([r["rate"] for r in bare])
    t_rate = C.median([r["rate"] for r in tfos]) if tfos else float("nan")
    print()
    print(f"repeats: {args.repeats}; medians in rows/s")
    print(f"  ember  {e_rate:12.0f}  ({args.rows} rows; runs {[round(r['rate']) for r in emb]})")
    print(f"  bare   {b_rate:12.0f}  ({args.rows} rows; runs {[round(r['rate']) for r in bare]})")
    if tfos:
        print(f"  tfos   {t_rate:12.0f}  ({args.tfos_rows} rows; runs {[round(r['rate']) for r in tfos]}; "
              f"{results['tfos_env']})")
    if args.profile:
        print("NOTE: run with --profile: the timings include the profiler's overhead")
    def cpu_per_m(runs, key="cpu"):
        return C.median([r[key]["total"] / r["rows"] * 1e6 for r in runs]) if runs else float("nan")
    print(f"CPU seconds per 1M rows (all cluster + driver processes; medians): ember {cpu_per_m(emb):.2f}, "
          f"bare {cpu_per_m(bare):.2f}, tfos {cpu_per_m(tfos):.1f}; ember/bare {cpu_per_m(emb) / cpu_per_m(bare):.2f}")
    results["medians"] = {"ember": e_rate, "bare": b_rate, "tfos": t_rate}
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    C.log(f"machine at end: {C.machine_info()}")
    tail = ""
    if args.connect:
        ce = C.median([r["rate"] for r in results["connect"]["ember"]])
        cb = C.median([r["rate"] for r in results["connect"]["bare"]])
        print(f"connect (Spark Connect client): ember {ce:12.0f} (runs "
              f"{[round(r['rate']) for r in results['connect']['ember']]}; {ce / e_rate:.3f} of classic), "
              f"bare {cb:12.0f} ({cb / b_rate:.3f} of classic)")
        tail = f" ember_connect={C.fmt_rate(ce)} connect_vs_classic={ce / e_rate:.3f}"
    print(f"feed_rows_per_sec: ember={C.fmt_rate(e_rate)} tfos={C.fmt_rate(t_rate)} bare={C.fmt_rate(b_rate)} "
          f"ratio_vs_tfos={e_rate / t_rate:.2f} ratio_vs_bare={e_rate / b_rate:.2f}{tail}")


def run_ember_and_bare(spark, args, out: Path, cluster, df) -> tuple:
    """The warm-up, then --repeats of bare and ember interleaved: (ember runs, bare runs)."""
    bench = EmberBench(spark, args, out, cluster)
    bare, emb, warm = [], [], {}
    try:
        for w in range(args.warmup):  # untimed: JIT, Python workers, first-use costs
            warm["bare"], warm["ember"] = run_bare(df, cluster), bench.run(df)
            C.log(f"warm-up {w + 1}: bare {warm['bare']['secs']:.2f}s, ember {warm['ember']['secs']:.2f}s "
                  "(not counted)")
        if args.profile:
            import _feedprof
            shutil.rmtree(_feedprof.PROF_DIR, ignore_errors=True)
        for r in range(args.repeats):
            bare.append(run_bare(df, cluster))
            b = bare[-1]
            C.log(f"bare  repeat {r + 1}: {b['rows']} rows in {b['secs']:.2f}s = {b['rate']:.0f} rows/s "
                  f"(sum of task times {b['task_secs']:.2f}s; {C.fmt_cpu(b['cpu'])})")
            emb.append(bench.run(df))
            e = emb[-1]
            C.log(f"ember repeat {r + 1}: {e['rows']} rows in {e['secs']:.2f}s = {e['rate']:.0f} rows/s "
                  f"(train() {e['train_secs']:.2f}s; last row consumed "
                  f"{e['consumed_lag_secs']:+.2f}s after train() returned; per node {e['node_rows']}; "
                  f"{C.fmt_cpu(e['cpu'])})")
    finally:
        bench.close()
    return emb, bare


def connect_runs(cluster, args) -> dict:
    """ember and bare from a Spark Connect client: a Connect server whose application runs on
    the standalone `cluster` with the classic session's settings, and this script again as its
    client.  {"ember": runs, "bare": runs}."""
    conf = {"spark.sql.shuffle.partitions": "4", "spark.executor.memory": "2g", "spark.python.worker.reuse": "true",
            "spark.app.name": "bench-feed-ember-connect"}
    conf.update(args.spark_conf)
    return C.run_as_connect_client(
        cluster.master_url, conf,
        [str(Path(__file__).resolve()), "--rows", str(args.rows), "--partitions", str(args.partitions),
         "--batch-size", str(args.batch_size), "--repeats", str(args.repeats), "--warmup", str(args.warmup)],
        "CONNECT_RUNS")


def connect_client(args) -> None:
    """The Connect client of connect_runs: the same data, warm-up and repeats; prints the runs."""
    from pyspark.sql import SparkSession

    from ember._driver.spark_side import spark_side

    spark = SparkSession.builder.remote(args.remote).getOrCreate()
    side = spark_side(spark)
    C.wait_for(lambda: side.default_parallelism(fresh=True) >= 4, 120, "the Connect server's 2 executors (4 cores)")
    out = Path(tempfile.mkdtemp(prefix="ember-bench-feed-connect-"))
    try:
        t = time.time()
        df = C.synthetic_df(spark, args.rows, args.partitions)
        C.log(f"connect data: {args.rows} rows generated+cached in {time.time() - t:.1f}s")
        emb, bare = run_ember_and_bare(spark, args, out, None, df)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    print("CONNECT_RUNS " + json.dumps({"ember": emb, "bare": bare}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
