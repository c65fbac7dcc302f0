"""The run's state on the JAX engine: model, optimizer and counters, their arrays placed
on the mesh, gathered to host arrays for the run format and scattered back onto the mesh
(`fenwicks.train.run_format`, shared with the TensorFlow engine).

The Keras variables hold the state between calls: a compiled loop takes their arrays
(`values`), and the arrays it returns are put back (`set_values`), so callbacks, export
and ``model.get_weights()`` see the current weights, as on the TensorFlow engine. The
counters (``global_step`` and the input position) live on the host: the trainer advances
them by the steps each loop ran.

The JAX engine's previous format (``<work_dir>/orbax/<step>``, `checkpoints.py`) is
only read: a work_dir written before the run format is restored from it, and its next
checkpoint is in the run format.

Everything else (the checkpointer, the work_dir lock, summary writers, the reload after
a NaN, following a work_dir that changed, waiting for writes) is `RunState`'s, shared
with the TensorFlow engine.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np

from fenwicks import io as fw_io
from fenwicks.train import building, run_format
from fenwicks.train.jax import checkpoints, mesh, processes, tpu_steps
from fenwicks.train.jax import weights as jax_weights
from fenwicks.train.run_state import HostCountedRunState

logger = logging.getLogger("fenwicks")


def owned_values(groups: tuple[list, list, list]) -> tuple[list, list, list]:
    """The arrays of `groups`' variables (trainable, non-trainable, optimizer), each once.

    A compiled block takes ownership of (donates) them, and two variables may hold the
    same array (an initial value that Keras or JAX shared): the second gets a copy.
    """
    seen: set[int] = set()

    def own(array: Any) -> Any:
        if id(array) in seen:
            return jnp.copy(array)
        seen.add(id(array))
        return array

    return tuple([own(v.value) for v in group] for group in groups)


def assign_values(groups: tuple[list, list, list], values: tuple[list, list, list]) -> None:
    """Puts a compiled block's arrays back into `groups`' variables."""
    for group, arrays in zip(groups, values, strict=True):
        for variable, array in zip(group, arrays, strict=True):
            variable.assign(array)


class JaxRunState(HostCountedRunState):
    """`RunState` with the variables on a JAX mesh.

    Examples:
        >>> from fenwicks.train.options import EstimatorConfig
        >>> acc = fw.accel.current()   # the JAX engine's devices
        >>> config = EstimatorConfig(steps_per_epoch=1, work_dir='run', train_batch_size=4,
        ...                          eval_batch_size=4, predict_batch_size=4, steps_per_loop=1,
        ...                          precision='float32', num_replicas=acc.num_replicas)
        >>> model_func = fw.train.get_clf_model_func(
        ...     lambda: keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]),
        ...     fw.train.sgd_optimizer(0.1))
        >>> state = JaxRunState(model_func, config, acc)
        >>> state.build(tf.TensorSpec([None, 2], tf.float32), {})   # 'run' holds nothing yet
        >>> state.global_step, state.latest_checkpoint
        (0, None)
        >>> state.checkpointer.save_and_wait(0)   # as the controller's SavePolicy saves
        >>> state.close()
        >>> again = JaxRunState(model_func, config, acc)
        >>> again.build(tf.TensorSpec([None, 2], tf.float32), {})   # restores the latest
        >>> again.latest_checkpoint
        'run/checkpoints/0'
        >>> again.close()
    """

    engine = "jax"

    # ---------------------------------------------------------------- the arrays

    def _variable_lists(self, spec: Any = None) -> tuple[list, list, list]:
        model = (spec or self.spec).model
        return (list(model.trainable_variables), list(model.non_trainable_variables),
                list(self.optimizer.variables))

    def values(self) -> tuple[list, list, list]:
        """The state's arrays (trainable, non-trainable, optimizer), for a compiled step."""
        return owned_values(self._lists)

    def set_values(self, values: tuple[list, list, list]) -> None:
        assign_values(self._lists, values)

    def tree(self) -> dict[str, Any]:
        """What an old checkpoint (``orbax/<step>``, `checkpoints.LegacyReader`) holds:
        every variable, in the model's and the optimizer's order, and the counters.
        Positions, not names, key the variables; the names were kept in each step's
        metadata, for a warm start by name."""
        return {"model": [v.value for v in self._model_variables],
                "optimizer": [v.value for v in self.optimizer.variables],
                "counters": {"global_step": np.int64(self.step),
                             "input_steps": np.int64(self.input_steps_taken)}}

    def set_tree(self, tree: dict[str, Any]) -> None:
        for variables, part in ((self._model_variables, "model"),
                                (self.optimizer.variables, "optimizer")):
            for variable, value in zip(variables, tree[part], strict=True):
                variable.assign(value)
        self.step = int(tree["counters"]["global_step"])
        self.input_steps_taken = int(tree["counters"]["input_steps"])

    # ---------------------------------------------------------------- building

    def build(self, features_spec: Any, params: dict) -> None:
        """Creates model, optimizer and counters on the mesh; restores or warm-starts."""
        if self.built:
            return
        fw_io.check_bucket(self.config.work_dir)
        if self.config.seed is not None:
            keras.utils.set_random_seed(self.config.seed)
        with building.precision_policy(self.config.precision):
            try:
                spec, self.optimizer = building.build_model(
                    self._model_func, params, self.config.precision, features_spec)
            except Exception as err:  # Keras's rebuilt AttributeError: JAX's, named
                found = tpu_steps.traced_value_error(err)
                if found is None:
                    raise
                raise ValueError(tpu_steps.value_in_python("the model", found)) from None
        self.features_spec = features_spec
        self._lists = self._variable_lists(spec)
        self._model_variables = list(spec.model.variables)
        self.step = self.input_steps_taken = 0
        checkpointer = self.make_checkpointer(
            run_format.variable_groups(spec.model, self.optimizer), writes=True,
            processes=jax.process_count(),
            asynchronous=self.config.async_checkpoints and jax.process_count() == 1,
            legacy=self._legacy_reader())
        # The run format; else this engine's previous format, or the other engine's.
        restored = checkpointer.restore()
        if restored is None and self.config.warm_start_from:
            from fenwicks.train.jax import warm_start
            self.warm_start_report = warm_start.warm_start(spec.model,
                                                           self.config.warm_start_from)
        self._place_on_mesh(restored is None)
        self._spec, self._checkpointer = spec, checkpointer

    def _legacy_reader(self) -> checkpoints.LegacyReader | None:
        """A reader of the JAX engine's previous orbax checkpoints (``orbax/<step>``) if
        work_dir holds some; they are restored, never written."""
        if jax_weights.latest(self.config.work_dir) is None:
            return None
        return checkpoints.LegacyReader(self.config.work_dir, self.tree, self.set_tree,
                                        mesh.replicated())

    # ---------------------------------------------------------------- the run format

    def snapshot(self) -> Any:
        """Copies of the variables' arrays in host memory, dispatched without waiting
        (`checkpoints.snapshot`: a later step donates the arrays themselves)."""
        return checkpoints.snapshot({group: [v.value for v in variables]
                                     for group, variables in self._groups.items()})

    def to_host(self, frozen: Any) -> run_format.StateTree:
        """Waits for a `snapshot`'s copies: NumPy arrays."""
        host = checkpoints.to_host(frozen)
        return {group: [np.asarray(a) for a in arrays] for group, arrays in host.items()}

    def scatter(self, tree: run_format.StateTree) -> None:
        """Assigns host arrays to the variables, then replicates them over the mesh."""
        for group, variables in self._groups.items():
            for variable, array in zip(variables, tree[group], strict=True):
                variable.assign(np.asarray(array).astype(variable.dtype))
        self._place_on_mesh(False)

    def set_counters(self, step: int, input_steps: int) -> None:
        self.step, self.input_steps_taken = int(step), int(input_steps)

    def _place_on_mesh(self, initialised: bool) -> None:
        """Replicates every variable on every device of the mesh. With several processes,
        a fresh initialisation is process 0's: without a seed each process drew its own."""
        variables = [variable for group in self._lists for variable in group]
        values = [variable.value for variable in variables]
        if initialised and mesh.num_processes() > 1:
            values = processes.broadcast_from_first(values)
        for variable, value in zip(variables, mesh.put_replicated(values), strict=True):
            variable.assign(value)

    @property
    def is_chief(self) -> bool:
        """Process 0 of a multi-process run (and the only process of others): it holds
        the work_dir lock and writes summaries and the epoch log. Checkpoints are written
        by every process together (orbax), metadata by process 0."""
        return mesh.process_index() == 0

    def reset(self) -> None:
        super().reset()
        self.step = self.input_steps_taken = 0

