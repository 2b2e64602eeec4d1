"""InputMode.SPARK inference, TFoS style: every node loads the exported SavedModel, calls its
``serving_default`` signature with TFoS's input/output names and answers every fed row through
``TFNode.DataFeed(ctx.mgr, train_mode=False)`` / ``batch_results``."""


def main_fun(args, ctx):
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    from ember.compat.tensorflowonspark import TFNode

    saved_model = tf.saved_model.load(args.export_dir, tags="serve")
    predict = saved_model.signatures["serving_default"]
    tf_feed = TFNode.DataFeed(ctx.mgr, train_mode=False)
    while not tf_feed.should_stop():
        batch = tf_feed.next_batch(args.batch_size)
        if len(batch) > 0:
            images = np.array([row[0] for row in batch], dtype=np.float32).reshape(-1, 28, 28, 1) / 255.0
            predictions = predict(conv2d_input=tf.constant(images))
            tf_feed.batch_results([int(p) for p in np.argmax(predictions["dense"], axis=1)])
