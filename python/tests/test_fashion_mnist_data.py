"""examples/fashion_mnist/data.py: IDX validation and the TFRecord conversion."""

from __future__ import annotations

import gzip
import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "fashion_mnist"))
import data  # noqa: E402

needs_dataset = pytest.mark.skipif(
    not (data.SOURCE_DIR / "t10k-labels-idx1-ubyte.gz").exists(),
    reason="Debian package dataset-fashion-mnist is not installed")


def _write_idx(path: Path, magic: int, shape: tuple, payload: bytes | None = None) -> Path:
    header = struct.pack(f">I{len(shape)}I", magic, *shape)
    if payload is None:
        payload = bytes(int(np.prod(shape)))
    with gzip.open(path, "wb") as f:
        f.write(header + payload)
    return path


def test_read_idx_returns_the_declared_shape(tmp_path):
    pixels = bytes(range(256)) * 3 + bytes(2 * 28 * 28 - 768)
    path = _write_idx(tmp_path / "ok.gz", 0x803, (2, 28, 28), pixels)
    images = data.read_idx(path, 0x803, 3)
    assert images.shape == (2, 28, 28) and images.dtype == np.uint8
    assert images.reshape(-1)[:256].tolist() == list(range(256))


@pytest.mark.parametrize("case, expected", [
    ("wrong_magic", "magic number 0x00000801, expected 0x00000803"),
    ("truncated", "but the header's shape (2, 28, 28) needs"),
    ("trailing", "but the header's shape (2, 28, 28) needs"),
    ("short_header", "shorter than the 16-byte IDX header"),
    ("not_gzip", "not a readable gzip file"),
    ("missing", "not found"),
])
def test_read_idx_names_the_file_and_the_problem(tmp_path, case, expected):
    path = tmp_path / f"{case}.gz"
    full = 2 * 28 * 28
    if case == "wrong_magic":
        _write_idx(path, 0x801, (2, 28, 28))
    elif case == "truncated":
        _write_idx(path, 0x803, (2, 28, 28), bytes(full - 1))
    elif case == "trailing":
        _write_idx(path, 0x803, (2, 28, 28), bytes(full + 1))
    elif case == "short_header":
        with gzip.open(path, "wb") as f:
            f.write(b"\x00\x00\x08\x03\x00")
    elif case == "not_gzip":
        path.write_bytes(b"plain bytes")
    with pytest.raises(data.DataError) as err:
        data.read_idx(path, 0x803, 3)
    assert str(path) in str(err.value)
    assert expected in str(err.value)


def test_load_split_rejects_a_wrong_count(tmp_path):
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", 0x803, (5, 28, 28))
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", 0x801, (5,))
    with pytest.raises(data.DataError, match=r"t10k-images-idx3-ubyte.gz: shape \(5, 28, 28\)"):
        data.load_split("test", tmp_path)


@needs_dataset
def test_convert_writes_shards_once_and_they_round_trip(tmp_path):
    import tensorflow as tf

    out = tmp_path / "fmnist"
    manifest = data.convert(out, train_shards=4, test_shards=2)
    assert manifest["converted"]
    assert data.shard_examples(out, "train") == [15_000] * 4
    assert data.num_examples(out, "test") == 10_000
    assert [Path(p).name for p in data.shard_paths(out, "test")] == [
        "part-00000-of-00002.tfrecord", "part-00001-of-00002.tfrecord"]
    # Nothing but the result is left beside it (the temp dir was renamed into place).
    assert os.listdir(tmp_path) == ["fmnist"]

    # A second call finds the valid conversion and writes nothing; other shard counts redo it.
    mtime = os.stat(data.shard_paths(out, "train")[0]).st_mtime_ns
    assert not data.convert(out, train_shards=4, test_shards=2)["converted"]
    assert os.stat(data.shard_paths(out, "train")[0]).st_mtime_ns == mtime
    # A damaged shard is noticed (its size no longer matches the manifest) and rewritten.
    with open(data.shard_paths(out, "test")[1], "ab") as f:
        f.write(b"x")
    assert data.convert(out, train_shards=4, test_shards=2)["converted"]

    # Records decode to the source images and labels, in order.
    images, labels = data.load_split("test", data.SOURCE_DIR)
    ds = tf.data.TFRecordDataset(data.shard_paths(out, "test")).map(data.parse_example)
    got = list(ds.take(3)) + list(ds.skip(9_999))
    for (image, label), j in zip(got, [0, 1, 2, 9_999]):
        assert image.shape == (28, 28, 1) and image.dtype == tf.float32
        np.testing.assert_allclose(image.numpy()[..., 0], images[j] / 255.0, rtol=1e-6)
        assert int(label) == int(labels[j])
