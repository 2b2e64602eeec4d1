"""ember.data's TFRecord batches as a PyTorch IterableDataset, with real torch: tensors share the
decoded buffers, shards split the files, and a DataLoader(batch_size=None) passes them through."""
from __future__ import annotations

import numpy as np
import torch

import ember.data
from ember import _ember
from ember.data import _fs


def write_records(path, ids):
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids)
    pixels = (ids[:, None] + np.arange(6, dtype=np.int64)).astype(np.uint8)  # 6 raw bytes per row
    splits = np.arange(n + 1, dtype=np.int64)
    w = _ember.ExampleWriter.open(str(path), _fs.options_from("", ""), "none")
    w.write([("id", "int64", ids, None, splits, None),
             ("pixels", "bytes", pixels.reshape(-1), splits * 6, splits, None)])
    w.close()


def test_torch_dataset_batches_of_every_shard(tmp_path):
    for f in range(4):
        write_records(tmp_path / f"part-{f}.tfrecord", range(f * 10, f * 10 + 10))
    spec = {"id": ("int64", ()), "pixels": ember.data.RawBytes((2, 3))}
    seen = []
    for shard in range(2):
        ds = ember.data.tfrecord_batches(str(tmp_path), spec, 4, shard=(shard, 2)).to_torch_dataset()
        for batch in torch.utils.data.DataLoader(ds, batch_size=None):
            assert batch["id"].dtype == torch.int64 and batch["pixels"].dtype == torch.uint8
            assert batch["pixels"].shape == (len(batch["id"]), 2, 3)
            expected = (batch["id"][:, None] + torch.arange(6)).to(torch.uint8).reshape(-1, 2, 3)
            assert torch.equal(batch["pixels"], expected)
            seen.extend(batch["id"].tolist())
    assert sorted(seen) == list(range(40))


def test_torch_dataset_transform(tmp_path):
    write_records(tmp_path / "a.tfrecord", range(10))
    spec = {"id": ("int64", ()), "pixels": ember.data.RawBytes((6,))}
    ds = ember.data.tfrecord_batches(str(tmp_path / "a.tfrecord"), spec, 8, shard=(0, 1)).to_torch_dataset(
        transform=lambda b: (torch.from_numpy(b["pixels"]).float() / 255.0, torch.from_numpy(b["id"])))
    batches = list(ds)
    assert [len(y) for _, y in batches] == [8, 2]
    x, y = batches[0]
    assert x.shape == (8, 6) and abs(float(x[1, 0]) - 1 / 255.0) < 1e-7 and y.tolist() == list(range(8))


def test_parquet_batches_as_a_torch_dataset(tmp_path):
    """ember.data.parquet_batches(...).to_torch_dataset(): Arrow's read-only buffers become
    tensors torch may write to (copied), every row once over the shards, equal batch counts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for f in range(3):
        ids = np.arange(f * 30, f * 30 + 30, dtype=np.int64)
        x = pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 3).astype(np.float32)), 3)
        pq.write_table(pa.table({"id": ids, "x": x}), str(tmp_path / f"part-{f}.parquet"), row_group_size=10)
    seen, counts = [], []
    for shard in range(2):
        ds = ember.data.parquet_batches(str(tmp_path), batch_size=8, shard=(shard, 2), shuffle=True,
                                        equal_batches=True).to_torch_dataset()
        n = 0
        for batch in torch.utils.data.DataLoader(ds, batch_size=None):
            assert batch["x"].dtype == torch.float32 and batch["x"].shape == (8, 3)
            assert torch.equal(batch["x"][:, 0], batch["id"].float())
            batch["x"].add_(1)  # writable
            seen.extend(batch["id"].tolist())
            n += 1
        counts.append(n)
    assert counts[0] == counts[1] == 40 // 8 and len(set(seen)) == len(seen)  # 9 row groups of 10: 50 and 40 rows
