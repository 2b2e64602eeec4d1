"""The examples keep their promises: the distributed twin of the single-process Keras script
differs from it by fewer than 10 lines (TFoS's "fewer than 10 lines changed")."""
from __future__ import annotations

import difflib
from pathlib import Path

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
