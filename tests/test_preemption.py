"""`fenwicks.train.preemption` on its own: SIGTERM sets the flag the compiled loop reads,
even while the main thread is inside a compiled call; the previous handler comes back.

The signals go to this very process, so a fixture installs a harmless SIGTERM handler
first: were the watcher not in place, the signal would land there, not kill pytest.
(tests/test_faults.py proves the whole flow, a SIGTERM'd training process, end to end.)
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import tensorflow as tf

from fenwicks.train import preemption


@pytest.fixture
def fallback_handler():
    """A SIGTERM handler that records the signals the watcher did not take."""
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    yield seen
    signal.signal(signal.SIGTERM, previous)


def test_sigterm_sets_the_flag_and_the_previous_handler_comes_back(fallback_handler):
    before = signal.getsignal(signal.SIGTERM)
    watcher = preemption.PreemptionWatcher()
    with watcher:
        assert not watcher.requested and not bool(watcher.flag.numpy())
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not watcher.requested and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watcher.requested and bool(watcher.flag.numpy())
    assert signal.getsignal(signal.SIGTERM) is before
    assert fallback_handler == []  # the watcher took it
    with watcher:  # entering again starts from a clear flag
        assert not watcher.requested and not bool(watcher.flag.numpy())
    os.kill(os.getpid(), signal.SIGTERM)  # after exit, the previous handler gets it
    time.sleep(0.05)
    assert fallback_handler == [signal.SIGTERM]


def test_the_flag_is_set_while_the_main_thread_is_inside_a_compiled_call(fallback_handler):
    # A Python handler cannot run until the compiled call returns; the wakeup-fd thread
    # must set the flag meanwhile, or this loop would spin for its whole 20 s. The loop
    # reads a variable that follows the watcher, as the tf engine's loop does.
    watcher = preemption.PreemptionWatcher()
    stop = tf.Variable(False, trainable=False)
    watcher.follow(stop)

    @tf.function
    def spin_until_flag(flag):
        start = tf.timestamp()
        return tf.while_loop(lambda i: tf.logical_and(tf.logical_not(flag.read_value()),
                                                      tf.timestamp() - start < 20.0),
                             lambda i: i + 1, [tf.constant(0, tf.int64)])

    with watcher:
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
        start = time.monotonic()
        timer.start()
        spin_until_flag(stop)
        waited = time.monotonic() - start
        timer.join()
    assert watcher.requested and waited < 10, waited


class _Recorder:
    """Anything with ``assign(bool)``: what an engine's stop variable is to the watcher."""

    def __init__(self) -> None:
        self.values: list[bool] = []

    def assign(self, value: bool) -> None:
        self.values.append(bool(value))


def test_a_followed_variable_is_cleared_on_entry_and_set_by_each_request(fallback_handler):
    watcher = preemption.PreemptionWatcher()
    followed = _Recorder()
    watcher.follow(followed)
    assert followed.values == [False]  # takes the flag's value at once
    with watcher:
        assert followed.values == [False, False]  # entering clears it
        os.kill(os.getpid(), signal.SIGTERM)
        _wait_for(lambda: watcher.requested)
        _wait_for(lambda: True in followed.values)
        assert watcher.requested and followed.values[-1] is True
    with watcher:  # a new train call starts clear, the flag and what follows it alike
        assert followed.values[-1] is False and not watcher.flag.numpy()


def _wait_for(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def _wakeup_fd() -> int:
    fd = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(fd)
    return fd


def test_one_pipe_and_thread_serve_every_train_call_and_nested_watchers(fallback_handler):
    """The wakeup pipe and its thread are made once per process, not per `train` call;
    a watcher entered inside another (a callback training a second estimator) leaves the
    outer one watching, and a SIGTERM reaches both."""
    def watcher_threads():
        return [t for t in threading.enumerate() if t.name == "fenwicks-preemption"]

    before = _wakeup_fd()
    for _ in range(3):
        with preemption.PreemptionWatcher():
            pass
    outer, inner = preemption.PreemptionWatcher(), preemption.PreemptionWatcher()
    with outer:
        ours = _wakeup_fd()
        with inner:
            assert _wakeup_fd() == ours
            # Straight into the pipe, as the C signal handler writes: only the thread
            # sees it (no Python handler runs), and it tells both watchers.
            os.write(ours, bytes([signal.SIGTERM]))
            _wait_for(lambda: outer.requested and inner.requested)
        assert _wakeup_fd() == ours  # the outer one still watches
        assert outer.requested and inner.requested and bool(outer.flag.numpy())
    assert len(watcher_threads()) == 1 and ours != before
    assert _wakeup_fd() == before and fallback_handler == []


def test_off_the_main_thread_the_watcher_installs_nothing(fallback_handler):
    before = signal.getsignal(signal.SIGTERM)
    seen = {}

    def enter():
        with preemption.PreemptionWatcher() as watcher:
            seen["handler"] = signal.getsignal(signal.SIGTERM)
            seen["requested"] = watcher.requested

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert seen == {"handler": before, "requested": False}


def test_preempted_exits_like_an_unhandled_sigterm_and_says_how_to_resume():
    err = preemption.Preempted(120, "/runs/a/ckpt-120")
    assert isinstance(err, SystemExit) and err.code == 143 == 128 + signal.SIGTERM
    assert (err.step, err.checkpoint) == (120, "/runs/a/ckpt-120")
    assert str(err) == ("preempted (SIGTERM): step 120 saved to /runs/a/ckpt-120; "
                        "run the same code again to resume")


def test_a_signal_one_call_took_never_reaches_the_next(fallback_handler):
    """The reader thread serves every call: a SIGTERM byte still in its pipe when one
    watcher leaves must reach that watcher, not the next (a spurious preemption)."""
    for _ in range(20):
        with preemption.PreemptionWatcher() as first:
            os.kill(os.getpid(), signal.SIGTERM)
        assert first.requested
        with preemption.PreemptionWatcher() as second:
            time.sleep(0.02)  # time for the reader to hand on anything left in the pipe
            assert not second.requested
    assert fallback_handler == []
