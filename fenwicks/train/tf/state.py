"""The run's state on the TensorFlow engine: model, optimizer and step counters as
``tf.Variable``s under the strategy, and their TensorFlow checkpoints (`checkpoints.py`,
through `checkpointer.create`: sync, async or a non-chief worker's).

Everything else (the work_dir lock, summary writers, the reload after a NaN, following a
work_dir that changed, waiting for writes) is `fenwicks.train.run_state.RunState`'s.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from fenwicks import accel
from fenwicks import io as fw_io
from fenwicks.train import building, cross_engine
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.run_state import RunState
from fenwicks.train.tf import checkpointer as checkpointer_lib
from fenwicks.train.tf import checkpoints, devices


class TFRunState(RunState):
    """`RunState` with ``tf.Variable`` counters and TensorFlow checkpoints.

    Examples:
        >>> state = TFRunState(model_func, config, fw.accel.current())
        >>> state.build(features_spec, params)   # restores work_dir's latest checkpoint
        >>> state.latest_checkpoint
        '/content/work/ckpt-1000'
    """

    engine = "tf"

    def __init__(self, model_func: building.ModelFunc, config: EstimatorConfig,
                 accelerator: accel.Accelerator) -> None:
        super().__init__(model_func, config, accelerator)
        self._strategy = devices.strategy()

    @property
    def global_step(self) -> int:
        """Training steps taken so far, including those of runs resumed from work_dir."""
        return int(self.step_counter.numpy()) if self.built else 0

    @property
    def checkpoint_root(self) -> tf.train.Checkpoint:
        """What a checkpoint of this run holds (`checkpoints.make_checkpoint`)."""
        self.spec  # noqa: B018 - raises the "built on first use" error
        return self._root

    @property
    def input_position(self) -> int:
        """Training steps' worth of input read so far: where a new input iterator starts."""
        return int(self.input_steps.numpy()) if self.built else 0

    @property
    def is_chief(self) -> bool:
        """False on the non-chief workers of a multi-worker run: they write no files."""
        return bool(self._strategy.extended.should_checkpoint)

    def build(self, features_spec: Any, params: dict) -> None:
        """Creates model, optimizer and step counters; restores or warm-starts them."""
        if self.built:
            return
        fw_io.check_bucket(self.config.work_dir)  # credentials, bucket: before any gs:// call
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
        checkpointer = self._create_checkpointer()
        restored = checkpointer.restore()
        if restored is None:  # the JAX engine's checkpoint, for evaluate and predict
            saved = cross_engine.restore_for_reading(spec.model, self.config.work_dir, "tf")
            if saved is not None:
                self.step_counter.assign(saved.step)
                restored = self.other_engines_checkpoint = saved.checkpoint
        if restored is None and self.config.warm_start_from:
            source = self.config.warm_start_from
            self.warm_start_report = (cross_engine.warm_start(spec.model, source, "tf")
                                      or checkpoints.warm_start(spec.model, source))
        self._spec, self._checkpointer = spec, checkpointer

    def _create_checkpointer(self) -> checkpointer_lib.SyncCheckpointer:
        # A TPU reached over the network cannot write local files: its probe goes to gs://.
        return checkpointer_lib.create(
            self._root, self.config.work_dir, keep=self.config.keep_checkpoints,
            asynchronous=self.config.async_checkpoints, workers=self.config.num_processes,
            worker_id=None if self.is_chief else self._strategy.cluster_resolver.task_id,
            probe_dir=self.config.work_dir + "/.probe" if self._acc.is_remote else None)

    def remove_partial_saves(self, work_dir: str) -> None:
        checkpoints.remove_partial_saves(work_dir)
