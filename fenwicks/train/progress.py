"""Progress during training, as entries of the action list called after each compiled
loop (see `fenwicks.train.actions`): a notebook-aware tqdm bar and TensorBoard scalars. Both read
the loop's `LoopOutput`, so the bar, the scalars and `History` show the same numbers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from fenwicks import _deadline, _summaries
from fenwicks.train.actions import Action
from fenwicks.train.conditions import EverySeconds
from fenwicks.train.runner import LoopOutput

# How often a `train` call writes its loops' TensorBoard scalars (and at its end).
SUMMARY_SECS = 10.0


class TrainSummaries(Action):
    """An action: each loop's last loss, examples/s and learning rate as TensorBoard
    scalars (``<work_dir>/train``), at the loop's last global step.

    The scalars are written in batches, in one compiled call: every `every_secs` seconds
    and when the `train` call ends (`close`), however it ends. Written after each loop
    they cost a compiled call per loop (a millisecond or more, what a small model's loop
    of ten steps can take on a CPU). TensorBoard shows the same points: the file writer
    keeps events in memory for up to two minutes anyway (``flush_millis``).

    Args:
        writer: a `tf.summary` writer, e.g. for ``<work_dir>/train``.
        path: where `writer` writes; on ``gs://`` each write is bounded in time and the
            final one is a clean-up call (`fenwicks._deadline`). Defaults to None:
            unbounded.
        every_secs: how often the loops' scalars are written during a `train` call.
            Defaults to `SUMMARY_SECS`.

    Examples:
        >>> import glob, tempfile
        >>> from fenwicks.train.runner import LoopOutput
        >>> logdir = tempfile.mkdtemp()
        >>> summaries = TrainSummaries(tf.summary.create_file_writer(logdir))
        >>> summaries(LoopOutput(0, 10, np.full(10, 0.5, 'float32'), learning_rate=0.1,
        ...                      seconds=0.02, examples_per_sec=800.0))  # a loop's output
        >>> summaries.close()     # written (and flushed) by now
        >>> [(event.step, value.tag, round(float(tf.make_ndarray(value.tensor)), 4))
        ...  for path in glob.glob(logdir + '/events.*')
        ...  for event in tf.compat.v1.train.summary_iterator(path)
        ...  for value in event.summary.value]
        [(10, 'loss', 0.5), (10, 'examples_per_sec', 800.0), (10, 'learning_rate', 0.1)]
    """

    def __init__(self, writer: Any, path: str | None = None,
                 every_secs: float = SUMMARY_SECS) -> None:
        self._writer, self._path = writer, path
        self._write = _summaries.scalar_writer(writer)
        self._pending: list[tuple[int, float, float, float | None]] = []
        self._due = EverySeconds(every_secs)

    def __call__(self, output: LoopOutput) -> None:
        self._pending.append((output.step, output.last_loss, output.examples_per_sec,
                              output.learning_rate))
        if self._due():
            # Bounded on gs://: a scalar can flush the writer's queue, and while a
            # checkpoint is written in the background this can be the training thread's
            # first call to meet a storage outage (TensorFlow alone retries for minutes).
            self._write_pending(best_effort=False)

    def close(self) -> None:
        # Skipped while storage is down, so the error that stopped training comes first.
        self._write_pending(best_effort=True)
        _deadline.run(self._writer.flush, what="training summary flush", path=self._path,
                      best_effort=True)

    def _write_pending(self, best_effort: bool) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        rates = [(step, rate) for step, _, _, rate in pending if rate is not None]
        _deadline.run(self._write, np.array([p[0] for p in pending], np.int64),
                      np.array([p[1:3] for p in pending], np.float32).reshape(-1, 2),
                      np.array([step for step, _ in rates], np.int64),
                      np.array([rate for _, rate in rates], np.float32),
                      what="training summaries", path=self._path, best_effort=best_effort)


class ProgressBar(Action):
    """An action: a notebook-aware tqdm bar over global steps, with the loss and
    examples/s of the last loop.

    Args:
        start: the global step training starts at.
        target: the global step it stops at.

    Examples:
        >>> from fenwicks.train.runner import LoopOutput
        >>> bar = ProgressBar(0, 20)   # on stderr: 10/20 [...] loss=0.5000, ex_per_s=800
        >>> bar(LoopOutput(0, 10, np.full(10, 0.5, 'float32'), learning_rate=0.1,
        ...                seconds=0.02, examples_per_sec=800.0))  # a loop's output
        >>> bar.close()
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
