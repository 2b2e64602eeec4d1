"""The node launcher: what each Spark barrier task of ``Cluster.run`` executes.

One launcher per node.  It registers the node with the driver's coordinator,
starts the node's own process (``python -m ember._node_main``) in a new
process group that dies with the launcher, forwards the node's output to the
driver, and reports how the node ended.  It ends the node when the driver
stops it (ps/evaluator at shutdown) or the job aborts.  Nothing it started
outlives it: the node's process group is killed and reaped on every path.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from typing import Deque, Dict, Iterable, Iterator, List, Optional, Tuple

from ember import _ember, _proc
from ember.context import WORKER_ROLES, absolute_path
from ember.errors import EmberError
from ember.input_mode import InputMode

TENSORBOARD_URL_KEY = "ember/tensorboard_url"
_MAX_LINE = 64 * 1024  # longer lines are split; a progress bar without newlines must not grow forever


@dataclasses.dataclass
class NodeSpec:
    """Everything a node needs, made on the driver and carried in the Spark closure."""

    job_id: str
    coordinator_host: str
    coordinator_port: int
    secret: bytes
    payload: bytes  # cloudpickled (main_fun, args)
    num_nodes: int
    default_fs: str
    working_dir: str
    log_dir: Optional[str]
    tensorboard: bool
    input_mode: int
    reservation_timeout: float
    connect_timeout: float
    kill_grace_secs: float
    echo_logs: bool  # echo node output to the task's stderr (not in local mode: that is the driver's)
    feed_ring_bytes: int = 64 << 20  # InputMode.SPARK: each training node's feed ring
    feed_timeout: float = 600.0      # InputMode.SPARK: how long the feed server waits without progress


class NodeFailed(RuntimeError):
    """The node's main_fun failed or its process died; the message has the traceback."""


class NodeAborted(RuntimeError):
    """The job was aborted while this node ran."""


def run_partition(spec: NodeSpec, _rows: Iterable) -> Iterator[int]:
    """mapPartitions function of the barrier stage: runs one node, yields its executor id."""
    from pyspark import BarrierTaskContext

    executor_id = BarrierTaskContext.get().partitionId()
    NodeLauncher(spec, executor_id).run()
    yield executor_id


def routable_address(peer_host: str, peer_port: int) -> str:
    """This host's address on the route to `peer_host`, which peers can therefore reach."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(peer_host, peer_port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)  # UDP: picks a route, sends nothing
            address = s.getsockname()[0]
        if address not in ("0.0.0.0", "::"):
            return address
    except OSError:
        pass
    return socket.gethostname()


def _bind_free_port() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("", 0))
    return s


def _child_python_path() -> List[str]:
    """sys.path entries the node process would not have by itself (Spark's py-files, user paths)."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    extra = []
    for entry in sys.path:
        if not entry or not os.path.exists(entry):
            continue
        real = os.path.realpath(entry)
        if any(real == p or real.startswith(p + os.sep) for p in prefixes):
            continue
        if entry not in extra:
            extra.append(entry)
    return extra


def _runs_tensorboard(role: str, index: int, cluster_spec: Dict[str, List[str]]) -> bool:
    """TensorBoard runs beside the chief (or master), else beside worker 0."""
    if role in ("chief", "master"):
        return True
    has_chief = any(cluster_spec.get(r) for r in ("chief", "master"))
    return role == "worker" and index == 0 and not has_chief


class NodeFeed:
    """A training node's InputMode.SPARK endpoint: its shared-memory ring, which the
    node process reads, and the TCP feed server that relays remote feeding tasks into it.

    The launcher owns both, so that when the node ends, feeding tasks learn at once:
    a failure aborts the ring (they raise the node's error), a normal end terminates it
    (they stop quietly, as after TFoS's DataFeed.terminate()).
    """

    def __init__(self, spec: NodeSpec, executor_id: int, label: str, host: str):
        from ember._feed_driver import FEED_ENDPOINT_KEY

        self.key = FEED_ENDPOINT_KEY.format(executor_id=executor_id)
        self.ring = _ember.ShmRing.create(f"/{spec.job_id}-{executor_id}", spec.feed_ring_bytes)
        try:
            self.server = _ember.FeedServer.start(
                self.ring.name, spec.secret, bind_host="0.0.0.0", port=0,
                result_ring_prefix=f"/{spec.job_id}-{executor_id}-results",
                idle_timeout=spec.feed_timeout)
        except BaseException:
            self.ring.close()
            raise
        self.endpoint = json.dumps({"name": label, "ring": self.ring.name, "host": host,
                                    "port": self.server.port, "capacity": self.ring.capacity})

    def settle(self, outcome: str, reason: str, returncode: Optional[int], label: str) -> None:
        """Tells feeding tasks how the node ended (see the class docstring)."""
        if outcome == "abort":
            self.ring.abort(f"the job was aborted: {reason}"[:240])
        elif outcome == "exit" and returncode not in (0, None):
            self.ring.abort(f"node {label} failed ({_proc.describe_exit(returncode)}); "
                            "see the driver's output for its traceback")
        else:
            self.ring.terminate()

    def close(self) -> None:
        self.server.close()
        self.ring.close()


class NodeLauncher:
    """Runs one node inside its Spark task; see the module docstring."""

    def __init__(self, spec: NodeSpec, executor_id: int):
        self.spec = spec
        self.executor_id = executor_id
        self.label = f"executor {executor_id}"
        self._stderr_tail: Deque[str] = collections.deque(maxlen=40)
        self._log_ok = True

    def run(self) -> None:
        spec = self.spec
        host = routable_address(spec.coordinator_host, spec.coordinator_port)
        port_sock = _bind_free_port()  # held until the node process starts, as TFoS does
        try:
            client = _ember.CoordinatorClient.connect(
                spec.coordinator_host, spec.coordinator_port, spec.secret,
                connect_timeout=spec.connect_timeout)
            try:
                reg = client.register(self.executor_id, host, port_sock.getsockname()[1],
                                      os.getpid(), spec.reservation_timeout)
                self._run_registered(client, reg, host, port_sock)
            finally:
                client.close()
        finally:
            port_sock.close()

    # -- after registration -------------------------------------------------

    def _run_registered(self, client, reg, host: str, port_sock: socket.socket) -> None:
        spec = self.spec
        role, index = reg.role.job_name, reg.role.task_index
        self.label = f"{role}:{index}"
        cluster_spec = json.loads(reg.cluster_spec_json)
        log_dir = absolute_path(spec.log_dir, spec.default_fs, spec.working_dir) if spec.log_dir else None
        tmpdir = tempfile.mkdtemp(prefix=f"{spec.job_id}-{self.executor_id}-")
        child: Optional[subprocess.Popen] = None
        tensorboard: Optional[subprocess.Popen] = None
        feed: Optional[NodeFeed] = None
        forwarders: List[threading.Thread] = []
        reported = False
        try:
            env = self._child_env(cluster_spec, role, index)
            if spec.tensorboard and log_dir and _runs_tensorboard(role, index, cluster_spec):
                tensorboard, url = self._start_tensorboard(env, host, log_dir)
                client.kv_set(TENSORBOARD_URL_KEY, url.encode())
            if spec.input_mode == int(InputMode.SPARK) and role in WORKER_ROLES:
                feed = NodeFeed(spec, self.executor_id, self.label, host)
                client.kv_set(feed.key, feed.endpoint.encode())
            port_sock.close()  # the node's framework binds this port now
            child = _proc.spawn([sys.executable, "-m", "ember._node_main"], env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
            forwarders = [self._forward(client, child.stdout, "stdout"),
                          self._forward(client, child.stderr, "stderr")]
            traceback_path = os.path.join(tmpdir, "traceback.txt")
            self._send_inputs(child, role, index, cluster_spec, traceback_path,
                              feed.ring.name if feed is not None else None)

            outcome, reason = self._supervise(client, child)
            if feed is not None:
                feed.settle(outcome, reason, child.returncode, self.label)
            grace = 0.0 if outcome == "exit" else spec.kill_grace_secs
            returncode = _proc.stop_group(child, grace)  # also ends whatever main_fun left behind
            for t in forwarders:
                t.join(timeout=5.0)

            if outcome == "abort":
                raise NodeAborted(f"node {self.label}: the job was aborted: {reason}")
            if outcome == "stop" or returncode == 0:
                client.done()
                reported = True
                return
            error = self._failure_text(traceback_path, returncode)
            reported = True
            try:
                client.fail(error)
            finally:
                self._echo("stderr", f"node failed:\n{error}")
            # Short: the traceback went to the driver (and to this task's stderr above).
            last = error.strip().splitlines()[-1] if error.strip() else ""
            raise NodeFailed(f"node {self.label} failed: {last}")
        except (NodeAborted, NodeFailed):
            raise
        except BaseException:
            if not reported:
                try:
                    client.fail(f"the launcher of node {self.label} failed:\n{traceback.format_exc()}")
                except EmberError:
                    pass
            raise
        finally:
            if child is not None:
                _proc.stop_group(child, 0.0)
            if tensorboard is not None:
                _proc.stop_group(tensorboard, 1.0)
            if feed is not None:
                feed.close()
            shutil.rmtree(tmpdir, ignore_errors=True)

    def _child_env(self, cluster_spec: Dict[str, List[str]], role: str, index: int) -> Dict[str, str]:
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster_spec, "task": {"type": role, "index": index}})
        env["EMBER_JOB_ID"] = self.spec.job_id  # marks every process of the job
        env["PYTHONUNBUFFERED"] = "1"  # lines reach the driver as they are printed
        extra = _child_python_path()
        if extra:
            env["PYTHONPATH"] = os.pathsep.join(extra)
        return env

    def _send_inputs(self, child: subprocess.Popen, role: str, index: int,
                     cluster_spec: Dict[str, List[str]], traceback_path: str,
                     feed_ring: Optional[str]) -> None:
        spec = self.spec
        data = {
            "payload": spec.payload,
            "traceback_path": traceback_path,
            "ctx": dict(
                executor_id=self.executor_id, job_name=role, task_index=index,
                cluster_spec=cluster_spec, default_fs=spec.default_fs,
                working_dir=spec.working_dir, log_dir=spec.log_dir,
                input_mode=spec.input_mode, job_id=spec.job_id, feed_ring=feed_ring,
                coordinator=(spec.coordinator_host, spec.coordinator_port, spec.secret,
                             spec.connect_timeout)),
        }
        try:
            child.stdin.write(pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
            child.stdin.close()
        except BrokenPipeError:
            pass  # the process died at start; its exit code tells the rest

    def _supervise(self, client, child: subprocess.Popen) -> Tuple[str, str]:
        """Waits for the node process to exit or a push; returns (outcome, reason)."""
        while not _proc.has_exited(child):
            push = client.next_push(0.25)
            if push is None:
                continue
            if push.kind == _ember.Push.Kind.STOP:
                return "stop", push.reason
            return "abort", push.reason
        return "exit", ""

    def _failure_text(self, traceback_path: str, returncode: int) -> str:
        try:
            with open(traceback_path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            if text.strip():
                return text
        except OSError:
            pass
        tail = "\n".join(self._stderr_tail)
        text = f"the node process ended with {_proc.describe_exit(returncode)} without a Python traceback"
        return f"{text}; its last stderr lines:\n{tail}" if tail else text

    def _forward(self, client, pipe, stream: str) -> threading.Thread:
        def pump() -> None:
            with pipe:
                for raw in iter(lambda: pipe.readline(_MAX_LINE), b""):
                    line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                    if stream == "stderr":
                        self._stderr_tail.append(line)
                    if self._log_ok:
                        try:
                            client.log(stream, line)
                        except EmberError:
                            self._log_ok = False  # coordinator gone; the echo below still works
                    self._echo(stream, line)

        t = threading.Thread(target=pump, name=f"ember-{stream}-{self.executor_id}", daemon=True)
        t.start()
        return t

    def _echo(self, stream: str, text: str) -> None:
        if not self.spec.echo_logs:
            return
        try:
            for line in text.splitlines() or [""]:
                sys.stderr.write(f"[{self.label}] {line}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def _start_tensorboard(self, env: Dict[str, str], host: str,
                           log_dir: str) -> Tuple[subprocess.Popen, str]:
        path = log_dir[len("file://"):] if log_dir.startswith("file://") else log_dir
        if "://" not in path:
            os.makedirs(path, exist_ok=True)
        with _bind_free_port() as s:
            port = s.getsockname()[1]
        argv = [sys.executable, "-m", "tensorboard.main", "--logdir", path,
                "--port", str(port), "--bind_all"]
        proc = _proc.spawn(argv, env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        self._echo("stderr", f"TensorBoard for {log_dir} at http://{host}:{port}")
        return proc, f"http://{host}:{port}"
