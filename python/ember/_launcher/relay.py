"""The coordinator's endpoint inside the job, executor side (issue 22; docs/deploy.md).

A Spark Connect client is often out of the executors' reach (behind NAT or a firewall) while it
can itself dial them.  The driver then runs :func:`relay_task` as a one-task Spark job before
the nodes' barrier stage:

* it first tries the client's coordinator from the executor (``probe``: an authenticated
  connection, closed at once); if that works the nodes dial the client as they always did;
* otherwise it starts the relay (:func:`main`) in a process of its own session.  The relay
  holds the core's ``CoordinatorRelay``: a node port, which the nodes and the feeding tasks dial
  instead of the coordinator, and an agent port, which the client's ``RelayAgent`` dials out
  to.  Every node connection is spliced to the client's coordinator over a connection the
  client opened.  The task returns the relay's address (JSON, one line) and ends.

The relay lives as long as the client's agent holds its control connection: it ends when the
agent closes it (the job ended), when the agent falls silent (the client died or was cut off),
or when no agent came within ``agent_timeout``.  Nothing of it outlives its job, and nothing
of the job's state lives in it: the coordinator stays in the client.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, Iterator

from ember import _ember
from ember._net import routable_address
from ember.errors import EmberError


# The relay process's program (not `-m`: importing ember imports this module first).
RELAY_MAIN = "import sys; from ember._launcher.relay import main; sys.exit(main())  # ember coordinator relay"


def relay_task(request_json: str, partition: int) -> Iterator[str]:
    """The one task of the placement job: probe the client's coordinator, else start a relay.
    Yields one JSON line: {"direct": true} or the relay's {"host", "node_port", "agent_port",
    "pid", "probe_error"}."""
    del partition
    req: Dict[str, Any] = json.loads(request_json)
    secret = bytes.fromhex(req["secret"])
    probe_error = None
    if req.get("probe"):
        try:
            client = _ember.CoordinatorClient.connect(req["client_host"], int(req["client_port"]), secret,
                                                      connect_timeout=float(req["probe_timeout"]))
            client.close()
            yield json.dumps({"direct": True})
            return
        except EmberError as e:
            probe_error = str(e)
    host = routable_address(req["driver_host"], int(req["driver_port"]))
    bind = req.get("bind") or host
    proc = subprocess.Popen([sys.executable, "-c", RELAY_MAIN], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, start_new_session=True, close_fds=True,
                            env=dict(os.environ, EMBER_JOB_ID=req["job_id"]))  # as the job's nodes carry
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"secret": req["secret"], "bind": bind,
                                     "agent_timeout": req["agent_timeout"]}).encode())
        proc.stdin.close()
        line = _first_line(proc, float(req["start_timeout"]), host)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    # Reaps the relay when it ends, while this Python worker lives (else a zombie until it exits).
    threading.Thread(target=proc.wait, daemon=True, name="ember-relay-reaper").start()
    ports = json.loads(line)
    yield json.dumps({"direct": False, "host": host, "node_port": ports["node_port"],
                      "agent_port": ports["agent_port"], "pid": proc.pid, "probe_error": probe_error})


def _first_line(proc: subprocess.Popen, timeout: float, host: str) -> str:
    """The relay's first line of output (its ports), within `timeout` seconds."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buf = b""
    fd = proc.stdout.fileno()
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the coordinator relay on host {host} (pid {proc.pid}) did not report its "
                               f"ports within {timeout:g}s; look at this executor's stderr for why")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"the coordinator relay on host {host} exited with {proc.wait()} before it "
                                   f"reported its ports; its error is in this executor's stderr")
            buf += chunk
    proc.stdout.close()
    return buf.split(b"\n", 1)[0].decode()


def main() -> int:
    """The relay process: reads its settings (with the job's secret) from stdin, prints its
    ports, and serves until its agent leaves."""
    req = json.loads(sys.stdin.read())
    relay = _ember.CoordinatorRelay.start(bytes.fromhex(req["secret"]), bind_host=req["bind"],
                                          agent_timeout=float(req["agent_timeout"]))
    signal.signal(signal.SIGTERM, lambda *_: relay.close())
    sys.stdout.write(json.dumps({"node_port": relay.node_port, "agent_port": relay.agent_port}) + "\n")
    sys.stdout.flush()
    os.close(1)  # the task reads to the first line only; nothing else goes there
    try:
        relay.wait()
    except EmberError as e:
        print(f"ember: coordinator relay on {req['bind']}: {e}", file=sys.stderr)
        return 1
    finally:
        relay.close()
    return 0

