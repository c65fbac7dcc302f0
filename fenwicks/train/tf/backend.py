"""What the layers, optimizers and loss checks (below `fenwicks.train`) need to know of
Keras on TensorFlow; `fenwicks._engine.backend_facts` finds this module through the
engine's registry entry. The JAX engine's ``backend.py`` answers the same questions.

``tf.distribute`` runs a step once per replica: each replica sees its own share of the
batch and its own gradients, which the optimizer sums over the replicas, then updates
every replica's copy of a variable once (`StrategyExtended.update`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras
import tensorflow as tf

# A `keras.Variable` wraps a lasting `tf.Variable`, which callers may hold instead of it.
LASTING_BACKEND_VARIABLES = True
# Keras's BatchNormalization syncs replicas itself (``synchronized=True``) on TensorFlow.
SYNCS_BATCHNORM = True


def is_symbolic(value: object) -> bool:
    """Whether `value` belongs to a step being traced (a ``tf.function`` graph): it has no
    number to check yet."""
    return not tf.executing_eagerly()


def data_parallel_replicas() -> int | None:
    """A ``keras.distribution`` batch split: Keras has none on TensorFlow."""
    return None


def sum_gradients(grads: Sequence[Any]) -> list[Any]:
    """Each replica's gradients summed over the replicas (in a replica context, inside
    ``strategy.run``); in a cross-replica context they are global already."""
    context = tf.distribute.get_replica_context()
    if context is not None:
        grads = context.all_reduce(tf.distribute.ReduceOp.SUM, list(grads))
    return list(grads)


def update_each(variables: Sequence[Any], grads: Sequence[Any],
                update: Callable[[Any, Any, Any], None]) -> None:
    """Calls ``update(variable, copy, grad)`` for every replica's copy of each variable
    (of the `tf.Variable` behind a `keras.Variable`, through `StrategyExtended.update`:
    a merge call where the strategy needs one)."""
    extended = tf.distribute.get_strategy().extended
    for grad, variable in zip(grads, variables, strict=True):
        backend = variable.value if isinstance(variable, keras.Variable) else variable
        extended.update(backend, lambda copy, g, v=variable: update(v, copy, g),
                        args=(grad,), group=False)
