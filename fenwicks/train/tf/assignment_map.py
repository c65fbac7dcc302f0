"""Warm start by name through a TF1 assignment map (`tf.compat.v1.train.init_from_checkpoint`,
`tf.estimator.WarmStartSettings`), for `fw.train.TPUEstimator`.

Current variables are named by their TF1 names (a model_fn's, `current_name`), else
their Keras paths (``'dense/kernel'``); a checkpoint's variables as
`tf.train.list_variables` names them, without the object-based checkpoints'
``'/.ATTRIBUTES/VARIABLE_VALUE'``. A Fenwicks run (a work_dir, its ``checkpoints`` folder,
one step) is read as a TF1 checkpoint (`RunStepReader`): by the TF1 names its run record
holds for a TPUEstimator model_fn's step, else by Keras path.
(`fenwicks.train.tf.checkpoints.warm_start` matches whole models by checkpoint key
instead.)

    report = warm_start(model.variables, 'bert_model.ckpt',
                        {'bert/pooler/dense/kernel': 'pooler/kernel'})

A map's current name that is no variable's Keras path is matched by path suffix when
that is unambiguous: Keras 3's ``variable.name`` is the short name (``'kernel'``), and a
map written from TF1 names (``'bert/pooler/dense/kernel'``) ends with a Keras path
(``'dense/kernel'``). As in TF1, every mapped variable loads or none does: a mapped name
missing from the checkpoint, or of another shape, is an error (`WarmStartError`, a
ValueError as TF1's was), and so is a map that loads nothing, never a silent no-op.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

_OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"  # the key object-based checkpoints hold


def fenwicks_step(source: str) -> str | None:
    """The Fenwicks run-format step `source` names (itself, a work_dir's newest, or the
    newest of a work_dir's ``checkpoints`` folder); None if it names none."""
    from fenwicks.train import cross_engine

    return cross_engine.run_format_step(str(source))


class RunStepReader:
    """A Fenwicks run-format step read as TF1 read a checkpoint
    (`tf.compat.v1.train.load_checkpoint`'s reader): its model variables by the TF1
    names its run record holds (``tf1_names``: a TPUEstimator model_fn's step), else by
    Keras path (a Keras model_func's step, or one written before TF1 names were
    recorded). A name two arrays share (same-named layers' Keras paths in such an older
    step) names neither: it is left out. ``RunStepReader('/content/pretrain/checkpoints/
    1000').get_variable_to_shape_map()['bert/pooler/dense/kernel']`` is ``[768, 768]``.
    """

    def __init__(self, step_dir: str) -> None:
        from fenwicks.train import run_format

        record = run_format.read_record(step_dir)
        self.step_dir = step_dir
        self.by_tf1_name = bool(record.get("tf1_names"))
        self._where: dict[str, tuple[int, list[int]]] = {}  # name -> (position, shape)
        counts: dict[str, int] = {}
        position = 0
        for group in ("trainable", "non_trainable"):
            layout = record["layout"][group]
            names = (record.get("tf1_names") or {}).get(group) or [None] * len(layout)
            for (path, shape, _), name in zip(layout, names, strict=True):
                key = name or path
                counts[key] = counts.get(key, 0) + 1
                self._where[key] = (position, [int(d) for d in shape])
                position += 1
        for key, count in counts.items():
            if count > 1:
                del self._where[key]
        self._arrays: list[np.ndarray] | None = None

    def get_variable_to_shape_map(self) -> dict[str, list[int]]:
        return {name: shape for name, (_, shape) in self._where.items()}

    def has_tensor(self, name: str) -> bool:
        return name in self._where

    def get_tensor(self, name: str) -> np.ndarray:
        if name not in self._where:
            raise KeyError(f"{name!r} is not a variable of the checkpoint {self.step_dir}")
        if self._arrays is None:  # read on first use: listing needs only the record
            from fenwicks.train import cross_engine

            self._arrays = cross_engine.read_run_format(self.step_dir).arrays
        return self._arrays[self._where[name][0]]

    def list_variables(self) -> list[tuple[str, list[int]]]:
        """``tf.train.list_variables``' answer: (name, shape) pairs, sorted by name."""
        return sorted(self.get_variable_to_shape_map().items())


_READERS: dict[tuple[str, str], RunStepReader] = {}  # (step, its arrays' CRCs): reader


def step_reader(step_dir: str) -> RunStepReader:
    """The `RunStepReader` of a step, read once per process (a model_fn lists its
    init_checkpoint in every mode); a step rewritten since has other CRCs: read again."""
    import json

    from fenwicks.train import run_format

    key = (step_dir, json.dumps(run_format.read_record(step_dir)["crc32"]))
    if key not in _READERS:
        _READERS.clear()  # one step at a time: its arrays may be large
        _READERS[key] = RunStepReader(step_dir)
    return _READERS[key]


def checkpoint_path(source: str, what: str = "warm_start_from") -> str:
    """The checkpoint prefix `source` names (itself, or a directory's latest), or the
    Fenwicks run-format step.

    Raises:
        WarmStartError: there is no checkpoint there, in one sentence naming `what`.
    """
    step = fenwicks_step(source)
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
    """True for a checkpoint whose variables are found by TF1 name: a TF1 checkpoint,
    or a Fenwicks step of a TPUEstimator model_fn (its record holds the TF1 names);
    False for an object-based one (TensorFlow 2's) and a Keras model_func's step."""
    step = fenwicks_step(source)
    if step is not None:
        return step_reader(step).by_tf1_name
    reader = tf.train.load_checkpoint(checkpoint_path(source))
    return not reader.has_tensor(_OBJECT_GRAPH)


def _checkpoint_names(source: str) -> tuple[Any, dict[str, tuple[str, list[int]]]]:
    path = checkpoint_path(source, "the warm start's checkpoint")
    if fenwicks_step(source) is not None:  # a Fenwicks run's: by TF1 name or Keras path
        reader = step_reader(path)
        return reader, {name: (name, shape)
                        for name, shape in reader.get_variable_to_shape_map().items()}
    reader = tf.train.load_checkpoint(path)
    suffix = "/.ATTRIBUTES/VARIABLE_VALUE"
    names = {}
    for key, shape in reader.get_variable_to_shape_map().items():
        names[key[:-len(suffix)] if key.endswith(suffix) else key] = (key, shape)
    return reader, names


def list_variables(source: str) -> list[tuple[str, list[int]]] | None:
    """`tf.train.list_variables(source)` for a Fenwicks step or work_dir (each model
    variable by its TF1 name, else its Keras path, with its shape); None for anything
    else (TensorFlow's own answers)."""
    step = fenwicks_step(source)
    return None if step is None else step_reader(step).list_variables()


def load_checkpoint(source: str) -> RunStepReader | None:
    """`tf.train.load_checkpoint(source)` for a Fenwicks step or work_dir; None for
    anything else."""
    step = fenwicks_step(source)
    return None if step is None else step_reader(step)


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
    """Assigns checkpoint values to `variables` by name through `assignment_map`, as
    TF1's ``init_from_checkpoint`` did: every mapped variable, or none.

    Variables the map does not cover are left alone.

    Returns:
        ``{'loaded': [current names], 'not_loaded': []}`` (TF1 loaded every mapped
        variable or raised; the key stays for the estimator's report).

    Raises:
        WarmStartError: a mapped variable's name is missing from the checkpoint, or its
            shape differs from the checkpoint's (TF1's init_from_checkpoint raised for
            both), or the map loads nothing. Nothing is assigned then.
    """
    reader, names = _checkpoint_names(source)
    assignment_map = resolve(assignment_map, variables)
    plan, missing = [], []
    for variable in variables:
        name = current_name(variable)
        old = _source_for(name, assignment_map)
        if old is None:
            continue
        found = names.get(old)
        if found is None:
            missing.append((old, name))
            continue
        if tuple(found[1]) != tuple(variable.shape):
            raise WarmStartError(
                f"the warm start from {source!r} maps {old!r} (shape {list(found[1])} in "
                f"the checkpoint) to {name!r} (shape {list(variable.shape)} here), as "
                "TF1's init_from_checkpoint refused too: map it to a variable of its "
                "shape, or leave it out of the assignment map")
        plan.append((variable, found[0], name))
    if missing:
        raise WarmStartError(_not_found(source, missing, names, reader))
    if not plan:
        raise WarmStartError(_nothing_loaded(source, assignment_map, names, variables,
                                             reader))
    for variable, key, _ in plan:
        variable.assign(reader.get_tensor(key))
    return {"loaded": [name for _, _, name in plan], "not_loaded": []}


def _keras_step_fix(source: str, reader: Any) -> str | None:
    """The fix for a Keras model_func's step, whose variables have no TF1 names."""
    if not isinstance(reader, RunStepReader) or reader.by_tf1_name:
        return None
    return (f"{source!r} is a Fenwicks run whose record holds no TF1 names (a Keras "
            "model_func's, or one written before Fenwicks recorded them), only Keras "
            "paths, so pass it as TPUEstimator(warm_start_from=...) instead, which loads "
            "each variable whose Keras path and shape match, or map its Keras paths "
            "(tf.compat.v1.train.list_variables in the model_fn lists them)")


def _not_found(source: str, missing: list[tuple[str, str]], names: Mapping[str, Any],
               reader: Any) -> str:
    old, name = missing[0]
    near = difflib.get_close_matches(old, list(names), n=2)
    others = (f" ({len(missing) - 1} more mapped variable(s) are missing too, e.g. "
              f"{missing[1][0]!r})" if len(missing) > 1 else "")
    fix = _keras_step_fix(source, reader) or (
        f"map {name!r} to one of the checkpoint's names (tf.compat.v1.train."
        "list_variables lists them), or leave it out of the assignment map")
    return (f"the warm start from {source!r} maps {old!r} to {name!r}, but the checkpoint "
            f"holds no {old!r}"
            + (f" (its nearest: {', '.join(repr(n) for n in near)})" if near else "")
            + f"{others}, and TF1's init_from_checkpoint refused that too (\"Tensor {old} "
            f"is not found in {source} checkpoint\"): {fix}")


def _nothing_loaded(source: str, assignment_map: Mapping[str, Any], names: Mapping[str, Any],
                    variables: Sequence[Any], reader: Any) -> str:
    def first(items: Sequence[str]) -> str:
        return ", ".join(repr(i) for i in items[:3]) + (", ..." if len(items) > 3 else "")

    mapped = list(assignment_map.items())
    fix = _keras_step_fix(source, reader) or (
        "map checkpoint names to this model's names (est.get_variable_names()), or to "
        "themselves where one ends with the other")
    return (f"the warm-start map from {source!r} loads no variable: its first entries are "
            f"{first([f'{k} -> {v}' for k, v in mapped]) or 'none (an empty map)'}, the "
            f"checkpoint's first names {first(sorted(names))}, this model's "
            f"{first([current_name(v) for v in variables])}: {fix}")


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
