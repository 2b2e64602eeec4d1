"""TensorFlowOnSpark's API on Ember: a TFoS program runs with only its imports changed.

    from tensorflowonspark import TFCluster, TFNode, compat, dfutil                  # before
    from ember.compat.tensorflowonspark import TFCluster, TFNode, compat, dfutil     # after

Modules, each named and used as in TFoS 2.2:

* :mod:`.TFCluster` — ``TFCluster.run`` / ``train`` / ``inference`` / ``shutdown``, ``InputMode``
  (on :class:`ember.Cluster`).
* :mod:`.TFNode` — ``DataFeed``, ``hdfs_path``, ``release_port`` (on :class:`ember.DataFeed`),
  and the context ``map_fun(args, ctx)`` receives.
* :mod:`.compat` — ``export_saved_model``, ``disable_auto_shard``, ``is_gpu_available`` for
  Keras 2 (``tf-keras``, ``TF_USE_LEGACY_KERAS=1``) and Keras 3.
* :mod:`.dfutil` — ``saveAsTFRecords``, ``loadTFRecords``, ``isLoadedDF`` (on
  :mod:`ember.data`).
* ``pipeline`` (``TFEstimator``, ``TFModel``) and ``TFParallel`` — imported only when asked for.

Submodules load on first use, so ``import ember.compat.tensorflowonspark`` imports neither
TensorFlow nor Spark.  What differs from TFoS, call by call, is in docs/migration.md.
"""
from __future__ import annotations

import importlib

__all__ = ["TFCluster", "TFNode", "compat", "dfutil", "pipeline", "TFParallel"]
__version__ = "2.2.5"  # the TFoS release whose API this layer follows

_SUBMODULES = frozenset(__all__)


def __getattr__(name):
    # ``from ember.compat.tensorflowonspark import TFCluster`` imports the submodule by itself;
    # this serves ``import ember.compat.tensorflowonspark as tfos; tfos.TFCluster``.
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
