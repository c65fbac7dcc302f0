"""What the layers, optimizers and loss checks (below `fenwicks.train`) need to know of
Keras on JAX; `fenwicks._engine.backend_facts` finds this module through the engine's
registry entry. The TensorFlow engine's ``backend.py`` answers the same questions.

Under ``jax.jit`` a step sees the global batch: its gradients are global already, and a
variable is one array (sharded or replicated by JAX), updated once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import keras

# Under jax.jit the global batch's statistics are the synchronized ones.
# A `keras.Variable` holds JAX arrays, replaced at every assignment: only the Keras
# variable lasts.
LASTING_BACKEND_VARIABLES = False
SYNCS_BATCHNORM = False


def is_symbolic(value: object) -> bool:
    """Whether `value` belongs to a step being traced (a ``jax.jit`` tracer)."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(value))


def data_parallel_replicas() -> int | None:
    """The batch axis's devices of a ``keras.distribution.DataParallel`` that splits the
    batch a layer sees (Keras's own ``fit`` on JAX); None where there is none."""
    distribution = keras.distribution.distribution()
    if isinstance(distribution, keras.distribution.DataParallel):
        mesh = distribution.device_mesh
        return int(mesh.shape[mesh.axis_names.index(distribution.batch_dim_name)])
    return None


def sum_gradients(grads: Sequence[Any]) -> list[Any]:
    """The gradients of the global batch: global already."""
    return list(grads)


def update_each(variables: Sequence[Any], grads: Sequence[Any],
                update: Callable[[Any, Any, Any], None]) -> None:
    """Calls ``update(variable, variable, grad)`` once per variable: its one copy."""
    for grad, variable in zip(grads, variables, strict=True):
        update(variable, variable, grad)
