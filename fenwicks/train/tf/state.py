"""The run's state on the TensorFlow engine: model, optimizer and step counters as
``tf.Variable``s under the strategy, gathered to host arrays for the run format and
scattered back (`fenwicks.train.run_format`, shared with the JAX engine).

TensorFlow checkpoints (``<work_dir>/ckpt-<step>``, `checkpoints.py` through
`legacy_reader.LegacyReader`) are only read: a work_dir written before the run format is
restored from them, and its next checkpoint is in the run format.

Everything else (the checkpointer, the work_dir lock, summary writers, the reload after
a NaN, following a work_dir that changed, waiting for writes) is
`fenwicks.train.run_state.RunState`'s.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from fenwicks import accel
from fenwicks import io as fw_io
from fenwicks.train import building, run_format
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.run_state import RunState
from fenwicks.train.tf import checkpoints, devices, legacy_reader
from fenwicks.train.tf import weights as tf_weights


class TFRunState(RunState):
    """`RunState` with ``tf.Variable`` counters under the strategy.

    Examples:
        >>> from fenwicks.train.options import EstimatorConfig
        >>> acc = fw.accel.current()
        >>> config = EstimatorConfig(steps_per_epoch=1, work_dir='run', train_batch_size=4,
        ...                          eval_batch_size=4, predict_batch_size=4, steps_per_loop=1,
        ...                          precision='float32', num_replicas=acc.num_replicas)
        >>> model_func = fw.train.get_clf_model_func(
        ...     lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]),
        ...     fw.train.sgd_optimizer(0.1))
        >>> state = TFRunState(model_func, config, acc)
        >>> state.build(tf.TensorSpec([None, 3], tf.float32), {})   # 'run' holds nothing yet
        >>> state.global_step, state.latest_checkpoint
        (0, None)
        >>> state.checkpointer.save_and_wait(0)   # as the controller's SavePolicy saves
        >>> state.close()
        >>> again = TFRunState(model_func, config, acc)
        >>> again.build(tf.TensorSpec([None, 3], tf.float32), {})   # restores the latest
        >>> again.latest_checkpoint
        'run/checkpoints/0'
        >>> again.close()
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
        checkpointer = self.make_checkpointer(
            run_format.variable_groups(spec.model, self.optimizer), writes=self.is_chief,
            legacy=self._legacy_reader(spec))
        # The run format; else this engine's previous format, or the other engine's.
        restored = checkpointer.restore()
        if restored is None and self.config.warm_start_from:
            source = self.config.warm_start_from
            self.warm_start_report = (self.warm_start_any(spec.model, source)
                                      or checkpoints.warm_start(spec.model, source))
        self._spec, self._checkpointer = spec, checkpointer

    # ---------------------------------------------------------------- the run format

    def snapshot(self) -> dict[str, list[np.ndarray]]:
        """Host copies of every variable (a mirrored variable's first replica)."""
        return {group: [np.array(variable.value.numpy(), copy=True)
                        for variable in variables]
                for group, variables in self._groups.items()}

    def tf1_names(self) -> dict[str, list[str]] | None:
        """Each model variable's TF1 name (``tf.compat.v1.get_variable``'s, a Keras
        layer's under ``tf.compat.v1.variable_scope``; else its Keras path, TF1's name
        for an unscoped layer), if a TPUEstimator model_fn made the model; None for a
        Keras model_func's, whose variables have Keras paths only."""
        groups = {group: self._groups.get(group, []) for group in ("trainable",
                                                                   "non_trainable")}
        if not any(getattr(v, "fenwicks_v1_name", None) for vs in groups.values()
                   for v in vs):
            return None
        return {group: [getattr(v, "fenwicks_v1_name", None) or v.path for v in vs]
                for group, vs in groups.items()}

    def to_host(self, frozen: dict[str, list[np.ndarray]]) -> dict[str, list[np.ndarray]]:
        return frozen

    def scatter(self, tree: run_format.StateTree) -> None:
        """Assigns host arrays to the variables (every replica of a mirrored one)."""
        for group, variables in self._groups.items():
            for variable, array in zip(variables, tree[group], strict=True):
                variable.assign(np.asarray(array).astype(variable.dtype))

    def set_counters(self, step: int, input_steps: int) -> None:
        self.step_counter.assign(step)
        self.input_steps.assign(input_steps)

    def _legacy_reader(self, spec: Any) -> legacy_reader.LegacyReader | None:
        """A reader of TensorFlow checkpoints (``ckpt-<step>``) if work_dir holds some
        (written before the run format); they are restored, never written."""
        if tf_weights.latest(self.config.work_dir) is None:  # by name too
            return None
        root = checkpoints.make_checkpoint(spec.model, self.optimizer, self.step_counter,
                                           self.input_steps)
        # A TPU reached over the network cannot write local files: its probe goes to gs://.
        return legacy_reader.LegacyReader(
            root, self.config.work_dir,
            probe_dir=self.config.work_dir + "/.probe" if self._acc.is_remote else None)

    def remove_partial_saves(self, work_dir: str) -> None:
        super().remove_partial_saves(work_dir)
        checkpoints.remove_partial_saves(work_dir)  # a TensorFlow save's, before the run format
