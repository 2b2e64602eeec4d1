"""Compatibility layers: programs written for other libraries run on Ember.

* :mod:`ember.compat.tensorflowonspark` — TensorFlowOnSpark's API (``TFCluster``, ``TFNode``,
  ``compat``, ``dfutil``, ...): a TFoS program runs with only its imports changed.
  See docs/migration.md.
* :mod:`ember.compat.elephas` — Elephas's ``SparkModel`` and ``to_simple_rdd``: an Elephas
  program runs with its imports changed (asynchronous and hogwild modes through Ember's
  parameter server, docs/ps.md).
"""
