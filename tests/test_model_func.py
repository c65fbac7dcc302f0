"""Tests for fenwicks.train.model_func: per-example losses and model functions."""

import keras
import numpy as np
import pytest

import fenwicks as fw


def _log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def test_cross_entropy_matches_numpy_for_logits_and_probabilities():
    logits = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0], [-2.0, 1.0, 0.0]], np.float32)
    labels = np.array([0, 1, 2])
    expected = -_log_softmax(logits)[np.arange(3), labels]
    got = fw.train.sparse_softmax_cross_entropy(labels, logits).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    probs = np.exp(_log_softmax(logits)).astype(np.float32)
    got = fw.train.sparse_softmax_cross_entropy(labels[:, None], probs, from_logits=False)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5)


def test_from_logits_takes_the_outputs_as_given_even_from_a_softmax():
    """Keras's TensorFlow op would swap a Softmax output for that softmax's input; the JAX
    op cannot. Both engines use what they are given: here, probabilities as logits."""
    logits = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]], np.float32)
    probs = keras.activations.softmax(keras.ops.convert_to_tensor(logits))
    expected = -_log_softmax(np.exp(_log_softmax(logits)))[np.arange(2), [0, 2]]
    got = fw.train.sparse_softmax_cross_entropy(np.array([0, 2]), probs)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(got), expected, rtol=1e-6)


def test_example_values_are_float32_per_example_in_metric_order():
    model = fw.Sequential([keras.Input((3,)), fw.layers.Classifier(3)])
    spec = fw.train.get_clf_model_func(lambda: model, fw.train.sgd_optimizer(0.1))({})
    outputs = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]], "float16")  # a mixed model's
    values = spec.example_values(np.array([0, 1]), outputs)
    assert list(values) == ["loss", "accuracy"]
    assert all(keras.backend.standardize_dtype(v.dtype) == "float32" for v in values.values())
    expected = -_log_softmax(outputs.astype(np.float32))[np.arange(2), [0, 1]]
    np.testing.assert_allclose(keras.ops.convert_to_numpy(values["loss"]), expected,
                               rtol=1e-6)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(values["accuracy"]), [1, 0])


def test_accuracy_and_regression_errors_are_per_example():
    np.testing.assert_array_equal(
        fw.train.accuracy([1, 0, 2], [[0.1, 0.9, 0], [0.2, 0.8, 0], [0, 0, 1]]).numpy(),
        [1.0, 0.0, 1.0])
    labels = np.array([[1.0, 2.0], [0.0, -1.0]])
    outputs = np.array([[0.0, 0.0], [1.0, 1.0]], np.float32)
    np.testing.assert_allclose(fw.train.squared_error(labels, outputs).numpy(),
                               [(1 + 4) / 2, (1 + 4) / 2])
    np.testing.assert_allclose(fw.train.absolute_error(labels, outputs).numpy(),
                               [(1 + 2) / 2, (1 + 2) / 2])


def test_out_of_range_label_is_a_clear_error_eagerly():
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\).*label is 3"):
        fw.train.sparse_softmax_cross_entropy([0, 3], np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="label is -1"):
        fw.train.sparse_softmax_cross_entropy([-1, 0], np.zeros((2, 3), np.float32))


def _net(final_activation=None):
    return keras.Sequential([keras.Input((4,)),
                             keras.layers.Dense(3, activation=final_activation)])


def test_clf_model_func_builds_spec_and_detects_softmax_output():
    opt_func = lambda: keras.optimizers.SGD(0.1)  # noqa: E731
    spec = fw.train.get_clf_model_func(_net, opt_func, reduction="sum")({})
    assert isinstance(spec, fw.train.ModelSpec) and spec.reduction == "sum"
    assert set(spec.metric_fns) == {"accuracy"}
    logits = np.array([[1.0, 2.0, 0.0]], np.float32)
    expected = np.exp(_log_softmax(logits))
    np.testing.assert_allclose(spec.predict_fn(logits).numpy(), expected, rtol=1e-6)
    # A softmax head: outputs are probabilities, so predict_fn passes them through.
    soft = fw.train.get_clf_model_func(lambda: _net("softmax"), opt_func)({})
    np.testing.assert_allclose(soft.predict_fn(expected.astype(np.float32)).numpy(), expected,
                               rtol=1e-6)
    np.testing.assert_allclose(soft.loss_fn([1], expected.astype(np.float32)).numpy(),
                               -_log_softmax(logits)[:, 1], rtol=1e-5)


def test_build_nn_may_take_params():
    seen = {}

    def build_nn(params):
        seen.update(params)
        return _net()

    fw.train.get_clf_model_func(build_nn, lambda: keras.optimizers.SGD(0.1))({"seed": 7})
    assert seen == {"seed": 7}


def test_reg_model_func_reports_mse_and_mae():
    spec = fw.train.get_reg_model_func(_net, lambda: keras.optimizers.Adam())({})
    assert set(spec.metric_fns) == {"mse", "mae"}
    assert spec.loss_fn is fw.train.squared_error


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="reduction='avg'"):
        fw.train.get_clf_model_func(_net, lambda: None, reduction="avg")
    with pytest.raises(ValueError, match="opt_func="):
        fw.train.get_clf_model_func(_net, keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="build_nn returned"):
        fw.train.get_clf_model_func(lambda: "net", lambda: keras.optimizers.SGD())({})
    with pytest.raises(ValueError, match="must not contain 'loss'"):
        fw.train.ModelSpec(_net(), keras.optimizers.SGD(), fw.train.squared_error,
                           {"loss": fw.train.squared_error})
