"""`fenwicks.train.progress` on its own: examples/s from a known clock, the TensorBoard
scalars as written to disk, and the tqdm bar."""

from __future__ import annotations

import glob
import math

import numpy as np
import pytest
import tensorflow as tf

from fenwicks.train import progress


def _scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under `logdir`: name -> [(step, value)]."""
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(str(logdir / "*tfevents*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                out.setdefault(value.tag, []).append(
                    (event.step, float(tf.make_ndarray(value.tensor))))
    return out


class _Clock:
    def __init__(self, *times: float) -> None:
        self.times = list(times)

    def __call__(self) -> float:
        return self.times.pop(0)


def test_update_reports_examples_per_second_and_writes_scalars(tmp_path, monkeypatch):
    # Clock: 100 s at start, 104 s after the first loop (10 steps of 8 examples: 20/s),
    # restarted at 110 s (a checkpoint save), 112 s after the next 5 steps (20/s).
    monkeypatch.setattr(progress.time, "perf_counter", _Clock(100.0, 104.0, 110.0, 112.0))
    writer = tf.summary.create_file_writer(str(tmp_path))
    with progress.Progress(writer, start=10, target=25, global_batch_size=8,
                           verbose=False) as bar:
        assert bar.update(step=20, losses=np.array([0.9, 0.7]), learning_rate=0.5) == 20.0
        bar.restart_clock()
        assert bar.update(step=25, losses=[0.6], learning_rate=None) == 20.0
        assert bar.step == 25
    scalars = _scalars(tmp_path)
    assert scalars["loss"] == [(20, pytest.approx(0.7)), (25, pytest.approx(0.6))]
    assert scalars["examples_per_sec"] == [(20, 20.0), (25, 20.0)]
    assert scalars["learning_rate"] == [(20, 0.5)]  # None: not written


def test_a_loop_without_losses_reports_nan(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    with progress.Progress(writer, 0, 5, 4, verbose=False) as bar:
        bar.update(step=0, losses=[], learning_rate=None)
    ((step, loss),) = _scalars(tmp_path)["loss"]
    assert step == 0 and math.isnan(loss)


def test_the_bar_starts_at_the_resumed_step_and_shows_the_loss(tmp_path, capsys):
    writer = tf.summary.create_file_writer(str(tmp_path))
    with progress.Progress(writer, start=40, target=100, global_batch_size=8) as bar:
        bar.update(step=70, losses=[0.25], learning_rate=None)
    err = capsys.readouterr().err
    assert "70/100" in err and "loss=0.2500" in err


def test_eval_summary_writes_every_result_but_the_step(tmp_path):
    writer = tf.summary.create_file_writer(str(tmp_path))
    progress.write_eval_summary(writer, 30, {"loss": 0.5, "accuracy": 0.75,
                                             "num_examples": 773, "global_step": 30})
    assert _scalars(tmp_path) == {"loss": [(30, 0.5)], "accuracy": [(30, 0.75)],
                                  "num_examples": [(30, 773.0)]}
