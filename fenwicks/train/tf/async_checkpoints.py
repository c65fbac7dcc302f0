"""Asynchronous checkpoints: training goes on while a checkpoint's files are written.

A save copies every variable of the checkpoint to host memory in the training thread
(milliseconds: one on-device copy per variable), then a background thread writes a
checkpoint of the copies through a `checkpoint_manager.CheckpointManager` (a compiled
write), with the same keys and object graph as a synchronous save: a checkpoint written
either way restores either way. The new checkpoint is named in the ``checkpoint`` state
file only after its data and index files are complete, so a process killed mid-write
leaves the previous checkpoint as latest. A variable added under the root after the
copies were made (the object graph changed) gets a copy at the next save.

Why not TensorFlow's own ``tf.train.CheckpointOptions(enable_async=True)``: measured on
TensorFlow 2.21 with Keras 3, its second save fails ("tf.function only supports singleton
tf.Variables created on the first call": Keras's `_copy_trackable_to_cpu` creates a new
`tf.Variable` inside TensorFlow's copying `tf.function` on every call). It also swallows a
failed write at `sync()` and reads checkpoints back through its copies. Here the copies
are made once, with `assign` on each save.

One write at a time: a save first waits for the previous write (and raises its error).
`checkpointer.AsyncCheckpointer` drives a `BackgroundWriter`; everything that must see a
complete checkpoint waits through it: the next save, the end of `train`, a restore from
disk, SIGTERM, `close()` and, for writers still running, interpreter exit
(`_wait_at_exit`).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from typing import Any

import keras
import tensorflow as tf

from fenwicks import _tf_internals
from fenwicks.train.tf import checkpoint_manager, checkpoints

logger = logging.getLogger("fenwicks")

_WRITERS: weakref.WeakSet = weakref.WeakSet()  # writers that may have a write running
_EXIT_HOOK: list[bool] = []  # registered once, at the first writer
# How long `wait` gives a writer thread to show it runs: a thread starts in microseconds,
# so one that has not started by then never will (`start` was interrupted before it).
_LAUNCH_GRACE_SECS = 2.0


class UnsupportedAsyncCheckpointError(TypeError):
    """An object in the checkpoint saves state that is not a variable; it cannot be copied."""


def _is_variable(node: Any) -> bool:
    return isinstance(node, (tf.Variable, keras.Variable))


def host_copies(root: tf.train.Checkpoint) -> tuple[tf.train.Checkpoint, list[tuple]]:
    """A checkpoint root like `root` whose variables are written from host copies.

    Returns:
        ``(shadow, pairs)``: `shadow` has `root`'s children (so its keys and object graph
        are `root`'s) and saves, for each variable, the copy in ``pairs`` of
        ``(variable, copy)``.

    Raises:
        UnsupportedAsyncCheckpointError: an object under `root` saves state other than
            variables (it would be read while training changes it).

    Examples:
        >>> shadow, pairs = host_copies(tf.train.Checkpoint(v=tf.Variable(1.0)))
        >>> for variable, copy in pairs: copy.assign(variable)
        >>> shadow.write('/tmp/ckpt')   # the keys `root.write` would write
    """
    children = {name: child for name, child in
                tf.train.TrackableView(root).children(root).items() if name != "save_counter"}
    shadow = tf.train.Checkpoint(**children)
    pairs, seen = [], set()
    object_map = _tf_internals.identity_dict()  # variables are unhashable
    for child in children.values():
        for node in tf.train.TrackableView(child).descendants():
            if id(node) in seen:
                continue
            seen.add(id(node))
            if _is_variable(node):
                # The same name as the variable's own: the object graph records it.
                inner = node.value if isinstance(node, keras.Variable) else node
                with tf.device("CPU:0"):
                    copy = tf.Variable(tf.zeros(node.shape, node.dtype), trainable=False,
                                       name=inner.name.split(":")[0])
                object_map[node] = copy
                pairs.append((node, copy))
            elif _tf_internals.saves_own_state(node):
                raise UnsupportedAsyncCheckpointError(
                    f"{type(node).__name__} in the checkpoint saves state that is not a "
                    "variable, so it cannot be copied for an asynchronous save; pass "
                    "async_checkpoints=False to get_tpu_estimator")
    _tf_internals.write_copies_in_place(shadow, object_map)
    return shadow, pairs


class CompiledCopy:
    """Assigns each variable to its host copy: one eager assign per variable the first
    time, then one call of a compiled function that assigns them all (for `mnist_net`'s
    18 variables, 0.3 ms instead of 2-3 ms on a loaded machine).

    Args:
        pairs: ``(variable, copy)`` pairs, as `host_copies` returns them.

    Examples:
        >>> shadow, pairs = host_copies(root)
        >>> copy = CompiledCopy(pairs)
        >>> copy(); copy()   # eager, then traced
    """

    def __init__(self, pairs: list[tuple]) -> None:
        self.pairs = pairs
        self._copied = False
        self._function: Any = None

    def __call__(self) -> None:
        if self._function is None and self._copied:  # copied again: worth compiling
            self._function = tf.function(self._assign_all, autograph=False
                                         ).get_concrete_function()
        if self._function is not None:
            self._function()
        else:
            self._assign_all()
            self._copied = True

    def _assign_all(self) -> None:
        for variable, copy in self.pairs:
            copy.assign(variable.value if isinstance(variable, keras.Variable) else variable)


class BackgroundWriter:
    """Saves checkpoints of `root` in a background thread, one at a time.

    Args:
        root: the run's checkpoint root (`checkpoints.make_checkpoint`).
        directory: the work_dir (local or ``gs://``).
        keep: how many checkpoints to keep.

    Attributes:
        manager: the `checkpoint_manager.CheckpointManager` that writes (its
            ``latest_checkpoint`` names the newest complete checkpoint).
        pending_step: the step being written, or None.

    Examples:
        >>> writer = BackgroundWriter(root, work_dir, keep=3)
        >>> writer.start(100)           # copies the variables, returns at once
        >>> done = writer.wait()        # (path, fingerprint, seconds); raises on failure
    """

    def __init__(self, root: tf.train.Checkpoint, directory: str, keep: int) -> None:
        self._root, self._graph = root, checkpoint_manager.ObjectGraph(root)
        shadow, pairs = host_copies(root)
        self._copy = CompiledCopy(pairs)
        self.manager = checkpoint_manager.CheckpointManager(shadow, directory, keep)
        self.manager.write = self._compiled_write(shadow)
        self.pending_step: int | None = None
        self._thread: threading.Thread | None = None
        self._outcome: dict[str, Any] = {}
        self._launched = threading.Event()
        _WRITERS.add(self)
        if not _EXIT_HOOK:
            _EXIT_HOOK.append(True)
            atexit.register(_wait_at_exit)  # after fenwicks._deadline's: runs before it

    def reopen(self) -> None:
        """Reads the directory's list of checkpoints again (after a restore from disk:
        another run's checkpoints, or damaged ones set aside). No write may be running."""
        self.manager.reload()

    def start(self, step: int) -> None:
        """Copies the variables now and writes checkpoint ``ckpt-<step>`` in the background.

        The previous write must be finished (`wait`): the copies are reused.
        """
        self._copy_variables("start")
        self.pending_step, self._outcome = step, {}
        self._launched = threading.Event()
        self._thread = threading.Thread(target=self._write, args=(step,), daemon=True,
                                        name=f"fenwicks checkpoint writer (ckpt-{step})")
        self._thread.start()

    def write_now(self, step: int) -> tuple[str, Any, float]:
        """Copies the variables and writes checkpoint ``ckpt-<step>`` in this thread.

        Returns:
            ``(path, fingerprint, seconds)`` of the checkpoint written.

        Raises:
            CheckpointWriteError: the write failed; the previous checkpoint is intact.
        """
        self._copy_variables("write_now")
        started = time.monotonic()
        path = checkpoints.save(self.manager, step)
        return path, checkpoints.fingerprint(path), time.monotonic() - started

    def _copy_variables(self, caller: str) -> None:
        if self._thread is not None:
            raise RuntimeError(f"BackgroundWriter.{caller} while a write runs; call wait() "
                               "first")
        graph = checkpoint_manager.ObjectGraph(self._root)
        if graph != self._graph:  # a variable was added: copies of the new graph
            shadow, pairs = host_copies(self._root)
            self._graph, self._copy = graph, CompiledCopy(pairs)
            self.manager.write = self._compiled_write(shadow)
        with tf.init_scope():
            self._copy()

    @staticmethod
    def _compiled_write(shadow: tf.train.Checkpoint) -> checkpoint_manager.CompiledWrite:
        # The shadow's graph is fixed: a change under the root makes a new shadow (above).
        return checkpoint_manager.CompiledWrite(shadow, follow_graph=False)

    def _write(self, step: int) -> None:
        self._launched.set()
        started = time.monotonic()
        try:
            path = checkpoints.save(self.manager, step)
            self._outcome.update(path=path, fingerprint=checkpoints.fingerprint(path))
        except BaseException as err:  # noqa: BLE001 - raised in the training thread by wait()
            self._outcome["error"] = err
        self._outcome["seconds"] = time.monotonic() - started

    @property
    def running(self) -> bool:
        return self._thread is not None

    def wait(self) -> tuple[str, Any, float] | None:
        """Waits for the write in progress; None if there was none.

        Returns:
            ``(path, fingerprint, seconds)`` of the checkpoint written.

        Raises:
            CheckpointWriteError: the write failed; the previous checkpoint is intact
                and stays the latest.
        """
        thread = self._thread
        if thread is None:
            return None
        if not self._launched.wait(_LAUNCH_GRACE_SECS):
            # A second Ctrl-C raised inside `start` before the thread ran: nothing was
            # written, and the previous checkpoint stays the latest.
            self._thread = self.pending_step = None
            return None
        while thread.is_alive():  # a timeout keeps the wait interruptible by Ctrl-C
            thread.join(0.5)
        self._thread, step, outcome = None, self.pending_step, self._outcome
        self.pending_step = None
        error = outcome.get("error")
        if isinstance(error, checkpoints.CheckpointWriteError):
            raise checkpoints.CheckpointWriteError(
                f"{error} (It was written in the background, async_checkpoints=True, while "
                f"training went on past step {step}.)") from error.__cause__
        if error is not None:
            raise error
        return outcome["path"], outcome["fingerprint"], outcome["seconds"]


def _wait_at_exit() -> None:
    """At interpreter exit: lets writes in progress finish; reports a failed one."""
    for writer in list(_WRITERS):
        try:
            writer.wait()
        except Exception as err:  # noqa: BLE001 - nobody is left to raise it to
            logger.error("fenwicks: %s", err)
