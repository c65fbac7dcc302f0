"""The TensorFlow engine's checkpoints of work_dirs written before the run format
(``<work_dir>/ckpt-<step>``), and TF2 checkpoints given to warm start: what they hold,
safe resume from them, and warm start from another run. They are read, never written:
a run writes the run format (`fenwicks.train.run_format`); `legacy_reader.LegacyReader`
restores these.

A checkpoint holds every variable the next step depends on:

* ``model/...``: the model through TensorFlow's object graph (readable keys, which warm
  start matches by name);
* ``model_extra/NNNN``: model variables that graph does not reach, keyed by their
  position in ``model.variables``. Keras 3 tracks sublayers kept in Python lists and its
  seed generators (Dropout's random state), but TensorFlow's checkpoint graph follows
  neither, so a plain ``tf.train.Checkpoint(model=model)`` silently drops them. Fenwicks'
  own layers keep sublayers in attributes; a user's layer that uses a list still has
  every variable saved, with a warning that names them;
* ``optimizer_state/NNNN``: the optimizer's own slots, a flat list (so the model's
  variables are always saved under ``model/`` and never under the optimizer's references);
* ``global_step`` and ``input_steps`` (how far the training input has been read).

`make_checkpoint` checks that every one of these variables is reachable from the root
and raises `CheckpointCoverageError` otherwise: no variable is ever dropped silently.
Before anything is restored the checkpoint is compared with the model, so a work_dir that
holds another model's checkpoint gives an error that names the variables, and nothing in
it is overwritten.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import tempfile
import weakref
from collections.abc import Iterable
from typing import Any

import keras
import tensorflow as tf

from fenwicks import _deadline, _removal, _tf_internals
from fenwicks._text import first_line
from fenwicks.train.checkpointing import (  # noqa: F401  (their home: shared)
    CheckpointCorruptError,
    CheckpointCoverageError,
    CheckpointMismatchError,
    CheckpointReadError,
    ProbeWriteError,
    is_storage_error,
    none_readable,
    step_of,
)

logger = logging.getLogger("fenwicks")

_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
# Bookkeeping entries that differ between any two checkpoints and say nothing about the model.
_IGNORED_KEYS = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter" + _VALUE_SUFFIX)
_EXTRA = "model_extra"


def _ids(variable: Any) -> tuple[int, ...]:
    """A Keras variable and the TensorFlow variable inside it (either may be tracked)."""
    inner = getattr(variable, "value", None)
    return (id(variable),) if inner is None else (id(variable), id(inner))


def _reachable(root: Any) -> set[int]:
    return {id(node) for node in tf.train.TrackableView(root).descendants()}


def _unreached_model_variables(model: keras.Model) -> dict[int, Any]:
    """Position in ``model.variables`` -> variable, for those the object graph misses."""
    reached = _reachable(tf.train.Checkpoint(model=model))
    return {i: v for i, v in enumerate(model.variables)
            if not reached.intersection(_ids(v))}


def _warn_unreached(extra: dict[int, Any]) -> None:
    # Seed generators are never in TF's graph; that is Keras's design, not the user's.
    named = [v.path for v in extra.values() if not v.path.endswith("seed_generator_state")]
    if named:
        logger.warning(
            "fenwicks: %d model variable(s) are not reachable through TensorFlow's "
            "checkpoint graph (a layer keeps sublayers in a Python list?): %s. They are "
            "saved by position under %s/, so resuming is exact, but warm start from another "
            "model cannot match them by name. To fix, assign each sublayer to its own "
            "attribute (self.block_0 = ..., self.block_1 = ...)", len(named),
            ", ".join(named[:8]) + (" ..." if len(named) > 8 else ""), _EXTRA)


def make_checkpoint(model: keras.Model, optimizer: Any, global_step: tf.Variable,
                    input_steps: tf.Variable) -> tf.train.Checkpoint:
    """The root object every Fenwicks checkpoint saves and restores.

    Raises:
        CheckpointCoverageError: if a model or optimizer variable, or a step counter,
            is not reachable from the root (it would not be saved).
    """
    extra = _unreached_model_variables(model)
    _warn_unreached(extra)
    root = tf.train.Checkpoint(
        model=model,
        model_extra={f"{i:04d}": v for i, v in extra.items()},
        optimizer_state={f"{i:04d}": v for i, v in enumerate(optimizer.variables)},
        global_step=global_step, input_steps=input_steps)
    check_coverage(root, [*model.variables, *optimizer.variables, global_step, input_steps])
    return root


def check_coverage(root: Any, variables: Iterable[Any]) -> None:
    """Raises `CheckpointCoverageError` naming each of `variables` that `root` misses.

    Examples:
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> step = tf.Variable(0)
        >>> check_coverage(tf.train.Checkpoint(model=model, step=step), [*model.variables, step])
        >>> check_coverage(tf.train.Checkpoint(model=model), [*model.variables, step])
        Traceback (most recent call last):
        fenwicks.train.checkpointing.CheckpointCoverageError: 1 variable(s) would not be saved ...
    """
    reached = _reachable(root)
    missing = [getattr(v, "path", v.name) for v in variables
               if not reached.intersection(_ids(v))]
    if missing:
        raise CheckpointCoverageError(
            f"{len(missing)} variable(s) would not be saved in the checkpoint: "
            f"{', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}. Nothing was "
            "trained or written. If a layer of yours keeps sublayers or variables in a "
            "container TensorFlow does not track, assign each to its own attribute")


def latest(directory: str) -> str | None:
    """The newest checkpoint prefix in `directory` (local or gs://), or None."""
    return _deadline.run(_latest, directory, what="latest checkpoint", path=directory)


def _latest(directory: str) -> str | None:
    if not tf.io.gfile.exists(directory):
        return None
    return tf.train.latest_checkpoint(directory)


def resolve(path: str) -> str:
    """A checkpoint prefix from a prefix or a directory holding checkpoints.

    Raises:
        ValueError: if `path` holds no checkpoint.
    """
    if tf.io.gfile.isdir(path):
        found = tf.train.latest_checkpoint(path)
        if found:
            return found
    elif tf.io.gfile.exists(path + ".index"):
        return path
    raise ValueError(f"warm_start_from={path!r} is neither a checkpoint prefix nor a "
                     "directory holding checkpoints; give a work_dir of a finished run or "
                     "a path such as work_dir/ckpt-100")


def _shapes(prefix: str) -> dict[str, tuple[int, ...]]:
    return {name: tuple(shape) for name, shape in tf.train.list_variables(prefix)
            if name not in _IGNORED_KEYS}


# root -> its keys and shapes: fixed once the variables exist, and finding them writes the
# whole model, so a restore that falls back past damaged checkpoints (or a catch-up after
# another process trained) does not write it again for every checkpoint it compares.
_EXPECTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def expected_shapes(root: tf.train.Checkpoint,
                    scratch_dir: str | None = None) -> dict[str, tuple[int, ...]]:
    """Keys and shapes `root` would save, found by writing it once to a scratch dir.

    Writing is the only public way to get TF's exact key for every variable. `write`
    (unlike `save`) leaves the save counter alone. A TPU reached over the network cannot
    write local files, so the estimator passes a gs:// scratch dir there.
    """
    if root not in _EXPECTED:
        _EXPECTED[root] = _write_probe(root, scratch_dir)
    return _EXPECTED[root]


def _write_probe(root: tf.train.Checkpoint,
                 scratch_dir: str | None) -> dict[str, tuple[int, ...]]:
    if scratch_dir is None:
        with _removal.temporary_dir() as tmp:
            return _shapes(root.write(os.path.join(tmp, "probe")))
    try:
        return _shapes(root.write(scratch_dir + "/probe"))
    finally:
        _removal.remove_tree(scratch_dir)


def check_compatible(root: tf.train.Checkpoint, prefix: str, work_dir: str,
                     scratch_dir: str | None = None) -> None:
    """Raises CheckpointMismatchError naming what differs between `prefix` and `root`."""
    have, want = _shapes(prefix), expected_shapes(root, scratch_dir)
    missing = sorted(set(want) - set(have))
    unexpected = sorted(set(have) - set(want))
    reshaped = sorted(k for k in set(have) & set(want) if have[k] != want[k])
    if not (missing or unexpected or reshaped):
        return
    lines = [f"  {_short(k)}: checkpoint {list(have[k])} vs model {list(want[k])}"
             for k in reshaped[:10]]
    lines += [f"  {_short(k)}: in the model, not in the checkpoint" for k in missing[:10]]
    lines += [f"  {_short(k)}: in the checkpoint, not in the model" for k in unexpected[:10]]
    raise CheckpointMismatchError(
        f"work_dir={work_dir!r} holds a checkpoint ({os.path.basename(prefix)}) of a "
        f"different model; {len(reshaped)} variable(s) differ in shape, {len(missing)} are "
        f"missing and {len(unexpected)} unexpected:\n" + "\n".join(lines) +
        "\nNothing was restored or overwritten. Use a new work_dir for a new model, or "
        "warm_start_from=<that work_dir> to load only the variables that match.")


def _short(key: str) -> str:
    return key[: -len(_VALUE_SUFFIX)] if key.endswith(_VALUE_SUFFIX) else key


def restore(root: tf.train.Checkpoint, prefix: str, work_dir: str,
            scratch_dir: str | None = None) -> None:
    """Restores `root` from `prefix` after checking that the two match."""
    check_compatible(root, prefix, work_dir, scratch_dir)
    # expect_partial: save_counter is bookkeeping that read() leaves alone on purpose.
    root.read(prefix).assert_existing_objects_matched().expect_partial()
    logger.info("fenwicks: resumed from %s", prefix)


# --------------------------------------------------------------------------- faults


_CORRUPT_SUFFIX = ".corrupt"


def _listed(directory: str) -> list[str]:
    """Checkpoint prefixes in `directory`, newest first: from its state file, or by name."""
    try:
        state = tf.train.get_checkpoint_state(directory)  # None if it cannot be parsed
    except (tf.errors.OpError, ValueError):
        state = None
    if state is None and tf.io.gfile.exists(f"{directory}/checkpoint"):
        logger.warning("fenwicks: %s/checkpoint is unreadable; looking for checkpoints by "
                       "name", directory)
    if state is not None and state.all_model_checkpoint_paths:
        paths = list(state.all_model_checkpoint_paths)
    else:
        paths = [p[: -len(".index")] for p in tf.io.gfile.glob(f"{directory}/ckpt-*.index")]
    paths = [p if "/" in p or "://" in p else f"{directory}/{p}" for p in paths]
    _check_inside(directory, paths)
    return sorted(set(paths), key=step_of, reverse=True)


class ForeignCheckpointError(ValueError):
    """The work_dir's ``checkpoint`` file names a checkpoint in another folder."""


def _check_inside(directory: str, paths: list[str]) -> None:
    """Refuses a state file naming checkpoints outside `directory`.

    A shared or downloaded work_dir could otherwise load another folder's weights, and
    TensorFlow's CheckpointManager would later delete those files as it rotates old
    checkpoints.
    """
    def folder(path: str) -> str:
        head = path.rstrip("/").rsplit("/", 1)[0] if "/" in path else ""
        return head if "://" in head else os.path.abspath(head)

    home = folder(directory.rstrip("/") + "/x")
    outside = [p for p in paths if folder(p) != home]
    if outside:
        raise ForeignCheckpointError(
            f"{directory}/checkpoint names checkpoint(s) outside the work_dir: "
            f"{', '.join(outside[:3])}. Restoring would load another folder's weights "
            "(and rotating old checkpoints would later delete its files). If this "
            f"work_dir was copied or downloaded, delete {directory}/checkpoint: Fenwicks "
            "then finds the ckpt-* files in the work_dir by name. Nothing was read or changed")


# What a damaged file raises while it is read: TensorFlow's errors, and plain Python ones
# from its C++ reader ("IndexError: Read less bytes than requested" for a data file cut
# short). A bug of ours (TypeError, AttributeError ...) is not damage and propagates.
_DAMAGE = (tf.errors.OpError, ValueError, AssertionError, IndexError, EOFError)


def _probe(root: tf.train.Checkpoint, scratch_dir: str | None) -> None:
    """Writes the probe before any checkpoint is read, so a failure to write scratch
    files is never mistaken for damage to the user's checkpoints."""
    try:
        expected_shapes(root, scratch_dir)
    except (tf.errors.OpError, OSError) as err:
        where = scratch_dir or _temp_dir_named()
        raise ProbeWriteError(
            f"could not write a probe copy of the model to {where}: {first_line(err)}. "
            "Fenwicks writes the model once there to learn its variables' checkpoint "
            "names before restoring. This is not about your checkpoints: nothing in the "
            "work_dir was read, changed or set aside. Free space there, or point TMPDIR "
            "at a folder with room for one checkpoint (before starting Python)") from err


def _temp_dir_named() -> str:
    """The temp dir, for a message; when every candidate is full, says so."""
    try:
        return f"the temp dir {tempfile.gettempdir()!r}"
    except OSError:  # "No usable temporary directory found in [...]", as the error says
        return "a temp dir (every candidate is full or not writable)"


def restore_latest(root: tf.train.Checkpoint, work_dir: str,
                   scratch_dir: str | None = None) -> str | None:
    """Restores the newest readable checkpoint of `work_dir`; None if there is none.

    A corrupt, truncated, empty or incomplete checkpoint (bytes flipped, a file cut
    short or missing) is never loaded: the next older one is, with a warning naming the
    damaged file, and the damaged files are renamed ``*.corrupt`` (kept, not deleted;
    left in place if the work_dir is read-only) so the run continues from a sound state.

    Raises:
        CheckpointMismatchError: the checkpoint belongs to another model.
        CheckpointCorruptError: checkpoints are listed but none can be read.
        CheckpointReadError: the storage did not answer (nothing is set aside).
        ProbeWriteError: scratch space for the model's probe could not be written.
    """
    if not _deadline.run(tf.io.gfile.exists, work_dir, what="exists", path=work_dir):
        return None
    candidates = _deadline.run(_listed, work_dir, what="checkpoint listing", path=work_dir)
    if candidates:
        _probe(root, scratch_dir)
    damaged: list[tuple[str, str]] = []
    for prefix in candidates:
        try:
            read(root, prefix, work_dir, scratch_dir)  # storage down: CheckpointReadError
        except CheckpointMismatchError:
            raise
        except _DAMAGE as err:
            why, cause = diagnose(prefix), first_line(err)
            damaged.append((prefix, why if cause in why else f"{why}; {cause}"))
            continue
        if damaged:
            _set_aside(work_dir, damaged, prefix)
        return prefix
    if candidates:
        raise none_readable(work_dir, len(candidates), damaged, "the ckpt-* files")
    return None


def diagnose(prefix: str) -> str:
    """Which file of checkpoint `prefix` is missing, empty or cut short, in words.

    Examples:
        >>> prefix = tf.train.Checkpoint(v=tf.Variable(1.0)).write('run/ckpt-10')
        >>> os.rename(prefix + '.data-00000-of-00001', 'moved-away')
        >>> diagnose(prefix)
        'run/ckpt-10.data-00000-of-00001 is missing'
    """
    try:
        return _diagnose(prefix)
    except tf.errors.OpError as err:  # the storage, not the files: say so, do not guess
        return f"{prefix}'s files could not be examined ({first_line(err)})"


def _diagnose(prefix: str) -> str:
    index = prefix + ".index"
    if not tf.io.gfile.exists(index):
        return f"{index} is missing"
    if tf.io.gfile.stat(index).length == 0:
        return f"{index} is empty"
    shards = tf.io.gfile.glob(prefix + ".data-*-of-*")
    total = int(shards[0].rsplit("-of-", 1)[1]) if shards else 1
    expected = [f"{prefix}.data-{i:05d}-of-{total:05d}" for i in range(total)]
    for path in expected:
        if not tf.io.gfile.exists(path):
            return f"{path} is missing"
        if tf.io.gfile.stat(path).length == 0:
            return f"{path} is empty"
    try:
        reader = tf.train.load_checkpoint(prefix)
    except _DAMAGE:
        return f"{index} is damaged"
    # Each tensor carries a checksum: the first that cannot be read shows where the data
    # is cut short or altered.
    for name in sorted(reader.get_variable_to_shape_map()):
        try:
            reader.get_tensor(name)
        except _DAMAGE as err:
            return (f"{', '.join(expected)} is cut short or damaged ({_short(name)} cannot "
                    f"be read: {first_line(err)})")
    return f"{', '.join(expected)} (data) is damaged"


def _set_aside(work_dir: str, damaged: list[tuple[str, str]], used: str) -> None:
    for prefix, why in damaged:
        logger.warning("fenwicks: checkpoint %s is unreadable (%s); resumed from the older "
                       "%s instead. Its files are kept as %s*%s", prefix, why, used, prefix,
                       _CORRUPT_SUFFIX)
    try:
        for prefix, _ in damaged:
            for path in tf.io.gfile.glob(prefix + ".*"):
                if not path.endswith(_CORRUPT_SUFFIX):
                    tf.io.gfile.rename(path, path + _CORRUPT_SUFFIX, overwrite=True)
        bad = {prefix for prefix, _ in damaged}
        good = sorted((p for p in _listed(work_dir) if p not in bad), key=step_of)
        _tf_internals.update_checkpoint_state(work_dir, used, good)
    except tf.errors.OpError as err:  # a read-only work_dir: read around them each time
        logger.warning("fenwicks: could not set the damaged checkpoint(s) aside in %s "
                       "(%s); they stay in place and are skipped", work_dir,
                       first_line(err))


def remove_partial_saves(work_dir: str) -> None:
    """Removes ``ckpt-N_temp*`` folders: the shards of a save cut short (a run killed
    while writing). Call only while holding the work_dir's lock."""
    for path in _partial_saves(work_dir):
        if tf.io.gfile.isdir(path):
            logger.warning("fenwicks: removing %s, the partial files of a checkpoint save "
                           "that was cut short", path)
            _remove_quietly(path)


def _partial_saves(work_dir: str) -> list[str]:
    """``ckpt-*_temp*`` entries of `work_dir`. Every `train` call looks (it takes the
    lock): on local disk a directory listing, as ``tf.io.gfile.glob`` hands matching to
    a thread pool that took tens of ms on a loaded machine."""
    if "://" in work_dir:
        return tf.io.gfile.glob(f"{work_dir}/ckpt-*_temp*")
    try:
        names = os.listdir(work_dir)
    except OSError:  # not made yet: nothing to remove
        return []
    return [f"{work_dir}/{name}" for name in names
            if name.startswith("ckpt-") and "_temp" in name[5:]]


def fingerprint(prefix: str | None) -> tuple | None:
    """``(prefix, digest)`` of a checkpoint's index: which checkpoint, which copy.

    Tells a checkpoint from another run's that was put in its place under the same name.
    The index holds a CRC32C of every tensor in the data files, so its digest names the
    contents; a modification time would not (TensorFlow's local `stat` has whole seconds,
    and a copy made within the same second looked unchanged).
    """
    if prefix is None:
        return None
    try:
        index = _deadline.run(_read_bytes, prefix + ".index", what="checkpoint index",
                              path=prefix + ".index")
    except tf.errors.OpError:
        return (prefix,)
    return (prefix, hashlib.sha256(index).hexdigest())


def _read_bytes(path: str) -> bytes:
    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


def _remove_quietly(path: str) -> None:
    try:
        if tf.io.gfile.isdir(path):
            _removal.remove_tree(path)
        else:
            _removal.remove_file(path)
    except (tf.errors.OpError, OSError) as err:
        logger.warning("fenwicks: could not remove the partial %s: %s", path, first_line(err))


# --------------------------------------------------------------------------- warm start


def model_variable_keys(model: keras.Model) -> dict[str, Any]:
    """Checkpoint key -> variable for every model variable, as in `make_checkpoint`.

    Walks TF's object graph breadth-first from the same root, as the saver does, so the
    first path that reaches a variable is its key; the variables the graph misses get
    their ``model_extra/NNNN`` keys.
    """
    root = tf.train.Checkpoint(model=model)
    wanted = {i: v for v in model.variables for i in _ids(v)}
    keys: dict[str, Any] = {}
    keyed: set[int] = set()
    seen, queue = {id(root)}, collections.deque([(root, "")])
    while queue:
        parent, path = queue.popleft()
        for name, child in tf.train.TrackableView(parent).children(parent).items():
            if id(child) in seen:
                continue
            seen.add(id(child))
            child_path = f"{path}/{_escape(name)}" if path else _escape(name)
            variable = wanted.get(id(child))
            if variable is not None and id(variable) not in keyed:
                keys[child_path + _VALUE_SUFFIX] = variable
                keyed.add(id(variable))
            queue.append((child, child_path))
    for i, variable in _unreached_model_variables(model).items():
        keys[f"{_EXTRA}/{i:04d}{_VALUE_SUFFIX}"] = variable
    return keys


def _escape(name: str) -> str:
    """TF's escaping of object names inside checkpoint keys."""
    return name.replace(".", "..").replace("/", ".S")


def warm_start(model: keras.Model, source: str) -> dict[str, list[str]]:
    """Loads every model variable whose key and shape match a variable in `source`.

    Args:
        model: the (built) model to initialise.
        source: a checkpoint prefix, or a directory (another run's work_dir).

    Returns:
        ``{'loaded': [...], 'not_loaded': [...]}`` of Keras variable paths.

    Examples:
        >>> trained = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> tf.train.Checkpoint(model=trained).write('pretrain/ckpt-5')
        'pretrain/ckpt-5'
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2),
        ...                           keras.layers.Dense(1)])   # the same, and a new head
        >>> report = warm_start(model, 'pretrain/ckpt-5')
        >>> [len(paths) for paths in report.values()]   # loaded, not_loaded: the head's
        [2, 2]
        >>> np.array_equal(model.layers[0].kernel.numpy(), trained.layers[0].kernel.numpy())
        True
    """
    prefix = resolve(source)
    reader = tf.train.load_checkpoint(prefix)
    available = {k: tuple(v) for k, v in reader.get_variable_to_shape_map().items()}
    keys = model_variable_keys(model)
    # Extras are keyed by position, which only means the same variable in the same model:
    # load them only if the source's extras have exactly our keys and shapes.
    ours = {k: tuple(v.shape) for k, v in keys.items() if k.startswith(_EXTRA + "/")}
    theirs = {k: v for k, v in available.items() if k.startswith(_EXTRA + "/")}
    report: dict[str, list[str]] = {"loaded": [], "not_loaded": []}
    for key, variable in keys.items():
        if key.startswith(_EXTRA + "/") and ours != theirs:
            report["not_loaded"].append(variable.path)
        elif available.get(key) == tuple(variable.shape):
            variable.assign(reader.get_tensor(key))
            report["loaded"].append(variable.path)
        else:
            report["not_loaded"].append(variable.path)
    logger.warning("fenwicks: warm start from %s loaded %d variable(s); not loaded: %s",
                   prefix, len(report["loaded"]), report["not_loaded"] or "none")
    return report


# --------------------------------------------------------------------------- reading

def read(root: tf.train.Checkpoint, prefix: str, work_dir: str | None = None,
         scratch_dir: str | None = None) -> None:
    """`restore`, but a storage failure raises `CheckpointReadError` naming `prefix`.

    Corruption (DataLossError, a missing file, a mismatch) propagates unchanged, so a
    caller that falls back past damaged checkpoints still can; an unreachable bucket
    does not look like damage.

    Examples:
        >>> step = tf.Variable(4, dtype=tf.int64)
        >>> prefix = tf.train.Checkpoint(step=step).write('run/ckpt-4')
        >>> _ = step.assign(0)
        >>> read(tf.train.Checkpoint(step=step), prefix, 'run')
        >>> int(step)
        4
    """
    try:
        _deadline.run(restore, root, prefix, work_dir or os.path.dirname(prefix),
                      scratch_dir, what="checkpoint read", path=prefix)
    except (tf.errors.OpError, ValueError, _deadline.StorageTimeoutError) as err:
        if is_storage_error(err) or _deadline.is_outage(err):
            raise CheckpointReadError(prefix, err) from err
        raise
