"""Shipping the environment to the executors: ``ember pack`` / ``ember.pack()``.

Ember has a native module, so ``--py-files`` (TFoS's way) cannot ship it.  Spark's own answer
("Python package management" in Spark's docs) is to pack a virtual environment into an archive,
hand it to Spark with ``spark.archives=<archive>#environment`` (``--archives`` for spark-submit),
and run the executors' Python from it: ``PYSPARK_PYTHON=./environment/bin/python``.  This module
packs the current virtual environment with venv-pack, the packer those docs name, and prints
exactly those settings.

**Editable installs.**  venv-pack refuses editable installs it can see (a ``.pth`` line with a
path outside the environment), and does not see the import-hook kind pip makes today
(scikit-build-core's ``_editable_skbc_ember.pth`` runs ``import _editable_skbc_ember``, which
redirects ``import ember`` to the source tree).  Packed as is, such an archive would import Ember
from a path that exists only on this machine.  When Ember itself is installed editable, the
archive holds it as a regular install would: the package's files from the source tree
(``ember.__file__``'s directory, without ``__pycache__``) plus the built files the editable
install keeps in site-packages (the native module ``ember/_ember*.so`` and ``ember/bin/ember``);
the hook files the dist-info's RECORD lists are left out, ``direct_url.json`` (which says
"editable from file://...") is dropped, and RECORD is rewritten to name the shipped files.
Nothing is built: the archive holds the very files this environment runs.  Any other editable
package is refused, by name (install it normally, or ship it some other way).

What venv-pack does not ship: the Python interpreter itself (``bin/python`` stays a link to the
base interpreter, so executors need the same Python at the same path, or ``python_prefix`` for
where it is there) and system libraries the native module links (OpenSSL's libcrypto, libcurl,
zlib: Debian's ``libssl3``, ``libcurl4``, ``zlib1g``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Optional, Tuple

from ember.errors import EmberError

DEFAULT_OUTPUT = "ember-env.tar.gz"
ALIAS = "environment"  # the directory name Spark unpacks the archive into (the #fragment)
_FORMATS = (".tar.gz", ".tgz", ".tar", ".zip")  # what both venv-pack and spark.archives take

# Asked of the environment's own Python: where its ember comes from (an editable install
# answers with its source tree), without this process's PYTHONPATH.
_WHERE = """
import json, sysconfig
import ember
from ember import _ember
print(json.dumps({"version": getattr(ember, "__version__", None), "package": ember.__file__,
                  "native": _ember.__file__, "purelib": sysconfig.get_path("purelib"),
                  "python": __import__("sys").version.split()[0]}))
"""


class PackError(EmberError):
    """The environment cannot be packed; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class PackResult:
    """What ``pack`` made.

    Attributes:
        archive: the archive's absolute path.
        size_bytes: its size.
        seconds: how long packing took.
        prefix: the virtual environment packed.
        files: how many files the archive holds.
        ember_version: the Ember inside.
        editable_source: the source tree an editable Ember was shipped from (None: a regular install).
        python_home: the directory of the interpreter the archive's ``bin/python`` links to
            (pyvenv.cfg's ``home``); executors need it there (venv-pack does not ship it).
        python_version: that interpreter's version.
    """
    archive: Path
    size_bytes: int
    seconds: float
    prefix: Path
    files: int
    ember_version: str
    editable_source: Optional[Path]
    python_home: str
    python_version: str

    def settings(self) -> str:
        """The Spark settings that ship this archive, as Spark's "Python package management"
        docs prescribe, and a SparkSession.builder snippet."""
        a, py = str(self.archive), f"./{ALIAS}/bin/python"
        return f"""\
Spark settings (Spark's "Python package management": the archive is unpacked into ./{ALIAS}
in each executor's working directory, and the executors run its Python):

  spark-submit, client mode (the driver runs here, in this environment):
    PYSPARK_PYTHON={py} spark-submit --archives {a}#{ALIAS} app.py

  spark-submit, cluster mode (YARN, Kubernetes: the driver runs in the cluster, from the archive too;
  do not set PYSPARK_DRIVER_PYTHON or spark.pyspark.driver.python to a path of this machine):
    spark-submit --archives {a}#{ALIAS} --conf spark.pyspark.python={py} app.py

  Spark conf: spark.archives={a}#{ALIAS}   (YARN also reads spark.yarn.dist.archives)
              PYSPARK_PYTHON={py}   (environment of the driver process, before the session starts)

  In a script:
    import os
    from pyspark.sql import SparkSession
    os.environ["PYSPARK_PYTHON"] = "{py}"
    spark = (SparkSession.builder
             .config("spark.archives", "{a}#{ALIAS}")
             .getOrCreate())

  From a Spark Connect client (the archive goes to this client's session on the server; the
  session's Python workers run from it):
    spark.addArtifacts("{a}#{ALIAS}", archive=True)
    spark.conf.set("spark.sql.execution.pyspark.python", "{ALIAS}/bin/python")

The archive links, and does not hold, the interpreter: executors need Python {self.python_version}
in {self.python_home} (else pack with --python-prefix=<its prefix there>). See docs/deploy.md."""

    def summary(self) -> str:
        how = (f"Ember {self.ember_version}, editable from {self.editable_source}, shipped as a regular install"
               if self.editable_source else f"Ember {self.ember_version}")
        return (f"packed {self.prefix} ({self.files} files; {how}) into {self.archive}: "
                f"{self.size_bytes / 2**20:,.1f} MiB in {self.seconds:.0f} s")


def current_venv() -> Path:
    """The virtual environment this Python runs in; PackError when it runs in none."""
    if sys.prefix == getattr(sys, "base_prefix", sys.prefix) or not (Path(sys.prefix) / "pyvenv.cfg").is_file():
        raise PackError(
            f"ember pack packs a virtual environment, and this Python ({sys.executable}) runs in none. "
            f"Make one with the libraries your job needs and Ember (python3 -m venv env && "
            f"env/bin/pip install ember ...), then run env/bin/ember pack; or pass prefix= / --prefix. "
            f"(A conda environment: use conda-pack.)")
    return Path(sys.prefix)


def pack(output: Optional[str] = None, *, prefix: Optional[str] = None, force: bool = False,
         compress_level: int = 4, python_prefix: Optional[str] = None,
         timeout: float = 120.0) -> PackResult:
    """Packs a virtual environment, Ember included, into an archive for ``spark.archives``.

    Args:
        output: the archive to write (.tar.gz, .tgz, .tar or .zip); default ember-env.tar.gz.
        prefix: the virtual environment to pack; default the one this Python runs in.
        force: overwrite `output` if it exists (else PackError).
        compress_level: gzip level, 0-9 (lower is faster and bigger).
        python_prefix: where the base Python lives on the executors, if not where it lives here
            (venv-pack relinks ``bin/python`` to it).
        timeout: seconds the environment's Python may take to say where its Ember is.

    Returns:
        a PackResult; ``print(result.settings())`` gives the Spark settings.

    Raises:
        PackError: not a virtual environment, its Python cannot import ember, another package is
            installed editable, the output exists, or venv-pack refused; the message says which.
    """
    try:
        import venv_pack
    except ImportError as e:
        raise PackError(f"ember pack packs with venv-pack, which this Python ({sys.executable}) lacks: "
                        f"pip install venv-pack ({e})") from e

    started = time.monotonic()
    venv = Path(prefix).resolve() if prefix else current_venv()
    if not (venv / "pyvenv.cfg").is_file():
        raise PackError(f"{venv} is not a virtual environment (it has no pyvenv.cfg)")
    out = Path(output or DEFAULT_OUTPUT).absolute()
    if not str(out).endswith(_FORMATS):
        raise PackError(f"{out}: the archive must end in one of {', '.join(_FORMATS)} (what spark.archives unpacks)")
    if out.exists() and not force:
        raise PackError(f"{out} exists; pass force=True (ember pack --force) to overwrite it")
    where = _where_is_ember(venv, timeout)
    site = Path(where["purelib"])
    site_rel = site.relative_to(venv).as_posix()
    _refuse_other_editables(site)
    package = Path(where["package"]).parent
    editable = None if _inside(package, venv) else package
    hooks = _editable_hooks(site) if editable is not None else []
    try:
        env = _load_env(venv_pack, venv, site, {h for h in hooks if h.endswith(".pth")})
    except venv_pack.VenvPackException as e:
        raise PackError(f"venv-pack cannot pack {venv}: {e}") from e
    with tempfile.TemporaryDirectory(prefix="ember-pack-") as tmp:
        if editable is not None:
            env = _ship_editable_as_installed(env, venv_pack.File, site, site_rel, editable, hooks, Path(tmp))
        try:
            env.pack(output=str(out), force=force, compress_level=compress_level, python_prefix=python_prefix)
        except venv_pack.VenvPackException as e:
            raise PackError(f"venv-pack could not pack {venv} into {out}: {e}") from e
    home = f"{python_prefix}/bin" if python_prefix else _pyvenv_home(venv)
    return PackResult(archive=out, size_bytes=out.stat().st_size, seconds=time.monotonic() - started,
                      prefix=venv, files=len(env.files) + 2,  # + venv-pack's activate and pyvenv.cfg
                      ember_version=str(where["version"]), editable_source=editable,
                      python_home=home, python_version=where["python"])


def _where_is_ember(venv: Path, timeout: float) -> dict:
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    try:
        proc = subprocess.run([str(python), "-c", _WHERE], capture_output=True, text=True, timeout=timeout,
                              env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise PackError(f"{python} did not say where its ember is within {timeout:g}s") from None
    except OSError as e:
        raise PackError(f"cannot run {python}: {e}") from e
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise PackError(f"the environment's Python {python} cannot import ember and its native module "
                        f"({last}); install Ember into it (pip install ...) before packing it")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def _editables(site: Path) -> List[Tuple[str, str]]:
    """(distribution, where from) of every package installed editable in `site` (PEP 610)."""
    found = []
    for direct in sorted(site.glob("*.dist-info/direct_url.json")):
        try:
            info = json.loads(direct.read_text())
        except (OSError, ValueError):
            continue
        if (info.get("dir_info") or {}).get("editable"):
            found.append((direct.parent.name.split("-")[0], str(info.get("url"))))
    return found


def _refuse_other_editables(site: Path) -> None:
    others = [(name, url) for name, url in _editables(site) if name.lower() != "ember"]
    if others:
        raise PackError(
            "ember pack ships Ember's own editable install as a regular one, but not other editable "
            "packages, whose files live outside the environment: "
            + ", ".join(f"{n} (editable from {u})" for n, u in others)
            + ". Install them normally (pip install <dir>, not -e) and pack again.")


def _ember_dist(site: Path) -> Path:
    dist = sorted(site.glob("ember-*.dist-info"))
    if len(dist) != 1:
        raise PackError(f"expected one ember-*.dist-info in {site}, found {[d.name for d in dist]}")
    return dist[0]


def _editable_hooks(site: Path) -> List[str]:
    """The files of Ember's editable hook: top-level files its install put beside the packages
    (its dist-info's RECORD says which), a .pth and the finder module it imports, e.g.
    _editable_skbc_ember.pth/.py (scikit-build-core) or __editable__.ember-*.pth (setuptools)."""
    record = [line.split(",")[0] for line in (_ember_dist(site) / "RECORD").read_text().splitlines() if line.strip()]
    return [p for p in record if "/" not in p and (p.endswith(".pth") or p.endswith(".py"))]


_env_lock = threading.Lock()


def _load_env(venv_pack, venv: Path, site: Path, ember_pth: set):
    """venv_pack.Env(venv), with venv-pack's refusal of editable installs applied to every .pth
    file but Ember's own hook (which _ship_editable_as_installed replaces).  venv-pack has no
    option for that, so its check is swapped for the same rule over the other files while the
    Env is built (under a lock: the swap is process-wide)."""
    core = venv_pack.core
    foreign = []
    for pth in sorted(site.glob("*.pth")):
        if pth.name in ember_pth:
            continue
        for line in pth.read_text(errors="replace").splitlines():
            line = line.rstrip()
            if line and not line.startswith(("#", "import ", "import\t")):
                location = os.path.normpath(os.path.join(site, line))
                if not location.startswith(str(venv)):
                    foreign.append(f"{line} (from {pth.name})")
    if foreign:
        raise PackError("venv-pack cannot pack editable packages other than Ember, whose files live outside "
                        "the environment: " + ", ".join(foreign) + ". Install them normally and pack again.")
    with _env_lock:
        check = core.check_no_editable_packages
        core.check_no_editable_packages = lambda context: None
        try:
            return venv_pack.Env(str(venv))
        finally:
            core.check_no_editable_packages = check


def _ship_editable_as_installed(env, File, site: Path, site_rel: str, source: Path, hooks: List[str], tmp: Path):
    """`env` with an editable Ember replaced by the files a regular install would have."""
    dist = _ember_dist(site)
    compiled = [f"__pycache__/{h[:-3]}.*.pyc" for h in hooks if h.endswith(".py")]
    for name in hooks + compiled + [f"{dist.name}/direct_url.json", f"{dist.name}/RECORD"]:
        env = env.exclude(f"{site_rel}/{name}")
    pkg_rel = f"{site_rel}/ember"
    have = {f.target for f in env.files}
    added = []
    for root, dirs, files in os.walk(source):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")):
                continue
            src = Path(root) / name
            target = f"{pkg_rel}/{src.relative_to(source).as_posix()}"
            if target not in have:  # a file of the build (the native module) wins over the tree's
                added.append(File(str(src), target))
    env.files.extend(added)
    # RECORD: every shipped file of the package and its dist-info, with hash and size (as pip
    # writes it; RECORD's own line has neither).
    shipped = sorted((f.target[len(site_rel) + 1:], f.source) for f in env.files
                     if f.target.startswith(pkg_rel + "/") or f.target.startswith(f"{site_rel}/{dist.name}/"))
    rec = tmp / "RECORD"
    rec.write_text("".join(f"{p},{_record_hash(Path(src))}\n" for p, src in shipped) + f"{dist.name}/RECORD,,\n")
    env.files.append(File(str(rec), f"{site_rel}/{dist.name}/RECORD"))
    if not any(f.target.startswith(f"{pkg_rel}/_ember") for f in env.files):
        raise PackError(f"Ember is editable from {source}, but {site / 'ember'} holds no native module _ember; "
                        f"rebuild it (pip install --no-build-isolation -e .) and pack again")
    return env


def _record_hash(path: Path) -> str:
    import base64
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    b64 = base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    return f"sha256={b64},{path.stat().st_size}"


def _pyvenv_home(venv: Path) -> str:
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip().lower() == "home":
            return value.strip()
    return "?"
