"""Stopping cleanly: SIGTERM (preemption) and Ctrl-C (SIGINT, a notebook's stop button)
end training at the next step boundary, with the steps done saved.

Colab and Kaggle end a session, and preemptible TPU VMs and GPUs are reclaimed, with
SIGTERM followed by SIGKILL a little later. While `Estimator.train` runs, SIGTERM sets a
flag that the engine's training loop reads (`PreemptionWatcher.flag`, a host bool; an
engine that reads it inside its compiled loop mirrors it into its own variable,
`PreemptionWatcher.follow`: the TensorFlow engine, before every step; the JAX engine reads
the host bool between blocks); the loop returns early,
the estimator saves the steps done and raises `Preempted` (a `SystemExit`, so a script
exits without a traceback, with status 143 as after an unhandled SIGTERM).

Ctrl-C in a terminal and the stop button of Jupyter, Colab and Kaggle send SIGINT, which
Python turns into `KeyboardInterrupt`. Left alone, that exception could only be raised
when a compiled call returns: with the default of one call per epoch, after up to a whole
epoch. While `train` runs, SIGINT instead sets the same flag: the loop stops after the
step in progress, the estimator saves it (when saving is quick) and raises `Interrupted`,
a `KeyboardInterrupt` that says which step was saved. Step counter, input position and
weights are advanced together inside the compiled step, so whatever stops training, they
agree, and the next `train` continues as if nothing had happened. A second Ctrl-C raises
`KeyboardInterrupt` at once (an evaluation or a save in progress is abandoned; the
work_dir keeps its previous checkpoint). The previous SIGINT handler is put back when
`train` returns; one that ignores SIGINT, or a handler of the user's, is left in charge.

Why not `tf.distribute.experimental.PreemptionCheckpointHandler`: it checks for the
signal only between calls of the function it wraps, and Fenwicks runs `steps_per_loop`
steps per call (often an epoch): the grace period could run out inside one call. It also
restores the checkpoint itself, bypassing Fenwicks' model check and corrupt-checkpoint
fallback, and exits the process from inside. A Python signal handler cannot run while
the main thread is inside a compiled call either, so the signal is also written to a
wakeup pipe (`signal.set_wakeup_fd`) that a small thread watches and turns into the
flag at once. Where a wakeup fd is already set (an asyncio event loop, e.g. a Jupyter
kernel's), the thread passes every byte on to it, so its owner still sees its signals;
should the pipe be unavailable, the Python handler still sets the flag when the current
compiled call returns. The pipe and its thread are made once per process (`_Wakeups`)
and serve every `train` call: starting a thread per call cost more than a small
model's compiled loop of ten steps does on a loaded machine.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

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


class Interrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C (SIGINT) at a step boundary.

    The estimator in memory is consistent (weights, optimizer, step, input position):
    calling `train` again continues exactly where it stopped, with the same input_fn or
    a new one.

    Attributes:
        step: the global step training stopped at.
        checkpoint: the work_dir's latest checkpoint afterwards (None if there is none).
        saved: True if `checkpoint` holds `step`; False if the steps since it were not
            saved (a second Ctrl-C, or saving takes long): they are only in memory.

    Examples:
        >>> import tempfile
        >>> X, y = np.random.rand(10, 4).astype('float32'), np.arange(10) % 3
        >>> model_func = fw.train.get_clf_model_func(lambda: keras.Sequential(
        ...     [keras.Input((4,)), keras.layers.Dense(3, kernel_initializer='zeros')]),
        ...     fw.train.sgd_optimizer(0.1))
        >>> train_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'])
        >>> est = fw.train.get_tpu_estimator(2, model_func, tempfile.mkdtemp(), trn_bs=4,
        ...                                  val_bs=4, verbose=False)
        >>> import signal
        >>> class CtrlC(keras.callbacks.Callback):   # presses Ctrl-C after an epoch
        ...     def on_epoch_end(self, epoch, logs=None):
        ...         signal.raise_signal(signal.SIGINT)
        >>> try:
        ...     est.train(train_fn, max_steps=10_000, callbacks=[CtrlC()])
        ... except fw.train.Interrupted as stop:
        ...     print(stop.step, stop.saved)
        2 True
    """

    def __init__(self, step: int, checkpoint: str | None, saved: bool,
                 reason: str = "") -> None:
        super().__init__(step, checkpoint, saved, reason)
        self.step, self.checkpoint, self.saved, self._reason = step, checkpoint, saved, reason

    def __str__(self) -> str:
        if self.saved:
            where = f"saved to {self.checkpoint}"
        else:
            where = (f"not saved ({self._reason}); work_dir's latest checkpoint is "
                     f"{self.checkpoint or 'none'}")
        return (f"training interrupted at step {self.step}, {where}. The estimator is "
                "consistent: call train() again to continue exactly where it stopped")


def keeps_ctrl_c(method: Callable[..., Any]) -> Callable[..., Any]:
    """Decorates `method` so a Ctrl-C during it is raised, even one Python swallowed.

    Python raises `KeyboardInterrupt` wherever the main thread happens to be. Inside a
    garbage-collector callback or a ``__del__`` (JAX registers a gc callback;
    TensorFlow's resources have finalizers) it is printed as "Exception ignored" and lost,
    and the call goes on as if nothing was pressed. While `method` runs (outside
    `train`, whose watcher owns SIGINT), a handler notes the signal; if `method` then
    returns normally, the `KeyboardInterrupt` is raised on its way out.

    Examples:
        >>> class Estimator:
        ...     @keeps_ctrl_c
        ...     def evaluate(self, input_fn): ...
    """
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread() or \
                not _own_sigint(signal.getsignal(signal.SIGINT)):
            return method(*args, **kwargs)  # a handler of the user's (or train's) rules
        pressed: list[int] = []

        def note(signum: int, frame: Any) -> None:
            pressed.append(signum)
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGINT, note)
        try:
            result = method(*args, **kwargs)
        finally:
            signal.signal(signal.SIGINT, previous)
        if pressed:  # raised where Python dropped it; the call's result is not trusted
            raise KeyboardInterrupt(f"interrupted during {method.__name__}")
        return result

    return wrapper


def _own_sigint(handler: Any) -> bool:
    """Whether Fenwicks may take SIGINT over: only from Python's (or the OS's) default."""
    return handler in (signal.default_int_handler, signal.SIG_DFL)


class _Wakeups:
    """The process's one wakeup pipe and the thread that reads it, made on first use.

    While a `PreemptionWatcher` is entered, the pipe is the signal wakeup fd and the
    thread hands each signal byte to every entered watcher (and on to the wakeup fd
    that was set before, an event loop's). Between `train` calls the pipe stays open and
    the thread waits on it, idle: no signal byte reaches it then.
    """

    def __init__(self) -> None:
        self._pid = -1
        self._pipe: tuple[int, int] | None = None
        self._watchers: list[PreemptionWatcher] = []  # entered, innermost last
        self._flushes: list[threading.Event] = []  # `flush` calls waiting for the reader
        self._lock = threading.Lock()

    def write_end(self) -> int | None:
        """The pipe's write end (made, with its thread, on first use in this process);
        None if no pipe can be made."""
        if self._pid != os.getpid():  # first use, or a forked child: the thread is not here
            try:
                read_end, write_end = os.pipe()
            except OSError:
                return None
            os.set_blocking(write_end, False)
            self._pipe, self._pid, self._watchers = (read_end, write_end), os.getpid(), []
            threading.Thread(target=self._read, args=(read_end,), daemon=True,
                             name="fenwicks-preemption").start()
        return self._pipe[1] if self._pipe else None

    def add(self, watcher: PreemptionWatcher) -> None:
        with self._lock:
            self._watchers.append(watcher)

    def remove(self, watcher: PreemptionWatcher) -> None:
        """Stops handing bytes to `watcher`, once the reader has handed it every byte
        written before: a signal that came while it was entered reaches it, never the
        watcher entered next (the next `train` call would stop for a stale SIGTERM)."""
        self._flush()
        with self._lock:
            if watcher in self._watchers:
                self._watchers.remove(watcher)

    def _flush(self) -> None:
        if self._pipe is None or self._pid != os.getpid():
            return
        done = threading.Event()
        with self._lock:
            self._flushes.append(done)
        try:
            os.write(self._pipe[1], bytes([_FLUSH]))
        except OSError:  # the pipe is full: the reader is behind anyway; do not wait
            with self._lock:
                self._flushes.remove(done)
            return
        done.wait(1.0)

    def _read(self, read_end: int) -> None:
        while True:
            try:
                data = os.read(read_end, 64)
            except OSError:
                return
            if not data:
                return
            flushes = data.count(_FLUSH)
            data = data.replace(bytes([_FLUSH]), b"")
            with self._lock:
                watchers = list(self._watchers)
            forward = watchers[0].forward if watchers else -1
            if data and forward != -1:  # an event loop's wakeup fd: it gets its bytes too
                with contextlib.suppress(OSError):
                    os.write(forward, data)
            for watcher in watchers:
                watcher.on_wakeup(data)
            with self._lock:
                done, self._flushes = self._flushes[:flushes], self._flushes[flushes:]
            for event in done:
                event.set()


class HostFlag:
    """A `PreemptionWatcher`'s stop request as a Python bool, read like a variable
    (``numpy()``). A loop that looks between compiled calls, on the host, reads this:
    reading a TensorFlow variable is an eager op, about 0.2 ms a read while tf.data
    feeds the same process (0.40 to 0.46 ms of the main thread's CPU a step of the JAX
    engine's one-step blocks in `benchmarks/jax_engine.py`, under load), where this is
    an attribute.

    Examples:
        >>> import os, signal
        >>> watcher = PreemptionWatcher()
        >>> with watcher:
        ...     print(watcher.flag.numpy())   # read between blocks: stop when True
        ...     os.kill(os.getpid(), signal.SIGTERM)   # what a preempted VM gets
        ...     print(watcher.flag.numpy())
        False
        True
    """

    def __init__(self, watcher: PreemptionWatcher) -> None:
        self._watcher = watcher

    def numpy(self) -> bool:
        return self._watcher.requested or self._watcher.interrupted


_FLUSH = 0xFF  # a byte no signal number takes: `_Wakeups.remove` waits for it to be read
_WAKEUPS = _Wakeups()


class PreemptionWatcher:
    """While entered (from the main thread), SIGTERM and SIGINT set `flag` (and every
    variable that `follow` gave it).

    `requested` tells SIGTERM (preemption), `interrupted` Ctrl-C. A second SIGINT
    raises `KeyboardInterrupt` at once. Entering costs no thread: the process's one
    wakeup pipe and its reader (`_Wakeups`) serve every watcher.

    Attributes:
        flag: the stop request as a `HostFlag` (``flag.numpy()`` -> bool), for a loop
            that looks between compiled calls, on the host.
        forward: the wakeup fd that was set before this watcher's (an event loop's),
            which gets every signal byte too; -1 for none.

    Examples:
        >>> import os, signal
        >>> stop = tf.Variable(False)   # a compiled loop reads it before each step
        >>> watcher = PreemptionWatcher()
        >>> watcher.follow(stop)
        >>> with watcher:
        ...     os.kill(os.getpid(), signal.SIGTERM)   # what a preempted VM gets
        ...     print(watcher.requested, watcher.interrupted, bool(stop.numpy()))
        True False True
    """

    def __init__(self) -> None:
        self.flag = HostFlag(self)  # derived from requested/interrupted
        self._followers: list[Any] = []  # engines' variables, set with the flag
        self.requested = False
        self.interrupted = False
        self.forward = -1  # the wakeup fd that was set before ours (-1: none)
        self._sigints = 0
        self._previous: dict[int, Any] = {}
        self._restore_fd: int | None = None  # the wakeup fd to put back on exit

    def __enter__(self) -> PreemptionWatcher:
        self.requested = self.interrupted = False
        self._sigints = 0
        self._set_followers(False)
        if threading.current_thread() is not threading.main_thread():
            return self  # signal handlers can only be installed from the main thread
        self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_signal)
        if _own_sigint(signal.getsignal(signal.SIGINT)):
            self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_signal)
        self._watch_wakeup_fd()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._restore_handlers()
        if self._restore_fd is not None:
            signal.set_wakeup_fd(self._restore_fd)
            _WAKEUPS.remove(self)
            self._restore_fd = None

    def _request(self) -> None:
        if not self.requested:
            logger.warning("fenwicks: SIGTERM received; saving at the next step boundary")
        self.requested = True
        self._set_followers(True)

    def _interrupt(self) -> None:
        if not self.interrupted:
            logger.warning("fenwicks: interrupted; stopping after the step in progress "
                           "(interrupt again to stop at once, without saving)")
        self.interrupted = True
        self._set_followers(True)

    def follow(self, variable: Any) -> None:
        """Sets `variable` (anything with ``assign(bool)``: an engine's variable that its
        compiled loop reads) whenever the flag changes, from now on.

        Examples:
            >>> stop = tf.Variable(True)
            >>> watcher = PreemptionWatcher()
            >>> watcher.follow(stop)   # stop.assign(True) at SIGTERM or Ctrl-C
            >>> bool(stop.numpy())   # set to the flag at once: no stop requested
            False
        """
        variable.assign(self.requested or self.interrupted)
        self._followers.append(variable)

    def _set_followers(self, value: bool) -> None:
        for variable in self._followers:
            variable.assign(value)

    @property
    def forced(self) -> bool:
        """True after a second Ctrl-C: stop at once, without saving."""
        return self._sigints > 1

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGTERM:
            self._request()
            return
        self._sigints += 1
        if self._sigints > 1:
            # A second Ctrl-C: stop at once. The KeyboardInterrupt lands wherever the main
            # thread is, perhaps inside `__exit__` between two handlers: they are put back
            # first, so none of ours outlives the watcher (a later `train` would find a
            # handler not Python's and leave Ctrl-C to it).
            self._restore_handlers()
            raise KeyboardInterrupt
        self._interrupt()

    def _restore_handlers(self) -> None:
        """Puts back the SIGTERM and SIGINT handlers found on entry (once)."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def _watch_wakeup_fd(self) -> None:
        write_end = _WAKEUPS.write_end()
        if write_end is None:
            return
        try:
            previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        except ValueError:
            return
        # A watcher entered inside another (a callback that trains a second estimator):
        # the pipe is already the wakeup fd, and the bytes already reach every watcher.
        self.forward = -1 if previous == write_end else previous
        self._restore_fd = previous
        _WAKEUPS.add(self)

    def on_wakeup(self, data: bytes) -> None:
        """Signal bytes read from the wakeup pipe (by `_Wakeups`' thread)."""
        if signal.SIGTERM in data:
            self._request()
        if signal.SIGINT in data and signal.SIGINT in self._previous:
            self._interrupt()
