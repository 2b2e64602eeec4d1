"""InputMode.SPARK training, TFoS ``examples/mnist/keras/mnist_spark.py`` style: the driver feeds
an RDD of ``(pixels, label)`` rows; each node reads them with ``TFNode.DataFeed(ctx.mgr)``
through a ``tf.data`` generator, trains with ``model.fit``, exports with ``compat``, and
terminates its feed."""


def _cnn(keras):
    return keras.Sequential([
        keras.layers.Conv2D(8, 3, activation="relu", input_shape=(28, 28, 1)),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax"),
    ])


def _dataset(tf, np, tf_feed, batch_size):
    def rdd_generator():
        while not tf_feed.should_stop():
            batch = tf_feed.next_batch(batch_size)
            if len(batch) == 0:
                return
            images = np.array([row[0] for row in batch], dtype=np.float32).reshape(-1, 28, 28, 1) / 255.0
            labels = np.array([row[1] for row in batch], dtype=np.float32).reshape(-1, 1)
            yield images, labels

    ds = tf.data.Dataset.from_generator(
        rdd_generator, output_signature=(tf.TensorSpec((None, 28, 28, 1), tf.float32),
                                         tf.TensorSpec((None, 1), tf.float32)))
    return ds


def _steps_per_epoch(args, ctx):
    # Every node must run the same number of synchronous steps before any runs dry; as TFoS's
    # example does, stop at 90% of the rows a node can expect per epoch.
    return int(args.rows / ctx.num_workers / args.batch_size * 0.9)


def main_fun_keras2(args, ctx):
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    from ember.compat.tensorflowonspark import TFNode, compat

    tf.config.threading.set_intra_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if strategy.num_replicas_in_sync != ctx.num_workers:  # TF_CONFIG names every worker
        raise RuntimeError(f"{strategy.num_replicas_in_sync} replicas for {ctx.num_workers} workers")
    tf_feed = TFNode.DataFeed(ctx.mgr, False)
    options = tf.data.Options()
    compat.disable_auto_shard(options)  # each node reads its own part of the feed
    ds = _dataset(tf, np, tf_feed, args.batch_size).with_options(options)
    with strategy.scope():
        model = _cnn(tf.keras)
        model.compile(loss=tf.keras.losses.sparse_categorical_crossentropy,
                      optimizer=tf.keras.optimizers.Adam(learning_rate=0.003), metrics=["accuracy"])
    model.fit(x=ds, epochs=args.epochs, steps_per_epoch=_steps_per_epoch(args, ctx), verbose=0)
    compat.export_saved_model(model, args.export_dir, ctx.job_name == "chief")
    tf_feed.terminate()


def main_fun_keras3(args, ctx):
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import numpy as np
    import tensorflow as tf

    import ember.keras
    from ember.compat.tensorflowonspark import TFNode, compat

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf_feed = TFNode.DataFeed(ctx.mgr, False)
    ds = _dataset(tf, np, tf_feed, args.batch_size)
    model = _cnn(keras)
    model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  optimizer=ember.keras.DistributedOptimizer(keras.optimizers.Adam(learning_rate=0.003)))
    model.fit(ds, epochs=args.epochs, steps_per_epoch=_steps_per_epoch(args, ctx),
              callbacks=[ember.keras.SyncCallback()], verbose=0)
    compat.export_saved_model(model, args.export_dir, ctx.job_name == "chief")
    tf_feed.terminate()
