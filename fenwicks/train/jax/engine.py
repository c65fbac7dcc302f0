"""The JAX engine's roles, as `fenwicks.train.engines` asks for them."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import keras

from fenwicks import accel
from fenwicks.train.jax import mesh, processes
from fenwicks.train.jax.evaluation import JaxEvaluator
from fenwicks.train.jax.inputs import JaxInputManager
from fenwicks.train.jax.state import JaxRunState
from fenwicks.train.jax.trainer import JaxTrainer

# 'auto' precision by the device JAX computes on: bfloat16 on a TPU (its native format),
# float16 with loss scaling on a GPU, float32 on the CPU (no faster in 16 bits there).
_PRECISION = {"tpu": "bfloat16", "gpu": "float16", "cpu": "float32"}


class JaxEngine:
    """Keras 3 on JAX: ``jax.jit`` steps over a mesh of every device, orbax checkpoints."""

    name = "jax"
    RunState = JaxRunState
    InputManager = JaxInputManager
    Evaluator = JaxEvaluator

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
        from fenwicks.train.tf.inputs import unpack

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
