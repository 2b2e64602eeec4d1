"""Elephas 7.3.0's API on Ember (issue 21, in progress): an Elephas program runs with its
imports changed.

    # was: from elephas.spark_model import SparkModel
    #      from elephas.utils.rdd_utils import to_simple_rdd
    from ember.compat.elephas import SparkModel, to_simple_rdd

    rdd = to_simple_rdd(sc, x_train, y_train)
    spark_model = SparkModel(model, frequency="epoch", mode="asynchronous", num_workers=2)
    spark_model.fit(rdd, epochs=20, batch_size=32, verbose=0)
    spark_model.master_network.evaluate(x_test, y_test)   # or spark_model.evaluate / predict
    spark_model.predict(features_rdd)   # distributed: a list of predictions, in the RDD's order

    # was: from elephas.ml_model import ElephasEstimator
    from ember.compat.elephas import ElephasEstimator

    estimator = ElephasEstimator(featuresCol="features", labelCol="label")
    estimator.set_keras_model_config(model.to_json())
    estimator.set_optimizer_config(keras.optimizers.serialize(keras.optimizers.Adam(0.01)))
    estimator.set_loss("categorical_crossentropy")
    estimator.set_categorical_labels(True)
    estimator.set_nb_classes(3)
    estimator.set_mode("synchronous")
    estimator.set_num_workers(2)
    fitted = Pipeline(stages=[assembler, estimator]).fit(df)   # its last stage: ElephasTransformer
    fitted.transform(df)    # every input column, plus "prediction"

Also here: ``to_labeled_point``, ``from_labeled_point``, ``lp_to_simple_rdd`` and
``encode_label`` (``elephas.utils.rdd_utils``, pyspark.mllib LabeledPoints), and
``load_ml_estimator`` / ``load_ml_transformer`` for the stages' ``save(file_name)`` (Elephas's
HDF5 files: one JSON attribute, ``distributed_config``).

What runs underneath:

* ``mode="asynchronous"`` / ``"hogwild"``: one Ember job with a parameter-server shard on the
  driver's host (``num_ps=1, driver_ps_nodes=True``, where Elephas runs its server) and
  `num_workers` training nodes fed the RDD's partitions (InputMode.SPARK).  Each node trains
  the model with ``ember.keras.AsyncCallback``: every `frequency` ("epoch" or "batch") it
  pushes its weight delta, which the shard adds (under a lock; ``hogwild``: without one),
  and pulls the shard's weights, as Elephas's workers do.  The shard is Ember's C++ server on
  the job's authenticated transport, not Elephas's Flask/socket server.
* ``mode="synchronous"``: Ember's synchronous training (``ember.keras.DistributedOptimizer``:
  gradients averaged every step, bit-identical replicas) instead of Elephas's averaging of
  the workers' weights after each epoch; the result is what the same model trained on all the
  data would reach.
* ``fit`` returns once every node finished; the trained weights come back to the driver and
  ``master_network`` (the model you passed) holds them.
* ``predict(rdd)`` sends the model once (its ``.keras`` file, broadcast), loads it once per
  partition and predicts in batches of rows; the rows come back as Elephas's do, a list of
  numpy arrays (one per input row, in order).  ``predict(numpy_array)`` gives the same list,
  computed on the driver where the array already is.  ``evaluate`` (numpy arrays, as in
  Elephas) runs on the driver.
* ``ElephasEstimator.fit(df)`` builds the model from its JSON, compiles it with the optimizer
  config, loss and metrics, and trains it with ``SparkModel`` (mode, frequency, num_workers
  honoured) on two columns made in the JVM: the features (a Vector column, as float arrays)
  and the label (a number; one-hot over ``nb_classes`` when ``categorical``).  The
  ``ElephasTransformer`` it returns predicts with ``ember.ml.KerasModel`` (a pandas UDF over
  the features column; every other column stays in the JVM, rows keep their order), and its
  output column has Elephas's type: the model's outputs as ``array<double>``, or a ``double``
  when the loss is a regression loss (``mse``, ``mae``, ...).

Not carried over: ``parameter_server_mode`` and ``port`` (the shard picks its own port on the
job's transport), ``validation_split`` (warned; evaluate on held-out data afterwards),
``custom_objects`` beyond what ``keras.saving`` registers (the model travels as a ``.keras``
file loaded with ``safe_mode=True``), models with several inputs or outputs, pyspark.mllib
Vector columns in DataFrames, and Spark ML persistence (``write()``) of the two stages.
Stricter than Elephas: setters check their values (Elephas takes anything and fails, or
silently ignores it, later), and ``ElephasEstimator`` honours `mode` and `frequency` (Elephas
7.3.0's estimator always averages synchronously).
"""
from __future__ import annotations

import enum
import functools
import itertools
import json
import time
import warnings
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params
from pyspark.ml.param.shared import HasFeaturesCol, HasLabelCol, HasOutputCol

_WEIGHTS_KEY = "ember/elephas/weights"  # the chief's final weights (npz), for the driver
_PREDICT_ROWS = 1024  # rows per model call in SparkModel.predict(rdd)
_MODES = ("asynchronous", "hogwild", "synchronous")
_FREQUENCIES = ("epoch", "batch")


# --------------------------------------------------------------------------- elephas.utils.rdd_utils
def to_simple_rdd(sc: Any, features: Any, labels: Any):
    """An RDD of (features, label) pairs, as Elephas's ``to_simple_rdd``."""
    return sc.parallelize(list(zip(np.asarray(features), np.asarray(labels))))


def encode_label(label: Any, nb_classes: int) -> np.ndarray:
    """Class `label` (a whole number) one-hot over `nb_classes`, as float64."""
    out = np.zeros(nb_classes)
    out[int(label)] = 1.0
    return out


def to_labeled_point(sc: Any, features: Any, labels: Any, categorical: bool = False):
    """An RDD of pyspark.mllib LabeledPoints; with `categorical`, `labels` are one-hot rows and
    each point's label is the class index."""
    from pyspark.mllib.linalg import Vectors
    from pyspark.mllib.regression import LabeledPoint

    x, y = np.asarray(features), np.asarray(labels)
    return sc.parallelize([LabeledPoint(float(np.argmax(b)) if categorical else b, Vectors.dense(a))
                           for a, b in zip(x, y)])


def _lp_label(label: float) -> Any:
    return int(label) if float(label).is_integer() else float(label)


def from_labeled_point(rdd: Any, categorical: bool = False,
                       nb_classes: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """The LabeledPoint RDD `rdd` collected as (features, labels) numpy arrays; with
    `categorical`, labels one-hot over `nb_classes` (default: the largest label + 1).  Whole
    labels come back as integers, as Elephas's do (other labels stay floats)."""
    pairs = rdd.map(lambda lp: (lp.features.toArray(), _lp_label(lp.label))).collect()
    if not pairs:
        return np.empty((0,)), np.empty((0,))
    x = np.stack([a for a, _ in pairs])
    y = np.asarray([b for _, b in pairs])
    if categorical:
        n = int(nb_classes or int(y.max()) + 1)
        y = np.stack([encode_label(b, n) for b in y])
    return x, y


def lp_to_simple_rdd(lp_rdd: Any, categorical: bool = False, nb_classes: Optional[int] = None):
    """The LabeledPoint RDD `lp_rdd` as an RDD of (features, label) pairs (numpy); with
    `categorical`, labels one-hot over `nb_classes` (default: the largest label + 1, one Spark
    job to find it)."""
    if not categorical:
        return lp_rdd.map(lambda lp: (lp.features.toArray(), lp.label))
    n = int(nb_classes or lp_rdd.map(lambda lp: int(lp.label)).max() + 1)
    return lp_rdd.map(lambda lp: (lp.features.toArray(), encode_label(lp.label, n)))


def _node_main(args: dict, ctx: Any) -> None:
    """Every node of SparkModel.fit: the ps node serves; the workers train."""
    import io

    import ember.keras as ek
    import ember.ps
    from ember import parallel

    if ctx.job_name == "ps":
        ember.ps.serve(ctx)  # until shutdown
    model = parallel.load_keras_model(args["model_bytes"], compile=True)
    in_shape = tuple(model.inputs[0].shape[1:])

    def to_xy(cols):
        x, y = cols["_0"], cols["_1"]
        x = np.asarray(x, np.float32).reshape((-1,) + in_shape)
        return x, (y.astype(np.float32) if y.dtype == np.float64 else y)

    ds = ctx.get_data_feed(train_mode=True).to_tf_dataset(args["batch_size"], transform=to_xy)
    callbacks = [ek.ProgressCallback(ctx, every_n_steps=50, batch_size=args["batch_size"])]
    if args["mode"] == "synchronous":
        ek.DistributedOptimizer(model.optimizer)
        callbacks.append(ek.SyncCallback())
    else:
        ps = ember.ps.connect(ctx, timeout=args["timeout"])
        callbacks.append(ek.AsyncCallback(ps, frequency=args["frequency"], prefix="elephas/",
                                          hogwild=args["mode"] == "hogwild"))
    model.fit(ds, epochs=args["epochs"], verbose=ek.verbose(args["verbose"]), shuffle=False, callbacks=callbacks)
    comm = ctx.communicator()
    comm.barrier()  # every worker's last push is in
    if ctx.is_chief:
        if args["mode"] != "synchronous":
            for v in model.weights:  # the shard's weights, now that no worker pushes any more
                if "float" in str(v.dtype):
                    v.assign(ps.pull("elephas/" + v.path, shape=tuple(v.shape))[0])
        buf = io.BytesIO()
        np.savez(buf, *[np.asarray(w) for w in model.get_weights()])
        ctx._coordinator_client().kv_set(_WEIGHTS_KEY, buf.getvalue())


def _predict_partition(model_bytes: Any, rows_per_call: int, rows: Iterable[Any]) -> Iterator[np.ndarray]:
    """One partition of SparkModel.predict(rdd): its rows' predictions, one array per row, in
    order.  The model is loaded from the broadcast ``.keras`` bytes at the first row (an empty
    partition loads nothing)."""
    from ember import parallel

    it = iter(rows)
    model = in_shape = None
    while True:
        batch = list(itertools.islice(it, rows_per_call))
        if not batch:
            return
        if model is None:
            model = parallel.load_keras_model(model_bytes.value, compile=False)
            in_shape = tuple(model.inputs[0].shape[1:])
        x = np.asarray(batch)
        if x.shape[1:] != in_shape and None not in in_shape:  # flat rows for e.g. a CNN, as fit takes them
            width = int(np.prod(in_shape))
            if x.ndim < 2 or int(np.prod(x.shape[1:])) != width:
                raise ValueError(f"SparkModel.predict: the RDD's rows have shape {x.shape[1:]} but the model's "
                                 f"input {in_shape} takes {width} values")
            x = x.reshape((len(batch),) + in_shape)
        yield from np.asarray(model.predict_on_batch(x))


class SparkModel:
    """Elephas's ``SparkModel``: trains a compiled Keras model on an RDD of (features, label)
    pairs over `num_workers` Ember nodes (see the module doc)."""

    # Elephas 7.3.0's order, so positional calls mean the same.
    def __init__(self, model: Any, num_workers: Optional[int] = None, custom_objects: Any = None,
                 batch_size: int = 32, mode: str = "asynchronous", frequency: str = "epoch",
                 parameter_server_mode: str = "http", port: int = 4000, *args: Any, **kwargs: Any):
        if mode not in ("asynchronous", "hogwild", "synchronous"):
            raise ValueError(f"SparkModel: mode must be 'asynchronous', 'hogwild' or 'synchronous', got {mode!r}")
        if frequency not in ("epoch", "batch"):
            raise ValueError(f"SparkModel: frequency must be 'epoch' or 'batch', got {frequency!r}")
        if getattr(model, "optimizer", None) is None:
            raise ValueError("SparkModel: compile the model first (model.compile(optimizer=..., loss=...))")
        self._master_network = model
        self.mode, self.frequency, self.num_workers = mode, frequency, num_workers
        self.batch_size = batch_size
        self.parameter_server_mode = parameter_server_mode  # accepted; Ember's shard serves either way
        self.custom_objects = custom_objects or {}
        self.training_histories = []
        self.timeout = float(kwargs.pop("timeout", 3600.0))

    @property
    def master_network(self) -> Any:
        return self._master_network

    def get_config(self) -> dict:
        return {"mode": self.mode, "frequency": self.frequency, "num_workers": self.num_workers,
                "batch_size": self.batch_size, "parameter_server_mode": self.parameter_server_mode}

    def fit(self, rdd: Any, epochs: int = 10, batch_size: int = 32, verbose: int = 0,
            validation_split: float = 0.1, **kwargs: Any) -> None:
        """Trains on `rdd` (RDD of (features, label); or a DataFrame of two columns ``_0``,
        ``_1`` in that layout, which ElephasEstimator passes) for `epochs`; ``master_network``
        ends with the trained weights."""
        import io

        from pyspark.sql import SparkSession

        import ember
        from ember import parallel

        if validation_split:
            warnings.warn("ember.compat.elephas: validation_split is not applied inside fit (the nodes read "
                          "a stream); evaluate on held-out data afterwards", stacklevel=2)
        num_workers = int(self.num_workers or rdd.getNumPartitions())
        asynchronous = self.mode != "synchronous"
        args = dict(model_bytes=parallel.keras_model_bytes(self._master_network), mode=self.mode,
                    frequency=self.frequency, epochs=int(epochs), batch_size=int(batch_size),
                    verbose=int(verbose), timeout=min(600.0, self.timeout))
        spark = SparkSession.builder.getOrCreate()
        deadline = time.monotonic() + self.timeout
        cluster = ember.Cluster.run(spark, _node_main, args, num_executors=num_workers + (1 if asynchronous else 0),
                                    num_ps=1 if asynchronous else 0, driver_ps_nodes=asynchronous,
                                    input_mode=ember.InputMode.SPARK, reservation_timeout=min(600.0, self.timeout))
        try:
            cluster.train(rdd, num_epochs=int(epochs))
            try:
                data = cluster._gang.server.wait_for_key(_WEIGHTS_KEY, max(0.0, deadline - time.monotonic()))
            except ember.errors.Aborted:
                cluster.shutdown(timeout=60.0)  # raises the failed node's error
                raise
            cluster.shutdown(timeout=max(30.0, deadline - time.monotonic()))
        except BaseException:
            cluster._teardown(abort_reason="SparkModel.fit failed")
            raise
        with np.load(io.BytesIO(bytes(data))) as npz:
            self._master_network.set_weights([npz[f"arr_{i}"] for i in range(len(npz.files))])
        self.training_histories.append({"job_id": cluster.job_id, "epochs": int(epochs)})

    def predict(self, data: Any) -> List[np.ndarray]:
        """The model's predictions for `data`, as Elephas gives them: a list with one numpy
        array per row, in the rows' order.

        Args:
            data: an RDD of feature rows (numpy arrays or lists): predicted on the executors,
                the model loaded once per partition; or a numpy array: predicted on the driver.
        """
        from pyspark import RDD

        from ember import parallel

        if not isinstance(data, RDD):
            return list(self._master_network.predict(np.asarray(data), verbose=0))
        model_bytes = data.context.broadcast(parallel.keras_model_bytes(self._master_network))
        try:
            return data.mapPartitions(functools.partial(_predict_partition, model_bytes, _PREDICT_ROWS)).collect()
        finally:
            model_bytes.destroy()

    def evaluate(self, x_test: Any, y_test: Any, **kwargs: Any) -> Any:
        """``master_network.evaluate(x_test, y_test, **kwargs)`` on the driver: the loss, or
        [loss, *metrics] (what Elephas's distributed evaluation averages to)."""
        return self._master_network.evaluate(x_test, y_test, **kwargs)

    def save(self, file_name: str, overwrite: bool = False) -> None:
        self._master_network.save(file_name, overwrite=overwrite)


# --------------------------------------------------------------------------- elephas.ml_model
class ModelType(enum.Enum):
    """What ElephasTransformer's output column holds (Elephas derives it from the loss)."""
    CLASSIFICATION = 1  # the model's outputs, array<double>
    REGRESSION = 2      # the model's one output, double


# Elephas's loss -> model type table; a loss not in it (e.g. a function) counts as a classifier's.
_REGRESSION_LOSSES = frozenset({"mean_squared_error", "mean_absolute_error", "mse", "mae", "cosine_proximity",
                                "mean_absolute_percentage_error", "mean_squared_logarithmic_error", "logcosh"})
_CLASSIFICATION_LOSSES = frozenset({"binary_crossentropy", "categorical_crossentropy",
                                    "sparse_categorical_crossentropy"})


def _model_type(loss: Any) -> Optional[ModelType]:
    if isinstance(loss, str) and loss in _REGRESSION_LOSSES:
        return ModelType.REGRESSION
    if isinstance(loss, str) and loss in _CLASSIFICATION_LOSSES:
        return ModelType.CLASSIFICATION
    return None


def _is_regression(model_type: Any) -> bool:
    """ModelType.REGRESSION (ours or Elephas's enum, or its name)."""
    return str(getattr(model_type, "name", model_type)).upper() == "REGRESSION"


def _is_whole(v: Any, least: int) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v >= least


def _is_json(v: Any) -> bool:
    try:
        return isinstance(v, str) and isinstance(json.loads(v), dict)
    except ValueError:
        return False


# Each checked Param: (test, what a good value is).  The setters and the constructors check;
# Elephas's take anything and fail (or ignore the value) later.
_CHECKS = {
    "keras_model_config": (_is_json, "the JSON string of model.to_json()"),
    "mode": (lambda v: v in _MODES, "'asynchronous', 'hogwild' or 'synchronous'"),
    "frequency": (lambda v: v in _FREQUENCIES, "'epoch' or 'batch'"),
    "epochs": (lambda v: _is_whole(v, 1), "a whole number >= 1"),
    "batch_size": (lambda v: _is_whole(v, 1), "a whole number >= 1"),
    "num_workers": (lambda v: _is_whole(v, 1), "a whole number >= 1 (training nodes, one Spark task slot each)"),
    "nb_classes": (lambda v: _is_whole(v, 1), "a whole number >= 1"),
    "validation_split": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1,
                         "a number in [0, 1)"),
    "categorical": (lambda v: isinstance(v, (bool, np.bool_)), "True or False"),
    "verbose": (lambda v: _is_whole(v, 0) and v <= 2, "0, 1 or 2"),
    "optimizer_config": (lambda v: v is None or isinstance(v, (dict, str)),
                         "keras.optimizers.serialize(optimizer) (a dict) or an optimizer's name"),
    "loss": (lambda v: isinstance(v, str) or callable(v), "a Keras loss name or function"),
    "metrics": (lambda v: v is None or isinstance(v, (list, tuple)), "a list of Keras metrics"),
    "custom_objects": (lambda v: v is None or isinstance(v, dict), "a dict of name -> object"),
    "inference_batch_size": (lambda v: v is None or _is_whole(v, 0),
                             "None or 0 (one model call per partition in Elephas) or a whole number of rows"),
}


def _param(name: str, doc: str) -> Param:
    return Param(Params._dummy(), name, doc)


class _ElephasParams(HasFeaturesCol, HasLabelCol, HasOutputCol):
    """What both stages hold, with Elephas's names and setters."""

    keras_model_config = _param("keras_model_config", "the Keras model as JSON (model.to_json())")
    custom_objects = _param("custom_objects", "custom objects for keras.models.model_from_json")

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(custom_objects={})

    def _set_checked(self, **kwargs: Any) -> "_ElephasParams":
        stage = type(self).__name__
        for name, value in kwargs.items():
            if isinstance(value, enum.Enum):  # Elephas's Mode / Frequency
                value = value.value
            if not self.hasParam(name):
                raise ValueError(f"{stage}: no parameter {name!r}")
            check = _CHECKS.get(name)
            if check is not None and not check[0](value):
                raise ValueError(f"{stage}: {name} must be {check[1]}, got {value!r}")
            self._set(**{name: value})
        return self

    def set_params(self, **kwargs: Any) -> "_ElephasParams":
        """Sets Params by name (Elephas's names: keras_model_config, mode, ..., featuresCol)."""
        return self._set_checked(**kwargs)

    def setFeaturesCol(self, value: str) -> "_ElephasParams":
        return self._set(featuresCol=value)

    def setLabelCol(self, value: str) -> "_ElephasParams":
        return self._set(labelCol=value)

    def setOutputCol(self, value: str) -> "_ElephasParams":
        return self._set(outputCol=value)

    def set_keras_model_config(self, keras_model_config: str) -> "_ElephasParams":
        return self._set_checked(keras_model_config=keras_model_config)

    def get_keras_model_config(self) -> str:
        return self.getOrDefault(self.keras_model_config)

    def set_custom_objects(self, custom_objects: Dict[str, Any]) -> "_ElephasParams":
        return self._set_checked(custom_objects=custom_objects)

    def get_custom_objects(self) -> Dict[str, Any]:
        return self.getOrDefault(self.custom_objects) or {}

    def _defined(self, names: Iterable[str]) -> Dict[str, Any]:
        return {n: self.getOrDefault(n) for n in names if self.isDefined(self.getParam(n))}


def _accessors(name: str, setter: str, getter: str):
    """set_<x>(value) (checked, returns self) and get_<x>() for Param `name`, as Elephas names them."""
    def set_(self, value):
        return self._set_checked(**{name: value})

    def get_(self):
        return self.getOrDefault(name)
    set_.__name__, get_.__name__ = setter, getter
    set_.__doc__ = f"Sets {name}."
    get_.__doc__ = f"The {name} Param's value."
    return set_, get_


class _EstimatorParams(_ElephasParams):
    """ElephasEstimator's Params (Elephas's names and defaults)."""

    mode = _param("mode", "'asynchronous', 'hogwild' or 'synchronous'")
    frequency = _param("frequency", "when asynchronous workers exchange weights: 'epoch' or 'batch'")
    nb_classes = _param("nb_classes", "number of classes (one-hot width of categorical labels)")
    categorical = _param("categorical", "whether the label column holds class indices to one-hot encode")
    epochs = _param("epochs", "passes over the DataFrame")
    batch_size = _param("batch_size", "rows per training step on each worker")
    verbose = _param("verbose", "Keras fit verbosity on the chief")
    validation_split = _param("validation_split", "accepted; not applied (warned)")
    num_workers = _param("num_workers", "training nodes")
    optimizer_config = _param("optimizer_config", "keras.optimizers.serialize(optimizer), or a name")
    metrics = _param("metrics", "Keras metrics")
    loss = _param("loss", "Keras loss")

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(mode="asynchronous", frequency="epoch", nb_classes=10, categorical=True, epochs=10,
                         batch_size=32, verbose=0, validation_split=0.1, num_workers=8, optimizer_config=None,
                         metrics=["acc"], outputCol="prediction")

    set_mode, get_mode = _accessors("mode", "set_mode", "get_mode")
    set_frequency, get_frequency = _accessors("frequency", "set_frequency", "get_frequency")
    set_nb_classes, get_nb_classes = _accessors("nb_classes", "set_nb_classes", "get_nb_classes")
    set_categorical_labels, get_categorical_labels = _accessors("categorical", "set_categorical_labels",
                                                                "get_categorical_labels")
    set_epochs, get_epochs = _accessors("epochs", "set_epochs", "get_epochs")
    set_batch_size, get_batch_size = _accessors("batch_size", "set_batch_size", "get_batch_size")
    set_verbosity, get_verbosity = _accessors("verbose", "set_verbosity", "get_verbosity")
    set_validation_split, get_validation_split = _accessors("validation_split", "set_validation_split",
                                                            "get_validation_split")
    set_num_workers, get_num_workers = _accessors("num_workers", "set_num_workers", "get_num_workers")
    set_optimizer_config, get_optimizer_config = _accessors("optimizer_config", "set_optimizer_config",
                                                            "get_optimizer_config")
    set_metrics, get_metrics = _accessors("metrics", "set_metrics", "get_metrics")
    set_loss, get_loss = _accessors("loss", "set_loss", "get_loss")


_ESTIMATOR_CONFIG = ("keras_model_config", "mode", "frequency", "num_workers", "categorical", "loss", "metrics",
                     "validation_split", "featuresCol", "labelCol", "epochs", "batch_size", "verbose", "nb_classes",
                     "outputCol", "optimizer_config")


def _write_config(file_name: str, stage: Any, config: Dict[str, Any]) -> None:
    """Elephas's file of a stage: HDF5 with one attribute, ``distributed_config`` (JSON)."""
    import h5py

    text = json.dumps({"class_name": type(stage).__name__, "config": config}, default=_json_enum)
    with h5py.File(file_name, "w", libver="latest") as f:  # "latest": attributes over 64 KiB (weights)
        f.attrs["distributed_config"] = text.encode("utf8")


def _read_config(file_name: str, class_name: str) -> Dict[str, Any]:
    import h5py

    with h5py.File(file_name, "r") as f:
        if "distributed_config" not in f.attrs:
            raise ValueError(f"{file_name} is not an Elephas stage file (no distributed_config attribute)")
        raw = f.attrs["distributed_config"]
    doc = json.loads(raw.decode("utf8") if isinstance(raw, bytes) else raw, object_hook=_unjson_enum)
    if doc.get("class_name") != class_name:
        raise ValueError(f"{file_name} holds a {doc.get('class_name')}, not an {class_name}")
    return doc["config"]


def _json_enum(v: Any) -> Any:
    if isinstance(v, ModelType):
        return {"__enum__": f"ModelType.{v.name}"}  # Elephas's encoding
    raise TypeError(f"a {type(v).__name__} cannot be saved in the stage's JSON config")


def _unjson_enum(d: Dict[str, Any]) -> Any:
    if set(d) == {"__enum__"}:
        return ModelType[d["__enum__"].rsplit(".", 1)[-1]]
    return d


class ElephasEstimator(Estimator, _EstimatorParams):
    """Elephas's Spark ML Estimator: trains the Keras model given as JSON with ``SparkModel``
    on a DataFrame's features (Vector) and label (number) columns; ``fit`` returns an
    :class:`ElephasTransformer`.

    Params (Elephas's names and defaults): keras_model_config (required), optimizer_config
    (required: ``keras.optimizers.serialize(opt)`` or a name), loss (required), metrics
    ["acc"], mode "asynchronous", frequency "epoch", num_workers 8 (left unset: at most the
    Spark task slots less one, which feeding needs), epochs 10, batch_size 32 (per worker),
    verbose 0, validation_split 0.1 (not applied: warned), categorical True, nb_classes 10,
    custom_objects {}, featuresCol "features", labelCol "label", outputCol "prediction".
    """

    def __init__(self, **kwargs: Any):
        super().__init__()
        self._set_checked(**kwargs)

    def get_config(self) -> Dict[str, Any]:
        """The Params Elephas saves, by name (those with a value)."""
        return self._defined(_ESTIMATOR_CONFIG)

    def save(self, file_name: str) -> None:
        """Writes get_config() to the HDF5 file `file_name` (read back by load_ml_estimator)."""
        _write_config(file_name, self, self.get_config())

    def get_model(self) -> Any:
        """The (untrained, uncompiled) Keras model of keras_model_config."""
        import keras
        return keras.models.model_from_json(self.get_keras_model_config(), custom_objects=self.get_custom_objects())

    def _required(self, name: str, how: str) -> Any:
        if not self.isDefined(self.getParam(name)) or self.getOrDefault(name) is None:
            raise ValueError(f"ElephasEstimator: {name} is not set; {how}")
        return self.getOrDefault(name)

    def _num_workers(self, sc: Any) -> int:
        if self.isSet(self.num_workers):
            return self.get_num_workers()
        from ember._driver.spark_side import spark_side
        return max(1, min(self.get_num_workers(), spark_side(sc).task_slots() - 1))  # Elephas's 8 where it fits

    def _fit(self, dataset: Any) -> "ElephasTransformer":
        import keras
        from pyspark.ml.functions import vector_to_array
        from pyspark.sql import functions as F
        from pyspark.sql.types import NumericType

        from ember.ml import _field, _input_kind

        stage = "ElephasEstimator"
        config = self._required("keras_model_config", "call set_keras_model_config(model.to_json())")
        loss = self._required("loss", "call set_loss(...), e.g. set_loss('categorical_crossentropy')")
        optimizer = self._required("optimizer_config", "call set_optimizer_config(keras.optimizers.serialize(opt))")
        features, label = self.getFeaturesCol(), self.getLabelCol()
        kind = _input_kind(_field(dataset.schema, features, "features", stage), stage)
        label_type = _field(dataset.schema, label, "label", stage).dataType
        if not isinstance(label_type, NumericType):
            raise ValueError(f"{stage}: label column {label!r} is {label_type.simpleString()}; it must hold numbers")

        # The two columns SparkModel's nodes read (_0 features, _1 label), made in the JVM.
        x = (vector_to_array(F.col(features), "float32") if kind == "vector"
             else F.col(features).cast("array<float>") if kind == "array" else F.array(F.col(features).cast("float")))
        y = F.col(label).cast("double")
        if self.get_categorical_labels():
            n = self.get_nb_classes()
            one_hot = F.array(*[(y == float(i)).cast("float") for i in range(n)])
            y = F.when(y.isNotNull() & (y >= 0) & (y < n) & (y == F.floor(y)), one_hot).otherwise(F.raise_error(
                F.lit(f"{stage}: label column {label!r} holds a value that is not a class index 0..{n - 1} "
                      f"(nb_classes={n}); set_nb_classes(...) to the number of classes, or "
                      f"set_categorical_labels(False)")))
        else:
            y = y.cast("float")
        feed = dataset.select(x.alias("_0"), y.alias("_1"))

        custom = self.get_custom_objects()
        model = keras.models.model_from_json(config, custom_objects=custom)
        try:
            opt = keras.optimizers.get(optimizer)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{stage}: optimizer_config {optimizer!r} is not a Keras optimizer: pass "
                             f"keras.optimizers.serialize(opt) or a name ({e})") from None
        model.compile(optimizer=opt, loss=loss, metrics=self.get_metrics())
        spark_model = SparkModel(model, mode=self.get_mode(), frequency=self.get_frequency(),
                                 num_workers=self._num_workers(dataset.sparkSession.sparkContext),
                                 custom_objects=custom, batch_size=self.get_batch_size())
        spark_model.fit(feed, epochs=self.get_epochs(), batch_size=self.get_batch_size(),
                        verbose=self.get_verbosity(), validation_split=self.get_validation_split())
        return ElephasTransformer(labelCol=label, outputCol=self.getOutputCol(), featuresCol=features,
                                  keras_model_config=model.to_json(), weights=model.get_weights(),
                                  custom_objects=custom, model_type=_model_type(loss),
                                  history=spark_model.training_histories)


def load_ml_estimator(file_name: str) -> ElephasEstimator:
    """The ElephasEstimator that ``save(file_name)`` wrote (Elephas's files load too)."""
    return ElephasEstimator(**_read_config(file_name, "ElephasEstimator"))


class ElephasTransformer(Model, _ElephasParams):
    """Elephas's Spark ML Model: a trained Keras model (JSON config + weights).

    ``transform(df)`` returns `df` with every column kept, in order, plus outputCol: the
    model's outputs as ``array<double>``, or one ``double`` when model_type is
    ModelType.REGRESSION (as Elephas).  The prediction runs on the executors with
    ``ember.ml.KerasModel`` (pandas UDF over featuresCol, inference_batch_size rows per call).

    Args (keywords, as Elephas's): weights (list of numpy arrays), model_type (ModelType or
    None), history, and any Param: keras_model_config, custom_objects, featuresCol,
    labelCol, outputCol, inference_batch_size.
    """

    inference_batch_size = _param("inference_batch_size", "rows per model call in transform (None or 0: 1024)")

    def __init__(self, **kwargs: Any):
        super().__init__()
        self._setDefault(inference_batch_size=None)
        self.weights: Optional[List[np.ndarray]] = kwargs.pop("weights", None)
        self.model_type: Optional[ModelType] = kwargs.pop("model_type", None)
        self._history = kwargs.pop("history", [])
        self._set_checked(**kwargs)

    @property
    def history(self) -> list:
        """What fit recorded (SparkModel.training_histories)."""
        return self._history

    set_inference_batch_size, get_inference_batch_size = _accessors(
        "inference_batch_size", "set_inference_batch_size", "get_inference_batch_size")

    def get_config(self) -> Dict[str, Any]:
        """What ``save`` writes: the Params Elephas saves, the weights (as lists) and model_type."""
        config = self._defined(("keras_model_config", "labelCol", "featuresCol", "outputCol"))
        config["weights"] = [np.asarray(w).tolist() for w in (self.weights or [])]
        config["model_type"] = self.model_type
        return config

    def save(self, file_name: str) -> None:
        """Writes get_config() to the HDF5 file `file_name` (read back by load_ml_transformer)."""
        _write_config(file_name, self, self.get_config())

    def get_model(self) -> Any:
        """The Keras model, holding the trained weights (Elephas's has none set)."""
        import keras
        model = keras.models.model_from_json(self.get_keras_model_config(), custom_objects=self.get_custom_objects())
        if self.weights is not None:
            model.set_weights(self.weights)
        return model

    def _transform(self, dataset: Any) -> Any:
        from pyspark.sql import functions as F

        from ember.ml import KerasModel

        if self.weights is None:
            raise ValueError("ElephasTransformer: no weights; make it with ElephasEstimator.fit, or pass "
                             "weights=model.get_weights()")
        out = self.getOutputCol()
        stage = KerasModel.from_keras(self.get_model(), inputCol=self.getFeaturesCol(), outputCol=out,
                                      outputMode="raw", predictBatchSize=self.get_inference_batch_size() or 1024)
        df = stage.transform(dataset)
        one_value = int(np.prod(stage.output_shape[1:])) == 1  # KerasModel gave a double, else array<float>
        if _is_regression(self.model_type) and one_value:
            return df
        return df.withColumn(out, (F.array(F.col(out)) if one_value else F.col(out)).cast("array<double>"))


def load_ml_transformer(file_name: str) -> ElephasTransformer:
    """The ElephasTransformer that ``save(file_name)`` wrote (Elephas's files load too)."""
    config = _read_config(file_name, "ElephasTransformer")
    config["weights"] = [np.asarray(w) for w in config.get("weights", [])]
    return ElephasTransformer(**config)
