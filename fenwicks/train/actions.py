"""What happens around each compiled loop of `Estimator.train`: one ordered list of
actions (`ActionList`), built per `train` call by `controller.default_actions`.

An entry is an `Action`: called with each loop's `LoopOutput`, and with hooks for the
train's and each epoch's begin and end, which default to nothing. The user's Keras
callbacks are entries too (`KerasCallback` calls a callback as ``model.fit`` would), so
the built-in jobs (history, TensorBoard scalars, the progress bar, the epoch log) and the
user's callbacks are one list, and every hook runs over it in the list's order: an entry
sees what the entries before it left.

"When" is apart from "what" (Orbit's ``ConditionalAction``): `ConditionalAction` pairs a
condition of `fenwicks.train.conditions` ("at the epoch's end") with the action it
triggers. The actions that save do not call the checkpointer: they tell the run's
`save_policy.SavePolicy` what happened, and it decides and saves.

Keras's own callbacks do not do these jobs as Fenwicks needs them: `keras.callbacks.History`
keeps epoch logs only, `ProgbarLogger` counts batches of one epoch and `TerminateOnNaN`
stops quietly where Fenwicks raises `NonFiniteLossError`; the user may still add them.

Examples:
    >>> from fenwicks.train import conditions
    >>> from fenwicks.train.runner import LoopOutput
    >>> class PrintEpoch(Action):   # a user's part of the list
    ...     def on_epoch_end(self, epoch, logs):
    ...         print(epoch, logs)
    >>> losses = EpochLoss()   # epochs of 4 steps, loops of 2
    >>> end = ConditionalAction(conditions.AtEpochEnd(4), EndEpoch(4, losses))
    >>> actions = end.action.actions = ActionList([losses, end], user=[PrintEpoch()])
    >>> for start in (0, 2, 4):   # three loops' outputs: losses [0, 1], [2, 3], [4, 5]
    ...     actions(LoopOutput(start, start + 2, np.array([start, start + 1], 'float32'),
    ...                        learning_rate=0.1, seconds=0.01, examples_per_sec=800.0))
    0 {'loss': 1.5}
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import keras
import numpy as np

from fenwicks.train import preemption
from fenwicks.train.history import History
from fenwicks.train.run_state import NonFiniteLossError, RunState
from fenwicks.train.runner import LoopOutput
from fenwicks.train.save_policy import SavePolicy, Trigger

logger = logging.getLogger("fenwicks")


class Action:
    """An entry of the `ActionList`: ``action(output)`` after each compiled loop, and
    hooks that default to doing nothing.

    Examples:
        >>> class PrintLoss(Action):
        ...     def __call__(self, output):
        ...         print(output.step, output.last_loss)
    """

    def on_train_begin(self) -> None:
        """Before the first loop of a `train` call."""

    def on_epoch_begin(self, epoch: int) -> None:
        """Before the first loop of an epoch (and the first loop of a `train` call)."""

    def on_loop_begin(self, step: int) -> None:
        """Before each compiled loop, which starts at global step `step`."""

    def __call__(self, output: LoopOutput) -> None:
        """After each compiled loop."""

    def on_epoch_end(self, epoch: int, logs: dict[str, float]) -> None:
        """After an epoch's last loop (and its evaluation, if any)."""

    def on_train_end(self, logs: dict[str, float]) -> None:
        """After the last loop of a `train` call: the last epoch's logs."""

    def close(self) -> None:
        """On the way out of a `train` call, however it ends (flush, close a bar)."""


class ActionList:
    """The one ordered list: the entries before the user's, the user's callbacks, the
    entries after them; every hook runs over the entries in this order.

    Args:
        before: the built-in entries that run before the user's callbacks.
        user: the user's callbacks, as entries (`KerasCallback`).
        after: the built-in entries that run after them.

    Attributes:
        entries: all entries, in order.
        user: the user's part of the list (the controller forces the end-of-train save
            when it is not empty: a callback may have changed the weights).
    """

    def __init__(self, before: Sequence[Action], user: Sequence[Action] = (),
                 after: Sequence[Action] = ()) -> None:
        self.user = tuple(user)
        self.entries = (*before, *self.user, *after)

    def on_train_begin(self) -> None:
        for entry in self.entries:
            entry.on_train_begin()

    def on_epoch_begin(self, epoch: int) -> None:
        for entry in self.entries:
            entry.on_epoch_begin(epoch)

    def on_loop_begin(self, step: int) -> None:
        for entry in self.entries:
            entry.on_loop_begin(step)

    def __call__(self, output: LoopOutput) -> None:
        for entry in self.entries:
            entry(output)

    def on_epoch_end(self, epoch: int, logs: dict[str, float]) -> None:
        for entry in self.entries:
            entry.on_epoch_end(epoch, logs)

    def on_train_end(self, logs: dict[str, float]) -> None:
        for entry in self.entries:
            entry.on_train_end(logs)

    def close(self) -> None:
        for entry in self.entries:
            entry.close()


class ConditionalAction(Action):
    """Runs `action` after a loop when `condition(output)` holds (Orbit's pattern).

    Args:
        condition: ``condition(output) -> bool``, e.g. `conditions.AtEpochEnd`.
        action: the `Action` to run.
    """

    def __init__(self, condition: Callable[[LoopOutput], bool], action: Action) -> None:
        self.condition, self.action = condition, action

    def __call__(self, output: LoopOutput) -> None:
        if self.condition(output):
            self.action(output)


class KerasCallback(Action):
    """A `keras.callbacks.Callback` as an entry, called as ``model.fit`` calls it:
    ``on_train_batch_begin/end`` around each loop (``batch`` is the global step,
    ``logs['loss']`` the loop's last loss), ``on_epoch_begin/end``, ``on_train_begin/end``.
    """

    def __init__(self, callback: keras.callbacks.Callback) -> None:
        self.callback = callback

    def on_train_begin(self) -> None:
        self.callback.on_train_begin({})

    def on_epoch_begin(self, epoch: int) -> None:
        self.callback.on_epoch_begin(epoch, {})

    def on_loop_begin(self, step: int) -> None:
        self.callback.on_train_batch_begin(step, {})

    def __call__(self, output: LoopOutput) -> None:
        self.callback.on_train_batch_end(output.step, {"loss": output.last_loss})

    def on_epoch_end(self, epoch: int, logs: dict[str, float]) -> None:
        self.callback.on_epoch_end(epoch, logs)

    def on_train_end(self, logs: dict[str, float]) -> None:
        self.callback.on_train_end(logs)


class StoppedOnNonFiniteLoss(Exception):  # noqa: N818 - a signal, not an error
    """A callback stopped training after a non-finite loss: end quietly, save nothing."""


class RecordHistory(Action):
    """Appends each loop's per-step losses, learning rate and examples/s to `history`."""

    def __init__(self, history: History) -> None:
        self.history = history

    def __call__(self, output: LoopOutput) -> None:
        losses = output.losses
        self.history.steps += list(range(output.start + 1, output.start + 1 + len(losses)))
        self.history.losses += [float(x) for x in losses]
        self.history.examples_per_sec.append((output.step, output.examples_per_sec))
        if output.learning_rate is not None:
            self.history.learning_rates.append((output.step, output.learning_rate))


class StopOnNonFiniteLoss(Action):
    """A NaN or infinite loss stops training: `NonFiniteLossError` naming the step, or,
    when a callback already set ``model.stop_training``, a warning and a quiet stop.

    Either way the weights in memory are marked stale (``state.stale``): the estimator
    reloads the last good checkpoint before its next use.
    """

    def __init__(self, state: RunState) -> None:
        self.state = state

    def __call__(self, output: LoopOutput) -> None:
        if not len(output.losses) or np.isfinite(output.last_loss):
            return
        state = self.state
        state.stale = True
        if state.spec.model.stop_training:
            logger.warning("fenwicks: the loss is %s at step %d; a callback stopped "
                           "training. The last good checkpoint is %s", output.last_loss,
                           output.step, state.latest_checkpoint)
            raise StoppedOnNonFiniteLoss
        raise NonFiniteLossError(
            f"the training loss is {output.last_loss} at step {output.step}; training "
            "stopped and no checkpoint was written for it (the last good one is "
            f"{state.latest_checkpoint}). Lower the learning rate, or check the "
            "inputs for NaN and the labels' range")


class CheckPreemption(Action):
    """SIGTERM: saves the step reached (`Trigger.PREEMPTION`) and raises `Preempted`;
    Ctrl-C: raises KeyboardInterrupt (the controller asks the save policy)."""

    def __init__(self, watcher: preemption.PreemptionWatcher, state: RunState,
                 saves: SavePolicy) -> None:
        self.watcher, self.state, self.saves = watcher, state, saves

    def __call__(self, output: LoopOutput) -> None:
        # Processes that save together (the JAX engine's hosts) decide together: a signal
        # reaches one of them, and a save is a collective of all (`SavePolicy.agree`).
        if self.saves.agree(self.watcher.requested):
            self.saves.save(Trigger.PREEMPTION, self.state.global_step)
            raise preemption.Preempted(self.state.global_step, self.state.latest_checkpoint)
        if self.saves.agree(self.watcher.interrupted):
            raise KeyboardInterrupt


class Heartbeat(Action):
    """Renews the work_dir lock (`RunState.heartbeat`)."""

    def __init__(self, state: RunState) -> None:
        self.state = state

    def __call__(self, output: LoopOutput) -> None:
        self.state.heartbeat()


class PeriodicSave(Action):
    """Tells the save policy a loop ended (`Trigger.LOOP`); its condition,
    ``every_loops`` or ``every_secs`` (`conditions.AnyOf`), decides whether to save."""

    def __init__(self, saves: SavePolicy) -> None:
        self.saves = saves

    def __call__(self, output: LoopOutput) -> None:
        self.saves.save(Trigger.LOOP, output.step)


class EpochLoss(Action):
    """Adds up the training losses of the current epoch; `EndEpoch` takes their mean."""

    def __init__(self) -> None:
        self.total, self.count = 0.0, 0

    def __call__(self, output: LoopOutput) -> None:
        self.total += float(np.sum(output.losses, dtype=np.float64))
        self.count += len(output.losses)

    def take(self) -> float:
        """The epoch's mean loss; starts the next epoch's count."""
        mean = self.total / self.count if self.count else float("nan")
        self.total, self.count = 0.0, 0
        return mean


class EndEpoch(Action):
    """Ends the epoch of the loop just run: its logs (the mean training ``loss``, plus
    what `end` is given, e.g. ``val_*``) go to ``on_epoch_end`` of every entry of
    `actions`, in order.

    Args:
        steps_per_epoch: the estimator's steps per epoch.
        losses: the `EpochLoss` entry adding up the epoch's losses.
        actions: the `ActionList` whose entries' ``on_epoch_end`` run; set after the
            list is made when this action is one of its entries. Defaults to None.

    Attributes:
        logs: the last ended epoch's logs (``on_train_end`` gets them).
    """

    def __init__(self, steps_per_epoch: int, losses: EpochLoss,
                 actions: ActionList | None = None) -> None:
        self.steps_per_epoch, self.losses, self.actions = steps_per_epoch, losses, actions
        self.logs: dict[str, float] = {}

    def __call__(self, output: LoopOutput) -> None:
        self.end(output.step)

    def end(self, step: int, extra: dict[str, float] | None = None) -> None:
        """Ends the epoch that global step `step` closes, with `extra` logs."""
        logs = {"loss": self.losses.take(), **(extra or {})}
        # The epoch of the loop that reached `step` (a loop never crosses an epoch's end).
        self.actions.on_epoch_end((step - 1) // self.steps_per_epoch, logs)
        self.logs = logs
