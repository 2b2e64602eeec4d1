"""TensorFlow adapter of the data feed: ``DataFeed.to_tf_dataset`` (InputMode.SPARK)."""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Union

import numpy as np


def _keep_freed_memory() -> None:
    """Undoes the malloc setting TensorFlow applies when it builds a generator dataset.

    tf.data sets glibc's M_TRIM_THRESHOLD to 128 KiB, which also freezes the mmap
    threshold there: every activation, gradient and feed buffer over 128 KiB becomes a
    fresh mmap, page-faulted in and unmapped per step.  Measured in bench/e2e_feed.py,
    that halved a node's training speed; raising both thresholds restores it.
    A no-op where glibc is not the allocator.
    """
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 64 << 20)
    mallopt(m_trim_threshold, 256 << 20)


def feed_dataset(feed, batch_size: int, features: Optional[Union[str, Sequence[str]]] = None,
                 label: Optional[str] = None, drop_remainder: Optional[bool] = None, transform=None,
                 validation: bool = False, device: Optional[str] = None):
    """A ``tf.data.Dataset`` over `feed` (an :class:`ember.feed.DataFeed`); each pass over it is
    one epoch of ``cluster.train``.

    Args:
        feed: the node's DataFeed (``ctx.get_data_feed()``).
        batch_size: rows per batch on this node (per-replica batch).
        features: column name or list of names for the model input (default: every
            column but `label`); a list gives a dict of tensors.
        label: column holding the label, or None for no label.
        drop_remainder: yield only full batches, the same count on every node; default
            True for training, False for validation (evaluation needs no equal steps).
        transform: optional function(dict of numpy columns) -> (x, y) or x, applied on
            this side of TensorFlow (e.g. reshape image bytes, scale to [0, 1]).
        validation: each pass reads the validation epoch fed after the training epoch just
            read (``cluster.train(validation_data=...)``): pass it as Keras's
            ``validation_data``.  Its columns must be the training data's.
        device: e.g. ``"/gpu:0"``: batches are prefetched onto that device
            (``tf.data.experimental.prefetch_to_device``, the dataset's last step), so the
            copy overlaps the model's work.  None: Keras copies each batch when it runs.

    Use ``model.fit(ds, epochs=num_epochs)`` with the num_epochs given to cluster.train.
    Auto-sharding is off: every node already gets its own share of the data.

    Raises:
        ValueError: the feed ended before any data arrived.
    """
    import tensorflow as tf

    first = feed._peek_columns()
    if first is None:
        raise ValueError(f"node {feed._node}: the feed ended before any data arrived")

    def shape_batch(cols: Dict[str, np.ndarray]):
        if transform is not None:
            return transform(cols)
        names = [c for c in cols if c != label] if features is None else features
        x = cols[names] if isinstance(names, str) else (
            cols[names[0]] if len(names) == 1 else {n: cols[n] for n in names})
        return x if label is None else (x, cols[label])

    def spec(value):
        if isinstance(value, dict):
            return {k: spec(v) for k, v in value.items()}
        if isinstance(value, tuple):
            return tuple(spec(v) for v in value)
        arr = np.asarray(value)
        return tf.TensorSpec(shape=(None,) + arr.shape[1:], dtype=tf.as_dtype(arr.dtype))

    signature = spec(shape_batch(first))

    if drop_remainder is None:
        drop_remainder = not validation
    read = feed.validation_batches if validation else feed.epoch_batches
    expected = sorted(first)

    def gen():
        _keep_freed_memory()  # runs after TF's generator dataset set its malloc options
        for cols in read(batch_size, drop_remainder):
            if validation and sorted(cols) != expected:
                raise ValueError(f"node {feed._node}: the validation rows have columns {sorted(cols)}, the "
                                 f"training rows {expected}; validation_data must have the training data's columns")
            yield shape_batch(cols)

    ds = tf.data.Dataset.from_generator(gen, output_signature=signature)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    ds = ds.with_options(options)
    if device is not None:
        ds = ds.apply(tf.data.experimental.prefetch_to_device(device))
    return ds
