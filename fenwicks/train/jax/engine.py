"""The JAX engine's roles, as `fenwicks.train.engines` asks for them."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import keras

from fenwicks import accel
from fenwicks.train import building
from fenwicks.train.jax import lr_sweep, mesh, processes, tpu_steps
from fenwicks.train.jax.evaluation import JaxEvaluator
from fenwicks.train.jax.inputs import JaxInputManager
from fenwicks.train.jax.state import JaxRunState
from fenwicks.train.jax.trainer import JaxTrainer
from fenwicks.train.model_func import ModelSpec
from fenwicks.train.options import EstimatorConfig


class _Profiler:
    """JAX's profiler: its trace shows the jitted steps on each device."""

    errors = (RuntimeError,)  # e.g. a trace already running

    @staticmethod
    def start(logdir: str) -> None:
        jax.profiler.start_trace(logdir)

    @staticmethod
    def stop() -> None:
        jax.profiler.stop_trace()


class JaxEngine:
    """Keras 3 on JAX: ``jax.jit`` steps over a mesh of every device, orbax checkpoints."""

    name = "jax"
    RunState = JaxRunState
    InputManager = JaxInputManager
    Evaluator = JaxEvaluator
    profiler = _Profiler()
    sweep_batches = staticmethod(lr_sweep.sweep_batches)
    sweep_trainer = staticmethod(lr_sweep.sweep_trainer)
    build_for_tpu_check = staticmethod(tpu_steps.build_model)
    check_tpu_step = staticmethod(tpu_steps.check_step)

    # What the loss raises, traced, for labels that do not fit the model's outputs.
    label_errors = (ValueError,)

    @staticmethod
    def num_replicas(acc: accel.Accelerator) -> int:
        """The mesh's devices, over every process."""
        return mesh.num_replicas()

    @staticmethod
    def num_processes(acc: accel.Accelerator) -> int:
        """The processes of the run (``jax.distributed``)."""
        return mesh.num_processes()

    @staticmethod
    def precision(acc: accel.Accelerator) -> str:
        return acc.precision

    @staticmethod
    def jit_compile_refusal(acc: accel.Accelerator) -> str | None:
        return None  # every step is a jax.jit over the mesh, on any device

    @staticmethod
    def trainer(config: EstimatorConfig, state: JaxRunState, watcher: Any) -> JaxTrainer:
        """The loop looks for a stop between blocks, on the host: the watcher's
        `HostFlag`, a Python bool, agreed over the processes."""
        return JaxTrainer(state, config.train_batch_size, config.steps_per_loop,
                          processes.agreed_stop(watcher.flag))

    @staticmethod
    def build(model_func: Any, params: dict, precision: str,
              features_spec: Any) -> tuple[ModelSpec, Any]:
        """A model and optimizer (JAX places their arrays when a step first runs)."""
        with building.precision_policy(precision):
            return building.build_model(model_func, params, precision, features_spec)

    @staticmethod
    def model_outputs(spec: ModelSpec, features: Any) -> Any:
        """The shapes and dtypes of the model's outputs (``jax.eval_shape``), float32 as
        the steps compute losses: Keras's JAX losses check shapes, not values, and an
        eager run would compile every op of the model separately (seconds per model)."""
        def outputs(features: Any) -> Any:
            return jax.tree.map(lambda t: keras.ops.cast(t, "float32")
                                if jnp.issubdtype(t.dtype, jnp.floating) else t,
                                spec.model(features, training=False))

        return jax.eval_shape(outputs, features)

    @staticmethod
    def loss(spec: ModelSpec, labels: Any, outputs: Any) -> None:
        """The loss traced on `outputs`' shapes: a label that does not fit is a
        ValueError now, before anything compiles."""
        jax.eval_shape(spec.loss_fn, labels, outputs)

    @staticmethod
    def export_saved_model(spec: Any, features_spec: Any, export_dir: str) -> str:
        from fenwicks.train.jax import export

        return export.export_saved_model(spec, features_spec, export_dir)

    @staticmethod
    def tf1_model_fn_refusal() -> str | None:
        return (
            "fw.train.TPUEstimator runs a TF1-style model_fn, which needs TensorFlow and "
            "cannot run inside JAX, and this process runs on the jax engine: start it with "
            "FENWICKS_ENGINE=tf (on a TPU image whose TensorFlow cannot reach the TPU, "
            "such as Kaggle's, it then trains on the host CPU), or write the model as a "
            "Keras model_func (fw.train.get_clf_model_func(build_nn, opt_func) with "
            "fw.train.get_tpu_estimator), which runs on both engines: tutorials/PORTING.md, "
            "'TPUEstimator programs on the jax engine'")


ENGINE = JaxEngine
