"""What the driver shows while a job runs: node output, lifecycle, progress.

Node output lines keep their stream: a node's stdout goes to sys.stdout and
its stderr to sys.stderr, each line prefixed with the node's ``[role:index]``.
Ember's own messages and progress go to sys.stderr.  On a terminal, progress
is one line, rewritten in place, with an entry per node; otherwise each
report prints a line.  Streams are looked up at each write, so redirection
(pytest's capsys, notebooks) works.

Spark's own console progress bar (``spark.ui.showConsoleProgress``, on by default for
PySpark) is drawn by the JVM on the same terminal, without a newline: node lines printed after
it used to continue its line (``[Stage 1:> (0 + 2) / 2][worker:0] ...``).  So, while a job's
nodes print, the bar is held off (setting ``spark_progress``, ``spark.ember.console.sparkProgress``
= ``hide``, the default; ``show`` leaves it drawn), and on a terminal every line starts on a
cleared line of its own, whatever was drawn there.
"""
from __future__ import annotations

import os
import shutil
import sys
import threading
from typing import Any, Dict, Optional, TextIO, Tuple

_CLEAR_LINE = "\r\x1b[K"  # to column 0, erase the line: what a progress bar drew there goes


class _SparkBarHold:
    """Holds Spark's console progress bar off the screen while a job's nodes print.

    Spark draws its bar (``ConsoleProgressBar``, a JVM timer every 200 ms) only once 500 ms
    have passed since the bar was last finished; ``finishAll()`` erases it and restarts that
    delay (Spark calls it after each of its jobs).  Finishing it every 200 ms therefore keeps it
    off; once released, Spark draws it again for the user's own jobs.
    """

    PERIOD = 0.2  # seconds: well inside Spark's 500 ms delay

    def __init__(self, bar: Any):
        self._bar = bar
        self._released = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ember-spark-progress-hold", daemon=True)

    @classmethod
    def start_for_active_context(cls) -> Optional["_SparkBarHold"]:
        """A started hold on the active SparkContext's bar; None when there is no bar to hold
        (no context, the bar is off, or spark_progress is "show")."""
        try:
            from pyspark import SparkContext

            from ember import config
            sc = SparkContext._active_spark_context
            if sc is None or config.get("spark_progress", sc) != "hide":
                return None
            bar = sc._jsc.sc().progressBar()
            if not bar.isDefined():
                return None
            hold = cls(bar.get())
            hold._bar.finishAll()  # erased before the first node line is written
        except Exception:  # noqa: BLE001 - no pyspark, a stopped context: nothing to hold
            return None
        hold._thread.start()
        return hold

    def release(self) -> None:
        self._released.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2.0)

    def _run(self) -> None:
        # A ticker, not a wait: the bar is redrawn by a JVM timer that nothing here can block.
        while not self._released.wait(self.PERIOD):
            try:
                self._bar.finishAll()
            except Exception:  # noqa: BLE001 - the context stopped: nothing left to hold
                return


def _fmt(value: float) -> str:
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


class Console:
    """Thread-safe writer of a job's driver-side output."""

    def __init__(self, live: Optional[bool] = None):
        self._live = live
        self._lock = threading.Lock()
        self._spark_bar: Optional[_SparkBarHold] = None  # held while nodes print
        self._spark_bar_tried = False
        self._progress: Dict[str, str] = {}  # label -> compact progress text
        self._previous: Dict[str, Tuple[float, float]] = {}  # label -> (time, samples or step)
        self._live_shown = 0  # characters of the live line on screen

    def info(self, message: str) -> None:
        """An Ember message, e.g. 'all 2 nodes registered in 3.1s'."""
        self._write(sys.stderr, f"[ember] {message}")

    def node_line(self, label: str, stream: str, line: str) -> None:
        """One line of a node's stdout or stderr."""
        self._hold_spark_bar()
        self._write(sys.stderr if stream == "stderr" else sys.stdout, f"[{label}] {line}")

    def progress(self, label: str, metrics: Dict[str, float]) -> None:
        """A node's progress report: step, loss, samples/s and whatever else it sent."""
        self._hold_spark_bar()
        text = self._progress_text(label, metrics)
        if self._is_live():
            with self._lock:
                self._progress[label] = text
                self._redraw()
        else:
            self._write(sys.stderr, f"[{label}] progress: {text}")

    def clear_progress(self) -> None:
        """Removes the live line and lets Spark draw its bar again (at the end of a job)."""
        with self._lock:
            self._erase()
            self._progress.clear()
            hold, self._spark_bar, self._spark_bar_tried = self._spark_bar, None, False
        if hold is not None:
            hold.release()

    # -- internals ----------------------------------------------------------

    def _hold_spark_bar(self) -> None:
        """From a job's first node line or report on: Spark's bar held off (spark_progress)."""
        with self._lock:
            if self._spark_bar_tried:
                return
            self._spark_bar_tried = True
            self._spark_bar = _SparkBarHold.start_for_active_context()

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
                if _is_terminal(stream):  # a line of its own, even if Spark's bar is drawn there
                    line = _CLEAR_LINE + line
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


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False
