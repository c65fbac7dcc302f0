"""Preemption: SIGTERM stops training at the next step boundary, which is then saved.

Colab and Kaggle end a session, and preemptible TPU VMs and GPUs are reclaimed, with
SIGTERM followed by SIGKILL a little later. While `Estimator.train` runs, SIGTERM sets a
flag that the compiled training loop reads before every step; the loop returns early,
the estimator saves the steps done and raises `Preempted` (a `SystemExit`, so a script
exits without a traceback, with status 143 as after an unhandled SIGTERM).

Why not `tf.distribute.experimental.PreemptionCheckpointHandler`: it checks for the
signal only between calls of the function it wraps, and Fenwicks runs `steps_per_loop`
steps per call (often an epoch): the grace period could run out inside one call. It also
restores the checkpoint itself, bypassing Fenwicks' model check and corrupt-checkpoint
fallback, and exits the process from inside. A Python signal handler cannot run while
the main thread is inside a compiled call either, so the signal is also written to a
wakeup pipe (`signal.set_wakeup_fd`) that a small thread watches and turns into the
flag at once. Where the wakeup fd is taken (an asyncio loop, as in Jupyter) the flag is
set when the current loop returns instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from typing import Any

import tensorflow as tf

logger = logging.getLogger("fenwicks")

EXIT_STATUS = 128 + signal.SIGTERM  # what a shell reports for a process ended by SIGTERM


class Preempted(SystemExit):
    """Training stopped on SIGTERM after saving its last completed step.

    Attributes:
        step: the global step saved.
        checkpoint: the checkpoint written.
    """

    def __init__(self, step: int, checkpoint: str | None) -> None:
        super().__init__(EXIT_STATUS)
        self.step, self.checkpoint = step, checkpoint

    def __str__(self) -> str:
        return (f"preempted (SIGTERM): step {self.step} saved to {self.checkpoint}; "
                "run the same code again to resume")


class PreemptionWatcher:
    """While entered (from the main thread), SIGTERM sets `flag` and `requested`.

    Example:
        >>> with PreemptionWatcher() as watcher:
        ...     losses = loop(iterator, num_steps, watcher.flag)
        ...     if watcher.requested: ...
    """

    def __init__(self) -> None:
        with tf.device("CPU:0"):
            self.flag = tf.Variable(False, trainable=False, name="preempted")
        self.requested = False
        self._previous: Any = None
        self._pipe: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PreemptionWatcher:
        self.requested = False
        self.flag.assign(False)
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be installed from the main thread
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        self._watch_wakeup_fd()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None
        if self._pipe is not None:
            signal.set_wakeup_fd(-1)
            read_end, write_end = self._pipe
            os.close(write_end)  # the watcher thread reads EOF and ends
            if self._thread is not None:
                self._thread.join(timeout=5)
            os.close(read_end)
            self._pipe = self._thread = None

    def _request(self) -> None:
        if not self.requested:
            logger.warning("fenwicks: SIGTERM received; saving at the next step boundary")
        self.requested = True
        self.flag.assign(True)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._request()

    def _watch_wakeup_fd(self) -> None:
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        with contextlib.suppress(ValueError):
            previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
            if previous == -1:
                self._pipe = (read_end, write_end)
                self._thread = threading.Thread(target=self._read_wakeups, daemon=True,
                                                name="fenwicks-preemption")
                self._thread.start()
                return
            signal.set_wakeup_fd(previous)  # someone else's (asyncio): leave it to them
        os.close(read_end)
        os.close(write_end)

    def _read_wakeups(self) -> None:
        read_end = self._pipe[0] if self._pipe else -1
        while True:
            try:
                data = os.read(read_end, 64)
            except OSError:
                return
            if not data:
                return
            if signal.SIGTERM in data:
                self._request()
