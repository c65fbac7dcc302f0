"""Input functions to NumPy global batches for the JAX engine.

``params`` are exactly the TensorFlow engine's (`fenwicks.train.inputs.make_params`):
``params['batch_size']`` is the per-replica batch, and the input_fn is called once, as
one pipeline feeding every replica of this host (``InputContext(1, 0, replicas)``). A
global batch is R consecutive per-replica batches, which is what the TensorFlow engine's
round-robin hands to replicas 0..R-1 in one step: both engines, and any device count,
train on the same examples in the same order.

The training position is counted in steps (`JaxRunState.input_position`) and a restarted
input skips ``steps * R`` per-replica batches (`resumed_train_dataset`), as on the
TensorFlow engine, so a killed and resumed run reads what the uninterrupted one read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import tensorflow as tf

from fenwicks.train import inputs as tf_inputs
from fenwicks.train.inputs import InputFn, InputManager, discard

logger = logging.getLogger("fenwicks")


def _merge_replicas(tree: Any) -> Any:
    """``[R, b, ...]`` -> ``[R * b, ...]``: R per-replica batches as one global batch."""
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), tree)


class TrainBatches:
    """The training input as NumPy global batches, taken a number of steps at a time.

    Example:
        >>> batches = TrainBatches(dataset, replicas=8)
        >>> block = batches.take(21)   # up to 21 global batches (fewer if it ran out)
    """

    def __init__(self, dataset: tf.data.Dataset, replicas: int) -> None:
        dataset = dataset.batch(replicas, drop_remainder=True).prefetch(2)
        self._iterator = dataset.as_numpy_iterator()

    def take(self, num_steps: int) -> list[Any]:
        """The next `num_steps` global batches; fewer only when the input ran out."""
        batches = []
        for _ in range(num_steps):
            try:
                batches.append(_merge_replicas(next(self._iterator)))
            except StopIteration:
                break
        return batches

    def release(self) -> None:
        holder, self._iterator = [self._iterator], None
        discard(holder)


class JaxInputManager(InputManager):
    """`InputManager` whose iterators yield NumPy global batches (see the module doc)."""

    @property
    def num_replicas(self) -> int:
        return self.config.num_replicas  # the mesh's devices, not TensorFlow's replicas

    def _context(self) -> tf.distribute.InputContext:
        return tf.distribute.InputContext(1, 0, self.num_replicas)

    def _drop_train_iterator(self) -> None:
        if self._train is not None:
            batches, self._train = self._train[1], None
            batches.release()

    def train_iterator(self, input_fn: InputFn, start_step: int) -> TrainBatches:
        """Global batches of `input_fn` from training step `start_step` on."""
        params = self.params("train", self.config.train_batch_size, self._context())
        self._last_probe = None
        self._drop_train_iterator()
        dataset = tf_inputs.resumed_train_dataset(input_fn, params,
                                                  start_step * self.num_replicas)
        tf_inputs.check_train_spec(dataset.element_spec, self.config.train_batch_per_replica)
        if start_step:
            logger.info("fenwicks: resuming the training input after %d steps", start_step)
        batches = TrainBatches(dataset, self.num_replicas)
        self._train = (input_fn, batches)
        return batches

    def padded_batches(self, input_fn: InputFn, global_batch: int, mode: str,
                       steps: int | None) -> Iterator[tuple[Any, np.ndarray]]:
        """``(global batch, mask)`` pairs covering every example once (`pad_and_mask`):
        the last partial batch padded to the static shape, filler batches masked out."""
        what = tf_inputs.MODE_NOUNS[mode]
        batch_size = self.probe(input_fn, mode, global_batch).params["batch_size"]
        params = self.params(mode, global_batch, self._context())
        dataset = tf_inputs.call_input_fn(input_fn, params, what)
        if steps is not None:
            dataset = dataset.take(steps * self.num_replicas)
        # Each batch padded to `batch_size` in tf.data; the last group of fewer than R
        # batches filled up with zero batches here, on the host (`_fill_group`), rather
        # than by `pad_and_mask`'s filler, which starts a second pass of the input.
        dataset = tf_inputs.pad_and_mask(dataset, batch_size, 1, what)
        dataset = dataset.batch(self.num_replicas).prefetch(2)
        self._last_probe = None
        holder = [dataset.as_numpy_iterator()]  # the only reference: `discard` drops it
        try:
            for element, mask in holder[0]:
                element, mask = _fill_group(element, mask, self.num_replicas)
                yield _merge_replicas(element), mask.reshape(-1)
        finally:
            discard(holder)


def _fill_group(element: Any, mask: np.ndarray, replicas: int) -> tuple[Any, np.ndarray]:
    """``[r, b, ...]`` with r < `replicas` (the input's last group) -> ``[replicas, b,
    ...]``, the added batches zero and masked out; a full group as it is."""
    missing = replicas - mask.shape[0]
    if not missing:
        return element, mask

    def fill(x: np.ndarray) -> np.ndarray:
        return np.concatenate([x, np.zeros((missing,) + x.shape[1:], x.dtype)])

    return jax.tree.map(fill, element), fill(mask)
