"""The node launcher: what each Spark barrier task of ``Cluster.run`` executes.

One launcher per node.  It registers the node with the driver's coordinator,
starts the node's own process (``python -m ember._node.main`` for a Python
``main_fun``, or the user's executable) in a new process group that dies with
the launcher, forwards the node's output to the driver, and reports how the
node ended.  It ends the node when the driver stops it (ps/evaluator at
shutdown) or the job aborts.  Nothing it started outlives it: the node's
process group is killed and reaped on every path.

The node learns its context from one typed start-up message (docs/wire.md,
"Node start-up"; encoded by the C++ core) that the launcher writes into a pipe
the process inherits; EMBER_STARTUP_FD names the pipe's descriptor.  The
job's secret is therefore in neither argv nor the environment, and the
process's stdin is /dev/null.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from typing import Deque, Dict, Iterator, List, Optional, Tuple

from ember import _ember
from ember._launcher import gpus as _gpus
from ember._launcher import proc as _proc
from ember._launcher import ring_owner as _ring_owner
from ember._names import FEED_ENDPOINT_KEY, GPUS_KEY, NODE_END_KEY, TENSORBOARD_URL_KEY, WORKER_ROLES
from ember._net import routable_address
from ember._node.env import node_env, notice_filter
from ember.context import absolute_path
from ember.errors import EmberError
from ember.input_mode import InputMode

_FOREVER = 10 * 365 * 86400.0  # seconds: no deadline for a wait that another event ends
_MAX_LINE = 64 * 1024  # longer lines are split; a progress bar without newlines must not grow forever


@dataclasses.dataclass
class NodeSpec:
    """Everything a node needs, made on the driver and carried in the Spark closure."""

    job_id: str
    coordinator_host: str
    coordinator_port: int
    secret: bytes
    payload: bytes  # cloudpickled (main_fun, args); empty for a program node
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
    feed_ring_bytes: Optional[int] = None  # InputMode.SPARK: each training node's feed ring (None: the core's)
    argv: Optional[List[str]] = None  # a program node: the executable and its arguments
    hdfs_http_address: str = ""  # the NameNode's WebHDFS host:port when default_fs is hdfs://
    node_bind: str = ""  # where the node's listeners bind; "" = the node's own address (config.node_bind)
    gpus_per_node: float = 0.0  # GPUs asked per node (Cluster.run's gpus_per_node; 0: none asked)
    local_gpus: Optional[List[str]] = None  # local mode: the driver's GPUs, shared out by partition
    tolerated_worker_losses: int = 0  # Cluster.run's min_workers: a failed "worker" node's task ends normally


class NodeFailed(RuntimeError):
    """The node's main_fun failed or its process died; the message has the traceback."""


class NodeAborted(RuntimeError):
    """The job was aborted while this node ran."""


def run_partition(spec: NodeSpec, first_executor_id: int, partition: int) -> Iterator[str]:
    """The task body of the nodes' barrier stage (ember._driver.spark_side.SparkSide.run_tasks):
    runs one node, yields its executor id (`first_executor_id` + the partition: ids below it
    are nodes on the driver)."""
    addresses = _gpus.task_addresses(spec.local_gpus, spec.gpus_per_node, partition)
    NodeLauncher(spec, first_executor_id + partition, gpu_addresses=addresses).run()
    yield str(first_executor_id + partition)


def run_replacement(spec: NodeSpec, executor_id: int, _partition: int) -> Iterator[str]:
    """The task body of a one-task Spark job that replaces a lost worker: runs the node of
    `executor_id` (Cluster.run's replace_lost_workers)."""
    NodeLauncher(spec, executor_id).run()
    yield str(executor_id)


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
    """TensorBoard runs beside the job's chief: training rank 0 (the chief or master, else
    worker 0; include/ember/roles.h)."""
    return _ember.training_rank(cluster_spec, role, index) == 0


def _short_reason(text: str, limit: int = 1000) -> str:
    """`text` cut to `limit` characters (a ring's abort reason holds 1 KiB), keeping its
    first line (which node failed) and its last (the exception: why)."""
    text = text.strip()
    if len(text) <= limit:
        return text
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first, last = lines[0], lines[-1]
    if len(lines) == 1 or len(last) >= limit // 2:
        return text[:limit - len(last[-(limit // 2 - 5):]) - 5] + " ... " + last[-(limit // 2 - 5):]
    return first[:limit - len(last) - 5] + " ... " + last


class NodeFeed:
    """A training node's InputMode.SPARK endpoint: its shared-memory ring, which the
    node process reads, and the TCP feed server that relays remote feeding tasks into it.

    The launcher owns both, so that when the node ends, feeding tasks learn at once:
    a failure aborts the ring (they raise the node's error), a normal end terminates it
    (they stop quietly, as after TFoS's DataFeed.terminate()).
    """

    ended_how: Optional[str] = None  # set by settle()

    def __init__(self, spec: NodeSpec, executor_id: int, label: str, host: str, bind_host: str):
        self.key = FEED_ENDPOINT_KEY.format(executor_id=executor_id)
        # Owns the ring's names for the life of this process: however the launcher ends, its
        # reaper removes them (a lost launcher's ring must not stay in the host's memory).
        self.owner = _ring_owner.RingOwner(_ember.node_ring_name(spec.job_id, executor_id).lstrip("/"))
        try:
            # The ring and the server relaying remote feeding tasks into it (ember/feed.h FeedHost);
            # its endpoint is published as endpoint.encode(), the core's typed, versioned form.
            self.host = _ember.FeedHost.start(spec.job_id, executor_id, label, host, bind_host, spec.secret,
                                              ring_bytes=spec.feed_ring_bytes)
        except BaseException:
            self.owner.close()
            raise
        self.endpoint = self.host.endpoint

    def settle(self, outcome: str, reason: str, returncode: Optional[int], label: str) -> None:
        """Tells feeding tasks how the node ended (see the class docstring); `ended_how`
        keeps the words, which the launcher also publishes for tasks that come later."""
        if outcome == "abort":
            self.ended_how = _short_reason(f"the job was aborted: {reason}")
            self.host.abort(self.ended_how)
        elif outcome == "exit" and returncode not in (0, None):
            self.ended_how = (f"node {label} failed ({_proc.describe_exit(returncode)}); "
                              "see the driver's output for its traceback")
            self.host.abort(self.ended_how)
        else:
            self.ended_how = f"node {label} ended its feed"
            self.host.terminate()

    def close(self) -> None:
        self.host.close()  # also removes result rings whose feeding task was killed early
        self.owner.close()


def _write_all(fd: int, data: bytes) -> None:
    """Writes `data` to `fd` and closes it; a reader that died early is fine."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        pass  # the node died at start (EPIPE); its exit status tells the rest
    finally:
        os.close(fd)


def end_node(child: subprocess.Popen, outcome: str, reason: str, feed: Optional["NodeFeed"],
             label: str, kill_grace_secs: float) -> int:
    """Ends the node process and its group, tells its feed how it ended, returns its exit status.

    When the node exited by itself it is reaped first, so that the feed learns the real
    exit status (``_proc.has_exited`` does not reap: ``child.returncode`` is still None
    then, and a crash would have been settled as a quiet end).  When the driver stopped
    it or the job aborted, the feed is settled first, so feeding tasks stop at once,
    while the node gets `kill_grace_secs` to end.
    """
    if outcome == "exit":
        returncode = _proc.stop_group(child, 0.0)  # also ends whatever main_fun left behind
        if feed is not None:
            feed.settle(outcome, reason, returncode, label)
        return returncode
    if feed is not None:
        feed.settle(outcome, reason, None, label)
    return _proc.stop_group(child, kill_grace_secs)


class NodeLauncher:
    """Runs one node inside its Spark task; see the module docstring."""

    def __init__(self, spec: NodeSpec, executor_id: int, gpu_addresses: Optional[List[str]] = None):
        self.spec = spec
        self.executor_id = executor_id
        self.label = f"executor {executor_id}"
        self.gpu_addresses = list(gpu_addresses or [])  # what Spark assigned the task
        self.gpus: List[str] = []  # the node's CUDA_VISIBLE_DEVICES entries
        self._stderr_tail: Deque[str] = collections.deque(maxlen=40)
        self._log_ok = True

    def run(self) -> None:
        spec = self.spec
        _ring_owner.sweep_stale()  # rings left on this host by launchers that are gone
        host = routable_address(spec.coordinator_host, spec.coordinator_port)
        self.bind_host = spec.node_bind or host  # docs/network.md
        if self.gpu_addresses:
            try:
                self.gpus = _gpus.visible_devices(self.gpu_addresses)
            except EmberError as e:
                raise RuntimeError(f"the node of executor {self.executor_id} on host {host}: {e}") from None
        port_sock = _bind_free_port()  # held until the node process starts, as TFoS does
        try:
            client = _ember.CoordinatorClient.connect(
                spec.coordinator_host, spec.coordinator_port, spec.secret,
                connect_timeout=spec.connect_timeout)
            try:
                if self.gpus:  # before registering: the driver checks them once all registered
                    client.kv_set(GPUS_KEY.format(executor_id=self.executor_id),
                                  _gpus.published(host, self.gpu_addresses, self.gpus))
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
                feed = NodeFeed(spec, self.executor_id, self.label, host, self.bind_host)
                client.kv_set(feed.key, feed.endpoint.encode())
            port_sock.close()  # the node's framework binds this port now
            traceback_path = os.path.join(tmpdir, "traceback.txt")
            startup = self._startup_message(role, index, cluster_spec, log_dir, traceback_path,
                                            feed.endpoint.ring if feed is not None else "")
            child = self._spawn_node(env, startup)
            forwarders = [self._forward(client, child.stdout, "stdout"),
                          self._forward(client, child.stderr, "stderr")]

            outcome, reason = self._supervise(client, child)
            returncode = end_node(child, outcome, reason, feed, self.label, spec.kill_grace_secs)
            if feed is not None and feed.ended_how:
                # A feeding task that starts after the ring is gone learns why from here.
                try:
                    client.kv_set(NODE_END_KEY.format(executor_id=self.executor_id), feed.ended_how.encode())
                except EmberError:
                    pass  # the coordinator is gone: the job is over anyway
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
            if role == "worker" and spec.tolerated_worker_losses > 0:
                # The job may go on without this worker (the coordinator decides, and aborts
                # past the count): failing this task would make Spark end the whole barrier stage.
                self._echo("stderr", f"node {self.label} failed ({last}); the job tolerates lost workers, "
                                     f"so this task ends without failing the stage")
                return
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
        env = node_env(os.environ, cluster_spec, role, index)  # TF_CONFIG, torch's variables, quiet defaults
        env["EMBER_JOB_ID"] = self.spec.job_id  # marks every process of the job
        env["PYTHONUNBUFFERED"] = "1"  # lines reach the driver as they are printed
        if self.gpus:
            env = _gpus.node_env(env, self.gpus)
        extra = _child_python_path()
        if extra:
            env["PYTHONPATH"] = os.pathsep.join(extra)
        return env

    def _startup_message(self, role: str, index: int, cluster_spec: Dict[str, List[str]],
                         log_dir: Optional[str], traceback_path: str, feed_ring: str) -> bytes:
        """The node's typed start-up message (docs/wire.md, "Node start-up")."""
        spec = self.spec
        ctx = _ember.NodeContext()
        ctx.job_id = spec.job_id
        ctx.executor_id = self.executor_id
        ctx.job_name = role
        ctx.task_index = index
        ctx.cluster_spec = cluster_spec  # the core derives training_rank/training_size from it
        ctx.bind_host = self.bind_host  # the node's own listeners bind there (config.node_bind)
        ctx.coordinator_host = spec.coordinator_host
        ctx.coordinator_port = spec.coordinator_port
        ctx.secret = spec.secret
        ctx.connect_timeout = spec.connect_timeout
        ctx.input_mode = int(spec.input_mode)
        ctx.feed_ring = feed_ring
        ctx.default_fs = spec.default_fs
        ctx.hdfs_http_address = spec.hdfs_http_address
        ctx.working_dir = spec.working_dir
        ctx.log_dir = log_dir or ""
        ctx.traceback_path = traceback_path
        ctx.gpus = self.gpus
        ctx.payload = spec.payload
        return _ember.encode_node_startup(ctx)

    def _spawn_node(self, env: Dict[str, str], startup: bytes) -> subprocess.Popen:
        """Starts the node process with `startup` in an inherited pipe (EMBER_STARTUP_FD)."""
        argv = list(self.spec.argv) if self.spec.argv else [sys.executable, "-m", "ember._node.main"]
        read_fd, write_fd = os.pipe()  # both close-on-exec; pass_fds keeps read_fd in the child
        try:
            env = dict(env, **{_ember.STARTUP_FD_ENV: str(read_fd)})
            try:
                child = _proc.spawn(argv, env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, pass_fds=(read_fd,))
            except OSError as e:
                raise RuntimeError(f"node {self.label}: cannot start {argv[0]!r} on host "
                                 f"{socket.gethostname()}: {e}") from e
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)
        # From a thread: a message larger than the pipe holds must not block the launcher
        # while the node has not read it yet (or never reads it).
        threading.Thread(target=_write_all, args=(write_fd, startup), daemon=True,
                         name=f"ember-startup-{self.executor_id}").start()
        return child

    def _supervise(self, client, child: subprocess.Popen) -> Tuple[str, str]:
        """Waits for the node process to exit or a push from the coordinator (Stop, Abort, or
        the coordinator lost), whichever comes first; returns (outcome, reason).

        Two threads block on the two events (waitid without reaping; the client's push queue
        in the core) and the first to return wins, so neither is noticed late."""
        first: "queue.Queue[Tuple[str, str]]" = queue.Queue()

        def wait_exit() -> None:
            try:
                os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # leaves it to be reaped
            except ChildProcessError:
                pass
            first.put(("exit", ""))

        def wait_push() -> None:
            push = client.next_push(_FOREVER)  # None once the client is closed
            if push is not None:
                first.put(("stop" if push.kind == _ember.Push.Kind.STOP else "abort", push.reason))

        for target, what in ((wait_exit, "exit"), (wait_push, "push")):
            threading.Thread(target=target, daemon=True, name=f"ember-{what}-{self.executor_id}").start()
        return first.get()

    def _failure_text(self, traceback_path: str, returncode: int) -> str:
        try:
            with open(traceback_path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            if text.strip():
                return text
        except OSError:
            pass
        tail = "\n".join(self._stderr_tail)
        if self.spec.argv:
            text = f"the node program {self.spec.argv[0]} ended with {_proc.describe_exit(returncode)}"
        else:
            text = (f"the node process ended with {_proc.describe_exit(returncode)} "
                    "without a Python traceback")
        return f"{text}; its last stderr lines:\n{tail}" if tail else text

    def _forward(self, client, pipe, stream: str) -> threading.Thread:
        is_notice = notice_filter(os.environ)  # TensorFlow's import notices (ember/_node/env.py)

        def pump() -> None:
            with pipe:
                for raw in iter(lambda: pipe.readline(_MAX_LINE), b""):
                    line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                    if stream == "stderr" and is_notice(line):
                        continue
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
        argv = [sys.executable, "-m", "tensorboard.main", "--logdir", path, "--port", str(port),
                *(["--bind_all"] if self.bind_host in ("0.0.0.0", "::") else ["--host", self.bind_host])]
        proc = _proc.spawn(argv, env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        self._echo("stderr", f"TensorBoard for {log_dir} at http://{host}:{port}")
        return proc, f"http://{host}:{port}"
