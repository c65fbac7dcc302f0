"""Devices and shardings of the JAX engine: a 1-D mesh over every device, as
``keras.distribution.DataParallel`` lays it out. Variables are replicated on every
device; a global batch is split on its first axis, device ``r`` holding rows
``r * b .. (r + 1) * b``: the per-replica batch ``r``, as on the TensorFlow engine.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "batch"


@functools.cache
def mesh() -> Mesh:
    """The mesh of every device of the run (all hosts), along one ``'batch'`` axis."""
    return Mesh(np.asarray(jax.devices()), (AXIS,))


def num_replicas() -> int:
    """Devices sharing each global batch (over all hosts)."""
    return jax.device_count()


def replicated() -> NamedSharding:
    """Variables: the same full copy on every device."""
    return NamedSharding(mesh(), PartitionSpec())


def batch_sharded(leading: int = 0) -> NamedSharding:
    """A batch split on axis `leading` (1 for a block of steps ``[steps, batch, ...]``)."""
    return NamedSharding(mesh(), PartitionSpec(*([None] * leading), AXIS))


def put_batch(tree: Any, leading: int = 0) -> Any:
    """Copies a NumPy batch (any structure) to the devices, split over the mesh; the copy
    is asynchronous, so the next batch moves while the current one computes."""
    sharding = batch_sharded(leading)
    return jax.tree.map(lambda x: jax.device_put(x, sharding), tree)


def put_replicated(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.device_put(x, replicated()), tree)
