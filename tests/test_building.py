"""fenwicks.train.building: the precision policy, building model and optimizer, and the
checks of model against data (input shape, labels, the random state inference keeps).
Tiny Keras models, in-process and eager."""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks.train import building, engines
from fenwicks.train.model_func import ModelSpec
from tests.conftest import run_json


def _clf_spec(model: keras.Model) -> ModelSpec:
    """A sparse-label classifier spec around `model`, as get_clf_model_func makes it."""
    return fw.train.get_clf_model_func(lambda: model, fw.train.sgd_optimizer(0.1))({})


def _dense(shape=(4,), classes=3) -> keras.Model:
    return keras.Sequential([keras.Input(shape), keras.layers.Flatten(),
                             keras.layers.Dense(classes)])


@pytest.mark.parametrize("precision, inside", [("bfloat16", "mixed_bfloat16"),
                                               ("float16", "mixed_float16"),
                                               ("float32", "float32")])
def test_precision_policy_is_set_inside_and_restored_after_even_on_error(precision, inside):
    before = keras.config.dtype_policy().name
    with pytest.raises(RuntimeError, match="inside"):
        with building.precision_policy(precision):
            assert keras.config.dtype_policy().name == inside
            layer = keras.layers.Dense(2)
            layer.build((None, 3))
            assert (layer.compute_dtype, layer.kernel.dtype) == (inside.replace(
                "mixed_", ""), "float32")  # variables stay float32
            raise RuntimeError("inside")
    assert keras.config.dtype_policy().name == before


def test_build_model_builds_the_model_and_the_optimizers_slots():
    class Unbuilt(keras.Model):  # declares no input shape: built by a call on zeros
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x, training=False):
            return self.dense(x)

    model_func = fw.train.get_clf_model_func(Unbuilt, fw.train.sgd_optimizer(0.1, mom=0.9))
    spec, optimizer = building.build_model(model_func, {}, "float32",
                                           tf.TensorSpec([None, 5], tf.float32))
    assert spec.model.built and spec.model.dense.kernel.shape == (5, 3)
    assert optimizer is spec.optimizer
    # momentum: one slot per trainable variable (kernel and bias), shaped like it
    slots = sorted(tuple(v.shape) for v in optimizer.variables if len(v.shape))
    assert slots == sorted([(5, 3), (3,)])


def test_float16_gets_a_loss_scale_and_model_func_must_return_a_spec():
    model_func = fw.train.get_clf_model_func(_dense, fw.train.sgd_optimizer(0.1))
    with building.precision_policy("float16"):
        _, optimizer = building.build_model(model_func, {}, "float16",
                                            tf.TensorSpec([None, 4], tf.float32))
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    with pytest.raises(ValueError, match="model_func returned dict; it must return "
                                         "fw.train.ModelSpec"):
        building.build_model(lambda params: {"model": _dense()}, {}, "float32",
                             tf.TensorSpec([None, 4], tf.float32))


def test_check_input_shape_compares_the_data_with_the_declared_shape():
    model = _dense((8, 8, 1))
    building.check_input_shape(model, tf.TensorSpec([None, 8, 8, 1], tf.float32))
    building.check_input_shape(model, tf.TensorSpec([32, 8, 8, 1], tf.float32))  # batch
    with pytest.raises(ValueError, match=r"expects inputs of shape \(None, 8, 8, 1\) but "
                                         r"the input_fn gives \(None, 9, 9, 1\).*"
                                         r"input_shape=\(9, 9, 1\)"):
        building.check_input_shape(model, tf.TensorSpec([None, 9, 9, 1], tf.float32))
    with pytest.raises(ValueError, match=r"gives \(None, 64\)"):  # flattened images
        building.check_input_shape(model, tf.TensorSpec([None, 64], tf.float32))


def test_inference_leaves_the_training_random_state_as_it_was():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dropout(0.5, seed=3)])
    states = [v for v in model.variables if v.path.endswith("seed_generator_state")]
    assert states  # Dropout keeps its seed generator's state in a variable
    before = [v.numpy().copy() for v in states]
    with building.training_randomness_kept(model):
        model(np.ones((2, 6), np.float32), training=True)
        assert any(not np.array_equal(v.numpy(), b) for v, b in zip(states, before,
                                                                     strict=True))
    for variable, value in zip(states, before, strict=True):
        np.testing.assert_array_equal(variable.numpy(), value)


def test_check_labels_runs_the_loss_eagerly_on_a_few_examples():
    spec = _clf_spec(_dense())
    engine = engines.current()
    x = np.zeros((5, 4), np.float32)
    good = tf.data.Dataset.from_tensor_slices((x, np.array([0, 1, 2, 0, 1]))).batch(5)
    building.check_labels(engine, spec, good)
    one_hot = tf.data.Dataset.from_tensor_slices((x, np.eye(3, dtype=np.float32)[
        [0, 1, 2, 0, 1]])).batch(5)
    with pytest.raises(ValueError, match=r"labels have shape \[5, 3\], one-hot .* model's 3 "
                                         r"outputs, but the loss takes class indices"):
        building.check_labels(engine, spec, one_hot)
    out_of_range = tf.data.Dataset.from_tensor_slices((x, np.array([0, 1, 7, 0, 1]))).batch(5)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="7"):
        building.check_labels(engine, spec, out_of_range)


_ONE_HOT_ON_JAX = """
import json
import keras, numpy as np, tensorflow as tf
import fenwicks as fw
from fenwicks.train import building, engines
spec = fw.train.get_clf_model_func(
    lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
    fw.train.sgd_optimizer(0.1))({})
x = np.zeros((5, 4), np.float32)
engine = engines.current()
building.check_labels(engine, spec, tf.data.Dataset.from_tensor_slices(
    (x, np.array([0, 1, 2, 0, 1]))).batch(5))
try:
    building.check_labels(engine, spec, tf.data.Dataset.from_tensor_slices(
        (x, np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 1]])).batch(5))
    error = None
except ValueError as err:
    error = str(err)
print(json.dumps({"engine": engine.name, "error": error}))
"""


def test_the_one_hot_hint_reaches_the_jax_engine():
    # The label check is written once (building.check_labels); each engine only computes
    # the outputs and the loss its own way (eagerly, or jax.eval_shape).
    result = run_json(_ONE_HOT_ON_JAX, env={"KERAS_BACKEND": "jax", "FENWICKS_ENGINE": None,
                                            "FENWICKS_DEVICE": None})
    assert result["engine"] == "jax"
    assert result["error"] is not None and re.search(
        r"labels have shape \[5, 3\], one-hot .* model's 3 outputs, but the loss takes "
        r"class indices", result["error"]), result["error"]
