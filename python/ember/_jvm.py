"""Ember's Spark extension: SQL functions that run in Spark's JVM (issue 23, point 4).

``ember_pack_floats(array<float|double>) -> binary``: a row's numbers as one little-endian float32
buffer (and ``ember_unpack_floats``, its inverse).  Spark hands an array column to a Python worker
element by element (its Arrow writer for ArrayType); a binary column crosses as one copy per row,
and a batch of equal-length rows arrives in the worker as one buffer numpy views whole.
KerasModel.transform uses it when the session has it (:func:`has_pack_floats`).  And a join by
position for ``cluster.inference`` (:func:`infer_by_position`, planned by a strategy the extension
injects).

The jar is built from the Scala source shipped in the package (``ember/_scala/*.scala``) by the
Scala compiler pyspark itself ships (``pyspark/jars/scala-compiler-*.jar``) with the ``java``
Spark runs on: no download, a few seconds, once per source and pyspark version, into a cache
directory (``EMBER_JAR_DIR``, else ``$XDG_CACHE_HOME/ember`` or ``~/.cache/ember``).

A session loads it with :func:`spark_conf`'s two settings, at its start (they are static)::

    spark = SparkSession.builder.config(map=ember.spark_conf()).getOrCreate()

A Spark Connect server takes the same two settings on its command line (``--conf``).
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import weakref
import zipfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence

from ember.errors import DeadlineExceeded, EmberError

EXTENSIONS = "org.ember.spark.EmberExtensions"  # the class spark.sql.extensions names
PACK_FLOATS = "ember_pack_floats"
UNPACK_FLOATS = "ember_unpack_floats"  # binary -> array<float>: PACK_FLOATS undone (cluster.inference's output)
SOURCES = Path(__file__).parent / "_scala"
BUILD_TIMEOUT = 300.0


def _java() -> str:
    """The `java` Spark itself would run (JAVA_HOME's, else PATH's)."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    found = shutil.which("java")
    if not found:
        raise EmberError("building Ember's Spark extension needs `java` (the one Spark runs on): set JAVA_HOME "
                         "or put java on PATH")
    return found


def _spark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _cache_dir() -> Path:
    if os.environ.get("EMBER_JAR_DIR"):
        return Path(os.environ["EMBER_JAR_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ember"


def spark_jar(cache_dir: Optional[str] = None) -> str:
    """The path of Ember's Spark extension jar, built on first use (see the module's doc).

    Raises:
        EmberError: no `java`, or the compiler failed (its output is in the message).
        DeadlineExceeded: the build took longer than 300 s.
    """
    import pyspark

    sources = sorted(SOURCES.glob("*.scala"))
    key = hashlib.sha256(pyspark.__version__.encode() + b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    out = Path(cache_dir) if cache_dir else _cache_dir()
    jar = out / f"ember-spark-{key}.jar"
    if jar.exists():
        return str(jar)
    jars = _spark_jars()
    compiler = [str(p) for name in ("scala-compiler", "scala-library", "scala-reflect")
                for p in sorted(jars.glob(f"{name}-2.*.jar"))]
    if len(compiler) != 3:
        raise EmberError(f"building Ember's Spark extension needs the Scala compiler pyspark ships; {jars} "
                         f"holds {', '.join(Path(c).name for c in compiler) or 'none of it'}")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ember-jar-", dir=out) as tmp:
        classes = Path(tmp, "classes")
        classes.mkdir()
        cmd = [_java(), "-cp", os.pathsep.join(compiler), "scala.tools.nsc.Main", "-nowarn",
               "-classpath", str(jars / "*"), "-d", str(classes), *map(str, sources)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise DeadlineExceeded(f"compiling Ember's Spark extension ({', '.join(p.name for p in sources)}) took "
                                   f"over {BUILD_TIMEOUT:g}s; a loaded host may need a second try") from None
        if done.returncode != 0:
            raise EmberError(f"compiling Ember's Spark extension failed (exit {done.returncode}):\n"
                             f"{(done.stdout + done.stderr)[-4000:]}")
        part = Path(tmp, jar.name)
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: ember\n\n")
            for f in sorted(classes.rglob("*.class")):
                z.write(f, f.relative_to(classes).as_posix())
        os.replace(part, jar)  # whole or absent, whoever else builds at the same time
    return str(jar)


def _join(existing: Optional[str], item: str) -> str:
    parts: List[str] = [p.strip() for p in (existing or "").split(",") if p.strip()]
    return ",".join(parts if item in parts else parts + [item])


def spark_conf(conf: Optional[Mapping[str, str]] = None, cache_dir: Optional[str] = None) -> Dict[str, str]:
    """``spark.jars`` and ``spark.sql.extensions`` that load Ember's extension, each merged
    with `conf`'s own value (both are comma-separated lists: Delta's extension stays)."""
    conf = dict(conf or {})
    return {"spark.jars": _join(conf.get("spark.jars"), spark_jar(cache_dir)),
            "spark.sql.extensions": _join(conf.get("spark.sql.extensions"), EXTENSIONS)}


_warned: "weakref.WeakSet" = weakref.WeakSet()  # sessions told that their extension did not load (once each)


def has_pack_floats(spark: Any) -> bool:
    """Whether `spark` (classic or Connect) has ember_pack_floats registered.  When it has not
    but its ``spark.sql.extensions`` names Ember's (the session was created in a JVM started
    without Ember's jar, where Spark itself only warns ClassNotFoundException), says so once,
    on the ``ember`` logger, with what to do."""
    if spark.catalog.functionExists(PACK_FLOATS):
        return True
    try:
        named = EXTENSIONS in (spark.conf.get("spark.sql.extensions", None) or "")
    except Exception:  # noqa: BLE001 - a setting that cannot be read: nothing to tell
        named = False
    if named and spark not in _warned:
        _warned.add(spark)
        logging.getLogger("ember").warning(
            "spark.sql.extensions names %s but this Spark session lacks %s: its JVM was started without Ember's "
            "jar (spark.jars counts only when the JVM starts: an earlier session in this Python process or "
            "notebook started it, and spark.stop() keeps it). Ember goes on with Spark's slower element-by-element "
            "array hand-over. To load the extension, give ember.spark_conf() to the first session of a new Python "
            "process (restart the notebook's kernel), or to a Spark Connect server at its start",
            EXTENSIONS, PACK_FLOATS)
    return False


def infer_by_position(df: Any, fn: Callable[[Iterator[Any]], Iterator[Any]], args: Sequence[Any],
                      result_type: Any, batch_bytes: int, name: str) -> Any:
    """`df` (classic PySpark, with Ember's extension) with `result_type`'s fields appended, row for
    row: `fn` receives Arrow record batches of the columns `args` (pyspark Columns over `df`'s
    columns, each with a name: e.g. ``F.col(c)``, ``F.call_function(PACK_FLOATS, F.col(c)).alias(c)``)
    and must answer record batches of `result_type` (a StructType), exactly as many rows, in
    order.  Spark keeps each row in the JVM and joins the answers to it by position
    (InferByPosition.scala): no column crosses back from Python.  The rows go to `fn` in batches
    of about `batch_bytes` (and at most spark.sql.execution.arrow.maxRecordsPerBatch rows).
    `name` names the caller in errors."""
    from pyspark.sql import DataFrame
    from pyspark.sql.udf import _wrap_function

    spark = df.sparkSession
    sc = spark.sparkContext
    cols = sc._gateway.new_array(sc._jvm.org.apache.spark.sql.Column, len(args))
    for i, c in enumerate(args):
        cols[i] = c._jc
    jdf = sc._jvm.org.apache.spark.sql.ember.InferByPosition.apply(
        df._jdf, _wrap_function(sc, fn, result_type), cols, result_type.json(), name, int(batch_bytes))
    return DataFrame(jdf, spark)
