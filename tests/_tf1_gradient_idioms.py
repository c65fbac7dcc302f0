"""TF1 gradient idioms in TPUEstimator model_fns (issue 50, item 1), run in a process of
its own: ``python -m tests._tf1_gradient_idioms <model_dir>`` under FENWICKS_DEVICE=cpu:N
prints, per idiom, the weights after training (or the error it was refused with).

The network is two bias-free Dense layers, ``body`` (3 -> 2) and ``head`` (2 -> 1), from
fixed initial weights, with TF1's mean squared error; ``body`` has an L2 regulariser, which
only the ``reg_*`` idioms add to their loss; the NumPy rule the weights are
checked against is in tests/test_tpu_estimator_gradients.py.
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
W1 = np.array([[0.5, -0.3], [0.2, 0.8], [-0.6, 0.1]], np.float32)
W2 = np.array([[0.7], [-0.4]], np.float32)
LR, CLIP, STEPS = 0.1, 1e-3, 2
REG = 0.05  # body's L2 regulariser: REG * sum(W1 ** 2), in the loss of the reg_* idioms


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(50)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    y = rng.normal(size=(8, 1)).astype(np.float32) * 3
    return x, y


class PlainSGD(v1.train.Optimizer):
    """A TF1 optimizer subclass with its own apply_gradients (BERT's pattern)."""

    def __init__(self, learning_rate):
        super().__init__(False, "PlainSGD")
        self.learning_rate = learning_rate

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        return tf.group(*[v.assign(v - self.learning_rate * g) for g, v in grads_and_vars])


def _optimizer(idiom: str):
    step = v1.train.get_global_step()
    if idiom == "subclass_constant":
        return PlainSGD(LR)
    if idiom == "subclass_scheduled":
        return PlainSGD(v1.train.exponential_decay(LR, step, decay_steps=1, decay_rate=0.5))
    optimizer = v1.train.GradientDescentOptimizer(LR)
    return v1.tpu.CrossShardOptimizer(optimizer) if idiom.startswith("cs_") else optimizer


def _train_op(idiom: str, loss, optimizer, step):
    name = idiom.removeprefix("cs_")
    tvars = v1.trainable_variables()
    if name in ("minimize", "reg_added", "reg_total_loss"):
        return optimizer.minimize(loss, step)
    if name == "var_list_scope":
        return optimizer.minimize(loss, step, var_list=v1.trainable_variables("head"))
    if name == "compute_gradients_scaled":
        pairs = optimizer.compute_gradients(loss)
        return optimizer.apply_gradients([(g * 0.5, v) for g, v in pairs], step)
    if name == "tvars_subset":
        tvars = [v for v in tvars if v.name.startswith("head")]
    grads = tf.gradients(loss, tvars)
    if name == "clip_global":
        grads, _ = tf.clip_by_global_norm(grads, CLIP)
    elif name == "clip_per_tensor":
        grads = [tf.clip_by_norm(g, CLIP) for g in grads]
    elif name == "freeze_body":
        grads = [g * 0.0 if v.name.startswith("body") else g
                 for g, v in zip(grads, tvars, strict=True)]
    elif name == "ema":
        v1.train.ExponentialMovingAverage(0.99).apply(tvars)
    return optimizer.apply_gradients(zip(grads, tvars, strict=True), global_step=step)


def model_fn_of(idiom: str):
    def model_fn(features, labels, mode, params):
        # Every idiom's body carries an L2 regulariser: TF1 trained with it only where
        # the model_fn added it to its loss (the reg_* idioms), never by itself.
        body = keras.layers.Dense(2, use_bias=False, name="body",
                                  kernel_initializer=keras.initializers.Constant(W1),
                                  kernel_regularizer=keras.regularizers.l2(REG))
        head = keras.layers.Dense(1, use_bias=False, name="head",
                                  kernel_initializer=keras.initializers.Constant(W2))
        outputs = head(body(features))
        if mode == fw.train.ModeKeys.PREDICT:  # the weights, on every row
            rows = tf.shape(features)[0]
            flat = tf.concat([tf.reshape(body.kernel, [-1]), tf.reshape(head.kernel, [-1])], 0)
            return fw.train.TPUEstimatorSpec(mode, predictions=tf.tile(flat[None], [rows, 1]))
        loss = v1.losses.mean_squared_error(labels, outputs)
        if idiom.endswith("reg_added"):  # TF1's way to train with the layer regularisers
            loss = loss + v1.losses.get_regularization_loss()
        elif idiom == "reg_total_loss":  # the LOSSES collection plus the regularisers
            loss = v1.losses.get_total_loss()
        if mode == fw.train.ModeKeys.EVAL:  # each replica's gradient norm, averaged
            norm = tf.linalg.global_norm(tf.gradients(loss, v1.trainable_variables()))
            return fw.train.TPUEstimatorSpec(mode, loss=loss, eval_metrics=(
                lambda n: {"grad_norm": v1.metrics.mean(n)}, [tf.fill([1], norm)]))
        step = v1.train.get_or_create_global_step()
        train_op = _train_op(idiom, loss, _optimizer(idiom), step)
        return fw.train.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)
    return model_fn


IDIOMS = ("minimize", "cs_minimize", "clip_global", "cs_clip_global", "clip_per_tensor",
          "cs_clip_per_tensor", "freeze_body", "tvars_subset", "cs_tvars_subset",
          "var_list_scope", "cs_var_list_scope", "compute_gradients_scaled",
          "cs_compute_gradients_scaled", "subclass_constant", "subclass_scheduled", "ema",
          # The model_fn adds the regulariser: get_regularization_loss(), get_total_loss().
          "cs_reg_added", "reg_total_loss")


def run(idiom: str, model_dir: str) -> dict:
    x, y = data()
    est = fw.train.TPUEstimator(model_fn_of(idiom), model_dir=model_dir, train_batch_size=8,
                                eval_batch_size=8, predict_batch_size=8, verbose=False,
                                config=fw.train.RunConfig(tpu_config=fw.train.TPUConfig(1)))
    try:
        est.train(lambda params: tf.data.Dataset.from_tensor_slices((x, y)).batch(
            params["batch_size"], drop_remainder=True).repeat(), max_steps=STEPS)
    except ValueError as err:
        return {"error": str(err), "type": type(err).__name__}
    weights = next(iter(est.predict(lambda params: tf.data.Dataset.from_tensor_slices(
        x).batch(params["batch_size"]))))
    norm = padded_loss = None
    if idiom == "reg_total_loss":  # 7 rows: a padded last batch, its padding left out
        padded_loss = est.evaluate(lambda params: tf.data.Dataset.from_tensor_slices(
            (x[:7], y[:7])).batch(params["batch_size"]))["loss"]
    if idiom == "minimize":
        norm = est.evaluate(lambda params: tf.data.Dataset.from_tensor_slices((x, y)).batch(
            params["batch_size"], drop_remainder=True))["grad_norm"]
    est.close()
    return {"w1": weights[:6].reshape(3, 2).tolist(), "w2": weights[6:].reshape(2, 1).tolist(),
            "eval_grad_norm": norm, "padded_eval_loss": padded_loss}


def main(root: str) -> None:
    out = {"replicas": fw.accel.current().num_replicas}
    for idiom in IDIOMS:
        out[idiom] = run(idiom, os.path.join(root, idiom))
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
