"""The Python package is layered: each module imports only modules of lower layers.

Spark glue and framework adapters sit on the native core; the public verbs sit on
top.  A new import that points up (or sideways) fails here, naming both modules.

The private modules live in rooms, one subpackage per process they run in (ember/_driver,
_launcher, _feeder, _node; their __init__.py says what each holds).  A room's modules are
layered one by one under their dotted names ("_driver.watcher"); a public subpackage (data,
compat) is one layer under its own name.
"""
import ast
from pathlib import Path

import ember

PACKAGE = Path(ember.__file__).parent

# Lowest first.  A module may import only from layers before its own.
LAYERS = [
    {"_names", "_net", "errors", "input_mode", "config", "_launcher.proc", "_arrow_rows", "collective", "_hadoop",
     "_driver", "_launcher", "_feeder", "_node",  # the rooms' __init__: a docstring only
     "_feeder.worker"},  # a Spark Python worker settled once (zip importers, frozen heap)
    # the driver's console (reads config); a node's environment and rank rule; rings that die with their launcher; GPUs on each side
    {"_driver.console", "_node.env", "_launcher.ring_owner", "_launcher.gpus", "_driver.gpus",
     "_driver.spark_side", "_launcher.relay",  # ... the one seam to Spark (classic or Connect); a coordinator relay
     "_parquet_io", "_jvm"},  # Parquet files through Ember's FileSystem layer; the file-rows reference of the feed; Ember's Spark extension jar
    {"_driver.relay", "_delta_log"},  # where the nodes reach the coordinator; a Delta table's log
    {"_driver.scan"},         # is a DataFrame a plain Parquet (or Delta) scan
    {"summary"},              # TensorBoard event files, written by the core
    {"checkpoint"},           # checkpoints, written and verified by the core
    {"ps"},                   # the parameter server's client and server (shards checkpoint through the above)
    {"tf", "torch", "_torch_program"},  # framework adapters over numpy columns; TorchModel's torch.export program
    {"keras"},                # the Keras callbacks and optimizer (on Keras's torch backend: ember.torch's reducers)
    {"feed"},                 # the node's DataFeed over the core's consumer
    {"context", "_feeder.task"},  # the node's ctx; the feeding tasks' Spark glue
    # the launching task; the node's process; data/: TFRecord and Parquet datasets, DataFrame <-> TFRecord
    {"_launcher.task", "_node.main", "data"},
    {"_driver.spark_job", "_driver.watcher"},
    # a job's nodes (coordinator, barrier job, watcher; start, stop, recover); the feeding jobs and the epoch loop
    {"_driver.gang", "_driver.feed"},
    {"cluster"},
    {"parallel"},          # run_parallel: independent one-node clusters
    {"_tune_runner"},      # tune's warm trial runners: one-node parallel runs that take trial after trial
    {"ml", "tune"},        # Spark ML stages; hyperparameter search over parallel runs
    {"compat"},            # ember.compat.tensorflowonspark: TFoS's API over all of the above
    {"_pack"},             # ember pack: the virtual environment as an archive for spark.archives
    {"__init__", "_cli"},  # the package and the `ember` command
]
LAYER = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def is_room(name: str) -> bool:
    """Whether `name` is a subpackage whose modules are layered one by one (a private one)."""
    return name.startswith("_") and (PACKAGE / name / "__init__.py").exists()


def layered_name(dotted: str) -> str:
    """The layer name of module ``ember.<dotted>``: a room's module by its dotted name, a public
    subpackage's module by the subpackage, a top module by its own."""
    parts = dotted.split(".")
    if is_room(parts[0]) and len(parts) > 1:
        return f"{parts[0]}.{parts[1]}"
    return parts[0]


def ember_imports(path: Path):
    """Layer names of the ember modules `path` imports, anywhere in it (lazy imports count)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "ember":
                out.update(a.name for a in node.names)
            elif node.module.startswith("ember."):
                sub = node.module[len("ember."):]
                if is_room(sub):  # from ember._driver import watcher
                    out.update(layered_name(f"{sub}.{a.name}") for a in node.names)
                else:
                    out.add(layered_name(sub))
        elif isinstance(node, ast.Import):
            out.update(layered_name(a.name[len("ember."):]) for a in node.names if a.name.startswith("ember."))
    return out - {"_ember"}  # the native module is below everything


def modules():
    """(name, file) for every module of the package: a room's modules by their dotted names, a
    public subpackage's files all by its name."""
    for path in sorted(PACKAGE.glob("*.py")):
        yield path.stem, path
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        room = init.parent.name
        for path in sorted(init.parent.rglob("*.py")):
            if is_room(room):
                yield (room if path.stem == "__init__" else f"{room}.{path.stem}"), path
            else:
                yield room, path


def test_every_room_module_is_named_by_its_room():
    names = {name for name, _ in modules()}
    assert {"_driver.watcher", "_launcher.task", "_feeder.task", "_node.main"} <= names


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


# The processes' rooms: the driver starts the tasks, the launching task starts the node.  Code
# that runs in a task or a node never imports the driver's room, and a node's code never
# imports a task's (the launcher may import the node's environment rule: it builds it).
MAY_NOT_IMPORT = {"_launcher": {"_driver", "_feeder"}, "_feeder": {"_driver", "_launcher", "_node"},
                  "_node": {"_driver", "_launcher", "_feeder"}}


def test_rooms_import_no_room_of_a_process_that_starts_them():
    wrong = []
    for name, path in modules():
        room = name.split(".")[0]
        for dep in sorted(ember_imports(path)):
            if dep.split(".")[0] in MAY_NOT_IMPORT.get(room, ()):
                wrong.append(f"{path.relative_to(PACKAGE)} ({room}) imports ember.{dep}")
    assert wrong == []
