"""What happens after each compiled loop of `Estimator.train`: Orbit-style actions, plain
callables ``action(output: LoopOutput) -> None``, each knowing one concern and none of
the others.

`default_actions` installs them, composed with the user's Keras callbacks, in this order
(each sees the state the ones before it left):

1. `RecordHistory`: per-step losses, learning rates and examples/s into `History`.
2. `progress.TrainSummaries`: TensorBoard scalars in ``<work_dir>/train``.
3. `progress.ProgressBar`: the tqdm bar (when ``verbose``).
4. the user's callbacks: ``on_train_batch_end(global_step, {'loss': last loss})``.
5. `StopOnNonFiniteLoss`: a NaN/inf loss is an error (or a quiet stop when a callback
   such as Keras's `TerminateOnNaN`, called just before, asked to stop); nothing after
   it runs, so nothing is saved for that loop.
6. `CheckPreemption`: SIGTERM saves and stops; Ctrl-C stops (the controller asks the
   save policy whether to save).
7. the work_dir lock's heartbeat.
8. the periodic save: `save_policy.Trigger.LOOP`, a checkpoint every
   ``save_every_loops`` loops or ``save_every_secs``.
9. `Epochs`: epoch boundaries, evaluation when due (and a checkpoint of each evaluated
   step), ``on_epoch_end`` of the callbacks, whose first is the estimator's
   `callbacks.EpochLog` (the epoch log in work_dir).

The actions that save (6, 8, 9) do not call the checkpointer: they tell the run's
`save_policy.SavePolicy` what happened, and it decides and saves.

Keras's own callbacks do not do these jobs as Fenwicks needs them: `keras.callbacks.History`
keeps epoch logs only, `ProgbarLogger` counts batches of one epoch and `TerminateOnNaN`
stops quietly where Fenwicks raises `NonFiniteLossError`; the user may still add them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import keras
import numpy as np

from fenwicks.train import preemption
from fenwicks.train.callbacks import val_logs
from fenwicks.train.history import History
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.progress import ProgressBar, TrainSummaries
from fenwicks.train.save_policy import SavePolicy, Trigger
from fenwicks.train.state import NonFiniteLossError, RunState
from fenwicks.train.trainer import LoopOutput

logger = logging.getLogger("fenwicks")

Action = Callable[[LoopOutput], None]


class StoppedOnNonFiniteLoss(Exception):  # noqa: N818 - a signal, not an error
    """A callback stopped training after a non-finite loss: end quietly, save nothing."""


class RecordHistory:
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


class StopOnNonFiniteLoss:
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


class CheckPreemption:
    """SIGTERM: saves the step reached (`Trigger.PREEMPTION`) and raises `Preempted`;
    Ctrl-C: raises KeyboardInterrupt (the controller asks the save policy)."""

    def __init__(self, watcher: preemption.PreemptionWatcher, state: RunState,
                 saves: SavePolicy) -> None:
        self.watcher, self.state, self.saves = watcher, state, saves

    def __call__(self, output: LoopOutput) -> None:
        if self.watcher.requested:
            self.saves.save(Trigger.PREEMPTION, self.state.global_step)
            raise preemption.Preempted(self.state.global_step, self.state.latest_checkpoint)
        if self.watcher.interrupted:
            raise KeyboardInterrupt


class Epochs:
    """Epoch boundaries every `steps_per_epoch` steps: ``on_epoch_begin`` before the first
    loop of an epoch (`begin`), and after its last (the action) the epoch's mean loss,
    an evaluation when due (every `eval_every` steps and at `target`), a checkpoint of
    each evaluated step (`Trigger.EVALUATION`), and ``on_epoch_end``.

    Attributes:
        logs: the last epoch's logs (``on_train_end`` gets them).
    """

    def __init__(self, steps_per_epoch: int, target: int,
                 callbacks: keras.callbacks.CallbackList, saves: SavePolicy,
                 evaluate: Callable[[], dict[str, float]] | None = None,
                 eval_every: int | None = None) -> None:
        self.steps_per_epoch, self.target = steps_per_epoch, target
        self.callbacks, self._saves = callbacks, saves
        self._evaluate, self._eval_every = evaluate, eval_every
        self._losses: list[float] = []
        self.logs: dict[str, float] = {}

    def begin(self, step: int) -> None:
        """Before a loop that starts at `step`: ``on_epoch_begin`` if an epoch starts."""
        if step % self.steps_per_epoch == 0 or not self._losses:
            self.callbacks.on_epoch_begin(step // self.steps_per_epoch)

    def __call__(self, output: LoopOutput) -> None:
        self._losses += [float(x) for x in output.losses]
        step = output.step
        due = self._evaluate is not None and (step == self.target or bool(
            self._eval_every and step % self._eval_every == 0))
        if not (step % self.steps_per_epoch == 0 or due):
            return
        logs = {"loss": float(np.mean(self._losses))}
        if due:
            self._saves.save(Trigger.EVALUATION, step)
            logs.update(val_logs(self._evaluate()))
        # The epoch the loop ran in (a loop never crosses an epoch's end).
        self.callbacks.on_epoch_end(output.start // self.steps_per_epoch, logs)
        self.logs, self._losses = logs, []


@contextlib.contextmanager
def default_actions(config: EstimatorConfig, state: RunState, history: History,
                    watcher: preemption.PreemptionWatcher,
                    callbacks: keras.callbacks.CallbackList, epochs: Epochs,
                    saves: SavePolicy, start: int) -> Iterator[list[Action]]:
    """The actions of one `train` call, in the order of this module's docstring; the
    summaries are flushed and the bar closed on the way out."""
    summaries = TrainSummaries(state.summary_writer("train"), path=f"{config.work_dir}/train")
    bar = ProgressBar(start, epochs.target) if config.verbose else None
    actions: list[Action] = [
        RecordHistory(history), summaries, *([bar] if bar else []),
        lambda output: callbacks.on_train_batch_end(output.step,
                                                    {"loss": output.last_loss}),
        StopOnNonFiniteLoss(state), CheckPreemption(watcher, state, saves),
        lambda output: state.heartbeat(),
        lambda output: saves.save(Trigger.LOOP, output.step), epochs]
    try:
        yield actions
    finally:
        summaries.close()
        if bar is not None:
            bar.close()
