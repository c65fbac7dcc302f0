"""The TensorFlow engine's roles, as `fenwicks.train.engines.Engine` asks for them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from fenwicks import accel
from fenwicks.train import building, inputs
from fenwicks.train.model_func import ModelSpec
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.tf import devices, export, tpu_steps
from fenwicks.train.tf.evaluation import TFEvaluator
from fenwicks.train.tf.inputs import TFInputManager
from fenwicks.train.tf.state import TFRunState
from fenwicks.train.tf.trainer import Trainer


class _Profiler:
    """TensorFlow's profiler: its trace shows the steps and the tf.data pipeline."""

    errors = (tf.errors.OpError, RuntimeError)  # e.g. another profiler already running

    @staticmethod
    def start(logdir: str) -> None:
        tf.profiler.experimental.start(logdir)

    @staticmethod
    def stop() -> None:
        tf.profiler.experimental.stop()


class TensorFlowEngine:
    """Keras 3 on TensorFlow: ``tf.distribute`` strategies, ``tf.function`` loops of
    ``steps_per_loop`` steps, TensorFlow checkpoints. The strategy is this engine's
    (`devices.strategy`, made when the devices were detected); nothing outside this
    folder holds it."""

    name = "tf"
    RunState = TFRunState
    InputManager = TFInputManager
    Evaluator = TFEvaluator
    profiler = _Profiler()
    # What the loss raises for labels that do not fit, run eagerly.
    label_errors = (tf.errors.InvalidArgumentError, ValueError)

    @staticmethod
    def strategy() -> tf.distribute.Strategy:
        """The ``tf.distribute`` strategy every model and loop of this engine runs under."""
        return devices.strategy()

    @staticmethod
    def num_replicas(acc: accel.Accelerator) -> int:
        """The strategy's replicas in sync (over every worker)."""
        return int(devices.strategy().num_replicas_in_sync)

    @staticmethod
    def num_processes(acc: accel.Accelerator) -> int:
        """The workers of the strategy's cluster (``TF_CONFIG``, a TPU pod's hosts)."""
        return acc.num_workers

    @staticmethod
    def precision(acc: accel.Accelerator) -> str:
        return acc.precision

    @staticmethod
    def jit_compile_refusal(acc: accel.Accelerator) -> str | None:
        if acc.kind == "cpu" and acc.num_replicas > 1:
            # XLA cannot reach variables on the other logical CPU devices ("Trying to
            # access resource ... located in device CPU:1 from device CPU:0").
            return (f"on {acc.num_replicas} logical CPU replicas (XLA does not support "
                    "variables spread over logical CPU devices)")
        return None

    @staticmethod
    def trainer(config: EstimatorConfig, state: TFRunState, watcher: Any) -> Trainer:
        """The loop reads a variable that follows the watcher's flag inside the compiled
        function, before each step."""
        with tf.device("CPU:0"):
            stop = tf.Variable(False, trainable=False, name="preempted")
        watcher.follow(stop)
        return Trainer(devices.strategy(), state.spec, state.optimizer, state.step_counter,
                       config.train_batch_size, config.jit_compile, stop,
                       state.input_steps)

    @staticmethod
    def build(model_func: Callable, params: dict, precision: str,
              features_spec: Any) -> tuple[ModelSpec, Any]:
        """A model and optimizer whose variables live under the strategy."""
        with devices.strategy().scope(), building.precision_policy(precision):
            return building.build_model(model_func, params, precision, features_spec)

    @staticmethod
    def model_outputs(spec: ModelSpec, features: Any) -> Any:
        """The model's outputs for a few examples, run eagerly under the strategy, in
        float32 (as the loops compute losses)."""
        with devices.strategy().scope(), building.training_randomness_kept(spec.model):
            return tf.nest.map_structure(
                lambda t: tf.cast(t, tf.float32) if t.dtype.is_floating else t,
                spec.model(features, training=False))

    @staticmethod
    def loss(spec: ModelSpec, labels: Any, outputs: Any) -> None:
        """The loss, eagerly: the built-in losses raise for out-of-range labels here
        (compiled, they can only return NaN)."""
        with devices.strategy().scope():
            spec.loss_fn(labels, outputs)

    @staticmethod
    def export_saved_model(spec: ModelSpec, features_spec: Any, export_dir: str) -> str:
        return export.export_saved_model(spec, features_spec, export_dir)

    @staticmethod
    def sweep_batches(input_fn: Callable, params: Callable[[Any], dict],
                      num_steps: int) -> tuple[Any, Callable[[], None], Any]:
        """The distributed iterator over `input_fn` (every replica its own batch), its
        release (`inputs.discard`: the destructor can wait for seconds) and the spec."""
        strategy = devices.strategy()
        first = params(None)
        spec = inputs.call_input_fn(input_fn, first, "training").element_spec
        inputs.check_train_spec(spec, first["batch_size"])

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            dataset = inputs.call_input_fn(input_fn, params(context), "training")
            # Only what the sweep can use: nothing past it is read or prefetched.
            return dataset.take(num_steps * strategy.num_replicas_in_sync
                                // context.num_input_pipelines)

        holder = [iter(strategy.distribute_datasets_from_function(dataset_fn))]
        return holder[0], lambda: inputs.discard(holder), spec

    @staticmethod
    def sweep_trainer(spec: ModelSpec, optimizer: Any, batch_size: int) -> Trainer:
        strategy = devices.strategy()
        with strategy.scope():
            counter = tf.Variable(0, dtype=tf.int64, name="find_lr_step")
        # The step count is a tensor in the TensorFlow loop: no retrace.
        return Trainer(strategy, spec, optimizer, counter, batch_size)

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
