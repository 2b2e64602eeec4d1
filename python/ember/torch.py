"""PyTorch adapter of the data feed: ``DataFeed.to_torch_dataset`` (InputMode.SPARK)."""
from __future__ import annotations

import numpy as np


def feed_dataset(feed, batch_size: int, drop_remainder: bool = True, transform=None):
    """A ``torch.utils.data.IterableDataset`` over `feed` (an :class:`ember.feed.DataFeed`);
    each pass is one epoch (see ``DataFeed.epoch_batches``).

    Yields dicts of tensors (or whatever `transform` returns from a dict of numpy
    columns).  Use it with ``DataLoader(ds, batch_size=None)`` in the node's own
    process (``num_workers=0``: the feed is one reader).  The tensors share the
    feed's read-only Arrow memory (no copy): do not write into them in place.
    """
    import warnings

    import torch

    def to_tensors(cols):
        with warnings.catch_warnings():  # read-only on purpose: zero-copy from the feed
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in cols.items()
                    if v.dtype != object}

    class _FeedDataset(torch.utils.data.IterableDataset):
        def __iter__(self):
            for cols in feed.epoch_batches(batch_size, drop_remainder):
                yield transform(cols) if transform is not None else to_tensors(cols)

    return _FeedDataset()
