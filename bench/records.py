#!/usr/bin/env python
"""TFRecord read and write speed: Ember's C++ reader/writer vs tf.data vs the pure-Python
``tfrecord`` package (PyPI), on Fashion-MNIST-shaped tf.Examples, plus the bare read bandwidth.

Data: --mb (default 1100) MB of records {image: 784 raw bytes, label: int64}, written once
into a temporary directory by Ember (then read through the page cache: the file is read once
before any timing).  Each contender runs --repeats times, interleaved; medians are reported.

Read, into batches of numpy columns (image uint8 [B, 784], label int64 [B]), CRCs checked:
  ember   ember.data.tfrecord_batches(file, {image: RawBytes((784,)), label: FixedLenFeature}),
          one dataset iterated once per repeat, as a training loop iterates it once per epoch
          (from the second pass on, its file is still mapped: fs::MappingCache)
  ember_new  the same with a new dataset made for every pass (the file mapped each time)
  tfdata  tf.data.TFRecordDataset(file, buffer_size=8 MiB).batch(B).map(parse_example +
          decode_raw), as_numpy_iterator (TF checks both CRCs of every record)
  pyrec   tfrecord 1.14 (pure Python): tfrecord.reader.tfrecord_loader, batched with numpy;
          reads only the first --pyrec-mb MB (it is slow), and checks no CRC at all
  bare    the file read with 8 MiB readinto() calls: the limit for any reader
Write, from numpy columns of the same rows (--write-mb MB each):
  ember   ember._ember.ExampleWriter (tf.Example encoded from columns in C++)
  tfdata  tf.io.TFRecordWriter + tf.train.Example built per row (TF's documented way)
  pyrec   tfrecord.writer.TFRecordWriter (pure Python)

Last line: records_read_mb_per_sec: ember=<v> tfdata=<v> ratio=<ember/tfdata>

  .venv/bin/python bench/records.py                # ~3 min
  .venv/bin/python bench/records.py --mb 200 --repeats 1   # quick
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
PYREC_SITE = Path(__file__).resolve().parent / ".tfrecord-site"
PYREC_VERSION = "1.14.6"
CRC32C_VERSION = "2.9.post0"  # the tfrecord package's writer computes CRCs with it (a C extension)
RECORD_BYTES = 784


def ensure_pyrec(load: bool = True):
    if not (PYREC_SITE / "crc32c").exists():
        C.log(f"installing tfrecord=={PYREC_VERSION} crc32c=={CRC32C_VERSION} into {PYREC_SITE} (pip --target, no deps)")
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        "--upgrade", "--target", str(PYREC_SITE), f"tfrecord=={PYREC_VERSION}",
                        f"crc32c=={CRC32C_VERSION}"], check=True)
    if not load:
        return None
    if str(PYREC_SITE) not in sys.path:
        sys.path.append(str(PYREC_SITE))
    import tfrecord
    return tfrecord


def make_rows(n: int, seed: int = 7):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, RECORD_BYTES), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.int64)
    return images, labels


def columns(images, labels):
    n = len(labels)
    splits = np.arange(n + 1, dtype=np.int64)
    return [("image", "bytes", images.reshape(-1), splits * RECORD_BYTES, splits, None),
            ("label", "int64", labels, None, splits, None)]


def ember_write(path: str, images, labels, chunk: int = 8192) -> None:
    from ember import _ember
    from ember.data import _fs
    w = _ember.ExampleWriter.open(path, _fs.options_from("", ""), "none")
    for i in range(0, len(labels), chunk):
        w.write(columns(images[i:i + chunk], labels[i:i + chunk]))
    w.close()


def tf_write(tf, path: str, images, labels) -> None:
    with tf.io.TFRecordWriter(path) as w:
        for img, lab in zip(images, labels):
            ex = tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[img.tobytes()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(lab)]))}))
            w.write(ex.SerializeToString())


def pyrec_write(tfrecord, path: str, images, labels) -> None:
    w = tfrecord.TFRecordWriter(path)
    for img, lab in zip(images, labels):
        w.write({"image": (img.tobytes(), "byte"), "label": (int(lab), "int")})
    w.close()


def ember_batches(path: str, batch: int):
    """The file's batches, iterable once per epoch."""
    import tensorflow as tf

    import ember.data
    spec = {"image": ember.data.RawBytes((RECORD_BYTES,)), "label": tf.io.FixedLenFeature([], tf.int64)}
    return ember.data.tfrecord_batches(path, spec, batch, shard=(0, 1))


def ember_read(path: str, batch: int, batches=None) -> int:
    """One pass: over `batches` (a later epoch of one dataset), or a dataset made for it."""
    rows = 0
    for b in batches if batches is not None else ember_batches(path, batch):
        rows += len(b["label"])
        assert b["image"].shape[1] == RECORD_BYTES
    return rows


def tf_read(tf, path: str, batch: int) -> int:
    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(s):
        d = tf.io.parse_example(s, spec)
        return {"image": tf.io.decode_raw(d["image"], tf.uint8), "label": d["label"]}

    ds = tf.data.TFRecordDataset(path, buffer_size=8 << 20).batch(batch).map(parse)
    rows = 0
    for b in ds.as_numpy_iterator():
        rows += len(b["label"])
        assert b["image"].shape[1] == RECORD_BYTES
    return rows


def pyrec_read(tfrecord, path: str, batch: int, max_bytes: int) -> tuple:
    """Rows and bytes read by the pure-Python loader from the first max_bytes of the file."""
    rows, images, labels = 0, [], []
    per_record = os.path.getsize(path) / C_ROWS[path]
    limit = int(max_bytes / per_record)
    for ex in tfrecord.reader.tfrecord_loader(path, None, {"image": "byte", "label": "int"}):
        images.append(ex["image"])
        labels.append(ex["label"])
        if len(labels) == batch:
            np.stack(images), np.concatenate(labels)
            rows += batch
            images, labels = [], []
        if rows >= limit:
            break
    return rows, rows * per_record


def bare_read(path: str) -> int:
    buf = bytearray(8 << 20)
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            k = f.readinto(buf)
            if not k:
                return n
            n += k


C_ROWS: dict = {}


def timed(fn):
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t, time.process_time() - c


def pyrec_worker(argv) -> None:
    """Runs one pure-Python contender in its own process: the tfrecord package's protobuf
    descriptors clash with TensorFlow's (both register tensorflow.BytesList), so it cannot share
    a process with TF.  Prints a JSON line {secs, cpu, bytes}."""
    import json
    tfrecord = ensure_pyrec()
    mode, path, batch, amount = argv[0], argv[1], int(argv[2]), float(argv[3])
    if mode == "read":
        C_ROWS[path] = int(argv[4])
        (rows, nbytes), secs, cpu = timed(lambda: pyrec_read(tfrecord, path, batch, amount))
    else:
        images, labels = make_rows(int(amount), seed=1)
        _, secs, cpu = timed(lambda: pyrec_write(tfrecord, path, images, labels))
        nbytes = os.path.getsize(path)
    print(json.dumps({"secs": secs, "cpu": cpu, "bytes": nbytes}))


def run_pyrec(*argv) -> dict:
    import json
    out = subprocess.run([sys.executable, __file__, "--pyrec-worker", *map(str, argv)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--pyrec-worker":
        return pyrec_worker(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=1100)
    p.add_argument("--pyrec-mb", type=float, default=60)
    p.add_argument("--write-mb", type=float, default=100)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    import tensorflow as tf
    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    ensure_pyrec(load=False)  # installed once, imported only by the worker processes
    C.log(C.machine_info())
    tmp = Path(tempfile.mkdtemp(prefix="ember-bench-records-"))
    try:
        per_row = RECORD_BYTES + 40  # approximate framed Example size, refined after writing
        n = int(args.mb * 1e6 / per_row)
        path = str(tmp / "data.tfrecord")
        chunk = 100_000
        from ember import _ember
        from ember.data import _fs
        w = _ember.ExampleWriter.open(path, _fs.options_from("", ""), "none")
        for i in range(0, n, chunk):
            im, la = make_rows(min(chunk, n - i), seed=i)
            w.write(columns(im, la))
        w.close()
        size = os.path.getsize(path)
        C_ROWS[path] = n
        C.log(f"data: {n} records, {size / 1e6:.0f} MB in {path}")
        bare_read(path)  # into the page cache

        res = {k: [] for k in ("ember", "ember_new", "tfdata", "pyrec", "bare")}
        cpu = {k: [] for k in res}
        epochs = ember_batches(path, args.batch)  # one dataset, one pass per repeat, as in training
        for r in range(args.repeats):
            for name in ("bare", "ember", "ember_new", "tfdata", "pyrec"):
                if name == "bare":
                    nbytes, secs, c = timed(lambda: bare_read(path))
                elif name.startswith("ember"):
                    # ember_new: a new dataset per pass, which maps the file anew (and unmaps it
                    # inside its timing, when the dataset goes)
                    rows, secs, c = timed(lambda: ember_read(path, args.batch,
                                                             epochs if name == "ember" else None))
                    assert rows == n, (rows, n)
                    nbytes = size
                elif name == "tfdata":
                    rows, secs, c = timed(lambda: tf_read(tf, path, args.batch))
                    assert rows == n, (rows, n)
                    nbytes = size
                else:
                    r_ = run_pyrec("read", path, args.batch, args.pyrec_mb * 1e6, n)
                    nbytes, secs, c = r_["bytes"], r_["secs"], r_["cpu"]
                res[name].append(nbytes / 1e6 / secs)
                cpu[name].append(c / (nbytes / 1e9))
                C.log(f"read {name:6s} repeat {r + 1}: {nbytes / 1e6:.0f} MB in {secs:.2f}s = "
                      f"{res[name][-1]:.0f} MB/s (cpu {c:.2f}s)")

        m = min(n, int(args.write_mb * 1e6 / per_row))
        images, labels = make_rows(m, seed=1)
        wres = {k: [] for k in ("ember", "tfdata", "pyrec")}
        for r in range(args.repeats):
            for name in wres:
                out = str(tmp / f"w-{name}.tfrecord")
                if name == "ember":
                    _, secs, _ = timed(lambda: ember_write(out, images, labels))
                elif name == "tfdata":
                    _, secs, _ = timed(lambda: tf_write(tf, out, images, labels))
                else:
                    secs = run_pyrec("write", out, args.batch, m)["secs"]
                mb = os.path.getsize(out) / 1e6
                wres[name].append(mb / secs)
                C.log(f"write {name:6s} repeat {r + 1}: {m} records, {mb:.0f} MB in {secs:.2f}s = {wres[name][-1]:.0f} MB/s")
                os.unlink(out)

        med = {k: C.median(v) for k, v in res.items()}
        wmed = {k: C.median(v) for k, v in wres.items()}
        print(f"\nrepeats: {args.repeats}; medians in MB/s (CPU-s per GB read)")
        for k in ("ember", "ember_new", "tfdata", "pyrec", "bare"):
            print(f"  read  {k:9s} {med[k]:8.0f}  runs {[round(x) for x in res[k]]}  cpu/GB {C.median(cpu[k]):.2f}")
        for k in ("ember", "tfdata", "pyrec"):
            print(f"  write {k:7s} {wmed[k]:8.0f}  runs {[round(x) for x in wres[k]]}")
        print(f"read: ember/tfdata {med['ember'] / med['tfdata']:.2f}x, ember/pyrec {med['ember'] / med['pyrec']:.1f}x, "
              f"ember/bare {med['ember'] / med['bare']:.2f} (a new dataset per pass: "
              f"{med['ember_new'] / med['bare']:.2f}); write: ember/tfdata {wmed['ember'] / wmed['tfdata']:.1f}x, "
              f"ember/pyrec {wmed['ember'] / wmed['pyrec']:.1f}x")
        C.log(C.machine_info())
        print(f"records_read_mb_per_sec: ember={med['ember']:.0f} tfdata={med['tfdata']:.0f} "
              f"ratio={med['ember'] / med['tfdata']:.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
