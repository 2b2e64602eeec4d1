"""ember.ps (issue 21, in progress): shards served over the job's authenticated transport, workers
as real processes pushing and pulling through them (shared memory on this host; one client TCP
only: both see the same tensors); a worker killed mid-run does not stop the
others; a dead shard is named; ps nodes of a real Spark job serve and its workers connect.

Main functions live at module level: executors import this module by name."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest

import ember
import ember.errors
import ember.ps
from conftest import no_leftovers

SECRET = b"0123456789abcdef-ps-python-test"
BIG = 100_000  # cut over both shards (Place splits tensors of 65,536+ elements)


def _worker(shards, rank, steps, ready, go):
    ps = ember.ps.Client.connect(shards, SECRET, name=f"worker:{rank}", timeout=30)
    assert ps.shared_memory(0) and ps.shared_memory(1)  # the shards share this host: its rings, not TCP
    ps.create_dense("w", np.zeros((BIG // 4, 4), np.float32), rule="add")  # every worker creates: first wins
    ps.create_table("emb", dim=8, seed=3, rule="add")
    ready.put(rank)
    go.wait(30)
    for _ in range(steps):
        w, versions = ps.pull("w")
        ps.push("w", np.ones_like(w), versions)
        ps.push_rows("emb", [rank, 100 + rank, rank], np.ones((3, 8), np.float32))
        if rank == 2:
            time.sleep(0.05)  # the one that gets killed: slow, so it dies mid-run


def test_workers_in_processes_update_through_two_shards_and_a_killed_worker_stops_no_one():
    servers = [ember.ps.Server.start(f"ps:{i}", SECRET, bind_host="127.0.0.1") for i in range(2)]
    shards = [f"127.0.0.1:{s.port}" for s in servers]
    ctx = mp.get_context("spawn")
    ready, go = ctx.Queue(), ctx.Event()
    steps = 20
    procs = [ctx.Process(target=_worker, args=(shards, r, steps if r < 2 else 10_000, ready, go), daemon=True)
             for r in range(3)]
    try:
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=60)
        go.set()
        time.sleep(0.3)
        os.kill(procs[2].pid, signal.SIGKILL)  # mid-run: its pushes so far stay, the rest are missing
        for p in procs[:2]:
            p.join(60)
            assert p.exitcode == 0, f"worker {p.name} exited {p.exitcode}"
        procs[2].join(10)
        assert procs[2].exitcode == -signal.SIGKILL  # killed while still running its 10,000 steps

        # The killed worker's rings went with it (their names were unlinked once both sides mapped them).
        assert [n for n in os.listdir("/dev/shm") if n.startswith("ember-ps-")] == []
        ps = ember.ps.Client.connect(shards, SECRET, name="checker", timeout=30, transport="tcp")
        assert not ps.shared_memory(0) and not ps.shared_memory(1)
        w, versions = ps.pull("w", shape=(BIG // 4, 4))
        # Each slice (half) holds 1 per push it took: the survivors' 2 x 20, plus the killed worker's
        # pushes so far (a kill between its two slices' requests leaves the halves one apart).
        flat = w.reshape(-1)
        for half, version in zip((flat[:BIG // 2], flat[BIG // 2:]), versions.per_slice):
            assert 2 * steps <= version < 10_000
            np.testing.assert_array_equal(half, np.full(BIG // 2, float(version), np.float32))
        assert abs(versions.per_slice[0] - versions.per_slice[1]) <= 1
        rows = ps.pull_rows("emb", [0, 100, 1, 101], dim=8)
        init = ps.pull_rows("emb", [7], dim=8)  # never pushed: its initial values
        assert np.all(np.abs(init) < 0.05)
        # row r got 2 per step, row 100 + r 1 per step (on top of their own initial values)
        fresh = ember.ps.Client.connect(shards, SECRET, name="fresh")
        fresh.create_table("emb2", dim=8, seed=3, rule="add")  # the same (seed, id) -> the same start
        start = fresh.pull_rows("emb2", [0, 100, 1, 101], dim=8)
        np.testing.assert_allclose(rows - start, np.repeat([[2.0 * steps], [1.0 * steps]] * 2, 8, axis=1),
                                   rtol=0, atol=1e-4)
        stats = ps.stats()
        assert sum(s.pushes_applied for s in stats) >= 2 * (2 * steps)
        assert sum(sum(s.staleness_histogram) for s in stats) > 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for s in servers:
            s.close()


def test_errors_name_the_shard_the_tensor_and_the_call():
    with ember.ps.Server.start("ps:0", SECRET, bind_host="127.0.0.1") as s0, \
            ember.ps.Server.start("ps:1", SECRET, bind_host="127.0.0.1") as s1:
        ps = ember.ps.Client.connect([f"127.0.0.1:{s0.port}", f"127.0.0.1:{s1.port}"], SECRET, timeout=10)
        with pytest.raises(ember.errors.NotFound, match="pull of 'nope' on ps:"):
            ps.pull("nope", shape=(3,))
        ps.create_dense("w", np.zeros(BIG, np.float32), rule="sgd", lr=0.1, staleness_bound=0)
        w, v = ps.pull("w")
        assert ps.push("w", np.ones(BIG), v).applied == 2
        late = ps.push("w", np.ones(BIG), v)  # based on the old versions: past the bound of 0
        assert (late.applied, late.rejected, late.max_staleness) == (0, 2, 1)
        with pytest.raises(ValueError, match="unknown PS rule 'nesterov'"):
            ps.create_dense("x", [1.0], rule="nesterov")
        s1.close()
        with pytest.raises(ember.errors.EmberError, match=r"ps:1 at 127\.0\.0\.1:\d+.*the shard died"):
            ps.pull("w")
    with pytest.raises(ember.errors.EmberError, match="is its ps node running"):
        ember.ps.Client.connect([f"127.0.0.1:{s0.port}"], SECRET, connect_timeout=2)
    with pytest.raises(ember.errors.Unauthenticated):
        with ember.ps.Server.start("ps:0", SECRET, bind_host="127.0.0.1") as s:
            ember.ps.Client.connect([f"127.0.0.1:{s.port}"], b"another-secret-of-16+", connect_timeout=5)


def test_ssp_holds_fast_workers_a_dead_worker_is_dropped_and_a_replacement_joins_at_the_slowest_clock():
    import threading

    server = ember.ps.Server.start("ps:0", SECRET, bind_host="127.0.0.1")
    shards = [f"127.0.0.1:{server.port}"]
    gaps, errors, steps = {0: [], 1: []}, [], 30

    def run(rank, delay):
        try:
            ps = ember.ps.Client.connect(shards, SECRET, name=f"worker:{rank}", timeout=30)
            ex = ember.ps.Exchange(ps, "downpour", ssp=1, workers=3)
            w = ex.start({"w": np.zeros(4, np.float32)})["w"]
            for _ in range(steps):
                time.sleep(delay)
                w = ex.exchange({"w": w + 1})["w"]
                gaps[rank].append(ex.clock - ps.clock(ex.clock, 1, 0, 3).min_clock)  # a tick again: no wait
            ex.finish()
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    try:
        # worker:2 starts (clock 0) and dies: its connection closes without leave().
        doomed = ember.ps.Client.connect(shards, SECRET, name="worker:2", timeout=30)
        threads = [threading.Thread(target=run, args=(0, 0.0)), threading.Thread(target=run, args=(1, 0.02))]
        for t in threads:
            t.start()
        doomed.clock(0, 1, 0, 3)
        del doomed
        time.sleep(0.2)
        assert "worker:2" in server._native.departed()
        # A replacement takes the dead worker's place: it joins at the slowest live clock.
        new = ember.ps.Client.connect(shards, SECRET, name="worker:2", timeout=30)
        joined = ember.ps.Exchange(new, "downpour", ssp=1, workers=3)
        joined.start({"w": np.zeros(4, np.float32)})
        assert joined.clock >= min(server._native.clocks().get("worker:1", 0), steps) - 1
        joined.finish()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert max(gaps[0]) <= 1  # the fast worker never ran more than ssp=1 clocks ahead
        assert gaps[0] and gaps[1]
        ps = ember.ps.Client.connect(shards, SECRET, name="checker")
        assert ps.pull("w", shape=(4,))[0][0] == 2 * steps  # every push of both landed
        assert server._native.clocks() == {}  # everyone left
    finally:
        server.close()


def ps_job(args, ctx):
    import os
    import signal
    import time

    import numpy as np

    import ember.ps

    restarted = ctx.job_id.endswith("-r1")
    if ctx.job_name == "ps":
        server = ember.ps.serve(ctx, block=False, checkpoint_dir=args["checkpoints"], checkpoint_secs=0.5)
        if ctx.task_index == 0 and not restarted:
            # The first gang's ps:0 dies once the workers' pushes are in a checkpoint of its own.
            while server.stats().pushes_applied < 10:
                time.sleep(0.05)
            time.sleep(1.5)  # ps:1 saves every 0.5 s: its checkpoints hold pushes too
            server.save()
            os.kill(os.getpid(), signal.SIGKILL)
        while True:
            time.sleep(3600)  # until shutdown stops the node
    ps = ember.ps.connect(ctx, timeout=60)
    ps.create_dense("w", np.zeros(BIG, np.float32), rule="add")
    ps.create_table("emb", dim=4, seed=1, rule="add")
    if not restarted:
        while True:  # until ps:0 dies: this worker's next call names it, and the gang restarts
            w, versions = ps.pull("w")
            ps.push("w", np.ones_like(w), versions)
            time.sleep(0.01)
    comm = ctx.communicator()
    w, start = ps.pull("w")
    if min(start.per_slice) < 1:
        raise AssertionError(f"the restarted shards did not resume from their checkpoints: versions {start.per_slice}")
    comm.barrier()  # every worker saw the restored versions before anyone pushes
    for _ in range(args["steps"]):
        w, versions = ps.pull("w")
        ps.push("w", np.ones_like(w), versions)
        ps.push_rows("emb", [ctx.training_rank], np.ones((1, 4), np.float32))
    comm.barrier()
    if ctx.training_rank == 0:
        w, versions = ps.pull("w")
        halves = (w[:BIG // 2], w[BIG // 2:])
        # each slice holds 1 per push it ever took (restored ones included): its version
        if not all(np.all(h == v) for h, v in zip(halves, versions.per_slice)) or \
                min(b - a for a, b in zip(start.per_slice, versions.per_slice)) < ctx.num_workers * args["steps"]:
            raise AssertionError(f"after every push: {w[:3]}..., versions {versions.per_slice}, from {start.per_slice}")


def test_ps_nodes_serve_shards_a_killed_ps_node_restarts_from_its_checkpoint_and_training_goes_on(spark, tmp_path):
    cluster = ember.Cluster.run(spark, ps_job, {"steps": 5, "checkpoints": str(tmp_path)}, num_executors=4, num_ps=2,
                                reservation_timeout=60, max_restarts=1)
    cluster.shutdown(timeout=120)  # the workers' assertion would fail the job; ps nodes are stopped
    assert sorted(cluster.cluster_spec) == ["ps", "worker"]
    assert len(cluster.restarts) == 1
    # The first failure is ps:0's SIGKILL, or a worker's call naming the shard that died.
    assert cluster.restarts[0].node == "ps:0" or "ps:0" in cluster.restarts[0].reason, cluster.restarts
    assert cluster.restarts[0].relaunch_secs is not None
    no_leftovers(cluster.job_id)
    no_leftovers(f"{cluster.job_id}-r1")


def lossy_job(args, ctx):
    import os
    import signal

    import numpy as np

    import ember.ps

    if ctx.job_name == "ps":
        ember.ps.serve(ctx)
    import ember.errors

    coordinator = ctx._coordinator_client()
    try:
        replacement = coordinator.kv_get("test/killed", 0.0) is not None
    except ember.errors.DeadlineExceeded:
        replacement = False
    ps = ember.ps.connect(ctx, timeout=60)
    ex = ember.ps.Exchange(ps, "downpour", ssp=2)  # every worker must start; then SSP
    w = ex.start({"w": np.zeros(8, np.float32)})["w"]
    if replacement:
        coordinator.kv_set("test/replacement_clock", str(ex.clock).encode())
    for step in range(args["steps"]):
        if ctx.task_index == 2 and step == 3 and not replacement:
            coordinator.kv_set("test/killed", b"1")
            os.kill(os.getpid(), signal.SIGKILL)  # a worker dies mid-training
        w = ex.exchange({"w": w + 1})["w"]
    if args["replace"] and not replacement:
        coordinator.kv_get("test/replacement_clock", 120.0)  # the job ends once the replacement joined
    ex.finish()
    coordinator.kv_set(f"test/pushes/{ctx.task_index}", str(ex.pushes).encode())


@pytest.mark.parametrize("replace", [0, 1])
def test_a_job_with_min_workers_goes_on_without_a_worker_that_died_names_it_and_can_replace_it(spark, replace):
    steps = 20
    cluster = ember.Cluster.run(spark, lossy_job, {"steps": steps, "replace": replace}, num_executors=4, num_ps=1,
                                reservation_timeout=60, min_workers=2, replace_lost_workers=replace)
    cluster.shutdown(timeout=120)  # returns: the survivors (and the replacement) finished; ps stopped
    lost = cluster.lost_workers
    assert [(e.job_name, e.task_index) for e in lost] == [("worker", 2)], lost
    assert "SIGKILL" in str(lost[0]), str(lost[0])
    server = cluster._gang.server
    assert [server.kv_get(f"test/pushes/{i}") for i in (0, 1)] == [str(steps).encode()] * 2
    assert cluster.replaced == replace
    if replace:  # the replacement ran main_fun whole, joining the clocks where the others were
        assert server.kv_get("test/pushes/2") == str(steps).encode()
        assert int(server.kv_get("test/replacement_clock")) >= 1
    no_leftovers(cluster.job_id)
    with pytest.raises(ValueError, match="min_workers must be"):
        ember.Cluster.run(spark, lossy_job, {}, num_executors=2, num_ps=1, min_workers=2)


def test_a_shard_checkpoints_and_a_new_one_resumes_from_it(tmp_path):
    directory = str(tmp_path / "ps-0")
    with ember.ps.Server.start("ps:0", SECRET, bind_host="127.0.0.1") as s:
        assert s.checkpoint_to(directory, every_secs=3600) is None  # nothing to restore yet
        ps = ember.ps.Client.connect([f"127.0.0.1:{s.port}"], SECRET)
        ps.create_dense("w", np.zeros(BIG, np.float32), rule="add")
        ps.create_table("emb", dim=4, seed=2, rule="sgd", lr=0.5)
        w, v = ps.pull("w")
        ps.push("w", np.full(BIG, 2.0), v)
        ps.push_rows("emb", [3, 9], np.ones((2, 4), np.float32))
        rows = ps.pull_rows("emb", [3, 9])
    # close() saved once more: a new shard (a restarted ps node) resumes from it
    with ember.ps.Server.start("ps:0", SECRET, bind_host="127.0.0.1") as s2:
        assert s2.checkpoint_to(directory, every_secs=3600) == 1
        ps = ember.ps.Client.connect([f"127.0.0.1:{s2.port}"], SECRET)
        w, v = ps.pull("w", shape=(BIG,))
        assert v.per_slice == [1] and np.all(w == 2.0)
        np.testing.assert_array_equal(ps.pull_rows("emb", [3, 9], dim=4), rows)
        blobs = s2.snapshot()
        assert sorted(blobs) == ["dense/w", "table/emb"]
        broken = dict(blobs, **{"dense/w": blobs["dense/w"][:-5]})
        with pytest.raises(ember.errors.Corruption, match="blob 'dense/w'"):
            s2.restore(broken)
        assert np.all(ps.pull("w", shape=(BIG,))[0] == 2.0)  # unchanged


def _in_step(exchanges, rounds, window=5, h=0.5):
    """Workers in step (as an SSP bound holds them, and BSP) on f(w) = w^2 / 2: each takes
    `window` local steps w -= h * w from the same pulled weights (reaching nearly the floor, 0),
    then exchanges; every push lands before the workers continue from the center.  The center
    after every round."""
    ws = [ex.start({"w": np.full(4, 1.0, np.float32)})["w"] for ex in exchanges]
    centers = []
    for _ in range(rounds):
        for ex, w in zip(exchanges, ws):
            ex.exchange({"w": w * (1 - h) ** window})
        ws = [ex.pull()["w"] for ex in exchanges]  # the center with every worker's push
        assert all(np.array_equal(w, ws[0]) for w in ws)
        centers.append(float(ws[0][0]))
    return centers


def test_summed_deltas_of_workers_in_step_swing_and_averaged_ones_converge():
    # The SSP(2) accuracy gap (docs/ps.md, Consistency): 2 workers in step each reach the valley
    # floor in their window, and the shards add both deltas: the center overshoots to -0.94 and
    # swings, shrinking by 6 % a round.  average=True moves it by the mean delta: it converges.
    with ember.ps.Server.start("ps:0", SECRET, bind_host="127.0.0.1") as s:
        def pair(name, **kw):
            clients = [ember.ps.Client.connect([f"127.0.0.1:{s.port}"], SECRET) for _ in range(2)]
            return [ember.ps.Exchange(_Renamed(c, name), "downpour", window=5, workers=2, **kw) for c in clients]

        summed = _in_step(pair("summed"), rounds=6)
        assert all(abs(c) > 0.6 and (c < 0) == (i % 2 == 0) for i, c in enumerate(summed)), summed  # -0.94, +0.88, ...
        averaged = _in_step(pair("averaged", average=True), rounds=6)
        assert abs(averaged[-1]) < 1e-6 < abs(averaged[0]) < 0.05, averaged
        # adag's division by the window and average's by the workers combine
        ex = ember.ps.Exchange(_Renamed(ember.ps.Client.connect([f"127.0.0.1:{s.port}"], SECRET), "adag"),
                               "adag", window=5, workers=2, average=True)
        w = ex.start({"w": np.zeros(3, np.float32)})["w"]
        assert np.allclose(ex.exchange({"w": w + 10})["w"], 1.0)
        ex = ember.ps.Exchange(_Renamed(ember.ps.Client.connect([f"127.0.0.1:{s.port}"], SECRET), "once"),
                               workers=4, average=True)
        w = ex.start({"w": np.zeros(3, np.float32)})["w"]
        assert np.allclose(ex.exchange({"w": w + 2}, steps=1)["w"], 0.5)  # steps count for adag only
    with pytest.raises(ValueError, match="easgd pushes weights"):
        ember.ps.Exchange(None, "easgd", workers=2, average=True)
    with pytest.raises(ValueError, match="needs the number of workers"):
        ember.ps.Exchange(None, "downpour", average=True)


class _Renamed:
    """A client whose tensor 'w' is '<prefix>/w' on the shard: several tests' tensors on one."""

    def __init__(self, ps, prefix):
        self._ps, self._prefix = ps, prefix

    def __getattr__(self, name):
        return getattr(self._ps, name)

    def _n(self, names):
        return [f"{self._prefix}/{n}" for n in names]

    def create_dense(self, name, initial, **kw):
        self._ps.create_dense(f"{self._prefix}/{name}", initial, **kw)

    def pull_many(self, names, shapes=None):
        return self._ps.pull_many(self._n(names), shapes)

    def push_many(self, names, updates, versions):
        return self._ps.push_many(self._n(names), updates, versions)
