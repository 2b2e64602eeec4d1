"""What the driver's console shows while nodes run (real Spark, real TensorFlow, a real terminal).

* TensorFlow's INFO lines (its oneDNN notice, printed twice by every node that imports it) are
  left out of node output unless the user set TF_CPP_MIN_LOG_LEVEL for the nodes;
* Spark's console progress bar is never drawn into a node's line: held off while the nodes print
  (``spark.ember.console.sparkProgress=hide``, the default), or, with ``show``, every node line
  starts on a line of its own.  Checked on a pseudo-terminal, rendered as a terminal shows it.
"""
from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import textwrap
import time

import pytest

import ember
from conftest import LOCAL_MASTER, no_leftovers

pytestmark = pytest.mark.timeout(300)

ONEDNN = "oneDNN custom operations are on"


def _import_tensorflow(args, ctx):
    import os

    import tensorflow as tf
    print(f"level={os.environ.get('TF_CPP_MIN_LOG_LEVEL')} sum={int(tf.constant(1) + 1)}", flush=True)


def _run_tf_node(spark, capfd) -> str:
    capfd.readouterr()
    cluster = ember.Cluster.run(spark, _import_tensorflow, None, num_executors=1, reservation_timeout=120)
    cluster.shutdown(timeout=120)
    no_leftovers(cluster.job_id)
    out = capfd.readouterr()
    return out.out + out.err


def test_tensorflow_notices_are_left_out_of_node_output_unless_the_user_sets_the_level(spark_sessions, capfd):
    # The node's default level, unless this process's environment (which local[N] executors
    # inherit) sets one: then that level wins, as a user's does.
    level = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1")
    text = _run_tf_node(spark_sessions.get(LOCAL_MASTER), capfd)
    assert f"[worker:0] level={level} sum=2" in text
    if level != "0":
        assert ONEDNN not in text and "absl::InitializeLog" not in text, text
    # The user's level wins (here through spark.executorEnv, as on a cluster): TF's INFO lines show.
    spark = spark_sessions.get(LOCAL_MASTER, conf={"spark.executorEnv.TF_CPP_MIN_LOG_LEVEL": "0"})
    try:
        text = _run_tf_node(spark, capfd)
    finally:
        spark_sessions.stop()
    assert "[worker:0] level=0 sum=2" in text
    assert f"] {ONEDNN}" in text or ONEDNN in text, text


# -- Spark's progress bar on a terminal --------------------------------------------------------

_DRIVER = textwrap.dedent("""
    import os
    import sys
    import threading
    import time

    from pyspark.sql import SparkSession
    import ember

    spark = (SparkSession.builder.master("local[4]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "true").getOrCreate())  # as pyspark-shell has it
    spark.sparkContext.setLogLevel("ERROR")
    node = [sys.executable, "-c",
            "import time\\nfor i in range(20):\\n    print(f'line {i}', flush=True)\\n    time.sleep(0.3)"]
    # Two jobs, one session: first with Spark's bar shown while the nodes print, then held off
    # (the default); the setting is read when a job starts.
    for part, progress in ((1, "show"), (2, None)):
        if progress:
            os.environ["EMBER_CONSOLE_SPARK_PROGRESS"] = progress
        else:
            os.environ.pop("EMBER_CONSOLE_SPARK_PROGRESS", None)
        print(f"=== part {part} ===", flush=True)
        cluster = ember.Cluster.run(spark, node, num_executors=2, reservation_timeout=120)
        # Another Spark job while the nodes print (as feeding jobs do): its tasks end one by one, so
        # Spark redraws its bar as they do.
        other = threading.Thread(target=lambda: spark.sparkContext.parallelize(range(12), 12)
                                 .map(lambda x: (time.sleep(0.6), x)[1]).count())
        other.start()
        cluster.shutdown(timeout=120)
        other.join()
        print("job done", flush=True)
    spark.stop()
""")


@pytest.fixture(scope="module")
def terminal_parts(tmp_path_factory) -> dict:
    """The driver above run once on a pseudo-terminal: what the terminal received in each part
    ({1: bar shown, 2: bar held off})."""
    text = _run_on_a_terminal(tmp_path_factory.mktemp("console"))
    _, one, two = re.split(r"=== part \d ===\r?\n", text)
    return {1: one, 2: two}


def _run_on_a_terminal(tmp_path) -> str:
    """Runs the driver above on a pseudo-terminal; everything the terminal received."""
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    master, slave = pty.openpty()
    env = dict(os.environ, COLUMNS="100", LINES="40", TERM="xterm", PYSPARK_PYTHON=sys.executable)
    env.pop("EMBER_CONSOLE_SPARK_PROGRESS", None)
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env=env, cwd=tmp_path)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        os.close(master)
    text = b"".join(chunks).decode("utf-8", errors="replace")
    assert proc.returncode == 0, text[-4000:]
    return text


def _screen(text: str) -> list:
    """The lines a terminal shows for `text`: carriage returns, erase-line and newlines applied."""
    lines, col = [[]], 0
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\x1b":
            m = re.match(r"\x1b\[([0-9;?]*)([A-Za-z])", text[i:])
            if m:
                if m.group(2) == "K":
                    del lines[-1][col:]
                i += len(m.group(0))
                continue
        if c == "\r":
            col = 0
        elif c == "\n":
            lines.append([])
            col = 0
        else:
            row = lines[-1]
            row.extend(" " * (col - len(row)))
            if col < len(row):
                row[col] = c
            else:
                row.append(c)
            col += 1
        i += 1
    return ["".join(r) for r in lines]


def _node_lines(screen: list) -> list:
    return [line for line in screen if re.search(r"\[worker:\d\] line \d+", line)]


def test_node_lines_start_on_a_line_of_their_own_when_sparks_bar_is_shown(terminal_parts):
    text = terminal_parts[1]
    assert "[Stage " in text  # Spark drew its bar while the nodes printed: the case under test
    lines = _node_lines(_screen(text))
    assert len(lines) == 40, lines
    bad = [line for line in lines if not re.match(r"\[worker:\d\] line \d+ *$", line)]
    assert not bad, bad  # was: "[Stage 1:>   (0 + 2) / 2][worker:0] line 3"


def test_sparks_bar_is_held_off_while_nodes_print(terminal_parts):
    text = terminal_parts[2]
    first, last = text.index("[worker:"), text.rindex("line 19")
    assert "[Stage " not in text[first:last], text[first:last]
    assert len(_node_lines(_screen(text))) == 40
    assert "job done" in text
