"""Keras integration: progress reports from ``model.fit`` to the driver.

Importing this module imports Keras; ``import ember`` alone does not.
"""
from __future__ import annotations

import math
import time
from typing import Any, Dict, Optional

import keras


class ProgressCallback(keras.callbacks.Callback):
    """Reports training progress to the driver through ``ctx.report``.

    Every `every_n_steps` training batches it sends the global step, the loss
    and the other batch metrics (accuracy, ...), and, when `batch_size` is
    given, the cumulative number of samples (so the driver shows samples/s).
    At each epoch's end it sends the epoch's metrics (including validation ones).

    Args:
        ctx: the node's ember.Context.
        every_n_steps: report every this many batches.
        batch_size: samples per batch on this node, for samples/s; None to omit.
    """

    def __init__(self, ctx: Any, every_n_steps: int = 10, batch_size: Optional[int] = None):
        super().__init__()
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.ctx = ctx
        self.every_n_steps = every_n_steps
        self.batch_size = batch_size
        self._step = 0
        self._epoch = 0

    def on_epoch_begin(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._step += 1
        if self._step % self.every_n_steps == 0:
            self._report(logs)

    def on_epoch_end(self, epoch: int, logs: Optional[Dict[str, Any]] = None) -> None:
        self._report(logs, epoch_end=True)

    def _report(self, logs: Optional[Dict[str, Any]], epoch_end: bool = False) -> None:
        metrics: Dict[str, float] = {"epoch": float(self._epoch + (1 if epoch_end else 0)),
                                     "time": time.time()}
        if self.batch_size:
            metrics["samples"] = float(self._step * self.batch_size)
        for key, value in (logs or {}).items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                continue
            if math.isfinite(number):
                metrics[key] = number
        loss = metrics.pop("loss", None)
        self.ctx.report(step=self._step, loss=loss, **metrics)
