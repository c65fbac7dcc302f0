"""Progress during training: a notebook-aware tqdm bar and TensorBoard scalars."""

from __future__ import annotations

import time
from typing import Any

import tensorflow as tf

from fenwicks import _deadline


class Progress:
    """Reports each loop of `Estimator.train`: the bar and ``work_dir/train`` scalars.

    Args:
        writer: a `tf.summary` writer, e.g. for ``<work_dir>/train``.
        start: the global step training starts at.
        target: the global step it stops at.
        global_batch_size: examples per step, for examples/s.
        verbose: show the tqdm bar. Defaults to True.
        path: where `writer` writes; on ``gs://`` the final flush is a clean-up call
            bounded in time (`fenwicks._deadline`). Defaults to None: unbounded.

    Example:
        >>> writer = tf.summary.create_file_writer(work_dir + '/train')
        >>> with Progress(writer, 0, 100, 128) as progress:
        ...     progress.update(step=10, losses=[0.7] * 10, learning_rate=0.1)
    """

    def __init__(self, writer: Any, start: int, target: int, global_batch_size: int,
                 verbose: bool = True, path: str | None = None) -> None:
        self.global_batch_size = global_batch_size
        self._path = path
        self.step = start
        self._time = time.perf_counter()
        self._writer = writer
        self._bar = None
        if verbose:
            from tqdm.auto import tqdm  # picks the widget bar in notebooks

            self._bar = tqdm(total=target, initial=start, unit="step", dynamic_ncols=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def restart_clock(self) -> None:
        """Excludes compile time or checkpoint saving from the next examples/s."""
        self._time = time.perf_counter()

    def update(self, step: int, losses: Any, learning_rate: float | None) -> float:
        """Records the loop that ended at `step`; returns its examples per second."""
        now = time.perf_counter()
        steps = step - self.step
        rate = steps * self.global_batch_size / max(now - self._time, 1e-9)
        loss = float(losses[-1]) if len(losses) else float("nan")
        # Bounded on gs://: a scalar can flush the writer's queue, and while a checkpoint
        # is written in the background this can be the training thread's first call to
        # meet a storage outage (TensorFlow alone retries for minutes).
        _deadline.run(self._write_scalars, step, loss, rate, learning_rate,
                      what="training summaries", path=self._path)
        if self._bar is not None:
            self._bar.update(steps)
            self._bar.set_postfix(loss=f"{loss:.4f}", ex_per_s=f"{rate:,.0f}")
        self.step, self._time = step, now
        return rate

    def _write_scalars(self, step: int, loss: float, rate: float,
                       learning_rate: float | None) -> None:
        with self._writer.as_default(step=step):
            tf.summary.scalar("loss", loss)
            tf.summary.scalar("examples_per_sec", rate)
            if learning_rate is not None:
                tf.summary.scalar("learning_rate", learning_rate)

    def close(self) -> None:
        # Skipped while storage is down, so the error that stopped training comes first.
        _deadline.run(self._writer.flush, what="training summary flush", path=self._path,
                      best_effort=True)
        if self._bar is not None:
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
