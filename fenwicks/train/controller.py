"""The outer training loop, as plain as Orbit's `Controller.train`: how many steps,
``trainer.train(n)``, then the actions that are due.

Each concern it calls lives elsewhere: the compiled inner loop and its counters in the
`Trainer` (`trainer.py`), what follows each loop (history, summaries, the bar, the
callbacks, the non-finite-loss stop, preemption, the save policy, epochs and evaluation)
in `actions.py`, state and checkpoints in `state.py`, preemption signals in
`preemption.py`. When to save: every `save_every_loops` loops, every `save_every_secs`,
at each evaluation, on SIGTERM, on Ctrl-C (when quick), and at the end.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from fenwicks.train import actions, preemption, profiling
from fenwicks.train.history import History
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.state import RunState
from fenwicks.train.trainer import InputExhaustedError, LoopOutput, Trainer

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
        >>> controller.train(strategy, iterator, target=1000, callbacks=callback_list)
    """

    def __init__(self, config: EstimatorConfig, state: RunState, record: History,
                 engine: Any = None) -> None:
        self.config = config
        self.state = state
        self.history = record
        self._engine = engine  # None: the TensorFlow engine (`fenwicks.train.engines`)
        self._watcher = preemption.PreemptionWatcher()
        self._trainer: Trainer | None = None

    def _get_trainer(self, strategy: tf.distribute.Strategy) -> Trainer:
        if self._trainer is None:
            if self._engine is None:
                from fenwicks.train.engines import TensorFlowEngine as engine
            else:
                engine = self._engine
            self._trainer = engine.trainer(strategy, self.config, self.state,
                                           self._watcher.flag)
        return self._trainer

    def train(self, strategy: tf.distribute.Strategy, iterator: Any, target: int,
              callbacks: keras.callbacks.CallbackList,
              evaluate: Callable[[], dict[str, float]] | None = None,
              eval_every: int | None = None,
              profile_steps: tuple[int, int] | None = None) -> None:
        """Trains to global step `target`, evaluating every `eval_every` steps and at the end.

        Epochs end every ``steps_per_epoch`` steps; loops are cut there so the callbacks'
        epoch boundaries are exact, and at `profile_steps` (`profiling.ProfileWindow`).
        """
        trainer, state = self._get_trainer(strategy), self.state
        model = state.spec.model
        model.stop_training = False
        epochs = actions.Epochs(self.config.steps_per_epoch, target, callbacks, state.save,
                                evaluate, eval_every)
        callbacks.on_train_begin()
        profile = profiling.ProfileWindow(profile_steps if state.is_chief else None,
                                          f"{self.config.work_dir}/train")
        with self._watcher, profile, actions.default_actions(
                self.config, state, self.history, self._watcher, callbacks, epochs,
                state.global_step) as after_each_loop:
            try:
                while state.global_step < target and not model.stop_training:
                    num_steps = self._loop_length(state.global_step, target, profile)
                    epochs.begin(state.global_step)
                    callbacks.on_train_batch_begin(state.global_step)
                    profile.update(state.global_step)  # outside the timed compiled call
                    output = self._run(trainer, iterator, num_steps)
                    profile.update(state.global_step)
                    for action in after_each_loop:
                        action(output)
            except actions.StoppedOnNonFiniteLoss:
                return  # a callback (TerminateOnNaN) asked to stop: nothing saved
            except KeyboardInterrupt:
                raise self._interrupted() from None
        callbacks.on_train_end(epochs.logs)
        # After on_train_end: a callback may have changed the weights (EarlyStopping's
        # restore_best_weights); the checkpoint then holds what the callbacks left.
        state.save(force=any(not getattr(c, "installed_by_default", False)
                             for c in callbacks.callbacks))

    def _loop_length(self, step: int, target: int, profile: profiling.ProfileWindow) -> int:
        """`steps_per_loop`, cut at the target, the epoch's end and the profile window."""
        to_epoch_end = self.config.steps_per_epoch - step % self.config.steps_per_epoch
        return min(self.config.steps_per_loop, target - step, to_epoch_end,
                   profile.steps_to_boundary(step) or target)

    def _run(self, trainer: Trainer, iterator: Any, num_steps: int) -> LoopOutput:
        try:
            return trainer.train(iterator, num_steps)
        except InputExhaustedError:
            # The steps that did run are complete and valid (the loop counted them and
            # the input position together): keep them.
            self.state.save()
            raise

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


def _step_of(checkpoint: str | None) -> int:
    """The step a checkpoint path ends with (``ckpt-<step>``, orbax's ``.../<step>``)."""
    match = re.search(r"(\d+)$", checkpoint or "")
    return int(match.group(1)) if match else 0


def epochs_to(target: int, steps_per_epoch: int) -> int:
    """How many epochs reach global step `target` (Keras's ``params['epochs']``)."""
    return max(1, math.ceil(target / steps_per_epoch))
