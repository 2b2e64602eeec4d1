"""Fashion-MNIST: IDX gzip files -> sharded TFRecord files of tf.train.Example.

Each record holds one image and its label:

    image: bytes_list, 784 raw uint8 pixels (28x28, row-major, 0 = background)
    label: int64_list, class id 0..9

Layout under ``data_dir``::

    train/part-00000-of-00008.tfrecord ...   60,000 examples
    test/part-00000-of-00001.tfrecord        10,000 examples
    manifest.json                            shard names, sizes and example counts

The conversion is idempotent: if ``manifest.json`` is present and every shard it names exists with
the recorded size, nothing is written. Otherwise everything is written into a temporary directory
beside ``data_dir`` and renamed into place, so a reader never sees a half-written data set.

Run ``python examples/fashion_mnist/data.py`` to convert (``--help`` for options).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

SOURCE_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian package dataset-fashion-mnist
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "fashion_mnist"
IMAGE_SHAPE = (28, 28)
NUM_CLASSES = 10
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
               "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")

# IDX magic numbers: two zero bytes, the element type (0x08 = unsigned byte), the number of dims.
_IMAGES_MAGIC = 0x00000803
_LABELS_MAGIC = 0x00000801
_SPLITS = {
    # split: (images file, labels file, expected count)
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 60_000),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 10_000),
}
_MANIFEST = "manifest.json"
_FORMAT_VERSION = 1


class DataError(ValueError):
    """A source file is missing or malformed; the message names the file."""


def read_idx(path: Path, magic: int, dims: int) -> np.ndarray:
    """Reads a gzip-compressed IDX file of unsigned bytes into an array of ``dims`` dimensions.

    Raises DataError naming ``path`` if the file is missing, not gzip, has the wrong magic number,
    or holds more or fewer bytes than its header declares.
    """
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise DataError(f"{path}: not found (install the Debian package dataset-fashion-mnist "
                        f"or pass --source-dir)") from None
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: not a readable gzip file: {e}") from None
    header_len = 4 + 4 * dims
    if len(raw) < header_len:
        raise DataError(f"{path}: {len(raw)} bytes, shorter than the {header_len}-byte IDX header")
    header = np.frombuffer(raw, dtype=">u4", count=1 + dims)
    if int(header[0]) != magic:
        raise DataError(f"{path}: IDX magic number {int(header[0]):#010x}, expected {magic:#010x}")
    shape = tuple(int(d) for d in header[1:])
    expected = header_len + int(np.prod(shape, dtype=np.int64))
    if len(raw) != expected:
        raise DataError(f"{path}: {len(raw)} bytes, but the header's shape {shape} needs {expected}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header_len).reshape(shape)


def load_split(split: str, source_dir: Path = SOURCE_DIR) -> tuple[np.ndarray, np.ndarray]:
    """Returns (images uint8 [N, 28, 28], labels uint8 [N]) of ``split`` ("train" or "test")."""
    images_name, labels_name, count = _SPLITS[split]
    images_path, labels_path = Path(source_dir) / images_name, Path(source_dir) / labels_name
    images = read_idx(images_path, _IMAGES_MAGIC, 3)
    labels = read_idx(labels_path, _LABELS_MAGIC, 1)
    if images.shape != (count, *IMAGE_SHAPE):
        raise DataError(f"{images_path}: shape {images.shape}, expected {(count, *IMAGE_SHAPE)}")
    if labels.shape != (count,):
        raise DataError(f"{labels_path}: {labels.shape[0]} labels, expected {count}")
    if labels.max(initial=0) >= NUM_CLASSES:
        raise DataError(f"{labels_path}: label {int(labels.max())} outside 0..{NUM_CLASSES - 1}")
    return images, labels


def shard_name(index: int, num_shards: int) -> str:
    return f"part-{index:05d}-of-{num_shards:05d}.tfrecord"


def _write_shards(tf, out_dir: Path, images: np.ndarray, labels: np.ndarray,
                  num_shards: int) -> list[dict]:
    out_dir.mkdir(parents=True)
    shards = []
    # Contiguous, near-equal slices; the source order is already shuffled across classes.
    for i, idx in enumerate(np.array_split(np.arange(len(labels)), num_shards)):
        path = out_dir / shard_name(i, num_shards)
        with tf.io.TFRecordWriter(str(path)) as writer:
            for j in idx:
                example = tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[images[j].tobytes()])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(labels[j])])),
                }))
                writer.write(example.SerializeToString())
        shards.append({"file": path.name, "examples": len(idx), "bytes": path.stat().st_size})
    return shards


def _valid_manifest(data_dir: Path, train_shards: int, test_shards: int) -> dict | None:
    """Returns the manifest if ``data_dir`` holds a complete conversion with these shard counts."""
    try:
        manifest = json.loads((data_dir / _MANIFEST).read_text())
        if manifest.get("format_version") != _FORMAT_VERSION:
            return None
        for split, want in (("train", train_shards), ("test", test_shards)):
            info = manifest["splits"][split]
            if len(info["shards"]) != want or sum(s["examples"] for s in info["shards"]) != _SPLITS[split][2]:
                return None
            for s in info["shards"]:
                if (data_dir / split / s["file"]).stat().st_size != s["bytes"]:
                    return None
        return manifest
    except (OSError, ValueError, KeyError, TypeError):
        return None


def is_uri(data_dir: Path | str) -> bool:
    """``hdfs://...``-style data sets are made elsewhere (e.g. copied up by the caller)."""
    return "://" in str(data_dir)


def absolute(data_dir: Path | str) -> str:
    """``data_dir`` as an absolute local path, or the URI unchanged."""
    return str(data_dir) if is_uri(data_dir) else str(Path(data_dir).resolve())


def convert(data_dir: Path | str = DEFAULT_DATA_DIR, source_dir: Path | str = SOURCE_DIR,
            train_shards: int = 8, test_shards: int = 1, force: bool = False) -> dict | None:
    """Converts the IDX files in ``source_dir`` into TFRecord shards under ``data_dir``; for a
    URI ``data_dir`` (``hdfs://...``) does nothing and returns None: the shards are already there.

    Skips the work if ``data_dir`` already holds a valid conversion with the same shard counts
    (unless ``force``). Returns the manifest (a dict; ``manifest["converted"]`` tells whether this
    call wrote anything). Raises DataError for a missing or malformed source file.
    """
    if is_uri(data_dir):
        return None
    data_dir, source_dir = Path(data_dir).resolve(), Path(source_dir)
    if not force:
        manifest = _valid_manifest(data_dir, train_shards, test_shards)
        if manifest is not None:
            return {**manifest, "converted": False}

    import tensorflow as tf  # imported late: validating an existing conversion needs no TF

    start = time.monotonic()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{data_dir.name}.tmp-", dir=data_dir.parent))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; executors may run as another user
        splits = {}
        for split, num_shards in (("train", train_shards), ("test", test_shards)):
            images, labels = load_split(split, source_dir)
            splits[split] = {"shards": _write_shards(tf, tmp / split, images, labels, num_shards)}
        manifest = {"format_version": _FORMAT_VERSION, "source_dir": str(source_dir),
                    "image_shape": list(IMAGE_SHAPE), "num_classes": NUM_CLASSES, "splits": splits}
        (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        # Swap in atomically: move the old directory aside, rename the new one, drop the old.
        old = None
        if data_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{data_dir.name}.old-", dir=data_dir.parent))
            os.rename(data_dir, old / data_dir.name)
        os.rename(tmp, data_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {**manifest, "converted": True, "convert_secs": time.monotonic() - start}


def shard_paths(data_dir: Path | str, split: str) -> list[str]:
    """Absolute paths of ``split``'s shards, in order, as recorded in the manifest.  For a URI
    (``hdfs://...``): the split's directory, whose files ember.data lists itself."""
    if is_uri(data_dir):
        return [f"{str(data_dir).rstrip('/')}/{split}"]
    data_dir = Path(data_dir)
    manifest = json.loads((data_dir / _MANIFEST).read_text())
    return [str(data_dir / split / s["file"]) for s in manifest["splits"][split]["shards"]]


def shard_examples(data_dir: Path | str, split: str) -> list[int]:
    """Number of examples in each of ``split``'s shards (same order as shard_paths)."""
    manifest = json.loads((Path(data_dir) / _MANIFEST).read_text())
    return [s["examples"] for s in manifest["splits"][split]["shards"]]


def num_examples(data_dir: Path | str, split: str) -> int:
    """Number of examples in ``split``, as recorded in the manifest."""
    return sum(shard_examples(data_dir, split))


def ember_features() -> dict:
    """The records' features for ember.data.tfrecord_dataset: the image's 784 bytes as a uint8
    [28, 28] array (no decode_raw, no copy) and the label."""
    import tensorflow as tf

    import ember.data
    return {"image": ember.data.RawBytes(IMAGE_SHAPE), "label": tf.io.FixedLenFeature([], tf.int64)}


def parse_batch(batch):
    """tf.data map function: an ember.data batch -> (float32 [B, 28, 28, 1] in [0, 1], int64 [B])."""
    import tensorflow as tf

    return tf.cast(batch["image"][..., None], tf.float32) / 255.0, batch["label"]


def parse_example(serialized):
    """tf.data map function: serialized tf.train.Example -> (float32 [28, 28, 1] in [0, 1], int64)."""
    import tensorflow as tf

    features = tf.io.parse_single_example(serialized, {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
    })
    image = tf.io.decode_raw(features["image"], tf.uint8)
    image = tf.cast(tf.reshape(image, (*IMAGE_SHAPE, 1)), tf.float32) / 255.0
    return image, features["label"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source-dir", default=str(SOURCE_DIR), help="directory of the IDX .gz files")
    p.add_argument("--data-dir", default=str(DEFAULT_DATA_DIR), help="output directory")
    p.add_argument("--train-shards", type=int, default=8)
    p.add_argument("--test-shards", type=int, default=1)
    p.add_argument("--force", action="store_true", help="convert even if a valid conversion exists")
    a = p.parse_args(argv)
    m = convert(a.data_dir, a.source_dir, a.train_shards, a.test_shards, a.force)
    counts = {s: sum(x["examples"] for x in m["splits"][s]["shards"]) for s in m["splits"]}
    what = f"converted in {m['convert_secs']:.1f}s" if m["converted"] else "already converted"
    print(f"{a.data_dir}: {what}: {counts}")


if __name__ == "__main__":
    main()
