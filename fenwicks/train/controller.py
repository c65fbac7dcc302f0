"""The outer training loop, as plain as Orbit's `Controller.train`: how many steps,
``trainer.train(n)``, then the actions.

`Controller.run` opens one `train` call's `Run`; ``run.train(to)`` trains to a global
step. `Estimator.train_and_evaluate` alternates at the top, as Orbit's
``train_and_evaluate`` does: ``run.train`` to the next evaluation, ``run.save``, the
estimator's own `evaluate`, ``run.end_epoch`` with the ``val_*`` logs, in a loop.

What happens around each loop is one ordered list (`default_actions`, an
`actions.ActionList`): the built-in entries, the user's Keras callbacks, the entries that
stop and save. The compiled inner loop and its counters are the `Trainer`'s
(`trainer.py`), the model and counters `state.py`'s, preemption signals `preemption.py`'s.

Checkpoints have one owner, the run's `checkpointer.Checkpointer`, and one caller: the
controller holds a `save_policy.SavePolicy` over it for each `train` call, and every
reason to save (every `save_every_loops` loops or `save_every_secs`, each evaluation,
SIGTERM, Ctrl-C when quick, input exhausted, the end) goes through its `save`.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import keras

from fenwicks.train import actions, conditions, preemption, profiling
from fenwicks.train.callbacks import EpochLog
from fenwicks.train.checkpointing import step_of
from fenwicks.train.history import History
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.progress import ProgressBar, TrainSummaries
from fenwicks.train.run_state import RunState
from fenwicks.train.runner import InputExhaustedError, LoopOutput, Trainer
from fenwicks.train.save_policy import SavePolicy, Trigger

if TYPE_CHECKING:
    from fenwicks.train.engines import Engine

logger = logging.getLogger("fenwicks")


def default_actions(config: EstimatorConfig, state: RunState, history: History,
                    watcher: preemption.PreemptionWatcher,
                    callbacks: Sequence[keras.callbacks.Callback], saves: SavePolicy,
                    start: int, target: int,
                    ) -> tuple[actions.ActionList, actions.EndEpoch, conditions.AtEpochEnd]:
    """The one list of a `train` call, in the order every hook runs (an entry sees the
    state the ones before it left), and its epoch end (`Run.end_epoch` calls it after an
    evaluation) with its condition (which `Run.train` holds at an evaluation)."""
    bar = [ProgressBar(start, target)] if config.verbose else []
    epoch_loss = actions.EpochLoss()
    at_epoch_end = conditions.AtEpochEnd(config.steps_per_epoch)
    before = [
        actions.RecordHistory(history),  # per-step losses, rates, examples/s
        TrainSummaries(state.summary_writer("train"), path=f"{config.work_dir}/train"),
        *bar,
        # The epoch log in work_dir, before the user's callbacks replay or read it.
        actions.KerasCallback(EpochLog(config.work_dir, lambda: state.global_step,
                                       writes=state.is_chief)),
    ]
    user = [actions.KerasCallback(callback) for callback in callbacks]
    after: list[actions.Action] = [
        # After the callbacks: Keras's TerminateOnNaN, called first, makes it a quiet stop.
        # Nothing after it runs for a non-finite loss, so nothing is saved for that loop.
        actions.StopOnNonFiniteLoss(state),
        actions.CheckPreemption(watcher, state, saves),  # SIGTERM saves; Ctrl-C stops
        actions.Heartbeat(state),  # the work_dir lock's
        actions.PeriodicSave(saves),  # every save_every_loops loops or save_every_secs
        epoch_loss,
    ]
    # Last: ``on_epoch_end`` sees what every entry did with the epoch's last loop.
    end_epoch = actions.EndEpoch(config.steps_per_epoch, epoch_loss)
    after.append(actions.ConditionalAction(at_epoch_end, end_epoch))
    entries = end_epoch.actions = actions.ActionList(before, user, after)
    return entries, end_epoch, at_epoch_end


class Run:
    """One `train` call's loops, from `Controller.run`: `train` to a step, and, at the
    top of `train_and_evaluate`, `save` and `end_epoch` around each evaluation.

    Attributes:
        target: the global step the `train` call stops at.
        actions: the call's `actions.ActionList`.
    """

    def __init__(self, controller: Controller, trainer: Trainer, iterator: Any, target: int,
                 entries: actions.ActionList, end_epoch: actions.EndEpoch,
                 at_epoch_end: conditions.AtEpochEnd,
                 profile: profiling.ProfileWindow) -> None:
        self._controller, self._trainer, self._iterator = controller, trainer, iterator
        self.target, self.actions, self._end_epoch = target, entries, end_epoch
        self._profile = profile
        self._at_epoch_end = at_epoch_end
        self._model = controller.state.spec.model

    @property
    def step(self) -> int:
        return self._controller.state.global_step

    @property
    def stopped(self) -> bool:
        """The target is reached, or a callback set ``model.stop_training``."""
        return self.step >= self.target or bool(self._model.stop_training)

    def train(self, to: int, evaluation_follows: bool = False) -> None:
        """Trains to global step `to` (at most `target`), or until a callback stops.

        Args:
            to: the global step to reach.
            evaluation_follows: the epoch that ends at `to` ends after the evaluation
                (`end_epoch`), so that its logs carry the ``val_*`` metrics.
        """
        to = min(to, self.target)
        config, entries = self._controller.config, self.actions
        spe = config.steps_per_epoch
        self._at_epoch_end.held = to if evaluation_follows else None
        step = self.step
        while step < to and not self._model.stop_training:
            num_steps = self._loop_length(step, to)
            if step % spe == 0 or self._end_epoch.losses.count == 0:
                entries.on_epoch_begin(step // spe)
            entries.on_loop_begin(step)
            self._profile.update(step)  # outside the timed compiled call
            output = self._controller.run_loop(self._trainer, self._iterator, num_steps)
            step = output.step
            self._profile.update(step)
            entries(output)

    def save(self, trigger: Trigger) -> str | None:
        """Tells the save policy of `trigger` at the step reached (`SavePolicy.save`)."""
        return self._controller.saves.save(trigger, self.step)

    def end_epoch(self, logs: dict[str, float]) -> None:
        """Ends the epoch at the step reached, with `logs` (e.g. ``val_loss``) beside the
        mean training loss: ``on_epoch_end`` of every entry, in order."""
        self._end_epoch.end(self.step, logs)

    @property
    def logs(self) -> dict[str, float]:
        """The last ended epoch's logs."""
        return self._end_epoch.logs

    def _loop_length(self, step: int, to: int) -> int:
        """`steps_per_loop`, cut at `to`, the epoch's end and the profile window."""
        spe = self._controller.config.steps_per_epoch
        return min(self._controller.config.steps_per_loop, to - step, spe - step % spe,
                   self._profile.steps_to_boundary(step) or to)


class Controller:
    """Runs training loops for one `RunState`.

    Args:
        config: the estimator's `EstimatorConfig`.
        state: the run's `RunState` (built).
        record: the `History` to append per-step losses, rates and learning rates to.
        engine: the `fenwicks.train.engines.Engine` whose trainer runs the compiled loop.

    Examples:
        >>> import tempfile
        >>> from fenwicks.train.options import EstimatorConfig
        >>> config = EstimatorConfig(steps_per_epoch=4, work_dir=tempfile.mkdtemp(),
        ...                          train_batch_size=8, eval_batch_size=4,
        ...                          predict_batch_size=4, steps_per_loop=2,
        ...                          precision='float32', num_replicas=1, verbose=False)
        >>> X = np.ones((16, 3), 'float32')
        >>> y = X.sum(1, keepdims=True)   # 3: a zero model's squared error is 9
        >>> from fenwicks.train import engines
        >>> from fenwicks.train.history import History
        >>> from fenwicks.train.reference.model import linear_model_func
        >>> train_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'])
        >>> with engines.use('reference') as engine:   # NumPy SGD: the same controller
        ...     state = engine.RunState(linear_model_func(3, kernel_initializer='zeros'),
        ...                             config, fw.accel.current())
        ...     inputs = engine.InputManager(config, fw.accel.current())
        ...     probe = inputs.probe(train_fn, 'train')
        ...     state.build(probe.features_spec, probe.params)
        ...     controller = Controller(config, state, History(), engine)
        ...     with controller.run(inputs.train_iterator(train_fn, 0), 4, []) as run:
        ...         run.train(run.target)   # two loops of 2 steps, a checkpoint at the end
        >>> controller.history.steps, np.round(controller.history.losses, 4).tolist()
        ([1, 2, 3, 4], [9.0, 0.36, 0.0144, 0.0006])
    """

    def __init__(self, config: EstimatorConfig, state: RunState, record: History,
                 engine: Engine) -> None:
        self.config = config
        self.state = state
        self.history = record
        self._engine = engine
        self._watcher = preemption.PreemptionWatcher()
        self._trainer: Trainer | None = None
        self.saves: SavePolicy | None = None  # the current train call's

    def _get_trainer(self) -> Trainer:
        if self._trainer is None:
            self._trainer = self._engine.trainer(self.config, self.state, self._watcher)
        return self._trainer

    @contextlib.contextmanager
    def run(self, iterator: Any, target: int,
            callbacks: Sequence[keras.callbacks.Callback],
            profile_steps: tuple[int, int] | None = None) -> Iterator[Run]:
        """One `train` call to global step `target`, with the user's `callbacks` (their
        model and params set); the body trains with the `Run` it is given.

        On the way out: ``on_train_end`` and the end-of-train save, forced when the list
        has a user part (a callback, e.g. EarlyStopping's ``restore_best_weights``, may
        have changed the weights of a saved step). A stop after a non-finite loss that a
        callback asked for ends quietly, saving nothing; Ctrl-C becomes `Interrupted`.
        """
        trainer, state = self._get_trainer(), self.state
        state.spec.model.stop_training = False
        saves = self.saves = SavePolicy(state.checkpointer, self.config.save_every_loops,
                                        self.config.save_every_secs,
                                        before_save=state.check_work_dir)
        profile = profiling.ProfileWindow(profile_steps if state.is_chief else None,
                                          f"{self.config.work_dir}/train",
                                          self._engine.profiler)
        with self._watcher, profile:
            entries, end_epoch, at_epoch_end = default_actions(self.config, state, self.history,
                                                 self._watcher, callbacks, saves,
                                                 state.global_step, target)
            try:
                entries.on_train_begin()
                yield Run(self, trainer, iterator, target, entries, end_epoch, at_epoch_end,
                          profile)
                if not entries.user:
                    # Nothing after the last loop changes the weights: the end-of-train
                    # checkpoint is written while the summaries flush (Trigger.LAST_LOOP).
                    saves.save(Trigger.LAST_LOOP, state.global_step)
            except actions.StoppedOnNonFiniteLoss:
                return  # a callback (TerminateOnNaN) asked to stop: nothing saved
            except KeyboardInterrupt:
                raise self._interrupted() from None
            finally:
                entries.close()  # flushes the summaries, closes the bar
        entries.on_train_end(end_epoch.logs)
        # After on_train_end: a callback may have changed the weights (EarlyStopping's
        # restore_best_weights); the checkpoint then holds what the callbacks left. With
        # no callbacks, the write started above and this waits for it.
        saves.save(Trigger.END, state.global_step, force=bool(entries.user))

    def run_loop(self, trainer: Trainer, iterator: Any, num_steps: int) -> LoopOutput:
        """One compiled loop; running out of input saves the steps that did run."""
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
