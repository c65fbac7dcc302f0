"""A run's state survives the process, for every public model and layer of Fenwicks.

Each entry of `tests._state_catalogue` (found by introspection over `fw.models` and
`fw.layers`) trains a few steps in one process; a second process opens a new estimator
on the same work_dir and must hold every variable bit for bit, evaluate to the same loss,
predict the same rows, and warm-start every variable into a fresh work_dir.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks.train.tf import checkpoints
from tests import _state_catalogue as catalogue
from tests.conftest import run_module_json

ENTRIES = sorted(catalogue.entries())


def _run(*args: str) -> Any:
    """``python -m tests._state_catalogue *args`` in a new process: its JSON output."""
    return run_module_json("tests._state_catalogue", *args)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("catalogue"))
    return {"train": _run("train", root), "check": _run("check", root)}


def _equal(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b, strict=True))


def test_the_catalogue_covers_every_public_model_and_layer():
    # Every public name of fw.models is a model or a block; fw.layers' classes are blocks.
    public = {f"fw.models.{n}" for n in fw.models.__all__}
    public |= {f"fw.layers.{n}" for n in fw.layers.__all__
               if inspect.isclass(getattr(fw.layers, n))}
    assert public == set(ENTRIES)
    assert {"fw.models.mnist_net", "fw.models.resnet9", "fw.layers.DenseBN"} <= public


@pytest.mark.slow
@pytest.mark.parametrize("name", ENTRIES)
def test_every_variable_is_saved_and_restored_in_a_new_process(runs, name):
    trained, reopened = runs["train"][name], runs["check"][name]
    # Counted in the checkpoint file itself, not through the code that wrote it.
    assert trained["saved"] == trained["in_model"] == len(trained["paths"])
    assert reopened["step"] == trained["step"] == catalogue.TRAIN_STEPS
    # (Keras's layer-name counters differ between the processes; the order does not.)
    assert len(reopened["paths"]) == len(trained["paths"])
    assert _equal(reopened["model"], trained["model"]), "model variables differ"
    assert _equal(reopened["optimizer"], trained["optimizer"]), "optimizer slots differ"
    assert reopened["eval"]["loss"] == pytest.approx(trained["eval"]["loss"], abs=1e-7)
    np.testing.assert_array_equal(reopened["predict"], trained["predict"])
    report = reopened["warm_report"]
    assert report["not_loaded"] == [] and len(report["loaded"]) == trained["in_model"]
    assert _equal(reopened["warm_model"], trained["model"]), "warm start differs"


@pytest.mark.slow
def test_the_flagship_net_resumes_bit_for_bit_from_a_gcs_work_dir(gcs_emulator):
    root, name = gcs_emulator.unique_url("catalogue"), "fw.models.mnist_net"
    trained = gcs_emulator.run_module_json("tests._state_catalogue", "train", root, name)
    reopened = gcs_emulator.run_module_json("tests._state_catalogue", "check", root, name)
    trained, reopened = trained[name], reopened[name]
    assert trained["saved"] == trained["in_model"] == 16
    assert reopened["step"] == catalogue.TRAIN_STEPS
    assert _equal(reopened["model"], trained["model"])
    assert _equal(reopened["optimizer"], trained["optimizer"])
    np.testing.assert_array_equal(reopened["predict"], trained["predict"])
    assert reopened["warm_report"]["not_loaded"] == []


@pytest.mark.slow
def test_the_catalogue_has_batchnorm_statistics_and_dropout_state(runs):
    paths = [p for entry in runs["train"].values() for p in entry["paths"]]
    assert any(p.endswith("moving_variance") for p in paths)
    assert any(p.endswith("seed_generator_state") for p in paths)
    # And training moved the BatchNorm statistics away from their initial values.
    mnist = runs["train"]["fw.models.mnist_net"]
    moving = [np.asarray(v) for p, v in zip(mnist["paths"], mnist["model"], strict=True)
              if p.endswith("moving_mean")]
    assert moving and all(np.abs(m).max() > 0 for m in moving)


# --------------------------------------------------------------------------- a user's layer


def test_a_list_held_sublayer_is_saved_by_position_with_a_warning(tmp_path, caplog):
    model = catalogue.list_model()
    # Without Fenwicks' extras, TensorFlow's own checkpoint would drop these.
    with pytest.raises(checkpoints.CheckpointCoverageError, match="listed_dense/kernel"):
        checkpoints.check_coverage(tf.train.Checkpoint(model=model), model.variables)
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
    step, position = tf.Variable(0, dtype=tf.int64), tf.Variable(0, dtype=tf.int64)
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        root = checkpoints.make_checkpoint(model, optimizer, step, position)
    assert "listed_dense/kernel" in caplog.text and "own attribute" in caplog.text
    keys = [k for k, _ in tf.train.list_variables(root.write(str(tmp_path / "c")))]
    # Dense kernel, bias; BN gamma, beta, moving mean, variance; Dropout's seed state.
    listed = [v.path for v in model.variables if "listed" in v.path or "seed" in v.path]
    assert len(listed) == 7
    assert sum(k.startswith("model_extra/") for k in keys) == 7


def test_an_incomplete_checkpoint_root_is_refused_before_training():
    model = catalogue.list_model()
    step = tf.Variable(0, dtype=tf.int64, name="global_step")
    with pytest.raises(checkpoints.CheckpointCoverageError, match="global_step"):
        checkpoints.check_coverage(tf.train.Checkpoint(model=model), [step])


@pytest.mark.slow
def test_a_users_list_held_layer_resumes_exactly_across_processes(tmp_path):
    # The uninterrupted run and the first half need no process of their own; the resume
    # is what crosses the process boundary.
    whole = catalogue.user(str(tmp_path / "whole"), "8")
    catalogue.user(str(tmp_path / "half"), "4")
    resumed = _run("user", str(tmp_path / "half"), "4")
    assert _equal(resumed, whole)
