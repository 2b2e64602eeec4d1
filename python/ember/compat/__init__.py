"""Compatibility layers: programs written for other libraries run on Ember.

* :mod:`ember.compat.tensorflowonspark` — TensorFlowOnSpark's API (``TFCluster``, ``TFNode``,
  ``compat``, ``dfutil``, ...): a TFoS program runs with only its imports changed.
  See docs/migration.md.
"""
