"""TFoS's ``pipeline``: ``TFEstimator`` / ``TFModel`` Spark ML stages, with TFoS's Params and
its ``Namespace`` handling of ``tf_args``, on Ember.

``TFEstimator(train_fn, tf_args, export_fn=None).fit(df)`` starts a cluster of ``cluster_size``
nodes running ``train_fn(args, ctx)``, feeds the columns named by ``input_mapping`` (InputMode
.SPARK) for ``epochs`` epochs, shuts the cluster down and returns a ``TFModel`` with the same
Params.  ``TFModel(tf_args).transform(df)`` loads the SavedModel in ``export_dir`` (once per
Python worker), feeds the ``input_mapping`` columns to the ``signature_def_key`` signature in
batches of ``batch_size`` and returns the ``output_mapping`` columns, row for row, as TFoS did.

As in TFoS, ``train_fn`` receives ``args``: ``tf_args`` (an argparse Namespace, a dict, or a
list of command-line arguments, kept as ``args.argv``) merged with every Param by its
snake_case name (``args.batch_size``, ``args.export_dir``, ...); a list is passed as it is.

Differences from TFoS (Ember's behaviour):

* ``TFModel.transform`` feeds Arrow batches to the model (``mapInArrow``), not pickled rows;
  columns may be numbers or arrays of numbers (Vector columns too).  As in TFoS, each row is
  reshaped to the signature's input shape (a flat 784-value image to ``[28, 28, 1]``); a row
  that cannot be raises ValueError naming the column, its length and the shape expected.
* A node failure during ``fit`` raises the node's error on the driver (with its traceback)
  instead of leaving the Spark job hanging; every wait has a deadline.
* ``protocol`` and ``readers`` are accepted and ignored (Ember's collectives are not gRPC;
  InputMode.TENSORFLOW programs read with their own readers).
* ``export_fn`` is called on the driver after training, as ``export_fn(args)``, when given;
  TFoS documented it but never called it.
"""
from __future__ import annotations

import argparse
import collections
import copy
import functools
import threading
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np
import pyarrow as pa
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters

from ember.input_mode import InputMode


class Namespace:
    """TFoS's argument holder: built from an argparse Namespace, a dict, another Namespace,
    or a list of command-line arguments (kept as ``argv``, passed to train_fn unchanged)."""

    argv: Optional[List[str]] = None

    def __init__(self, d: Any):
        if isinstance(d, list):
            self.argv = d
        elif isinstance(d, dict):
            self.__dict__.update(d)
        elif isinstance(d, argparse.Namespace):
            self.__dict__.update(vars(d))
        elif isinstance(d, Namespace):
            self.__dict__.update(d.__dict__)
        else:
            raise TypeError(f"Unsupported Namespace args: {d!r} (give an argparse.Namespace, a dict, a "
                            f"Namespace or a list of arguments)")

    def __iter__(self):
        return iter(self.__dict__)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Namespace) and self.__dict__ == other.__dict__

    def __repr__(self) -> str:
        return f"TFoS.Namespace({self.__dict__})"


def _param(name: str, doc: str, conv=None) -> Param:
    return Param(Params._dummy(), name, doc, typeConverter=conv or TypeConverters.identity)


class TFTypeConverters:
    """TFoS's extra converter: a dict (the input/output mappings)."""

    @staticmethod
    def toDict(value: Any) -> Dict[Any, Any]:
        if isinstance(value, dict):
            return value
        raise TypeError(f"Could not convert {value!r} to dict")


def _mixin(cls_name: str, pname: str, doc: str, conv=None):
    """A TFoS ``Has<Name>`` mixin: the Param plus setX/getX."""
    camel = "".join(part.capitalize() for part in pname.split("_"))
    if pname == "num_ps":
        camel = "NumPS"
    elif pname == "driver_ps_nodes":
        camel = "DriverPSNodes"
    elif pname == "tfrecord_dir":
        camel = "TFRecordDir"
    p = _param(pname, doc, conv)

    def setter(self, value):
        return self._set(**{pname: value})

    def getter(self):
        return self.getOrDefault(pname)

    return type(cls_name, (Params,), {pname: p, f"set{camel}": setter, f"get{camel}": getter})


HasBatchSize = _mixin("HasBatchSize", "batch_size", "Number of records per batch", TypeConverters.toInt)
HasClusterSize = _mixin("HasClusterSize", "cluster_size", "Number of nodes in the cluster", TypeConverters.toInt)
HasEpochs = _mixin("HasEpochs", "epochs", "Number of epochs to train", TypeConverters.toInt)
HasGraceSecs = _mixin("HasGraceSecs", "grace_secs",
                      "Number of seconds to wait after feeding data (for final tasks like exporting a saved_model)",
                      TypeConverters.toInt)
HasInputMapping = _mixin("HasInputMapping", "input_mapping", "Mapping of input DataFrame column to input tensor",
                         TFTypeConverters.toDict)
HasInputMode = _mixin("HasInputMode", "input_mode", "Input data feeding mode (0=TENSORFLOW, 1=SPARK)",
                      TypeConverters.toInt)
HasMasterNode = _mixin("HasMasterNode", "master_node", "Job name of master/chief worker node",
                       TypeConverters.toString)
HasModelDir = _mixin("HasModelDir", "model_dir", "Path to save/load model checkpoints", TypeConverters.toString)
HasNumPS = _mixin("HasNumPS", "num_ps", "Number of PS nodes in cluster", TypeConverters.toInt)
HasDriverPSNodes = _mixin("HasDriverPSNodes", "driver_ps_nodes", "Run PS nodes on driver locally",
                          TypeConverters.toBoolean)
HasOutputMapping = _mixin("HasOutputMapping", "output_mapping", "Mapping of output tensor to output DataFrame column",
                          TFTypeConverters.toDict)
HasProtocol = _mixin("HasProtocol", "protocol", "Network protocol for Tensorflow (grpc|rdma); ignored by Ember",
                     TypeConverters.toString)
HasReaders = _mixin("HasReaders", "readers", "number of reader/enqueue threads; ignored by Ember",
                    TypeConverters.toInt)
HasSteps = _mixin("HasSteps", "steps", "Maximum number of steps to train", TypeConverters.toInt)
HasTensorboard = _mixin("HasTensorboard", "tensorboard", "Launch tensorboard process", TypeConverters.toBoolean)
HasTFRecordDir = _mixin("HasTFRecordDir", "tfrecord_dir", "Path to temporarily export a DataFrame as TFRecords "
                        "(for InputMode.TENSORFLOW apps)", TypeConverters.toString)
HasExportDir = _mixin("HasExportDir", "export_dir", "Directory to export saved_model", TypeConverters.toString)
HasSignatureDefKey = _mixin("HasSignatureDefKey", "signature_def_key",
                            "Identifier for a specific saved_model signature", TypeConverters.toString)
HasTagSet = _mixin("HasTagSet", "tag_set", "Comma-delimited list of tags identifying a saved_model metagraph",
                   TypeConverters.toString)


class TFParams(Params):
    """Mix-in of TFoS's stages: ``args`` (a Namespace) and ``merge_args_params``."""

    args: Namespace

    def merge_args_params(self) -> Namespace:
        """A copy of ``args`` with every Param set on it by name (``args.batch_size``, ...)."""
        local_args = copy.copy(self.args)
        args_dict = vars(local_args)
        for p in self.params:
            args_dict[p.name] = self.getOrDefault(p.name)
        return local_args


class TFEstimator(Estimator, TFParams, HasInputMapping, HasClusterSize, HasNumPS, HasDriverPSNodes, HasInputMode,
                  HasMasterNode, HasProtocol, HasGraceSecs, HasTensorboard, HasModelDir, HasExportDir,
                  HasTFRecordDir, HasBatchSize, HasEpochs, HasReaders, HasSteps):
    """Trains with ``train_fn(args, ctx)`` on an Ember cluster; ``fit`` returns a :class:`TFModel`.

    Args:
        train_fn: the nodes' main function (TFoS's ``map_fun``).
        tf_args: argparse Namespace, dict or argv list; see the module doc.
        export_fn: optional ``export_fn(args)`` run on the driver after training.
    """

    def __init__(self, train_fn: Callable[[Any, Any], Any], tf_args: Any, export_fn: Optional[Callable] = None):
        super().__init__()
        self.train_fn = train_fn
        self.export_fn = export_fn
        self.args = Namespace(tf_args)
        self._setDefault(input_mapping={}, cluster_size=1, num_ps=0, driver_ps_nodes=False,
                         input_mode=int(InputMode.SPARK), master_node="chief", protocol="grpc",
                         tensorboard=False, model_dir=None, export_dir=None, tfrecord_dir=None,
                         batch_size=100, epochs=1, readers=1, steps=1000, grace_secs=30)

    def _fit(self, dataset: Any) -> "TFModel":
        local_args = self.merge_args_params()
        tf_args = self.args.argv if self.args.argv else local_args
        mode = InputMode(local_args.input_mode)
        if mode == InputMode.SPARK and not local_args.input_mapping:
            raise ValueError("TFEstimator: input_mapping is empty; setInputMapping({column: tensor}) names the "
                             "columns to feed")
        for col in sorted(local_args.input_mapping):
            if col not in dataset.columns:
                raise ValueError(f"TFEstimator: input_mapping column {col!r} is not in the DataFrame "
                                 f"(columns: {', '.join(dataset.columns)})")
        cluster = _run_cluster(dataset.sparkSession, self.train_fn, tf_args, local_args, mode)
        try:
            if mode == InputMode.SPARK:
                cluster.train(dataset.select(sorted(local_args.input_mapping)), local_args.epochs)
        except BaseException:
            cluster.shutdown(timeout=60)  # ends (aborts, past the timeout) what still runs
            raise
        cluster.shutdown(grace_secs=local_args.grace_secs)
        if self.export_fn is not None:
            self.export_fn(local_args)
        return self._copyValues(TFModel(self.args))


def _run_cluster(spark: Any, train_fn: Callable, tf_args: Any, a: Namespace, mode: InputMode):
    """TFCluster.run of the compat package when present (it has driver_ps_nodes), else ember.Cluster.run."""
    try:
        from ember.compat.tensorflowonspark import TFCluster
    except ImportError:
        TFCluster = None
    run = getattr(TFCluster, "run", None)
    master = a.master_node or None
    if run is not None:
        return run(spark.sparkContext, train_fn, tf_args, a.cluster_size, a.num_ps, a.tensorboard, mode,
                   driver_ps_nodes=a.driver_ps_nodes, master_node=master)
    import ember
    return ember.Cluster.run(spark, train_fn, tf_args, num_executors=a.cluster_size, num_ps=a.num_ps,
                             tensorboard=a.tensorboard, input_mode=mode, master_node=master,
                             driver_ps_nodes=bool(a.driver_ps_nodes))


# --------------------------------------------------------------------------- TFModel
_loaded: "collections.OrderedDict[tuple, Any]" = collections.OrderedDict()  # per Python worker
_loaded_lock = threading.Lock()


def _signature(export_dir: str, tag_set: str, key: str):
    """The SavedModel's signature `key`, loaded once per process (TFoS cached it the same way)."""
    cache_key = (export_dir, tag_set, key)
    with _loaded_lock:
        if cache_key in _loaded:
            return _loaded[cache_key]
    import tensorflow as tf
    tags = [t for t in (tag_set or "").split(",") if t] or None
    loaded = tf.saved_model.load(export_dir, tags=tags)
    if key not in loaded.signatures:
        raise ValueError(f"TFModel: the SavedModel in {export_dir} has no signature {key!r}; it has "
                         f"{sorted(loaded.signatures)} (setSignatureDefKey)")
    sig = loaded.signatures[key]
    with _loaded_lock:
        _loaded[cache_key] = (loaded, sig)
        while len(_loaded) > 4:
            _loaded.popitem(last=False)
    return loaded, sig


def _output_field(name: str, spec: Any):
    from pyspark.sql.types import ArrayType, DoubleType, FloatType, LongType, StringType, StructField

    import tensorflow as tf
    scalar = {tf.float32: FloatType(), tf.float64: DoubleType(), tf.string: StringType()}.get(spec.dtype, None)
    if scalar is None:
        scalar = LongType() if spec.dtype.is_integer or spec.dtype == tf.bool else DoubleType()
    per_row_scalar = spec.shape.rank is not None and spec.shape.rank <= 1
    return StructField(name, scalar if per_row_scalar else ArrayType(scalar), True)


def _to_arrow(values: np.ndarray, field: Any) -> pa.Array:
    from pyspark.sql.types import ArrayType, DoubleType, FloatType, LongType

    def scalar_type(t):
        return {FloatType: pa.float32(), DoubleType: pa.float64(), LongType: pa.int64()}.get(type(t), pa.string())

    if isinstance(field.dataType, ArrayType):
        flat = values.reshape(len(values), -1)
        inner = scalar_type(field.dataType.elementType)
        offsets = pa.array(np.arange(0, flat.size + 1, max(1, flat.shape[1]), dtype=np.int32))
        return pa.ListArray.from_arrays(offsets, pa.array(flat.ravel().astype(inner.to_pandas_dtype())),
                                        type=pa.list_(pa.field("element", inner)))
    t = scalar_type(field.dataType)
    flat = values.reshape(len(values))
    if pa.types.is_string(t):
        return pa.array([v.decode() if isinstance(v, bytes) else str(v) for v in flat], t)
    return pa.array(flat.astype(t.to_pandas_dtype()))


def _row_dims(spec: Any) -> Optional[List[Optional[int]]]:
    """The per-row dimensions of a signature input (its shape without the batch dimension), or
    None when the signature does not fix its rank."""
    if spec is None or spec.shape.rank is None:
        return None
    return spec.shape.as_list()[1:]


def _shaped(x: np.ndarray, col: str, tensor: str, spec: Any, key: str) -> np.ndarray:
    """Column `col`'s batch `x` in the shape input `tensor` of signature `key` takes.

    Spark columns are flat, and a SavedModel does not carry the reshape of the program that
    trained it, so, as TFoS, each row is reshaped to the signature's shape (a 784-value image
    to ``[28, 28, 1]``).  Checked here, before TensorFlow runs: a shape that does not fit
    raises ValueError naming the column, its values per row and the expected shape (fed as it
    is, TF's kernels can abort the whole Python worker).
    """
    expected = f"{tensor!r} of signature {key!r}, shape {spec.shape if spec is not None else '?'}"
    if x.dtype == object:  # rows of different lengths (or nulls): column_to_numpy gives up
        lengths = sorted({-1 if v is None else int(np.size(v)) for v in x})
        raise ValueError(f"TFModel: column {col!r} has rows of different lengths ({lengths[:5]}; -1 is null); "
                         f"input {expected} needs the same number of values in every row")
    want = _row_dims(spec)
    have = list(x.shape[1:])
    if want is None or (len(have) == len(want) and all(w is None or w == h for h, w in zip(have, want))):
        return x
    per_row = int(np.prod(have, dtype=np.int64))
    known = int(np.prod([w for w in want if w is not None], dtype=np.int64))
    unknown = sum(w is None for w in want)
    if (unknown == 0 and known == per_row) or (unknown == 1 and known > 0 and per_row % known == 0):
        return x.reshape([len(x)] + [-1 if w is None else w for w in want])
    raise ValueError(f"TFModel: column {col!r} holds {per_row} values per row (row shape {have}), which do not "
                     f"fit input {expected}")


def _run_model(export_dir: str, tag_set: str, key: str, input_mapping: Dict[str, str],
               output_mapping: Dict[str, str], out_fields: List[Any], batch_size: int,
               batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function of TFModel.transform: the signature's outputs, batch by batch."""
    import tensorflow as tf

    from ember._arrow_rows import column_to_numpy

    _, sig = _signature(export_dir, tag_set, key)
    specs = sig.structured_input_signature[1]
    for batch in batches:
        n = batch.num_rows
        inputs = {}
        for col, tensor in sorted(input_mapping.items()):
            arr = batch.column(batch.schema.get_field_index(col))
            spec = specs.get(tensor)
            if pa.types.is_struct(arr.type):  # a Spark ML Vector
                from ember.ml import _vectors_to_matrix
                dims = _row_dims(spec)
                if dims is not None and None not in dims:
                    width = int(np.prod(dims, dtype=np.int64))
                else:
                    width = int(arr.flatten()[3].value_lengths()[0].as_py())
                x = _vectors_to_matrix(arr, width, col)
            else:
                x = column_to_numpy(arr)
            x = _shaped(x, col, tensor, spec, key)
            if spec is not None:
                x = x.astype(spec.dtype.as_numpy_dtype, copy=False)
            inputs[tensor] = x
        outs: Dict[str, List[np.ndarray]] = {t: [] for t in output_mapping}
        for i in range(0, n, batch_size):
            result = sig(**{t: tf.constant(v[i:i + batch_size]) for t, v in inputs.items()})
            for t in output_mapping:
                if t not in result:
                    raise ValueError(f"TFModel: output_mapping names tensor {t!r}, but signature {key!r} "
                                     f"returns {sorted(result)}")
                outs[t].append(result[t].numpy())
        arrays = []
        for (t, col), f in zip(sorted(output_mapping.items()), out_fields):
            values = np.concatenate(outs[t]) if outs[t] else np.zeros((0,), np.float32)
            arrays.append(_to_arrow(values, f))
        yield pa.RecordBatch.from_arrays(arrays, names=[f.name for f in out_fields])


class TFModel(Model, TFParams, HasInputMapping, HasOutputMapping, HasBatchSize, HasModelDir, HasExportDir,
              HasSignatureDefKey, HasTagSet):
    """Inference with a SavedModel over a DataFrame (TFoS's TFModel); see the module doc.

    ``transform(df)`` returns a DataFrame of the ``output_mapping`` columns (ordered by tensor
    name, as TFoS did), one row per input row, in input order.
    """

    def __init__(self, tf_args: Any):
        super().__init__()
        self.args = Namespace(tf_args)
        self._setDefault(input_mapping={}, output_mapping={}, batch_size=100, model_dir=None, export_dir=None,
                         signature_def_key="serving_default", tag_set="serve")

    def _transform(self, dataset: Any) -> Any:
        from pyspark.sql.types import StructType

        a = self.merge_args_params()
        if not a.export_dir:
            raise ValueError("TFModel: export_dir is not set (setExportDir: the SavedModel to load)")
        if not a.input_mapping or not a.output_mapping:
            raise ValueError("TFModel: setInputMapping({column: tensor}) and setOutputMapping({tensor: column}) "
                             "say what to feed and what to return")
        for col in a.input_mapping:
            if col not in dataset.columns:
                raise ValueError(f"TFModel: input_mapping column {col!r} is not in the DataFrame "
                                 f"(columns: {', '.join(dataset.columns)})")
        _, sig = _signature(a.export_dir, a.tag_set, a.signature_def_key)  # on the driver: the output types
        for tensor in a.input_mapping.values():
            if tensor not in sig.structured_input_signature[1]:
                raise ValueError(f"TFModel: input_mapping names tensor {tensor!r}, but signature "
                                 f"{a.signature_def_key!r} takes {sorted(sig.structured_input_signature[1])}")
        out_specs = sig.structured_outputs
        fields = []
        for tensor, col in sorted(a.output_mapping.items()):
            if tensor not in out_specs:
                raise ValueError(f"TFModel: output_mapping names tensor {tensor!r}, but signature "
                                 f"{a.signature_def_key!r} returns {sorted(out_specs)}")
            fields.append(_output_field(col, out_specs[tensor]))
        fn = functools.partial(_run_model, a.export_dir, a.tag_set, a.signature_def_key, dict(a.input_mapping),
                               dict(a.output_mapping), fields, int(a.batch_size))
        return dataset.select(sorted(a.input_mapping)).mapInArrow(fn, StructType(fields))
