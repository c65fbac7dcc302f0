"""Issue 50, items 6 and 7: a TPUEstimator program's mistakes are answered in one sentence
naming what was given and the fix, before any step; a padded metric is exact or warns.

Each case was a raw error or silence before (the issue lists them): a model_fn with an
extra required argument (TypeError), a PREDICT spec without predictions after training
(StagingError inside the predict loop), a params key the front door sets (silently
replaced), predict_keys for tensor predictions (silently ignored), tf.compat.v1.layers
(Keras's "not available with Keras 3"), tf.metrics.mean of a batch mean on a padded last
batch (1.210 against 1.143 exact, no warning).
"""

from __future__ import annotations

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks.train.tf import tf1_config
from fenwicks.train.tf.tf1_config import ModelFnError

v1 = tf.compat.v1
RNG = np.random.default_rng(11)
X = RNG.normal(size=(10, 3)).astype(np.float32)
Y = RNG.normal(size=(10, 1)).astype(np.float32)
W = np.array([[0.5], [-1.0], [0.25]], np.float32)


def _linear(features):
    return keras.layers.Dense(1, use_bias=False,
                              kernel_initializer=keras.initializers.Constant(W))(features)


def _spec(mode, outputs, labels, **kwargs):
    if mode == fw.train.ModeKeys.PREDICT:
        return fw.train.TPUEstimatorSpec(mode, **kwargs)
    loss = v1.losses.mean_squared_error(labels, outputs)
    train_op = v1.train.GradientDescentOptimizer(0.0).minimize(
        loss, v1.train.get_or_create_global_step())
    return fw.train.TPUEstimatorSpec(mode, loss=loss, train_op=train_op, **kwargs)


def _train(est):
    est.train(lambda params: tf.data.Dataset.from_tensor_slices((X[:8], Y[:8])).batch(
        params["batch_size"], drop_remainder=True).repeat(), max_steps=1)


def _estimator(model_fn, tmp_path, **kwargs):
    return fw.train.TPUEstimator(model_fn, model_dir=str(tmp_path), train_batch_size=8,
                                 eval_batch_size=8, predict_batch_size=8, verbose=False,
                                 config=fw.train.RunConfig(tpu_config=fw.train.TPUConfig(1)),
                                 **kwargs)


@pytest.mark.slow  # compiles a model_fn's steps (over ~1 s)
def test_a_model_fn_with_an_extra_required_argument_is_one_sentence(tmp_path):
    def model_fn(features, labels, mode, params, hidden_size):
        return _spec(mode, _linear(features), labels)

    with pytest.raises(ModelFnError) as err:
        _train(_estimator(model_fn, tmp_path))
    assert str(err.value) == (
        "model_fn(features, labels, mode, params, hidden_size) requires hidden_size, which "
        "TPUEstimator does not pass (it passes features, labels, mode, params and config, "
        "by name): give it a default or bind it first, "
        "functools.partial(model_fn, hidden_size=...)")


@pytest.mark.slow  # compiles a model_fn's steps (over ~1 s)
def test_a_predict_spec_without_predictions_is_one_sentence_after_training(tmp_path):
    def model_fn(features, labels, mode, params):
        return _spec(mode, _linear(features), labels)  # no predictions in PREDICT

    est = _estimator(model_fn, tmp_path)
    _train(est)
    with pytest.raises(ModelFnError) as err:
        list(est.predict(lambda params: tf.data.Dataset.from_tensor_slices(X).batch(
            params["batch_size"])))
    assert str(err.value).startswith("model_fn gave no predictions in mode 'infer' "
                                     "(PREDICT): return TPUEstimatorSpec(mode, predictions=")


@pytest.mark.parametrize("key", ["seed", "num_replicas", "input_context",
                                 "global_batch_size", "mode"])
def test_a_params_key_the_front_door_sets_is_refused(tmp_path, key):
    with pytest.raises(ValueError) as err:
        _estimator(lambda features, labels, mode, params: None, tmp_path,
                   params={key: 3, "data_dir": "/d"})
    assert str(err.value).startswith(f"params[{key!r}]=3: Fenwicks sets params[{key!r}] "
                                     "itself (")
    assert str(err.value).endswith("which would replace yours: rename your key")


@pytest.mark.slow  # compiles a model_fn's steps (over ~1 s)
def test_predict_keys_for_tensor_predictions_is_refused_as_tf1_did(tmp_path):
    def model_fn(features, labels, mode, params):
        outputs = _linear(features)
        return _spec(mode, outputs, labels, predictions=outputs)

    est = _estimator(model_fn, tmp_path)
    _train(est)
    with pytest.raises(ValueError, match=r"predict_keys=\['y'\]: the model_fn's predictions "
                                         "are one tensor, not a dict"):
        list(est.predict(lambda params: tf.data.Dataset.from_tensor_slices(X).batch(
            params["batch_size"]), predict_keys=["y"]))
    rows = np.array(list(est.predict(lambda params: tf.data.Dataset.from_tensor_slices(
        X).batch(params["batch_size"]))))
    np.testing.assert_allclose(rows.reshape(10, 1), X @ W, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # compiles a model_fn's steps (over ~1 s)
@pytest.mark.parametrize("held", ["tf.compat.v1", "import tensorflow.compat.v1"])
def test_tf1_layers_are_refused_naming_the_keras_layer(tmp_path, held):
    """Whichever module object the program holds as ``tf``: ``import
    tensorflow.compat.v1 as tf`` makes another than ``tf.compat.v1`` gave before it."""
    import importlib

    stale = tf.compat.v1  # before the import below rebinds tf.compat.v1
    module = importlib.import_module("tensorflow.compat.v1") if held.startswith(
        "import") else stale

    def model_fn(features, labels, mode, params):
        outputs = module.layers.dense(features, 1, name="out")
        return _spec(mode, outputs, labels, predictions=outputs)

    with pytest.raises(ModelFnError) as err:
        _train(_estimator(model_fn, tmp_path))
    assert str(err.value).startswith("model_fn called tf.compat.v1.layers.dense, which "
                                     "Keras 3 removed: call keras.layers.Dense(...)(inputs)")
    assert type(v1.layers).__name__ != "V1Layers"  # the stand-in is gone after the model_fn


@pytest.mark.slow  # compiles a model_fn's steps (over ~1 s)
def test_a_metric_mean_of_a_batch_mean_is_exact_and_an_opaque_one_warns_once(
        tmp_path, caplog):
    def metric_fn(labels, outputs):
        per_example = tf.reduce_mean(tf.square(outputs - labels), axis=1)
        return {"mse": v1.metrics.mean(tf.reduce_mean(per_example)),
                "opaque": v1.metrics.mean(tf.reduce_sum(per_example) / 8.0)}

    def model_fn(features, labels, mode, params):
        outputs = _linear(features)
        return _spec(mode, outputs, labels, predictions=outputs,
                     eval_metrics=(metric_fn, [labels, outputs]))

    tf1_config.reset_warnings()
    est = _estimator(model_fn, tmp_path)
    _train(est)  # a learning rate of 0: the weights stay W
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        result = est.evaluate(lambda params: tf.data.Dataset.from_tensor_slices(
            (X, Y)).batch(params["batch_size"]))
        est.evaluate(lambda params: tf.data.Dataset.from_tensor_slices(
            (X, Y)).batch(params["batch_size"]))
    squared = ((X @ W - Y) ** 2).ravel()
    assert result["num_examples"] == 10
    assert result["mse"] == pytest.approx(np.mean(squared), rel=1e-5)  # every example once
    # The two batch means (8 rows, then 2 padded to 8) weighted alike would differ:
    assert abs((squared[:8].mean() + squared[8:].mean()) / 2 - np.mean(squared)) > 1e-3
    warnings = [r.getMessage() for r in caplog.records if "metrics.mean of a scalar" in
                r.getMessage()]
    assert len(warnings) == 1 and "pass the per-example [batch] values" in warnings[0]
