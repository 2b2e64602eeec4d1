"""The Python package is layered: each module imports only modules of lower layers.

Spark glue and framework adapters sit on the native core; the public verbs sit on
top.  A new import that points up (or sideways) fails here, naming both modules.
"""
import ast
from pathlib import Path

import ember

PACKAGE = Path(ember.__file__).parent

# Lowest first.  A module may import only from layers before its own.
LAYERS = [
    {"_names", "errors", "input_mode", "config", "_proc", "_arrow_rows", "collective", "_hadoop"},
    # the driver's console (reads config); a node's environment and rank rule; rings that die with their launcher
    {"_console", "_node_env", "_ring_owner"},
    {"summary"},              # TensorBoard event files, written by the core
    {"checkpoint"},           # checkpoints, written and verified by the core
    {"tf", "torch", "keras"},  # framework adapters over numpy columns; the Keras callback
    {"feed"},                 # the node's DataFeed over the core's consumer
    {"context", "_feeding"},  # the node's ctx; the feeding tasks' Spark glue
    {"_launcher", "_node_main", "_feed_driver", "data"},  # data/: TFRecord datasets, DataFrame <-> TFRecord
    {"_spark_job", "_watcher"},
    {"cluster"},
    {"parallel"},          # run_parallel: independent one-node clusters
    {"_tune_runner"},      # tune's warm trial runners: one-node parallel runs that take trial after trial
    {"ml", "tune"},        # Spark ML stages; hyperparameter search over parallel runs
    {"compat"},            # ember.compat.tensorflowonspark: TFoS's API over all of the above
    {"_pack"},             # ember pack: the virtual environment as an archive for spark.archives
    {"__init__", "_cli"},  # the package and the `ember` command
]
LAYER = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def ember_imports(path: Path):
    """Names of the ember modules `path` imports, anywhere in it (lazy imports count)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "ember":
                out.update(a.name for a in node.names)
            elif node.module.startswith("ember."):
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out.update(a.name.split(".")[1] for a in node.names if a.name.startswith("ember."))
    return out - {"_ember"}  # the native module is below everything


def modules():
    """(name, file) for every module of the package; a subpackage's files all carry its name."""
    for path in sorted(PACKAGE.glob("*.py")):
        yield path.stem, path
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        for path in sorted(init.parent.rglob("*.py")):
            yield init.parent.name, path


def test_every_module_has_a_layer():
    names = {name for name, _ in modules()}
    assert names - set(LAYER) == set(), "add new modules to LAYERS"


def test_imports_point_only_down():
    wrong = []
    for name, path in modules():
        me = LAYER[name]
        for dep in sorted(ember_imports(path) - {name}):
            if LAYER.get(dep, len(LAYERS)) >= me:
                wrong.append(f"{path.relative_to(PACKAGE)} (layer {me}) imports ember.{dep} (layer {LAYER.get(dep)})")
    assert wrong == []
