# Ported from tensorflow/tpu (Apache License 2.0), commit 7dc921f846c9e4071f3884b768a7ddf521272a49:
# models/official/mnist/mnist_tpu.py, as written but for the lines marked `# TF2`
# (tf.estimator and tf.layers are gone from TensorFlow 2) and main()'s last line, which
# hands the estimator to the test. FLAGS holds the flags' values; absl's flag definitions
# and the TPUClusterResolver line (fw.accel finds the device) are left out.
"""MNIST model training using TPUs (tensorflow/tpu's mnist_tpu.py)."""

import os
import types

import keras  # TF2: tf.layers is gone
from absl import logging
import tensorflow.compat.v1 as tf

import fenwicks as fw  # TF2: tf.estimator is gone


FLAGS = types.SimpleNamespace(  # absl flags' values
    learning_rate=0.05, use_tpu=True, batch_size=32,
                              iterations=20, num_shards=8, train_steps=40, eval_steps=3,
                              enable_predict=True, data_dir=None, model_dir=None)


def metric_fn(labels, logits):
    accuracy = tf.metrics.accuracy(
        labels=labels, predictions=tf.argmax(logits, axis=1))
    return {"accuracy": accuracy}


def model_fn(features, labels, mode, params):
    """model_fn constructs the ML model used to predict handwritten digits."""

    del params

    image = features / 255.

    y = keras.layers.Conv2D(filters=32,  # TF2: tf.layers
                            kernel_size=5,
                            padding="same",
                            activation="relu")(image)
    y = keras.layers.MaxPooling2D(pool_size=(2, 2),  # TF2: tf.layers
                                  strides=(2, 2),
                                  padding="same")(y)
    y = keras.layers.Conv2D(filters=32,  # TF2: tf.layers
                            kernel_size=5,
                            padding="same",
                            activation="relu")(y)
    y = keras.layers.MaxPooling2D(pool_size=(2, 2),  # TF2: tf.layers
                                  strides=(2, 2),
                                  padding="same")(y)
    y = keras.layers.Flatten()(y)  # TF2: tf.layers
    y = keras.layers.Dense(1024, activation="relu")(y)  # TF2: tf.layers
    y = keras.layers.Dropout(0.4)(y, training=(mode == fw.train.ModeKeys.TRAIN))  # TF2

    logits = keras.layers.Dense(10)(y)  # TF2: tf.layers

    if mode == fw.train.ModeKeys.PREDICT:  # TF2: tf_estimator
        predictions = {
            "class_ids": tf.argmax(logits, axis=1),
            "probabilities": tf.nn.softmax(logits),
        }
        return fw.train.TPUEstimatorSpec(mode, predictions=predictions)  # TF2

    loss = tf.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)

    if mode == fw.train.ModeKeys.TRAIN:  # TF2: tf_estimator
        learning_rate = tf.train.exponential_decay(
            FLAGS.learning_rate,
            tf.train.get_global_step(),
            decay_steps=100000,
            decay_rate=0.96)
        optimizer = tf.train.GradientDescentOptimizer(learning_rate=learning_rate)
        if FLAGS.use_tpu:
            optimizer = tf.tpu.CrossShardOptimizer(optimizer)
        return fw.train.TPUEstimatorSpec(  # TF2: tf_estimator
            mode=mode,
            loss=loss,
            train_op=optimizer.minimize(loss, tf.train.get_global_step()))

    if mode == fw.train.ModeKeys.EVAL:  # TF2: tf_estimator
        return fw.train.TPUEstimatorSpec(  # TF2: tf_estimator
            mode=mode, loss=loss, eval_metrics=(metric_fn, [labels, logits]))


def dataset(records_file):
    """Loads MNIST dataset from given TFRecords file."""
    features = {
        "image_raw": tf.io.FixedLenFeature((), tf.string),
        "label": tf.io.FixedLenFeature((), tf.int64),
    }

    def decode_record(record):
        example = tf.io.parse_single_example(record, features)
        image = tf.decode_raw(example["image_raw"], tf.uint8)
        image = tf.cast(image, tf.float32)
        image = tf.reshape(image, [28, 28, 1])

        return image, example["label"]

    return tf.data.TFRecordDataset(records_file).map(decode_record)


def train_input_fn(params):
    """train_input_fn defines the input pipeline used for training."""
    batch_size = params["batch_size"]
    records_file = os.path.join(params["data_dir"], "train.tfrecords")

    return dataset(records_file).cache().repeat().shuffle(
        buffer_size=50000).batch(batch_size, drop_remainder=True)


def eval_input_fn(params):
    batch_size = params["batch_size"]
    records_file = os.path.join(params["data_dir"], "validation.tfrecords")

    return dataset(records_file).batch(batch_size, drop_remainder=True)


def predict_input_fn(params):
    batch_size = params["batch_size"]
    records_file = os.path.join(params["data_dir"], "test.tfrecords")

    return dataset(records_file).take(10).batch(batch_size)


def main(argv):
    del argv  # Unused.
    run_config = fw.train.RunConfig(  # TF2: tf_estimator
        model_dir=FLAGS.model_dir,
        session_config=tf.ConfigProto(
            allow_soft_placement=True, log_device_placement=True),
        tpu_config=fw.train.TPUConfig(FLAGS.iterations, FLAGS.num_shards),  # TF2
    )

    estimator = fw.train.TPUEstimator(  # TF2: tf_estimator
        model_fn=model_fn,
        use_tpu=FLAGS.use_tpu,
        train_batch_size=FLAGS.batch_size,
        eval_batch_size=FLAGS.batch_size,
        predict_batch_size=FLAGS.batch_size,
        params={"data_dir": FLAGS.data_dir},
        config=run_config)
    estimator.train(input_fn=train_input_fn, max_steps=FLAGS.train_steps)
    if FLAGS.eval_steps:
        estimator.evaluate(input_fn=eval_input_fn, steps=FLAGS.eval_steps)

    if FLAGS.enable_predict:
        predictions = estimator.predict(input_fn=predict_input_fn)

        for pred_dict in predictions:
            template = ('Prediction is "{}" ({:.1f}%).')

            class_id = pred_dict["class_ids"]
            probability = pred_dict["probabilities"][class_id]

            logging.info(template.format(class_id, 100 * probability))
    return estimator  # (the test goes on with it)
