"""A real Spark Connect server for the tests: pyspark's own distribution's
``org.apache.spark.sql.connect.service.SparkConnectServer`` (spark-submit), in a process group
of its own, on a free loopback port, against a local master or a standalone cluster.

Clients run in processes of their own (:func:`run_client`): a Connect session switches its
whole Python process into Connect mode (pyspark sets SPARK_CONNECT_MODE_ENABLED), which the
tests' classic sessions must not see.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ConnectServer:
    """One Spark Connect server process; :meth:`stop` ends its whole process group."""

    def __init__(self, master: str, log: Path, conf: Optional[Dict[str, str]] = None, timeout: float = 180.0,
                 host: Any = None, env: Optional[Dict[str, str]] = None):
        """`host`: a spark_cluster.Host to run on (a network namespace of netns_cluster.py),
        listening on its address; by default here, on loopback.  `env`: the server's
        environment (by default this process's)."""
        address = host.address if host is not None else "127.0.0.1"
        self.port = free_port()
        self.url = f"sc://{address}:{self.port}"
        self.log = log
        args = [*(host.prefix if host is not None else ()),
                str(SPARK_HOME / "bin" / "spark-submit"), "--class", SERVER_CLASS, "--master", master,
                "--conf", f"spark.connect.grpc.binding.port={self.port}",
                "--conf", f"spark.connect.grpc.binding.address={address}",
                "--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false",
                "--conf", "spark.sql.shuffle.partitions=4"]
        for key, value in (conf or {}).items():
            args += ["--conf", f"{key}={value}"]
        env = dict(env or os.environ, PYSPARK_PYTHON=sys.executable, SPARK_HOME=str(SPARK_HOME))

        def listening() -> bool:
            try:
                with socket.create_connection((address, self.port), timeout=1.0):
                    return True
            except OSError:
                return False
        self._log_file = open(log, "wb")
        self.proc = subprocess.Popen(args, stdout=self._log_file, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"the Spark Connect server exited with {self.proc.returncode} before "
                                   f"listening on port {self.port}:\n{self.log_tail()}")
            if host.call(listening) if host is not None and hasattr(host, "call") else listening():
                break
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the Spark Connect server did not listen on port {self.port} within "
                                   f"{timeout:g}s:\n{self.log_tail()}")
            time.sleep(0.25)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
            except ProcessLookupError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything of its group still alive
        except ProcessLookupError:
            pass
        self._log_file.close()


def run_client(script: str, url: str, *args: str, timeout: float = 300.0,
               env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """Runs `script` (Python source; sys.argv[1] is the server's URL, then `args`) in a
    process of its own; returns it finished (stdout and stderr as text)."""
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-c", script, url, *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env)
