"""What the driver shows while a job runs: node output, lifecycle, progress.

Node output lines keep their stream: a node's stdout goes to sys.stdout and
its stderr to sys.stderr, each line prefixed with the node's ``[role:index]``.
Ember's own messages and progress go to sys.stderr.  On a terminal, progress
is one line, rewritten in place, with an entry per node; otherwise each
report prints a line.  Streams are looked up at each write, so redirection
(pytest's capsys, notebooks) works.
"""
from __future__ import annotations

import shutil
import sys
import threading
from typing import Dict, Optional, TextIO, Tuple


def _fmt(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


class Console:
    """Thread-safe writer of a job's driver-side output."""

    def __init__(self, live: Optional[bool] = None):
        self._live = live
        self._lock = threading.Lock()
        self._progress: Dict[str, str] = {}  # label -> compact progress text
        self._previous: Dict[str, Tuple[float, float]] = {}  # label -> (time, samples or step)
        self._live_shown = 0  # characters of the live line on screen

    def info(self, message: str) -> None:
        """An Ember message, e.g. 'all 2 nodes registered in 3.1s'."""
        self._write(sys.stderr, f"[ember] {message}")

    def node_line(self, label: str, stream: str, line: str) -> None:
        """One line of a node's stdout or stderr."""
        self._write(sys.stderr if stream == "stderr" else sys.stdout, f"[{label}] {line}")

    def progress(self, label: str, metrics: Dict[str, float]) -> None:
        """A node's progress report: step, loss, samples/s and whatever else it sent."""
        text = self._progress_text(label, metrics)
        if self._is_live():
            with self._lock:
                self._progress[label] = text
                self._redraw()
        else:
            self._write(sys.stderr, f"[{label}] progress: {text}")

    def clear_progress(self) -> None:
        """Removes the live line (at the end of a job)."""
        with self._lock:
            self._erase()
            self._progress.clear()

    # -- internals ----------------------------------------------------------

    def _progress_text(self, label: str, metrics: Dict[str, float]) -> str:
        m = dict(metrics)
        now = m.pop("time", None)
        parts = []
        if "step" in m:
            parts.append(f"step={_fmt(m.pop('step'))}")
        if "loss" in m:
            parts.append(f"loss={m.pop('loss'):.4f}")
        rate_key = "samples" if "samples" in metrics else "step" if "step" in metrics else None
        if now is not None and rate_key is not None:
            count = metrics[rate_key]
            before = self._previous.get(label)
            self._previous[label] = (now, count)
            if before is not None and now > before[0] and count >= before[1]:
                unit = "samples/s" if rate_key == "samples" else "steps/s"
                parts.append(f"{unit}={(count - before[1]) / (now - before[0]):.1f}")
        m.pop("samples", None)
        parts.extend(f"{k}={_fmt(v)}" for k, v in sorted(m.items()))
        return " ".join(parts)

    def _is_live(self) -> bool:
        if self._live is not None:
            return self._live
        try:
            return sys.stderr.isatty()
        except (AttributeError, ValueError):
            return False

    def _write(self, stream: TextIO, line: str) -> None:
        with self._lock:
            self._erase()
            try:
                stream.write(line + "\n")
                stream.flush()
            except (OSError, ValueError):
                pass
            self._redraw()

    def _erase(self) -> None:  # requires _lock
        if self._live_shown:
            try:
                sys.stderr.write("\r" + " " * self._live_shown + "\r")
            except (OSError, ValueError):
                pass
            self._live_shown = 0

    def _redraw(self) -> None:  # requires _lock
        if not self._progress or not self._is_live():
            return
        self._erase()
        line = " | ".join(f"{label} {text}" for label, text in sorted(self._progress.items()))
        line = line[: max(20, shutil.get_terminal_size().columns - 1)]  # one screen line: \r erases it
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):
            return
        self._live_shown = len(line)
