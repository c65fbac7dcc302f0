"""The outer training loop, as plain as Orbit's `Controller.train`: how many steps,
``trainer.train(n)``, then the actions that are due.

Each concern it calls lives elsewhere: the compiled inner loop and its counters in the
`Trainer` (`trainer.py`), what follows each loop (history, summaries, the bar, the
callbacks, the non-finite-loss stop, preemption, periodic saves, epochs and evaluation)
in `actions.py`, the model and counters in `state.py`, preemption signals in
`preemption.py`.

Checkpoints have one owner, the run's `checkpointer.Checkpointer`, and one caller: the
controller holds a `save_policy.SavePolicy` over it for each `train` call, and every
reason to save (every `save_every_loops` loops or `save_every_secs`, each evaluation,
SIGTERM, Ctrl-C when quick, input exhausted, the end) goes through its `save`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from fenwicks.train import actions, preemption, profiling
from fenwicks.train.checkpoints import step_of
from fenwicks.train.history import History
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.save_policy import SavePolicy, Trigger
from fenwicks.train.state import RunState
from fenwicks.train.trainer import InputExhaustedError, LoopOutput, Trainer

logger = logging.getLogger("fenwicks")


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
        self.saves: SavePolicy | None = None  # the current train call's

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
        saves = self.saves = SavePolicy(state.checkpointer, self.config.save_every_loops,
                                        self.config.save_every_secs,
                                        before_save=state.check_work_dir)
        epochs = actions.Epochs(self.config.steps_per_epoch, target, callbacks, saves,
                                evaluate, eval_every)
        callbacks.on_train_begin()
        profile = profiling.ProfileWindow(profile_steps if state.is_chief else None,
                                          f"{self.config.work_dir}/train")
        with self._watcher, profile, actions.default_actions(
                self.config, state, self.history, self._watcher, callbacks, epochs,
                saves, state.global_step) as after_each_loop:
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
        users = [c for c in callbacks.callbacks if not getattr(c, "installed_by_default", False)]
        saves.save(Trigger.END, state.global_step, force=bool(users))

    def _loop_length(self, step: int, target: int, profile: profiling.ProfileWindow) -> int:
        """`steps_per_loop`, cut at the target, the epoch's end and the profile window."""
        to_epoch_end = self.config.steps_per_epoch - step % self.config.steps_per_epoch
        return min(self.config.steps_per_loop, target - step, to_epoch_end,
                   profile.steps_to_boundary(step) or target)

    def _run(self, trainer: Trainer, iterator: Any, num_steps: int) -> LoopOutput:
        try:
            return trainer.train(iterator, num_steps)
        except InputExhaustedError:
            self.saves.save(Trigger.INPUT_EXHAUSTED, self.state.global_step)
            raise

    def _interrupted(self) -> preemption.Interrupted:
        """Saves the step reached after Ctrl-C when the policy says so; says what it did."""
        step = self.state.global_step
        reason = self.saves.save(Trigger.INTERRUPTED_TWICE if self._watcher.forced
                                 else Trigger.INTERRUPT, step)
        latest = self.state.latest_checkpoint
        if reason is None:
            return preemption.Interrupted(step, latest, True)
        return preemption.Interrupted(step, latest, step_of(latest) == step, reason)


def epochs_to(target: int, steps_per_epoch: int) -> int:
    """How many epochs reach global step `target` (Keras's ``params['epochs']``)."""
    return max(1, math.ceil(target / steps_per_epoch))
