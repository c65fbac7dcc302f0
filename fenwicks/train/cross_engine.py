"""One engine's checkpoints read on the other: a work_dir trained on the TensorFlow engine
is evaluated, predicted from and warm-started on the JAX engine, and back.

Each engine reads only its own format, into one neutral form, `SavedWeights` (model
variables by Keras path, and the step): `fenwicks.train.tf.weights` (TensorFlow's
``<work_dir>/ckpt-<step>``) and `fenwicks.train.jax.weights` (orbax's
``<work_dir>/orbax/<step>``). Any engine then loads any other's weights by path: N
engines need N readers (each registry entry's ``reader``, `fenwicks._engine.readers`), not
one per pair.

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

Examples:
    >>> trained = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name='out')],
    ...                             name='net')
    >>> step = tf.Variable(100, dtype=tf.int64)   # in the TF engine's previous format
    >>> tf.train.Checkpoint(model=trained, global_step=step).write('run/ckpt-100')
    'run/ckpt-100'
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name='out')],
    ...                           name='net')
    >>> restore_for_reading(model, 'run', 'jax').step   # on the JAX engine: for evaluate
    100
    >>> np.array_equal(model.layers[0].kernel.numpy(), trained.layers[0].kernel.numpy())
    True
    >>> refuse_training('run', 'jax')   # but train continues it on the engine that wrote it
    Traceback (most recent call last):
    fenwicks.train.cross_engine.CrossEngineTrainingError: work_dir='run' holds the ...

    On the JAX engine, ``fw.train.get_tpu_estimator(..., work_dir='run')`` evaluates and
    predicts from these weights, and ``warm_start_from='run'`` starts a new work_dir
    from them.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from fenwicks import _deadline, _engine
from fenwicks import io as fw_io
from fenwicks.train import run_format
from fenwicks.train.checkpointing import step_of

logger = logging.getLogger("fenwicks")

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


def _reader(engine: str) -> Any:
    return importlib.import_module(_engine.readers()[engine])


def _others(engine: str) -> list[Any]:
    return [_reader(name) for name in _engine.readers() if name != engine]


def title(engine: str) -> str:
    """How messages name an engine: ``title('jax') == 'JAX engine'``."""
    return _reader(engine).TITLE


def any_engines_latest(work_dir: str) -> str | None:
    """The newest checkpoint in `work_dir` of any engine, or None.

    Examples:
        >>> any_engines_latest('/root/fenwicks/work/demo')
        '/root/fenwicks/work/demo/ckpt-252'
    """
    found = [found for name in _engine.readers() if (found := _reader(name).latest(work_dir))]
    if (newest := run_format.latest(work_dir)) is not None:
        found.append(newest)
    return max(found, key=step_of, default=None)


def other_engines_checkpoint(work_dir: str, engine: str) -> str | None:
    """Another engine's newest checkpoint in `work_dir`, if it holds none of `engine`'s.

    Examples:
        >>> trained = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name='out')],
        ...                             name='net')
        >>> step = tf.Variable(100, dtype=tf.int64)   # in the TF engine's previous format
        >>> tf.train.Checkpoint(model=trained, global_step=step).write('run/ckpt-100')
        'run/ckpt-100'
        >>> other_engines_checkpoint('run', 'jax')   # the JAX engine finds the TF engine's
        'run/ckpt-100'
        >>> other_engines_checkpoint('run', 'tf') is None   # the TF engine's own
        True
    """
    if run_format.latest(work_dir) is not None:  # the run format is every engine's
        return None
    # The others' first: absent, as they nearly always are, one listing each answers.
    theirs = [found for reader in _others(engine) if (found := reader.latest(work_dir))]
    if not theirs or _reader(engine).latest(work_dir) is not None:
        return None
    return max(theirs, key=step_of)


def _run_format_step(source: str) -> str | None:
    """`source`'s run-format step: `source` itself if it is one, else the newest of the
    work_dir `source`; None if it holds none."""
    source = source.rstrip("/")
    if run_format.is_step(source):
        if source.startswith("gs://") and not fw_io.exists(
                f"{source}/{run_format.COMMIT_FILE}"):
            raise ValueError(
                f"warm_start_from={source!r} is not a complete checkpoint (it has no "
                f"{run_format.COMMIT_FILE}: its upload was cut short); give the work_dir "
                "to use its latest complete checkpoint")
        return source
    if source.endswith(f"/{run_format.SUBDIR}"):
        source = source[: -len(run_format.SUBDIR) - 1]
    return run_format.latest(source)


def read_run_format(step_dir: str) -> SavedWeights:
    """The model variables of a run-format step, in the neutral form.

    Examples:
        >>> x, y = np.ones((8, 3), 'float32'), np.zeros(8, 'int64')
        >>> model_func = fw.train.get_clf_model_func(lambda: keras.Sequential(
        ...     [keras.Input((3,)), keras.layers.Dense(2, name='out')], name='net'),
        ...     fw.train.sgd_optimizer(0.1))
        >>> est = fw.train.get_tpu_estimator(1, model_func, 'run', trn_bs=8, verbose=False)
        >>> est.train(lambda params: fw.data.numpy_ds(x, y, params['batch_size']),
        ...           steps=2).global_step
        2
        >>> saved = read_run_format('run/checkpoints/2')   # the model's variables only
        >>> saved.engine, saved.step, saved.paths
        ('tf', 2, ['net/out/kernel', 'net/out/bias'])
    """
    record = run_format.read_record(step_dir)
    arrays = _deadline.run(_local_arrays, step_dir, record, what="checkpoint read",
                           path=step_dir)
    paths, values = [], []
    for group in ("trainable", "non_trainable"):
        paths += [path for path, _, _ in record["layout"][group]]
        values += arrays[group]
    return SavedWeights(step_dir, record["engine"], int(record["step"]), paths, values,
                        in_model_order=False)


def _local_arrays(step_dir: str, record: dict) -> dict:
    if not step_dir.startswith("gs://"):
        return run_format.read_arrays(step_dir, record)
    from fenwicks import _removal

    with _removal.temporary_dir(prefix="fenwicks-warm-start-") as scratch:
        fw_io.download(step_dir, scratch, progress=False)
        return run_format.read_arrays(f"{scratch}/{step_dir.rsplit('/', 1)[-1]}", record)


def _source_of_other_engine(source: str, engine: str) -> str | None:
    """`source` (a work_dir or one checkpoint) if it is another engine's, else None."""
    for reader in _others(engine):
        source = reader.work_dir_of(source)
        if reader.is_checkpoint(source):
            return source
    if _reader(engine).is_checkpoint(source):
        return None
    return other_engines_checkpoint(source, engine)


def _owner(checkpoint: str) -> Any:
    """The reader of the engine that wrote `checkpoint`."""
    for name in _engine.readers():
        if _reader(name).is_checkpoint(checkpoint):
            return _reader(name)
    raise ValueError(f"{checkpoint!r} is no engine's checkpoint (a TensorFlow "
                     "'.../ckpt-<step>' prefix or an orbax '.../orbax/<step>' folder)")


# --------------------------------------------------------------------------- reading


def read(checkpoint: str) -> SavedWeights:
    """The model variables of any engine's checkpoint, in the neutral form.

    Raises:
        ImportError: an orbax checkpoint and no orbax-checkpoint installed.

    Examples:
        >>> trained = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name='out')],
        ...                             name='net')
        >>> step = tf.Variable(100, dtype=tf.int64)   # in the TF engine's previous format
        >>> tf.train.Checkpoint(model=trained, global_step=step).write('run/ckpt-100')
        'run/ckpt-100'
        >>> saved = read('run/ckpt-100')
        >>> saved.engine, saved.step, saved.paths
        ('tf', 100, ['net/out/kernel', 'net/out/bias'])
    """
    return _deadline.run(_owner(checkpoint).read, checkpoint, what="checkpoint read",
                         path=checkpoint)


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

    Examples:
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name='out')],
        ...                           name='net')
        >>> [v.path for v in model.variables]
        ['net/out/kernel', 'net/out/bias']
        >>> saved = SavedWeights('run/ckpt-100', 'tf', 100,   # paths of another process
        ...                      ['net_1/out_1/bias', 'net_1/out_1/kernel'],
        ...                      [np.zeros(2), np.zeros((3, 2))], in_model_order=False)
        >>> match(model.variables, saved)   # by path without Keras's _<n>, then shape
        {0: 1, 1: 0}
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

    Examples:
        >>> trained = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name='out')],
        ...                             name='net')
        >>> step = tf.Variable(100, dtype=tf.int64)   # in the TF engine's previous format
        >>> tf.train.Checkpoint(model=trained, global_step=step).write('run/ckpt-100')
        'run/ckpt-100'
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name='out')],
        ...                           name='net')
        >>> restore_for_reading(model, 'run', 'jax').step   # as the JAX engine reads it
        100
        >>> np.array_equal(model.layers[0].kernel.numpy(), trained.layers[0].kernel.numpy())
        True
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
        "from these weights)", work_dir, title(saved.engine), checkpoint, saved.step,
        title(engine), len(variables))
    return saved


def _mismatch(work_dir: str, saved: SavedWeights, engine: str, missing: list,
              unused: list[int]) -> CrossEngineMismatchError:
    lines = [f"  {v.path} {list(v.shape)}: in the model, not matched in the checkpoint"
             for v in missing[:10]]
    lines += [f"  {saved.paths[j]} {list(np.shape(saved.arrays[j]))}: in the checkpoint, "
              "not matched in the model" for j in unused[:10]]
    return CrossEngineMismatchError(
        f"work_dir={work_dir!r} holds the {title(saved.engine)}'s checkpoint "
        f"{saved.checkpoint} (step {saved.step}), read here on the {title(engine)}; "
        f"{len(missing)} model variable(s) have no match in it and {len(unused)} of its "
        "variables none in the model (matched by Keras variable path, ignoring the _<n> "
        "suffixes Keras adds to names, and by shape):\n" + "\n".join(lines) +
        "\nNothing was loaded. Build the model with the model_func that trained this "
        f"work_dir, or evaluate on the {title(saved.engine)} "
        f"(FENWICKS_ENGINE={saved.engine}); warm_start_from=<this work_dir> in a new "
        "work_dir "
        "loads only the variables that match.")


def refuse_training(work_dir: str, engine: str) -> None:
    """Raises `CrossEngineTrainingError` if `work_dir` holds only the other engine's
    checkpoints (see the module's docstring for why training does not continue them).

    Examples:
        >>> trained = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name='out')],
        ...                             name='net')
        >>> step = tf.Variable(100, dtype=tf.int64)   # in the TF engine's previous format
        >>> tf.train.Checkpoint(model=trained, global_step=step).write('run/ckpt-100')
        'run/ckpt-100'
        >>> refuse_training('run', 'tf')   # the TF engine's own: nothing to refuse
        >>> refuse_training('run', 'jax')
        Traceback (most recent call last):
        fenwicks.train.cross_engine.CrossEngineTrainingError: work_dir='run' holds the ...
    """
    checkpoint = other_engines_checkpoint(work_dir, engine)
    if checkpoint is None:
        return
    theirs = _owner(checkpoint).NAME
    raise CrossEngineTrainingError(
        f"work_dir={work_dir!r} holds the {title(theirs)}'s checkpoint {checkpoint} "
        f"(step {step_of(checkpoint)}) and none of the {title(engine)}'s, "
        f"which runs here. train() does not continue another engine's run in its "
        f"work_dir (its checkpoints would sit beside the {title(theirs)}'s, which would "
        "resume from its own and skip them). Either train on the "
        f"{title(theirs)} (FENWICKS_ENGINE={theirs} in a new Python process), or continue "
        "from "
        f"its weights here in a new work_dir: get_tpu_estimator(..., work_dir=<new>, "
        f"warm_start_from={work_dir!r}) (model weights by name; the step and the "
        "optimizer start afresh). evaluate() and predict() read it on either engine. "
        "Nothing was read or written")


def warm_start(model: Any, source: str, engine: str) -> dict[str, list[str]] | None:
    """Warm-starts `model` from `source` if that is a run-format work_dir or step (any
    engine's), or the other engine's previous format: the model variables that match
    by name and shape (not the optimizer).

    Returns:
        ``{'loaded': [...], 'not_loaded': [...]}`` of Keras variable paths; None if
        `source` is neither (the engine's own previous format: its warm start reads it).

    Examples:
        >>> trained = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name='out')],
        ...                             name='net')
        >>> step = tf.Variable(100, dtype=tf.int64)   # in the TF engine's previous format
        >>> tf.train.Checkpoint(model=trained, global_step=step).write('run/ckpt-100')
        'run/ckpt-100'
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name='out')],
        ...                           name='net')
        >>> warm_start(model, 'run', 'jax')   # as the JAX engine warm-starts from it
        {'loaded': ['net/out/kernel', 'net/out/bias'], 'not_loaded': []}
    """
    step_dir = _run_format_step(source)
    if step_dir is not None:
        saved = read_run_format(step_dir)
        report = load_matching(model, saved)
        logger.warning("fenwicks: warm start from %s (written on the %s, step %d) loaded "
                       "%d variable(s) by name; not loaded: %s", step_dir,
                       title(saved.engine), saved.step, len(report["loaded"]),
                       report["not_loaded"] or "none")
        return report
    checkpoint = _source_of_other_engine(source, engine)
    if checkpoint is None:
        return None
    saved = read(checkpoint)
    report = load_matching(model, saved)
    logger.warning("fenwicks: warm start from the %s's checkpoint %s loaded %d "
                   "variable(s) by name; not loaded: %s", title(saved.engine),
                   checkpoint, len(report["loaded"]), report["not_loaded"] or "none")
    return report
