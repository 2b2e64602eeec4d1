"""Where the nodes find the coordinator (issue 22; docs/deploy.md, "Spark Connect").

The coordinator always runs in this process (the client): its state, the job's logs and
events stay here.  Its *endpoint* is placed by ``spark.ember.coordinator.placement``:

* ``client``: the nodes dial this process, as they dial a classic Spark driver;
* ``job``: a one-task Spark job starts a relay on an executor (ember._launcher.relay); the nodes
  dial the relay, and this process's ``RelayAgent`` dials out to it and splices each node's
  connection to the coordinator.  For a client the executors cannot dial (a Spark Connect
  client behind NAT or a firewall);
* ``auto`` (the default): ``client`` under a classic session (Spark's executors must reach
  their driver anyway); under Spark Connect the same one-task job first tries the client's
  coordinator from an executor, and starts the relay only if that fails.
"""
from __future__ import annotations

import functools
import json
from typing import Any, Optional

from ember import _ember
from ember._driver.spark_side import SparkSide
from ember._launcher.relay import relay_task
from ember.errors import ClusterError

PLACEMENTS = ("auto", "client", "job")
PROBE_TIMEOUT = 3.0   # seconds an executor tries the client's coordinator (auto placement)
START_TIMEOUT = 60.0  # seconds the relay process has to report its ports
AGENT_TIMEOUT = 30.0  # seconds the relay waits for this process's agent, or hears nothing from it


class Endpoint:
    """The coordinator's address for the nodes, and the agent that serves it from a relay."""

    def __init__(self, host: str, port: int, agent: Any = None, where: str = "the client"):
        self.host, self.port, self.agent, self.where = host, port, agent, where

    @property
    def relayed(self) -> bool:
        return self.agent is not None

    def relay_error(self) -> Optional[str]:
        """Why the relay's agent stopped serving (None while it serves, or with no relay)."""
        if self.agent is None or self.agent.ok:
            return None
        return f"the coordinator relay {self.where} ended: {self.agent.error}"

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()


def placement(side: SparkSide, setting: str) -> str:
    """The placement to use: `setting` checked, ``auto`` resolved where no probe is needed."""
    if setting not in PLACEMENTS:
        raise ValueError(f"spark.ember.coordinator.placement must be one of {', '.join(PLACEMENTS)}, "
                         f"not {setting!r}")
    if setting == "auto" and not side.connect:
        return "client"
    return setting


def place(side: SparkSide, how: str, secret: bytes, host: str, port: int, local_host: str, job_id: str,
          node_bind: str = "", connect_timeout: float = 30.0) -> Endpoint:
    """The endpoint the nodes of job `job_id` dial for the coordinator listening at
    `host`:`port` (and at `local_host`:`port` for this process).  `how` from :func:`placement`."""
    if how == "client":
        return Endpoint(host, port)
    driver_host = side.conf("spark.driver.host") or host
    request = {"job_id": job_id, "secret": secret.hex(), "probe": how == "auto", "client_host": host, "client_port": port,
               "probe_timeout": PROBE_TIMEOUT, "driver_host": driver_host,
               "driver_port": int(side.conf("spark.driver.port", "7077") or 7077),
               "bind": node_bind, "agent_timeout": AGENT_TIMEOUT, "start_timeout": START_TIMEOUT}
    lines = side.run_tasks(1, functools.partial(relay_task, json.dumps(request)), f"{job_id}-relay",
                           "Ember: where the nodes reach the coordinator")
    if len(lines) != 1:
        raise ClusterError(f"the coordinator placement job returned {len(lines)} lines, not 1: {lines!r}")
    answer = json.loads(lines[0])
    if answer["direct"]:
        return Endpoint(host, port)
    where = f"at {answer['host']}:{answer['node_port']} (relay pid {answer['pid']})"
    try:
        agent = _ember.RelayAgent.connect(answer["host"], int(answer["agent_port"]), secret, local_host, port,
                                          connect_timeout=connect_timeout)
    except Exception as e:
        raise ClusterError(
            f"the executors cannot dial this client's coordinator at {host}:{port} "
            f"({answer['probe_error'] or 'placement job'}), and this client cannot dial the relay started "
            f"{where} on its agent port {answer['agent_port']}: {e}. Let one side reach the other, or set "
            f"spark.ember.coordinator.host to an address of this client the executors can reach.") from e
    return Endpoint(answer["host"], int(answer["node_port"]), agent, where)
