"""fenwicks.train.profiling: the profile_steps checks and the `ProfileWindow` that starts
and stops TensorFlow's profiler between compiled loops (a real profile, in-process)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf

from fenwicks.train import engines, profiling

PROFILER = engines.current().profiler  # the TensorFlow engine's, in this process


def test_profile_steps_are_two_ordered_global_steps():
    assert profiling.check_profile_steps(None) is None
    steps = profiling.check_profile_steps([np.int64(10), 20])
    assert steps == (10, 20) and all(type(s) is int for s in steps)
    for bad in [(5, 5), (6, 2), (-1, 3), (1.0, 3), (1, 2, 3), (True, 3), "0:10", 10]:
        with pytest.raises(ValueError, match=r"profile_steps=.* must be two global steps"):
            profiling.check_profile_steps(bad)


def test_the_window_must_lie_in_the_train_call():
    profiling.check_in_range(None, 0, 10)
    profiling.check_in_range((100, 110), 100, 110)
    # from 100 to 110, a window of 10 steps at 95: the example keeps its length, 10
    with pytest.raises(ValueError, match=r"runs from global step 100 to 110; e.g. "
                                         r"profile_steps=\(100, 110\)"):
        profiling.check_in_range((95, 105), 100, 110)
    with pytest.raises(ValueError, match=r"e.g. profile_steps=\(100, 103\)"):  # 3 to go
        profiling.check_in_range((101, 120), 100, 103)


def test_the_controller_cuts_its_loops_at_the_windows_ends():
    window = profiling.ProfileWindow((20, 30), "unused", PROFILER)
    assert [window.steps_to_boundary(s) for s in (0, 19, 20, 25, 30, 31)] == [
        20, 1, 10, 5, None, None]
    assert profiling.ProfileWindow(None, "unused", PROFILER).steps_to_boundary(0) is None


def test_a_window_writes_a_profile_of_its_steps(tmp_path):
    logdir = str(tmp_path / "train")
    with profiling.ProfileWindow((20, 30), logdir, PROFILER) as window:
        assert window.update(10) is False and not window.running  # before the window
        assert window.update(20) is True and window.running       # started at a
        tf.reduce_sum(tf.ones([8, 8]))
        assert window.update(25) is False and window.running      # inside: nothing
        assert window.update(30) is True and not window.running   # stopped at b
    traces = tf.io.gfile.glob(f"{logdir}/plugins/profile/*/*.xplane.pb")
    assert len(traces) == 1 and tf.io.gfile.stat(traces[0]).length > 0


def test_a_profiler_that_cannot_start_leaves_training_alone(tmp_path, caplog):
    tf.profiler.experimental.start(str(tmp_path / "someone_else"))  # only one at a time
    try:
        window = profiling.ProfileWindow((0, 10), str(tmp_path / "train"), PROFILER)
        with caplog.at_level(logging.WARNING, logger="fenwicks"):
            assert window.update(0) is False
        assert "could not start the profiler" in caplog.text and "(0, 10)" in caplog.text
        assert window.profile_steps is None and not window.running
        assert window.update(5) is False  # the window is given up, not retried
    finally:
        tf.profiler.experimental.stop()


def test_closing_a_window_that_is_still_open_writes_what_it_recorded(tmp_path):
    logdir = str(tmp_path / "train")
    window = profiling.ProfileWindow((0, 100), logdir, PROFILER)
    window.update(0)
    window.close()  # e.g. training failed at step 40
    assert not window.running
    assert tf.io.gfile.glob(f"{logdir}/plugins/profile/*/*.xplane.pb")
    window.close()  # again: nothing to stop
