"""A real HDFS for tests: one NameNode and one DataNode on loopback.

Runs Hadoop's ``MiniHadoopClusterManager`` (``-nomr``: HDFS only) from the jars that
``make setup-hdfs`` put in ``.hdfs/lib`` (scripts/hdfs/pom.xml), in a temporary directory::

    with HdfsCluster() as hdfs:
        hdfs.default_fs       # "hdfs://127.0.0.1:<nn port>"   (fs.defaultFS)
        hdfs.http_address     # "127.0.0.1:<http port>"        (WebHDFS, what Ember talks to)
    # the JVM is gone and its directory removed here

As a command, it runs another one while HDFS is up, with ``EMBER_TEST_HDFS_DEFAULT_FS`` and
``EMBER_TEST_HDFS_HTTP_ADDRESS`` set (how ctest runs the C++ webhdfs_test), and exits with its code::

    python python/tests/hdfs_cluster.py -- build/core/src/webhdfs_test

Process hygiene: the JVM runs in its own process group with SIGKILL as its parent-death signal, so
it dies with this process even when that is SIGKILLed; ``stop()`` kills the group and waits.
The DataNode registers as 127.0.0.1 (MiniDFSCluster sets dfs.datanode.hostname so), so WebHDFS
redirects point at loopback. Only the standard library is used (ctest runs this before any venv).
"""

from __future__ import annotations

import ctypes
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HDFS_LIB = REPO / ".hdfs" / "lib"
ENV_DEFAULT_FS = "EMBER_TEST_HDFS_DEFAULT_FS"
ENV_HTTP_ADDRESS = "EMBER_TEST_HDFS_HTTP_ADDRESS"

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)  # resolved before fork: preexec must not import


def _die_with_parent(parent_pid: int):
    def preexec() -> None:  # in the child, between fork and exec
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)
    return preexec


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HdfsClusterError(RuntimeError):
    """HDFS did not come up; the message holds the tail of its log."""


class HdfsCluster:
    """A NameNode + DataNode as a child process of this one.

    Args:
        start_timeout: seconds to wait for WebHDFS to answer (start-up takes ~6 s).
        heap: the JVM's maximum heap.

    ``start()`` (or entering the ``with`` block) returns once WebHDFS answers GETFILESTATUS of
    ``/`` and a file can be created, or raises HdfsClusterError. ``stop()`` is idempotent. Start
    and stop it from the same thread (the parent-death signal is tied to the starting thread).
    """

    def __init__(self, start_timeout: float = 90.0, heap: str = "768m") -> None:
        self.start_timeout = start_timeout
        self.heap = heap
        self.default_fs: str | None = None
        self.http_address: str | None = None
        self.startup_secs: float | None = None
        self.base_dir: Path | None = None
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> "HdfsCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def env(self) -> dict:
        """The variables a test process reads to find this HDFS."""
        return {ENV_DEFAULT_FS: self.default_fs, ENV_HTTP_ADDRESS: self.http_address}

    def start(self) -> "HdfsCluster":
        if self._proc is not None:
            raise RuntimeError("HDFS already started")
        if not any(HDFS_LIB.glob("hadoop-hdfs-*.jar")):
            raise HdfsClusterError(f"no Hadoop jars in {HDFS_LIB}: run `make setup-hdfs` first")
        java = shutil.which("java")
        if java is None:
            raise HdfsClusterError("no `java` on PATH (scripts/setup_system.sh installs a JRE)")
        t0 = time.monotonic()
        self.base_dir = Path(tempfile.mkdtemp(prefix="ember-hdfs-"))
        try:
            nn_port, http_port = free_port(), free_port()
            self.default_fs = f"hdfs://127.0.0.1:{nn_port}"
            self.http_address = f"127.0.0.1:{http_port}"
            log = open(self.base_dir / "hdfs.log", "wb")
            try:
                self._proc = subprocess.Popen(
                    [java, f"-Xmx{self.heap}", "-cp", f"{HDFS_LIB}/*",
                     "org.apache.hadoop.mapreduce.MiniHadoopClusterManager", "-nomr", "-format",
                     "-nnport", str(nn_port), "-nnhttpport", str(http_port), "-datanodes", "1",
                     # A file is complete once its DataNode reported the last block; the client
                     # (the DataNode's WebHDFS handler) polls for that from 400 ms, which made
                     # every CREATE/APPEND take ~0.5 s.
                     "-D", "dfs.client.block.write.locateFollowingBlock.initial.delay.ms=10",
                     "-writeConfig", str(self.base_dir / "conf.xml")],
                    cwd=self.base_dir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, preexec_fn=_die_with_parent(os.getpid()))
            finally:
                log.close()
            self._wait_ready(t0 + self.start_timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_secs = time.monotonic() - t0
        return self

    def _status(self, method: str, path: str, op: str, timeout: float) -> int:
        """The HTTP status of one WebHDFS request (redirects not followed)."""
        host, port = self.http_address.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        try:
            conn.request(method, f"/webhdfs/v1{path}?op={op}&user.name={_user()}",
                         body=b"" if method == "PUT" else None)
            return conn.getresponse().status
        finally:
            conn.close()

    def _wait_ready(self, deadline: float) -> None:
        last = "no answer yet"
        while True:
            if self._proc.poll() is not None:
                raise HdfsClusterError(f"HDFS exited with code {self._proc.returncode} while starting:\n"
                                       f"{self._log_tail()}")
            try:
                # CREATE's first step: the NameNode answers 307 (to a DataNode) only once it is out
                # of safe mode with a live DataNode; nothing is created until data is sent there.
                status = self._status("PUT", "/.ember-ready", "CREATE&overwrite=true", timeout=5)
                if status == 307:
                    return
                last = f"HTTP {status}"
            except OSError as e:
                last = str(e)
            if time.monotonic() >= deadline:
                raise HdfsClusterError(f"WebHDFS at {self.http_address} did not answer within "
                                       f"{self.start_timeout:.0f} s (last: {last}):\n{self._log_tail()}")
            time.sleep(0.2)

    def _log_tail(self, lines: int = 30) -> str:
        try:
            text = (self.base_dir / "hdfs.log").read_text(errors="replace")
        except (OSError, TypeError) as e:
            return f"<no log: {e}>"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 30.0) -> None:
        """Kills the JVM's process group, waits for it, removes the temporary directory."""
        proc, self._proc = self._proc, None
        if proc is not None:
            for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, timeout)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
                try:
                    proc.wait(grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
            if proc.poll() is None:
                raise RuntimeError(f"HDFS (pid {proc.pid}) still running after SIGKILL")
            try:  # anything the JVM left in its group
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.base_dir is not None:
            shutil.rmtree(self.base_dir, ignore_errors=True)
            self.base_dir = None


def _user() -> str:
    import pwd
    return pwd.getpwuid(os.geteuid()).pw_name


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: hdfs_cluster.py -- <command> [args...]   (runs it while HDFS is up)",
              file=sys.stderr)
        return 2
    command = argv[argv.index("--") + 1:]
    with HdfsCluster() as hdfs:
        print(f"hdfs_cluster: HDFS up in {hdfs.startup_secs:.1f} s at {hdfs.default_fs} "
              f"(WebHDFS {hdfs.http_address})", flush=True)
        env = dict(os.environ, **hdfs.env)
        child = subprocess.Popen(command, env=env, preexec_fn=_die_with_parent(os.getpid()))
        try:
            return child.wait()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


if __name__ == "__main__":
    # SIGTERM (ctest's timeout) runs the `with` exit, so HDFS stops too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main(sys.argv[1:]))
