"""The estimator's small parts on their own: the action list's order, the callback checks
and names (the epoch log: test_history.py; the integrated behaviour, the end-of-train save
order included: test_reference_engine.py, test_estimator.py and test_callbacks.py)."""

from __future__ import annotations

import types

import keras
import pytest
import tensorflow as tf

from fenwicks.train import actions, callbacks, conditions, controller, progress
from fenwicks.train.history import History


def test_epochs_to_counts_a_partial_last_epoch():
    assert controller.epochs_to(100, 10) == 10
    assert controller.epochs_to(101, 10) == 11
    assert controller.epochs_to(3, 10) == 1


def test_evaluation_results_get_keras_names():
    assert callbacks.val_logs({"loss": 0.5, "accuracy": 0.75, "global_step": 10,
                               "num_examples": 100}) == {"val_loss": 0.5,
                                                         "val_accuracy": 0.75}


def test_callback_checks():
    assert callbacks.check_supported(None) == []
    one = keras.callbacks.History()
    assert callbacks.check_supported(one) == [one]
    with pytest.raises(ValueError, match="keras.callbacks.Callback objects; got 'x'"):
        callbacks.check_supported(["x"])

    class Mine(keras.callbacks.ReduceLROnPlateau):  # a subclass is refused too
        pass

    with pytest.raises(ValueError, match="ReduceLROnPlateau cannot be used"):
        callbacks.check_supported([Mine()])


def test_one_list_built_ins_then_the_users_callbacks_then_stop_and_save():
    config = types.SimpleNamespace(verbose=True, steps_per_epoch=4, work_dir="/nowhere")
    state = types.SimpleNamespace(summary_writer=lambda kind: tf.summary.create_noop_writer(),
                                  is_chief=False, global_step=0)
    mine, theirs = keras.callbacks.Callback(), keras.callbacks.Callback()
    saves = types.SimpleNamespace(save=lambda *args, **kwargs: None)
    entries, end_epoch, at_end = controller.default_actions(
        config, state, History(), None, [mine, theirs], saves, 0, 8)
    try:
        kinds = [type(e) for e in entries.entries]
        assert kinds == [actions.RecordHistory, progress.TrainSummaries, progress.ProgressBar,
                         actions.KerasCallback, actions.KerasCallback, actions.KerasCallback,
                         actions.StopOnNonFiniteLoss, actions.CheckPreemption,
                         actions.Heartbeat, actions.PeriodicSave, actions.EpochLoss,
                         actions.ConditionalAction]
        assert isinstance(entries.entries[3].callback, callbacks.EpochLog)
        # The user part is the user's callbacks, in their order: it forces the last save.
        assert [e.callback for e in entries.user] == [mine, theirs]
        last = entries.entries[-1]
        assert (last.condition, last.action) == (at_end, end_epoch)
        assert isinstance(at_end, conditions.AtEpochEnd) and end_epoch.actions is entries
    finally:
        entries.close()

