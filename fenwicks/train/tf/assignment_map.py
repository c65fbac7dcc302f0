"""Warm start by name through a TF1 assignment map (`tf.compat.v1.train.init_from_checkpoint`,
`tf.estimator.WarmStartSettings`), for `fw.train.TPUEstimator`.

Current variables are named by their Keras paths (``'dense/kernel'``); a checkpoint's
variables as `tf.train.list_variables` names them, without the object-based checkpoints'
``'/.ATTRIBUTES/VARIABLE_VALUE'``. (`fenwicks.train.tf.checkpoints.warm_start` matches whole
models by checkpoint key instead.)

    report = warm_start(model.variables, 'bert_model.ckpt',
                        {'bert/pooler/dense/kernel': 'pooler/kernel'})
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf


def _checkpoint_names(source: str) -> tuple[Any, dict[str, list[int]]]:
    path = tf.train.latest_checkpoint(source) or source
    reader = tf.train.load_checkpoint(path)
    suffix = "/.ATTRIBUTES/VARIABLE_VALUE"
    names = {}
    for key, shape in reader.get_variable_to_shape_map().items():
        names[key[:-len(suffix)] if key.endswith(suffix) else key] = (key, shape)
    return reader, names


def current_name(variable: Any) -> str:
    return getattr(variable, "path", None) or variable.name.split(":")[0]


def _source_for(name: str, assignment_map: Mapping[str, Any]) -> str | None:
    """TF1's init_from_checkpoint map: {ckpt name or 'scope/': current name or 'scope/'}."""
    for old, new in assignment_map.items():
        new = new if isinstance(new, str) else current_name(new)
        if old.endswith("/") or old == "/":
            new_scope = "" if new == "/" else new
            old_scope = "" if old == "/" else old
            if name.startswith(new_scope):
                return old_scope + name[len(new_scope):]
        elif new == name:
            return old
    return None


def warm_start(variables: Sequence[Any], source: str,
               assignment_map: Mapping[str, Any]) -> dict[str, list[str]]:
    """Assigns checkpoint values to `variables` by name through `assignment_map`.

    Variables the map does not cover are left alone; a mapped one whose name is missing
    from the checkpoint, or whose shape differs, is not loaded and is listed so.

    Returns:
        ``{'loaded': [current names], 'not_loaded': [current names]}``.
    """
    reader, names = _checkpoint_names(source)
    report: dict[str, list[str]] = {"loaded": [], "not_loaded": []}
    for variable in variables:
        name = current_name(variable)
        old = _source_for(name, assignment_map)
        if old is None:
            continue
        found = names.get(old)
        if found is None or tuple(found[1]) != tuple(variable.shape):
            report["not_loaded"].append(name)
            continue
        variable.assign(reader.get_tensor(found[0]))
        report["loaded"].append(name)
    return report


def settings_map(variables: Sequence[Any], vars_to_warm_start: str | Sequence[str] | None,
                 renames: Mapping[str, str] | None) -> dict[str, str]:
    """`WarmStartSettings` as an assignment map: the trainable variables matching
    `vars_to_warm_start`, from their own names or their `renames`."""
    patterns = vars_to_warm_start
    patterns = [patterns] if isinstance(patterns, str) else list(patterns or [])
    renames = dict(renames or {})
    chosen = {}
    for variable in variables:
        name = current_name(variable)
        if variable.trainable and any(re.match(p, name) for p in patterns):
            chosen[renames.get(name, name)] = name
    return chosen
