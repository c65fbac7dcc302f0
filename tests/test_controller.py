"""The estimator's small parts on their own: the action list's order, the callback checks
and names (the epoch log: test_history.py; the integrated behaviour: test_estimator.py and
test_callbacks.py)."""

from __future__ import annotations

import types

import keras
import pytest
import tensorflow as tf

import fenwicks as fw
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


def test_the_last_checkpoint_is_written_while_the_call_closes_unless_callbacks_follow(
        tmp_path, monkeypatch):
    """Without callbacks, the end-of-train write starts before the summaries flush and
    `train` returns once it is complete; with one, on_train_end may change the weights
    (restore_best_weights), so the write waits until after it."""
    from fenwicks.train import run_format
    from tests import _estimator_helpers as helpers

    events = []
    original = {name: getattr(run_format.RunCheckpointer, name)
                for name in ("save", "save_and_wait")}

    def spy(name):
        def method(self, step, *, force=False):
            events.append((name, step))
            return original[name](self, step, force=force)
        return method

    for name in original:
        monkeypatch.setattr(run_format.RunCheckpointer, name, spy(name))
    close = progress.TrainSummaries.close
    monkeypatch.setattr(progress.TrainSummaries, "close",
                        lambda self: (events.append(("close",)), close(self))[1])

    class Ended(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            events.append(("on_train_end",))

    x, y = helpers.make_data(96)
    est = fw.train.get_tpu_estimator(4, helpers.model_func(), str(tmp_path / "run"),
                                     trn_bs=8, verbose=False, save_every_secs=None)
    est.train(helpers.train_input(x, y), steps=6)
    assert events == [("save", 6), ("close",), ("save_and_wait", 6)]
    assert run_format.latest(str(tmp_path / "run")).endswith("checkpoints/6")
    events.clear()
    est.train(helpers.train_input(x, y), steps=6, callbacks=[Ended()])
    assert events == [("close",), ("on_train_end",), ("save_and_wait", 12)]
    assert run_format.latest(str(tmp_path / "run")).endswith("checkpoints/12")
