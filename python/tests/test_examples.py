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
