"""The core's FileSystem layer from Python (ember._ember.fs_*), against a real HDFS and a local
directory; and the HDFS harness itself (nothing left behind, the CLI used by ctest)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ember import _ember, errors
from hdfs_cluster import ENV_DEFAULT_FS, ENV_HTTP_ADDRESS, HdfsCluster


def _options(hdfs=None):
    opts = _ember.ResolveOptions()
    if hdfs is not None:
        opts.default_fs = hdfs.default_fs
        opts.hdfs_http_addresses = {hdfs.default_fs.split("//", 1)[1]: hdfs.http_address}
    opts.connect_timeout = 5.0
    return opts


@pytest.fixture(params=["hdfs", "local"])
def root(request, tmp_path):
    """(base URI of a fresh directory, ResolveOptions) on HDFS or on the local file system."""
    if request.param == "local":
        yield str(tmp_path), _options()
        return
    hdfs = request.getfixturevalue("hdfs")
    opts = _options(hdfs)
    base = f"{hdfs.default_fs}/py/{request.node.name.replace('[', '_').replace(']', '')}"
    _ember.fs_delete_recursively(base, opts)
    yield base, opts
    _ember.fs_delete_recursively(base, opts)


def test_write_read_stat_list(root):
    base, opts = root
    data = bytes(range(256)) * 1000
    _ember.fs_write_file(f"{base}/d/a.bin", data, opts)
    _ember.fs_write_file(f"{base}/d/b.bin", b"", opts)
    assert _ember.fs_read_file(f"{base}/d/a.bin", opts) == data
    info = _ember.fs_stat(f"{base}/d/a.bin", opts)
    assert (info.name, info.size, info.is_dir) == ("a.bin", len(data), False)
    assert info.mtime_ms > 1_600_000_000_000
    assert _ember.fs_stat(f"{base}/d", opts).is_dir
    assert _ember.fs_list(f"{base}/d", opts) == ["a.bin", "b.bin"]
    # write_file replaces atomically and leaves no temporary.
    _ember.fs_write_file(f"{base}/d/a.bin", b"new", opts)
    assert _ember.fs_read_file(f"{base}/d/a.bin", opts) == b"new"
    assert _ember.fs_list(f"{base}/d", opts) == ["a.bin", "b.bin"]


def test_glob_rename_delete(root):
    base, opts = root
    for name in ("part-0", "part-1", "_SUCCESS"):
        _ember.fs_write_file(f"{base}/out/{name}", name.encode(), opts)
    _ember.fs_create_dir(f"{base}/out/sub", opts)
    globbed = _ember.fs_glob(f"{base}/out", opts)
    assert [u.rsplit("/", 1)[1] for u in globbed] == ["part-0", "part-1"]
    assert [u.rsplit("/", 1)[1] for u in _ember.fs_glob(f"{base}/out/part-?", opts)] == ["part-0", "part-1"]
    _ember.fs_rename(f"{base}/out/part-0", f"{base}/out/part-1", opts)  # replaces part-1
    assert _ember.fs_read_file(f"{base}/out/part-1", opts) == b"part-0"
    with pytest.raises(errors.NotFound, match="part-0"):
        _ember.fs_stat(f"{base}/out/part-0", opts)
    _ember.fs_delete_recursively(f"{base}/out", opts)
    with pytest.raises(errors.NotFound):
        _ember.fs_list(f"{base}/out", opts)
    _ember.fs_delete_recursively(f"{base}/out", opts)  # missing: fine


def test_errors_name_the_uri(hdfs):
    opts = _options(hdfs)
    missing = f"{hdfs.default_fs}/py/no/such/file"
    with pytest.raises(errors.NotFound, match=missing):
        _ember.fs_read_file(missing, opts)
    # hdfs:/// and a bare path resolve through default_fs.
    _ember.fs_write_file("/py/bare", b"x", opts)
    assert _ember.fs_read_file("hdfs:///py/bare", opts) == b"x"
    assert _ember.fs_read_file(f"webhdfs://{hdfs.http_address}/py/bare", opts) == b"x"
    _ember.fs_delete_recursively("/py/bare", opts)
    with pytest.raises(errors.InvalidArgument, match="s3://b/x"):
        _ember.fs_stat("s3://b/x", opts)


def test_namenode_not_there_is_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = _options()
    opts.hdfs_http_addresses = {"127.0.0.1:1": f"127.0.0.1:{port}"}
    with pytest.raises(errors.Unavailable, match=f"127.0.0.1:{port}"):
        _ember.fs_stat("hdfs://127.0.0.1:1/x", opts)


def test_harness_stops_everything():
    cluster = HdfsCluster().start()
    pid, base_dir = cluster._proc.pid, cluster.base_dir
    assert base_dir.is_dir() and cluster.startup_secs < 60
    cluster.stop()
    cluster.stop()  # idempotent
    assert not base_dir.exists()
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # the JVM's whole process group is gone


def test_harness_cli_runs_a_command_with_hdfs_up():
    script = (f"import os, sys; print(os.environ['{ENV_DEFAULT_FS}'], os.environ['{ENV_HTTP_ADDRESS}']); "
              "sys.exit(7)")
    harness = Path(__file__).with_name("hdfs_cluster.py")
    r = subprocess.run([sys.executable, str(harness), "--", sys.executable, "-c", script],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 7, r.stderr
    default_fs, http = r.stdout.strip().splitlines()[-1].split()
    assert default_fs.startswith("hdfs://127.0.0.1:")
    host, port = http.rsplit(":", 1)
    with pytest.raises(ConnectionRefusedError):  # HDFS stopped with the command
        socket.create_connection((host, int(port)), timeout=5).close()
