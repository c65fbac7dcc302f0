"""Callbacks: Keras's own (EarlyStopping with restore_best_weights, TerminateOnNaN,
ModelCheckpoint) on 8 replicas; the ones that cannot apply are refused; Fenwicks'
EarlyStopping and BestExporter are exact across a resume in a new process. (The call
order, params and logs, CSVLogger and stop_training are the shared code's, checked in
test_reference_engine.py; test_engine_contract.py runs the hooks on both engines.)"""

from __future__ import annotations

import json
import os

import keras
import numpy as np
import pytest

import fenwicks as fw
from tests import _callbacks, _callbacks_resume
from tests import _flagship as flagship
from tests.conftest import run_module_json

# The 8-replica process (the first 8-replica test's set-up) needs minutes on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
SPE = _callbacks.STEPS_PER_EPOCH


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The scenarios whose outcome the replica count could change (see `_callbacks`), on
    8 replicas: weights set back into mirrored variables, a NaN in the all-reduced loss, a
    Keras file written from mirrored variables. (Their one-replica run, the same Python on
    plain variables, was a duplicate: the reference engine's tests run restore_best_weights
    and TerminateOnNaN on a Keras model's plain variables, test_reference_engine.py.)"""
    root = str(tmp_path_factory.mktemp("callbacks8"))
    return run_module_json("tests._callbacks", root, *_callbacks.EIGHT_REPLICA_SCENARIOS,
                           env={"FENWICKS_DEVICE": "cpu:8"}, timeout=1700)


def test_early_stopping_stops_and_restores_the_best_weights(runs):
    out = runs["early_stopping"]
    # Epoch 0 sets the best; epoch 1 does not improve by min_delta=10: patience 1 is up.
    assert out["stopped_epoch"] == 1 and out["step"] == 2 * SPE
    assert len(out["evals"]) == 2
    # restore_best_weights put epoch 0's weights back, and the checkpoint holds them.
    assert out["after"] == pytest.approx(out["evals"][0], abs=1e-6)
    assert out["saved"]
    assert abs(out["evals"][1] - out["evals"][0]) > 1e-4  # so the restore did something


def test_terminate_on_nan_stops_without_an_exception_and_nothing_nan_is_saved(runs):
    out = runs["terminate_on_nan"]
    assert out["stopped_at"] == 26  # the first NaN step
    assert out["reloaded"] == 20  # evaluate went back to the last good checkpoint


def test_model_checkpoint_writes_a_keras_file_of_the_trained_model(runs):
    out = runs["model_checkpoint"]
    logits = np.asarray(out["logits"])
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(probs, np.asarray(out["probs"]), atol=1e-5)


@pytest.mark.parametrize("callback,why", [
    (keras.callbacks.ReduceLROnPlateau(), "comes from the schedule in opt_func"),
    (keras.callbacks.LearningRateScheduler(lambda epoch: 0.1), "comes from opt_func"),
    (keras.callbacks.BackupAndRestore("/tmp/x"), "already resumes from work_dir"),
])
def test_callbacks_that_cannot_apply_are_refused_before_training(tmp_path, callback, why):
    est = _callbacks.make_estimator(str(tmp_path))
    x, y = _callbacks.make_data()
    with pytest.raises(ValueError, match=why):
        est.train(flagship.train_input(x, y), steps=5, callbacks=[callback])
    assert est.global_step == 0 and not (tmp_path / "checkpoints").exists()


# --------------------------------------------------------------------------- across resume


def test_fenwicks_early_stopping_and_best_exporter_are_exact_across_a_resume(tmp_path):
    # The uninterrupted run and the first epoch run here; the resume is a new process.
    whole = _callbacks_resume.run(str(tmp_path / "whole"), "6")
    _callbacks_resume.run(str(tmp_path / "half"), "1")
    resumed = run_module_json("tests._callbacks_resume", str(tmp_path / "half"), "6")
    # Uninterrupted: epoch 0 is the best, epoch 1 is not better by 10: stop at step 64.
    assert whole["step"] == 2 * SPE
    # The resumed process replays epoch 0 from work_dir's epoch log and stops at the
    # same step (a plain Keras EarlyStopping would start afresh and run to step 96).
    assert resumed["step"] == whole["step"]
    assert resumed["best"] == whole["best"]  # BestExporter kept the whole run's best
    latest = fw.train.latest_export(str(tmp_path / "half" / "best"))
    assert json.loads(open(os.path.join(latest, "best.json")).read())["step"] == \
        whole["best"]["step"]


def test_best_exporter_rejects_a_bad_mode():
    with pytest.raises(ValueError, match="mode='best'"):
        fw.train.BestExporter("/tmp/x", mode="best")
