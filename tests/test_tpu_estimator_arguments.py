"""Issue 50, item 4: every argument TPUEstimator, TPUConfig, RunConfig and
TPUEstimatorSpec accept does what it says or warns once, naming itself; tf.summary in a
model_fn is refused in one sentence (TensorFlow 2 would drop it silently).

(RunConfig's and TPUEstimatorSpec's no-effect arguments are checked in
tests/test_tpu_estimator.py, test_ignored_arguments_warn_once_naming_themselves...;
per_host_input_for_training and eval_training_input_configuration, which now work, in
tests/test_tpu_estimator_batch_sizes.py.)
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks.train.tf import tf1_config
from fenwicks.train.tf.tf1_config import ModelFnError

v1 = tf.compat.v1


def _model_fn(features, labels, mode, params):
    outputs = keras.layers.Dense(1)(features)
    if params.get("summary"):
        v1.summary.scalar("mean_output", tf.reduce_mean(outputs))
    if mode == fw.train.ModeKeys.PREDICT:
        return fw.train.TPUEstimatorSpec(mode, predictions=outputs)
    loss = v1.losses.mean_squared_error(labels, outputs)
    return fw.train.TPUEstimatorSpec(mode, loss=loss, train_op=v1.train.GradientDescentOptimizer(
        0.1).minimize(loss, v1.train.get_or_create_global_step()))


IGNORED_ESTIMATOR = {"export_to_tpu": False, "export_to_cpu": False, "batch_axis": (0, 0),
                     "export_saved_model_api_version": 2}
IGNORED_TPU_CONFIG = {"tpu_job_name": "worker", "initial_infeed_sleep_secs": 30,
                      "input_partition_dims": [[1, 2, 2, 1], None],
                      "experimental_host_call_every_n_steps": 10}


def test_each_no_effect_argument_warns_once_naming_itself(tmp_path, caplog):
    tf1_config.reset_warnings()
    with caplog.at_level("WARNING", logger="fenwicks"):
        for _ in range(2):  # twice: still one warning each
            tpu_config = fw.train.TPUConfig(iterations_per_loop=4, **IGNORED_TPU_CONFIG)
            fw.train.TPUEstimator(_model_fn, model_dir=str(tmp_path),
                                  config=fw.train.RunConfig(tpu_config=tpu_config),
                                  **IGNORED_ESTIMATOR)
    text = [r.getMessage() for r in caplog.records]
    for name, value in IGNORED_ESTIMATOR.items():
        words = f"TPUEstimator({name}={value!r}) has no effect and is ignored: "
        assert sum(words in t for t in text) == 1, words
    for name, value in IGNORED_TPU_CONFIG.items():
        words = f"TPUConfig({name}={value!r}) has no effect and is ignored: "
        assert sum(words in t for t in text) == 1, words


def test_the_defaults_warn_nothing(tmp_path, caplog):
    tf1_config.reset_warnings()
    with caplog.at_level("WARNING", logger="fenwicks"):
        fw.train.TPUEstimator(_model_fn, model_dir=str(tmp_path), use_tpu=False)
    assert not [r for r in caplog.records if "has no effect and is ignored" in r.getMessage()]


@pytest.mark.slow  # compiles a model_fn's steps (over ~1 s)
def test_tf_summary_in_a_model_fn_is_refused_in_one_sentence(tmp_path):
    x = np.random.default_rng(1).normal(size=(8, 3)).astype(np.float32)
    est = fw.train.TPUEstimator(_model_fn, model_dir=str(tmp_path), train_batch_size=8,
                                params={"summary": True}, verbose=False)
    with pytest.raises(ModelFnError) as err:
        est.train(lambda params: tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(
            params["batch_size"], drop_remainder=True).repeat(), max_steps=1)
    assert str(err.value).startswith("model_fn called tf.summary.scalar, which TF1 wrote "
                                     "through the graph's summary collection")
    assert "eval_metrics=(metric_fn, [value])" in str(err.value)
    assert tf.summary.scalar.__name__ == "scalar" and "fenwicks" not in \
        tf.summary.scalar.__module__  # restored afterwards
