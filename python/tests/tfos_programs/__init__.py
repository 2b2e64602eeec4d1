"""TensorFlowOnSpark-style programs run by test_compat_tfos.py, written from TFoS's documented API
in the style of its published MNIST examples, with only the ``tensorflowonspark`` imports changed
to ``ember.compat.tensorflowonspark``.  They train on Fashion-MNIST rows (784 pixels + label).

Keras 2 programs (``*_keras2``) use ``tf.keras`` under MultiWorkerMirroredStrategy, as TFoS's
examples do; they run with ``TF_USE_LEGACY_KERAS=1`` (tf-keras).  Keras 3 programs
(``*_keras3``) synchronise with Ember's engine (``ember.keras.DistributedOptimizer``), since
Keras 3's ``model.fit`` cannot run MultiWorkerMirroredStrategy on more than one worker.
"""
