"""`fenwicks.train.actions`, `conditions` (and the default `callbacks.EpochLog`) on their own: each
action fed hand-made `LoopOutput`s, with stand-ins for the state, the save policy and
the callbacks (the policy itself: test_save_policy.py)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from fenwicks.train import actions, callbacks, conditions, history, preemption
from fenwicks.train.history import History
from fenwicks.train.run_state import NonFiniteLossError
from fenwicks.train.save_policy import Trigger
from fenwicks.train.tf.trainer import LoopOutput


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

    def agree(self, flag):  # one process: its own flag
        return bool(flag)


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


class _Entry(actions.Action):
    """An entry that records the hooks it gets, into a list shared by all entries."""

    def __init__(self, name, calls):
        self.name, self.calls = name, calls

    def on_epoch_begin(self, epoch):
        self.calls.append((self.name, "epoch_begin", epoch))

    def __call__(self, output):
        self.calls.append((self.name, "loop", output.step))

    def on_epoch_end(self, epoch, logs):
        self.calls.append((self.name, "epoch_end", epoch, dict(logs)))


def test_the_list_runs_every_hook_in_its_order_and_ends_epochs_by_a_condition():
    calls = []
    losses = actions.EpochLoss()
    at_end = conditions.AtEpochEnd(4)
    end = actions.EndEpoch(4, losses)
    first, user = _Entry("first", calls), _Entry("user", calls)
    entries = end.actions = actions.ActionList(
        [first], [user], [losses, actions.ConditionalAction(at_end, end)])
    assert entries.user == (user,)
    # 4 steps per epoch, loops of 2; step 8 is held: its epoch ends after an evaluation.
    at_end.held = 8
    for start, loop_losses in ((0, [4.0, 2.0]), (2, [2.0, 0.0]), (4, [1.0, 1.0]),
                               (6, [3.0, 1.0])):
        entries(_output(start, loop_losses))
    end.end(8, {"val_loss": 0.5})
    entries.on_epoch_begin(2)
    entries(_output(8, [1.0, 2.0]))
    end.end(10)  # a partial last epoch, ended by the caller
    loops = [c for c in calls if c[1] == "loop"]
    assert loops == [(name, "loop", step) for step in (2, 4, 6, 8, 10)
                     for name in ("first", "user")]
    ends = [c for c in calls if c[1] != "loop"]
    assert ends == [
        ("first", "epoch_end", 0, {"loss": 2.0}), ("user", "epoch_end", 0, {"loss": 2.0}),
        ("first", "epoch_end", 1, {"loss": 1.5, "val_loss": 0.5}),  # mean of 1, 1, 3, 1
        ("user", "epoch_end", 1, {"loss": 1.5, "val_loss": 0.5}),
        ("first", "epoch_begin", 2), ("user", "epoch_begin", 2),
        ("first", "epoch_end", 2, {"loss": 1.5}), ("user", "epoch_end", 2, {"loss": 1.5})]
    assert end.logs == {"loss": 1.5}


def test_conditions_every_n_loops_every_t_seconds_and_any_of(monkeypatch):
    every = conditions.EveryNLoops(3)
    assert [every() for _ in range(7)] == [False, False, True, False, False, True, False]
    clock = [0.0]
    monkeypatch.setattr(conditions.time, "monotonic", lambda: clock[0])
    timed, counted = conditions.EverySeconds(10.0), conditions.EveryNLoops(3)
    either, held = conditions.AnyOf(counted, timed), []
    for now in (1.0, 2.0, 9.0, 12.5, 19.5):
        clock[0] = now
        held.append(either())
    # Loop 3 (t=9) holds by count and restarts the clock; t=19.5 is 10.5 s after it,
    # on the second loop since: by time.
    assert held == [False, False, True, False, True]
    with pytest.raises(ValueError, match="n=0 must be a positive int"):
        conditions.EveryNLoops(0)


def test_a_keras_callback_is_called_as_fit_calls_it():
    seen = []

    class Recorder(callbacks.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(("batch_begin", batch))

        def on_train_batch_end(self, batch, logs=None):
            seen.append(("batch_end", batch, logs))

    entry = actions.KerasCallback(Recorder())
    entry.on_loop_begin(4)
    entry(_output(4, [1.0, 0.5]))
    assert seen == [("batch_begin", 4), ("batch_end", 6, {"loss": 0.5})]


def test_the_default_epoch_log_keeps_evaluated_epochs_only(tmp_path):
    log = callbacks.EpochLog(str(tmp_path), lambda: 20)
    log.on_epoch_end(0, {"loss": 1.0})  # not evaluated: not logged
    log.on_epoch_end(1, {"loss": 0.5, "val_loss": 0.75})
    callbacks.EpochLog(str(tmp_path / "other"), lambda: 20, writes=False).on_epoch_end(
        1, {"val_loss": 0.1})
    assert history.read_epochs(str(tmp_path), 100) == [
        {"epoch": 1, "step": 20, "logs": {"loss": 0.5, "val_loss": 0.75}}]
    assert not (tmp_path / "other").exists()
    assert not hasattr(callbacks.EpochLog, "installed_by_default")
