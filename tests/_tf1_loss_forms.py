"""Three ways a TPUEstimator model_fn writes its loss (issue 50, item 2), run in a process
of its own: ``python -m tests._tf1_loss_forms <model_dir>`` under FENWICKS_DEVICE=cpu:N
prints, per form, the first step's training loss, the weights after it, and the
evaluation loss over 10 examples in batches of 8 (the last one padded).

The model is a bias-free Dense(3) classifier from fixed weights, trained one step by
``GradientDescentOptimizer(0.5).minimize``; tests/test_tpu_estimator_losses.py checks the
numbers against NumPy.
"""

from __future__ import annotations

import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

import fenwicks as fw

v1 = tf.compat.v1
W = np.array([[0.3, -0.2, 0.1], [-0.4, 0.5, 0.2], [0.1, 0.1, -0.3], [0.2, -0.1, 0.4]],
             np.float32)
LR = 0.5
FORMS = ("keras_object", "v1_losses", "reduce_mean")


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)
    return (rng.normal(size=(18, 4)).astype(np.float32) * 2,
            rng.integers(0, 3, 18).astype(np.int32))


def _loss(form: str, labels, logits):
    if form == "keras_object":
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
    if form == "v1_losses":
        return v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))


def model_fn_of(form: str):
    def model_fn(features, labels, mode, params):
        dense = keras.layers.Dense(3, use_bias=False,
                                   kernel_initializer=keras.initializers.Constant(W))
        logits = dense(features)
        if mode == fw.train.ModeKeys.PREDICT:
            return fw.train.TPUEstimatorSpec(mode, predictions=tf.tile(
                tf.reshape(dense.kernel, [1, -1]), [tf.shape(features)[0], 1]))
        loss = _loss(form, labels, logits)
        train_op = None
        if mode == fw.train.ModeKeys.TRAIN:
            train_op = v1.train.GradientDescentOptimizer(LR).minimize(
                loss, v1.train.get_or_create_global_step())
        return fw.train.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)
    return model_fn


def run(form: str, model_dir: str) -> dict:
    x, y = data()
    est = fw.train.TPUEstimator(model_fn_of(form), model_dir=model_dir, train_batch_size=8,
                                eval_batch_size=8, predict_batch_size=8, verbose=False,
                                config=fw.train.RunConfig(tpu_config=fw.train.TPUConfig(1)))
    est.train(lambda params: tf.data.Dataset.from_tensor_slices((x[:8], y[:8])).batch(
        params["batch_size"], drop_remainder=True).repeat(), max_steps=1)
    weights = next(iter(est.predict(lambda params: tf.data.Dataset.from_tensor_slices(
        x[:1]).batch(params["batch_size"]))))
    result = est.evaluate(lambda params: tf.data.Dataset.from_tensor_slices(
        (x[8:], y[8:])).batch(params["batch_size"]))
    out = {"train_loss": float(est.estimator.history.losses[0]),
           "w": weights.reshape(4, 3).tolist(), "eval_loss": float(result["loss"]),
           "num_examples": int(result["num_examples"])}
    est.close()
    return out


def main(root: str) -> None:
    out = {"replicas": fw.accel.current().num_replicas}
    for form in FORMS:
        out[form] = run(form, os.path.join(root, form))
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
