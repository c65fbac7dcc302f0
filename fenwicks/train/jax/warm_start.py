"""Warm start on the JAX engine: model variables from another run's orbax checkpoint,
matched by path and shape (the paths are saved in each checkpoint's metadata)."""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from fenwicks.train.jax import checkpoints

logger = logging.getLogger("fenwicks")


def _locate(source: str) -> tuple[str, int]:
    """``(orbax directory, step)`` of a work_dir's latest checkpoint or a step directory."""
    import orbax.checkpoint as ocp

    source = source.rstrip("/")
    if os.path.basename(source).isdigit():
        return os.path.dirname(source), int(os.path.basename(source))
    directory = checkpoints.directory(source)
    step = None
    if os.path.isdir(directory):
        with ocp.CheckpointManager(os.path.abspath(directory), options=ocp.
                                   CheckpointManagerOptions(read_only=True)) as manager:
            step = manager.latest_step()
    if step is None:
        raise ValueError(
            f"warm_start_from={source!r} holds no JAX-engine checkpoint (<work_dir>/orbax/"
            "<step>); on the JAX engine warm start reads those. A TensorFlow-engine "
            "checkpoint warm-starts on the TensorFlow engine (FENWICKS_ENGINE=tf)")
    return directory, step


def warm_start(model: Any, source: str) -> dict[str, list[str]]:
    """Loads every model variable whose path and shape match one in `source`.

    Returns:
        ``{'loaded': [...], 'not_loaded': [...]}`` of Keras variable paths.

    Example:
        >>> warm_start(model, '/kaggle/working/pretrain')
    """
    import orbax.checkpoint as ocp

    with checkpoints.local_copy(source) as readable:  # a gs:// one, downloaded
        directory, step = _locate(readable)
        with ocp.CheckpointManager(os.path.abspath(directory), options=ocp.
                                   CheckpointManagerOptions(read_only=True)) as manager:
            paths = manager.metadata(step).custom_metadata["model"]
            arrays = manager.restore(step, args=ocp.args.StandardRestore())["model"]
    theirs = dict(zip(paths, arrays, strict=True))
    report: dict[str, list[str]] = {"loaded": [], "not_loaded": []}
    for variable in model.variables:
        value = theirs.get(variable.path)
        if value is not None and tuple(np.shape(value)) == tuple(variable.shape):
            variable.assign(np.asarray(value))
            report["loaded"].append(variable.path)
        else:
            report["not_loaded"].append(variable.path)
    logger.warning("fenwicks: warm start from %s/%d loaded %d variable(s); not loaded: %s",
                   directory, step, len(report["loaded"]), report["not_loaded"] or "none")
    return report
