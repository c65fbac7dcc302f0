"""The run's state and where it lives: model, optimizer and step counters, built once and
restored from (or saved to) ``work_dir``, the work_dir lock, and the summary writers.

`RunState` knows nothing of loops, inputs or callbacks; the controller and the input
manager call it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from fenwicks import accel
from fenwicks.train import building, checkpoints, lock
from fenwicks.train.model_func import ModelSpec

logger = logging.getLogger("fenwicks")


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; no checkpoint was written for it."""


class RunState:
    """Model, optimizer, ``global_step`` and ``input_steps``, and their checkpoints.

    Args:
        model_func: ``params -> ModelSpec``.
        config: the estimator's `EstimatorConfig`.
        accelerator: where the variables live (`fw.accel.current()`).

    Example:
        >>> state = RunState(model_func, config, fw.accel.current())
        >>> state.build(features_spec, params)   # restores work_dir's latest checkpoint
        >>> state.save()
    """

    def __init__(self, model_func: building.ModelFunc, config: Any,
                 accelerator: accel.Accelerator) -> None:
        self.config = config
        self.warm_start_report: dict[str, list[str]] | None = None
        self.stale = False  # True after a NaN: the weights in memory are not trusted
        self._model_func = model_func
        self._acc = accelerator
        self._strategy = accelerator.strategy
        self._spec: ModelSpec | None = None
        self._lock: lock.WorkDirLock | None = None
        self._writers: dict[str, Any] = {}

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
    def global_step(self) -> int:
        """Training steps taken so far, including those of runs resumed from work_dir."""
        return int(self.step_counter.numpy()) if self.built else 0

    @property
    def is_chief(self) -> bool:
        """False on the non-chief workers of a multi-worker run: they write no files."""
        return bool(self._strategy.extended.should_checkpoint)

    @property
    def latest_checkpoint(self) -> str | None:
        return self._manager.latest_checkpoint if self.built else None

    def build(self, features_spec: Any, params: dict) -> None:
        """Creates model, optimizer and step counters; restores or warm-starts them."""
        if self.built:
            return
        if self.config.seed is not None:
            keras.utils.set_random_seed(self.config.seed)
        with self._strategy.scope(), building.precision_policy(self.config.precision):
            spec, self.optimizer = building.build_model(
                self._model_func, params, self.config.precision, features_spec)
            self.step_counter = tf.Variable(0, dtype=tf.int64, name="global_step")
            self.input_steps = tf.Variable(0, dtype=tf.int64, name="input_steps")
        self.features_spec = features_spec
        self._root = checkpoints.make_checkpoint(spec.model, self.optimizer,
                                                 self.step_counter, self.input_steps)
        restored = self._restore()
        if restored is None and self.config.warm_start_from:
            self.warm_start_report = checkpoints.warm_start(spec.model,
                                                            self.config.warm_start_from)
        self._manager = self._make_manager()
        self._spec = spec

    # ---------------------------------------------------------------- reading

    def _scratch_dir(self) -> str | None:
        return self.config.work_dir + "/.probe" if self._acc.is_remote else None

    def _restore(self) -> str | None:
        return checkpoints.restore_latest(self._root, self.config.work_dir,
                                          self._scratch_dir())

    def _make_manager(self) -> tf.train.CheckpointManager:
        return tf.train.CheckpointManager(
            self._root, self.config.work_dir, self.config.keep_checkpoints,
            step_counter=self.step_counter, checkpoint_name="ckpt")

    def reload_if_stale(self) -> bool:
        """After a NaN, goes back to the last good checkpoint; True if it did."""
        if not self.stale:
            return False
        if self._restore() is None:
            raise NonFiniteLossError("the weights became NaN before any checkpoint was "
                                     "saved; create a new estimator (lower the learning rate)")
        self.stale = False
        return True

    def catch_up(self) -> bool:
        """Reloads work_dir if another process trained there since; True if it did."""
        if not self.built or (checkpoints.latest(self.config.work_dir)
                              == self._manager.latest_checkpoint):
            return False
        restored = self._restore()
        logger.warning("fenwicks: %s changed since this estimator read it; continuing from "
                       "%s", self.config.work_dir, restored)
        self._manager = self._make_manager()
        return True

    # ---------------------------------------------------------------- writing

    def save(self, force: bool = False) -> None:
        """Checkpoints the current step (unless already saved, or `force`)."""
        latest = self._manager.latest_checkpoint
        if not force and latest and latest.endswith(f"-{self.global_step}"):
            return  # nothing new since the last save
        if self.is_chief:
            checkpoints.save(self._manager, self.global_step)
            return
        # Every worker takes part in a save (a variable may need a collective to be read);
        # the others write to a scratch directory that is removed at once.
        scratch = f"{self.config.work_dir}/.worker-{self._strategy.cluster_resolver.task_id}"
        tf.train.CheckpointManager(self._root, scratch, 1).save(self.global_step)
        tf.io.gfile.rmtree(scratch)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Held while training: one writer of checkpoints per work_dir (see `lock.py`)."""
        if not self.is_chief:
            yield  # a non-chief worker writes no checkpoint
            return
        if self._lock is None:
            self._lock = lock.WorkDirLock(self.config.work_dir)
        self._lock.acquire()
        try:
            yield
        finally:
            self._lock.release()

    def heartbeat(self) -> None:
        if self._lock is not None:
            self._lock.heartbeat()

    def summary_writer(self, kind: str) -> Any:
        """One writer per kind (``'train'``, ``'eval'``): each opens a new event file."""
        if kind not in self._writers:
            self._writers[kind] = (tf.summary.create_file_writer(
                f"{self.config.work_dir}/{kind}") if self.is_chief
                else tf.summary.create_noop_writer())
        return self._writers[kind]

    def close(self) -> None:
        """Flushes and closes the summary writers."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
