"""The examples keep their promises: the distributed twin of the single-process Keras script
differs from it by fewer than 10 lines (TFoS's "fewer than 10 lines changed")."""
from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "fashion_mnist"


def changed_lines(a: str, b: str) -> int:
    """Lines a user adds or rewrites to turn `a` into `b` (a rewritten line counts once)."""
    matcher = difflib.SequenceMatcher(None, a.splitlines(), b.splitlines(), autojunk=False)
    return sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal")


def test_main_is_train_single_with_fewer_than_10_lines_changed():
    single = (EXAMPLES / "train_single.py").read_text()
    distributed = (EXAMPLES / "main.py").read_text()
    n = changed_lines(single, distributed)
    assert 0 < n < 10, "".join(difflib.unified_diff(single.splitlines(True), distributed.splitlines(True),
                                                    "train_single.py", "main.py"))


def test_changed_lines_counts_rewrites_once():
    assert changed_lines("a\nb\nc\n", "a\nB\nc\nd\n") == 2
    assert changed_lines("a\n", "a\n") == 0


def test_the_wide_and_deep_example_learns_with_embeddings_on_the_ps_and_dense_layers_in_sync():
    """examples/criteo_wide_deep on a small Criteo-shaped DataFrame, as a user runs it (its own
    Spark local[4]): 1 ps node holding the embedding tables, 2 workers; it must beat always
    predicting the base rate by a clear margin."""
    import re
    import subprocess
    import sys

    script = EXAMPLES.parent / "criteo_wide_deep" / "wide_deep.py"
    run = subprocess.run([sys.executable, str(script), "--rows", "30000", "--epochs", "2"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    m = re.search(r"test AUC ([\d.]+), log loss ([\d.]+) \(always the base rate [\d.]+: ([\d.]+)\)", run.stdout)
    assert m, run.stdout[-3000:]
    auc, logloss, base = map(float, m.groups())
    assert auc > 0.7 and logloss < base - 0.05, (auc, logloss, base)
    assert "epoch 2: train log loss" in run.stdout + run.stderr


@pytest.mark.parametrize("api_mode", ["classic", "connect"])
def test_the_spark_mode_main_job_trains_and_infers_from_either_kind_of_session(tmp_path, api_mode):
    """examples/fashion_mnist/train_spark_mode.py (`make run`'s second program), unchanged, for one
    epoch: Spark feeds the Parquet DataFrame to 2 nodes (InputMode.SPARK), then the test
    DataFrame comes back with predictions.  Under Spark 4's SPARK_API_MODE=connect its builder
    starts a Spark Connect server on its master and the program runs from a Connect client
    (issue 22: the README's job from a Connect client); the program holds no SparkContext."""
    import re
    import subprocess
    import sys

    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_API_MODE=api_mode)
    run = subprocess.run([sys.executable, str(EXAMPLES / "train_spark_mode.py"), "--epochs", "1"],
                         env=env, capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    m = re.search(r"test_accuracy=([\d.]+)", run.stdout)
    assert m and float(m.group(1)) >= 0.75, run.stdout[-2000:]
    assert "train: 60000 rows" in run.stdout
    # Which kind of session the program's builder gave Ember (its console names a Connect session).
    assert ("from a Spark Connect session" in out) == (api_mode == "connect"), run.stderr[-3000:]
