"""`fenwicks.train.actions` (and the default `callbacks.EpochLog`) on their own: each
action fed hand-made `LoopOutput`s, with stand-ins for the state and the callbacks."""

from __future__ import annotations

import types

import numpy as np
import pytest

from fenwicks.train import actions, callbacks, history, preemption
from fenwicks.train.history import History
from fenwicks.train.save_policy import Trigger
from fenwicks.train.state import NonFiniteLossError
from fenwicks.train.trainer import LoopOutput


def _output(start, losses, learning_rate=None, seconds=2.0, batch=8):
    losses = np.asarray(losses, np.float32)
    step = start + len(losses)
    return LoopOutput(start, step, losses, learning_rate, seconds,
                      len(losses) * batch / seconds)


def _state(stop_training=False):
    model = types.SimpleNamespace(stop_training=stop_training)
    return types.SimpleNamespace(stale=False, spec=types.SimpleNamespace(model=model),
                                 latest_checkpoint="ckpt-4", global_step=6)


class _Saves:
    """A stand-in `SavePolicy` that records each (trigger, step) it is told of."""

    def __init__(self):
        self.calls = []

    def save(self, trigger, step, force=False):
        self.calls.append((trigger, step))


class _Calls:
    """A stand-in CallbackList that records each call."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, *args))


def test_record_history_appends_each_step_and_one_rate_per_loop():
    record = History()
    actions.RecordHistory(record)(_output(0, [0.5, 0.25, 0.125], learning_rate=0.1))
    actions.RecordHistory(record)(_output(3, [0.0625]))
    assert record.steps == [1, 2, 3, 4]
    assert record.losses == [0.5, 0.25, 0.125, 0.0625]  # exact in float32
    assert record.examples_per_sec == [(3, 12.0), (4, 4.0)]  # 3 * 8 / 2 s, 1 * 8 / 2 s
    assert record.learning_rates == [(3, pytest.approx(0.1))]


def test_a_non_finite_loss_is_an_error_naming_the_step_and_marks_the_state_stale():
    state = _state()
    actions.StopOnNonFiniteLoss(state)(_output(0, [1.0, 0.5]))
    assert not state.stale
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at step 2.*ckpt-4"):
        actions.StopOnNonFiniteLoss(state)(_output(0, [1.0, np.nan]))
    assert state.stale


def test_a_non_finite_loss_after_a_callback_stopped_training_is_a_quiet_stop():
    state = _state(stop_training=True)
    with pytest.raises(actions.StoppedOnNonFiniteLoss):
        actions.StopOnNonFiniteLoss(state)(_output(4, [np.inf]))
    assert state.stale


def test_preemption_saves_and_stops_and_ctrl_c_stops():
    state, saves = _state(), _Saves()
    watcher = types.SimpleNamespace(requested=True, interrupted=False)
    with pytest.raises(preemption.Preempted, match="step 6 saved to ckpt-4"):
        actions.CheckPreemption(watcher, state, saves)(_output(0, [1.0]))
    assert saves.calls == [(Trigger.PREEMPTION, 6)]
    watcher = types.SimpleNamespace(requested=False, interrupted=True)
    with pytest.raises(KeyboardInterrupt):  # the controller asks the policy, not this
        actions.CheckPreemption(watcher, state, saves)(_output(0, [1.0]))
    actions.CheckPreemption(types.SimpleNamespace(requested=False, interrupted=False),
                            state, saves)(_output(0, [1.0]))
    assert saves.calls == [(Trigger.PREEMPTION, 6)]


def test_epochs_end_at_each_boundary_with_the_mean_loss_and_evaluate_when_due():
    calls, saves = _Calls(), _Saves()
    # 4 steps per epoch, loops of 2, evaluation every 8 steps and at the target, 10.
    epochs = actions.Epochs(4, 10, calls, saves,
                            evaluate=lambda: {"loss": 0.5, "global_step": 8},
                            eval_every=8)
    for start, losses in ((0, [4.0, 2.0]), (2, [2.0, 0.0]), (4, [1.0, 1.0]),
                          (6, [3.0, 1.0]), (8, [1.0, 2.0])):
        epochs.begin(start)
        epochs(_output(start, losses))
    assert calls.calls == [
        ("on_epoch_begin", 0), ("on_epoch_end", 0, {"loss": 2.0}),      # mean of 4,2,2,0
        ("on_epoch_begin", 1), ("on_epoch_end", 1, {"loss": 1.5, "val_loss": 0.5}),
        ("on_epoch_begin", 2), ("on_epoch_end", 2, {"loss": 1.5, "val_loss": 0.5})]
    assert saves.calls == [(Trigger.EVALUATION, 8), (Trigger.EVALUATION, 10)]
    assert epochs.logs == {"loss": 1.5, "val_loss": 0.5}


def test_the_default_epoch_log_keeps_evaluated_epochs_only(tmp_path):
    log = callbacks.EpochLog(str(tmp_path), lambda: 20)
    log.on_epoch_end(0, {"loss": 1.0})  # not evaluated: not logged
    log.on_epoch_end(1, {"loss": 0.5, "val_loss": 0.75})
    callbacks.EpochLog(str(tmp_path / "other"), lambda: 20, writes=False).on_epoch_end(
        1, {"val_loss": 0.1})
    assert history.read_epochs(str(tmp_path), 100) == [
        {"epoch": 1, "step": 20, "logs": {"loss": 0.5, "val_loss": 0.75}}]
    assert not (tmp_path / "other").exists()
    assert callbacks.EpochLog.installed_by_default
