"""One engine's checkpoints read on the other: a work_dir trained on the TensorFlow engine
is evaluated, predicted from, warm-started and continued on the JAX engine, and back.

Runs written today are in the run format (`fenwicks.train.run_format`), which every
engine reads. This module reads the formats before it, each engine's own: each engine's
reader reads only its own format, into one neutral form, `SavedWeights` (model variables
by Keras path, optimizer variables in ``optimizer.variables`` order, the step and the
input position): `fenwicks.train.tf.weights` (TensorFlow's ``<work_dir>/ckpt-<step>``)
and `fenwicks.train.jax.weights` (orbax's ``<work_dir>/orbax/<step>``). Any engine then
loads any other's state: N engines need N readers (each registry entry's ``reader``,
`fenwicks._engine.readers`), not one per pair.

**Matching by name.** A variable of the model is matched to the checkpoint's by its Keras
path. Keras makes names unique per process (``conv2d``, then ``conv2d_1`` for the next
model built), so a model built after another one has other paths than the same model
built first: every path component is compared without its ``_<n>`` suffix, and variables
whose paths are then equal are paired in the order of those suffixes (Keras counts up as
it creates layers, so the order is the creation order in both processes). Shapes are
checked for every pair. If names leave any variable unmatched and the checkpoint lists
its variables in model order (orbax does) with the same count and shapes, variables are
paired by position, with a warning. Restoring a work_dir needs every model variable
matched and raises `CrossEngineMismatchError` naming those that are not; a warm start
loads what matches and reports the rest, as on one engine. Optimizer variables are paired
by position (both formats saved them as the optimizer lists them), their shapes checked;
across a loss scale's wrapper (a float16 run's `LossScaleOptimizer` against a checkpoint
of another precision, or the reverse) as the run format pairs them
(`run_format.optimizer_pairs`). The same pairing continues an engine's own checkpoint of
the previous format that its reader refuses only for that wrapper (`AtAnotherPrecision`).

**A run continues** (`OtherEnginesReader`): a work_dir that holds only the other engine's
checkpoints of the previous format is restored whole, as a run-format step is: model
variables, optimizer ``iterations`` and slots (so the learning-rate schedule continues),
the step and the input position, with the run format's one-line warning that the run
continues from the other engine's step. Its next checkpoint is in the run format, and
every later one (the old checkpoint stays as it was). What those formats never held is
not restored: Keras's global seed generator (the warning says so). A checkpoint that
lacks what training needs (the reference engine's hold no optimizer variables) or whose
optimizer variables are not this optimizer's is loaded for `evaluate` and `predict`
only, and ``train()`` is refused in one sentence (`cannot_continue`).

Examples:
    >>> trained = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name='out')],
    ...                             name='net')
    >>> step = tf.Variable(100, dtype=tf.int64)   # in the TF engine's previous format
    >>> tf.train.Checkpoint(model=trained, global_step=step).write('run/ckpt-100')
    'run/ckpt-100'
    >>> other_engines_checkpoint('run', 'jax')   # what the JAX engine finds there
    'run/ckpt-100'
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name='out')],
    ...                           name='net')
    >>> warm_start(model, 'run', 'jax')   # by Keras path, as warm_start_from='run' does
    {'loaded': ['net/out/kernel', 'net/out/bias'], 'not_loaded': []}
    >>> np.array_equal(model.layers[0].kernel.numpy(), trained.layers[0].kernel.numpy())
    True

    On the JAX engine, ``fw.train.get_tpu_estimator(..., work_dir='run')`` would restore
    it for evaluate and predict; this checkpoint holds no optimizer variables, so
    ``train()`` there is refused (`cannot_continue`), while a TensorFlow engine's
    ``ckpt-<step>`` written with its optimizer and input position continues whole.
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
from fenwicks._text import first_line
from fenwicks.train import run_format
from fenwicks.train.checkpointing import (
    Checkpointer,
    CheckpointReadError,
    is_storage_error,
    none_readable,
    step_of,
)

logger = logging.getLogger("fenwicks")

_SUFFIX = re.compile(r"_(\d+)$")  # what Keras appends to make a layer's name unique


class CrossEngineMismatchError(ValueError):
    """The other engine's checkpoint does not hold every variable of this model."""


@dataclasses.dataclass(frozen=True)
class SavedWeights:
    """A checkpoint's model variables by Keras path, and what else it holds of the run.

    Attributes:
        checkpoint: the checkpoint read (``.../ckpt-<step>`` or ``.../orbax/<step>``).
        engine: the engine that wrote it, ``'tf'`` or ``'jax'``.
        step: its global step.
        paths: the variables' Keras paths, as that engine's process named them.
        arrays: their values, in `paths`' order.
        in_model_order: whether `paths` follow ``model.variables`` (orbax's list does;
            TensorFlow's object graph does not).
        optimizer: the optimizer's variables (``iterations`` and the slots) in
            ``optimizer.variables`` order; None if the checkpoint holds none.
        optimizer_paths: their Keras paths, as that engine's process named them.
        input_steps: the input position, in steps; None if the checkpoint holds none.
    """

    checkpoint: str
    engine: str
    step: int
    paths: list[str]
    arrays: list[np.ndarray]
    in_model_order: bool
    optimizer: list[np.ndarray] | None = None
    optimizer_paths: list[str] = dataclasses.field(default_factory=list)
    input_steps: int | None = None


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


def run_format_step(source: str) -> str | None:
    """`source`'s run-format step: `source` itself if it is one, else the newest of the
    work_dir `source` (or of its ``checkpoints`` folder); None if it holds none."""
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
        >>> saved = read_run_format('run/checkpoints/2')
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
        >>> saved.engine, saved.step, saved.paths, saved.optimizer
        ('tf', 100, ['net/out/kernel', 'net/out/bias'], None)
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
    if it holds none of `engine`'s; for `evaluate` and `predict` on an engine that does
    not continue other engines' runs (the reference engine: `cannot_continue`). The
    TensorFlow and JAX engines restore the whole run instead (`OtherEnginesReader`).

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
        >>> restore_for_reading(model, 'run', 'reference').step   # on the reference engine
        100
        >>> np.array_equal(model.layers[0].kernel.numpy(), trained.layers[0].kernel.numpy())
        True
    """
    checkpoint = other_engines_checkpoint(work_dir, engine)
    if checkpoint is None:
        return None
    saved = read(checkpoint)
    variables = list(model.variables)
    _assign(variables, saved, _match_all(variables, saved, work_dir, engine))
    _warn_weights_only(work_dir, saved, engine, len(variables),
                       f"the {title(engine)} continues no other engine's run")
    return saved


def _match_all(variables: Sequence[Any], saved: SavedWeights, work_dir: str,
               engine: str) -> dict[int, int]:
    """`match`, every variable of the model and of the checkpoint paired; else
    `CrossEngineMismatchError`."""
    pairs = match(variables, saved)
    missing = [v for i, v in enumerate(variables) if i not in pairs]
    unused = [j for j in range(len(saved.paths)) if j not in set(pairs.values())]
    if missing or unused:
        raise _mismatch(work_dir, saved, engine, missing, unused)
    return pairs


def _warn_weights_only(work_dir: str, saved: SavedWeights, engine: str, count: int,
                       why: str) -> None:
    logger.warning(
        "fenwicks: %s holds the %s's checkpoint %s (step %d) and none of the %s's: its "
        "%d model variables were loaded by name, for evaluate() and predict(); train() "
        "here is refused, as %s (warm_start_from=<this work_dir> into a new work_dir "
        "continues from these weights)", work_dir, title(saved.engine), saved.checkpoint,
        saved.step, title(engine), count, why)


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


def cannot_continue(work_dir: str, saved: SavedWeights, engine: str, why: str) -> str:
    """The one sentence refusing ``train()`` on `work_dir`, whose other engine's
    checkpoint `saved` was loaded for evaluate and predict only, because of `why`.

    Examples:
        >>> saved = SavedWeights('run/ckpt-2', 'tf', 2, ['net/out/kernel'], [np.ones((3, 2))],
        ...                      in_model_order=False)   # no optimizer variables
        >>> cannot_continue('run', saved, 'jax', 'it holds no optimizer variables')
        "work_dir='run' holds the TensorFlow engine's checkpoint run/ckpt-2 (step 2), and it
        holds no optimizer variables, so train() on the JAX engine cannot continue its run
        there: ..."
    """
    return (f"work_dir={work_dir!r} holds the {title(saved.engine)}'s checkpoint "
            f"{saved.checkpoint} (step {saved.step}), and {why}, so train() on the "
            f"{title(engine)} cannot continue its run there: its weights were loaded for "
            "evaluate() and predict() only, and get_tpu_estimator(..., work_dir=<new>, "
            f"warm_start_from={work_dir!r}) continues from them in a new work_dir (the "
            "step and the optimizer start afresh); nothing was written")


def _why_not_trainable(saved: SavedWeights, optimizer: Sequence[Any],
                       pairs: list[int | None] | None = None) -> str | None:
    """Why `saved` cannot continue a run with the live `optimizer` variables; None if
    it can. `pairs`: `run_format.optimizer_pairs` of the two (None: in order)."""
    if saved.optimizer is None:
        return "it holds no optimizer variables (iterations, slots)"
    if saved.input_steps is None:
        return "it holds no input position"
    ours = [[int(d) for d in v.shape] for v in optimizer]
    theirs = ([list(np.shape(a)) for a in saved.optimizer] if pairs is None else
              [list(np.shape(saved.optimizer[j])) if j is not None else mine
               for j, mine in zip(pairs, ours, strict=True)])
    if theirs != ours:
        first = next((i for i, (a, b) in enumerate(zip(theirs, ours, strict=False))
                      if a != b),
                     min(len(theirs), len(ours)))
        return (f"its {len(theirs)} optimizer variables are not this optimizer's "
                f"{len(ours)} (the first that differs is #{first}: "
                f"{theirs[first] if first < len(theirs) else 'none'} in the checkpoint, "
                f"{ours[first] if first < len(ours) else 'none'} here)")
    return None


class _ReadOnly(Checkpointer):
    """A reader of a previous format in the run's `Checkpointer` seat: it restores, and
    never writes (the run's checkpoints are written in the run format)."""

    @property
    def last_save_secs(self) -> float | None:
        return None

    def save(self, step: int, *, force: bool = False) -> None:
        raise NotImplementedError("a previous format is only read; the run's checkpoints "
                                  "are written in the run format")

    def wait(self) -> None:
        """Nothing is ever written."""


class OtherEnginesReader(_ReadOnly):
    """Restores the other engine's newest checkpoint of the previous format in `work_dir`
    (TensorFlow's ``ckpt-<step>``, the JAX engine's ``orbax/<step>``) into this engine's
    run state, whole, as a run-format step is restored; never writes (the run's
    `run_format.RunCheckpointer` writes the run format from then on).

    Model variables are matched by Keras path (`match`), optimizer variables by
    position; the step and the input position are set, and the run format's warning
    says the run continues from the other engine's step. A checkpoint that cannot be
    continued (`_why_not_trainable`) has its model variables and step loaded, for
    evaluate and predict, and `training_refusal` says why, for ``train()``.

    Args:
        work_dir: the run's work_dir.
        engine: the engine restoring (``'tf'``, ``'jax'``).
        parts: the run's state (`run_format.RunParts`: ``scatter``, ``snapshot``,
            ``to_host``, ``set_counters``, ``apply_record``).
        groups: its Keras variables by group (`run_format.variable_groups`).

    Examples:
        >>> from fenwicks.train.options import EstimatorConfig
        >>> from fenwicks.train.tf.state import TFRunState
        >>> acc = fw.accel.current()
        >>> config = EstimatorConfig(steps_per_epoch=1, work_dir='run', train_batch_size=4,
        ...                          eval_batch_size=4, predict_batch_size=4, steps_per_loop=1,
        ...                          precision='float32', num_replicas=acc.num_replicas)
        >>> model_func = fw.train.get_clf_model_func(lambda: keras.Sequential(
        ...     [keras.Input((3,)), keras.layers.Dense(2, name='out')], name='net'),
        ...     lambda: keras.optimizers.SGD(0.1))   # its variables: iteration, learning rate
        >>> state = TFRunState(model_func, config, acc)   # on the TensorFlow engine
        >>> state.build(tf.TensorSpec([None, 3], tf.float32), {})   # 'run' holds nothing yet

        Step 100 of a run on the JAX engine, as that engine wrote it before the run
        format: one pytree saved with orbax in ``run/orbax/100``, the variables' Keras
        paths in its metadata.

        >>> import os, orbax.checkpoint as ocp
        >>> old = {'model': [np.ones((3, 2), 'float32'), np.zeros(2, 'float32')],
        ...        'optimizer': [np.int64(100), np.float32(0.1)],
        ...        'counters': {'global_step': np.int64(100), 'input_steps': np.int64(100)}}
        >>> with ocp.CheckpointManager(os.path.abspath('run/orbax')) as manager:
        ...     manager.save(100, args=ocp.args.StandardSave(old), custom_metadata={
        ...         'model': ['net/out/kernel', 'net/out/bias'],
        ...         'optimizer': ['sgd/iteration', 'sgd/learning_rate']})
        True
        >>> groups = run_format.variable_groups(state.spec.model, state.optimizer)
        >>> reader = OtherEnginesReader('run', 'tf', state, groups)
        >>> reader.restore()   # the JAX engine's newest, into the TensorFlow engine's state
        'run/orbax/100'
        >>> state.global_step, int(state.optimizer.iterations), reader.training_refusal
        (100, 100, None)
        >>> state.spec.model.layers[0].kernel.numpy()
        array([[1., 1.],
               [1., 1.],
               [1., 1.]], dtype=float32)
        >>> state.close()
    """

    def __init__(self, work_dir: str, engine: str, parts: Any,
                 groups: dict[str, list[Any]]) -> None:
        self.directory = self.work_dir = work_dir.rstrip("/")
        self._engine, self._parts, self._groups = engine, parts, groups
        self._good: str | None = None  # the checkpoint restored
        self._newest: str | None = None  # the newest there then (damaged, or `_good`)
        self.training_refusal: str | None = None  # why train() cannot continue it

    @property
    def latest(self) -> str | None:
        return self._good

    @property
    def last_good(self) -> str | None:
        return self._good

    def change_on_disk(self) -> str | None:
        """None if the other engine's newest checkpoint is the one restored; ``'removed'``
        if there is none any more; else ``'replaced'``."""
        theirs = other_engines_checkpoint(self.work_dir, self._engine)
        if theirs is None:
            return "removed" if self._good else None
        return None if theirs == self._newest else "replaced"

    def restore(self, path: str | None = None) -> str | None:
        """Restores `path`, or the other engine's newest checkpoint in the work_dir.

        Returns:
            The checkpoint restored, or None if the work_dir holds none.

        Raises:
            CrossEngineMismatchError: a model variable has no match in the checkpoint, or
                the checkpoint has model variables the model lacks. Nothing was loaded.
            CheckpointCorruptError: the other engine's checkpoints are there but none
                can be read (a damaged newest one falls back to an older one, with a
                warning).
        """
        saved = self._read(path)
        if saved is None:
            return None
        checkpoint = saved.checkpoint
        model = self._groups["trainable"] + self._groups["non_trainable"]
        tree = _model_tree(self._groups, saved,
                           _match_all(model, saved, self.work_dir, self._engine))
        pairs = _optimizer_pairs(saved, self._groups["optimizer"])
        why = _why_not_trainable(saved, self._groups["optimizer"], pairs)
        if why is None:
            _restore_whole(self._parts, self._groups, saved, tree, pairs)
        else:
            live = self._parts.to_host(self._parts.snapshot())["optimizer"]
            self._parts.scatter({**tree, "optimizer": live})
            self._parts.set_counters(saved.step, saved.input_steps or 0)
            _warn_weights_only(self.work_dir, saved, self._engine, len(model), why)
        self.training_refusal = (None if why is None else
                                 cannot_continue(self.work_dir, saved, self._engine, why))
        self._good = checkpoint
        return checkpoint

    def _read(self, path: str | None) -> SavedWeights | None:
        """`path` read, or the newest of the other engine's checkpoints that can be: a
        damaged one (files cut short, garbled metadata) is skipped with a warning, as
        each engine skipped its own, and left as it is (this engine changes nothing of
        the other's).

        Raises:
            CheckpointCorruptError: checkpoints are there but none can be read.
        """
        if path is not None:
            self._newest = path
            return read(path)
        newest = self._newest = other_engines_checkpoint(self.work_dir, self._engine)
        if newest is None:
            return None
        owner = _owner(newest)
        listed = [c for c in owner.all_checkpoints(self.work_dir)
                  if step_of(c) <= step_of(newest)] or [newest]
        damaged: list[tuple[str, str]] = []
        for checkpoint in reversed(listed):
            try:
                saved = read(checkpoint)
            except Exception as err:
                if (isinstance(err, (ImportError, TimeoutError, CheckpointReadError))
                        or _deadline.is_outage(err) or is_storage_error(err)):
                    raise  # not the files' fault: nothing says they are damaged
                cause = first_line(err).split(" See full TensorStore details")[0][:300]
                damaged.append((checkpoint, cause or type(err).__name__))
                continue
            for where, why in damaged:
                logger.warning("fenwicks: checkpoint %s is unreadable (%s); resumed from "
                               "the older %s instead. Its files are left as they are (the "
                               "%s's)", where, why, checkpoint, owner.TITLE)
            return saved
        raise none_readable(self.work_dir, len(listed), damaged,
                            f"the {owner.TITLE}'s checkpoints")


def _model_tree(groups: dict[str, list[Any]], saved: SavedWeights,
                pairs: dict[int, int]) -> run_format.StateTree:
    """The checkpoint's model arrays as the model's groups list its variables."""
    arrays = [saved.arrays[pairs[i]] for i in range(len(pairs))]
    split = len(groups["trainable"])
    return {"trainable": arrays[:split], "non_trainable": arrays[split:]}


def _optimizer_pairs(saved: SavedWeights, ours: Sequence[Any]) -> list[int | None] | None:
    """`run_format.optimizer_pairs` of a checkpoint's and the live optimizer variables:
    across a loss scale's wrapper (a checkpoint of another precision); None in order."""
    if saved.optimizer is None:
        return None
    return run_format.optimizer_pairs(saved.optimizer_paths, [v.path for v in ours])


def _restore_whole(parts: Any, groups: dict[str, list[Any]], saved: SavedWeights,
                   tree: run_format.StateTree, pairs: list[int | None] | None) -> None:
    """Scatters a checkpoint that can continue the run (model arrays `tree`, optimizer
    paired by `pairs`) and applies its step and input position."""
    optimizer, notes = saved.optimizer, []
    if pairs is not None:
        live = parts.to_host(parts.snapshot())["optimizer"]
        optimizer = run_format.carry(saved.optimizer, live, pairs)
        notes = run_format.not_carried(run_format.layout_of(
            {"optimizer": groups["optimizer"]})["optimizer"], live, pairs)
    parts.scatter({**tree, "optimizer": optimizer})
    # The run format's record, but for Keras's global seed generator: the formats
    # before it did not hold it (no "seed": `RunState.apply_record` says so).
    parts.apply_record({"engine": saved.engine, "step": saved.step,
                        "input_steps": saved.input_steps,
                        **({"not_restored": notes} if notes else {})})


class AtAnotherPrecision(_ReadOnly):
    """An engine's reader of its own previous format (`run_format.PreviousFormatReader`)
    that also continues a checkpoint it refuses only because the run's precision changed:
    float16 wraps the optimizer in a ``LossScaleOptimizer``, bfloat16 and float32 do not,
    and the engine's own reader pairs optimizer variables as they are. Such a checkpoint
    is read into the neutral form (`read`) and restored whole, its optimizer variables
    paired across the wrapper (`run_format.optimizer_pairs`); any other refusal is the
    engine reader's, unchanged.

    Args:
        own: the engine's reader of its previous format.
        work_dir: the run's work_dir.
        engine: the engine restoring.
        parts: the run's state (`run_format.RunParts`).
        groups: its Keras variables by group (`run_format.variable_groups`).
    """

    def __init__(self, own: Any, work_dir: str, engine: str, parts: Any,
                 groups: dict[str, list[Any]]) -> None:
        self._own, self._engine, self._parts, self._groups = own, engine, parts, groups
        self.directory = self.work_dir = work_dir.rstrip("/")
        self._good: str | None = None  # a checkpoint restored across the wrapper

    @property
    def training_refusal(self) -> str | None:
        return None if self._good else getattr(self._own, "training_refusal", None)

    @property
    def latest(self) -> str | None:
        return self._good or getattr(self._own, "latest", None)

    @property
    def last_good(self) -> str | None:
        return self._good or getattr(self._own, "last_good", None)

    def change_on_disk(self) -> str | None:
        """As the engine's reader's, for a checkpoint restored across the wrapper."""
        if self._good is None:
            return self._own.change_on_disk()
        newest = _reader(self._engine).latest(self.work_dir)
        if newest is None:
            return "removed"
        return None if newest == self._good else "replaced"

    def restore(self, path: str | None = None) -> str | None:
        """The engine's reader's restore; for a checkpoint it refuses whose optimizer
        differs only by a loss scale's wrapper, that checkpoint restored across it.

        Raises:
            ValueError: the engine's reader's refusal (a `CheckpointMismatchError` on the
                TensorFlow engine), for any other difference.
        """
        try:
            return self._own.restore(path)
        except ValueError:
            restored = self._across_the_wrapper(path)
            if restored is None:
                raise
            return restored

    def _across_the_wrapper(self, path: str | None) -> str | None:
        checkpoint = path or _reader(self._engine).latest(self.work_dir)
        if checkpoint is None:
            return None
        try:
            saved = read(checkpoint)
        except Exception:  # noqa: BLE001 - the engine's reader's refusal is the news
            return None
        optimizer = self._groups["optimizer"]
        pairs = _optimizer_pairs(saved, optimizer)
        if pairs is None or _why_not_trainable(saved, optimizer, pairs) is not None:
            return None
        model = self._groups["trainable"] + self._groups["non_trainable"]
        matched = match(model, saved)
        if len(matched) != len(model) or len(set(matched.values())) != len(saved.paths):
            return None
        _restore_whole(self._parts, self._groups, saved,
                       _model_tree(self._groups, saved, matched), pairs)
        self._good = checkpoint
        return checkpoint

    def close(self) -> None:
        self._own.close()


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
    step_dir = run_format_step(source)
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
