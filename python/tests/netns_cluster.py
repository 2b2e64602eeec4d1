"""A multi-host Spark standalone cluster on one machine: Linux network namespaces as hosts.

Each "host" is a network namespace with its own ``lo`` and one ``eth0`` (a veth pair) on a
private subnet; the other ends of the veths hang on a Linux bridge that lives in a namespace of
its own (the "switch"), so nothing is added to the machine's own network and parallel runs,
whose namespaces carry a per-run suffix, cannot collide even though they use the same subnet.
Hosts reach each other only through the bridge: never over loopback.

Programs run on a host through ``ip netns exec``, inside a mount namespace that gets a private
``/dev/shm``, so shared memory between "hosts" is impossible, as between real machines (the
rest of the filesystem is shared, like an NFS home).  ``tc`` settings can be applied to a
host's ``eth0`` (``shaping``), for later bandwidth/latency experiments (the kernel decides which
qdiscs exist: this project's CI kernel has tbf but not netem).

    with NetnsCluster(hosts=("h1", "h2")) as nc:     # master in "drv", a worker on h1 and h2
        result = nc.run_driver(script, {"n": 3}, timeout=300)   # driver program in "drv"
    assert nc.leftovers == []

Needs root and a kernel that allows network namespaces, veths and bridges;
``netns_unavailable_reason()`` says why not (tests skip with its words).  Everything is torn
down on every path (and namespaces of a run killed outright are swept by the next one): the driver's and the daemons' process groups are killed (see
spark_cluster.py), any process still in one of the run's namespaces is SIGKILLed, and the
namespaces (with their veths and bridge) are deleted.  ``leftovers`` lists what is still there
afterwards: namespaces or links named with the run's suffix, and processes in the run's
namespaces or carrying the cluster's marker.
"""
from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from spark_cluster import Host, StandaloneCluster, _die_with_parent, _tail

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
NETNS_DIR = Path("/run/netns")  # where `ip netns add` pins namespaces


class NetnsUnavailable(RuntimeError):
    """The kernel or permissions refuse network namespaces (the message says which)."""


class CommandFailed(subprocess.CalledProcessError):
    """A set-up command failed; str() has the command and its own error output."""

    def __str__(self) -> str:
        return f"`{' '.join(self.cmd)}` exited with {self.returncode}: {(self.stderr or '').strip()}"


def _check(argv: List[str]) -> str:
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise CommandFailed(done.returncode, argv, done.stdout, done.stderr)
    return done.stdout


def _ip(*args: str, netns: Optional[str] = None) -> str:
    """Runs `ip [-n netns] args`; raises CommandFailed with ip's own words."""
    return _check(["ip", *(["-n", netns] if netns else []), *args])


def netns_unavailable_reason() -> Optional[str]:
    """None if this process can make namespaces joined by a bridge, else why not (to skip with)."""
    if os.geteuid() != 0:
        return f"network namespaces need root (this process runs as uid {os.geteuid()})"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"ember-probe-{uuid.uuid4().hex[:8]}"
    try:
        _ip("netns", "add", probe)
        try:
            _ip("link", "add", "br0", "type", "bridge", netns=probe)
            _ip("link", "add", "a0", "type", "veth", "peer", "name", "a1", netns=probe)
            _ip("link", "set", "a1", "master", "br0", netns=probe)
        finally:
            _ip("netns", "del", probe)
    except CommandFailed as e:
        return f"the kernel or permissions refuse network namespaces: {e}"
    return None


def _call_in_netns(netns: str, fn: Callable[[], Any]) -> Any:
    """fn() on a fresh thread that has joined network namespace `netns` (setns affects only the
    calling thread, which then ends: this process's other threads stay where they are)."""
    box: Dict[str, Any] = {}

    def run() -> None:
        try:
            fd = os.open(NETNS_DIR / netns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into network namespace {netns}: {os.strerror(err)}")
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, name=f"in-netns-{netns}", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


# Programs run with a private /dev/shm: `ip netns exec` gives each a new mount namespace, and
# children (a worker's executors) inherit it, so one "host"'s processes share theirs.
_PRIVATE_SHM = 'mount -t tmpfs ember-host-shm /dev/shm && exec "$@"'


@dataclasses.dataclass(frozen=True)
class NetnsHost(Host):
    """A host that is a network namespace: `address` on its eth0, programs run through
    ``ip netns exec`` with a private /dev/shm."""

    label: str = ""
    netns: str = ""

    @classmethod
    def make(cls, label: str, netns: str, address: str) -> "NetnsHost":
        prefix = ("ip", "netns", "exec", netns, "sh", "-c", _PRIVATE_SHM, "sh")
        return cls(address=address, prefix=prefix, label=label, netns=netns)

    def call(self, fn: Callable[[], Any]) -> Any:
        return _call_in_netns(self.netns, fn)


_RUN_NAME = re.compile(r"^ember-[a-z0-9]+-(\d+)x[0-9a-f]{4}$")


def sweep_stale() -> List[str]:
    """Deletes the namespaces of runs whose process is gone (a test run killed with SIGKILL
    cannot clean up) and that no process is inside; returns their names."""
    swept = []
    for path in NETNS_DIR.glob("ember-*") if NETNS_DIR.is_dir() else []:
        match = _RUN_NAME.match(path.name)
        if not match:
            continue
        try:
            os.kill(int(match.group(1)), 0)
            continue  # its run is alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        inside = f"net:[{os.stat(path).st_ino}]"
        if any(_netns_of(pid) == inside for pid in _pids()):
            continue
        try:
            _ip("netns", "del", path.name)
            swept.append(path.name)
        except CommandFailed:
            pass
    return swept


def _pids() -> List[int]:
    return [int(e) for e in os.listdir("/proc") if e.isdigit()]


def _netns_of(pid: int) -> Optional[str]:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


class NetnsNetwork:
    """Namespaces ``ember-<label>-<run>`` for each label, joined by a bridge in
    ``ember-sw-<run>``; host i gets ``<subnet>.<10 + i>/24`` on its eth0.

    Args:
        labels: the hosts' names, e.g. ("drv", "h1", "h2").
        subnet: the first three octets of the private /24 (inside the namespaces only).
        shaping: label -> ``tc qdisc`` arguments applied as ``tc qdisc add dev eth0 root ...``
            in that host (e.g. ``"tbf rate 1gbit burst 128kb latency 5ms"``, or netem where the
            kernel has sch_netem); none by default.
    """

    def __init__(self, labels: Sequence[str], subnet: str = "10.99.0",
                 shaping: Optional[Mapping[str, str]] = None) -> None:
        unknown = set(shaping or {}) - set(labels)
        if unknown:
            raise ValueError(f"shaping names hosts that do not exist: {sorted(unknown)} (hosts: {list(labels)})")
        self.run_id = f"{os.getpid()}x{uuid.uuid4().hex[:4]}"  # the pid lets sweep_stale() find dead runs
        self.switch = f"ember-sw-{self.run_id}"
        self.hosts: Dict[str, NetnsHost] = {
            label: NetnsHost.make(label, f"ember-{label}-{self.run_id}", f"{subnet}.{10 + i}")
            for i, label in enumerate(labels)}
        self.shaping = dict(shaping or {})
        self._inodes: Dict[str, int] = {}  # netns name -> its inode (to find processes inside)

    @property
    def namespaces(self) -> List[str]:
        return [self.switch, *(h.netns for h in self.hosts.values())]

    def create(self) -> "NetnsNetwork":
        sweep_stale()
        try:
            for ns in self.namespaces:
                _ip("netns", "add", ns)
                self._inodes[ns] = os.stat(NETNS_DIR / ns).st_ino
                _ip("link", "set", "lo", "up", netns=ns)
            _ip("link", "add", "br0", "type", "bridge", netns=self.switch)
            _ip("link", "set", "br0", "up", netns=self.switch)
            for label, host in self.hosts.items():
                port = f"v-{label}"[:15]
                # Both ends are made inside their namespaces: nothing appears in the machine's own.
                _ip("link", "add", "eth0", "netns", host.netns, "type", "veth",
                    "peer", "name", port, "netns", self.switch)
                _ip("link", "set", port, "master", "br0", "up", netns=self.switch)
                self._sysctl(host.netns, "net.ipv6.conf.all.disable_ipv6", "1")
                _ip("addr", "add", f"{host.address}/24", "dev", "eth0", netns=host.netns)
                _ip("link", "set", "eth0", "up", netns=host.netns)
                if label in self.shaping:
                    self._run_in(host.netns, ["tc", "qdisc", "add", "dev", "eth0", "root",
                                              *self.shaping[label].split()])
        except BaseException:
            self.destroy()
            raise
        return self

    def destroy(self) -> None:
        """Kills whatever still runs in the run's namespaces, then deletes them (their veths and
        bridge go with them).  Idempotent."""
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.05)  # SIGKILL is final; the kernel is reaping them
        for ns in self.namespaces:
            if (NETNS_DIR / ns).exists():
                try:
                    _ip("netns", "del", ns)
                except CommandFailed:
                    pass  # reported by leftovers()

    def processes(self) -> List[int]:
        """Pids of processes inside one of the run's network namespaces."""
        wanted = {f"net:[{ino}]" for ino in self._inodes.values()}
        return [pid for pid in _pids() if _netns_of(pid) in wanted]

    def leftovers(self) -> List[str]:
        """What of this run still exists: namespaces, links in the machine's own network
        named with the run's suffix, processes in the run's namespaces."""
        left = [f"namespace {ns}" for ns in self.namespaces if (NETNS_DIR / ns).exists()]
        left += [f"link {line.strip()}" for line in _ip("-o", "link", "show").splitlines()
                 if self.run_id in line]
        left += [f"process {pid} in a namespace of run {self.run_id}" for pid in self.processes()]
        return left

    def _sysctl(self, netns: str, key: str, value: str) -> None:
        path = "/proc/sys/" + key.replace(".", "/")
        self._run_in(netns, ["sh", "-c", f"echo {value} > {path}"])

    @staticmethod
    def _run_in(netns: str, argv: List[str]) -> None:
        _check(["ip", "netns", "exec", netns, *argv])


class NetnsCluster:
    """A Spark standalone cluster whose master and driver run on host "drv" and whose workers
    run one per host of `hosts`, each host a network namespace (see the module docstring).

    Args:
        hosts: labels of the worker hosts.
        cores_per_worker, memory: what each worker offers (StandaloneCluster's meaning).
        shaping: label -> tc qdisc arguments for that host's eth0 (NetnsNetwork).
        start_timeout: seconds for the master and every worker to come up.

    ``__enter__`` raises NetnsUnavailable (with the reason) where the kernel or permissions
    refuse namespaces.  Not thread-safe; start and stop it from one thread.
    """

    DRIVER = "drv"

    def __init__(self, hosts: Sequence[str] = ("h1", "h2"), cores_per_worker: int = 2,
                 memory: str = "2g", shaping: Optional[Mapping[str, str]] = None,
                 start_timeout: float = 120.0, clients: Sequence[str] = ()) -> None:
        if self.DRIVER in hosts or set(clients) & {self.DRIVER, *hosts}:
            raise ValueError(f"{self.DRIVER!r} is the driver's host; name worker and client hosts otherwise")
        # Client hosts are on the bridge and run no Spark daemon (e.g. a Spark Connect client).
        self.network = NetnsNetwork([self.DRIVER, *hosts, *clients], shaping=shaping)
        drv = self.network.hosts[self.DRIVER]
        self.spark = StandaloneCluster(
            cores_per_worker=cores_per_worker, memory=memory, start_timeout=start_timeout,
            master_host=drv, worker_hosts=[self.network.hosts[h] for h in hosts],
            driver_host=drv.address)
        self.leftovers: Optional[List[str]] = None  # set by stop()
        self._drivers: List[subprocess.Popen] = []

    @property
    def driver_host(self) -> NetnsHost:
        return self.network.hosts[self.DRIVER]

    def worker_host(self, label: str) -> NetnsHost:
        return self.network.hosts[label]

    def refuse_connections(self, label: str) -> None:
        """Host `label` drops every TCP connection attempt made to it from the network (a SYN
        without ACK coming in on eth0), while its own connections out, and to itself, work: a
        client behind NAT or a firewall, which nothing dials."""
        netns = self.network.hosts[label].netns
        for rule in (["add", "table", "inet", "ember"],
                     ["add", "chain", "inet", "ember", "in",
                      "{ type filter hook input priority 0; policy accept; }"],
                     ["add", "rule", "inet", "ember", "in", "iifname", "eth0", "tcp", "flags", "&", "(syn", "|", "ack)",
                      "==", "syn", "drop"]):
            _check(["ip", "netns", "exec", netns, "nft", *rule])

    def __enter__(self) -> "NetnsCluster":
        reason = netns_unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        try:
            self.network.create()
            self.spark.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def run_driver(self, script: Path, payload: Dict[str, Any], timeout: float,
                   spark_conf: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
        """Runs ``python script IN OUT`` on the driver's host and returns OUT's JSON.

        IN holds `payload` plus ``spark_conf`` (the settings for a session on this cluster,
        updated with `spark_conf`).  Raises RuntimeError with the program's output if it exits
        non-zero or writes no OUT, TimeoutError (after killing its process group) if it runs
        past `timeout` seconds.
        """
        base = self.spark.base_dir
        run = uuid.uuid4().hex[:8]
        inp, out, log = (base / f"driver-{run}.{ext}" for ext in ("in.json", "out.json", "log"))
        conf = {**self.spark.spark_conf(), **(spark_conf or {})}
        inp.write_text(json.dumps({**payload, "spark_conf": conf}))
        argv = [*self.driver_host.prefix, sys.executable, str(script), str(inp), str(out)]
        with open(log, "wb") as sink:
            proc = subprocess.Popen(argv, env=self.spark.env(self.driver_host), stdin=subprocess.DEVNULL,
                                    stdout=sink, stderr=subprocess.STDOUT, cwd=base,
                                    preexec_fn=_die_with_parent)
        self._drivers.append(proc)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            raise TimeoutError(f"driver program {script.name} on host {self.DRIVER} "
                               f"({self.driver_host.address}) still ran after {timeout:.0f}s; its output:\n"
                               f"{_tail(log, 80)}") from None
        if rc != 0 or not out.exists():
            raise RuntimeError(f"driver program {script.name} on host {self.DRIVER} exited with {rc}"
                               f"{'' if out.exists() else ' and wrote no result'}; its output:\n{_tail(log, 80)}")
        return json.loads(out.read_text())

    def stop(self) -> None:
        """Kills drivers, daemons and anything left in the namespaces; deletes the network;
        sets ``leftovers``.  Idempotent."""
        errors = []
        for proc in self._drivers:
            self._kill(proc)
        self._drivers = []
        try:
            self.spark.stop()
        except RuntimeError as e:  # processes still running: destroy() SIGKILLs what is in the namespaces
            errors.append(str(e))
        self.network.destroy()
        left = self.network.leftovers()
        left += [f"process {pid} with the cluster's marker" for pid in self.spark.processes()]
        self.leftovers = errors + left

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(5)
                return
            except subprocess.TimeoutExpired:
                continue
