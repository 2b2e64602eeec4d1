"""ember.run_parallel (TFoS's TFParallel.run): independent single-node runs, results, named failures."""
from __future__ import annotations

import os

import numpy as np
import pytest

import ember
from conftest import processes_of_job
from ember.parallel import RunsFailed, decode_result, encode_result


def _identify(args, ctx):
    ctx.report(step=1, loss=0.5 + ctx.run_index)
    return {"run": ctx.run_index, "executor_id": ctx.executor_id, "num_runs": ctx.num_runs,
            "pid": os.getpid(), "job": os.environ["EMBER_JOB_ID"], "args": args}


def _fail_run_1(args, ctx):
    if ctx.run_index == 1:
        raise ValueError(f"run {ctx.run_index} rejects its input {args!r}")
    return np.arange(3) * (ctx.run_index + 1)


def _tfoS_map_fun(tf_args, ctx):
    with open(os.path.join(tf_args.out, f"run-{ctx.executor_id}-of-{ctx.num_workers}"), "w") as f:
        f.write(str(tf_args.value))


def test_runs_are_independent_and_return_in_slot_order(spark, capsys):
    results = ember.run_parallel(spark, _identify, {"lr": 0.1}, num_executors=3)
    assert [r["run"] for r in results] == [0, 1, 2]
    assert [r["executor_id"] for r in results] == [0, 1, 2]
    assert all(r["num_runs"] == 3 and r["args"] == {"lr": 0.1} for r in results)
    assert len({r["pid"] for r in results}) == 3, "each run has a process of its own"
    assert len({r["job"] for r in results}) == 3, "each run is a job of its own"
    err = capsys.readouterr().err
    assert "[run 2 worker:0] progress:" in err  # reports are labelled with their run
    for r in results:
        assert not processes_of_job(r["job"])


def test_a_failed_run_is_named_and_the_others_finish(spark):
    with pytest.raises(RunsFailed) as info:
        ember.run_parallel(spark, _fail_run_1, "x", num_executors=3)
    e = info.value
    assert e.failed == [1]
    assert "run 1 failed: node worker:0" in str(e)
    assert "ValueError: run 1 rejects its input 'x'" in str(e)
    ok = [r for r in e.results if r.status == "ok"]
    assert [r.index for r in ok] == [0, 2]
    assert np.array_equal(ok[1].value, np.arange(3) * 3)


def test_too_many_runs_for_the_slots_is_an_error(spark):
    with pytest.raises(ember.ClusterError, match="5 runs at once.*has 4"):
        ember.run_parallel(spark, _identify, None, num_executors=5)


def test_results_are_typed_not_pickled():
    assert decode_result(encode_result({"a": [1, 2.5, None]})) == {"a": [1, 2.5, None]}
    assert decode_result(encode_result(np.float32(2.5))) == 2.5
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.array_equal(decode_result(encode_result(arr)), arr)
    with pytest.raises(TypeError, match="save it under ctx.absolute_path"):
        encode_result(object())
    with pytest.raises(ValueError, match="not an encoded run result"):
        decode_result(b"\x80\x04pickle")


def test_tfparallel_run_compat(spark, tmp_path):
    from argparse import Namespace

    from ember.compat.tensorflowonspark import TFParallel

    TFParallel.run(spark.sparkContext, _tfoS_map_fun, Namespace(out=str(tmp_path), value=7), 2)
    assert sorted(os.listdir(tmp_path)) == ["run-0-of-2", "run-1-of-2"]
    assert (tmp_path / "run-1-of-2").read_text() == "7"
