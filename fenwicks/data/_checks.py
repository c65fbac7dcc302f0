"""Argument checks shared by the input functions: fail before any pipeline is built."""

from __future__ import annotations

from typing import Any

import numpy as np

from fenwicks._checks import positive_int


class RecordError(ValueError):
    """A TFRecord file is corrupt, truncated, or holds records its parser cannot read."""


def check_batch_size(batch_size: Any) -> int:
    return positive_int("batch_size", batch_size,
                        why="the per-replica batch size: params['batch_size'] in an input_fn")


def check_labels(ys: Any, num_examples: int, name: str = "ys") -> np.ndarray:
    """Labels as an array: numeric, one per example, integer class ids of shape [N]."""
    ys = np.asarray(ys)
    if ys.ndim == 0:
        raise ValueError(f"{name} is a scalar; give one label per example, shape "
                         f"[{num_examples}]")
    if len(ys) != num_examples:
        raise ValueError(f"xs has {num_examples} examples but {name} has {len(ys)} "
                         f"labels; give exactly one label per example")
    if ys.dtype.kind not in "iub" and ys.dtype.kind != "f":
        raise ValueError(f"{name} has dtype {ys.dtype}; labels must be integer class ids "
                         "(or floats for regression). Map class names to ids first, e.g. "
                         "np.unique(names, return_inverse=True)[1]")
    if ys.dtype.kind in "iub" and ys.ndim != 1:
        raise ValueError(f"{name} holds integer class ids of shape {ys.shape}; they must "
                         f"have shape [{num_examples}]: pass {name}.reshape(-1)")
    return ys


def label_dtype(ys: np.ndarray) -> np.dtype:
    """int32 for class ids (what losses and TPUs handle natively; numpy's default int64
    is emulated on TPUs), int64 only if the values do not fit; floats unchanged."""
    if ys.dtype.kind == "f":
        return ys.dtype
    info = np.iinfo(np.int32)
    if ys.size and (ys.min() < info.min or ys.max() > info.max):
        return np.dtype(np.int64)
    return np.dtype(np.int32)


def check_features(xs: Any, name: str = "xs") -> np.ndarray:
    xs = xs if isinstance(xs, np.ndarray) else np.asarray(xs)
    if xs.ndim == 0 or len(xs) == 0:
        raise ValueError(f"{name} has shape {xs.shape}; it must hold at least one example "
                         "along its first axis")
    if xs.dtype.kind not in "iubf":
        raise ValueError(f"{name} has dtype {xs.dtype}; features must be a numeric array")
    return xs


def pipeline_shard(input_context: Any) -> tuple[int, int]:
    """``(num_input_pipelines, input_pipeline_id)`` from a `tf.distribute.InputContext`."""
    if input_context is None:
        return 1, 0
    return int(input_context.num_input_pipelines), int(input_context.input_pipeline_id)


def check_folds(n_folds: Any, val_fold_idx: Any, num_examples: int) -> tuple[int, int]:
    """k-fold arguments as ints: ``n_folds >= 1`` and ``0 <= val_fold_idx < n_folds``,
    with at least one example per fold."""
    if isinstance(n_folds, bool) or not isinstance(n_folds, (int, np.integer)) \
            or n_folds < 1:
        raise ValueError(f"n_folds={n_folds!r} must be a positive integer (1 = no folds)")
    if isinstance(val_fold_idx, bool) or not isinstance(val_fold_idx, (int, np.integer)) \
            or not 0 <= val_fold_idx < n_folds:
        raise ValueError(f"val_fold_idx={val_fold_idx!r} must be an integer in "
                         f"[0, n_folds={n_folds})")
    if num_examples < n_folds:
        raise ValueError(f"n_folds={n_folds} but there are {num_examples} records; "
                         "each fold needs at least one")
    return int(n_folds), int(val_fold_idx)
