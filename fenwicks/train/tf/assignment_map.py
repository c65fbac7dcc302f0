"""Warm start by name through a TF1 assignment map (`tf.compat.v1.train.init_from_checkpoint`,
`tf.estimator.WarmStartSettings`), for `fw.train.TPUEstimator`.

Current variables are named by their Keras paths (``'dense/kernel'``); a checkpoint's
variables as `tf.train.list_variables` names them, without the object-based checkpoints'
``'/.ATTRIBUTES/VARIABLE_VALUE'``. (`fenwicks.train.tf.checkpoints.warm_start` matches whole
models by checkpoint key instead.)

    report = warm_start(model.variables, 'bert_model.ckpt',
                        {'bert/pooler/dense/kernel': 'pooler/kernel'})

A map's current name that is no variable's Keras path is matched by path suffix when
that is unambiguous: Keras 3's ``variable.name`` is the short name (``'kernel'``), and a
map written from TF1 names (``'bert/pooler/dense/kernel'``) ends with a Keras path
(``'dense/kernel'``). A map that loads nothing is an error (`WarmStartError`), never a
silent no-op.
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


class WarmStartError(ValueError):
    """A warm-start map that loads no variable."""


def current_name(variable: Any) -> str:
    """A variable's name in maps: its TF1 name if `tf.compat.v1.get_variable` made it in a
    model_fn, else its Keras path."""
    return (getattr(variable, "fenwicks_v1_name", None) or getattr(variable, "path", None)
            or variable.name.split(":")[0])


def _by_suffix(name: str, names: Sequence[str]) -> str | None:
    """The one current name that `name` ends with, or that ends with `name`, at a '/'."""
    found = [n for n in names if name.endswith("/" + n) or n.endswith("/" + name)]
    return found[0] if len(found) == 1 else None


def resolve(assignment_map: Mapping[str, Any], variables: Sequence[Any]) -> dict[str, Any]:
    """The map with each current name that matches no variable exactly replaced by the
    variable whose path it matches by suffix, where exactly one does."""
    names = [current_name(v) for v in variables]
    out = {}
    for old, new in assignment_map.items():
        if isinstance(new, str) and not new.endswith("/") and new not in names:
            new = _by_suffix(new, names) or new
        out[old] = new
    return out


def _source_for(name: str, assignment_map: Mapping[str, Any]) -> str | None:
    """TF1's init_from_checkpoint map: {ckpt name or 'scope/': current name or 'scope/'}."""
    for old, new in assignment_map.items():
        new = new if isinstance(new, str) else current_name(getattr(new, "variable", new))
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
    assignment_map = resolve(assignment_map, variables)
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
    if not report["loaded"]:
        raise WarmStartError(_nothing_loaded(source, assignment_map, names, variables, report))
    return report


def _nothing_loaded(source: str, assignment_map: Mapping[str, Any], names: Mapping[str, Any],
                    variables: Sequence[Any], report: dict[str, list[str]]) -> str:
    def first(items: Sequence[str]) -> str:
        return ", ".join(repr(i) for i in items[:3]) + (", ..." if len(items) > 3 else "")

    mapped = list(assignment_map.items())
    mismatched = (f"; {first(report['not_loaded'])} matched by name but not by shape"
                  if report["not_loaded"] else "")
    return (f"the warm-start map from {source!r} loads no variable: its first entries are "
            f"{first([f'{k} -> {v}' for k, v in mapped]) or 'none (an empty map)'}, the "
            f"checkpoint's first names {first(sorted(names))}, this model's "
            f"{first([current_name(v) for v in variables])}{mismatched}. Map checkpoint "
            "names to this model's names (est.get_variable_names()), or to themselves "
            "where one ends with the other; BERT's get_assignment_map_from_checkpoint "
            "compares var.name, which Keras 3 shortens to 'kernel', so it finds nothing")


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
