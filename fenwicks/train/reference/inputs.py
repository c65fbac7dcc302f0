"""Input functions to NumPy global batches for the reference engine.

``params`` are the other engines' (`fenwicks.train.inputs.make_params`): the input_fn is
called once, as one pipeline feeding every replica (``InputContext(1, 0, R)``), and a
global batch is R consecutive per-replica batches, as on both real engines. The training
position is counted in steps and a restarted input skips ``steps * R`` per-replica
batches (`fenwicks.train.inputs.resumed_train_dataset`). Evaluation and prediction
batches are padded and masked by the shared `pad_and_mask`, the last group of fewer than
R batches filled with masked zero batches here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

from fenwicks.train import inputs as input_fns
from fenwicks.train.inputs import InputFn, InputManager, discard
from fenwicks.train.runner import InputExhaustedError


def _merge(element: Any) -> Any:
    """``[R, b, ...]`` -> ``[R * b, ...]``."""
    return keras.tree.map_structure(lambda x: x.reshape((-1,) + x.shape[2:]), element)


class TrainBatches:
    """The training input as NumPy global batches (`take`)."""

    def __init__(self, dataset: Any, replicas: int) -> None:
        self._iterator = dataset.batch(replicas, drop_remainder=True).as_numpy_iterator()

    def take(self, num_steps: int) -> list[Any]:
        """The next `num_steps` global batches; fewer only when the input ran out."""
        taken = []
        for element in self._iterator:
            taken.append(_merge(element))
            if len(taken) == num_steps:
                break
        return taken

    def release(self) -> None:
        holder, self._iterator = [self._iterator], None
        discard(holder)


class ReferenceInputManager(InputManager):
    """`InputManager` whose iterators yield NumPy global batches (module doc)."""

    @property
    def num_replicas(self) -> int:
        return self.config.num_replicas

    @property
    def num_hosts(self) -> int:
        return 1

    def _drop_train_iterator(self) -> None:
        if self._train is not None:
            batches, self._train = self._train[1], None
            batches.release()

    def train_iterator(self, input_fn: InputFn, start_step: int) -> TrainBatches:
        params = self.params("train", self.config.train_batch_size,
                             input_fns.input_context(1, 0, self.num_replicas))
        self._last_probe = None
        self._drop_train_iterator()
        dataset = input_fns.resumed_train_dataset(input_fn, params,
                                                  start_step * self.num_replicas)
        input_fns.check_train_spec(dataset.element_spec, self.config.train_batch_per_replica)
        batches = TrainBatches(dataset, self.num_replicas)
        self._train = (input_fn, batches)
        return batches

    def read_steps(self, iterator: TrainBatches, num_steps: int) -> int:
        examples = 0
        for _ in range(num_steps):
            taken = iterator.take(1)
            if not taken:
                raise InputExhaustedError(0)
            examples += len(keras.tree.flatten(taken[0])[0])
        return examples

    def padded_batches(self, input_fn: InputFn, global_batch: int,
                       mode: str) -> Iterator[tuple[Any, np.ndarray]]:
        """``(global batch, mask)`` pairs covering every example once."""
        what = input_fns.MODE_NOUNS[mode]
        batch_size = self.probe(input_fn, mode, global_batch).params["batch_size"]
        params = self.params(mode, global_batch,
                             input_fns.input_context(1, 0, self.num_replicas))
        dataset = input_fns.call_input_fn(input_fn, params, what)
        dataset = input_fns.pad_and_mask(dataset, batch_size, 1, what)
        self._last_probe = None
        holder = [dataset.batch(self.num_replicas).as_numpy_iterator()]
        try:
            for element, mask in holder[0]:
                missing = self.num_replicas - len(mask)
                if missing:  # the input's last group: zero batches, masked out
                    element, mask = keras.tree.map_structure(
                        lambda x, n=missing: np.concatenate(
                            [x, np.zeros((n,) + x.shape[1:], x.dtype)]), (element, mask))
                yield _merge(element), mask.reshape(-1)
        finally:
            discard(holder)
