"""The training batch size a work_dir's input position is counted in.

The input position is saved as steps (``input_steps``), each of ``trn_bs`` examples.
A run resumed with another ``trn_bs`` would skip ``steps x new`` examples where
``steps x old`` were read: the wrong examples, silently. So the chief writes the global
training batch size beside the checkpoints (``fenwicks_input.json``), and a resume with
another one is refused, naming both. Engine-neutral: both engines count the same way.

    input_record.check(work_dir, batch_size=64, position=12, write=True)
"""

from __future__ import annotations

import json

import tensorflow as tf  # tf.io.gfile: local and gs:// alike (storage, not training)

from fenwicks import _deadline

FILE = "fenwicks_input.json"


class BatchSizeChangedError(ValueError):
    """A run would resume with a training batch size other than the one it was saved with."""


def check(work_dir: str, batch_size: int, position: int, write: bool) -> None:
    """Refuses to resume at `position` steps with another global `batch_size` than the
    record's; records `batch_size` when starting afresh or when no record exists.

    Args:
        work_dir: the run's folder (local or ``gs://``).
        batch_size: this run's global training batch size (``trn_bs``).
        position: the restored input position, in steps (0: a fresh run).
        write: whether this process writes files (the chief).

    Raises:
        BatchSizeChangedError: the record holds another batch size and `position` > 0.
    """
    path = f"{work_dir.rstrip('/')}/{FILE}"
    recorded = _deadline.run(_read, path, what="input record", path=path)
    if position > 0 and recorded is not None and recorded != batch_size:
        raise BatchSizeChangedError(
            f"trn_bs={batch_size} differs from the trn_bs={recorded} this work_dir's run "
            f"was trained with: its input position ({position} steps) is counted in "
            f"batches of {recorded}, so resuming with {batch_size} would read other "
            f"examples than the run's. Pass trn_bs={recorded} to continue it, or start "
            f"a new work_dir with warm_start_from={work_dir!r} to train on with "
            f"trn_bs={batch_size}")
    if write and recorded != batch_size:
        _deadline.run(_write, path, batch_size, what="input record", path=path)


def _read(path: str) -> int | None:
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        try:
            return int(json.loads(f.read())["train_batch_size"])
        except (ValueError, KeyError, TypeError):
            return None  # unreadable (a torn write): the next write replaces it


def _write(path: str, batch_size: int) -> None:
    with tf.io.gfile.GFile(path, "w") as f:
        f.write(json.dumps({"train_batch_size": batch_size}))
