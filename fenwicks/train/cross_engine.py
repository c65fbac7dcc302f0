"""One engine's checkpoints read on the other: a work_dir trained on the TensorFlow engine
is evaluated, predicted from and warm-started on the JAX engine, and back.

The two formats:

* the TensorFlow engine's ``<work_dir>/ckpt-<step>`` (`checkpoints.make_checkpoint`):
  keys are paths in TensorFlow's object graph, and the object graph saved inside the
  checkpoint names each variable by its full name, which Keras sets to the variable's
  path (``'mnist_net/conv_bn/conv2d/kernel'``). Checkpoints written before this module
  existed are read as they are: nothing was added to the format;
* the JAX engine's ``<work_dir>/orbax/<step>`` (`jax.checkpoints`): the model's arrays
  in ``model.variables`` order, their paths in the checkpoint's custom metadata.

Only model variables cross (weights, BatchNorm statistics, seed-generator states) and
the global step; the optimizer's slots and the input position do not.

**Matching by name.** A variable of the model is matched to the checkpoint's by its Keras
path. Keras makes names unique per process (``conv2d``, then ``conv2d_1`` for the next
model built), so a model built after another one has other paths than the same model
built first: every path component is compared without its ``_<n>`` suffix, and variables
whose paths are then equal are paired in the order of those suffixes (Keras counts up as
it creates layers, so the order is the creation order in both processes). Shapes are
checked for every pair. If names leave any variable unmatched and the checkpoint lists
its variables in model order (orbax does) with the same count and shapes, variables are
paired by position, with a warning. `evaluate` and `predict` need every variable matched
and raise `CrossEngineMismatchError` naming those that are not; a warm start loads what
matches and reports the rest, as on one engine.

**Training is refused** (`refuse_training`) on a work_dir that holds only the other
engine's checkpoints, with `CrossEngineTrainingError` naming both engines, the checkpoint
and the two fixes (train on the engine that wrote it, or ``warm_start_from=<work_dir>``
into a new work_dir). Continuing there would write this engine's checkpoints beside the
other's: the work_dir would then hold two "latest" checkpoints in two formats, and the
other engine, back on it, would resume from its own older one and silently skip every
step trained here. A resume also promises exactness (optimizer slots, input position,
random state), which across engines holds only to the kernels' rounding. A warm start
into a new work_dir keeps both runs intact and costs one argument.

Example:
    >>> # a work_dir trained on a Kaggle TPU (JAX engine), on a Colab GPU (TF engine):
    >>> est = fw.train.get_tpu_estimator(steps_per_epoch, model_func, '/content/run')
    >>> est.evaluate(eval_fn)            # the JAX engine's weights, by path
    >>> est2 = fw.train.get_tpu_estimator(steps_per_epoch, model_func, '/content/run2',
    ...                                   warm_start_from='/content/run')
    >>> est2.train(train_fn, steps=1000)   # continues from those weights, step 0
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from fenwicks import _deadline
from fenwicks.train.tf import checkpoints

logger = logging.getLogger("fenwicks")

ENGINES = {"tf": "TensorFlow engine", "jax": "JAX engine"}
_FORCE = {"tf": "FENWICKS_ENGINE=tf", "jax": "FENWICKS_ENGINE=jax"}
ORBAX_SUBDIR = "orbax"  # `fenwicks.train.jax.checkpoints.SUBDIR` (that module needs JAX)
ORBAX_COMMIT_FILE = "commit_success.txt"  # `...jax.checkpoints.COMMIT_FILE`, for gs://
_TF_STEP = "global_step/.ATTRIBUTES/VARIABLE_VALUE"  # as `checkpoints.make_checkpoint` saves it
_MODEL_KEYS = ("model/", "model_extra/")  # the model's keys in a TF-engine checkpoint
_SUFFIX = re.compile(r"_(\d+)$")  # what Keras appends to make a layer's name unique


class CrossEngineMismatchError(ValueError):
    """The other engine's checkpoint does not hold every variable of this model."""


class CrossEngineTrainingError(ValueError):
    """`train` on a work_dir that holds only the other engine's checkpoints."""


@dataclasses.dataclass(frozen=True)
class SavedWeights:
    """A checkpoint's model variables, by Keras path.

    Attributes:
        checkpoint: the checkpoint read (``.../ckpt-<step>`` or ``.../orbax/<step>``).
        engine: the engine that wrote it, ``'tf'`` or ``'jax'``.
        step: its global step.
        paths: the variables' Keras paths, as that engine's process named them.
        arrays: their values, in `paths`' order.
        in_model_order: whether `paths` follow ``model.variables`` (orbax's list does;
            TensorFlow's object graph does not).
    """

    checkpoint: str
    engine: str
    step: int
    paths: list[str]
    arrays: list[np.ndarray]
    in_model_order: bool


# --------------------------------------------------------------------------- locating


def other(engine: str) -> str:
    """The other engine's name: ``other('tf') == 'jax'``."""
    return "jax" if engine == "tf" else "tf"


def tf_latest(work_dir: str) -> str | None:
    """The TensorFlow engine's newest checkpoint in `work_dir`, from its state file or,
    if that is missing (a copied work_dir), by name."""
    found = checkpoints.latest(work_dir)
    if found is None:
        names = _deadline.run(tf.io.gfile.glob, f"{work_dir}/ckpt-*.index",
                              what="checkpoint listing", path=work_dir)
        prefixes = [n[: -len(".index")] for n in names]
        found = max(prefixes, key=checkpoints.step_of, default=None)
    return found


def orbax_latest(work_dir: str) -> str | None:
    """The JAX engine's newest checkpoint ``<work_dir>/orbax/<step>``, found without
    orbax: orbax writes a step into a temporary directory and renames it to the bare
    step number when complete."""
    directory = f"{work_dir.rstrip('/')}/{ORBAX_SUBDIR}"
    if not _deadline.run(tf.io.gfile.isdir, directory, what="exists", path=directory):
        return None
    names = _deadline.run(tf.io.gfile.listdir, directory, what="checkpoint listing",
                          path=directory)
    steps = sorted((int(n.rstrip("/")) for n in names if n.rstrip("/").isdigit()),
                   reverse=True)
    if "://" not in directory:
        return f"{directory}/{steps[0]}" if steps else None
    # On GCS a step is complete once its marker is there (uploaded last; nothing renames).
    for step in steps:
        marker = f"{directory}/{step}/{ORBAX_COMMIT_FILE}"
        if _deadline.run(tf.io.gfile.exists, marker, what="exists", path=marker):
            return f"{directory}/{step}"
    return None


_LATEST = {"tf": tf_latest, "jax": orbax_latest}


def other_engines_checkpoint(work_dir: str, engine: str) -> str | None:
    """The other engine's newest checkpoint in `work_dir`, if it holds none of `engine`'s.

    Example:
        >>> other_engines_checkpoint('/kaggle/working/run', 'tf')
        '/kaggle/working/run/orbax/1000'
    """
    # The other engine's first: absent, as it nearly always is, one listing answers.
    theirs = _LATEST[other(engine)](work_dir)
    if theirs is None or _LATEST[engine](work_dir) is not None:
        return None
    return theirs


def _source_of_other_engine(source: str, engine: str) -> str | None:
    """`source` (a work_dir or one checkpoint) if it is the other engine's, else None."""
    source = source.rstrip("/")
    if os.path.basename(source) == ORBAX_SUBDIR:  # the orbax folder of a work_dir
        source = source[: -len(ORBAX_SUBDIR) - 1]
    is_orbax_step = bool(re.search(rf"(^|/){ORBAX_SUBDIR}/\d+$", source))
    is_tf_prefix = tf.io.gfile.exists(source + ".index")
    if engine == "tf":
        if is_orbax_step:
            return source
        return None if is_tf_prefix else other_engines_checkpoint(source, "tf")
    if is_tf_prefix:
        return source
    return None if is_orbax_step else other_engines_checkpoint(source, "jax")


# --------------------------------------------------------------------------- reading


def read(checkpoint: str) -> SavedWeights:
    """The model variables of either engine's checkpoint.

    Raises:
        ImportError: an orbax checkpoint and no orbax-checkpoint installed.

    Example:
        >>> saved = read('/kaggle/working/run/orbax/1000')
        >>> saved.engine, saved.step, saved.paths[0]
        ('jax', 1000, 'mnist_net/conv_bn/conv2d/kernel')
    """
    if re.search(rf"(^|/){ORBAX_SUBDIR}/\d+/?$", checkpoint):
        return _deadline.run(_read_orbax, checkpoint.rstrip("/"), what="checkpoint read",
                             path=checkpoint)
    return _deadline.run(_read_tf, checkpoint, what="checkpoint read", path=checkpoint)


def _read_tf(prefix: str) -> SavedWeights:
    # The object graph the checkpoint carries: its own record of which key holds which
    # variable, under the variable's full name (for a Keras variable, its path).
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    reader = tf.train.load_checkpoint(prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    paths, arrays = [], []
    for node in graph.nodes:
        for attribute in node.attributes:
            if attribute.checkpoint_key.startswith(_MODEL_KEYS):
                paths.append(attribute.full_name.split(":")[0])
                arrays.append(np.asarray(reader.get_tensor(attribute.checkpoint_key)))
    step = int(reader.get_tensor(_TF_STEP)) if reader.has_tensor(_TF_STEP) else 0
    return SavedWeights(prefix, "tf", step, paths, arrays, in_model_order=False)


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

        with tempfile.TemporaryDirectory(prefix="fenwicks-cross-engine-") as scratch:
            fw_io.download(path, scratch, progress=False)  # its own retries and bounds
            local = _read_orbax(os.path.join(scratch, os.path.basename(path)))
        return dataclasses.replace(local, checkpoint=path)
    ocp = _import_orbax(path)
    directory, step = os.path.dirname(path), int(os.path.basename(path))
    directory = directory if "://" in directory else os.path.abspath(directory)
    with ocp.CheckpointManager(directory, item_handlers=ocp.StandardCheckpointHandler(),
                               options=ocp.CheckpointManagerOptions(read_only=True)) as manager:
        paths = list(manager.metadata(step).custom_metadata["model"])
        # A target of host arrays: the checkpoint's sharding names the devices of the
        # process that wrote it (8 TPU cores), which this one may not have.
        target = _host_arrays(manager.item_metadata(step))
        tree = manager.restore(step, args=ocp.args.StandardRestore(target))
    step_value = int(tree["counters"]["global_step"])
    return SavedWeights(path, "jax", step_value, paths,
                        [np.asarray(a) for a in tree["model"]], in_model_order=True)


def _host_arrays(metadata: Any) -> Any:
    if isinstance(metadata, dict) or hasattr(metadata, "items"):
        return {key: _host_arrays(value) for key, value in metadata.items()}
    if isinstance(metadata, (list, tuple)):
        return [_host_arrays(value) for value in metadata]
    return np.zeros(metadata.shape, metadata.dtype)


# --------------------------------------------------------------------------- matching


def _name_and_rank(path: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """``'net_1/conv_bn_3/conv2d_3/kernel'`` -> ``(('net', 'conv_bn', 'conv2d',
    'kernel'), (1, 3, 3, 0))``: the path without Keras's uniquifying suffixes, and them."""
    names, ranks = [], []
    for part in path.split("/"):
        found = _SUFFIX.search(part)
        names.append(part[: found.start()] if found else part)
        ranks.append(int(found.group(1)) if found else 0)
    return tuple(names), tuple(ranks)


def _groups(paths: Sequence[str]) -> dict[tuple[str, ...], list[int]]:
    """Indices of `paths` by suffix-free path, each group in creation order."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, path in enumerate(paths):
        groups.setdefault(_name_and_rank(path)[0], []).append(i)
    for indices in groups.values():
        indices.sort(key=lambda i: (_name_and_rank(paths[i])[1], paths[i]))
    return groups


def match(variables: Sequence[Any], saved: SavedWeights) -> dict[int, int]:
    """Pairs `variables` with `saved`'s arrays: ``{variable index: saved index}``.

    By name first (exact path, else path without Keras's ``_<n>`` suffixes, paired in
    suffix order), then by position when names leave a variable out and `saved` is in
    model order with the same count and shapes. Only pairs of equal shape are returned.

    Example:
        >>> match(model.variables, read('/run/ckpt-100'))
        {0: 3, 1: 0, ...}
    """
    paths = [v.path for v in variables]
    shapes = [tuple(v.shape) for v in variables]
    theirs = [tuple(np.shape(a)) for a in saved.arrays]
    exact = {p: j for j, p in enumerate(saved.paths)}
    pairs = {i: exact[p] for i, p in enumerate(paths)
             if p in exact and theirs[exact[p]] == shapes[i]}
    if len(pairs) == len(paths):
        return pairs
    by_name: dict[int, int] = {}
    saved_groups = _groups(saved.paths)
    for name, ours in _groups(paths).items():
        found = saved_groups.get(name, [])
        if len(found) == len(ours):
            by_name.update((i, j) for i, j in zip(ours, found, strict=True)
                           if theirs[j] == shapes[i])
    used = set(by_name.values())
    for i, j in pairs.items():  # a partial warm start: exact paths the groups left out
        if i not in by_name and j not in used:
            by_name[i] = j
            used.add(j)
    if (len(by_name) < len(paths) and saved.in_model_order and theirs == shapes):
        logger.warning("fenwicks: %s: %d variable(s) did not match by name; all %d "
                       "variables have the same shapes in the same order, so they are "
                       "paired by position", saved.checkpoint, len(paths) - len(by_name),
                       len(paths))
        return dict(enumerate(range(len(paths))))
    return by_name


def _assign(variables: Sequence[Any], saved: SavedWeights, pairs: dict[int, int]) -> None:
    for i, j in pairs.items():
        variables[i].assign(saved.arrays[j].astype(variables[i].dtype))


def load_matching(model: Any, saved: SavedWeights) -> dict[str, list[str]]:
    """Loads each of `model`'s variables that `match` pairs in `saved` (a warm start).

    Returns:
        ``{'loaded': [...], 'not_loaded': [...]}`` of Keras variable paths.
    """
    variables = list(model.variables)
    pairs = match(variables, saved)
    _assign(variables, saved, pairs)
    return {"loaded": [v.path for i, v in enumerate(variables) if i in pairs],
            "not_loaded": [v.path for i, v in enumerate(variables) if i not in pairs]}


# --------------------------------------------------------------------------- the uses


def restore_for_reading(model: Any, work_dir: str, engine: str) -> SavedWeights | None:
    """Loads the model variables of the other engine's newest checkpoint in `work_dir`,
    if it holds none of `engine`'s; for `evaluate` and `predict` (`train` is refused:
    `refuse_training`).

    Returns:
        What was read (its `step` is the run's global step), or None if there was none.

    Raises:
        CrossEngineMismatchError: a model variable has no match in the checkpoint, or
            the checkpoint has model variables the model lacks. Nothing was loaded.
        ImportError: the checkpoint is orbax's and orbax-checkpoint is not installed.

    Example:
        >>> restore_for_reading(model, '/kaggle/input/run', 'tf').step
        1000
    """
    checkpoint = other_engines_checkpoint(work_dir, engine)
    if checkpoint is None:
        return None
    saved = read(checkpoint)
    variables = list(model.variables)
    pairs = match(variables, saved)
    missing = [v for i, v in enumerate(variables) if i not in pairs]
    unused = [j for j in range(len(saved.paths)) if j not in set(pairs.values())]
    if missing or unused:
        raise _mismatch(work_dir, saved, engine, missing, unused)
    _assign(variables, saved, pairs)
    logger.warning(
        "fenwicks: %s holds the %s's checkpoint %s (step %d) and none of the %s's: its "
        "%d model variables were loaded by name, for evaluate() and predict(); train() "
        "here is refused (warm_start_from=<this work_dir> into a new work_dir continues "
        "from these weights)", work_dir, ENGINES[saved.engine], checkpoint, saved.step,
        ENGINES[engine], len(variables))
    return saved


def _mismatch(work_dir: str, saved: SavedWeights, engine: str, missing: list,
              unused: list[int]) -> CrossEngineMismatchError:
    lines = [f"  {v.path} {list(v.shape)}: in the model, not matched in the checkpoint"
             for v in missing[:10]]
    lines += [f"  {saved.paths[j]} {list(np.shape(saved.arrays[j]))}: in the checkpoint, "
              "not matched in the model" for j in unused[:10]]
    return CrossEngineMismatchError(
        f"work_dir={work_dir!r} holds the {ENGINES[saved.engine]}'s checkpoint "
        f"{saved.checkpoint} (step {saved.step}), read here on the {ENGINES[engine]}; "
        f"{len(missing)} model variable(s) have no match in it and {len(unused)} of its "
        "variables none in the model (matched by Keras variable path, ignoring the _<n> "
        "suffixes Keras adds to names, and by shape):\n" + "\n".join(lines) +
        "\nNothing was loaded. Build the model with the model_func that trained this "
        f"work_dir, or evaluate on the {ENGINES[saved.engine]} "
        f"({_FORCE[saved.engine]}); warm_start_from=<this work_dir> in a new work_dir "
        "loads only the variables that match.")


def refuse_training(work_dir: str, engine: str) -> None:
    """Raises `CrossEngineTrainingError` if `work_dir` holds only the other engine's
    checkpoints (see the module's docstring for why training does not continue them).

    Example:
        >>> refuse_training('/content/run', 'tf')   # a JAX engine's work_dir
        CrossEngineTrainingError: work_dir='/content/run' holds the JAX engine's ...
    """
    checkpoint = other_engines_checkpoint(work_dir, engine)
    if checkpoint is None:
        return
    theirs = other(engine)
    raise CrossEngineTrainingError(
        f"work_dir={work_dir!r} holds the {ENGINES[theirs]}'s checkpoint {checkpoint} "
        f"(step {checkpoints.step_of(checkpoint)}) and none of the {ENGINES[engine]}'s, "
        f"which runs here. train() does not continue another engine's run in its "
        f"work_dir (its checkpoints would sit beside the {ENGINES[theirs]}'s, which would "
        "resume from its own and skip them). Either train on the "
        f"{ENGINES[theirs]} ({_FORCE[theirs]} in a new Python process), or continue from "
        f"its weights here in a new work_dir: get_tpu_estimator(..., work_dir=<new>, "
        f"warm_start_from={work_dir!r}) (model weights by name; the step and the "
        "optimizer start afresh). evaluate() and predict() read it on either engine. "
        "Nothing was read or written")


def warm_start(model: Any, source: str, engine: str) -> dict[str, list[str]] | None:
    """Warm-starts `model` from `source` if that is the other engine's work_dir or
    checkpoint: the model variables that match by name and shape (not the optimizer).

    Returns:
        ``{'loaded': [...], 'not_loaded': [...]}`` of Keras variable paths; None if
        `source` is not the other engine's (the engine's own warm start reads it).

    Example:
        >>> warm_start(model, '/kaggle/input/tpu-run', 'tf')['not_loaded']
        []
    """
    checkpoint = _source_of_other_engine(source, engine)
    if checkpoint is None:
        return None
    saved = read(checkpoint)
    report = load_matching(model, saved)
    logger.warning("fenwicks: warm start from the %s's checkpoint %s loaded %d "
                   "variable(s) by name; not loaded: %s", ENGINES[saved.engine],
                   checkpoint, len(report["loaded"]), report["not_loaded"] or "none")
    return report
