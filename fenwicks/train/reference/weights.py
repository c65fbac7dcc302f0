"""The reference engine's checkpoints as `cross_engine` reads them on any engine:
``<work_dir>/reference/ckpt-<step>``, a NumPy ``.npz`` archive (`state.NumpyCheckpointer`)
holding the kernel and bias, their Keras paths and the counters. Local folders only.
"""

from __future__ import annotations

import os
import re

import numpy as np

from fenwicks.train.checkpointing import step_of
from fenwicks.train.cross_engine import SavedWeights

NAME, TITLE = "reference", "reference engine"
SUBDIR = "reference"
PARAMS = ("kernel", "bias")  # the model's variables, in ``model.variables`` order


def latest(work_dir: str) -> str | None:
    """The newest ``<work_dir>/reference/ckpt-<step>``; None on a ``gs://`` work_dir
    (the reference engine writes none there)."""
    if "://" in work_dir:
        return None
    directory = os.path.join(work_dir, SUBDIR)
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return None
    steps = [step_of(name) for name in names if re.fullmatch(r"ckpt-\d+", name)]
    return f"{directory}/ckpt-{max(steps)}" if steps else None


def all_checkpoints(work_dir: str) -> list[str]:
    """Every ``<work_dir>/reference/ckpt-<step>``, oldest first."""
    newest = latest(work_dir)
    if newest is None:
        return []
    directory = os.path.dirname(newest)
    return sorted((f"{directory}/{name}" for name in os.listdir(directory)
                   if re.fullmatch(r"ckpt-\d+", name)), key=step_of)


def is_checkpoint(source: str) -> bool:
    """Whether `source` is one of this engine's checkpoints (``.../reference/ckpt-N``)."""
    return bool(re.search(rf"(^|/){SUBDIR}/ckpt-\d+$", source.rstrip("/")))


def work_dir_of(source: str) -> str:
    """`source` without a trailing ``reference`` folder."""
    source = source.rstrip("/")
    return source[: -len(SUBDIR) - 1] if os.path.basename(source) == SUBDIR else source


def read(path: str) -> SavedWeights:
    """The model variables and step of checkpoint `path`."""
    with np.load(path, allow_pickle=False) as flat:
        return SavedWeights(path, NAME, int(flat["counters/global_step"]),
                            [str(flat[f"paths/{name}"]) for name in PARAMS],
                            [np.array(flat[f"params/{name}"]) for name in PARAMS],
                            in_model_order=True)
