"""A node's GPUs, on the executor: the addresses Spark assigned its barrier task, and the
CUDA_VISIBLE_DEVICES its process gets (the rules are the core's, ``include/ember/gpu.h``).

The launcher publishes what it found under ``GPUS_KEY`` before it registers, so that the
driver can check, once every node registered, that no two nodes hold one GPU.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

from ember import _ember

VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
DEVICE_ORDER = "CUDA_DEVICE_ORDER"


def task_addresses(local_gpus: Optional[List[str]], gpus_per_node: float, partition: int) -> List[str]:
    """The GPU addresses of the calling barrier task: what Spark assigned it
    (``TaskContext.resources()["gpu"]``), or, in local mode where Spark assigns none, its share
    of the driver's GPUs (`local_gpus`, handed out by partition: whole GPUs in turn, or with a
    fractional `gpus_per_node` 1/k, k tasks on each GPU)."""
    from pyspark import BarrierTaskContext

    resources = BarrierTaskContext.get().resources()
    if "gpu" in resources and resources["gpu"].addresses:
        return list(resources["gpu"].addresses)
    if not local_gpus or gpus_per_node <= 0:
        return []
    if gpus_per_node >= 1:
        k = int(gpus_per_node)
        return list(local_gpus[partition * k:(partition + 1) * k])
    return [local_gpus[int(partition * gpus_per_node)]]


def visible_devices(addresses: List[str], environ=os.environ) -> List[str]:
    """The node's CUDA_VISIBLE_DEVICES entries for `addresses`, honouring the executor's own
    CUDA_VISIBLE_DEVICES (ember/gpu.h VisibleDevices; InvalidArgument names both)."""
    return _ember.gpu_visible_devices(addresses, environ.get(VISIBLE_DEVICES))


def gpu_ids(visible: List[str]) -> List[str]:
    """What identifies the node's GPUs across the job: their UUIDs where NVML answers (a host
    with the NVIDIA driver), else the visible entries themselves (compared per host)."""
    from ember.errors import NotFound

    try:
        return _ember.gpu_uuids(visible)
    except NotFound:
        return list(visible)


def published(host: str, addresses: List[str], visible: List[str]) -> bytes:
    """The value a launcher publishes under GPUS_KEY (read by ember._driver.gpus)."""
    return json.dumps({"host": host, "addresses": addresses, "visible": visible,
                       "ids": gpu_ids(visible)}).encode()


def node_env(env: Dict[str, str], visible: List[str]) -> Dict[str, str]:
    """`env` with the node's GPUs: CUDA_VISIBLE_DEVICES, and PCI bus order (the numbering
    nvidia-smi and discovery scripts use) unless the executor chose an order."""
    env = dict(env)
    env[VISIBLE_DEVICES] = ",".join(visible)
    env.setdefault(DEVICE_ORDER, "PCI_BUS_ID")
    return env
