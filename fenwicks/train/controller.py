"""The outer training loop, as plain as Orbit's `Controller.train`: compute how many steps,
run them in one compiled call, record, maybe save, maybe evaluate, call back, stop.

Each concern it calls lives elsewhere: the compiled loop in `loops.py`, state and
checkpoints in `state.py`, preemption in `preemption.py`, progress in `progress.py`,
callbacks in `callbacks.py`. When to save: every `save_every_loops` loops, every
`save_every_secs`, on SIGTERM, on Ctrl-C (when quick), and at the end.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from fenwicks.train import history, preemption
from fenwicks.train.callbacks import val_logs
from fenwicks.train.history import History
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.progress import Progress
from fenwicks.train.state import NonFiniteLossError, RunState
from fenwicks.train.trainer import InputExhaustedError, Trainer

logger = logging.getLogger("fenwicks")

# Ctrl-C saves the step reached unless the last checkpoint took longer than this to write:
# someone pressing stop wants control back, not minutes of upload to a bucket.
QUICK_SAVE_SECS = 10.0


class Controller:
    """Runs training loops for one `RunState` until a target step.

    Args:
        config: the estimator's `EstimatorConfig`.
        state: the run's `RunState` (built).
        record: the `History` to append per-step losses, rates and learning rates to.

    Example:
        >>> controller = Controller(config, state, est.history)
        >>> controller.train(iterator, target=1000, callbacks=callback_list)
    """

    def __init__(self, config: EstimatorConfig, state: RunState, record: History) -> None:
        self.config = config
        self.state = state
        self.history = record
        self._watcher = preemption.PreemptionWatcher()
        self._trainer: Trainer | None = None

    def _get_trainer(self, strategy: tf.distribute.Strategy) -> Trainer:
        if self._trainer is None:
            state = self.state
            self._trainer = Trainer(
                strategy, state.spec, state.optimizer, state.step_counter,
                self.config.train_batch_size, self.config.jit_compile, self._watcher.flag,
                state.input_steps)
        return self._trainer

    def train(self, strategy: tf.distribute.Strategy, iterator: Any, target: int,
              callbacks: keras.callbacks.CallbackList,
              evaluate: Callable[[], dict[str, float]] | None = None,
              eval_every: int | None = None) -> None:
        """Trains to global step `target`, evaluating every `eval_every` steps and at the end.

        Epochs end every ``steps_per_epoch`` steps; loops are cut there so the callbacks'
        epoch boundaries are exact.
        """
        trainer, state = self._get_trainer(strategy), self.state
        model = state.spec.model
        model.stop_training = False
        callbacks.on_train_begin()
        logs: dict[str, float] = {}
        with self._watcher, Progress(state.summary_writer("train"), state.global_step,
                                     target, self.config.train_batch_size,
                                     self.config.verbose,
                                     path=f"{self.config.work_dir}/train") as progress:
            saver = _SavePolicy(self.config)
            epoch_losses: list[float] = []
            try:
                while state.global_step < target and not model.stop_training:
                    epoch = state.global_step // self.config.steps_per_epoch
                    if (state.global_step % self.config.steps_per_epoch == 0
                            or not epoch_losses):
                        callbacks.on_epoch_begin(epoch)
                    losses = self._run_loop(trainer, iterator, target, callbacks, progress)
                    epoch_losses += [float(x) for x in losses]
                    if self._stopped_on_non_finite(losses):
                        return  # a callback (TerminateOnNaN) asked to stop: nothing saved
                    if self._watcher.requested:
                        state.save()
                        raise preemption.Preempted(state.global_step,
                                                   state.latest_checkpoint)
                    if self._watcher.interrupted:
                        raise KeyboardInterrupt
                    state.heartbeat()
                    if saver.due():
                        state.save()
                        progress.restart_clock()
                    epoch_logs = self._maybe_end_epoch(epoch, epoch_losses, target,
                                                       callbacks, evaluate, eval_every)
                    if epoch_logs:
                        logs, epoch_losses = epoch_logs, []
            except KeyboardInterrupt:
                raise self._interrupted() from None
        callbacks.on_train_end(logs)
        # After on_train_end: a callback may have changed the weights (EarlyStopping's
        # restore_best_weights); the checkpoint then holds what the callbacks left.
        state.save(force=bool(callbacks.callbacks))

    def _interrupted(self) -> preemption.Interrupted:
        """Saves the step reached after Ctrl-C when that is quick; says what it did."""
        state = self.state
        step = state.global_step
        if self._watcher.forced:
            reason = "interrupted twice"
        elif (state.last_save_secs or 0.0) > QUICK_SAVE_SECS:
            reason = (f"the last checkpoint took {state.last_save_secs:.0f} s to write; "
                      f"{step - _step_of(state.latest_checkpoint)} step(s) are only in memory")
        else:
            try:
                state.save()
                return preemption.Interrupted(step, state.latest_checkpoint, True)
            except KeyboardInterrupt:
                reason = "interrupted again while saving"
        saved = _step_of(state.latest_checkpoint) == step
        return preemption.Interrupted(step, state.latest_checkpoint, saved, reason)

    def _run_loop(self, trainer: Trainer, iterator: Any, target: int,
                  callbacks: keras.callbacks.CallbackList, progress: Progress) -> np.ndarray:
        state = self.state
        start = state.global_step
        to_epoch_end = self.config.steps_per_epoch - start % self.config.steps_per_epoch
        num_steps = min(self.config.steps_per_loop, target - start, to_epoch_end)
        callbacks.on_train_batch_begin(start)
        try:
            output = trainer.train(iterator, num_steps)
        except InputExhaustedError:
            # The steps that did run are complete and valid (the loop counted them and
            # the input position together): keep them.
            state.save()
            raise
        self._record(start, output.losses, output.learning_rate, progress)
        callbacks.on_train_batch_end(state.global_step, {"loss": output.last_loss})
        return output.losses

    def _stopped_on_non_finite(self, losses: np.ndarray) -> bool:
        if not len(losses) or np.isfinite(losses[-1]):
            return False
        state = self.state
        state.stale = True  # the weights in memory are now NaN; reload before next use
        if state.spec.model.stop_training:
            logger.warning("fenwicks: the loss is %s at step %d; a callback stopped "
                           "training. The last good checkpoint is %s", losses[-1],
                           state.global_step, state.latest_checkpoint)
            return True
        raise NonFiniteLossError(
            f"the training loss is {losses[-1]} at step {state.global_step}; training "
            "stopped and no checkpoint was written for it (the last good one is "
            f"{state.latest_checkpoint}). Lower the learning rate, or check the "
            "inputs for NaN and the labels' range")

    def _maybe_end_epoch(self, epoch: int, epoch_losses: list[float], target: int,
                         callbacks: keras.callbacks.CallbackList,
                         evaluate: Callable[[], dict[str, float]] | None,
                         eval_every: int | None) -> dict[str, float]:
        """At an epoch's end (or the last step when evaluating): its logs, else {}."""
        step = self.state.global_step
        at_epoch_end = step % self.config.steps_per_epoch == 0
        due = evaluate is not None and (step == target or (eval_every and
                                                           step % eval_every == 0))
        if not (at_epoch_end or due):
            return {}
        logs = {"loss": float(np.mean(epoch_losses))}
        if due:
            self.state.save()  # each evaluated step is also a checkpoint, as before
            logs.update(val_logs(evaluate()))
        if due and self.state.is_chief:  # evaluated epochs: what resumable callbacks replay
            history.append_epoch(self.config.work_dir, epoch, step, logs)
        callbacks.on_epoch_end(epoch, logs)
        return logs

    def _record(self, start: int, losses: np.ndarray, learning_rate: float | None,
                progress: Progress) -> None:
        step = self.state.global_step
        self.history.steps += list(range(start + 1, start + 1 + len(losses)))
        self.history.losses += [float(x) for x in losses]
        rate = progress.update(step, losses, learning_rate)
        self.history.examples_per_sec.append((step, rate))
        if learning_rate is not None:
            self.history.learning_rates.append((step, learning_rate))


class _SavePolicy:
    """Every `save_every_loops` loops and every `save_every_secs` seconds."""

    def __init__(self, config: EstimatorConfig) -> None:
        self._every, self._secs = config.save_every_loops, config.save_every_secs
        self._last, self._loops = time.monotonic(), 0

    def due(self) -> bool:
        self._loops += 1
        if (self._every and self._loops >= self._every) or (
                self._secs is not None and time.monotonic() - self._last >= self._secs):
            self._last, self._loops = time.monotonic(), 0
            return True
        return False


def _step_of(checkpoint: str | None) -> int:
    return int(checkpoint.rsplit("-", 1)[1]) if checkpoint else 0


def epochs_to(target: int, steps_per_epoch: int) -> int:
    """How many epochs reach global step `target` (Keras's ``params['epochs']``)."""
    return max(1, math.ceil(target / steps_per_epoch))
