"""``ember pack``: the environment shipped to the executors with spark.archives.

The real test runs a job on a Spark standalone cluster whose executors' own Python (the base
interpreter this venv was made from) has no Ember: they run ``./environment/bin/python`` from the
archive, and the driver's PYSPARK_PYTHON is that relative path, which names no Python here.  The
nodes report where their ``ember`` came from: the unpacked archive in the executor's directory.

The environment packed is the small node venv of node_env.py.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import ember
from conftest import no_leftovers
from ember._pack import PackError
from node_env import make_node_venv, pack_command
from spark_cluster import StandaloneCluster

pytestmark = pytest.mark.timeout(420)


@pytest.fixture(scope="module")
def node_venv(tmp_path_factory):
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests do not run in a virtual environment")
    return make_node_venv(tmp_path_factory.mktemp("node-venv") / "env")


def test_pack_refuses_what_it_cannot_ship(node_venv, tmp_path, monkeypatch):
    out = tmp_path / "env.tar.gz"
    out.write_bytes(b"not an archive")
    with pytest.raises(PackError, match="exists; pass force=True"):
        ember.pack(str(out), prefix=str(node_venv))
    assert out.read_bytes() == b"not an archive"
    with pytest.raises(PackError, match="must end in one of"):
        ember.pack(str(tmp_path / "env.rar"), prefix=str(node_venv))
    with pytest.raises(PackError, match="is not a virtual environment"):
        ember.pack(str(tmp_path / "x.tar.gz"), prefix=str(tmp_path))
    # Another package installed editable (PEP 610's direct_url.json): its files are elsewhere.
    site = next((node_venv / "lib").glob("python*/site-packages"))
    other = site / "mylib-1.0.dist-info"
    other.mkdir()
    (other / "direct_url.json").write_text(json.dumps({"dir_info": {"editable": True}, "url": "file:///src/mylib"}))
    try:
        with pytest.raises(PackError, match=r"mylib \(editable from file:///src/mylib\)"):
            ember.pack(str(tmp_path / "x.tar.gz"), prefix=str(node_venv))
    finally:
        shutil.rmtree(other)
    # Not in a virtual environment at all.
    monkeypatch.setattr(sys, "base_prefix", sys.prefix)
    with pytest.raises(PackError, match="runs in none"):
        ember.pack(str(tmp_path / "x.tar.gz"))
    assert not (tmp_path / "x.tar.gz").exists()


@pytest.fixture(scope="module")
def packed(node_venv, tmp_path_factory):
    """`ember pack` of the node venv: (the command, its completed process, the archive)."""
    archive = tmp_path_factory.mktemp("packed") / "env.tar.gz"
    cli = pack_command(node_venv, archive)
    yield cli, subprocess.run(cli, capture_output=True, text=True, timeout=300), archive
    archive.unlink(missing_ok=True)  # ~300 MiB: not left for pytest's kept temporary directories


def test_cli_packs_and_prints_the_spark_settings(packed):
    cli, proc, archive = packed
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    size_mib = archive.stat().st_size / 2**20
    assert f"into {archive}: {size_mib:,.1f} MiB in " in out, out
    assert f"editable from {Path(ember.__file__).parent}, shipped as a regular install" in out, out
    assert f"PYSPARK_PYTHON=./environment/bin/python spark-submit --archives {archive}#environment app.py" in out
    assert f"--archives {archive}#environment --conf spark.pyspark.python=./environment/bin/python" in out
    assert f'.config("spark.archives", "{archive}#environment")' in out
    assert f'spark.addArtifacts("{archive}#environment", archive=True)' in out
    assert 'spark.conf.set("spark.sql.execution.pyspark.python", "environment/bin/python")' in out
    assert f"in {sys.base_prefix}/bin" in out, out  # the interpreter the archive links to

    # The archive holds Ember as a regular install: package files, the native module, no hook.
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    site = next(n.rsplit("/", 1)[0] for n in names if n.endswith("site-packages/ember/__init__.py")).rsplit("/", 1)[0]
    assert f"{site}/ember/cluster.py" in names
    assert any(n.startswith(f"{site}/ember/_ember.") and n.endswith(".so") for n in names)
    assert not [n for n in names if "_editable" in n or n.endswith("direct_url.json")]
    with tarfile.open(archive) as tar:
        record = tar.extractfile(f"{site}/ember-{ember.__version__}.dist-info/RECORD").read().decode()
    assert "ember/__init__.py,sha256=" in record and "_editable" not in record

    again = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "exists; pass force=True (ember pack --force)" in again.stderr


@pytest.fixture(scope="module")
def bare_cluster():
    """One standalone worker whose executors have no Ember (both tests name their Python from
    the application: the archive's, or the Connect server's base Python); nothing of it left."""
    with StandaloneCluster(num_workers=1, cores_per_worker=2, memory="2g",
                           python="./environment/bin/python") as standalone:
        yield standalone
    assert standalone.processes() == []


def test_executors_get_ember_only_from_the_archive(packed, bare_cluster, spark_sessions, tmp_path, monkeypatch):
    base_python = Path(sys.base_prefix) / "bin" / "python3"
    assert subprocess.run([str(base_python), "-c", "import ember"], capture_output=True).returncode != 0, \
        f"{base_python} imports ember: it cannot stand for an executor without Ember"
    _, proc, archive = packed
    assert proc.returncode == 0, proc.stderr
    assert not (Path.cwd() / "environment").exists()  # the driver's PYSPARK_PYTHON names no Python here
    spark_sessions.stop()  # one SparkContext per process: make room for the cluster's
    monkeypatch.setenv("PYSPARK_PYTHON", "./environment/bin/python")  # session() sets it; restored after
    out = tmp_path / "reports"
    out.mkdir()

    def where_is_ember(args, ctx):  # nested: shipped by value (the archive has no pytest to import this module)
        import json
        import sys

        import ember
        from ember import _ember

        with open(f"{args['out']}/{ctx.task_index}.json", "w") as f:
            json.dump({"ember": ember.__file__, "native": _ember.__file__, "prefix": sys.prefix,
                       "executable": sys.executable}, f)

    standalone = bare_cluster
    spark = standalone.session("ember-pack-test", **{"spark.archives": f"{archive}#environment"})
    try:
        cluster = ember.Cluster.run(spark, where_is_ember, {"out": str(out)}, num_executors=2,
                                    reservation_timeout=120)
        cluster.shutdown(timeout=120)
        no_leftovers(cluster.job_id)
    finally:
        spark.stop()
    work = standalone.base_dir / "work"
    reports = [json.loads((out / f"{i}.json").read_text()) for i in range(2)]
    for r in reports:
        env_dir = Path(r["prefix"])
        assert env_dir.name == "environment" and env_dir.is_relative_to(work), r  # unpacked by Spark
        assert r["ember"] == str(env_dir / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
                                 / "site-packages" / "ember" / "__init__.py"), r
        assert r["native"].startswith(str(env_dir) + "/"), r
        assert r["executable"].startswith(str(env_dir.parent)), r


CONNECT_CLIENT = r'''
import json, sys
from pyspark.sql import SparkSession
import ember

url, archive, out = sys.argv[1:4]
spark = SparkSession.builder.remote(url).getOrCreate()
spark.addArtifacts(f"{archive}#environment", archive=True)          # what `ember pack` prints
spark.conf.set("spark.sql.execution.pyspark.python", "environment/bin/python")

def where_is_ember(args, ctx):
    import json, sys
    import ember
    from ember import _ember
    with open(f"{args['out']}/{ctx.task_index}.json", "w") as f:
        json.dump({"ember": ember.__file__, "native": _ember.__file__, "prefix": sys.prefix}, f)

cluster = ember.Cluster.run(spark, where_is_ember, {"out": out}, num_executors=2, reservation_timeout=120)
cluster.shutdown(timeout=120)
print("JOB " + cluster.job_id, flush=True)
'''


def test_a_connect_client_ships_the_archive_with_add_artifacts(packed, bare_cluster, tmp_path):
    """`ember pack`'s Spark Connect form: the client adds the archive to its session and names
    its Python; a standalone cluster's executors without Ember run the nodes from it."""
    from connect_server import ConnectServer

    _, proc, archive = packed
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "reports"
    out.mkdir()
    standalone = bare_cluster
    server = ConnectServer(standalone.master_url, tmp_path / "connect.log",
                           conf={"spark.pyspark.python": str(Path(sys.base_prefix) / "bin" / "python3")})
    try:
        client = subprocess.run([sys.executable, "-c", CONNECT_CLIENT, server.url, str(archive), str(out)],
                                capture_output=True, text=True, timeout=360)
    finally:
        server.stop()
    assert client.returncode == 0, f"{client.stdout[-3000:]}\n{client.stderr[-6000:]}\n{server.log_tail()}"
    job_id = next(line.split()[1] for line in client.stdout.splitlines() if line.startswith("JOB "))
    no_leftovers(job_id)
    work = standalone.base_dir / "work"
    for i in range(2):
        r = json.loads((out / f"{i}.json").read_text())
        env_dir = Path(r["prefix"])
        assert env_dir.name == "environment" and env_dir.is_relative_to(work), r  # unpacked by Spark
        assert r["ember"].startswith(str(env_dir) + "/") and r["native"].startswith(str(env_dir) + "/"), r
