"""The reference engine's roles, as `fenwicks.train.engines` asks for them.

Registered in `fenwicks._engine.REGISTRY` as ``'reference'``, with no Keras
backend of its own: it runs under whichever backend Keras has, chosen by name with
``engines.use('reference')``. `REPLICAS` sets how many replicas it splits each global
batch over (as one process of R devices would: R per-replica batches a step), 1 unless
a test sets it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fenwicks import accel
from fenwicks.train.model_func import ModelSpec
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.reference.evaluation import ReferenceEvaluator
from fenwicks.train.reference.inputs import ReferenceInputManager
from fenwicks.train.reference.state import ReferenceRunState
from fenwicks.train.reference.trainer import ReferenceTrainer

_NOT_HERE = ("the reference engine (fenwicks.train.reference, for the tests of the shared "
             "training code) does not {what}; run it on the tf or jax engine")


class _Profiler:
    """No device to trace: the profile window's start and stop are recorded only."""

    errors = ()  # recording cannot fail

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []

    def start(self, logdir: str) -> None:
        self.calls.append(("start", logdir))

    def stop(self) -> None:
        self.calls.append(("stop", None))


class ReferenceEngine:
    """A linear model trained by NumPy SGD steps, its state dicts of host arrays."""

    name = "reference"
    RunState = ReferenceRunState
    InputManager = ReferenceInputManager
    Evaluator = ReferenceEvaluator
    profiler = _Profiler()
    REPLICAS = 1
    # What `loss` raises for labels that do not fit the outputs.
    label_errors = (ValueError,)

    @classmethod
    def num_replicas(cls, acc: accel.Accelerator) -> int:
        return cls.REPLICAS

    @staticmethod
    def num_processes(acc: accel.Accelerator) -> int:
        return 1  # one process feeds every replica

    @staticmethod
    def precision(acc: accel.Accelerator) -> str:
        return "float32"  # NumPy steps in float32 on any device

    @staticmethod
    def jit_compile_refusal(acc: accel.Accelerator) -> str | None:
        return None  # nothing is compiled: jit_compile changes nothing here

    @staticmethod
    def trainer(config: EstimatorConfig, state: ReferenceRunState,
                watcher: Any) -> ReferenceTrainer:
        """Looks for a stop before each step, on the host (the watcher's `HostFlag`)."""
        return ReferenceTrainer(state, config.train_batch_size, watcher.flag)

    @staticmethod
    def build(model_func: Callable, params: dict, precision: str,
              features_spec: Any) -> Any:
        raise NotImplementedError(_NOT_HERE.format(what="run find_lr"))

    @staticmethod
    def model_outputs(spec: ModelSpec, features: Any) -> Any:
        """The linear model's outputs for `features` (NumPy)."""
        from fenwicks.train.reference import model as linear

        return linear.forward(linear.params_of(spec.model), features)

    @staticmethod
    def loss(spec: ModelSpec, labels: Any, outputs: Any) -> None:
        """The spec's loss on `outputs` (NumPy): a label that does not fit the model is
        a ValueError before training."""
        import keras
        import numpy as np

        if np.size(labels) != outputs.size:
            raise ValueError(
                f"the labels have shape {list(np.shape(labels))} and the model's "
                f"outputs {list(outputs.shape)}: a regression label has one value per "
                "output; check the labels or the Dense layer's units")
        keras.ops.convert_to_numpy(spec.loss_fn(labels, outputs))

    @staticmethod
    def export_saved_model(spec: ModelSpec, features_spec: Any, export_dir: str) -> str:
        raise NotImplementedError(_NOT_HERE.format(what="export SavedModels"))

    @staticmethod
    def sweep_batches(input_fn: Callable, params: Callable[[Any], dict],
                      num_steps: int) -> Any:
        raise NotImplementedError(_NOT_HERE.format(what="run find_lr"))

    @staticmethod
    def sweep_trainer(spec: ModelSpec, optimizer: Any, batch_size: int) -> Any:
        raise NotImplementedError(_NOT_HERE.format(what="run find_lr"))

    @staticmethod
    def build_for_tpu_check(model_func: Callable, params: dict, precision: str,
                            features_spec: Any) -> Any:
        raise NotImplementedError(_NOT_HERE.format(what="lower steps for a TPU"))

    @staticmethod
    def check_tpu_step(mode: str, spec: ModelSpec, optimizer: Any, batch: Any,
                       global_batch: int, replicas: int) -> None:
        raise NotImplementedError(_NOT_HERE.format(what="lower steps for a TPU"))

    @staticmethod
    def tf1_model_fn_refusal() -> str | None:
        return ("fw.train.TPUEstimator runs a TF1-style model_fn, which needs TensorFlow; "
                "this estimator runs on the reference engine (a linear model in NumPy, for "
                "tests): make it outside engines.use('reference')")


ENGINE = ReferenceEngine
