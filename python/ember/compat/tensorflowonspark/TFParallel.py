"""TFoS's ``TFParallel``: one independent single-node TensorFlow run per executor.

``TFParallel.run(sc, map_fun, tf_args, num_executors)`` runs ``map_fun(tf_args, ctx)``
`num_executors` times at once, as TFoS did (e.g. parallel inference over shards, or
independent trainings), on :func:`ember.run_parallel`.

Differences from TFoS, all in the user's favour:

* every run is an Ember job of its own (a barrier stage of one task, its own process): a
  run that fails does not take the others down, and the error raised once all of them ended
  names each failed run, its host and the tail of its traceback (TFoS failed the Spark stage
  with the first exception, after Spark's task retries);
* ``use_barrier`` is accepted and has no effect: each run is always its own barrier stage,
  and the runs are started together; too few task slots is an error up front, not a hang.

The ``ctx`` has TFoS's attributes: ``executor_id`` and ``worker_num`` (the run's index),
``num_workers`` (`num_executors`), ``defaultFS`` and ``working_dir``; and Ember's
(``report``, ``absolute_path``, ...).
"""
from __future__ import annotations

import functools
from typing import Any, Callable


def _tfos_main(map_fun: Callable[[Any, Any], Any], num_executors: int, tf_args: Any, ctx: Any) -> None:
    ctx.num_workers = num_executors  # TFoS's TFParallel ctx counts every run
    ctx.defaultFS = ctx.default_fs
    map_fun(tf_args, ctx)


def run(sc: Any, map_fun: Callable[[Any, Any], Any], tf_args: Any, num_executors: int,
        use_barrier: bool = True) -> None:
    """Runs ``map_fun(tf_args, ctx)`` on `num_executors` independent single-node runs and
    returns when all of them ended.

    Args:
        sc: the SparkContext (a SparkSession works too).
        map_fun: the function each run executes (pickled with cloudpickle).
        tf_args: passed to map_fun (an argparse Namespace, a dict, ...).
        num_executors: how many runs; needs that many free task slots.
        use_barrier: accepted for TFoS compatibility; runs always start together.

    Raises:
        ember.parallel.RunsFailed: some runs failed; names each with its traceback's tail.
    """
    from ember.parallel import run_parallel

    run_parallel(sc, functools.partial(_tfos_main, map_fun, int(num_executors)), tf_args,
                 num_executors=int(num_executors))
