"""The JAX engine's roles, as `fenwicks.train.engines` asks for them."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import keras

from fenwicks import accel
from fenwicks.train.inputs import unpack
from fenwicks.train.jax import lr_sweep, mesh, processes, tpu_steps
from fenwicks.train.jax.evaluation import JaxEvaluator
from fenwicks.train.jax.inputs import JaxInputManager
from fenwicks.train.jax.state import JaxRunState
from fenwicks.train.jax.trainer import JaxTrainer

# 'auto' precision by the device JAX computes on: bfloat16 on a TPU (its native format),
# float16 with loss scaling on a GPU, float32 on the CPU (no faster in 16 bits there).
_PRECISION = {"tpu": "bfloat16", "gpu": "float16", "cpu": "float32"}


class _Profiler:
    """JAX's profiler: its trace shows the jitted steps on each device."""

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

    @staticmethod
    def num_replicas(acc: accel.Accelerator) -> int:
        return mesh.num_replicas()

    @staticmethod
    def precision(acc: accel.Accelerator) -> str:
        return _PRECISION.get(jax.default_backend(), "float32")

    @staticmethod
    def trainer(strategy: Any, config: Any, state: JaxRunState, watcher: Any) -> JaxTrainer:
        """The loop looks for a stop between blocks, on the host: the watcher's
        `HostFlag`, a Python bool, not its TensorFlow variable (an eager op a read)."""
        return JaxTrainer(state, config.train_batch_size, config.steps_per_loop,
                          processes.agreed_stop(watcher.host_flag))

    @staticmethod
    def check_labels(spec: Any, acc: accel.Accelerator, dataset: Any) -> None:
        """Traces the model and the loss on a few examples: a label that does not fit
        the model is a ValueError now, before anything compiles. Shapes only
        (`jax.eval_shape`): Keras's JAX losses check shapes, not values, and an eager run
        would compile every op of the model separately (seconds per model on a CPU)."""
        def loss(features: Any, labels: Any) -> Any:
            outputs = spec.model(features, training=False)
            outputs = jax.tree.map(lambda t: keras.ops.cast(t, "float32")
                                   if jnp.issubdtype(t.dtype, jnp.floating) else t, outputs)
            return spec.loss_fn(labels, outputs)

        for element in dataset.take(1).as_numpy_iterator():
            features, labels, _ = unpack(jax.tree.map(lambda x: x[:64], element))
            jax.eval_shape(loss, features, labels)

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
