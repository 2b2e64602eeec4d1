"""Writes the TFRecord golden files of src/record/testdata/ with real TensorFlow.

Run from the repository root:  .venv/bin/python python/tests/data/make_tfrecord_golden.py
The C++ tests (src/record/golden_test.cc) read the files with Ember and compare
with expected.txt, which this script writes from the same values, one line per
fact:

  file <name> <compression> <records>          a file and how many records it holds
  feature <row> <name> <kind> <hex values...>  a feature present in Example <row>
                                               (bytes: hex of each value, "-" for b"";
                                               float: repr; int64: decimal)
  missing <row> <name>                         a feature Example <row> lacks
  payload <index> <length> <crc32>             a record of payloads.tfrecord: its length
                                               and zlib's CRC-32 of its bytes
"""
import os
import struct
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "src", "record", "testdata")

# name -> (kind, value per row; None = the row lacks the feature)
FEATURES = {
    "label": ("int64", [[3], [7], [0]]),
    "score": ("float", [[0.5], [-1.25], [3.0e38]]),
    "name": ("bytes", [[b"alpha"], [b"beta"], None]),
    "vec": ("float", [[1.0, 2.0, 3.0], [4.0, 5.5, -6.0], [0.0, 0.0, 0.0]]),
    "ids": ("int64", [[1, -2, 3000000000], [], [-(2**63), 2**63 - 1]]),
    "tags": ("bytes", [[b"a", b"", b"\xff\x00"], [b"x"], []]),
    "empty": ("float", [[], [], []]),
    "sparse": ("int64", [None, [42], None]),
}
ROWS = 3

PAYLOADS = [b"", b"not an Example", bytes(range(256)), b"\x00" * 70000]


def feature(kind, values):
    if kind == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    if kind == "float":
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))


def examples():
    out = []
    for row in range(ROWS):
        feats = {}
        for name, (kind, rows) in FEATURES.items():
            if rows[row] is not None:
                feats[name] = feature(kind, rows[row])
        out.append(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
    return out


def write(name, records, compression):
    opts = tf.io.TFRecordOptions(compression_type=compression)
    with tf.io.TFRecordWriter(os.path.join(OUT, name), opts) as w:
        for r in records:
            w.write(r)


def fmt(kind, v):
    if kind == "bytes":
        return v.hex() or "-"
    if kind == "float":
        return repr(struct.unpack("<f", struct.pack("<f", v))[0])  # the float32 value
    return str(v)


def main():
    os.makedirs(OUT, exist_ok=True)
    exs = examples()
    files = [("examples.tfrecord", ""), ("examples.tfrecord.gz", "GZIP"), ("examples.tfrecord.zlib", "ZLIB")]
    lines = []
    for name, comp in files:
        write(name, exs, comp)
        lines.append(f"file {name} {comp.lower() or 'none'} {len(exs)}")
    write("payloads.tfrecord", PAYLOADS, "")
    lines.append(f"file payloads.tfrecord none {len(PAYLOADS)}")
    for row in range(ROWS):
        for name, (kind, rows) in sorted(FEATURES.items()):
            if rows[row] is None:
                lines.append(f"missing {row} {name}")
            else:
                lines.append(" ".join([f"feature {row} {name} {kind}"] + [fmt(kind, v) for v in rows[row]]))
    for i, p in enumerate(PAYLOADS):
        lines.append(f"payload {i} {len(p)} {zlib.crc32(p)}")
    with open(os.path.join(OUT, "expected.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    # Sanity: TF reads back what it wrote.
    for name, comp in files:
        n = sum(1 for _ in tf.data.TFRecordDataset(os.path.join(OUT, name), compression_type=comp))
        assert n == len(exs), (name, n)
    print(f"wrote {len(files) + 1} files and expected.txt into {os.path.normpath(OUT)} (TF {tf.__version__})")


if __name__ == "__main__":
    main()
