"""Issue 50, item 3: warm starts in a TPUEstimator program happen as TF1's did, or are
refused in one sentence before the first step.

TF1's rules: ``warm_start_from=<path>`` initialises every trainable variable from the
checkpoint tensor of its name; ``init_from_checkpoint`` raises for a map entry whose
shapes differ; a ``Scaffold(init_fn=...)`` ran in the session, which TensorFlow 2 has not
(refused). The numbers are the checkpoint's own, pushed through the layer in NumPy.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks.train.tf.assignment_map import WarmStartError
from fenwicks.train.tf.tf1_config import ModelFnError
from tests.conftest import run_json

v1 = tf.compat.v1
X = np.random.default_rng(3).normal(size=(8, 3)).astype(np.float32)


def _tf1_checkpoint(prefix: str, tensors: dict) -> str:
    """A checkpoint as TF1's Saver wrote one: tensors under their TF1 names."""
    names = sorted(tensors)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(tensors[n]) for n in names])
    return prefix


def _saved():
    rng = np.random.default_rng(7)
    return {"dense/kernel": rng.normal(size=(3, 2)).astype(np.float32),
            "dense/bias": rng.normal(size=(2,)).astype(np.float32),
            "global_step": np.int64(1000)}


def _model_fn(features, labels, mode, params):
    logits = keras.layers.Dense(2, name="dense")(features)
    if params.get("init_map"):
        v1.train.init_from_checkpoint(params["ckpt"], params["init_map"])
    scaffold_fn = None
    if params.get("scaffold_init_fn"):
        def scaffold_fn():
            return v1.train.Scaffold(init_fn=lambda scaffold, session: None)
    if mode == fw.train.ModeKeys.PREDICT:
        return fw.train.TPUEstimatorSpec(mode, predictions=logits, scaffold_fn=scaffold_fn)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return fw.train.TPUEstimatorSpec(mode, loss=loss, scaffold_fn=scaffold_fn,
                                     train_op=v1.train.GradientDescentOptimizer(0.1).minimize(
                                         loss, v1.train.get_or_create_global_step()))


def _predict(est):
    return np.array(list(est.predict(
        lambda params: tf.data.Dataset.from_tensor_slices(X).batch(params["batch_size"]))))


def warm_started_predictions(root: str) -> dict:
    """Predictions of a fresh model_dir warm-started from a TF1 checkpoint, both ways."""
    saved = _saved()
    ckpt = _tf1_checkpoint(os.path.join(root, "tf1", "model.ckpt"), saved)
    by_path = fw.train.TPUEstimator(_model_fn, model_dir=os.path.join(root, "a"),
                                    warm_start_from=ckpt, predict_batch_size=8, verbose=False)
    from_path = _predict(by_path)
    report = by_path.warm_start_report
    by_path.close()
    by_map = fw.train.TPUEstimator(_model_fn, model_dir=os.path.join(root, "b"),
                                   predict_batch_size=8, verbose=False,
                                   params={"ckpt": ckpt,
                                           "init_map": {"dense/": "dense/"}})
    from_map = _predict(by_map)
    by_map.close()
    return {"from_path": from_path.tolist(), "from_map": from_map.tolist(),
            "loaded": sorted(report["loaded"])}


def _expected():
    saved = _saved()
    return X @ saved["dense/kernel"] + saved["dense/bias"]


@pytest.mark.slow  # compiles a model_fn's steps (over ~1 s)
def test_a_tf1_checkpoint_warm_starts_by_tf1_name(tmp_path):
    out = warm_started_predictions(str(tmp_path))
    assert out["loaded"] == ["dense/bias", "dense/kernel"]
    np.testing.assert_allclose(out["from_path"], _expected(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["from_map"], _expected(), rtol=1e-5, atol=1e-6)


def test_a_tf1_checkpoint_warm_starts_on_8_replicas(tmp_path):
    out = run_json(f"""
        import json
        import fenwicks as fw
        from tests import test_tpu_estimator_warm_start as t
        assert fw.accel.current().num_replicas == 8
        print(json.dumps(t.warm_started_predictions({str(tmp_path)!r})))
    """, env={"FENWICKS_DEVICE": "cpu:8"})
    np.testing.assert_allclose(out["from_path"], _expected(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["from_map"], _expected(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # compiles a model_fn's steps (over ~1 s)
def test_a_shape_mismatch_in_the_map_raises_as_tf1_did(tmp_path):
    ckpt = _tf1_checkpoint(str(tmp_path / "tf1" / "model.ckpt"),
                           {"old/kernel": np.ones((4, 2), np.float32)})
    est = fw.train.TPUEstimator(_model_fn, model_dir=str(tmp_path / "m"), verbose=False,
                                predict_batch_size=8,
                                params={"ckpt": ckpt, "init_map": {"old/kernel": "dense/kernel"}})
    with pytest.raises(WarmStartError) as err:
        _predict(est)
    message = str(err.value)
    assert "'old/kernel' (shape [4, 2] in the checkpoint) to 'dense/kernel' (shape [3, 2]" \
        in message and "TF1's init_from_checkpoint refused too" in message
    assert not os.path.exists(tmp_path / "m" / "checkpoints")  # before any step


@pytest.mark.slow  # compiles a model_fn's steps (over ~1 s)
def test_a_scaffold_init_fn_is_refused_in_one_sentence(tmp_path):
    est = fw.train.TPUEstimator(_model_fn, model_dir=str(tmp_path), verbose=False,
                                train_batch_size=8, params={"scaffold_init_fn": True})
    with pytest.raises(ModelFnError) as err:
        est.train(lambda params: tf.data.Dataset.from_tensor_slices(
            (X, np.zeros(8, np.int32))).batch(params["batch_size"], drop_remainder=True).repeat(),
            max_steps=1)
    assert str(err.value).startswith(
        "scaffold_fn returned tf.compat.v1.train.Scaffold(init_fn=...), which TF1 ran")
    assert "init_from_checkpoint(ckpt, assignment_map)" in str(err.value)


def test_a_warm_start_path_with_no_checkpoint_is_one_sentence_at_construction(tmp_path):
    missing = str(tmp_path / "no_such_dir")
    with pytest.raises(WarmStartError) as err:
        fw.train.TPUEstimator(_model_fn, model_dir=str(tmp_path / "m"), warm_start_from=missing)
    assert str(err.value).startswith(f"warm_start_from={missing!r} holds no checkpoint")
    with pytest.raises(WarmStartError, match="ckpt_to_initialize_from"):
        fw.train.TPUEstimator(_model_fn, model_dir=str(tmp_path / "m"),
                              warm_start_from=fw.train.WarmStartSettings(missing))
