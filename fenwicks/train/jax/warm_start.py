"""Warm start on the JAX engine: model variables from another run's orbax checkpoint,
matched by path and shape (the paths are saved in each checkpoint's metadata), or from
the TensorFlow engine's checkpoint (`fenwicks.train.cross_engine`)."""

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
            f"warm_start_from={source!r} holds no checkpoint of either engine (the JAX "
            "engine's <work_dir>/orbax/<step>, the TensorFlow engine's <work_dir>/ckpt-"
            "<step>); give the work_dir of a run that saved one, or one of its step "
            "directories")
    return directory, step


def warm_start(model: Any, source: str) -> dict[str, list[str]]:
    """Loads every model variable whose path and shape match one in `source`.

    Returns:
        ``{'loaded': [...], 'not_loaded': [...]}`` of Keras variable paths.

    Examples:
        >>> trained = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name='out')],
        ...                            name='net')
        >>> step = tf.Variable(5, dtype=tf.int64)   # a TensorFlow engine's run, say
        >>> tf.train.Checkpoint(model=trained, global_step=step).write('pretrain/ckpt-5')
        'pretrain/ckpt-5'
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name='out'),
        ...                           keras.layers.Dense(1, name='head')], name='net')
        >>> warm_start(model, 'pretrain')   # the new head is not in it
        {'loaded': ['net/out/kernel', 'net/out/bias'],
         'not_loaded': ['net/head/kernel', 'net/head/bias']}
    """
    import orbax.checkpoint as ocp

    from fenwicks.train import cross_engine

    report = cross_engine.warm_start(model, source, "jax")  # a TensorFlow engine's run
    if report is not None:
        return report
    with checkpoints.local_copy(source) as readable:  # a gs:// one, downloaded
        directory, step = _locate(readable)
        with ocp.CheckpointManager(os.path.abspath(directory), options=ocp.
                                   CheckpointManagerOptions(read_only=True)) as manager:
            paths = manager.metadata(step).custom_metadata["model"]
            arrays = manager.restore(step, args=ocp.args.StandardRestore())["model"]
    # Matched as across engines: by path without Keras's per-process `_<n>` suffixes (a
    # second model built in this process is `conv2d_1`), then by position, shapes checked.
    saved = cross_engine.SavedWeights(f"{directory}/{step}", "jax", step, list(paths),
                                      [np.asarray(a) for a in arrays], in_model_order=True)
    report = cross_engine.load_matching(model, saved)
    logger.warning("fenwicks: warm start from %s/%d loaded %d variable(s); not loaded: %s",
                   directory, step, len(report["loaded"]), report["not_loaded"] or "none")
    return report
