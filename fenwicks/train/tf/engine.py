"""The TensorFlow engine's roles, as `fenwicks.train.engines.Engine` asks for them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from fenwicks import accel
from fenwicks.train import building, inputs
from fenwicks.train.model_func import ModelSpec
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.tf import export, tpu_steps
from fenwicks.train.tf.evaluation import TFEvaluator
from fenwicks.train.tf.inputs import TFInputManager
from fenwicks.train.tf.state import TFRunState
from fenwicks.train.tf.trainer import Trainer


class _Profiler:
    """TensorFlow's profiler: its trace shows the steps and the tf.data pipeline."""

    @staticmethod
    def start(logdir: str) -> None:
        tf.profiler.experimental.start(logdir)

    @staticmethod
    def stop() -> None:
        tf.profiler.experimental.stop()


class TensorFlowEngine:
    """Keras 3 on TensorFlow: ``tf.distribute`` strategies, ``tf.function`` loops of
    ``steps_per_loop`` steps, TensorFlow checkpoints."""

    name = "tf"
    RunState = TFRunState
    InputManager = TFInputManager
    Evaluator = TFEvaluator
    profiler = _Profiler()

    @staticmethod
    def num_replicas(acc: accel.Accelerator) -> int:
        return acc.num_replicas

    @staticmethod
    def precision(acc: accel.Accelerator) -> str:
        return acc.precision

    @staticmethod
    def trainer(strategy: Any, config: EstimatorConfig, state: TFRunState,
                watcher: Any) -> Trainer:
        """The loop reads the watcher's variable inside the compiled function."""
        return Trainer(strategy, state.spec, state.optimizer, state.step_counter,
                       config.train_batch_size, config.jit_compile, watcher.flag,
                       state.input_steps)

    @staticmethod
    def check_labels(spec: ModelSpec, acc: accel.Accelerator, dataset: Any) -> None:
        building.check_labels(spec, acc.strategy, dataset)

    @staticmethod
    def export_saved_model(spec: ModelSpec, features_spec: Any, export_dir: str) -> str:
        return export.export_saved_model(spec, features_spec, export_dir)

    @staticmethod
    def sweep_batches(acc: accel.Accelerator, input_fn: Callable,
                      params: Callable[[Any], dict],
                      num_steps: int) -> tuple[Any, Callable[[], None], Any]:
        """The distributed iterator over `input_fn` (every replica its own batch), its
        release (`inputs.discard`: the destructor can wait for seconds) and the spec."""
        first = params(None)
        spec = inputs.call_input_fn(input_fn, first, "training").element_spec
        inputs.check_train_spec(spec, first["batch_size"])

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            dataset = inputs.call_input_fn(input_fn, params(context), "training")
            # Only what the sweep can use: nothing past it is read or prefetched.
            return dataset.take(num_steps * acc.num_replicas // context.num_input_pipelines)

        holder = [iter(acc.strategy.distribute_datasets_from_function(dataset_fn))]
        return holder[0], lambda: inputs.discard(holder), spec

    @staticmethod
    def sweep_trainer(acc: accel.Accelerator, spec: ModelSpec, optimizer: Any,
                      batch_size: int) -> Trainer:
        with acc.strategy.scope():
            counter = tf.Variable(0, dtype=tf.int64, name="find_lr_step")
        # The step count is a tensor in the TensorFlow loop: no retrace.
        return Trainer(acc.strategy, spec, optimizer, counter, batch_size)

    @staticmethod
    def build_for_tpu_check(model_func: Callable, params: dict, precision: str,
                            features_spec: Any) -> tuple[ModelSpec, Any]:
        """A fresh model for `check_tpu_ready`, on the host CPU (not a GPU's memory)."""
        with tf.device("/cpu:0"), building.precision_policy(precision):
            return building.build_model(model_func, params, precision, features_spec)

    check_tpu_step = staticmethod(tpu_steps.check_step)

    @staticmethod
    def tf1_model_fn_refusal() -> str | None:
        return None  # the TF1 graph runs inside a Keras model here (`_model_fn`)


ENGINE = TensorFlowEngine
