"""Devices and shardings of the JAX engine: a 1-D mesh over every device, as
``keras.distribution.DataParallel`` lays it out. Variables are replicated on every
device; a global batch is split on its first axis, device ``r`` holding rows
``r * b .. (r + 1) * b``: the per-replica batch ``r``, as on the TensorFlow engine.

Several processes (the hosts of a TPU pod slice, after ``jax.distributed.initialize``):
the mesh holds every process's devices, ordered by process, so process ``p`` holds the
contiguous replicas ``p * L .. (p + 1) * L`` (L devices per process). Each process then
puts only its own rows of a batch (`put_batch` with its share), and JAX assembles the
global array (``jax.make_array_from_process_local_data``) without copying between hosts.
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
    """The mesh of every device of the run (all processes), along one ``'batch'`` axis,
    each process's devices next to each other."""
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return Mesh(np.asarray(devices), (AXIS,))


def num_replicas() -> int:
    """Devices sharing each global batch (over all processes)."""
    return jax.device_count()


def num_processes() -> int:
    """Processes (hosts) of the run; 1 unless ``jax.distributed.initialize`` made more."""
    return jax.process_count()


def process_index() -> int:
    return jax.process_index()


def local_replicas() -> int:
    """This process's devices: the replicas whose rows it feeds."""
    return jax.local_device_count()


@functools.cache
def replicated() -> NamedSharding:
    """Variables: the same full copy on every device."""
    return NamedSharding(mesh(), PartitionSpec())


@functools.cache
def batch_sharded(leading: int = 0) -> NamedSharding:
    """A batch split on axis `leading` (1 for a block of steps ``[steps, batch, ...]``)."""
    return NamedSharding(mesh(), PartitionSpec(*([None] * leading), AXIS))


def put_batch(tree: Any, leading: int = 0) -> Any:
    """Copies a NumPy batch (any structure) to the devices, split over the mesh; the copy
    is asynchronous, so the next batch moves while the current one computes.

    With several processes, `tree` is this process's share (its replicas' rows, axis
    `leading` ``1 / num_processes()`` of the global batch) and the result the global
    array: every process must call this with shares of the same shape.
    """
    sharding = batch_sharded(leading)
    if num_processes() == 1:
        # One call for every array of the batch: JAX copies them together (0.17 ms of
        # CPU for the benchmark's images and labels, 0.20 as one call each).
        return jax.device_put(tree, sharding)

    def assemble(x: Any) -> Any:
        shape = list(np.shape(x))
        shape[leading] *= num_processes()
        return jax.make_array_from_process_local_data(sharding, x, tuple(shape))

    return jax.tree.map(assemble, tree)


def put_replicated(tree: Any) -> Any:
    """Copies arrays to every device. With several processes each process's value must
    be the same (`processes.broadcast_from_first` makes it so); each copies to its own devices, so
    nothing is compared across hosts here."""
    if num_processes() == 1:
        return jax.tree.map(lambda x: jax.device_put(x, replicated()), tree)

    def assemble(x: Any) -> Any:
        value = np.asarray(x)
        return jax.make_array_from_callback(value.shape, replicated(), lambda i: value[i])

    return jax.tree.map(assemble, tree)
