"""The training batch size a work_dir's input position is counted in.

The input position is saved as steps (``input_steps``), each of ``trn_bs`` examples.
A run resumed with another ``trn_bs`` would skip ``steps x new`` examples where
``steps x old`` were read: the wrong examples, silently. So each checkpoint's run record
holds the global training batch size (`fenwicks.train.run_format`: written atomically
with the step, checked when read), and a resume with another one is refused, naming
both. Work_dirs written before the run format kept it in ``fenwicks_input.json`` beside
the checkpoints; that file is still read for them, and no longer written.
Engine-neutral: both engines count the same way.

    input_record.check(work_dir, batch_size=64, position=12, record=state.restored_record)
"""

from __future__ import annotations

import json

from fenwicks import _deadline
from fenwicks import io as fw_io

FILE = "fenwicks_input.json"


class BatchSizeChangedError(ValueError):
    """A run would resume with a training batch size other than the one it was saved with."""


def check(work_dir: str, batch_size: int, position: int,
          record: dict | None = None) -> None:
    """Refuses to resume at `position` steps with another global `batch_size` than the
    one the restored step's run `record` holds (for a work_dir of the previous format,
    ``fenwicks_input.json``'s).

    Args:
        work_dir: the run's folder (local or ``gs://``).
        batch_size: this run's global training batch size (``trn_bs``).
        position: the restored input position, in steps (0: a fresh run).
        record: the run record of the step restored; None for a fresh run or a
            checkpoint of the previous format. Defaults to None.

    Raises:
        BatchSizeChangedError: the record holds another batch size and `position` > 0.

    Examples:
        >>> check('runs/mnist', 32, 12, {'train_batch_size': 32})   # the same: passes
        >>> check('runs/mnist', 64, 12, {'train_batch_size': 32})
        Traceback (most recent call last):
        fenwicks.train.input_record.BatchSizeChangedError: trn_bs=64 differs from the trn_bs=32 ...
    """
    if position <= 0:
        return
    if record is not None:
        recorded = int(record["train_batch_size"])
    else:
        path = f"{work_dir.rstrip('/')}/{FILE}"
        recorded = _deadline.run(_read, path, what="input record", path=path)
    if recorded is not None and recorded != batch_size:
        raise BatchSizeChangedError(
            f"trn_bs={batch_size} differs from the trn_bs={recorded} this work_dir's run "
            f"was trained with: its input position ({position} steps) is counted in "
            f"batches of {recorded}, so resuming with {batch_size} would read other "
            f"examples than the run's. Pass trn_bs={recorded} to continue it, or start "
            f"a new work_dir with warm_start_from={work_dir!r} to train on with "
            f"trn_bs={batch_size}")


def _read(path: str) -> int | None:
    """The previous format's record: None if absent or unreadable (it cannot be checked)."""
    if not fw_io.exists(path):
        return None
    try:
        return int(json.loads(fw_io.read_bytes(path))["train_batch_size"])
    except (ValueError, KeyError, TypeError):
        return None
