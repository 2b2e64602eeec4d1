"""TFoS's ``compat``: helpers that hide TensorFlow/Keras API changes from TFoS programs.

* :func:`export_saved_model` — a SavedModel for serving, from a Keras 2 (``tf-keras``) or a
  Keras 3 model, with the signature TFoS programs expect: ``serving_default``, inputs named as
  Keras 2 named them (``conv2d_input`` for a Sequential whose first layer is ``conv2d``,
  ``input_1`` for an unnamed functional input), outputs keyed by the output layers' names
  (``dense_1``).  Keras 3's own ``model.export`` names them ``inputs`` / ``output_0``, which
  breaks TFoS-era inference code (``predict(conv2d_input=x)['dense_1']``).
* :func:`disable_auto_shard`, :func:`is_gpu_available` — as TFoS.

TensorFlow is imported on first use, not with this module.
"""
from __future__ import annotations

import logging
import re
import shutil
import tempfile
from typing import Any, List

logger = logging.getLogger(__name__)

_KERAS3_INPUT_RE = re.compile(r"^input_layer(?:_(\d+))?$")  # Keras 3's automatic InputLayer names


def keras_major_version(model: Any) -> int:
    """2 for a ``tf-keras`` (or Keras 2) model, 3 for a Keras 3 model.

    Raises:
        TypeError: `model` is not a Keras model.
    """
    for cls in type(model).__mro__:
        module = cls.__module__ or ""
        if module.startswith("tf_keras.") and cls.__name__ == "Model":
            return 2
        if module.startswith("keras.") and cls.__name__ == "Model":
            import keras
            return 3 if keras.__version__.split(".")[0] == "3" else 2
    raise TypeError(f"export_saved_model takes a Keras model (tf.keras / tf-keras or Keras 3), "
                    f"got {type(model).__module__}.{type(model).__name__}")


def _keras2_input_names(model: Any) -> List[str]:
    """The signature input names Keras 2's SavedModel export gives `model` (a Keras 3 model)."""
    import keras

    layers = [t._keras_history.operation for t in model.inputs]
    names = []
    for k, layer in enumerate(layers):
        name = layer.name
        auto = _KERAS3_INPUT_RE.match(name)
        if auto:
            if isinstance(model, keras.Sequential) and model.layers:
                name = f"{model.layers[0].name}_input"  # Keras 2: Sequential(input_shape=...) named it so
            else:
                name = f"input_{int(auto.group(1) or 0) + 1}"  # Keras 2's input_1, input_2, ...
        names.append(name)
    return names


def _keras2_output_names(model: Any) -> List[str]:
    """The output keys Keras 2's SavedModel export gives `model`: its output layers' names."""
    names = []
    for t in model.outputs:
        name = t._keras_history.operation.name
        names.append(name if name not in names else f"{name}_{len(names)}")
    return names


def _export_keras3(model: Any, export_dir: str) -> None:
    import keras
    import tensorflow as tf

    try:
        inputs = list(model.inputs)
    except (AttributeError, ValueError) as e:
        raise ValueError(f"export_saved_model: the Keras 3 model has no defined inputs/outputs ({e}); build it "
                         f"on an Input (keras.Input(shape)) or call it on data first") from None
    in_names = _keras2_input_names(model)
    out_names = _keras2_output_names(model)
    specs = [tf.TensorSpec(shape=tuple(t.shape), dtype=tf.as_dtype(t.dtype), name=n)
             for t, n in zip(inputs, in_names)]

    def serve(*xs):
        out = model(xs[0] if len(xs) == 1 else list(xs), training=False)
        if isinstance(out, dict):
            return dict(out)
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        return {name: o for name, o in zip(out_names, outs)}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", tf.function(serve, input_signature=specs))
    archive.write_out(export_dir, verbose=False)


def export_saved_model(model: Any, export_dir: str, is_chief: bool = False) -> None:
    """Exports `model` as a SavedModel into `export_dir` on the chief (TFoS ``compat.export_saved_model``).

    * Keras 2 (``tf-keras``, ``TF_USE_LEGACY_KERAS=1``): ``model.save(dir, save_format='tf')``
      on every node, as TFoS: under MultiWorkerMirroredStrategy saving is a collective, so
      the other nodes save too, into a temporary directory that is removed afterwards (TFoS
      left a ``worker_model`` directory in the executor's working directory).
    * Keras 3: only the chief writes (nothing there is collective), through
      ``keras.export.ExportArchive`` with Keras 2's signature names (see the module doc).

    Either way the SavedModel loads with ``tf.saved_model.load(export_dir)`` and serves
    ``signatures['serving_default'](<input name>=x)`` -> ``{<output layer name>: y}``.

    Args:
        model: the trained Keras model.
        export_dir: where the chief writes the SavedModel (a path TensorFlow can write).
        is_chief: True on the node that exports (TFoS examples pass ``ctx.job_name == 'chief'``).

    Raises:
        TypeError: `model` is not a Keras model.
        ValueError: a Keras 3 model with no defined inputs.
    """
    version = keras_major_version(model)
    if version == 2:
        target = export_dir if is_chief else tempfile.mkdtemp(prefix="ember-worker-model-")
        try:
            model.save(target, save_format="tf")
        finally:
            if not is_chief:
                shutil.rmtree(target, ignore_errors=True)
        return
    if is_chief:
        _export_keras3(model, export_dir)


def disable_auto_shard(options: Any) -> None:
    """Turns off tf.data auto-sharding in `options` (a ``tf.data.Options``), as TFoS: for
    datasets each node already reads its own part of (the InputMode.SPARK feed, or files
    sharded by hand)."""
    import tensorflow as tf

    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF


def is_gpu_available() -> bool:
    """Whether TensorFlow sees a GPU on this node."""
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU")) > 0
