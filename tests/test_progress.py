"""`fenwicks.train.progress` on its own: the TensorBoard scalars as written to disk, and
the tqdm bar, from hand-made `LoopOutput`s."""

from __future__ import annotations

import glob
import math

import numpy as np
import pytest
import tensorflow as tf

from fenwicks.train import progress
from fenwicks.train.tf.trainer import LoopOutput


def _scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under `logdir`: name -> [(step, value)]."""
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(str(logdir / "*tfevents*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                out.setdefault(value.tag, []).append(
                    (event.step, float(tf.make_ndarray(value.tensor))))
    return out


def _output(start, step, losses, learning_rate=None, seconds=1.0, batch=8):
    losses = np.asarray(losses, np.float32)
    return LoopOutput(start, step, losses, learning_rate, seconds,
                      (step - start) * batch / seconds)


def test_summaries_write_the_last_loss_the_rate_and_the_learning_rate(tmp_path):
    summaries = progress.TrainSummaries(tf.summary.create_file_writer(str(tmp_path)))
    # 10 steps of 8 examples in 4 s: 20 examples/s; then 5 steps in 2 s: 20/s.
    summaries(_output(10, 20, [0.9, 0.7], learning_rate=0.5, seconds=4.0))
    summaries(_output(20, 25, [0.6], seconds=2.0))
    summaries.close()
    scalars = _scalars(tmp_path)
    assert scalars["loss"] == [(20, pytest.approx(0.7)), (25, pytest.approx(0.6))]
    assert scalars["examples_per_sec"] == [(20, 20.0), (25, 20.0)]
    assert scalars["learning_rate"] == [(20, 0.5)]  # None: not written


def test_summaries_are_written_in_batches_every_so_often_and_at_the_end(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    summaries = progress.TrainSummaries(writer, every_secs=3600.0)
    for start in range(0, 50, 10):  # five loops of 10 steps, one learning rate missing
        summaries(_output(start, start + 10, [start / 100, start / 10],
                          learning_rate=None if start == 20 else start / 1000))
    writer.flush()
    assert _scalars(tmp_path) == {}  # not yet: an hour has not passed
    summaries.close()
    scalars = _scalars(tmp_path)
    assert scalars["loss"] == [(s + 10, pytest.approx(s / 10)) for s in range(0, 50, 10)]
    assert scalars["learning_rate"] == [(s + 10, pytest.approx(s / 1000))
                                        for s in (0, 10, 30, 40)]
    every_loop = progress.TrainSummaries(writer, every_secs=0.0)
    every_loop(_output(50, 60, [0.5]))
    writer.flush()  # written at once, before close
    assert _scalars(tmp_path)["loss"][-1] == (60, 0.5)


def test_a_loop_without_losses_reports_nan(tmp_path):
    summaries = progress.TrainSummaries(tf.summary.create_file_writer(str(tmp_path)))
    summaries(_output(0, 0, []))
    summaries.close()
    ((step, loss),) = _scalars(tmp_path)["loss"]
    assert step == 0 and math.isnan(loss)


def test_the_bar_starts_at_the_resumed_step_and_shows_the_loss(capsys):
    bar = progress.ProgressBar(start=40, target=100)
    bar(_output(40, 70, [0.25]))
    bar.close()
    err = capsys.readouterr().err
    assert "70/100" in err and "loss=0.2500" in err


def test_eval_summary_writes_every_result_but_the_step(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    progress.write_eval_summary(writer, 30, {"loss": 0.5, "accuracy": 0.75,
                                             "num_examples": 773, "global_step": 30})
    assert _scalars(tmp_path) == {"loss": [(30, 0.5)], "accuracy": [(30, 0.75)],
                                  "num_examples": [(30, 773.0)]}
