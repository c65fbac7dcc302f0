"""One run format for both engines: a checkpoint step is Keras's state tree as NumPy
arrays plus Fenwicks' run record, written and read with orbax-checkpoint.

A run stopped on one engine continues on the other from its step, with its optimizer
slots and its input position: nothing in a step is an engine's own object.

Layout (``<work_dir>/checkpoints/<step>/``, one orbax step, renamed into place when complete)::

    state/    the arrays, in orbax's standard (OCDBT) format:
              {'trainable': [...], 'non_trainable': [...], 'optimizer': [...]}
              (``model.trainable_variables``, ``model.non_trainable_variables`` with the
              seed generators' states and BatchNorm statistics, ``optimizer.variables``
              with ``iterations`` and the slots), in the order Keras lists them
    record/   the run record (JSON): format, global step, input position (steps), the
              training batch size it is counted in, the Keras global seed generator's
              state, the engine and versions that wrote it, and every array's Keras
              path, shape and dtype (``layout``); for a step of a TPUEstimator
              model_fn, also each model array's TF1 name (``tf1_names``: ``{'trainable':
              [...], 'non_trainable': [...]}`` in ``layout``'s order), so that TF1 code
              finds the variables by the names it gave them (BERT's
              ``init_checkpoint``). A step without it (a Keras model_func's, or one
              written before it existed) names its arrays by Keras path only

A step continues at another precision: float16 wraps the optimizer in Keras's
``LossScaleOptimizer``, bfloat16 and float32 do not, and the optimizer variables are
paired across the wrapper (`optimizer_pairs`): ``iterations`` and the slots restored, a
loss scale the step lacks started afresh (the continuation line says so), one it holds
and the run does not use dropped.

The record is written in the same orbax step as the arrays, so it is committed
atomically with them and checked when read: a step whose record is missing, cut short,
empty or ``null`` is damaged, like a step whose data files are, and the newest intact step
is restored instead, with a warning.

What an engine supplies (`EngineArrays`): how to copy its variables to host arrays
(``snapshot`` then ``to_host``, the second in the writer's thread) and how to put host
arrays back onto its devices or sharding (``scatter``). Everything else is here: async
saves (a background thread of `RunCheckpointer`), keep-N (orbax's ``max_to_keep``),
atomic commit (orbax's rename; on ``gs://`` the commit marker uploaded last), fallback to
the newest intact step, and ``gs://`` (staged through local scratch space, as the JAX
engine's orbax checkpoints were: `StagedBucket`).

Orbax imports JAX. On the TensorFlow engine JAX must never take a GPU: `fenwicks._engine`
keeps it on the CPU (``JAX_PLATFORMS=cpu``) before anything imports it.

Examples:
    >>> x, y = np.ones((8, 3), 'float32'), np.zeros(8, 'int64')
    >>> model_func = fw.train.get_clf_model_func(lambda: keras.Sequential(
    ...     [keras.Input((3,)), keras.layers.Dense(2, name='out')], name='net'),
    ...     fw.train.sgd_optimizer(0.1))
    >>> est = fw.train.get_tpu_estimator(1, model_func, 'run', trn_bs=8, verbose=False)
    >>> est.train(lambda params: fw.data.numpy_ds(x, y, params['batch_size']),
    ...           steps=2).global_step
    2
    >>> sorted(os.listdir('run/checkpoints/2'))   # the record beside the arrays
    ['_CHECKPOINT_METADATA', 'commit_success.txt', 'record', 'state']
    >>> record = read_record('run/checkpoints/2')
    >>> record['engine'], record['step'], record['input_steps'], record['train_batch_size']
    ('tf', 2, 2, 8)
    >>> record['layout']['trainable']
    [['net/out/kernel', [3, 2], 'float32'], ['net/out/bias', [2], 'float32']]
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from fenwicks import _deadline, _removal, _tf_internals
from fenwicks import io as fw_io
from fenwicks._text import first_line
from fenwicks.train.checkpointing import (
    Checkpointer,
    CheckpointMismatchError,
    CheckpointReadError,
    CheckpointWriteError,
    is_storage_error,
    none_readable,
    step_of,
)

logger = logging.getLogger("fenwicks")

SUBDIR = "checkpoints"
STATE, RECORD = "state", "record"  # the two orbax items of a step
GROUPS = ("trainable", "non_trainable", "optimizer")
FORMAT = 1  # the record's "format": bumped when what a step holds changes
COMMIT_FILE = "commit_success.txt"  # orbax's own completion marker on GCS
METADATA_FILE = "_CHECKPOINT_METADATA"  # orbax's; holds the commit time of that copy
CORRUPT_SUFFIX = ".corrupt"  # a damaged step, set aside (kept, not deleted)
_TMP_MARK = ".orbax-checkpoint-tmp"  # orbax's name for a step being written
TITLES = {"tf": "TensorFlow engine", "jax": "JAX engine"}

StateTree = dict[str, list[np.ndarray]]


class EngineArrays(Protocol):
    """What an engine supplies to the run format: its variables to host and back.

    The variables are Keras's (`variable_groups`); only where their values live is the
    engine's. A reference engine implements these three methods and nothing else here.
    """

    def snapshot(self) -> Any:
        """The state's values as they are now, in copies no later step changes. Fast:
        may return before the copies reach the host (device-side copies)."""

    def to_host(self, frozen: Any) -> StateTree:
        """A `snapshot` as NumPy arrays ``{group: [array, ...]}`` in `GROUPS`' order.
        Called in the writer's thread for an async save."""

    def scatter(self, tree: StateTree) -> None:
        """Puts host arrays (cast to each variable's dtype) back into the variables, on
        the engine's devices or sharding."""


class RunParts(EngineArrays, Protocol):
    """`EngineArrays` plus the engine-neutral part a `RunState` provides."""

    def layout(self) -> dict[str, list[list]]:
        """``{group: [[path, shape, dtype], ...]}`` of the live variables."""

    def record(self) -> dict:
        """The run record of the live state (`make_record`)."""

    def apply_record(self, record: dict) -> None:
        """Sets the counters (and seed state) from a restored run record."""


class PreviousFormatReader(Protocol):
    """A reader of an engine's checkpoints from before the run format (TensorFlow's
    ``ckpt-<step>``, `fenwicks.train.tf.legacy_reader`; the JAX engine's
    ``orbax/<step>``, `fenwicks.train.jax.checkpoints`): restored, never written."""

    def restore(self, path: str | None = None) -> str | None:
        """Restores `path`, or the newest readable checkpoint; None if there is none."""

    def change_on_disk(self) -> str | None:
        """None, ``'removed'`` or ``'replaced'``: as `RunCheckpointer.change_on_disk`."""

    def close(self) -> None:
        """Releases what the reader holds."""


def variable_groups(model: Any, optimizer: Any) -> dict[str, list[Any]]:
    """The Keras variables of a step, by group, in the order Keras lists them.

    Examples:
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization(),
        ...                           keras.layers.Dense(2)])
        >>> optimizer = keras.optimizers.Adam()
        >>> optimizer.build(model.trainable_variables)
        >>> [len(v) for v in variable_groups(model, optimizer).values()]
        [4, 2, 10]

        Trainable: gamma, beta, kernel, bias; not: BatchNorm's moving mean and variance;
        the optimizer's: its iteration count, learning rate, and two slots per weight.
    """
    return {"trainable": list(model.trainable_variables),
            "non_trainable": list(model.non_trainable_variables),
            "optimizer": list(optimizer.variables)}


def layout_of(groups: dict[str, list[Any]]) -> dict[str, list[list]]:
    """``{group: [[path, shape, dtype], ...]}`` of Keras variables."""
    return {name: [[v.path, [int(d) for d in v.shape], str(np.dtype(_dtype(v)))]
                   for v in variables] for name, variables in groups.items()}


def _dtype(variable: Any) -> Any:
    dtype = variable.dtype
    return getattr(dtype, "as_numpy_dtype", dtype)


def versions(engine: str) -> dict[str, str]:
    """The versions of what wrote a step (for the record)."""
    from importlib import metadata

    names = ["fenwicks", "keras", "orbax-checkpoint",
             "tensorflow" if engine == "tf" else "jax"]
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "unknown"
    return found


def make_record(*, engine: str, step: int, input_steps: int, train_batch_size: int,
                layout: dict[str, list[list]],
                tf1_names: dict[str, list[str]] | None = None) -> dict:
    """The run record of one step (JSON-serialisable).

    Args:
        tf1_names: each model array's TF1 name, ``{'trainable': [...],
            'non_trainable': [...]}`` in `layout`'s order, if the program named its
            variables so (a TPUEstimator model_fn); recorded as given, never read here.
    """
    record = {"format": FORMAT, "step": int(step), "input_steps": int(input_steps),
              "train_batch_size": int(train_batch_size), "engine": engine,
              "versions": versions(engine), "seed": global_seed_state(),
              "layout": layout}
    if tf1_names:
        record["tf1_names"] = tf1_names
    return record


def global_seed_state() -> list[int] | None:
    """The state of Keras's global seed generator (``keras.random`` calls without a
    seed), or None if none was made."""
    generator = _tf_internals.keras_global_seed_generator()
    if generator is None:
        return None
    import keras

    return [int(x) for x in np.asarray(keras.ops.convert_to_numpy(generator.state.value))
            .ravel()]


def set_global_seed_state(state: list[int] | None) -> None:
    """Restores Keras's global seed generator from a record (nothing if None)."""
    if state is None:
        return
    generator = _tf_internals.keras_global_seed_generator(create=True)
    generator.state.assign(np.asarray(state, dtype=_dtype(generator.state))
                           .reshape(tuple(generator.state.shape)))


def check_record(record: Any) -> dict:
    """`record` if it is a complete run record; `DamagedStep` naming what is wrong."""
    if not isinstance(record, dict):
        raise DamagedStep(f"its run record is {type(record).__name__}, not the record")
    missing = [key for key in ("format", "step", "input_steps", "train_batch_size",
                               "engine", "layout", "crc32") if key not in record]
    if missing:
        raise DamagedStep(f"its run record lacks {', '.join(missing)}")
    if not isinstance(record["layout"], dict) or set(record["layout"]) != set(GROUPS):
        raise DamagedStep("its run record's layout is not the three groups "
                       f"{', '.join(GROUPS)}")
    return record


def checksums(tree: StateTree) -> dict[str, list[int]]:
    """CRC-32 of each array's bytes, by group: orbax's data files carry none, so a
    flipped byte would otherwise be read back as a wrong weight."""
    # As bytes: the buffer protocol knows no bfloat16 (ml_dtypes' 'E'), which a model
    # with a layer of dtype='bfloat16' holds; the same bytes, so the same CRC, otherwise.
    return {group: [zlib.crc32(np.ascontiguousarray(a).view(np.uint8)) for a in tree[group]]
            for group in GROUPS}


def check_checksums(tree: StateTree, record: dict) -> None:
    """`DamagedStep` naming the first array whose bytes differ from what was written."""
    for group in GROUPS:
        for i, (got, want) in enumerate(zip(checksums(tree)[group], record["crc32"][group],
                                            strict=True)):
            if got != want:
                path = record["layout"][group][i][0]
                raise DamagedStep(f"the array of {path} ({group} #{i}) does not match the "
                               "checksum written with it: its data file is damaged")


def title(engine: str) -> str:
    """How messages name an engine: ``title('jax') == 'JAX engine'``."""
    return TITLES.get(engine, f"{engine!r} engine")


# --------------------------------------------------------------------------- removal
# Every file or folder this module removes goes through these two (Fenwicks deletes only
# what it wrote: here a scratch copy, a step being replaced, a step pruned from gs://).


def _remove_tree(path: str) -> None:
    _removal.remove_tree(path, ignore_errors=not fw_io.is_gcs(path))


def _remove_file(path: str) -> None:
    _removal.remove_file(path)


# --------------------------------------------------------------------------- errors


class DamagedStep(Exception):
    """A step whose files cannot be read (the reason is its text): `restore_newest`
    restores the next older one instead."""


class CheckpointDownloadError(CheckpointReadError):
    """A ``gs://`` checkpoint could not be downloaded, or the steps of a ``gs://``
    checkpoints folder could not be listed, after the storage client's retries.

    Nothing was restored or changed: the checkpoints may be perfectly sound.

    Args:
        path: the step folder (or, with `listing`, the checkpoints folder).
        cause: what the storage client raised.
        listing: the listing of `path`'s steps failed, not a download. Defaults to False.
    """

    def __init__(self, path: str, cause: BaseException, *, listing: bool = False) -> None:
        self.path, self.cause = path, cause
        if isinstance(cause, fw_io.TransferError) and cause.__cause__ is not None:
            cause = cause.__cause__  # what storage answered, not the paths again
        what = (f"the checkpoints in {path}: listing them failed" if listing else
                f"checkpoint {path}: the download failed")
        OSError.__init__(
            self, f"could not read {what} after the storage client's retries "
            f"({type(cause).__name__}: {first_line(cause)}). Nothing was restored or "
            f"changed in the work_dir; the checkpoint{'s are' if listing else ' is'} not "
            "known to be damaged. Check the network or the bucket's status, then create "
            "the estimator again")


def directory(work_dir: str) -> str:
    """Where a work_dir's run-format steps live."""
    return f"{work_dir.rstrip('/')}/{SUBDIR}"


def is_step(path: str) -> bool:
    """Whether `path` names a run-format step (``.../checkpoints/<step>``)."""
    parts = path.rstrip("/").rsplit("/", 2)
    return len(parts) == 3 and parts[1] == SUBDIR and parts[2].isdigit()


def ocp() -> Any:
    """orbax.checkpoint, imported (JAX kept off any GPU on the TensorFlow engine)."""
    from fenwicks import accel

    accel.keep_jax_off_accelerators()
    import orbax.checkpoint

    return orbax.checkpoint


# --------------------------------------------------------------------------- reading


def latest(work_dir: str) -> str | None:
    """The newest complete run-format step of `work_dir`, found without orbax.

    Examples:
        >>> for step in ('300', '400', '500.orbax-checkpoint-tmp-1'):   # 500: being written
        ...     os.makedirs(f'run/checkpoints/{step}')
        >>> latest('run')
        'run/checkpoints/400'
    """
    steps = complete_steps(directory(work_dir))
    return f"{directory(work_dir)}/{steps[-1]}" if steps else None


def complete_steps(folder: str) -> list[int]:
    """Steps of a ``.../checkpoints`` folder that are complete, oldest first: locally the bare
    step folders (orbax renames a step into place when complete); on ``gs://`` those
    whose commit marker was uploaded (last).

    Raises:
        CheckpointDownloadError: the ``gs://`` listing failed after the storage client's
            retries (nothing was read or changed).

    Examples:
        >>> for step in ('300', '400', '500.orbax-checkpoint-tmp-1'):   # 500: being written
        ...     os.makedirs(f'run/checkpoints/{step}')
        >>> complete_steps('run/checkpoints')
        [300, 400]
    """
    if fw_io.is_gcs(folder):
        try:
            found = _deadline.run(fw_io.glob, f"{folder}/*/{COMMIT_FILE}",
                                  what="checkpoint listing", path=folder)
        except Exception as err:
            # TensorFlow's client used up its retries ("AbortedError: All 10 retry
            # attempts failed"): storage did not answer, which says nothing of the steps.
            if is_storage_error(err):
                raise CheckpointDownloadError(folder, err, listing=True) from err
            raise
        steps = {_step_name(path.rstrip("/").rsplit("/", 2)[-2]) for path in found}
    else:
        if not os.path.isdir(folder):
            return []
        steps = {_step_name(name) for name in os.listdir(folder)
                 if os.path.isdir(os.path.join(folder, name))}
    return sorted(step for step in steps if step is not None)


def _step_name(name: str) -> int | None:
    name = name.rstrip("/")
    return int(name) if name.isdigit() else None


def read_record(step_dir: str) -> dict:
    """The run record of one step (``.../checkpoints/<step>``), checked.

    Raises:
        ValueError: the record is missing, unreadable or incomplete.
    """
    path = f"{step_dir.rstrip('/')}/{RECORD}/metadata"
    try:
        text = _read_text(path)  # bounded on gs:// by fenwicks.io
        return check_record(json.loads(text))
    except (DamagedStep, OSError, ValueError) as err:
        raise ValueError(f"the run record {path} cannot be read: {first_line(err)}") \
            from err


def _read_text(path: str) -> str:
    return fw_io.read_bytes(path).decode()


def read_arrays(step_dir: str, record: dict) -> StateTree:
    """The arrays of a local step, as NumPy arrays, shaped as its record says."""
    target = {group: [np.empty(shape, dtype=np.dtype(dtype))
                      for _, shape, dtype in record["layout"][group]] for group in GROUPS}
    # Orbax takes absolute paths only ('Checkpoint path should be absolute'): a work_dir
    # given relative ('runs/demo') is resolved against the current folder.
    restored = _reader().restore(os.path.join(os.path.abspath(step_dir), STATE), target)
    return {group: [np.asarray(a) for a in restored[group]] for group in GROUPS}


def read_values(step_dir: str) -> dict[str, np.ndarray]:
    """Every array of a local step (model and optimizer variables) by its Keras path,
    read from disk on each call: a step rewritten in place (a forced save) is read as it
    is now.

    Examples:
        >>> x, y = np.ones((8, 3), 'float32'), np.zeros(8, 'int64')
        >>> model_func = fw.train.get_clf_model_func(lambda: keras.Sequential(
        ...     [keras.Input((3,)), keras.layers.Dense(2, name='out')], name='net'),
        ...     fw.train.sgd_optimizer(0.1))
        >>> est = fw.train.get_tpu_estimator(1, model_func, 'run', trn_bs=8, verbose=False)
        >>> est.train(lambda params: fw.data.numpy_ds(x, y, params['batch_size']),
        ...           steps=2).global_step
        2
        >>> values = read_values(latest('run'))
        >>> len(values), values['net/out/kernel'].shape   # the optimizer's too: 2 + 4
        (6, (3, 2))
        >>> np.array_equal(values['net/out/kernel'], est.model.layers[-1].kernel.numpy())
        True
    """
    record = read_record(step_dir)
    arrays = read_arrays(step_dir, record)
    return {path: array for group in GROUPS
            for (path, _, _), array in zip(record["layout"][group], arrays[group],
                                           strict=True)}


def _reader() -> Any:
    """One orbax reader for the process (closing one after a failed read left its
    event loop's callbacks to fail noisily at exit)."""
    return ocp().StandardCheckpointer()


def fingerprint(path: str, copy: str | None = None) -> tuple:
    """``(path, digest)``: which step, and which copy of it. Orbax's metadata file holds
    the copy's commit time, so another run's step written under the same number has
    another digest; a copy downloaded from the bucket has the same. `copy`: a local
    directory known to hold the same files as `path` (read instead of it). Also reads
    the JAX engine's older ``orbax/<step>`` folders, which orbax wrote the same way.

    Examples:
        >>> fingerprint('/content/run/checkpoints/100')[0]
        '/content/run/checkpoints/100'
        >>> fingerprint('/content/run/checkpoints/999')   # no such step
        ('/content/run/checkpoints/999',)
    """
    source = copy or path
    try:
        data = _read_bytes(f"{source}/{METADATA_FILE}")  # bounded on gs:// by fenwicks.io
    except Exception as err:
        if not isinstance(err, FileNotFoundError) and type(err).__name__ != "NotFoundError":
            raise  # (TensorFlow's NotFoundError, for gs://, is no OSError)
        return (path,)
    return (path, hashlib.sha256(data).hexdigest())


def _read_bytes(path: str) -> bytes:
    return fw_io.read_bytes(path)


def remove_partial_saves(work_dir: str) -> list[str]:
    """Removes what a save cut short left in `work_dir`'s checkpoints folder (orbax's
    ``<step>.orbax-checkpoint-tmp-*`` folders, never listed as steps), with a warning
    each. Call only while holding the work_dir's lock; nothing on ``gs://`` (a staged
    step is written locally and becomes a step only with its commit marker).

    Returns:
        The folders removed.
    """
    folder = directory(work_dir)
    if fw_io.is_gcs(folder) or not os.path.isdir(folder):
        return []
    removed = []
    for name in sorted(os.listdir(folder)):
        if _TMP_MARK in name and _step_name(name.split(_TMP_MARK)[0]) is not None:
            path = f"{folder}/{name}"
            logger.warning("fenwicks: removing %s, the partial files of a checkpoint save "
                           "that was cut short", path)
            _remove_tree(path)
            removed.append(path)
    return removed


# --------------------------------------------------------------------------- writing


class _Write:
    """One checkpoint write, in a background thread or at once in the caller's; `join`
    waits for it and raises its error in the caller."""

    def __init__(self, write: Callable[[], None], background: bool, name: str) -> None:
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if background:
            # Not a daemon: the interpreter's exit waits for the write to be complete.
            self._thread = threading.Thread(target=self._run, args=(write,), daemon=False,
                                            name=name)
            self._thread.start()
        else:
            self._run(write)

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except BaseException as err:  # noqa: BLE001 - raised by `join`, in the caller
            self._error = err

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error


_WRITING: weakref.WeakSet = weakref.WeakSet()  # checkpointers with a write in progress
_EXIT_HOOK: list[bool] = []  # registered once, at the first background write


def _wait_at_exit() -> None:
    """At interpreter exit: lets writes in progress finish; reports a failed one."""
    for checkpointer in list(_WRITING):
        try:
            checkpointer.wait()
        except Exception as err:  # noqa: BLE001 - nobody is left to raise it to
            logger.error("fenwicks: %s", err)


class RunCheckpointer(Checkpointer):
    """The `Checkpointer` of a run in the run format, for either engine.

    Args:
        work_dir: the run's work_dir (local path or ``gs://``).
        parts: the run's state (`RunParts`: the engine's gather and scatter, the
            neutral layout and record).
        keep: how many recent steps to keep.
        asynchronous: write (and upload) in a background thread (`wait` joins it).
        writes: whether this process writes (False: a TensorFlow multi-worker run's
            non-chief workers, which hold the same state and write nothing).
        processes: JAX processes saving together (orbax writes each array once, from
            process 0); 1 on the TensorFlow engine.
        legacy: the engine's reader of its previous format (``ckpt-<step>``, or the JAX
            engine's ``orbax/<step>``), restored when the work_dir holds no run-format
            step; never written. Defaults to None.

    Raises:
        ValueError: a ``gs://`` work_dir with several JAX processes.

    Examples:
        >>> from fenwicks.train import engines
        >>> from fenwicks.train.options import EstimatorConfig
        >>> acc = fw.accel.current()
        >>> config = EstimatorConfig(steps_per_epoch=1, work_dir='run', train_batch_size=4,
        ...                          eval_batch_size=4, predict_batch_size=4, steps_per_loop=1,
        ...                          precision='float32', num_replicas=acc.num_replicas)
        >>> state = engines.current().RunState(fw.train.get_clf_model_func(
        ...     lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]),
        ...     fw.train.sgd_optimizer(0.1)), config, acc)
        >>> state.build(tf.TensorSpec([None, 3], tf.float32), {})   # step 0, nothing restored
        >>> checkpointer = RunCheckpointer('copy', state, keep=3, asynchronous=True)
        >>> checkpointer.restore() is None   # 'copy' holds no step yet: a fresh run
        True
        >>> checkpointer.save(0)     # returns once the arrays are copied
        >>> checkpointer.wait()      # the write is complete (or its error raised here)
        >>> checkpointer.restore()   # the newest readable step, into the state
        'copy/checkpoints/0'
        >>> checkpointer.close(), state.close()
        (None, None)
    """

    def __init__(self, work_dir: str, parts: RunParts, *, keep: int, asynchronous: bool,
                 writes: bool = True, processes: int = 1,
                 legacy: PreviousFormatReader | None = None) -> None:
        self._ocp = ocp()
        self.work_dir = work_dir.rstrip("/")
        self.directory = directory(self.work_dir)
        self._parts, self._keep, self._writes = parts, keep, writes
        self._processes = processes
        self._legacy = legacy
        self._bucket = (StagedBucket(self.directory, keep, processes)
                        if fw_io.is_gcs(work_dir) else None)
        self.asynchronous = asynchronous
        self._manager_: Any = None
        self._last_save_secs: float | None = None
        self.last_blocked_secs: float | None = None  # how long the last save() blocked
        self._pending: tuple[int, float, _Write] | None = None  # (step, start, write)
        self._background = False  # whether the pending write runs in the background
        self._good: tuple | None = None  # fingerprint of the last durable step
        self._legacy_good: str | None = None  # a previous format's checkpoint restored
        self.restored_record: dict | None = None  # the record of the step restored
        self.training_refusal: str | None = None  # the previous format's (`cross_engine`)

    # ---------------------------------------------------------------- orbax

    @property
    def _manager(self) -> Any:
        """Orbax's manager of the local folder (the scratch copy for ``gs://``), made on
        first use: reading an empty work_dir creates nothing."""
        if self._manager_ is None:
            ocp_ = self._ocp
            local = self._bucket.scratch if self._bucket else os.path.abspath(self.directory)
            self._manager_ = ocp_.CheckpointManager(
                local, item_names=(STATE, RECORD),
                options=ocp_.CheckpointManagerOptions(
                    # Staged: the bucket keeps `keep`; locally only the newest is needed.
                    max_to_keep=1 if self._bucket else self._keep,
                    # Orbax writes in the calling thread: this object's background thread
                    # when asynchronous (one copy to host, then everything off the loop).
                    enable_async_checkpointing=False, create=False,
                    cleanup_tmp_directories=True))
        return self._manager_

    # ---------------------------------------------------------------- the interface

    @property
    def pending_step(self) -> int | None:
        return self._pending[0] if self._pending else None

    @property
    def last_good(self) -> str | None:
        """The newest step this object restored or saved durably (no waiting)."""
        return self._good[0] if self._good else self._legacy_good

    @property
    def latest(self) -> str | None:
        """The newest durable step restored or saved; waits for a save in progress."""
        self.wait()
        return self.last_good

    @property
    def last_save_secs(self) -> float | None:
        return self._last_save_secs

    def _path(self, step: int) -> str:
        return f"{self.directory}/{step}"

    def _local(self, step: int) -> str:
        return os.path.join(str(self._manager.directory), str(step))

    def save(self, step: int, *, force: bool = False) -> None:
        """Checkpoints `step`, unless it is already saved (or being saved) and not `force`.

        Raises:
            CheckpointWriteError: this write, or the previous background one, failed.
        """
        self._save(step, force, self.asynchronous)

    def save_and_wait(self, step: int, *, force: bool = False) -> None:
        """`save`, written in the calling thread: returns once the step is durable."""
        self._save(step, force, False)

    def _save(self, step: int, force: bool, background: bool) -> None:
        if not force and (self.pending_step == step or self.last_good == self._path(step)):
            self.last_blocked_secs = None
            return
        self.wait()
        started = time.monotonic()
        try:
            frozen, record = self._parts.snapshot(), self._parts.record()
            if not self._writes:  # took part (a collective read may need it); no file
                self._parts.to_host(frozen)
                self.last_blocked_secs = time.monotonic() - started
                self._good = (self._path(step),)
                return
            if not self._bucket:
                os.makedirs(self.directory, exist_ok=True)
            write = functools.partial(self._write, step, frozen, record, force)
        except Exception as err:
            raise self._write_error(step, err) from err
        # Synchronous: written here, before `wait` (below) raises its error, if any.
        if background and not _EXIT_HOOK:
            _tf_internals.call_before_thread_pools_shut_down(_wait_at_exit)
            _EXIT_HOOK.append(True)
        self._pending = (step, started, _Write(write, background,
                                               f"fenwicks checkpoint writer {step}"))
        self._background = background
        if background:
            _WRITING.add(self)
        self.last_blocked_secs = time.monotonic() - started
        if not background:
            self.wait()

    def _write(self, step: int, frozen: Any, record: dict, force: bool) -> None:
        """Orbax's write of a snapshot and its record, then (``gs://``) the step
        uploaded and committed."""
        tree = self._parts.to_host(frozen)
        tree = {g: [np.require(a, requirements="C") for a in tree[g]] for g in GROUPS}
        record = {**record, "crc32": checksums(tree)}
        manager = self._manager
        manager.reload()
        if step in manager.all_steps():  # force, or another run's step of that number
            _removal.remove_orbax_step(manager, step)
        args = self._ocp.args
        try:
            manager.save(step, args=args.Composite(**{
                STATE: args.StandardSave(tree),
                RECORD: args.JsonSave(record)}), force=True)
        except BaseException:
            self._remove_partial(step)  # a full disk: what was written of it goes
            raise
        if self._bucket:
            self._bucket.publish(step, self._local(step))

    def _remove_partial(self, step: int) -> None:
        """Removes orbax's temporary folder of a write of `step` that failed."""
        try:  # orbax's and tensorstore's own threads may still be writing into it
            self._manager.wait_until_finished()
        except Exception:  # noqa: BLE001 - the write's error is the one raised
            pass
        folder = str(self._manager.directory)
        for attempt in range(5):  # a file a late writer adds makes rmtree fail: again
            leftovers = [name for name in (os.listdir(folder) if os.path.isdir(folder)
                                           else ()) if name.startswith(f"{step}{_TMP_MARK}")]
            if not leftovers:
                return
            for name in leftovers:
                _remove_tree(os.path.join(folder, name))
            time.sleep(0.1 * attempt)

    def wait(self) -> None:
        """Waits for a step being written in the background, if any.

        Raises:
            CheckpointWriteError: that write failed (raised once); the step before it
                stays the latest.
        """
        if self._pending is None:
            return
        step, started, write = self._pending
        self._pending = None
        _WRITING.discard(self)
        try:
            write.join()
        except Exception as err:
            error = self._write_error(step, err)
            if self._background:
                error = CheckpointWriteError(
                    f"{error} (It was written in the background, async_checkpoints=True, "
                    f"while training went on past step {step}.)")
            raise error from err
        self._last_save_secs = time.monotonic() - started
        # Staged: the bucket's copy holds the local files, byte for byte.
        self._good = fingerprint(self._path(step), self._local(step) if self._bucket
                                  else None)

    def agree(self, due: bool) -> bool:
        """True on every process if a save is due on any: with several JAX processes
        each reads its own clock (``save_every_secs``) and its own signals (SIGTERM to one
        host), and a save is a collective of them all (orbax's barriers). `due` itself
        with one process."""
        if self._processes == 1:
            return due
        from fenwicks.train.jax import processes

        return bool(processes.processes_where(due))

    def _write_error(self, step: int, err: BaseException) -> CheckpointWriteError:
        if isinstance(err, fw_io.TransferError) and err.__cause__ is not None:
            # Its own text names every path again; what storage answered is the news.
            cause = err.__cause__
            what = (f"the upload to the bucket failed after the storage client's retries "
                    f"({type(cause).__name__}: {first_line(cause)[:200]})")
        else:
            what = first_line(err)[:200] or type(err).__name__
        return CheckpointWriteError(
            f"could not write checkpoint {self._path(step)}: {what}. The previous "
            f"checkpoint ({self.last_good or 'none'}) is intact: free space or fix the "
            "storage, then call train() again")

    def _steps_on_disk(self) -> list[int]:
        if self._bucket:
            return self._bucket.complete_steps()
        return complete_steps(self.directory)

    def change_on_disk(self) -> str | None:
        """None if the newest step on disk is the one this object last wrote or read;
        ``'removed'`` if there is none any more; else ``'replaced'``."""
        self.wait()
        steps = self._steps_on_disk()
        if not steps:
            if self._good is None and self._legacy is not None:
                return self._legacy.change_on_disk()
            return "removed" if self._good else None
        return None if fingerprint(self._path(steps[-1])) == self._good else "replaced"

    def restore(self, path: str | None = None) -> str | None:
        """Restores `path` (a ``<work_dir>/checkpoints/<step>`` folder), or the newest intact
        step; the engine's previous format if the work_dir holds no run-format step.

        For the newest, a damaged step (a data file cut short, a garbled orbax metadata
        file, a missing or damaged run record, a missing ``state`` folder) is never
        loaded: the next older one is, with a warning naming it, and the damaged step is
        set aside as ``<step>.corrupt`` (kept, not deleted).

        Returns:
            The step restored, or None if there is none.

        Raises:
            ValueError: the step was written for another model.
            CheckpointCorruptError: steps are there but none can be read.
            CheckpointDownloadError: a ``gs://`` step could not be downloaded (a
                `CheckpointReadError`); nothing was restored or changed.
        """
        self.wait()
        if path is not None and is_step(path):
            try:
                return self._restore_step(step_of(path))
            except DamagedStep as err:
                raise ValueError(f"checkpoint {path} cannot be read: {err}") from err
        if path is not None:
            return self._restore_legacy(path)
        steps = self._steps_on_disk()
        if not steps:
            return self._restore_legacy(None)
        return restore_newest(steps, self._restore_step, self._path, self._set_aside,
                              self.work_dir, self.directory)

    def _restore_legacy(self, path: str | None) -> str | None:
        if self._legacy is None:
            return None
        restored = self._legacy.restore(path)
        self._legacy_good, self.restored_record = restored, None
        self.training_refusal = getattr(self._legacy, "training_refusal", None)
        return restored

    def _restore_step(self, step: int) -> str:
        """Restores `step`; `DamagedStep` if its files cannot be read."""
        where = self._path(step)
        try:
            good = fingerprint(where)
        except Exception as err:
            if self._bucket:  # storage did not answer: no sign of damage, nothing changed
                raise CheckpointDownloadError(where, err) from err
            raise
        if self._bucket:
            self._bucket.fetch(step, self._local(step), good)
        local = self._local(step) if self._bucket else where
        try:
            record = check_record(json.loads(_read_text(f"{local}/{RECORD}/metadata")))
        except (OSError, ValueError) as err:
            raise DamagedStep(f"its run record is missing or unreadable ({first_line(err)})") \
                from err
        ours = self._parts.layout()
        pairs = optimizer_pairs([path for path, _, _ in record["layout"]["optimizer"]],
                                [path for path, _, _ in ours["optimizer"]])
        self._check_fits(where, record, ours, pairs)
        try:
            tree = read_arrays(local, record)
        except Exception as err:  # noqa: BLE001 - whatever orbax met reading it: damage
            cause = first_line(err).split(" See full TensorStore details")[0][:300]
            raise DamagedStep(f"its arrays cannot be read ({cause or type(err).__name__})") \
                from err
        check_checksums(tree, record)
        notes: list[str] = []
        if pairs is not None:
            live = self._parts.to_host(self._parts.snapshot())["optimizer"]
            tree = {**tree, "optimizer": carry(tree["optimizer"], live, pairs)}
            notes = not_carried(ours["optimizer"], live, pairs)
        self._parts.scatter(tree)
        self._parts.apply_record({**record, "not_restored": notes} if notes else record)
        self._good, self._legacy_good, self.restored_record = good, None, record
        self.training_refusal = None
        return where

    def _check_fits(self, where: str, record: dict, ours: dict[str, list[list]],
                    pairs: list[int | None] | None) -> None:
        """CheckpointMismatchError if the step's arrays are not this model's (count or
        shapes); the optimizer's as `optimizer_pairs` pairs them."""
        for group in GROUPS:
            theirs = record["layout"][group]
            if group == "optimizer" and pairs is not None:
                theirs = [theirs[j] if j is not None else mine
                          for j, mine in zip(pairs, ours[group], strict=True)]
            shapes = [list(shape) for _, shape, _ in theirs]
            if shapes != [list(shape) for _, shape, _ in ours[group]]:
                raise CheckpointMismatchError(
                    f"checkpoint {where} was written by a different model: its {group} "
                    f"variables "
                    f"are {_describe(theirs)}, the model's {_describe(ours[group])}. Use "
                    "the model_func that wrote it, or another work_dir (warm_start_from= "
                    "loads the variables that match)")

    def _set_aside(self, damaged: list[tuple[str, str]], used: str) -> None:
        set_aside(damaged, used, self.directory, self._bucket, rename=self._writes)

    def close(self) -> None:
        """Waits for a write in progress, then closes the manager's threads (and removes
        a ``gs://`` run's scratch folder)."""
        try:
            self.wait()
        finally:
            if self._manager_ is not None:
                self._manager_.close()
            if self._bucket:
                self._bucket.close()
            if self._legacy is not None:
                self._legacy.close()


def _describe(layout: list[list]) -> str:
    if not layout:
        return "none"
    shapes = ", ".join(f"{path} {shape}" for path, shape, _ in layout[:3])
    return f"{len(layout)} ({shapes}{', ...' if len(layout) > 3 else ''})"


# --------------------------------------------------------------------------- loss scale
# float16 wraps the optimizer in Keras's LossScaleOptimizer (`building.build_model`),
# bfloat16 and float32 do not ('auto' is bfloat16 on a TPU, float16 on a T4): a run that
# changes precision, on one engine or at a switch, finds the checkpoint's optimizer
# variables with or without the wrapper's own. They are paired by what they are.


def loss_scale_prefix(paths: Sequence[str]) -> str | None:
    """The path prefix of a `keras.optimizers.LossScaleOptimizer`'s own variables among
    an optimizer's variable paths (``'loss_scale_optimizer'``), or None without one.

    Examples:
        >>> loss_scale_prefix(['loss_scale_optimizer/iteration',
        ...                    'loss_scale_optimizer/step_counter',
        ...                    'loss_scale_optimizer/dynamic_scale', 'sgd/iteration'])
        'loss_scale_optimizer'
        >>> loss_scale_prefix(['sgd/iteration', 'sgd/dense_kernel_momentum']) is None
        True
    """
    listed = set(paths)
    for path in paths:
        prefix, _, leaf = path.rpartition("/")
        if leaf == "dynamic_scale" and f"{prefix}/step_counter" in listed:
            return prefix
    return None


def optimizer_pairs(theirs: Sequence[str], ours: Sequence[str]) -> list[int | None] | None:
    """How a checkpoint's optimizer variables (paths `theirs`) fill the live optimizer's
    (`ours`) when one of the two is wrapped in a loss scale and the other is not.

    The inner optimizer's variables (``iterations``, the slots) are paired in order;
    the wrapper's own (its loss scale, its step counter) keep their initial values when
    the checkpoint has none, and are dropped when the live optimizer has none.

    Returns:
        For each of `ours`, the index in `theirs` of its value, or None (kept as it is);
        None if both or neither are wrapped, or the inner variables do not number the
        same (then they are compared in order, as they are).

    Examples:
        >>> optimizer_pairs(['sgd/iteration', 'sgd/k_momentum'],
        ...                 ['loss_scale_optimizer/iteration',
        ...                  'loss_scale_optimizer/step_counter',
        ...                  'loss_scale_optimizer/dynamic_scale',
        ...                  'sgd_1/iteration', 'sgd_1/k_momentum'])
        [None, None, None, 0, 1]
        >>> optimizer_pairs(['sgd/iteration'], ['sgd_1/iteration']) is None
        True
    """
    wrapped = loss_scale_prefix(theirs), loss_scale_prefix(ours)
    if (wrapped[0] is None) == (wrapped[1] is None):
        return None

    def inner(paths: Sequence[str], prefix: str | None) -> list[int]:
        return [i for i, path in enumerate(paths) if path.rpartition("/")[0] != prefix]

    their_inner, our_inner = inner(theirs, wrapped[0]), inner(ours, wrapped[1])
    if len(their_inner) != len(our_inner):
        return None
    pairs: list[int | None] = [None] * len(ours)
    for i, j in zip(our_inner, their_inner, strict=True):
        pairs[i] = j
    return pairs


def carry(theirs: list[np.ndarray], live: list[np.ndarray],
          pairs: list[int | None]) -> list[np.ndarray]:
    """The optimizer's arrays to restore: the checkpoint's where `pairs` has one, the
    live value (the initial one, in a build just made) where it has None."""
    return [theirs[j] if j is not None else value for j, value in zip(pairs, live,
                                                                       strict=True)]


def not_carried(layout: list[list], live: list[np.ndarray],
                pairs: list[int | None]) -> list[str]:
    """What a restore did not carry, for the line that says the run continues: the loss
    scale, which starts afresh at its initial value (``['the loss scale starts afresh at
    32768']``); nothing for the wrapper state a checkpoint held and the run drops."""
    notes = []
    for (path, _, _), value, j in zip(layout, live, pairs, strict=True):
        if j is None and path.rpartition("/")[2] == "dynamic_scale":
            notes.append(f"the loss scale starts afresh at {float(np.asarray(value)):g}")
    return notes


# --------------------------------------------------------------------------- fallback
# Shared with the JAX engine's reader of its previous format (`jax.checkpoints`), whose
# steps are orbax steps too.


def restore_newest(steps: list[int], restore_step: Callable[[int], str],
                   path_of: Callable[[int], str],
                   set_aside_damaged: Callable[[list[tuple[str, str]], str], None],
                   work_dir: str, folder: str) -> str | None:
    """Restores the newest of `steps` that can be read, newest first.

    A step whose `restore_step` raises `DamagedStep` is passed over; once an older one
    is restored, the damaged ones go to `set_aside_damaged(damaged, restored)`.

    Args:
        steps: the complete steps, oldest first.
        restore_step: restores one step; returns its path.
        path_of: a step's path, for messages.
        set_aside_damaged: ``([(path, why), ...], restored path) -> None``.
        work_dir, folder: the work_dir and its steps' folder, for the error.

    Returns:
        The step restored; None if `steps` is empty.

    Raises:
        CheckpointCorruptError: every step is damaged; nothing was changed.

    Examples:
        >>> restore_newest([], print, str, print, '/content/run', '/content/run/checkpoints')
    """
    damaged: list[tuple[str, str]] = []
    for step in reversed(steps):
        try:
            restored = restore_step(step)
        except DamagedStep as err:
            damaged.append((path_of(step), str(err)))
            continue
        if damaged:
            set_aside_damaged(damaged, restored)
        return restored
    if steps:
        raise none_readable(work_dir, len(steps), damaged,
                            f"the step folders of {folder}")
    return None


def set_aside(damaged: list[tuple[str, str]], used: str, folder: str,
              bucket: StagedBucket | None, *, rename: bool = True) -> None:
    """Warns once per damaged step, and renames it ``<step>.corrupt`` (on ``gs://``
    its commit marker), so it is no longer a step.

    Args:
        damaged: ``[(step path, why), ...]``.
        used: the step restored instead.
        folder: the steps' folder, for a message.
        bucket: the ``gs://`` side of a staged work_dir, or None.
        rename: rename the steps (False: a process that writes nothing only warns).
            Defaults to True.

    Examples:
        >>> set_aside([], '/content/run/checkpoints/5', '/content/run/checkpoints', None)
    """
    for where, why in damaged:
        logger.warning("fenwicks: checkpoint %s is unreadable (%s); resumed from the "
                       "older %s instead. Its files are kept as %s%s", where, why, used,
                       where, CORRUPT_SUFFIX if not bucket else
                       f" (without {COMMIT_FILE}: renamed {COMMIT_FILE}{CORRUPT_SUFFIX})")
    if not rename:
        return
    try:
        for where, _ in damaged:
            if bucket:
                bucket.set_aside(step_of(where))
            else:
                os.rename(where, where + CORRUPT_SUFFIX)
    except Exception as err:  # noqa: BLE001 - a read-only work_dir: read around it
        logger.warning("fenwicks: could not set the damaged checkpoint(s) aside in %s "
                       "(%s); they stay in place and are skipped", folder, first_line(err))


# --------------------------------------------------------------------------- gs://


class StagedBucket:
    """The ``gs://`` side of a staged run: which steps are complete, upload, download,
    prune. Holds the local scratch folder orbax writes and reads.

    Orbax writes each step to local scratch space exactly as for a local work_dir; the
    completed step folder is then uploaded with `fenwicks.io.upload` (gcsfs), and last of
    all ``<step>/commit_success.txt``, the marker orbax itself uses on GCS. GCS objects
    appear whole or not at all, so a step whose upload was cut short is never taken for
    the latest. Old steps are pruned marker first, for the same reason. gcsfs gives one
    storage client, one source of credentials and Fenwicks' bounded retries. (Orbax's own
    ``gs://`` writes go through tensorstore, which has its own credential lookup, retry
    settings and endpoint variable, and whose OCDBT writes rely on conditional
    ``ifGenerationMatch`` requests that the offline test emulator does not implement:
    nothing of it could be tested here. The cost of staging: one local copy of the newest
    step, and an upload after each write.)
    """

    def __init__(self, remote: str, keep: int, processes: int = 1) -> None:
        if processes > 1:
            raise ValueError(
                f"work_dir={remote.rsplit('/', 1)[0]!r}: Fenwicks stages gs:// "
                "checkpoints through one process's local disk, and this run has "
                f"{processes} JAX processes; give a work_dir on a filesystem all hosts "
                "share, or run on one host")
        fw_io.check_bucket(remote)
        self.remote, self.keep = remote, keep
        self.scratch = tempfile.mkdtemp(prefix="fenwicks-run-")
        # Removed by `close`, or when this object goes (an estimator never closed).
        self._cleanup = _removal.remove_tree_at_exit(self, self.scratch)
        # Steps whose local copy is known to equal the bucket's: {step: fingerprint}.
        self._copies: dict[int, tuple] = {}

    def complete_steps(self) -> list[int]:
        return complete_steps(self.remote)

    def publish(self, step: int, local: str) -> None:
        """Uploads the completed local step folder, commits it, prunes old steps."""
        target = f"{self.remote}/{step}"
        # A copy being replaced, or an upload cut short earlier.
        self._remove(target, what="checkpoint save")
        for name in sorted(os.listdir(local)):
            if name != COMMIT_FILE:  # the marker goes last, once everything is there
                fw_io.upload(os.path.join(local, name), target, progress=False)
        _deadline.run(_write_text, f"{target}/{COMMIT_FILE}",
                      f"Checkpoint commit was successful to {target}",
                      what="checkpoint commit", path=target)
        self._copies[step] = fingerprint(target, local)
        self._prune()

    def fetch(self, step: int, local: str, fingerprint: tuple) -> None:
        """Makes `local` a copy of the bucket's `step` (downloaded unless known equal).

        Raises:
            CheckpointDownloadError: the download failed; nothing was restored.
        """
        if self._copies.get(step) == fingerprint and len(fingerprint) > 1 \
                and os.path.isdir(local):
            return
        _remove_tree(local)
        source = f"{self.remote}/{step}"
        try:
            fw_io.download(source, self.scratch, progress=False)
        except Exception as err:
            _remove_tree(local)  # never restore a partial copy
            raise CheckpointDownloadError(source, err) from err
        self._copies = {step: fingerprint}

    def set_aside(self, step: int) -> None:
        """Renames the commit marker of a damaged `step`: no longer complete, kept."""
        marker = f"{self.remote}/{step}/{COMMIT_FILE}"
        fw_io.rename(marker, marker + CORRUPT_SUFFIX)

    def _prune(self) -> None:
        """Keeps the newest `keep` complete steps; removes older ones and the leftovers
        of uploads cut short (no marker), marker first."""
        complete = self.complete_steps()
        if not complete:
            return
        kept = set(complete[-self.keep:])
        for name in fw_io.listdir(self.remote):
            step = _step_name(name.rstrip("/").rsplit("/", 1)[-1])
            if step is not None and step not in kept and step <= complete[-1]:
                self._remove(f"{self.remote}/{step}")

    def _remove(self, path: str, what: str = "removing an old checkpoint") -> None:
        """Removes step folder `path` if there; a storage failure is named as `what`."""
        if _deadline.run(_gcs_exists, path, what=what, path=path):
            _deadline.run(_remove_step, path, what=what, path=path)

    def close(self) -> None:
        self._cleanup()


def _gcs_exists(path: str) -> bool:
    import tensorflow as tf  # gs:// only: the client fenwicks.io uses

    return bool(tf.io.gfile.exists(path))


def _write_text(path: str, text: str) -> None:
    fw_io.write_text(path, text)


def _remove_step(path: str) -> None:
    """Marker first: a step half removed is never taken for a checkpoint."""
    marker = f"{path}/{COMMIT_FILE}"
    if fw_io.exists(marker):
        _remove_file(marker)
    _remove_tree(path)
