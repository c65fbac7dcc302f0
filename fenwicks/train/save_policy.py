"""When a run saves: every reason to save goes through `SavePolicy.save`, the one caller
of `Checkpointer.save` (and `save_and_wait`) during training.

The reasons (`Trigger`) and what each does:

=====================  ==========================================================
``LOOP``               after each compiled loop: saves when ``save_every_loops``
                       loops or ``save_every_secs`` seconds have passed since the
                       last such save
``EVALUATION``         each evaluated step is also a checkpoint
``PREEMPTION``         SIGTERM: the step reached, then training stops
``INTERRUPT``          Ctrl-C: the step reached, unless the last checkpoint took
                       longer than `QUICK_SAVE_SECS` to write (someone pressing
                       stop wants control back, not minutes of upload to a bucket)
``INTERRUPTED_TWICE``  a second Ctrl-C: nothing is saved
``INPUT_EXHAUSTED``    the input ran out: the steps that did run are complete and
                       valid (the loop counted them and the input position together)
``LAST_LOOP``          after the last loop of a `train` call without callbacks
                       (nothing after it changes the weights): written in the
                       background while the call closes (the summaries flush);
                       ``END`` then waits for it
``END``                the end of `train`: written in the calling thread, which
                       waits for it (or for the ``LAST_LOOP`` write)
=====================  ==========================================================

A step already saved is not saved again (`Checkpointer.save`), so triggers that meet at
one step (an evaluation at the end of `train`) write one checkpoint. The policy knows
nothing of loops, callbacks or signals: the controller and its actions say which
trigger happened. Engine-neutral: it only needs a `checkpointer.Checkpointer`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from fenwicks.train.checkpointing import Checkpointer, step_of
from fenwicks.train.conditions import AnyOf, EveryNLoops, EverySeconds

# Ctrl-C saves the step reached unless the last checkpoint took longer than this to write.
QUICK_SAVE_SECS = 10.0


class Trigger(enum.Enum):
    """Why a save is asked for; `SavePolicy.save` decides whether it happens."""

    LOOP = "loop"
    EVALUATION = "evaluation"
    PREEMPTION = "preemption"
    INTERRUPT = "interrupt"
    INTERRUPTED_TWICE = "interrupted twice"
    INPUT_EXHAUSTED = "input exhausted"
    LAST_LOOP = "last loop"
    END = "end"


class SavePolicy:
    """Decides, for each trigger, whether to save, and saves.

    Args:
        checkpointer: the run's `Checkpointer`.
        every_loops: save every this many loops (`Trigger.LOOP`); None: never by count.
            Defaults to None.
        every_secs: save every this many seconds (`Trigger.LOOP`); None: never by time.
            Defaults to None.
        quick_secs: Ctrl-C saves only if the last save took at most this long.
            Defaults to `QUICK_SAVE_SECS`.
        before_save: called before each save; raises to refuse it (the estimator's
            refuses when work_dir was deleted meanwhile). Defaults to None.

    Examples:
        >>> from fenwicks.train import engines
        >>> from fenwicks.train.options import EstimatorConfig
        >>> acc = fw.accel.current()
        >>> config = EstimatorConfig(steps_per_epoch=1, work_dir='run', train_batch_size=4,
        ...                          eval_batch_size=4, predict_batch_size=4, steps_per_loop=1,
        ...                          precision='float32', num_replicas=acc.num_replicas)
        >>> state = engines.current().RunState(fw.train.get_clf_model_func(
        ...     lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]),
        ...     fw.train.sgd_optimizer(0.1)), config, acc)
        >>> state.build(tf.TensorSpec([None, 3], tf.float32), {})   # step 0, nothing restored
        >>> saves = SavePolicy(state.checkpointer, every_loops=2)
        >>> saves.save(Trigger.LOOP, 0)   # one loop since the last save
        'not due'
        >>> saves.save(Trigger.LOOP, 0) is None   # two: saved
        True
        >>> saves.save(Trigger.INTERRUPTED_TWICE, 0)
        'interrupted twice'
        >>> state.latest_checkpoint
        'run/checkpoints/0'
        >>> state.close()
    """

    def __init__(self, checkpointer: Checkpointer, every_loops: int | None = None,
                 every_secs: float | None = None, quick_secs: float = QUICK_SAVE_SECS,
                 before_save: Callable[[], None] | None = None) -> None:
        self.checkpointer = checkpointer
        self._before_save = before_save
        self._quick_secs = quick_secs
        # "When" is a condition object (`fenwicks.train.conditions`), apart from the save.
        self.periodic = AnyOf(*([EveryNLoops(every_loops)] if every_loops else []),
                              *([EverySeconds(every_secs)] if every_secs is not None else []))

    def save(self, trigger: Trigger, step: int, *, force: bool = False) -> str | None:
        """Saves the state of `step` if `trigger` calls for it.

        Args:
            trigger: what happened.
            step: the global step the live state belongs to.
            force: write even if `step` is already saved: at the end of `train`, a
                callback (EarlyStopping's ``restore_best_weights``) may have changed the
                weights of a saved step. Defaults to False.

        Returns:
            None if `step` is saved (written, being written, or already there); else
            why it was not, in words a message can quote (``'not due'``, ``'interrupted
            twice'``, ``'the last checkpoint took 60 s to write; 7 step(s) are only in
            memory'``, ``'interrupted again while saving'``).

        Raises:
            CheckpointWriteError: the checkpoint could not be written (`Checkpointer.save`).
        """
        why_not = self._why_not(trigger, step)
        if why_not is not None:
            return why_not
        if self._before_save is not None:
            self._before_save()  # e.g. the work_dir still there (RunState.check_work_dir)
        try:
            if trigger is Trigger.END:  # `train` waits for it: nothing more to overlap
                self.checkpointer.save_and_wait(step, force=force)
            else:
                self.checkpointer.save(step, force=force)
        except KeyboardInterrupt:
            if trigger is not Trigger.INTERRUPT:
                raise
            return "interrupted again while saving"
        return None

    def _why_not(self, trigger: Trigger, step: int) -> str | None:
        if trigger is Trigger.LOOP:
            return None if self.due() else "not due"
        if trigger is Trigger.INTERRUPTED_TWICE:
            return "interrupted twice"
        seconds = self.checkpointer.last_save_secs or 0.0
        if trigger is Trigger.INTERRUPT and self.agree(seconds > self._quick_secs):
            saved = step_of(self.checkpointer.latest)
            return (f"the last checkpoint took {seconds:.0f} s to write; {step - saved} "
                    "step(s) are only in memory")
        return None

    def due(self) -> bool:
        """Counts a loop; True when a periodic save is due (and restarts both counts)."""
        due = self.periodic()
        # Hosts that save together read their own clocks (every_secs): they agree first.
        if self.agree(due) and not due:
            self.periodic.reset()
            return True
        return due

    def agree(self, flag: bool) -> bool:
        """`flag` as the processes that save together decide it: True on all of them if
        it is on any (`Checkpointer.agree`, a collective); `flag` itself with one writer.
        """
        return self.checkpointer.agree(bool(flag))
