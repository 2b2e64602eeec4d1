"""Elephas's API on Ember (issue 21, in progress): an Elephas program runs with its imports changed.

    # was: from elephas.spark_model import SparkModel
    #      from elephas.utils.rdd_utils import to_simple_rdd
    from ember.compat.elephas import SparkModel, to_simple_rdd

    rdd = to_simple_rdd(sc, x_train, y_train)
    spark_model = SparkModel(model, frequency="epoch", mode="asynchronous", num_workers=2)
    spark_model.fit(rdd, epochs=20, batch_size=32, verbose=0)
    spark_model.master_network.evaluate(x_test, y_test)   # or spark_model.evaluate / predict

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

Not carried over: ``parameter_server_mode`` and ``port`` (the shard picks its own port on the
job's transport), ``validation_split`` inside ``fit`` (warned; evaluate on held-out data
afterwards), ``custom_objects`` beyond what ``keras.saving`` registers.
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Optional

import numpy as np

_WEIGHTS_KEY = "ember/elephas/weights"  # the chief's final weights (npz), for the driver


def to_simple_rdd(sc: Any, features: Any, labels: Any):
    """An RDD of (features, label) pairs, as Elephas's ``to_simple_rdd``."""
    return sc.parallelize(list(zip(np.asarray(features), np.asarray(labels))))


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


class SparkModel:
    """Elephas's ``SparkModel``: trains a compiled Keras model on an RDD of (features, label)
    pairs over `num_workers` Ember nodes (see the module doc)."""

    def __init__(self, model: Any, mode: str = "asynchronous", frequency: str = "epoch",
                 parameter_server_mode: str = "http", num_workers: Optional[int] = None,
                 custom_objects: Any = None, batch_size: int = 32, port: int = 4000, *args: Any, **kwargs: Any):
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
        """Trains on `rdd` (RDD of (features, label)) for `epochs`; ``master_network`` ends
        with the trained weights."""
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

    def predict(self, data: Any) -> Any:
        """Predictions of the trained model for a numpy array (on the driver)."""
        return self._master_network.predict(np.asarray(data), verbose=0)

    def evaluate(self, x_test: Any, y_test: Any, **kwargs: Any) -> Any:
        return self._master_network.evaluate(x_test, y_test, **kwargs)

    def save(self, file_name: str, overwrite: bool = False) -> None:
        self._master_network.save(file_name, overwrite=overwrite)
