"""What every engine's checkpoints share: the `Checkpointer` interface (the one owner of
a run's checkpoints, implemented for both real engines by the run format,
`fenwicks.train.run_format.RunCheckpointer`, and by the reference engine's
`NumpyCheckpointer`), how a checkpoint's name gives its step, what counts as storage
failing, and the errors a user may meet.

    checkpointer.restore()        # the newest readable checkpoint into the live state
    checkpointer.save(100)        # (async: returns once the state is copied)
    checkpointer.wait()           # every started save durable, or its error raised once
    step_of('gs://bucket/work/ckpt-400')   # 400
"""

from __future__ import annotations

import abc
import re
import sys
from typing import Any

from fenwicks._text import first_line


class Checkpointer(abc.ABC):
    """The one object that writes and reads a run's checkpoints in one directory.

    Attributes:
        directory: where the checkpoints are (a local path or a ``gs://`` URL).

    Examples:
        >>> from fenwicks.train import engines
        >>> from fenwicks.train.options import EstimatorConfig
        >>> acc = fw.accel.current()
        >>> config = EstimatorConfig(steps_per_epoch=1, work_dir='run', train_batch_size=4,
        ...                          eval_batch_size=4, predict_batch_size=4, steps_per_loop=1,
        ...                          precision='float32', num_replicas=acc.num_replicas)
        >>> state = engines.current().RunState(fw.train.get_clf_model_func(
        ...     lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]),
        ...     fw.train.sgd_optimizer(0.1)), config, acc)
        >>> state.build(tf.TensorSpec([None, 3], tf.float32), {})   # step 0, nothing restored
        >>> checkpointer = state.checkpointer   # the run's (`run_format.RunCheckpointer`)
        >>> checkpointer.save(0)   # returns once the state is copied
        >>> checkpointer.wait()    # the write is durable (or its error is raised here)
        >>> checkpointer.latest, step_of(checkpointer.latest)
        ('run/checkpoints/0', 0)
        >>> state.close()
    """

    directory: str

    @abc.abstractmethod
    def save(self, step: int, *, force: bool = False) -> None:
        """Saves the live state as the checkpoint of `step`.

        Synchronous: returns when the checkpoint is durable. Asynchronous: returns once
        the state is copied to host memory; the write goes on in the background (see
        `wait`). A step already saved, or being saved, is not saved again.

        Args:
            step: the global step the state belongs to (names the checkpoint).
            force: save even if `step` is already saved (the weights of that step were
                changed since, e.g. by a callback). Defaults to False.

        Raises:
            CheckpointWriteError: this write, or the previous background one, failed;
                the message names the last good checkpoint, which stays the latest.
        """

    def save_and_wait(self, step: int, *, force: bool = False) -> None:
        """`save`, then `wait`: returns once the checkpoint of `step` is durable.

        For a save the caller waits for at once (the end of `train`): an asynchronous
        checkpointer may write it in the calling thread, as nothing would run beside a
        background write.

        Args:
            step, force: as for `save`.

        Raises:
            CheckpointWriteError: as for `save` and `wait`.
        """
        self.save(step, force=force)
        self.wait()

    @abc.abstractmethod
    def restore(self, path: str | None = None) -> str | None:
        """Restores `path`, or the newest readable checkpoint, into the live state.

        Waits for pending writes first, so only complete checkpoints are read.

        Args:
            path: a checkpoint to restore. Defaults to None: the newest in `directory`.

        Returns:
            The checkpoint restored; None if `directory` holds none.
        """

    @abc.abstractmethod
    def wait(self) -> None:
        """Blocks until every started save is durable.

        Raises:
            CheckpointWriteError: a background write failed (raised once; the last good
                checkpoint stays the latest).
        """

    @property
    @abc.abstractmethod
    def latest(self) -> str | None:
        """The newest durable checkpoint (restored or saved); waits for pending writes."""

    @property
    @abc.abstractmethod
    def last_save_secs(self) -> float | None:
        """Seconds the last save took to become durable; None before the first."""

    def close(self) -> None:
        """Waits for pending writes, then releases what this object holds; idempotent."""
        self.wait()

    def agree(self, due: bool) -> bool:
        """Whether a save that one process found `due` is made: with several processes
        that save together (the JAX engine's), True on all if it is on any. Defaults to
        `due` itself (one writer)."""
        return due

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()



class CheckpointMismatchError(ValueError):
    """A checkpoint's variables do not match the model being trained."""


class CheckpointCoverageError(ValueError):
    """A variable the next step depends on is not reachable from the checkpoint root."""


class CheckpointCorruptError(RuntimeError):
    """No checkpoint in work_dir can be read, though some are listed there."""


def none_readable(work_dir: str, listed: int, damaged: list[tuple[str, str]],
                  what_to_move: str) -> CheckpointCorruptError:
    """The error when every one of the `listed` checkpoints of `work_dir` is damaged:
    each with why, and what to move away (the engine's checkpoint files)."""
    listing = "; ".join(f"{where}: {why}" for where, why in damaged)
    return CheckpointCorruptError(
        f"work_dir={work_dir!r} lists {listed} checkpoint(s) and none can be read "
        f"({listing}). Nothing was changed. Move {what_to_move} away to start fresh, or "
        "restore them from a copy")


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, storage error); the previous is intact."""



class ProbeWriteError(OSError):
    """The model's probe checkpoint could not be written to scratch space (a full or
    tiny temp dir, ``ulimit -f``); the checkpoints in work_dir were not touched."""



def step_of(prefix: str | None) -> int:
    """The global step a checkpoint prefix ``.../ckpt-<step>`` was written at.

    Returns:
        The step; 0 for None (no checkpoint yet: a run starts at step 0); -1 for a prefix
        that does not end in a step, so it sorts before every real checkpoint.

    Examples:
        >>> step_of('gs://bucket/work/ckpt-400')
        400
        >>> step_of('/work/checkpoints/400')    # the JAX engine's orbax checkpoints
        400
    """
    if prefix is None:
        return 0
    # TensorFlow's ``.../ckpt-<step>`` and the JAX engine's orbax ``.../<step>``.
    match = re.search(r"(?:^|[-/])(\d+)/?$", prefix)
    return int(match.group(1)) if match else -1



# --------------------------------------------------------------------------- storage errors
#
# TensorFlow's gs:// client retries a request that fails with a 5xx, a dropped or timed-out
# connection, then gives up with AbortedError("All N retry attempts failed ..."); one
# restore makes several such requests in turn. Fenwicks sets that client's retries and
# timeouts at `import fenwicks` (`_deadline.tensorflow_settings`: 6 retries waiting 1, 2,
# 4, 8, 16, 16 s, and 20 s to connect or without progress), unless the user set the GCS_*
# variables or TensorFlow was imported first (then TensorFlow's own: 10 retries, about 3.2
# minutes per request); `_deadline.run` bounds each whole call either way. Such an error
# says nothing about the checkpoint's content: it must never be taken for a damaged
# checkpoint and set aside.

# Errors that kept their status code (a failed save raises AbortedError): ABORTED,
# UNAVAILABLE and DEADLINE_EXCEEDED, TensorFlow's values of the canonical (gRPC) codes.
_STORAGE_CODES = (10, 14, 4)


class CheckpointReadError(OSError):
    """Storage did not answer while reading a checkpoint, after TensorFlow's retries.

    Nothing was restored, renamed or deleted: the checkpoint may be perfectly sound.

    Attributes:
        path: the checkpoint prefix that could not be read.
        cause: TensorFlow's error.
    """

    def __init__(self, path: str, cause: BaseException) -> None:
        self.path, self.cause = path, cause
        super().__init__(
            f"could not read checkpoint {path}: the storage did not answer after "
            f"TensorFlow's retries ({first_line(cause)}). Nothing was restored or "
            "changed in the work_dir; the checkpoint is not known to be damaged. Check the "
            "network or the bucket's status, then create the estimator again")


# The status code does not always survive: tf.train.list_variables reports it inside a
# ValueError's text, and a metadata read as a bare OpError(UNKNOWN) whose text starts with
# the retry loop's "All N retry attempts failed".
_STORAGE_TEXTS = ("retry attempts failed", "ABORTED:", "UNAVAILABLE:", "DEADLINE_EXCEEDED:")


def is_storage_error(err: BaseException) -> bool:
    """True for a failure to reach storage (retries used up, unavailable, timed out),
    as opposed to a file that was reached and is missing or damaged.

    Examples:
        >>> is_storage_error(ValueError("All 10 retry attempts failed. The last failure: "
        ...                             "UNAVAILABLE: 503"))
        True
        >>> is_storage_error(FileNotFoundError("gs://bucket/work/checkpoints/4"))
        False
    """
    op_error = _tensorflow_op_error()
    if op_error is not None and isinstance(err, op_error) \
            and err.error_code in _STORAGE_CODES:
        return True
    kinds = (ValueError,) if op_error is None else (op_error, ValueError)
    return isinstance(err, kinds) and any(text in str(err) for text in _STORAGE_TEXTS)


def _tensorflow_op_error() -> type | None:
    """TensorFlow's ``tf.errors.OpError`` if TensorFlow is loaded, else None.

    Looked up, never imported: only a loaded TensorFlow can have raised one (gs:// is
    read through its client, `fenwicks.io`, on either engine), and the checkpoint code
    shared by the engines imports no TensorFlow.
    """
    errors = getattr(sys.modules.get("tensorflow"), "errors", None)
    return getattr(errors, "OpError", None)


