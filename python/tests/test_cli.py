"""The ``ember`` console script: ``ember records count|head|verify|schema`` on local files and on
a real HDFS whose addresses come from $HADOOP_CONF_DIR, as a user with a Hadoop client config
would run it."""
from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from ember import _cli

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "src" / "record" / "testdata"
EMBER = Path(sys.executable).parent / "ember"  # installed by pip with the package


def run_ember(*args, env=None):
    return subprocess.run([str(EMBER), *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **(env or {})))


def test_console_script_counts_tensorflow_files():
    out = run_ember("records", "count", str(GOLDEN / "examples.tfrecord.gz"), str(GOLDEN / "payloads.tfrecord"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].endswith("examples.tfrecord.gz\t3") and lines[1].endswith("payloads.tfrecord\t4")
    assert lines[-1] == "total\t7"


def test_verify_names_the_file_and_offset_of_a_corrupt_record(tmp_path):
    data = bytearray((GOLDEN / "payloads.tfrecord").read_bytes())
    data[-3] ^= 0xFF  # inside the last record's data CRC
    bad = tmp_path / "bad.tfrecord"
    bad.write_bytes(bytes(data))
    out = run_ember("records", "verify", str(bad))
    assert out.returncode == 1
    assert "bad.tfrecord" in out.stdout + out.stderr and "offset" in out.stdout + out.stderr


def test_usage_errors_exit_2():
    assert run_ember().returncode == 2
    assert run_ember("nonsense").returncode == 2
    assert run_ember("records", "count", "--bogus", "x").returncode == 2


def test_hadoop_settings_fill_only_what_the_user_did_not_give():
    conf = {"fs.defaultFS": "hdfs://nn:8020", "dfs.namenode.http-address": "0.0.0.0:50070"}
    assert _cli.records_argv(["count", "/a"], conf) == [
        "records", "count", "--default-fs=hdfs://nn:8020", "--namenode-http=nn:50070", "/a"]
    assert _cli.records_argv(["count", "--default-fs=file:///", "/a"], conf) == ["records", "count", "--default-fs=file:///", "/a"]
    assert _cli.records_argv(["count", "--namenode-http=h:1", "/a"], conf) == [
        "records", "count", "--default-fs=hdfs://nn:8020", "--namenode-http=h:1", "/a"]
    assert _cli.records_argv(["count", "/a"], {}) == ["records", "count", "/a"]


def write_hadoop_conf(conf_dir: Path, hdfs) -> None:
    def site(props):
        body = "".join(f"<property><name>{k}</name><value>{v}</value></property>" for k, v in props.items())
        return f"<?xml version=\"1.0\"?><configuration>{body}</configuration>"
    conf_dir.mkdir()
    (conf_dir / "core-site.xml").write_text(site({"fs.defaultFS": hdfs.default_fs}))
    (conf_dir / "hdfs-site.xml").write_text(site({"dfs.namenode.http-address": hdfs.http_address}))


def test_records_on_hdfs_through_hadoop_conf_dir(spark_on_hdfs, hdfs, tmp_path):
    import ember.data
    root = f"/cli/{uuid.uuid4().hex[:8]}"
    df = spark_on_hdfs.createDataFrame([(i,) for i in range(12)], "label long").repartition(2)
    assert ember.data.save_as_tfrecords(df, f"{hdfs.default_fs}{root}") == 12
    conf_dir = tmp_path / "hadoop-conf"
    write_hadoop_conf(conf_dir, hdfs)
    env = {"HADOOP_CONF_DIR": str(conf_dir)}
    for path in (root, f"hdfs://{root}", f"{root}/part-r-*"):  # no scheme and hdfs:/// -> fs.defaultFS
        out = run_ember("records", "count", path, env=env)
        assert out.returncode == 0, (path, out.stderr)
        assert out.stdout.splitlines()[-1] == "total\t12", (path, out.stdout)
    out = run_ember("records", "schema", f"{hdfs.default_fs}{root}", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1].startswith("label\tint64\tscalar\t1\t1\t"), out.stdout
    # Without the configuration the NameNode's HTTP port is unknown (Hadoop 3's 9870 is assumed):
    # the error names the address it tried.
    out = run_ember("records", "count", f"{hdfs.default_fs}{root}", env={"HADOOP_CONF_DIR": str(tmp_path / "none")})
    assert out.returncode == 1 and ":9870" in out.stderr, out.stderr
