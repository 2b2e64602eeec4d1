"""InputMode.TENSORFLOW training, TFoS ``examples/mnist/keras/mnist_tf.py`` style: every node
reads its share of the TFRecord files (written by ``dfutil.saveAsTFRecords``) with tf.data,
trains with ``model.fit`` and the chief exports with ``compat.export_saved_model``."""


def _dataset(tf, args, ctx):
    def parse_tfr(example_proto):
        feature_def = {"label": tf.io.FixedLenFeature(1, tf.int64),
                       "image": tf.io.FixedLenFeature(784, tf.int64)}
        features = tf.io.parse_single_example(serialized=example_proto, features=feature_def)
        image = tf.reshape(tf.cast(features["image"], tf.float32) / 255.0, [28, 28, 1])
        return image, tf.cast(features["label"], tf.float32)

    files = tf.data.Dataset.list_files(ctx.absolute_path(args.images_labels) + "/part-*", shuffle=False)
    ds = files.shard(ctx.num_workers, ctx.worker_num).interleave(tf.data.TFRecordDataset)
    return ds.map(parse_tfr).repeat().batch(args.batch_size)


def _cnn(keras):
    return keras.Sequential([
        keras.layers.Conv2D(8, 3, activation="relu", input_shape=(28, 28, 1)),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(10, activation="softmax"),
    ])


def main_fun_keras2(args, ctx):
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from ember.compat.tensorflowonspark import compat

    tf.config.threading.set_intra_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if strategy.num_replicas_in_sync != ctx.num_workers:  # TF_CONFIG names every worker
        raise RuntimeError(f"{strategy.num_replicas_in_sync} replicas for {ctx.num_workers} workers")
    options = tf.data.Options()
    compat.disable_auto_shard(options)  # sharded by file above
    ds = _dataset(tf, args, ctx).with_options(options)
    with strategy.scope():
        model = _cnn(tf.keras)
        model.compile(loss=tf.keras.losses.sparse_categorical_crossentropy,
                      optimizer=tf.keras.optimizers.Adam(learning_rate=0.003), metrics=["accuracy"])
    model.fit(x=ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=0)
    compat.export_saved_model(model, args.export_dir, ctx.job_name == "chief")


def main_fun_keras3(args, ctx):
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import ember.keras
    from ember.compat.tensorflowonspark import compat

    tf.config.threading.set_intra_op_parallelism_threads(1)
    ds = _dataset(tf, args, ctx)
    model = _cnn(keras)
    model.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                  optimizer=ember.keras.DistributedOptimizer(keras.optimizers.Adam(learning_rate=0.003)))
    model.fit(ds, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
              callbacks=[ember.keras.SyncCallback()], verbose=0)
    compat.export_saved_model(model, args.export_dir, ctx.job_name == "chief")
