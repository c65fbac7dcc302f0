"""The engine seam: which engine runs an estimator, and the roles each engine supplies.

The estimator, its controller and actions, the callbacks, `History`, TensorBoard, the
work_dir lock, preemption and Ctrl-C are engine-neutral. An engine supplies four roles:

==================  ==============================  ====================================
role                TensorFlow engine               JAX engine (`fenwicks.train.jax`)
==================  ==============================  ====================================
state               `state.RunState`                `jax.state.JaxRunState`
input manager       `inputs.InputManager`           `jax.inputs.JaxInputManager`
trainer             `trainer.Trainer`               `jax.trainer.JaxTrainer`
evaluator           `evaluation.Evaluator`          `jax.evaluation.JaxEvaluator`
==================  ==============================  ====================================

plus the checks of labels against the model, the replica count and export. The engine
is Keras's backend: ``keras.backend.backend() == 'jax'`` means the JAX engine (Keras
fixes its backend when first imported: ``KERAS_BACKEND=jax``, which `fw.accel`'s engine
selection sets).

Example:
    >>> engine = fenwicks.train.engines.current()
    >>> engine.name
    'tf'
"""

from __future__ import annotations

from typing import Any

import keras

from fenwicks import accel
from fenwicks.train import building
from fenwicks.train.tf import export
from fenwicks.train.tf.evaluation import Evaluator
from fenwicks.train.tf.inputs import InputManager
from fenwicks.train.tf.state import RunState
from fenwicks.train.tf.trainer import Trainer


class TensorFlowEngine:
    """Today's engine: ``tf.distribute`` strategies, ``tf.function`` loops, TF checkpoints."""

    name = "tf"
    RunState = RunState
    InputManager = InputManager
    Evaluator = Evaluator

    @staticmethod
    def num_replicas(acc: accel.Accelerator) -> int:
        return acc.num_replicas

    @staticmethod
    def precision(acc: accel.Accelerator) -> str:
        return acc.precision

    @staticmethod
    def trainer(strategy: Any, config: Any, state: RunState, watcher: Any) -> Trainer:
        """The loop reads the watcher's variable inside the compiled function."""
        return Trainer(strategy, state.spec, state.optimizer, state.step_counter,
                       config.train_batch_size, config.jit_compile, watcher.flag,
                       state.input_steps)

    @staticmethod
    def check_labels(spec: Any, acc: accel.Accelerator, dataset: Any) -> None:
        building.check_labels(spec, acc.strategy, dataset)

    @staticmethod
    def export_saved_model(spec: Any, features_spec: Any, export_dir: str) -> str:
        return export.export_saved_model(spec, features_spec, export_dir)


def is_jax() -> bool:
    """Whether Keras runs on JAX (the ground truth of which engine runs)."""
    return keras.backend.backend() == "jax"


def current() -> Any:
    """The engine for estimators made now: `JaxEngine` on Keras's JAX backend, else
    `TensorFlowEngine`."""
    if is_jax():
        from fenwicks.train.jax.engine import JaxEngine

        return JaxEngine
    return TensorFlowEngine
