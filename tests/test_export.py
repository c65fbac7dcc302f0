"""`fenwicks.train.tf.export` on its own: a SavedModel whose serving signature applies the
model's predict_fn, with a dynamic batch dimension."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from fenwicks.train.model_func import ModelSpec
from fenwicks.train.tf import export

KERNEL = np.array([[1.0, -2.0, 0.5], [0.0, 1.0, 3.0]], np.float32)  # 2 features, 3 classes


def _spec(predict_fn) -> ModelSpec:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3, use_bias=False)])
    model.layers[0].kernel.assign(KERNEL)
    return ModelSpec(model, keras.optimizers.SGD(0.1), lambda y, out: out[:, 0],
                     predict_fn=predict_fn)


def test_the_serving_signature_applies_predict_fn_to_any_batch_size(tmp_path):
    predict = lambda logits: {"classes": tf.argmax(logits, axis=1),
                              "probabilities": tf.nn.softmax(logits)}
    # Exported with a batch of 4; served with 3 rows: the batch dimension is dynamic.
    path = export.export_saved_model(_spec(predict), tf.TensorSpec([4, 2], tf.float32),
                                     str(tmp_path / "export"))
    assert path == str(tmp_path / "export")
    serve = tf.saved_model.load(path).signatures["serving_default"]
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], np.float32)
    out = serve(x=tf.constant(x))  # a single feature tensor is named "x"
    logits = x.astype(np.float64) @ KERNEL
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(out["classes"].numpy(), [0, 2, 2])
    np.testing.assert_allclose(out["probabilities"].numpy(), probs, rtol=1e-6)


def test_serving_outputs_are_always_a_dict():
    a, b = tf.constant([1.0]), tf.constant([2.0])
    assert export.serving_outputs(a) == {"predictions": a}
    assert export.serving_outputs((a, b)) == {"output_0": a, "output_1": b}
    assert export.serving_outputs({"p": a}) == {"p": a}
