"""The run's state and where it lives, shared by both engines: model, optimizer and step
counters, built once and restored from ``work_dir``, the work_dir lock, and the summary
writers.

Checkpoints are the run format's (`fenwicks.train.run_format`: Keras's state tree as
NumPy arrays plus the run record, through orbax), the same for both engines, so a run
stopped on one engine continues on the other. They belong to the run's
`run_format.RunCheckpointer`, which `RunState.make_checkpointer` builds with the model.
An engine's subclass supplies only how its variables reach the host and go back
(`snapshot`, `to_host`, `scatter`: `run_format.EngineArrays`), how its counters are set
(`set_counters`), and a reader of its previous checkpoint format, for old work_dirs; a
work_dir that holds only the other engine's previous format is continued too
(`cross_engine.OtherEnginesReader`).
`RunState` restores and waits; it never saves: the controller's `save_policy.SavePolicy`
does. `RunState` knows nothing of loops, inputs or callbacks; the estimator, the
controller and its actions call it.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

import tensorflow as tf  # tf.summary: TensorBoard's writers, on both engines

from fenwicks import _deadline, _removal, accel
from fenwicks import io as fw_io
from fenwicks._text import first_line
from fenwicks.train import building, checkpointing, cross_engine, lock, run_format
from fenwicks.train.checkpointing import Checkpointer
from fenwicks.train.model_func import ModelSpec
from fenwicks.train.options import EstimatorConfig

logger = logging.getLogger("fenwicks")


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; no checkpoint was written for it."""


class StorageUnavailableError(OSError):
    """Storage stopped answering during `train`; the message names the last good checkpoint.

    Attributes:
        last_checkpoint: the newest checkpoint known to be complete, or None.
    """

    def __init__(self, message: str, last_checkpoint: str | None) -> None:
        super().__init__(message)
        self.last_checkpoint = last_checkpoint


class RunState(abc.ABC):
    """Model, optimizer, step counters and their checkpointer; the work_dir lock, the
    summary writers, the reload after a NaN and following a work_dir that changed.

    Engine-neutral: each engine subclasses it (`fenwicks.train.tf.state.TFRunState`,
    `fenwicks.train.jax.state.JaxRunState`) with how its variables and counters are
    built, gathered to host arrays and scattered back (`snapshot`, `to_host`,
    `scatter`, `set_counters`).

    Args:
        model_func: ``params -> ModelSpec``.
        config: the estimator's `EstimatorConfig`.
        accelerator: where the variables live (`fw.accel.current()`).

    Examples:
        >>> from fenwicks.train import engines
        >>> from fenwicks.train.options import EstimatorConfig
        >>> acc = fw.accel.current()
        >>> config = EstimatorConfig(steps_per_epoch=1, work_dir='run', train_batch_size=4,
        ...                          eval_batch_size=4, predict_batch_size=4, steps_per_loop=1,
        ...                          precision='float32', num_replicas=acc.num_replicas)
        >>> model_func = fw.train.get_clf_model_func(
        ...     lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]),
        ...     fw.train.sgd_optimizer(0.1))
        >>> state = engines.current().RunState(model_func, config, acc)
        >>> state.build(tf.TensorSpec([None, 3], tf.float32), {})   # 'run' holds nothing yet
        >>> state.global_step, state.latest_checkpoint
        (0, None)
        >>> state.checkpointer.save_and_wait(0)   # as the controller's SavePolicy saves
        >>> state.close()
        >>> again = engines.current().RunState(model_func, config, acc)
        >>> again.build(tf.TensorSpec([None, 3], tf.float32), {})   # restores the latest
        >>> again.latest_checkpoint
        'run/checkpoints/0'
        >>> again.close()
        >>> type(again).__name__   # the engine's subclass
        'TFRunState'
    """

    engine: str  # whose checkpoints it reads and writes (`cross_engine.ENGINES`)

    def __init__(self, model_func: building.ModelFunc, config: EstimatorConfig,
                 accelerator: accel.Accelerator) -> None:
        self.config = config
        self.warm_start_report: dict[str, list[str]] | None = None
        self.other_engines_checkpoint: str | None = None  # read for evaluate and predict
        self.training_refusal: str | None = None  # why train() cannot continue what was read
        self.stale = False  # True after a NaN: the weights in memory are not trusted
        self.optimizer: Any = None
        self.features_spec: Any = None
        self._model_func = model_func
        self._acc = accelerator
        self._spec: ModelSpec | None = None
        self._lock: lock.WorkDirLock | None = None
        self._writers: dict[str, Any] = {}
        self._checkpointer: Checkpointer | None = None
        self._groups: dict[str, list[Any]] = {}  # the Keras variables of a checkpoint

    # ---------------------------------------------------------------- what is built

    @property
    def built(self) -> bool:
        return self._spec is not None

    @property
    def spec(self) -> ModelSpec:
        if self._spec is None:
            raise ValueError("the model is built on first use; call train, evaluate or "
                             "predict first (it needs the input's shapes)")
        return self._spec

    @property
    @abc.abstractmethod
    def global_step(self) -> int:
        """Training steps taken so far, including those of runs resumed from work_dir."""

    @property
    @abc.abstractmethod
    def input_position(self) -> int:
        """Training steps' worth of input read so far: where a new input iterator starts."""

    @property
    @abc.abstractmethod
    def is_chief(self) -> bool:
        """False on the processes that write no files (a multi-worker run's others)."""

    @property
    def checkpointer(self) -> Checkpointer:
        """The one owner of the run's checkpoints, built with the model (the controller's
        `SavePolicy` is what saves through it)."""
        self.spec  # noqa: B018 - raises the "built on first use" error
        return self._checkpointer

    @property
    def latest_checkpoint(self) -> str | None:
        """The newest complete checkpoint; waits for a save in progress (see `wait`)."""
        return self._checkpointer.latest if self.built else None

    @property
    def last_good_checkpoint(self) -> str | None:
        """The newest checkpoint known complete, without waiting for a write in progress."""
        return self._checkpointer.last_good if self._checkpointer is not None else None

    @abc.abstractmethod
    def build(self, features_spec: Any, params: dict) -> None:
        """Creates model, optimizer and step counters; restores or warm-starts them."""

    # ---------------------------------------------------------------- the run format
    # What an engine supplies to write and read the run format (`run_format.EngineArrays`;
    # the TensorFlow and JAX engines do; an engine with a checkpointer of its own, such as
    # the reference engine's, need not).

    def snapshot(self) -> Any:
        """The variables' values now, in copies no later step changes (may be device-side
        copies still on their way: `to_host` waits for them)."""
        raise NotImplementedError(f"the {self.engine} engine does not write the run format")

    def to_host(self, frozen: Any) -> run_format.StateTree:
        """A `snapshot` as NumPy arrays, ``{group: [array, ...]}`` in
        `run_format.GROUPS`' order (in the writer's thread for an async save)."""
        raise NotImplementedError(f"the {self.engine} engine does not write the run format")

    def scatter(self, tree: run_format.StateTree) -> None:
        """Puts host arrays back into the variables, on this engine's devices."""
        raise NotImplementedError(f"the {self.engine} engine does not read the run format")

    def set_counters(self, step: int, input_steps: int) -> None:
        """Sets the global step and the input position (a restored run record's)."""
        raise NotImplementedError(f"the {self.engine} engine does not read the run format")

    # What is the same on every engine:

    def layout(self) -> dict[str, list[list]]:
        """``{group: [[path, shape, dtype], ...]}`` of the variables a step holds."""
        return run_format.layout_of(self._groups)

    def record(self) -> dict:
        """The run record of the live state (`run_format.make_record`)."""
        return run_format.make_record(
            engine=self.engine, step=self.global_step, input_steps=self.input_position,
            train_batch_size=self.config.train_batch_size, layout=self.layout(),
            tf1_names=self.tf1_names())

    def tf1_names(self) -> dict[str, list[str]] | None:
        """Each model variable's TF1 name, for the run record, if the program gave its
        variables TF1 names (only the TensorFlow engine runs TF1 code); None here."""
        return None

    def apply_record(self, record: dict) -> None:
        """Sets counters and Keras's global seed state from a restored run record, and
        says so in one line when another engine wrote it."""
        self.set_counters(record["step"], record["input_steps"])
        run_format.set_global_seed_state(record.get("seed"))
        # What the restore did not carry: a loss scale the checkpoint lacked (it was
        # written at another precision: `run_format.optimizer_pairs`).
        missing = list(record.get("not_restored", ()))
        if record["engine"] != self.engine:
            # A checkpoint of the formats before the run format (`cross_engine`) holds no
            # seed state at all: the line says what was not restored.
            if "seed" not in record:
                missing.insert(0, "not Keras's global seed generator, which checkpoints "
                                  "before the run format did not hold")
            logger.warning(
                "fenwicks: %s was trained on the %s; this run continues from its step %d "
                "on the %s (optimizer slots, input position and learning-rate schedule "
                "restored%s)", self.config.work_dir, run_format.title(record["engine"]),
                record["step"], run_format.title(self.engine),
                "".join(f"; {note}" for note in missing))
        elif missing:
            logger.warning(
                "fenwicks: %s continues from its step %d at precision=%r (optimizer "
                "slots, input position and learning-rate schedule restored; %s, as the "
                "step was written without one)", self.config.work_dir, record["step"],
                self.config.precision, "; ".join(missing))

    @property
    def restored_record(self) -> dict | None:
        """The run record of the step restored, or None (a fresh run, or a checkpoint of
        an engine's previous format)."""
        checkpointer = self._checkpointer
        return getattr(checkpointer, "restored_record", None)

    def make_checkpointer(self, groups: dict[str, list[Any]], *, writes: bool,
                          processes: int = 1, asynchronous: bool | None = None,
                          legacy: run_format.PreviousFormatReader | None = None
                          ) -> run_format.RunCheckpointer:
        """The run's checkpointer over `groups` (`run_format.variable_groups`).

        Args:
            groups: the Keras variables of a step.
            writes: whether this process writes checkpoints.
            processes: processes saving together (the JAX engine's multi-host runs).
            asynchronous: background writes. Defaults to None: the config's.
            legacy: the engine's reader of its previous format (old work_dirs). Defaults
                to None: the other engines' previous formats are read
                (`cross_engine.OtherEnginesReader`).
        """
        self._groups = groups
        if legacy is None:
            legacy = cross_engine.OtherEnginesReader(self.config.work_dir, self.engine,
                                                     self, groups)
        else:  # and its checkpoints written at another precision
            legacy = cross_engine.AtAnotherPrecision(legacy, self.config.work_dir,
                                                     self.engine, self, groups)
        return run_format.RunCheckpointer(
            self.config.work_dir, self, keep=self.config.keep_checkpoints,
            asynchronous=(self.config.async_checkpoints if asynchronous is None
                          else asynchronous),
            writes=writes, processes=processes, legacy=legacy)

    def warm_start_any(self, model: Any, source: str) -> dict[str, list[str]] | None:
        """Warm-starts `model` from a run-format work_dir or step, or from another
        engine's previous format (`cross_engine.warm_start`); None if `source` is
        neither (the engine's own previous format: its reader)."""
        return cross_engine.warm_start(model, source, self.engine)

    def remove_partial_saves(self, work_dir: str) -> None:
        """Removes what a killed process left of a save in `work_dir` (before training)."""
        run_format.remove_partial_saves(work_dir)

    def reset(self) -> None:
        """Forgets model, optimizer, counters and checkpointer: the next `build` starts
        afresh."""
        checkpointer, self._checkpointer = self._checkpointer, None
        self._spec = self.optimizer = self.warm_start_report = None
        self.other_engines_checkpoint = self.training_refusal = None
        self.stale = False
        if checkpointer is not None:
            checkpointer.close()

    # ---------------------------------------------------------------- reading

    def reload_if_stale(self) -> bool:
        """After a NaN, goes back to the last good checkpoint; True if it did."""
        if not self.stale:
            return False
        if self.checkpointer.restore() is None:
            raise NonFiniteLossError("the weights became NaN before any checkpoint was "
                                     "saved; create a new estimator (lower the learning rate)")
        self.stale = False
        return True

    def catch_up(self) -> str | None:
        """Follows work_dir if its checkpoints changed since this state wrote or read them.

        The work_dir is the model, as in TPUEstimator: checkpoints written meanwhile by
        another run (or put there by hand) are restored; if they were all removed (a
        k-fold loop that cleans the work_dir), the state is reset, so the next `build`
        initialises a fresh model, as a new estimator would. A work_dir that holds only
        the other engine's checkpoints (read for evaluate and predict: `cross_engine`) is
        followed too: when its newest checkpoint changes, the state is reset and the next
        `build` reads the work_dir again.

        A multi-worker run does not follow work_dir: its chief is what writes there, and
        the workers hold the same state in lockstep. A worker restoring on its own could
        read the chief's previous checkpoint while the newest is still being written, and
        the cluster's collectives would then mix two models' numbers.

        Returns:
            ``'restored'``, ``'reset'``, or None if nothing changed.
        """
        if not self.built or self.config.num_processes > 1:
            return None
        checkpointer = self._checkpointer
        if checkpointer.last_good is None and self._other_engine_moved_on():
            self.reset()
            return "reset"
        change = checkpointer.change_on_disk()
        if change is None:
            return None
        if change == "removed":
            logger.warning("fenwicks: %s no longer holds checkpoint %s; starting from a "
                           "fresh initialisation (step 0), as a new estimator would",
                           self.config.work_dir, checkpointer.last_good)
            self.reset()
            return "reset"
        restored = checkpointer.restore()
        logger.warning("fenwicks: %s changed since this estimator read it; continuing from "
                       "%s", self.config.work_dir, restored)
        return "restored"

    def _other_engine_moved_on(self) -> bool:
        """Whether the other engine's newest checkpoint in work_dir (read when work_dir
        holds none of this engine's: `cross_engine`) is not the one this state read."""
        theirs = cross_engine.other_engines_checkpoint(self.config.work_dir, self.engine)
        if theirs == self.other_engines_checkpoint:
            return False
        logger.warning("fenwicks: %s now holds %s (this estimator read %s); reading the "
                       "work_dir again", self.config.work_dir,
                       theirs or "no checkpoint of the other engine",
                       self.other_engines_checkpoint or "none")
        return True

    # ---------------------------------------------------------------- waiting

    def check_work_dir(self) -> None:
        """Raises `lock.WorkDirLostError` if work_dir was deleted while this run held it:
        a save must not silently recreate the folder (the checkpoints, the epoch log and
        the TensorBoard logs that were there are gone)."""
        if self._lock is not None:
            # Bounded on gs:// as every storage call of the training thread is: a stat
            # that meets an outage would otherwise wait out TensorFlow's retries.
            _deadline.run(self._lock.check, what="work_dir check",
                          path=self.config.work_dir)

    def wait(self) -> None:
        """Waits for a checkpoint being written in the background, if any.

        Raises:
            CheckpointWriteError: that write failed (the message names the last good
                checkpoint, which stays the latest; nothing saved before is lost).
        """
        if self._checkpointer is not None:
            self._checkpointer.wait()

    def _background_failure(self) -> Exception | None:
        """Waits for a background write; its error, or None if it succeeded (or none ran)."""
        try:
            self.wait()
        except Exception as err:  # noqa: BLE001 - returned to the caller
            return err
        return None

    def _wait_quietly(self) -> None:
        """`wait`, logging a failure: for paths already raising another error."""
        try:
            self.wait()
        except Exception as err:  # noqa: BLE001 - the error in flight is the one raised
            logger.error("fenwicks: %s", err)

    def check_trainable(self) -> None:
        """Refuses ``train()`` when what `build` restored cannot be continued (another
        engine's checkpoint loaded for evaluate and predict only: `cross_engine`).

        Raises:
            CheckpointMismatchError: the one sentence saying why; nothing was written.
        """
        why = self.training_refusal or getattr(self._checkpointer, "training_refusal", None)
        if why:
            raise checkpointing.CheckpointMismatchError(why)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Held while training: one writer of checkpoints per work_dir (see `lock.py`)."""
        if not self.is_chief:
            yield  # a non-chief worker writes no checkpoint
            return
        work_dir = fw_io.check_bucket(self.config.work_dir)
        if self._lock is None:
            self._lock = lock.WorkDirLock(work_dir)
        _deadline.run(self._lock.acquire, what="work_dir lock", path=work_dir)
        self.remove_partial_saves(work_dir)  # a killed run's leftovers
        try:
            yield
            self.wait()  # the end of train: its last checkpoint is complete
        except Exception as err:
            if isinstance(err, lock.WorkDirLostError):
                raise self._lost(err) from err
            # A checkpoint write that failed in the background is the news, whatever the
            # training thread ran into meanwhile (a summary flush in the same outage).
            failed = self._background_failure() or err
            if work_dir.startswith("gs://") and _is_storage_failure(failed):
                _deadline.mark_outage()
                raise self._unavailable(failed) from err
            if failed is not err:
                raise failed from err
            raise
        finally:
            self._wait_quietly()  # never release the lock while a write runs
            _deadline.run(self._lock.release, what="releasing the lock", path=work_dir,
                          best_effort=True, attempt_in_outage=True)

    def _lost(self, err: lock.WorkDirLostError) -> lock.WorkDirLostError:
        """`err`, told truthfully when a checkpoint was being written in the background
        as the work_dir went: that write either failed (its leftovers, empty folders it
        made, are removed) or landed in a folder of its own making, then the only
        checkpoint there."""
        checkpointer = self._checkpointer
        step = checkpointer.pending_step if checkpointer is not None else None
        if step is None:
            return err
        failed = self._background_failure()
        lock_path = self._lock.path
        work_dir = lock_path.rsplit("/", 1)[0]
        folder_gone = err.folder_gone  # the write may have made it again meanwhile
        if failed is not None and not fw_io.is_gcs(work_dir):
            _remove_empty_folders(work_dir)
            folder_gone = folder_gone or not os.path.exists(work_dir)
        return lock.WorkDirLostError(lock.lost_message(
            work_dir, lock_path, folder_gone, in_flight=step,
            landed=checkpointer.latest if failed is None else None))

    def _unavailable(self, err: BaseException) -> StorageUnavailableError:
        last, cause = self.last_good_checkpoint, err
        while (cause.__cause__ is not None  # the innermost error of ours names the path
               and type(cause.__cause__).__module__.startswith("fenwicks")):
            cause = cause.__cause__
        return StorageUnavailableError(
            f"storage of work_dir={self.config.work_dir!r} stopped answering at step "
            f"{self.global_step} ({first_line(cause).split('. The previous')[0]}). "
            f"The last good checkpoint is {last or 'none: nothing was saved yet'}. When "
            "storage answers again, call train() again: it continues from there "
            "(a new process resumes from that checkpoint, exactly)", last)

    def heartbeat(self) -> None:
        if self._lock is not None:
            _deadline.run(self._lock.heartbeat, what="lock heartbeat",
                          path=self.config.work_dir)

    def summary_writer(self, kind: str) -> Any:
        """One writer per kind (``'train'``, ``'eval'``): each opens a new event file."""
        if kind not in self._writers:
            self._writers[kind] = self._create_writer(kind)
        return self._writers[kind]

    def _create_writer(self, kind: str) -> Any:
        if not self.is_chief:
            return tf.summary.create_noop_writer()
        path = f"{self.config.work_dir}/{kind}"
        try:
            return _deadline.run(tf.summary.create_file_writer, path,
                                 what="summary writer", path=path)
        except tf.errors.OpError as err:
            # A finished run read from a read-only folder (Kaggle's /kaggle/input, a
            # shared Drive) is still evaluated; only its TensorBoard scalars are lost.
            logger.warning("fenwicks: cannot write TensorBoard summaries to %s/%s (%s); "
                           "%s results are returned but not logged there",
                           self.config.work_dir, kind, first_line(err), kind)
            return tf.summary.create_noop_writer()

    def close(self) -> None:
        """Waits for a checkpoint being written; flushes and closes the summary writers.

        Raises:
            CheckpointWriteError: the checkpoint being written failed (the writers are
                closed all the same).
        """
        try:
            self.wait()
        finally:
            self._close_writers()

    def _close_writers(self) -> None:
        # This runs from a finalizer too, so at any moment: even while TensorFlow traces
        # another estimator's tf.data function. init_scope runs the flush and close
        # eagerly; otherwise they became ops of that function, which then failed with
        # "Resource ... SummaryWriterInterface does not exist" once the writer was gone.
        with tf.init_scope():
            for writer in self._writers.values():
                _deadline.run(writer.close, what="closing summaries",
                              path=self.config.work_dir, best_effort=True)
        self._writers.clear()


class HostCountedRunState(RunState):
    """A `RunState` whose step and input position are Python ints on the host (the jax
    and reference engines: their steps return values, not variables to count in)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.step = 0  # global_step, on the host
        self.input_steps_taken = 0  # the input position, in steps

    @property
    def global_step(self) -> int:
        return self.step if self.built else 0

    @property
    def input_position(self) -> int:
        return self.input_steps_taken if self.built else 0


def _is_storage_failure(err: BaseException) -> bool:
    """An error (or its cause) that says storage could not be reached."""
    return any(e is not None and (_deadline.is_outage(e) or checkpointing.is_storage_error(e)
                                  or isinstance(e, checkpointing.CheckpointReadError))
               for e in (err, err.__cause__))


def _remove_empty_folders(work_dir: str) -> None:
    """Removes the folders a failed write recreated under a deleted work_dir, if empty
    (an empty folder holds nothing of anyone's)."""
    for dirpath, _, _ in sorted(os.walk(work_dir), key=lambda w: -len(w[0])):
        _removal.remove_empty_dir(dirpath)  # not empty: something is in it, kept
