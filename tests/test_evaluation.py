"""fenwicks.train.evaluation: the `Evaluator` on its own, wired as the estimator wires it
(an `EstimatorConfig`, a built `RunState`, an `InputManager`), over a linear classifier
whose weights are set by hand, so every loss, accuracy and probability is computed again
here with numpy. In-process, one replica or as many as the session's accelerator has."""

from __future__ import annotations

import dataclasses
import logging
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.tf.evaluation import TFEvaluator
from fenwicks.train.tf.inputs import TFInputManager
from fenwicks.train.tf.state import TFRunState

FEATURES, CLASSES, EXAMPLES = 4, 3, 10
RNG = np.random.default_rng(7)
KERNEL = RNG.normal(size=(FEATURES, CLASSES)).astype(np.float32)
BIAS = np.array([0.1, -0.2, 0.3], np.float32)
X = RNG.normal(size=(EXAMPLES, FEATURES)).astype(np.float32)
Y = RNG.integers(0, CLASSES, EXAMPLES).astype(np.int32)


def _numpy_probs(x: np.ndarray) -> np.ndarray:
    logits = x.astype(np.float64) @ KERNEL + BIAS
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


def _input(*arrays):
    """An evaluation input_fn: one pass, batches of params['batch_size'], last one partial."""
    return lambda params: tf.data.Dataset.from_tensor_slices(arrays).batch(
        params["batch_size"])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """An Evaluator over a built RunState whose model holds KERNEL and BIAS (step 0)."""
    acc = fw.accel.current()
    batch = 4 * acc.num_replicas  # 10 examples: two full batches and a partial one
    config = EstimatorConfig(
        steps_per_epoch=1, work_dir=str(tmp_path_factory.mktemp("evaluation")),
        train_batch_size=batch, eval_batch_size=batch, predict_batch_size=batch,
        steps_per_loop=1, precision="float32", num_replicas=acc.num_replicas)
    model_func = fw.train.get_clf_model_func(
        lambda: keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES)]),
        fw.train.sgd_optimizer(0.1))
    state, inputs = TFRunState(model_func, config, acc), TFInputManager(config, acc)
    state.build(tf.TensorSpec([None, FEATURES], tf.float32),
                inputs.params("eval", batch))
    state.spec.model.set_weights([KERNEL, BIAS])
    yield TFEvaluator(config, acc, state, inputs), config
    state.close()


def test_evaluate_sees_every_example_once_and_matches_numpy(built):
    evaluator, config = built
    result = evaluator.evaluate(_input(X, Y), steps=None)
    probs = _numpy_probs(X)
    cross_entropy = -np.log(probs[np.arange(EXAMPLES), Y])
    assert result["num_examples"] == EXAMPLES and result["global_step"] == 0
    np.testing.assert_allclose(result["loss"], cross_entropy.mean(), rtol=1e-5)
    assert result["accuracy"] == pytest.approx(np.mean(probs.argmax(axis=1) == Y))
    assert os.listdir(f"{config.work_dir}/eval")  # the TensorBoard scalars were written


def test_evaluate_weights_each_example_by_its_sample_weight(built):
    evaluator, _ = built
    weights = np.linspace(0.5, 3.0, EXAMPLES).astype(np.float32)
    result = evaluator.evaluate(_input(X, Y, weights), steps=None)
    probs = _numpy_probs(X)
    cross_entropy = -np.log(probs[np.arange(EXAMPLES), Y])
    correct = (probs.argmax(axis=1) == Y).astype(np.float64)
    # Keras's evaluate(sample_weight=...): sum(w * v) / sum(w)
    np.testing.assert_allclose(result["loss"], np.sum(weights * cross_entropy)
                               / weights.sum(), rtol=1e-5)
    np.testing.assert_allclose(result["accuracy"], np.sum(weights * correct)
                               / weights.sum(), rtol=1e-6)


def test_evaluate_steps_counts_global_batches(built):
    evaluator, config = built
    result = evaluator.evaluate(_input(X, Y), steps=1)
    first = min(config.eval_batch_size, EXAMPLES)
    probs = _numpy_probs(X[:first])
    assert result["num_examples"] == first
    np.testing.assert_allclose(result["loss"], -np.log(probs[np.arange(first),
                                                              Y[:first]]).mean(), rtol=1e-5)


def test_predict_returns_one_row_per_example_in_input_order(built):
    evaluator, _ = built
    np.testing.assert_allclose(evaluator.predict(_input(X)), _numpy_probs(X), rtol=1e-5,
                               atol=1e-7)


def test_bad_evaluation_data_is_an_error_with_counts(built):
    evaluator, _ = built
    labels = Y.copy()
    labels[3] = CLASSES  # one label past the 3 classes
    with pytest.raises(ValueError, match=r"1 class label\(s\) outside \[0, 3\), of 10 "
                                         "examples"):
        evaluator.evaluate(_input(X, labels), steps=None)
    features = X.copy()
    features[[2, 8], 1] = [np.nan, np.inf]
    with pytest.raises(ValueError, match=r"2 example\(s\) with NaN or infinite features"):
        evaluator.evaluate(_input(features, Y), steps=None)
    with pytest.raises(ValueError, match="yielded no examples"):
        evaluator.evaluate(_input(X[:0], Y[:0]), steps=None)
    with pytest.raises(ValueError, match="sample weights add up to 0"):
        evaluator.evaluate(_input(X, Y, np.zeros(EXAMPLES, np.float32)), steps=None)


def test_a_model_never_trained_is_evaluated_with_a_warning(built, caplog):
    evaluator, config = built
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        evaluator.warn_if_untrained("evaluated")
    assert f"evaluated a model that was never trained: {config.work_dir}" in caplog.text


def test_predict_refuses_a_multi_worker_run(built):
    _, config = built
    workers = dataclasses.replace(config, num_processes=2)
    with pytest.raises(ValueError, match="predict runs on one host.*spans 2 workers"):
        TFEvaluator(workers, fw.accel.current(), None, None).check_single_host()
