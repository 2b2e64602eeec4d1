"""TensorBoard event files written by Ember's core, read by real TensorFlow
(``tf.compat.v1.train.summary_iterator``), served by a real TensorBoard process and drawn by a
real (headless) Chromium; and ``ctx.summary_writer()`` in the nodes of a real Spark job."""
from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import ember
import ember.summary
from conftest import no_leftovers
from ember import errors
from ember.context import Context

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT_COPY = REPO / "build" / "tensorboard_scalars.png"


def _events(path):
    """Every Event of one file, through TensorFlow's own reader."""
    import tensorflow as tf
    return list(tf.compat.v1.train.summary_iterator(str(path)))


def _event_files(directory) -> list:
    return sorted(Path(directory).glob("events.out.tfevents.*"))


def _png(width=8, height=4) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


# -- (a) TensorFlow reads what Ember writes ---------------------------------------------------


def test_tensorflow_reads_scalars_histograms_text_and_images(tmp_path):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    weights = rng.normal(1.0, 2.0, size=(32, 16))
    png = _png()
    with ember.summary.create_file_writer(str(tmp_path / "run"), flush_secs=0) as w:
        for step in range(5):
            w.scalar("loss", 1.0 / (step + 1), step)
        w.scalar("eval/accuracy", 0.875, 4)
        w.histogram("dense/kernel", weights, 4)
        w.text("notes", "learning rate **0.1**", 0)
        w.image("sample", png, 2)
    (path,) = _event_files(tmp_path / "run")
    assert path.name.startswith("events.out.tfevents.")
    assert w.uri == str(path)  # the local file system names files by path

    events = _events(path)
    assert events[0].file_version == "brain.Event:2"
    values = [(e.step, e.summary.value[0]) for e in events[1:]]
    assert len(values) == 9 == w.events_written - 1
    loss = [(s, v.simple_value) for s, v in values if v.tag == "loss"]
    assert loss == [(s, pytest.approx(1.0 / (s + 1), rel=1e-6)) for s in range(5)]
    (acc,) = [v for _, v in values if v.tag == "eval/accuracy"]
    assert acc.simple_value == 0.875

    ((step, hist),) = [(s, v) for s, v in values if v.tag == "dense/kernel"]
    h = hist.histo
    assert step == 4
    assert h.num == weights.size and sum(h.bucket) == weights.size
    assert h.min == weights.min() and h.max == weights.max()
    assert h.sum == pytest.approx(weights.sum()) and h.sum_squares == pytest.approx((weights ** 2).sum())
    assert list(h.bucket_limit) == sorted(h.bucket_limit)

    (text,) = [v for _, v in values if v.tag == "notes"]
    assert text.metadata.plugin_data.plugin_name == "text"
    assert tf.make_ndarray(text.tensor) == b"learning rate **0.1**"

    (image,) = [v for _, v in values if v.tag == "sample"]
    assert (image.image.height, image.image.width, image.image.colorspace) == (4, 8, 3)
    assert image.image.encoded_image_string == png
    assert all(e.wall_time >= events[0].wall_time for e in events)


def test_errors_are_python_exceptions_naming_what_failed(tmp_path):
    w = ember.summary.EventWriter(str(tmp_path / "logs"))
    with pytest.raises(ValueError, match="layer1/bias"):
        w.histogram("layer1/bias", [1.0, float("nan")], 0)
    w.close()
    w.close()  # idempotent
    with pytest.raises(errors.InvalidArgument, match="closed"):
        w.scalar("loss", 1.0, 1)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(errors.EmberError, match="a_file/logs"):  # the core's error, with the path
        ember.summary.EventWriter(str(tmp_path / "a_file" / "logs"))


def test_context_summary_writer_needs_a_log_dir(tmp_path):
    ctx = Context(0, "worker", 0, {"worker": ["h:1"]}, "file:///", str(tmp_path), log_dir=None)
    with pytest.raises(RuntimeError, match="log_dir"):
        ctx.summary_writer()
    ctx = Context(0, "worker", 3, {"worker": ["h:1"]}, "file:///", str(tmp_path), log_dir="logs")
    w = ctx.summary_writer()
    assert ctx.summary_writer() is w
    assert w.uri.startswith(f"{tmp_path}/logs/worker_3/events.out.tfevents.")
    ctx._close()
    with pytest.raises(ValueError):
        w.scalar("loss", 1.0, 1)


def test_event_files_on_hdfs(hdfs, tmp_path):
    """A log dir on a real HDFS (WebHDFS through the core's FileSystem layer), written through
    ctx.summary_writer() as a node with fs.defaultFS = hdfs:// would; read back by TF."""
    import uuid

    from ember import _ember

    job = f"/summaries/{uuid.uuid4().hex[:8]}"
    ctx = Context(0, "chief", 0, {"chief": ["h:1"]}, hdfs.default_fs, str(tmp_path), log_dir=job,
                  hdfs_http_address=hdfs.http_address)
    assert ctx.log_dir == f"{hdfs.default_fs}{job}"
    w = ctx.summary_writer(flush_secs=0)
    for step in range(50):
        w.scalar("loss", step * 0.5, step)
    w.histogram("w", np.arange(10.0), 49)
    w.flush()
    ctx._close()
    assert w.uri.startswith(f"{hdfs.default_fs}{job}/chief_0/events.out.tfevents.")
    resolve = ember.summary.resolve_options(hdfs.default_fs, hdfs.http_address)
    local = tmp_path / "copy.tfevents"
    local.write_bytes(_ember.fs_read_file(w.uri, resolve))
    events = _events(local)
    assert events[0].file_version == "brain.Event:2"
    assert [(e.step, e.summary.value[0].simple_value) for e in events[1:51]] == [
        (s, s * 0.5) for s in range(50)]
    assert events[51].summary.value[0].histo.num == 10


# -- (b), (c) a real TensorBoard serves it, a real browser draws it ---------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read().decode())


def _stop(proc: subprocess.Popen) -> None:
    """Kills `proc`'s whole process group (it was started in a new session) and reaps it."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    """A real TensorBoard on a free loopback port over a log dir Ember wrote: run `run1` with
    `loss` = 10 - step/10 for steps 0..99, a histogram, a text and an image.  Yields (base URL,
    log dir)."""
    logdir = tmp_path_factory.mktemp("tb")
    with ember.summary.create_file_writer(str(logdir / "run1")) as w:
        for step in range(100):
            w.scalar("loss", 10.0 - step / 10.0, step)
            if step % 10 == 0:
                w.histogram("weights", np.linspace(-1, 1, 50) * (1 + step / 100), step)
        w.text("notes", "written by **Ember**", 0)
        w.image("sample", _png(), 0)
    port = _free_port()
    log = open(logdir.parent / "tensorboard.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
         "--port", str(port), "--reload_interval", "1"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"TensorBoard exited: {(logdir.parent / 'tensorboard.log').read_text()}"
            try:
                _get_json(base + "/data/runs")
                break
            except OSError:
                assert time.monotonic() < deadline, "TensorBoard did not answer within 120 s"
                time.sleep(0.5)
        yield base, logdir
    finally:
        _stop(proc)
        log.close()


def test_tensorboard_serves_the_scalars_ember_wrote(tensorboard):
    base, _ = tensorboard
    query = urllib.parse.urlencode({"run": "run1", "tag": "loss"})
    deadline = time.monotonic() + 120
    points = []
    while len(points) < 100:  # TensorBoard loads the files in the background
        assert time.monotonic() < deadline, f"TensorBoard served {len(points)} of 100 points in 120 s"
        try:
            points = _get_json(f"{base}/data/plugin/scalars/scalars?{query}")
        except urllib.error.HTTPError:  # 400 until the run/tag is loaded
            points = []
        if len(points) < 100:
            time.sleep(0.5)
    assert "run1" in _get_json(base + "/data/runs")
    assert "loss" in _get_json(base + "/data/plugin/scalars/tags")["run1"]
    assert [p[1] for p in points] == list(range(100))
    assert [p[2] for p in points] == pytest.approx([10.0 - s / 10.0 for s in range(100)], rel=1e-6)
    # The other dashboards see theirs (histograms and images through TensorBoard's data_compat).
    assert "weights" in _get_json(base + "/data/plugin/histograms/tags").get("run1", {})
    assert "sample" in _get_json(base + "/data/plugin/images/tags").get("run1", {})
    assert "notes" in _get_json(base + "/data/plugin/text/tags").get("run1", [])
    text = _get_json(f"{base}/data/plugin/text/text?{urllib.parse.urlencode({'run': 'run1', 'tag': 'notes'})}")
    assert "<strong>Ember</strong>" in text[0]["text"]  # the markdown, rendered by TensorBoard


def test_chromium_draws_the_scalars_chart(tensorboard, tmp_path):
    from PIL import Image

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is missing: scripts/setup_system.sh installs it"
    base, _ = tensorboard
    # Loaded (the scalars test may not have run first): the page then draws at once.
    deadline = time.monotonic() + 120
    while "loss" not in _get_json(base + "/data/plugin/scalars/tags").get("run1", {}):
        assert time.monotonic() < deadline, "TensorBoard did not load run1/loss in 120 s"
        time.sleep(0.5)
    shot = tmp_path / "tensorboard_scalars.png"
    proc = subprocess.Popen(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,800",
         "--virtual-time-budget=15000", f"--screenshot={shot}", f"{base}/?darkMode=false#scalars"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        _stop(proc)
    assert shot.exists(), f"no screenshot: {out.decode(errors='replace')[-2000:]}"
    SCREENSHOT_COPY.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, SCREENSHOT_COPY)
    print(f"TensorBoard screenshot: {shot} (copied to {SCREENSHOT_COPY})")

    img = Image.open(shot).convert("RGB")
    assert img.size == (1200, 800)
    colors = img.getcolors(maxcolors=1 << 20)
    assert len(colors) > 50, "the page is (almost) one colour: blank or still loading"
    # The plotted line: TensorBoard draws the only run in its palette's first colour, #ff7043;
    # below the header, right of the sidebar (where the checkbox and slider share that hue),
    # those pixels must make a line across the chart, falling from step 0 to step 99.
    ys, xs = _line_pixels(img)
    assert len(xs) > 150, f"only {len(xs)} pixels of the run's colour: no chart drawn"
    assert xs.max() - xs.min() > 150 and ys.max() - ys.min() > 80, "the run's pixels make no line"
    left, right = ys[xs < xs.min() + 20].mean(), ys[xs > xs.max() - 20].mean()
    assert left < right, "loss falls, so the line must go down (image y grows downwards)"


def _line_pixels(img):
    arr = np.asarray(img).astype(int)[70:, 310:]
    hits = np.abs(arr - np.array([0xff, 0x70, 0x43])).sum(axis=2) < 40
    ys, xs = np.nonzero(hits)
    return ys + 70, xs + 310


# -- (d) ctx.summary_writer() in the nodes of a real job --------------------------------------


def write_node_summaries(args, ctx):
    w = ctx.summary_writer(flush_secs=0.2)
    assert ctx.summary_writer() is w
    for step in range(args["steps"]):
        w.scalar("loss", ctx.task_index * 100 + step, step)
    w.text("node", f"{ctx.job_name}:{ctx.task_index}", 0)
    # no close: the node's end flushes and closes it


def test_nodes_write_their_own_event_files(spark, tmp_path):
    log_dir = tmp_path / "logs"
    cluster = ember.Cluster.run(spark, write_node_summaries, {"steps": 20}, num_executors=2,
                                log_dir=str(log_dir), reservation_timeout=60)
    cluster.shutdown(timeout=60)
    assert sorted(p.name for p in log_dir.iterdir()) == ["worker_0", "worker_1"]
    for index in range(2):
        (path,) = _event_files(log_dir / f"worker_{index}")
        events = _events(path)
        assert events[0].file_version == "brain.Event:2"
        loss = [(e.step, e.summary.value[0].simple_value) for e in events[1:]
                if e.summary.value[0].tag == "loss"]
        assert loss == [(s, float(index * 100 + s)) for s in range(20)]
        (node,) = [e for e in events[1:] if e.summary.value[0].tag == "node"]
        assert node.summary.value[0].tensor.string_val == [f"worker:{index}".encode()]
    no_leftovers(cluster.job_id)
