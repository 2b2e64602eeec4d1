"""Spark ML stages for Keras: ``KerasEstimator`` trains on an Ember cluster, ``KerasModel``
predicts over a DataFrame; ``TorchModel`` is KerasModel's twin for a PyTorch model.

    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler
    from ember.ml import KerasEstimator

    def build():                      # runs on every training node
        import keras
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        return model

    pipeline = Pipeline(stages=[VectorAssembler(inputCols=["x1", "x2"], outputCol="features"),
                                KerasEstimator(model=build, labelCol="y", epochs=20)])
    fitted = pipeline.fit(df)         # trains on the cluster (InputMode.SPARK, Ember sync)
    fitted.transform(df)              # every input column + "prediction", in input order
    fitted.stages[-1].save("hdfs:///models/linear")   # KerasModel.load(...) reads it back

**The model** is given either as a function that builds and compiles it (pickled with
cloudpickle and called on every training node: the usual case, since any Python works) or as
a compiled Keras model (sent as its ``.keras`` file and loaded on the nodes with
``safe_mode=True``, so custom layers must be registered Keras serializables).  It has one
input; the input column's values are reshaped to that input's shape (e.g. 784 pixels to
``(28, 28, 1)``), so a flat Vector or array feeds a CNN directly.

**Training** (``fit``) starts ``numWorkers`` nodes with ``Cluster.run`` in InputMode.SPARK,
feeds ``(inputCol, labelCol)`` for ``epochs`` epochs with ``cluster.train``, and trains with
Keras ``model.fit``, ``ember.keras.DistributedOptimizer`` (one gradient allreduce per step)
and ``SyncCallback``; ``batchSize`` is the global batch.  The chief sends the trained model
(its ``.keras`` file, through the job's coordinator) back to the driver.

**Inference** (``transform``): only the input column goes to Python and only the output comes
back, while Spark keeps every other column in the JVM and appends the output in order (Vector
columns from VectorAssembler, dense or sparse, become float arrays in the JVM first).  With
Ember's Spark extension in a classic session the column crosses packed and Spark joins by
position (``_jvm.infer_by_position``, Arrow batches, no pandas); otherwise it is a
scalar-iterator pandas UDF.  Each batch becomes one float32 matrix without a copy where the
hand-over allows it; the model is loaded once per Python worker and reused across tasks (what
``predict_batch_udf`` does).
The driver never imports TensorFlow: the fitted model travels as bytes.
"""
from __future__ import annotations

import collections
import functools
import hashlib
import json
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Union

import numpy as np
import pyarrow as pa
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasInputCol, HasLabelCol, HasOutputCol
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader, MLWritable, MLWriter

from ember import _arrow_rows, _jvm, _torch_program, parallel
from ember._feeder import worker
from ember._names import MODEL_INFO_KEY, MODEL_KEY

_OUTPUT_MODES = ("raw", "argmax")


# --------------------------------------------------------------------------- Params
class _KerasParams(HasInputCol, HasOutputCol):
    """Params shared by KerasEstimator and KerasModel."""

    outputMode = Param(Params._dummy(), "outputMode",
                       "what the output column holds: 'raw' (the model's output: a double for a "
                       "one-value output, else an array<float>) or 'argmax' (the index of the "
                       "largest output, as a double: a classifier's prediction)",
                       typeConverter=TypeConverters.toString)
    predictBatchSize = Param(Params._dummy(), "predictBatchSize",
                             "rows per model call in transform (an Arrow batch is cut into these)",
                             typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(inputCol="features", outputCol="prediction", outputMode="raw", predictBatchSize=1024)

    def getOutputMode(self) -> str:
        return self.getOrDefault(self.outputMode)

    def getPredictBatchSize(self) -> int:
        return self.getOrDefault(self.predictBatchSize)

    def setInputCol(self, value: str):
        return self._set(inputCol=value)

    def setOutputCol(self, value: str):
        return self._set(outputCol=value)

    def setOutputMode(self, value: str):
        return self._set(outputMode=value)

    def setPredictBatchSize(self, value: int):
        return self._set(predictBatchSize=value)

    def _check_common(self) -> None:
        if self.getOutputMode() not in _OUTPUT_MODES:
            raise ValueError(f"outputMode must be one of {_OUTPUT_MODES}, got {self.getOutputMode()!r}")
        if self.getPredictBatchSize() < 1:
            raise ValueError(f"predictBatchSize must be >= 1, got {self.getPredictBatchSize()}")


class _EstimatorParams(_KerasParams, HasLabelCol):
    """Params of KerasEstimator (training)."""

    batchSize = Param(Params._dummy(), "batchSize", "global training batch size (split over the workers)",
                      typeConverter=TypeConverters.toInt)
    epochs = Param(Params._dummy(), "epochs", "passes over the DataFrame", typeConverter=TypeConverters.toInt)
    numWorkers = Param(Params._dummy(), "numWorkers",
                       "training nodes (each holds a Spark task slot; feeding needs at least one more)",
                       typeConverter=TypeConverters.toInt)
    threads = Param(Params._dummy(), "threads",
                    "TensorFlow intra- and inter-op threads per node (0: TensorFlow's default)",
                    typeConverter=TypeConverters.toInt)
    verbose = Param(Params._dummy(), "verbose", "Keras fit verbosity on the chief (0, 1 or 2)",
                    typeConverter=TypeConverters.toInt)
    seed = Param(Params._dummy(), "seed", "keras.utils.set_random_seed on every node (-1: none)",
                 typeConverter=TypeConverters.toInt)
    timeout = Param(Params._dummy(), "timeout",
                    "seconds fit may take from start to the trained model (then it fails, naming it)",
                    typeConverter=TypeConverters.toFloat)

    def __init__(self, *args: Any):
        super().__init__(*args)
        self._setDefault(labelCol="label", batchSize=32, epochs=1, numWorkers=1, threads=0, verbose=0,
                         seed=-1, timeout=3600.0)

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batchSize)

    def getEpochs(self) -> int:
        return self.getOrDefault(self.epochs)

    def getNumWorkers(self) -> int:
        return self.getOrDefault(self.numWorkers)

    def getThreads(self) -> int:
        return self.getOrDefault(self.threads)

    def getVerbose(self) -> int:
        return self.getOrDefault(self.verbose)

    def getSeed(self) -> int:
        return self.getOrDefault(self.seed)

    def getTimeout(self) -> float:
        return self.getOrDefault(self.timeout)

    def setLabelCol(self, value: str):
        return self._set(labelCol=value)

    def setBatchSize(self, value: int):
        return self._set(batchSize=value)

    def setEpochs(self, value: int):
        return self._set(epochs=value)

    def setNumWorkers(self, value: int):
        return self._set(numWorkers=value)

    def setThreads(self, value: int):
        return self._set(threads=value)

    def setVerbose(self, value: int):
        return self._set(verbose=value)

    def setSeed(self, value: int):
        return self._set(seed=value)

    def setTimeout(self, value: float):
        return self._set(timeout=value)


# --------------------------------------------------------------------------- columns
def _field(schema: Any, name: str, role: str, stage: str):
    """The StructField `name` of `schema`; ValueError naming the column and what exists."""
    names = schema.fieldNames()
    if name not in names:
        raise ValueError(f"{stage}: {role} column {name!r} is not in the DataFrame (columns: "
                         f"{', '.join(names) if names else 'none'})")
    return schema[name]


def _input_kind(field: Any, stage: str) -> str:
    """'vector', 'array' or 'scalar' for the input column `field`; ValueError otherwise."""
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import ArrayType, NumericType

    t = field.dataType
    if isinstance(t, VectorUDT):
        return "vector"
    if isinstance(t, ArrayType) and isinstance(t.elementType, NumericType):
        return "array"
    if isinstance(t, NumericType):
        return "scalar"
    raise ValueError(f"{stage}: input column {field.name!r} is {t.simpleString()}; it must be a Vector "
                     f"(e.g. from VectorAssembler), an array of numbers, or a number")


def _packable(field: Any, kind: str) -> bool:
    """Whether ember_pack_floats takes the input column (a Vector becomes array<float> first)."""
    from pyspark.sql.types import DoubleType, FloatType

    return kind == "vector" or (kind == "array" and isinstance(field.dataType.elementType, (FloatType, DoubleType)))


def _declared_width(field: Any) -> Optional[int]:
    """The vector size VectorAssembler (or another ML stage) declared in the column's metadata."""
    attrs = (field.metadata or {}).get("ml_attr") or {}
    n = attrs.get("num_attrs")
    if n is None and isinstance(attrs.get("attrs"), dict):
        n = sum(len(v) for v in attrs["attrs"].values()) or None
    return int(n) if n is not None else None


def _flat_width(shape: List[Optional[int]]) -> int:
    return int(np.prod([d for d in shape[1:]])) if len(shape) > 1 else 1


def _vectors_to_matrix(arr: pa.StructArray, width: int, column: str) -> np.ndarray:
    """Spark ML Vectors (VectorUDT's struct<type, size, indices, values>: type 1 dense, 0 sparse)
    as a float32 (rows, width) matrix, scattered in bulk (no Python loop over rows)."""
    if arr.null_count:
        raise ValueError(f"column {column!r} has {arr.null_count} null vectors; the model needs a value in each")
    kinds, sizes, indices, values = arr.flatten()
    n = len(arr)
    kinds = kinds.to_numpy(zero_copy_only=False)
    vlens = values.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    sizes = np.where(kinds == 0, sizes.fill_null(0).to_numpy(zero_copy_only=False), vlens)
    bad = np.flatnonzero(sizes != width)
    if bad.size:
        raise ValueError(f"column {column!r}: a vector has size {int(sizes[bad[0]])} but the model's input "
                         f"takes {width}")
    flat = values.flatten().to_numpy(zero_copy_only=False)
    if not (kinds == 0).any():  # all dense: one reshape
        return flat.astype(np.float32).reshape(n, width)
    out = np.zeros((n, width), np.float32)
    rows = np.repeat(np.arange(n), vlens)
    starts = np.concatenate([[0], np.cumsum(vlens)[:-1]])
    cols = np.arange(flat.size) - np.repeat(starts, vlens)
    sparse = np.repeat(kinds == 0, vlens)
    cols[sparse] = indices.flatten().to_numpy(zero_copy_only=False)
    out[rows, cols] = flat
    return out


# --------------------------------------------------------------------------- training node
def _fit_main(a: Dict[str, Any], ctx: Any) -> None:
    """Every training node of KerasEstimator.fit: build, train on the feed, chief returns the model."""
    import keras

    import ember.keras as ek

    if a["threads"]:
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(a["threads"])
        tf.config.threading.set_inter_op_parallelism_threads(a["threads"])
    if a["seed"] >= 0:
        keras.utils.set_random_seed(a["seed"])
    model = a["model_fn"]() if a["model_fn"] is not None else parallel.load_keras_model(a["model_bytes"], compile=True)
    if not isinstance(model, keras.Model):
        raise TypeError(f"KerasEstimator: the model function returned a {type(model).__name__}, not a keras.Model")
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", True):
        raise ValueError("KerasEstimator: the model is not compiled; call model.compile(optimizer=..., loss=...) "
                         "in the model function")
    if len(model.inputs) != 1:
        raise ValueError(f"KerasEstimator: the model has {len(model.inputs)} inputs; it takes one input column")
    ek.DistributedOptimizer(model.optimizer)  # in place: the optimizer the model compiled with
    in_shape = [None] + list(model.inputs[0].shape[1:])
    width, column = _flat_width(in_shape), a["input_col"]

    def to_xy(cols: Dict[str, np.ndarray]):
        x = cols["x"]
        if x.dtype == object or x.ndim != 2 or x.shape[1] != width:
            got = x.shape[1] if x.ndim == 2 and x.dtype != object else "differing numbers of"
            raise ValueError(f"KerasEstimator: column {column!r} has rows of {got} values but the model's input "
                             f"{tuple(in_shape[1:])} takes {width}")
        y = cols["y"]
        if y.dtype == np.float64:
            y = y.astype(np.float32)
        return x.astype(np.float32, copy=False).reshape([-1] + in_shape[1:]), y

    per_node = max(1, a["batch_size"] // ctx.num_workers)
    ds = ctx.get_data_feed(train_mode=True).to_tf_dataset(per_node, transform=to_xy)
    history = model.fit(ds, epochs=a["epochs"], verbose=ek.verbose(a["verbose"]), shuffle=False,
                        callbacks=[ek.SyncCallback(), ek.ProgressCallback(ctx, every_n_steps=50, batch_size=per_node)])
    if ctx.is_chief:
        client = ctx._coordinator_client()
        info = {"input_shape": in_shape, "output_shape": [None] + list(model.outputs[0].shape[1:]),
                "history": {k: [float(v) for v in vs] for k, vs in history.history.items()}}
        client.kv_set(MODEL_INFO_KEY, json.dumps(info).encode())
        client.kv_set(MODEL_KEY, parallel.keras_model_bytes(model))


# --------------------------------------------------------------------------- Estimator
class KerasEstimator(Estimator, _EstimatorParams):
    """Trains a Keras model on an Ember cluster; ``fit`` returns a :class:`KerasModel`.

    Args:
        model: a function ``() -> compiled keras.Model`` (called on every training node), or
            a compiled keras.Model (sent as its .keras file); see the module doc.
        **params: any Param by name (inputCol, labelCol, outputCol, outputMode, batchSize,
            epochs, numWorkers, threads, verbose, seed, timeout, predictBatchSize).

    Params (defaults): inputCol "features" (Vector, array of numbers, or a number), labelCol
    "label", outputCol "prediction", outputMode "raw", batchSize 32 (global), epochs 1,
    numWorkers 1, threads 0, verbose 0, seed -1, timeout 3600 s, predictBatchSize 1024.
    """

    def __init__(self, model: Union[Callable[[], Any], Any, None] = None, **params: Any):
        super().__init__()
        self._model_source = model
        self._set(**params)

    def setModel(self, model: Union[Callable[[], Any], Any]) -> "KerasEstimator":
        self._model_source = model
        return self

    def getModel(self) -> Union[Callable[[], Any], Any, None]:
        return self._model_source

    def _fit(self, dataset: Any) -> "KerasModel":
        from pyspark.ml.functions import vector_to_array
        from pyspark.sql import functions as F
        from pyspark.sql.types import ArrayType, IntegralType, NumericType

        import ember

        stage = "KerasEstimator"
        self._check_common()
        source = self._model_source
        if source is None:
            raise ValueError(f"{stage}: no model; pass model=<function returning a compiled keras.Model>")
        for name in ("batchSize", "epochs", "numWorkers"):
            if self.getOrDefault(name) < 1:
                raise ValueError(f"{stage}: {name} must be >= 1, got {self.getOrDefault(name)}")
        in_col, label_col = self.getInputCol(), self.getLabelCol()
        kind = _input_kind(_field(dataset.schema, in_col, "input", stage), stage)
        label_type = _field(dataset.schema, label_col, "label", stage).dataType
        if not isinstance(label_type, (NumericType, ArrayType)):
            raise ValueError(f"{stage}: label column {label_col!r} is {label_type.simpleString()}; it must hold "
                             f"numbers (or arrays of numbers)")
        x = (vector_to_array(F.col(in_col), "float32") if kind == "vector"
             else F.col(in_col).cast("array<float>") if kind == "array" else F.array(F.col(in_col).cast("float")))
        y = F.col(label_col) if isinstance(label_type, (IntegralType, ArrayType)) else F.col(label_col).cast("float")
        feed_df = dataset.select(x.alias("x"), y.alias("y"))

        if callable(source) and not parallel._is_keras_model(source):
            model_fn, model_bytes = source, None
        elif parallel._is_keras_model(source):
            model_fn, model_bytes = None, parallel.keras_model_bytes(source)
        else:
            raise TypeError(f"{stage}: model must be a function returning a compiled keras.Model, or one; "
                            f"got {type(source).__name__}")
        args = dict(model_fn=model_fn, model_bytes=model_bytes, input_col=in_col, batch_size=self.getBatchSize(),
                    epochs=self.getEpochs(), threads=self.getThreads(), verbose=self.getVerbose(),
                    seed=self.getSeed())
        timeout = self.getTimeout()
        deadline = time.monotonic() + timeout
        cluster = ember.Cluster.run(dataset.sparkSession, _fit_main, args, num_executors=self.getNumWorkers(),
                                    input_mode=ember.InputMode.SPARK,
                                    reservation_timeout=min(600.0, timeout))
        try:
            cluster.train(feed_df, num_epochs=self.getEpochs())
            server = cluster._gang.server
            try:
                info = server.wait_for_key(MODEL_INFO_KEY, max(0.0, deadline - time.monotonic()))
                model_data = server.wait_for_key(MODEL_KEY, max(0.0, deadline - time.monotonic()))
            except ember.errors.DeadlineExceeded:
                raise ember.errors.DeadlineExceeded(
                    f"{stage}: the chief did not return the trained model within timeout={timeout:g}s; "
                    f"raise the timeout Param or look at the nodes' output") from None
            except ember.errors.Aborted:
                cluster.shutdown(timeout=60.0)  # raises the failed node's error
                raise
            cluster.shutdown(timeout=max(30.0, deadline - time.monotonic()))
        except BaseException:
            cluster._teardown(abort_reason=f"{stage}.fit failed")
            raise
        fitted = KerasModel(model_bytes=bytes(model_data), model_info=json.loads(bytes(info).decode()))
        self._copyValues(fitted)
        fitted.training_summary = {"history": fitted._info.pop("history", {}), "startup_secs": cluster.startup_secs,
                                   "job_id": cluster.job_id}
        return fitted


# --------------------------------------------------------------------------- Model
_log = logging.getLogger(__name__)
_loaded: "collections.OrderedDict[str, Any]" = collections.OrderedDict()  # per Python worker
_loaded_lock = threading.Lock()
_MAX_LOADED = 4
# Rows per batch where Spark joins transform's output by position: about this many bytes of the
# input column (and at most spark.sql.execution.arrow.maxRecordsPerBatch rows).
_JOINED_BATCH_BYTES = 8 << 20


def _worker_model(key: str, source: Any, load: Callable[[bytes], Any]) -> Any:
    """The model `key`, loaded by `load` (KerasModel: parallel.load_keras_model; TorchModel:
    _torch_program.load) from `source` (a classic session's broadcast of its bytes, or under Spark
    Connect the bytes themselves, carried in the UDF: Spark ships a stage's closure to the
    executors once per stage, as a broadcast) the first time this Python worker needs it, and
    kept for the tasks that follow (Spark reuses its Python workers).  What `load` returns has
    ``predict_on_batch(x)``: a float32 matrix in, the outputs out."""
    with _loaded_lock:
        model = _loaded.get(key)
        if model is not None:
            _loaded.move_to_end(key)
            return model
    model = load(source if isinstance(source, bytes) else source.value)
    with _loaded_lock:
        _loaded[key] = model
        while len(_loaded) > _MAX_LOADED:
            _loaded.popitem(last=False)
    return model


def _series_to_matrix(s: Any, kind: str, width: int, column: str) -> np.ndarray:
    """One batch of the input column, as the pandas UDF receives it, as a float32 (rows, width)
    matrix.  An array column arrives as numpy views into one flattened Arrow buffer (pyarrow's
    list -> pandas conversion); when the rows are whole and consecutive in it, the matrix is
    that buffer itself (no copy), otherwise the rows are stacked."""
    n = len(s)
    if kind == "packed":  # ember_pack_floats's binary rows: little-endian float32, `width` each
        return _packed_to_matrix(s.to_numpy(), width, column)
    if kind == "scalar":
        if s.isna().any():
            raise ValueError(f"column {column!r} has {int(s.isna().sum())} null rows; the model needs a value in each")
        if width != 1:
            raise ValueError(f"column {column!r} holds one number per row but the model's input takes {width}")
        return s.to_numpy(dtype=np.float32).reshape(-1, 1)
    rows = s.to_numpy()
    if any(r is None for r in rows):
        nulls = sum(r is None for r in rows)
        raise ValueError(f"column {column!r} has {nulls} null rows; the model needs a value in each")
    lengths = np.fromiter(map(len, rows), np.int64, n)
    bad = np.flatnonzero(lengths != width)
    if bad.size:
        raise ValueError(f"column {column!r}: a row has {int(lengths[bad[0]])} values but the model's "
                         f"input takes {width}")
    first, last = rows[0], rows[-1]
    base = first.base if isinstance(first, np.ndarray) else None
    if (base is not None and isinstance(last, np.ndarray) and last.base is base and base.flags.c_contiguous
            and base.size == n * width and base.dtype == first.dtype
            and first.__array_interface__["data"][0] == base.__array_interface__["data"][0]
            and last.__array_interface__["data"][0] - first.__array_interface__["data"][0]
            == (n - 1) * width * first.itemsize):
        # List offsets only grow and every row is `width` long, so row i starts at i * width:
        # the flattened buffer is the matrix.
        return base.reshape(n, width).astype(np.float32, copy=False)
    return np.stack(rows).astype(np.float32, copy=False)


def _packed_to_matrix(rows: np.ndarray, width: int, column: str) -> np.ndarray:
    """ember_pack_floats's rows (bytes, None for a null row) as a float32 (rows, width) matrix."""
    lengths = np.fromiter((-1 if r is None else len(r) for r in rows), np.int64, len(rows))
    if (lengths < 0).any():
        raise ValueError(f"column {column!r} has {int((lengths < 0).sum())} null rows; the model needs a value in each")
    bad = np.flatnonzero(lengths != 4 * width)
    if bad.size:
        raise ValueError(f"column {column!r}: a row has {int(lengths[bad[0]]) // 4} values but the model's "
                         f"input takes {width}")
    return np.frombuffer(b"".join(rows), "<f4").reshape(len(rows), width)


def _packed_arrow_to_matrix(arr: pa.Array, width: int, column: str) -> np.ndarray:
    """ember_pack_floats's rows as Arrow hands them to a Python function (a binary array) as a
    float32 (rows, width) matrix: a view of the array's one values buffer, no copy."""
    import pyarrow.compute as pc

    if arr.null_count:
        raise ValueError(f"column {column!r} has {arr.null_count} null rows; the model needs a value in each")
    lengths = pc.binary_length(arr).to_numpy()
    bad = np.flatnonzero(lengths != 4 * width)
    if bad.size:
        raise ValueError(f"column {column!r}: a row has {int(lengths[bad[0]]) // 4} values "
                         f"but the model's input takes {width}")
    x = _arrow_rows.unpack_floats(arr, [width])  # the feed's own view of packed rows
    return x if x.dtype != object else np.stack(x)


def _run_model(model: Any, x: np.ndarray, chunk: int) -> np.ndarray:
    """The model's outputs for the rows of `x`, `chunk` rows per call, as an (n, k) matrix."""
    n = len(x)
    outs = [np.asarray(model.predict_on_batch(x[i:i + chunk])) for i in range(0, n, chunk)]
    return np.concatenate(outs).reshape(n, -1)


def _output_values(y: np.ndarray, mode: str, out_type: str) -> np.ndarray:
    """The output column's values of the model outputs `y`: (n,) doubles, or (n, k) float32 rows."""
    if mode == "argmax":
        return np.argmax(y, axis=1).astype(np.float64)
    if out_type == "double":
        return y[:, 0].astype(np.float64)
    return np.ascontiguousarray(y, dtype=np.float32)


def _predict_batches(key: str, source: Any, load: Callable[[bytes], Any], kind: str, in_shape: List[Optional[int]],
                     mode: str, out_type: str, chunk: int, column: str, series: Iterator[Any]) -> Iterator[Any]:
    """The scalar-iterator pandas UDF of KerasModel's and TorchModel's transform: the input column's batches in,
    the output column's batches out (Spark keeps every other column on the JVM side)."""
    import pandas as pd

    model = None
    width = _flat_width(in_shape)
    for s in series:
        y = np.zeros((0, 1), np.float32)
        if len(s):
            if model is None:
                model = _worker_model(key, source, load)
                worker.settle()  # once per Python worker: see ember._feeder.worker
            y = _run_model(model, _series_to_matrix(s, kind, width, column).reshape([-1] + list(in_shape[1:])), chunk)
        out = _output_values(y, mode, out_type)
        yield pd.Series(out if out.ndim == 1 else list(out))


def _predict_record_batches(key: str, source: Any, load: Callable[[bytes], Any], in_shape: List[Optional[int]],
                            mode: str, out_type: str, chunk: int, column: str, schema: pa.Schema,
                            batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The Python function of KerasModel's and TorchModel's transform where Spark joins its
    answers by position (_jvm.infer_by_position): record batches of the packed input column in,
    of the output column (`schema`) out, row for row."""
    model = None
    width = _flat_width(in_shape)
    for batch in batches:
        y = np.zeros((0, 1), np.float32)
        if batch.num_rows:
            if model is None:
                model = _worker_model(key, source, load)
                worker.settle()  # once per Python worker: see ember._feeder.worker
            x = _packed_arrow_to_matrix(batch.column(0), width, column).reshape([-1] + list(in_shape[1:]))
            y = _run_model(model, x, chunk)
        out = _output_values(y, mode, out_type)
        arr = pa.array(out) if out.ndim == 1 else pa.FixedSizeListArray.from_arrays(pa.array(out.reshape(-1)),
                                                                                  out.shape[1])
        yield pa.RecordBatch.from_arrays([arr.cast(schema.field(0).type)], schema=schema)


class _ServedModel(Model, _KerasParams, MLWritable, MLReadable):
    """What KerasModel and TorchModel share: a model held as bytes, its transform (one place for
    the column checks, the packed hand-over and the join by position) and its persistence.  A
    subclass names its file (`_MODEL_FILE`), how a Python worker loads the bytes (`_load`, a
    module-level function: it travels in the UDF) and how the driver reads the shapes from them
    (`_shapes`)."""

    _MODEL_FILE: str
    _load: Callable[[bytes], Any]
    _shapes: Callable[[bytes], Dict[str, Any]]

    def __init__(self, model_bytes: Optional[bytes] = None, model_info: Optional[Dict[str, Any]] = None, **params: Any):
        super().__init__()
        self._model_bytes = model_bytes
        self._info = dict(model_info) if model_info else None
        self._broadcast = None
        self._broadcast_lock = threading.Lock()
        self.training_summary: Dict[str, Any] = {}
        self._set(**params)

    @property
    def model_bytes(self) -> bytes:
        """The model's file (``.keras`` for KerasModel, ``.pt2`` for TorchModel)."""
        if self._model_bytes is None:
            raise ValueError(f"this {type(self).__name__} holds no model")
        return self._model_bytes

    @property
    def input_shape(self) -> List[Optional[int]]:
        return list(self._model_info()["input_shape"])

    @property
    def output_shape(self) -> List[Optional[int]]:
        return list(self._model_info()["output_shape"])

    def _model_info(self) -> Dict[str, Any]:
        if self._info is None:
            self._info = type(self)._shapes(self.model_bytes)
        return self._info

    def _model_key(self) -> str:
        return f"{self.uid}-{hashlib.sha256(self.model_bytes).hexdigest()[:16]}"

    def _model_source(self, spark: Any) -> Any:
        """How the executors get the model: a broadcast of its bytes (made once per model), or
        under Spark Connect, which has no broadcasts, the bytes in the UDF itself."""
        from ember._driver.spark_side import spark_side

        side = spark_side(spark)
        if side.connect:
            return self.model_bytes
        with self._broadcast_lock:
            if self._broadcast is None:
                self._broadcast = side.sc.broadcast(self.model_bytes)
            return self._broadcast

    def _transform(self, dataset: Any) -> Any:
        import pandas as pd
        from pyspark.ml.functions import vector_to_array
        from pyspark.sql import functions as F
        from pyspark.sql.functions import pandas_udf
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import ArrayType, DoubleType, FloatType, StructField, StructType

        from ember._driver.spark_side import is_connect_session

        stage = type(self).__name__
        self._check_common()
        in_col, out_col, mode = self.getInputCol(), self.getOutputCol(), self.getOutputMode()
        field = _field(dataset.schema, in_col, "input", stage)
        kind = _input_kind(field, stage)
        if out_col in dataset.columns:
            raise ValueError(f"{stage}: output column {out_col!r} is already in the DataFrame; set outputCol "
                             f"to a new name")
        in_shape, out_shape = self.input_shape, self.output_shape
        width, out_width = _flat_width(in_shape), _flat_width(out_shape)
        declared = _declared_width(field) if kind == "vector" else None
        if declared is not None and declared != width:
            raise ValueError(f"{stage}: input column {in_col!r} holds vectors of size {declared} but the model's "
                             f"input {tuple(in_shape[1:])} takes {width}")
        out_type = "double" if mode == "argmax" or out_width == 1 else "array"
        spark_type = DoubleType() if out_type == "double" else ArrayType(FloatType(), False)
        source = self._model_source(dataset.sparkSession)
        column = vector_to_array(F.col(in_col), "float32") if kind == "vector" else F.col(in_col)
        if kind == "scalar":
            passed = "scalar"
        elif _packable(field, kind) and _jvm.has_pack_floats(dataset.sparkSession):
            # Ember's Spark extension is loaded: the numbers cross as one binary buffer per row
            # (one copy in the JVM) instead of Spark's element-by-element array hand-over.
            column, passed = F.call_function(_jvm.PACK_FLOATS, column), "packed"
        else:
            passed = "array"
        _log.info("%s: %r reaches the model %s", stage, in_col,
                  "packed by ember_pack_floats (Ember's Spark extension)" if passed == "packed" else
                  "as Spark hands it over" + ("" if passed == "scalar" else " (ember.spark_conf() in the session's "
                                              "settings makes this faster)"))
        if passed == "packed" and not is_connect_session(dataset.sparkSession):
            # Spark keeps each row and appends the output by position (InferByPosition.scala):
            # the packed column reaches the model as Arrow's one values buffer, no pandas.
            result = StructType([StructField(out_col, spark_type)])
            fn = functools.partial(_predict_record_batches, self._model_key(), source, type(self)._load, in_shape,
                                   mode, out_type, self.getPredictBatchSize(), in_col, to_arrow_schema(result))
            return _jvm.infer_by_position(dataset, fn, [column.alias(in_col)], result, _JOINED_BATCH_BYTES, stage)
        fn = functools.partial(_predict_batches, self._model_key(), source, type(self)._load, passed, in_shape,
                               mode, out_type, self.getPredictBatchSize(), in_col)

        def predict(series):
            return fn(series)
        predict.__annotations__ = {"series": Iterator[pd.Series], "return": Iterator[pd.Series]}
        # A scalar-iterator pandas UDF over the input column alone: only that column goes to
        # Python and only the output comes back; Spark keeps the rest of each row in the JVM
        # and appends the output in order.  A Vector column becomes a float array in the JVM
        # (vector_to_array: dense and sparse) on its way out.
        udf = pandas_udf(predict, spark_type)  # Iterator[Series] -> Iterator[Series]: scalar iterator
        return dataset.withColumn(out_col, udf(column))

    def copy(self, extra: Optional[Dict[Any, Any]] = None) -> "_ServedModel":
        that = super().copy(extra)
        that._broadcast_lock = threading.Lock()
        that._broadcast = None
        return that

    # -- persistence -----------------------------------------------------------
    def write(self) -> MLWriter:
        """A writer of this model: Spark ML metadata (Params) plus the model's file, to a
        local or Hadoop path (``save(path)`` = ``write().save(path)``)."""
        return _ModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _ModelReader(cls)


def _keras_shapes(model: Any) -> Dict[str, Any]:
    """The input and output shapes of a keras.Model, batch dimension None."""
    return {"input_shape": [None] + list(model.inputs[0].shape[1:]),
            "output_shape": [None] + list(model.outputs[0].shape[1:])}


def _keras_file_shapes(data: bytes) -> Dict[str, Any]:
    """The shapes of the model in a ``.keras`` file's bytes (loads it: imports Keras)."""
    return _keras_shapes(parallel.load_keras_model(data))


class KerasModel(_ServedModel):
    """A trained Keras model as a Spark ML Model (made by KerasEstimator.fit, or from a
    ``.keras`` file's bytes / :meth:`load`).

    ``transform(df)`` returns `df` with every column kept, in order, plus `outputCol`.

    Args:
        model_bytes: the model's ``.keras`` file.
        model_info: ``{"input_shape": [...], "output_shape": [...]}``; read from the model
            on the driver (importing Keras) if not given.
    """

    _MODEL_FILE = "model.keras"
    _load = staticmethod(parallel.load_keras_model)
    _shapes = staticmethod(_keras_file_shapes)

    @classmethod
    def from_keras(cls, model: Any, **params: Any) -> "KerasModel":
        """A KerasModel of an in-memory keras.Model (e.g. one trained elsewhere)."""
        return cls(model_bytes=parallel.keras_model_bytes(model), model_info=_keras_shapes(model), **params)

    def keras_model(self) -> Any:
        """The model as a keras.Model in this process (imports Keras)."""
        return parallel.load_keras_model(self.model_bytes)


# --------------------------------------------------------------------------- PyTorch
class TorchModel(_ServedModel):
    """A PyTorch model as a Spark ML Model: KerasModel's twin for inference (the same Params,
    the same transform and speed, see docs/ml.md).  The model travels as a ``torch.export``
    program (``.pt2``: its graph and weights, no Python class needed on the executors) with a
    dynamic batch dimension (ember._torch_program).

    Args:
        model_bytes: a ``.pt2`` file (``torch.export.save``) whose first input is the batch.
        model_info: ``{"input_shape": [None, ...], "output_shape": [None, ...]}``; read from the
            program on the driver (importing torch) if not given.
    """

    _MODEL_FILE = "model.pt2"
    _load = staticmethod(_torch_program.load)
    _shapes = staticmethod(_torch_program.shapes)

    @classmethod
    def from_torch(cls, module: Any, input_shape: List[int], **params: Any) -> "TorchModel":
        """A TorchModel of an in-memory ``torch.nn.Module`` taking one float32 tensor of
        ``(batch, *input_shape)``: exported with ``torch.export`` (batch dimension dynamic) in
        evaluation mode."""
        data, info = _torch_program.export(module, input_shape)
        return cls(model_bytes=data, model_info=info, **params)

    def torch_module(self) -> Any:
        """The model as a callable ``torch.nn.Module`` in this process (imports torch)."""
        return _torch_program.load(self.model_bytes).module


def _resolve(spark: Any, path: str):
    """(URI of `path` with TFoS hdfs_path semantics, the core's ResolveOptions) for session
    `spark` (classic or Spark Connect)."""
    from ember import _hadoop
    from ember._driver.spark_side import spark_side
    from ember.context import absolute_path

    default_fs, http = spark_side(spark).hadoop_fs_conf()
    return absolute_path(path, default_fs, os.getcwd()), _hadoop.resolve_options(default_fs, http)


class _ModelWriter(MLWriter):
    def __init__(self, instance: _ServedModel):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        from ember import _ember
        spark = self.sparkSession
        uri, resolve = _resolve(spark, path)
        DefaultParamsWriter.saveMetadata(self.instance, uri, spark,
                                         extraMetadata={"modelInfo": self.instance._model_info()})
        _ember.fs_write_file(f"{uri.rstrip('/')}/{self.instance._MODEL_FILE}", self.instance.model_bytes, resolve)


class _ModelReader(MLReader):
    def __init__(self, cls: type):
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> _ServedModel:
        from ember import _ember
        spark = self.sparkSession
        uri, resolve = _resolve(spark, path)
        metadata = DefaultParamsReader.loadMetadata(uri, spark)
        model = self.cls(model_bytes=bytes(_ember.fs_read_file(f"{uri.rstrip('/')}/{self.cls._MODEL_FILE}", resolve)),
                         model_info=metadata.get("modelInfo"))
        model._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(model, metadata)
        return model
