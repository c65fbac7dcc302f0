"""`find_lr` on the JAX engine: each process's pipeline feeding its devices' share of the
global batches, as training reads it (`inputs.JaxInputManager.train_iterator`), and the
engine's trainer over the model's arrays (no checkpoints, no work_dir)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import tensorflow as tf

from fenwicks.train import inputs
from fenwicks.train.jax import mesh
from fenwicks.train.jax.inputs import TrainBatches
from fenwicks.train.jax.state import assign_values, owned_values
from fenwicks.train.jax.trainer import JaxTrainer
from fenwicks.train.model_func import ModelSpec


def sweep_batches(input_fn: Callable, params: Callable[[Any], dict],
                  num_steps: int) -> tuple[Any, Callable[[], None], Any]:
    """This process's share of `input_fn`'s global batches (one per-replica batch per
    local device a step, ``params['input_context']`` naming the share), their release,
    and the per-replica element spec."""
    local = mesh.local_replicas()
    found = params(tf.distribute.InputContext(mesh.num_processes(), mesh.process_index(),
                                              mesh.num_replicas()))
    dataset = inputs.call_input_fn(input_fn, found, "training")
    inputs.check_train_spec(dataset.element_spec, found["batch_size"])
    # Only what the sweep can use: nothing past it is read or prefetched.
    dataset = dataset.take(num_steps * local)
    batches = TrainBatches(dataset, local)
    return batches, batches.release, dataset.element_spec


class _SweepState:
    """The few parts of `JaxRunState` the trainer uses: the model's and optimizer's arrays
    on the mesh, and a step count; no checkpoints, no work_dir."""

    def __init__(self, spec: ModelSpec, optimizer: Any) -> None:
        self.spec, self.optimizer = spec, optimizer
        self.step = self.input_steps_taken = 0
        model = spec.model
        self._lists = (list(model.trainable_variables), list(model.non_trainable_variables),
                       list(optimizer.variables))
        for group in self._lists:  # replicated on every device, as the estimator's
            for variable in group:
                variable.assign(jax.device_put(variable.value, mesh.replicated()))

    @property
    def global_step(self) -> int:
        return self.step

    def values(self) -> tuple[list, list, list]:
        return owned_values(self._lists)

    def set_values(self, values: tuple[list, list, list]) -> None:
        assign_values(self._lists, values)


def sweep_trainer(spec: ModelSpec, optimizer: Any, batch_size: int) -> JaxTrainer:
    """The estimator's trainer, one step per call: the host decides after each step
    whether the curve has diverged."""
    return JaxTrainer(_SweepState(spec, optimizer), batch_size, steps_per_loop=1)
