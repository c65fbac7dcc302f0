"""The JAX engine's orbax checkpoints as `cross_engine` reads them on another engine:
found without orbax (a step is a folder ``<work_dir>/orbax/<step>``, renamed into place
when complete, or on GCS marked by its commit file), recognised and read into the neutral
form (`cross_engine.SavedWeights`: the model's arrays in ``model.variables`` order and
the optimizer's in ``optimizer.variables`` order, their paths in the checkpoint's custom
metadata, the step and the input position).

Importable without JAX: orbax (and with it JAX, kept to the CPU) is imported only to
read a step.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from typing import Any

import numpy as np
import tensorflow as tf

from fenwicks import _deadline, _removal
from fenwicks.train.cross_engine import SavedWeights

NAME, TITLE = "jax", "JAX engine"
SUBDIR = "orbax"  # `fenwicks.train.jax.checkpoints.SUBDIR` (that module needs JAX)
COMMIT_FILE = "commit_success.txt"  # `...jax.checkpoints.COMMIT_FILE`, for gs://


def latest(work_dir: str) -> str | None:
    """The JAX engine's newest checkpoint ``<work_dir>/orbax/<step>``, found without
    orbax: orbax writes a step into a temporary directory and renames it to the bare
    step number when complete."""
    found = all_checkpoints(work_dir, newest_only=True)
    return found[-1] if found else None


def all_checkpoints(work_dir: str, newest_only: bool = False) -> list[str]:
    """The JAX engine's complete checkpoints ``<work_dir>/orbax/<step>``, oldest first
    (the older ones a damaged newest falls back to); with `newest_only`, at most the
    newest."""
    directory = f"{work_dir.rstrip('/')}/{SUBDIR}"
    if not _deadline.run(tf.io.gfile.isdir, directory, what="exists", path=directory):
        return []
    names = _deadline.run(tf.io.gfile.listdir, directory, what="checkpoint listing",
                          path=directory)
    steps = sorted((int(n.rstrip("/")) for n in names if n.rstrip("/").isdigit()),
                   reverse=True)
    found = []
    for step in steps:  # newest first
        marker = f"{directory}/{step}/{COMMIT_FILE}"
        # On GCS a step is complete once its marker is there (uploaded last; nothing
        # renames); locally once it has its bare step name.
        if "://" not in directory or _deadline.run(tf.io.gfile.exists, marker,
                                                   what="exists", path=marker):
            found.append(f"{directory}/{step}")
            if newest_only:
                break
    return found[::-1]


def is_checkpoint(source: str) -> bool:
    """Whether `source` is one of this engine's checkpoints (``.../orbax/<step>``)."""
    return bool(re.search(rf"(^|/){SUBDIR}/\d+/?$", source))


def work_dir_of(source: str) -> str:
    """`source` without a trailing ``orbax`` folder (a user may name that folder)."""
    source = source.rstrip("/")
    return source[: -len(SUBDIR) - 1] if os.path.basename(source) == SUBDIR else source


def read(path: str) -> SavedWeights:
    """The model and optimizer variables, the step and the input position of orbax step
    `path`.

    Raises:
        ImportError: orbax-checkpoint is not installed.
    """
    return _read_orbax(path.rstrip("/"))


def _import_orbax(path: str) -> Any:
    # On the TensorFlow engine JAX comes in here only to read files: it is kept to the
    # CPU (JAX reads JAX_PLATFORMS once, on import), so that it does not take a GPU and,
    # as it does by default, 75% of its memory from TensorFlow.
    first = "jax" not in sys.modules
    before = os.environ.get("JAX_PLATFORMS")
    if first:
        os.environ["JAX_PLATFORMS"] = "cpu"
    try:
        import orbax.checkpoint as ocp
    except ImportError as err:
        raise ImportError(
            f"{path} is the JAX engine's checkpoint (orbax format); reading it needs "
            "orbax-checkpoint: pip install orbax-checkpoint (or pip install "
            "'fenwicks[jax]'), then start a new Python process") from err
    finally:
        if first and before is None:
            os.environ.pop("JAX_PLATFORMS", None)
        elif first:
            os.environ["JAX_PLATFORMS"] = before
    return ocp


def _read_orbax(path: str) -> SavedWeights:
    if "://" in path:  # staged as the JAX engine stages it: the step, downloaded
        from fenwicks import io as fw_io

        with _removal.temporary_dir(prefix="fenwicks-cross-engine-") as scratch:
            fw_io.download(path, scratch, progress=False)  # its own retries and bounds
            local = _read_orbax(os.path.join(scratch, os.path.basename(path)))
        return dataclasses.replace(local, checkpoint=path)
    ocp = _import_orbax(path)
    directory, step = os.path.dirname(path), int(os.path.basename(path))
    directory = directory if "://" in directory else os.path.abspath(directory)
    with ocp.CheckpointManager(directory, item_handlers=ocp.StandardCheckpointHandler(),
                               options=ocp.CheckpointManagerOptions(read_only=True)) as manager:
        described = manager.metadata(step).custom_metadata
        paths = list(described["model"])
        # A target of host arrays: the checkpoint's sharding names the devices of the
        # process that wrote it (8 TPU cores), which this one may not have.
        target = _host_arrays(manager.item_metadata(step))
        tree = manager.restore(step, args=ocp.args.StandardRestore(target))
    counters = tree["counters"]
    return SavedWeights(path, "jax", int(counters["global_step"]), paths,
                        [np.asarray(a) for a in tree["model"]], in_model_order=True,
                        optimizer_paths=list(described.get("optimizer", [])),
                        optimizer=[np.asarray(a) for a in tree.get("optimizer", [])] or None,
                        input_steps=(int(counters["input_steps"]) if "input_steps" in counters
                                     else None))


def _host_arrays(metadata: Any) -> Any:
    if isinstance(metadata, dict) or hasattr(metadata, "items"):
        return {key: _host_arrays(value) for key, value in metadata.items()}
    if isinstance(metadata, (list, tuple)):
        return [_host_arrays(value) for value in metadata]
    return np.zeros(metadata.shape, metadata.dtype)
