"""GPUs on the driver: how many each node asks of Spark, the stage-level resource profile that
asks for them, whether the application can give them, and the check, once every node
registered, that no two nodes hold one physical GPU (the rule is the core's, ember/gpu.h).

Spark schedules GPUs per task: each executor declares its GPUs (a standalone worker's
``spark.worker.resource.gpu.*``; YARN and Kubernetes the same through
``spark.executor.resource.gpu.*``) and each task asks an amount.  Ember asks for the barrier
stage of the nodes only, through a task resource profile, so that the feeding and check tasks
need no GPU.  Local mode assigns tasks no resources: there the nodes share out the driver's
GPUs (``spark.driver.resource.gpu.*``, else the driver's CUDA_VISIBLE_DEVICES).
"""
from __future__ import annotations

import json
import math
import os
from typing import Dict, List, Optional

from ember import _ember
from ember._names import GPUS_KEY
from ember.errors import ClusterError, InvalidArgument

_TASK_AMOUNT = "spark.task.resource.gpu.amount"


def requested(side, gpus_per_node: Optional[float]) -> float:
    """GPUs per node: `gpus_per_node` if given, else the application's own
    spark.task.resource.gpu.amount (a TorchDistributor-style setting), else 0.  A whole
    number, or a fraction 1/k (k nodes share a GPU), as Spark takes them."""
    if gpus_per_node is None:
        gpus_per_node = float(side.conf(_TASK_AMOUNT, "0") or 0)
    amount = float(gpus_per_node)
    if amount < 0 or math.isnan(amount):
        raise ValueError(f"gpus_per_node must be >= 0, got {gpus_per_node}")
    if amount >= 1 and amount != int(amount):
        raise ValueError(f"gpus_per_node must be a whole number, or a fraction 1/k below 1, got {gpus_per_node}")
    if 0 < amount < 1 and abs(1 / amount - round(1 / amount)) > 1e-9:
        raise ValueError(f"gpus_per_node below 1 must be 1/k (k nodes share a GPU: 0.5, 0.25, ...), "
                         f"got {gpus_per_node}")
    return amount


def resource_profile(side, amount: float):
    """The pyspark ResourceProfile the nodes' barrier stage runs under (registered with Spark,
    so its task slots can be counted), or None where the application's default profile already
    asks `amount` GPUs per task, none are asked, or in local mode."""
    if amount <= 0 or side.is_local:
        return None
    if float(side.conf(_TASK_AMOUNT, "0") or 0) == amount:
        return None
    from pyspark.resource import ResourceProfileBuilder, TaskResourceRequests

    cpus = int(side.conf("spark.task.cpus", "1") or 1)
    profile = ResourceProfileBuilder().require(TaskResourceRequests().cpus(cpus).resource("gpu", amount)).build
    side.register_profile(profile)
    return profile


def too_few(side, needed: int, amount: float, have: int) -> str:
    """What Cluster.run says when the application cannot run `needed` nodes with `amount`
    GPUs each at once (`have`: how many it can)."""
    executors = side.executor_gpus() or []
    total = sum(len(g) for _, _, g in executors)
    asked = (f"{needed} nodes with {amount:g} GPU{'s' if amount != 1 else ''} each "
             f"({math.ceil(needed * amount - 1e-9)} GPUs), all at once (Spark barrier execution)")
    if total == 0:
        return (f"Cluster.run needs {needed} nodes with {amount:g} GPU each, but the application's "
                f"{len(executors)} executors have no GPU (master {side.master}). Give executors GPUs: "
                f"spark.executor.resource.gpu.amount, with each worker's GPUs declared "
                f"(standalone: spark.worker.resource.gpu.amount and "
                f"spark.worker.resource.gpu.discoveryScript; YARN/Kubernetes: "
                f"spark.executor.resource.gpu.discoveryScript; docs/deploy.md), or run without "
                f"gpus_per_node.")
    listed = "; ".join(f"executor {eid} on {hp}: {', '.join(g) or 'none'}" for eid, hp, g in executors)
    return (f"Cluster.run needs {asked}, but the application's executors offer {total} GPUs "
            f"({listed}), room for {have} such nodes. Add executors with GPUs, ask fewer nodes or "
            f"GPUs per node, or share GPUs with a fractional gpus_per_node (0.5: two nodes per GPU).")


def local_gpus(side, num_nodes: int, amount: float) -> Optional[List[str]]:
    """Local mode: the driver's GPUs the nodes share out (spark.driver.resource.gpu.*, else
    the driver's CUDA_VISIBLE_DEVICES); None when no GPU is asked or not in local mode."""
    if amount <= 0 or not side.is_local:
        return None
    if side.connect:
        raise ClusterError(
            f"Cluster.run asked {amount:g} GPU per node from a Spark Connect client of a local-mode "
            f"server ({side.master}), whose GPUs this client cannot see: run the Connect server "
            f"against a cluster whose executors declare GPUs (docs/deploy.md), or use a classic session.")
    if side.driver_gpus():
        gpus, where = side.driver_gpus(), "spark.driver.resource.gpu"
    elif os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        gpus = _ember.gpu_split_visible_devices(os.environ["CUDA_VISIBLE_DEVICES"])
        where = f"the driver's CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r}"
    else:
        raise ClusterError(
            f"Cluster.run asked {amount:g} GPU per node in local mode ({side.master}), where Spark "
            f"assigns tasks no GPUs and the driver declares none: set spark.driver.resource.gpu.amount "
            f"and spark.driver.resource.gpu.discoveryScript (docs/deploy.md), or CUDA_VISIBLE_DEVICES "
            f"in the driver's environment, before the SparkSession starts.")
    need = math.ceil(num_nodes * amount - 1e-9)
    if need > len(gpus):
        raise ClusterError(
            f"Cluster.run needs {num_nodes} nodes with {amount:g} GPU each ({need} GPUs), but "
            f"local mode has {len(gpus)} ({where}: {', '.join(gpus) or 'none'}). Ask fewer nodes "
            f"or GPUs per node, or share GPUs with a fractional gpus_per_node (0.5: two nodes per GPU).")
    return gpus


def check_nodes(server, executor_ids: List[int], labels: Dict[int, str], amount: float) -> List[str]:
    """Once every node registered: each node's GPUs as its launcher published them, checked
    so that no two nodes hold one GPU (unless `amount` < 1, sharing on purpose).  Returns one
    line per node for the driver's console; raises ClusterError naming the nodes and the GPU."""
    nodes, lines = [], []
    for e in executor_ids:
        raw = server.kv_get(GPUS_KEY.format(executor_id=e))
        if raw is None:
            raise ClusterError(f"node {labels[e]} was asked {amount:g} GPU, but Spark assigned its task "
                               f"none (TaskContext.resources() has no 'gpu')")
        seen = json.loads(raw)
        nodes.append((labels[e], seen["host"], list(seen["ids"])))
        mapped = "" if seen["visible"] == seen["addresses"] else f" (Spark's address {','.join(seen['addresses'])})"
        lines.append(f"{labels[e]} on {seen['host']}: GPU {','.join(seen['visible'])}{mapped}")
    if amount >= 1:
        try:
            _ember.gpu_check_distinct(nodes)
        except InvalidArgument as e:
            raise ClusterError(f"Cluster.run: {e}") from None
    return lines
