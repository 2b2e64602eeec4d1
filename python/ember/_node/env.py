"""The environment of a node's process: the same for a Python ``main_fun`` node and for an
executable node (``Cluster.run(spark, ["./prog", ...])``), built once by the node's launcher.

On top of the executor's environment a node gets:

* the job's facts, which replace whatever the executor had: ``TF_CONFIG`` (cluster spec and
  this node's task) on every node, and on training nodes (chief/master/worker) what
  ``torch.distributed.init_process_group`` reads: ``MASTER_ADDR``/``MASTER_PORT`` (rank 0's
  host and its reserved port), ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``, as Spark's
  TorchDistributor sets them;
* quiet defaults (:data:`QUIET_DEFAULTS`), kept only where the executor's environment does not
  set the variable: a user's value (``spark.executorEnv.TF_CPP_MIN_LOG_LEVEL=0``, or the
  driver's environment in local mode) wins.  While that level hides INFO lines the launcher
  also leaves out the TensorFlow notices the level does not reach (:func:`notice_filter`).

The rank rules are the core's (include/ember/roles.h), so the launcher, the node context and a
C++ node agree.
"""
from __future__ import annotations

import json
import re
from typing import Callable, Dict, List, Mapping

from ember import _ember

# Every node prints these unless the user set them.  TF_CPP_MIN_LOG_LEVEL=1 hides TensorFlow's
# C++ INFO lines (the oneDNN and CPU-instruction notices each node printed when it imported
# TensorFlow); its warnings and errors still show.
QUIET_DEFAULTS: Dict[str, str] = {"TF_CPP_MIN_LOG_LEVEL": "1"}

# TensorFlow notices that TF_CPP_MIN_LOG_LEVEL does not silence: its oneDNN notice is an INFO line
# logged through absl before TensorFlow reads the level (twice per process, once per library that
# loads), after absl's own preamble.  The launcher leaves them out of a node's output while the
# node's level hides INFO lines, as the level says it should.
_TF_NOTICE = re.compile(r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
                        r"|I\d{4} [\d:.]+ +\d+ port\.cc:\d+\] oneDNN custom operations are on\b")


def torch_distributed_env(cluster_spec: Mapping[str, List[str]], job_name: str, task_index: int) -> Dict[str, str]:
    """MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK (this node's index among the
    training nodes on its host) of a training node; empty for ps and evaluator nodes."""
    rank = _ember.training_rank(cluster_spec, job_name, task_index)
    if rank is None:
        return {}
    addresses = _ember.training_addresses(cluster_spec)
    master_host, master_port = addresses[0].rsplit(":", 1)
    my_host = addresses[rank].rsplit(":", 1)[0]
    local_rank = sum(1 for a in addresses[:rank] if a.rsplit(":", 1)[0] == my_host)
    return {"MASTER_ADDR": master_host, "MASTER_PORT": master_port, "RANK": str(rank),
            "WORLD_SIZE": str(len(addresses)), "LOCAL_RANK": str(local_rank)}


def node_env(base: Mapping[str, str], cluster_spec: Mapping[str, List[str]], job_name: str,
             task_index: int) -> Dict[str, str]:
    """`base` (the executor's environment) with the node's facts and the quiet defaults; see the
    module doc.  `base` is not modified."""
    env = dict(base)
    for key, value in QUIET_DEFAULTS.items():
        env.setdefault(key, value)
    env["TF_CONFIG"] = json.dumps({"cluster": dict(cluster_spec), "task": {"type": job_name, "index": task_index}})
    env.update(torch_distributed_env(cluster_spec, job_name, task_index))
    return env


def notice_filter(base: Mapping[str, str]) -> Callable[[str], bool]:
    """For a node whose environment is ``node_env(base, ...)``: whether a line of its stderr is one
    of TensorFlow's notices to leave out (none when its TF_CPP_MIN_LOG_LEVEL is 0: the user
    asked for TensorFlow's INFO lines)."""
    level = dict(base).get("TF_CPP_MIN_LOG_LEVEL", QUIET_DEFAULTS["TF_CPP_MIN_LOG_LEVEL"]).strip()
    if not level.isdigit() or int(level) < 1:
        return lambda line: False
    return lambda line: _TF_NOTICE.match(line) is not None
