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

import numpy as np
import tensorflow as tf

_OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"  # the key object-based checkpoints hold


def _run_step(source: str) -> str | None:
    """The Fenwicks run-format step `source` names (a work_dir's newest, or the step)."""
    from fenwicks.train import run_format

    return source if run_format.is_step(source) else run_format.latest(source)


class _RunStepReader:
    """A Fenwicks run-format step's model variables by their Keras paths (its record's
    layout), read as a TF1 checkpoint reader is: ``get_tensor(name)``."""

    def __init__(self, step_dir: str) -> None:
        from fenwicks.train import run_format

        record = run_format.read_record(step_dir)
        arrays = run_format.read_arrays(step_dir, record)
        self.tensors = {path: array for group in ("trainable", "non_trainable")
                        for (path, _, _), array in zip(record["layout"][group],
                                                       arrays[group], strict=True)}

    def get_tensor(self, name: str) -> Any:
        return self.tensors[name]


def checkpoint_path(source: str, what: str = "warm_start_from") -> str:
    """The checkpoint prefix `source` names (itself, or a directory's latest), or the
    Fenwicks run-format step.

    Raises:
        WarmStartError: there is no checkpoint there, in one sentence naming `what`.
    """
    step = _run_step(source)
    if step is not None:
        return step
    path = tf.train.latest_checkpoint(source) if tf.io.gfile.isdir(source) else None
    path = path or source
    if not tf.io.gfile.exists(path + ".index"):
        raise WarmStartError(
            f"{what}={source!r} holds no checkpoint (no {path}.index, and no checkpoint "
            "file naming one): give the prefix the checkpoint was written with, e.g. "
            "'gs://bucket/bert/bert_model.ckpt', or the directory holding it")
    return path


def is_name_based(source: str) -> bool:
    """True for a TF1 checkpoint (variables saved by their TF1 names), False for an
    object-based one (TensorFlow 2's, Fenwicks' own) and a Fenwicks run's."""
    if _run_step(source) is not None:
        return False
    reader = tf.train.load_checkpoint(checkpoint_path(source))
    return not reader.has_tensor(_OBJECT_GRAPH)


def _checkpoint_names(source: str) -> tuple[Any, dict[str, list[int]]]:
    path = checkpoint_path(source, "the warm start's checkpoint")
    if _run_step(source) is not None:  # a Fenwicks run's: its variables by Keras path
        reader = _RunStepReader(path)
        return reader, {name: (name, list(np.shape(value)))
                        for name, value in reader.tensors.items()}
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
    from the checkpoint is not loaded and is listed so.

    Returns:
        ``{'loaded': [current names], 'not_loaded': [current names]}``.

    Raises:
        WarmStartError: a mapped variable's shape differs from the checkpoint's (TF1's
            init_from_checkpoint raised too), or the map loads nothing.
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
        if found is None:
            report["not_loaded"].append(name)
            continue
        if tuple(found[1]) != tuple(variable.shape):
            raise WarmStartError(
                f"the warm start from {source!r} maps {old!r} (shape {list(found[1])} in "
                f"the checkpoint) to {name!r} (shape {list(variable.shape)} here), as "
                "TF1's init_from_checkpoint refused too: map it to a variable of its "
                "shape, or leave it out of the assignment map")
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
    mismatched = (f"; {first(report['not_loaded'])} are not in the checkpoint"
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
