"""Ember: distributed deep-learning training and inference on Apache Spark.

The successor of TensorFlowOnSpark: ``Cluster.run`` starts one node per Spark
barrier task, each running ``main_fun(args, ctx)`` in a process of its own;
``cluster.shutdown()`` ends the job.  See docs/architecture.md.
"""
from ember import errors
from ember.cluster import Cluster
from ember.context import Context
from ember.errors import ClusterError, EmberError, NodeError
from ember.feed import DataFeed
from ember.input_mode import InputMode
from ember.parallel import run_parallel

__all__ = ["Cluster", "Context", "DataFeed", "InputMode", "errors", "EmberError", "ClusterError",
           "NodeError", "run_parallel", "pack", "PackResult", "PackError", "spark_conf", "spark_jar"]
__version__ = "0.1.0"


def __getattr__(name):
    # ember.keras imports Keras (and with it TensorFlow), ember.ml PySpark's ML: only when asked for.
    if name in ("keras", "data", "torch", "collective", "summary", "ml", "tune"):
        import importlib

        return importlib.import_module(f"ember.{name}")
    if name in ("pack", "PackResult", "PackError"):  # ember pack: the environment for spark.archives (venv-pack)
        from ember import _pack

        return getattr(_pack, name)
    if name in ("spark_conf", "spark_jar"):  # Ember's Spark extension (SQL functions in Spark's JVM)
        from ember import _jvm

        return getattr(_jvm, name)
    raise AttributeError(f"module 'ember' has no attribute {name!r}")
