"""What a run recorded: the in-memory `History` for plots, and the epoch log in work_dir.

The epoch log (``<work_dir>/epochs.jsonl``, one JSON object per evaluated epoch with its
callback ``logs``, written by `train_and_evaluate`) outlives the process, so callbacks
whose decisions depend on past epochs (`fw.train.EarlyStopping`, `fw.train.BestExporter`)
replay it when a run resumes and decide exactly as an uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import tensorflow as tf

from fenwicks import _deadline

EPOCH_LOG = "epochs.jsonl"


@dataclasses.dataclass
class History:
    """What a run recorded, ready for plots: one entry per step, one per evaluation.

    Examples:
        >>> history = History(steps=[10, 20], losses=[0.9, 0.5],   # est.history after
        ...                   evals=[{'global_step': 20, 'accuracy': 0.8}])  # training
        >>> history.metric('accuracy')   # plt.plot(*history.metric('accuracy'))
        ([20], [0.8])
    """

    steps: list[int] = dataclasses.field(default_factory=list)
    losses: list[float] = dataclasses.field(default_factory=list)
    learning_rates: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    examples_per_sec: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    evals: list[dict[str, float]] = dataclasses.field(default_factory=list)

    def metric(self, name: str) -> tuple[list[int], list[float]]:
        """(global steps, values) of evaluation metric `name`, e.g. ``'accuracy'``."""
        return ([int(e["global_step"]) for e in self.evals],
                [float(e[name]) for e in self.evals])


def read_epochs(work_dir: str, up_to_step: int) -> list[dict[str, Any]]:
    """The epoch log's entries ``{'epoch', 'step', 'logs'}`` up to global step `up_to_step`.

    Entries past `up_to_step` belong to steps the checkpoint does not hold (the run was
    interrupted after logging, before saving); they are left out, as they will be redone.
    """
    path = f"{work_dir}/{EPOCH_LOG}"
    text = _deadline.run(_read_text, path, what="epoch log read", path=path)
    entries = [_entry(path, number, line)
               for number, line in enumerate((text or "").splitlines(), 1) if line.strip()]
    return [e for e in entries if e["step"] <= up_to_step]


def _entry(path: str, number: int, line: str) -> dict[str, Any]:
    """One line of the epoch log; a damaged line is an error naming the file and line."""
    try:
        entry = json.loads(line)
        int(entry["step"])
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(
            f"{path}, line {number}, is not an epoch entry ({type(err).__name__}: "
            f"{str(err)[:100]}): {line[:80]!r}. The file was edited or damaged; fix or "
            "delete that line (the checkpoints do not depend on it)") from None
    return entry


def _read_text(path: str) -> str | None:
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return f.read()


def _write_text(path: str, text: str) -> None:
    with tf.io.gfile.GFile(path + ".tmp", "w") as f:  # whole file: gs:// cannot append
        f.write(text)
    tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def append_epoch(work_dir: str, epoch: int, step: int, logs: dict[str, Any]) -> None:
    """Adds an epoch to the log, dropping entries a resumed run is redoing."""
    entries = [e for e in read_epochs(work_dir, step) if e["step"] < step]
    entries.append({"epoch": epoch, "step": step,
                    "logs": {k: float(v) for k, v in logs.items()}})
    path = f"{work_dir}/{EPOCH_LOG}"
    _deadline.run(_write_text, path, "".join(json.dumps(e) + "\n" for e in entries),
                  what="epoch log write", path=path)
