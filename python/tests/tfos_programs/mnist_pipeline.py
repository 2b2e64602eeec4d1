"""TFoS ``examples/mnist/keras/mnist_pipeline.py`` style: Spark ML pipeline stages, run as a
program (``spark-submit mnist_pipeline.py --mode train|inference ...``).

``--mode train`` fits a ``TFEstimator`` whose nodes read the ``image``/``label`` columns one row
at a time through ``TFNode.DataFeed`` (a ``tf.data`` generator that reshapes each flat image to
``[28, 28, 1]``), train a Keras 2 CNN under MultiWorkerMirroredStrategy and export it with
``compat``.  ``--mode inference`` loads that export with ``TFModel``, mapping the flat ``image``
column to the signature's ``conv2d_input`` (``[None, 28, 28, 1]``), and writes the
``dense_1`` scores with their argmax as JSON.  Input is CSV: ``label,pixel0,...,pixel783``.

As TFoS's example, but ``--rows`` (TFoS: 60000 fixed) sizes the steps per epoch to the data.
Run with ``TF_USE_LEGACY_KERAS=1`` (tf-keras), as TFoS-era Keras 2 programs are.
"""


def main_fun(args, ctx):
    import numpy as np
    import tensorflow as tf

    from ember.compat.tensorflowonspark import TFNode, compat

    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    def build_and_compile_cnn_model():
        model = tf.keras.Sequential([
            tf.keras.layers.Conv2D(32, 3, activation='relu', input_shape=(28, 28, 1)),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation='relu'),
            tf.keras.layers.Dense(10, activation='softmax'),
        ])
        model.compile(loss=tf.keras.losses.sparse_categorical_crossentropy,
                      optimizer=tf.keras.optimizers.Adam(learning_rate=0.003), metrics=['accuracy'])
        return model

    tf_feed = TFNode.DataFeed(ctx.mgr, False)

    def rdd_generator():
        while not tf_feed.should_stop():
            batch = tf_feed.next_batch(1)
            if len(batch) == 0:
                return
            example = batch[0]
            image = np.reshape(np.array(example[0]).astype(np.float32) / 255.0, (28, 28, 1))
            label = np.reshape(np.array(example[1]).astype(np.float32), (1,))
            yield image, label

    ds = tf.data.Dataset.from_generator(rdd_generator, (tf.float32, tf.float32),
                                        (tf.TensorShape([28, 28, 1]), tf.TensorShape([1])))
    options = tf.data.Options()
    compat.disable_auto_shard(options)  # each node reads its own part of the feed
    ds = ds.with_options(options).batch(args.batch_size)

    tf.io.gfile.makedirs(args.model_dir)
    callbacks = [tf.keras.callbacks.ModelCheckpoint(filepath=args.model_dir + "/weights-{epoch:04d}",
                                                    save_weights_only=True)]
    with strategy.scope():
        multi_worker_model = build_and_compile_cnn_model()

    # Synchronous training: stop at 90% of the steps a node can expect, before any runs dry.
    max_steps_per_worker = int(args.rows / args.batch_size / ctx.num_workers * 0.9)
    multi_worker_model.fit(x=ds, epochs=args.epochs, steps_per_epoch=max_steps_per_worker, callbacks=callbacks,
                           verbose=2)
    compat.export_saved_model(multi_worker_model, args.export_dir, ctx.job_name == 'chief')
    tf_feed.terminate()


if __name__ == '__main__':
    import argparse

    from pyspark.conf import SparkConf
    from pyspark.context import SparkContext
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import udf
    from pyspark.sql.types import IntegerType

    from ember.compat.tensorflowonspark.pipeline import TFEstimator, TFModel

    sc = SparkContext(conf=SparkConf().setAppName("mnist_keras"))
    spark = SparkSession(sc)

    executors = sc._conf.get("spark.executor.instances")
    num_executors = int(executors) if executors is not None else 1

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", help="number of records per batch", type=int, default=64)
    parser.add_argument("--cluster_size", help="number of nodes in the cluster", type=int, default=num_executors)
    parser.add_argument("--epochs", help="number of epochs", type=int, default=3)
    parser.add_argument("--images_labels", help="path to MNIST images and labels in CSV")
    parser.add_argument("--mode", help="train|inference", choices=["train", "inference"], default="train")
    parser.add_argument("--model_dir", help="path to save checkpoint", default="mnist_model")
    parser.add_argument("--export_dir", help="path to export saved_model", default="mnist_export")
    parser.add_argument("--output", help="path to save predictions", type=str, default="predictions")
    parser.add_argument("--rows", help="rows in the training data", type=int, default=60000)
    parser.add_argument("--tensorboard", help="launch tensorboard process", action="store_true")
    args = parser.parse_args()
    print("args:", args)

    def parse(ln):
        vec = [int(x) for x in ln.split(',')]
        return (vec[1:], vec[0])

    images_labels = sc.textFile(args.images_labels).map(parse)
    df = spark.createDataFrame(images_labels, ['image', 'label'])

    if args.mode == 'train':
        estimator = TFEstimator(main_fun, args) \
            .setInputMapping({'image': 'image', 'label': 'label'}) \
            .setModelDir(args.model_dir) \
            .setExportDir(args.export_dir) \
            .setClusterSize(args.cluster_size) \
            .setTensorboard(args.tensorboard) \
            .setEpochs(args.epochs) \
            .setBatchSize(args.batch_size) \
            .setGraceSecs(60)
        model = estimator.fit(df)
    else:
        model = TFModel(args) \
            .setInputMapping({'image': 'conv2d_input'}) \
            .setOutputMapping({'dense_1': 'prediction'}) \
            .setSignatureDefKey('serving_default') \
            .setExportDir(args.export_dir) \
            .setBatchSize(args.batch_size)

        def argmax_fn(scores):
            return max(range(len(scores)), key=lambda i: scores[i])

        argmax = udf(argmax_fn, IntegerType())
        preds = model.transform(df).withColumn('argmax', argmax('prediction'))
        preds.show()
        preds.write.json(args.output)
