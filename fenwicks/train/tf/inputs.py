"""The TensorFlow engine's inputs: ``tf.distribute`` iterators and datasets over the
shared input functions (`fenwicks.train.inputs`).

With one input pipeline feeding R replicas (one host), `distribute_datasets_from_function`
hands the pipeline's batches out round-robin: step s gives replica r batch ``s * R + r``.
`predict` relies on this to put outputs back in input order.
"""

from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf

from fenwicks import accel
from fenwicks.train.inputs import (
    MODE_NOUNS,
    InputFn,
    InputManager,
    call_input_fn,
    check_train_spec,
    pad_and_mask,
    resumed_train_dataset,
)
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.tf import devices

logger = logging.getLogger("fenwicks")


def _rows(element: Any) -> tf.Tensor:
    return tf.cast(tf.shape(tf.nest.flatten(element)[0])[0], tf.int64)


def _drain_fn(strategy: tf.distribute.Strategy) -> Any:
    """A compiled ``(iterator, n) -> examples`` that takes n steps of batches, as the
    training loop does (``strategy.run`` on ``next(iterator)``), counting their rows."""

    @tf.function
    def drain(iterator: Any, num_steps: tf.Tensor) -> tf.Tensor:
        def body(i: tf.Tensor, examples: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            per_replica = strategy.run(_rows, args=(next(iterator),))
            # This host's replicas only: a cross-worker reduce would need every worker.
            local = strategy.experimental_local_results(per_replica)
            return i + 1, examples + tf.add_n(list(local))

        zero = tf.constant(0, tf.int64)
        return tf.while_loop(lambda i, _: i < num_steps, body, (zero, zero))[1]

    return drain


class TFInputManager(InputManager):
    """`InputManager` whose iterators and datasets are the strategy's distributed ones.

    Examples:
        >>> from fenwicks.train.options import EstimatorConfig
        >>> acc = fw.accel.current()
        >>> config = EstimatorConfig(steps_per_epoch=1, work_dir='run', train_batch_size=4,
        ...                          eval_batch_size=4, predict_batch_size=4, steps_per_loop=1,
        ...                          precision='float32', num_replicas=acc.num_replicas)
        >>> manager = TFInputManager(config, acc)
        >>> x, y = np.arange(16, dtype='float32').reshape(8, 2), np.zeros(8, 'int64')
        >>> train_input_fn = lambda params: tf.data.Dataset.from_tensor_slices(
        ...     (x, y)).repeat().batch(params['batch_size'], drop_remainder=True)
        >>> manager.probe(train_input_fn, 'train').features_spec  # checked before any compile
        TensorSpec(shape=(4, 2), dtype=tf.float32, name=None)
        >>> iterator = manager.train_iterator(train_input_fn, start_step=1)  # after step 0's
        >>> features, labels = next(iterator)
        >>> features.numpy()[:, 0]   # the second batch: examples 4 to 7
        array([ 8., 10., 12., 14.], dtype=float32)
    """

    def __init__(self, config: EstimatorConfig, accelerator: accel.Accelerator) -> None:
        super().__init__(config, accelerator)
        self._strategy = devices.strategy()
        self._drain: Any = None

    def read_steps(self, iterator: Any, num_steps: int) -> int:
        if self._drain is None:
            self._drain = _drain_fn(self._strategy)
        return int(self._drain(iterator, tf.constant(num_steps, tf.int64)))

    def train_iterator(self, input_fn: InputFn, start_step: int) -> Any:
        """A distributed iterator over `input_fn` from training step `start_step` on."""
        batch_size = self.config.train_batch_per_replica

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            params = self.params("train", self.config.train_batch_size, context)
            # Each step takes one batch per replica this pipeline feeds.
            per_step = self.num_replicas // context.num_input_pipelines
            dataset = resumed_train_dataset(input_fn, params, start_step * per_step)
            check_train_spec(dataset.element_spec, batch_size)
            return dataset

        self._last_probe = None  # the probe's dataset is no longer needed
        self._drop_train_iterator()
        iterator = iter(self._strategy.distribute_datasets_from_function(dataset_fn))
        if start_step:
            logger.info("fenwicks: resuming the training input after %d steps", start_step)
        self._train = (input_fn, iterator)
        return iterator

    def padded_dataset(self, input_fn: InputFn, global_batch: int, mode: str,
                       steps: int | None) -> Any:
        """The distributed dataset of ((features, labels), mask) for `evaluate`/`predict`.

        Every example appears exactly once: partial batches are padded to the static
        batch shape and masked out, as are whole filler batches.
        """
        what, batch_size = MODE_NOUNS[mode], self.probe(input_fn, mode, global_batch).params[
            "batch_size"]
        workers = self.config.num_processes

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            # Several workers: the estimator shards the batches itself (round-robin) and
            # gives the input_fn no input_context, so that each example is counted once
            # whether or not the input_fn would shard by it.
            params = self.params(mode, global_batch, None if workers > 1 else context)
            dataset = call_input_fn(input_fn, params, what)
            per_step = self.num_replicas // context.num_input_pipelines
            if steps is not None:
                dataset = dataset.take(steps * self.num_replicas)
            if workers > 1:
                dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
            return pad_and_mask(dataset, batch_size, per_step, what)

        self._last_probe = None
        return self._strategy.distribute_datasets_from_function(dataset_fn)

