"""Progress during training, as entries of the action list called after each compiled
loop (see `fenwicks.train.actions`): a notebook-aware tqdm bar and TensorBoard scalars. Both read
the loop's `LoopOutput`, so the bar, the scalars and `History` show the same numbers.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from fenwicks import _deadline
from fenwicks.train.actions import Action
from fenwicks.train.trainer import LoopOutput


class TrainSummaries(Action):
    """An action: each loop's last loss, examples/s and learning rate as TensorBoard
    scalars (``<work_dir>/train``), at the loop's last global step.

    Args:
        writer: a `tf.summary` writer, e.g. for ``<work_dir>/train``.
        path: where `writer` writes; on ``gs://`` the final flush is a clean-up call
            bounded in time (`fenwicks._deadline`). Defaults to None: unbounded.

    Example:
        >>> summaries = TrainSummaries(tf.summary.create_file_writer(work_dir + '/train'))
        >>> summaries(trainer.train(iterator, 100))
    """

    def __init__(self, writer: Any, path: str | None = None) -> None:
        self._writer, self._path = writer, path
        self._write = _scalar_writer(writer)

    def __call__(self, output: LoopOutput) -> None:
        # Bounded on gs://: a scalar can flush the writer's queue, and while a checkpoint
        # is written in the background this can be the training thread's first call to
        # meet a storage outage (TensorFlow alone retries for minutes).
        learning_rate = output.learning_rate
        values = np.array([output.last_loss, output.examples_per_sec,
                           0.0 if learning_rate is None else learning_rate], np.float32)
        _deadline.run(self._write, tf.constant(output.step, tf.int64), values,
                      learning_rate is not None, what="training summaries", path=self._path)

    def close(self) -> None:
        # Skipped while storage is down, so the error that stopped training comes first.
        _deadline.run(self._writer.flush, what="training summary flush", path=self._path,
                      best_effort=True)


class ProgressBar(Action):
    """An action: a notebook-aware tqdm bar over global steps, with the loss and
    examples/s of the last loop.

    Args:
        start: the global step training starts at.
        target: the global step it stops at.

    Example:
        >>> bar = ProgressBar(0, 1000)
        >>> bar(trainer.train(iterator, 100))
    """

    def __init__(self, start: int, target: int) -> None:
        from tqdm.auto import tqdm  # picks the widget bar in notebooks

        self._bar = tqdm(total=target, initial=start, unit="step", dynamic_ncols=True)

    def __call__(self, output: LoopOutput) -> None:
        self._bar.update(output.step - output.start)
        self._bar.set_postfix(loss=f"{output.last_loss:.4f}",
                              ex_per_s=f"{output.examples_per_sec:,.0f}")

    def close(self) -> None:
        self._bar.close()


# One compiled writer per summary writer, kept across `train` calls: each call's
# TrainSummaries would otherwise trace it again.
_SCALAR_WRITERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _scalar_writer(writer: Any) -> Callable[..., None]:
    """``write(step, [loss, examples/s, learning rate], has_learning_rate)``: the three
    scalars in one compiled call, about a tenth of the time of three eager
    ``tf.summary.scalar`` calls, which ran after every loop."""
    if writer in _SCALAR_WRITERS:
        return _SCALAR_WRITERS[writer]

    @tf.function
    def write(step: tf.Tensor, values: tf.Tensor, has_learning_rate: bool) -> None:
        with writer.as_default(step=step):
            tf.summary.scalar("loss", values[0])
            tf.summary.scalar("examples_per_sec", values[1])
            if has_learning_rate:  # a Python bool: one trace with, one without
                tf.summary.scalar("learning_rate", values[2])

    _SCALAR_WRITERS[writer] = write
    return write


def write_eval_summary(writer: Any, step: int, result: dict[str, float],
                       path: str | None = None) -> None:
    """Writes evaluation results as scalars with `writer` (``<work_dir>/eval``).

    A clean-up call: on ``gs://`` (`path`) it gets a few seconds, and a failure is a
    warning; the results were computed and are returned whether or not they are logged.
    """
    def write() -> None:
        with writer.as_default(step=step):
            for name, value in result.items():
                if name != "global_step":
                    tf.summary.scalar(name, value)
        writer.flush()

    _deadline.run(write, what="evaluation summary", path=path, best_effort=True)
