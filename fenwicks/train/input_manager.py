"""Inputs of a run: calling input functions with `params`, checking their first batch
before anything compiles, the live training iterator and its resume position, and the
padded, masked datasets of exact evaluation and prediction.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import weakref
from typing import Any

import tensorflow as tf

from fenwicks import accel
from fenwicks.train import building, inputs, loops
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.state import RunState

logger = logging.getLogger("fenwicks")

InputFn = inputs.InputFn


def _head(elem: Any, rows: int) -> Any:
    return tf.nest.map_structure(lambda t: t[:rows], elem)


class InputManager:
    """Turns input functions into distributed iterators for one `RunState`.

    Example:
        >>> manager = InputManager(config, fw.accel.current(), state)
        >>> iterator = manager.train_iterator(train_input_fn)  # builds the model first
    """

    def __init__(self, config: EstimatorConfig, accelerator: accel.Accelerator,
                 state: RunState) -> None:
        self.config = config
        self._acc = accelerator
        self._strategy = accelerator.strategy
        self._state = state
        self._train: tuple[InputFn, Any] | None = None
        # Eval input_fns whose labels were checked (weak: a new lambda may reuse an id).
        self._checked: weakref.WeakSet = weakref.WeakSet()

    @property
    def num_replicas(self) -> int:
        return self._acc.num_replicas

    def params(self, mode: str, global_batch: int, context: Any = None) -> dict:
        return building.make_params(
            mode, global_batch, self.num_replicas, seed=self.config.seed,
            precision=self.config.precision, steps_per_epoch=self.config.steps_per_epoch,
            input_context=context)

    def _probe_context(self) -> tf.distribute.InputContext:
        return tf.distribute.InputContext(1, 0, self.num_replicas)

    # ---------------------------------------------------------------- training

    def restart_training_input(self) -> None:
        """The next `train_iterator` starts again from the restored input position."""
        self._train = None

    def train_iterator(self, input_fn: InputFn) -> Any:
        """The live iterator for `input_fn`, positioned where the run's input stands.

        The input position belongs to the run, not to the function object: a new but
        identical input_fn (a notebook cell run again makes a new lambda) continues at the
        same batch as the old one would, and so does a fresh estimator on work_dir.
        """
        if self._train is not None and self._train[0] is input_fn:
            return self._train[1]
        batch_size = self.config.train_batch_per_replica
        self._check_first_batch(input_fn, batch_size)
        state = self._state
        skip_steps = int(state.input_steps.numpy())

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            params = self.params("train", self.config.train_batch_size, context)
            # Each step takes one batch per replica this pipeline feeds.
            per_step = self.num_replicas // context.num_input_pipelines
            dataset = inputs.resumed_train_dataset(input_fn, params, skip_steps * per_step)
            inputs.check_train_spec(dataset.element_spec, batch_size)
            return dataset

        iterator = iter(self._strategy.distribute_datasets_from_function(dataset_fn))
        if skip_steps:
            logger.info("fenwicks: resuming the training input after %d steps", skip_steps)
        self._train = (input_fn, iterator)
        return iterator

    def _check_first_batch(self, input_fn: InputFn, batch_size: int) -> None:
        """Structure, static batch and label checks on one batch, before any compile."""
        params = self.params("train", self.config.train_batch_size, self._probe_context())
        dataset = inputs.call_input_fn(input_fn, params, "training")
        inputs.check_train_spec(dataset.element_spec, batch_size)
        self._state.build(inputs.unpack(dataset.element_spec)[0], params)
        self._check_labels(dataset)

    def _check_labels(self, dataset: tf.data.Dataset) -> None:
        """Runs the loss eagerly on a few examples: the built-in losses then raise a
        ValueError for out-of-range labels (compiled, they can only return NaN)."""
        spec = self._state.spec
        for element in dataset.take(1):
            features, labels, _ = inputs.unpack(_head(element, 64))
            with self._strategy.scope(), building.training_randomness_kept(spec.model):
                outputs = loops._float32(spec.model(features, training=False))
                try:
                    spec.loss_fn(labels, outputs)
                except (tf.errors.InvalidArgumentError, ValueError) as err:
                    inputs.explain_one_hot(labels, outputs, err)
                    raise

    # ---------------------------------------------------------------- evaluation

    def padded_dataset(self, input_fn: InputFn, global_batch: int, mode: str,
                       steps: int | None) -> Any:
        """The distributed dataset of ((features, labels), mask) for `evaluate`/`predict`.

        Every example appears exactly once: partial batches are padded to the static
        batch shape and masked out, as are whole filler batches.
        """
        batch_size = global_batch // self.num_replicas
        what = "evaluation" if mode == "eval" else "prediction"
        probe = inputs.call_input_fn(
            input_fn, self.params(mode, global_batch, self._probe_context()), what)
        if mode == "eval":
            inputs.check_pair(probe.element_spec, what)
        inputs.check_eval_spec(probe.element_spec, batch_size, what)
        features = inputs.unpack(probe.element_spec)[0]
        self._state.build(features, self.params(mode, self.config.train_batch_size))
        if mode == "eval" and input_fn not in self._checked:
            self._check_labels(probe)
            with contextlib.suppress(TypeError):  # an object that cannot be weakly referenced
                self._checked.add(input_fn)
        workers = self._acc.num_workers

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            # Several workers: the estimator shards the batches itself (round-robin) and
            # gives the input_fn no input_context, so that each example is counted once
            # whether or not the input_fn would shard by it.
            params = self.params(mode, global_batch, None if workers > 1 else context)
            dataset = inputs.call_input_fn(input_fn, params, what)
            per_step = self.num_replicas // context.num_input_pipelines
            if steps is not None:
                dataset = dataset.take(steps * self.num_replicas)
            if workers > 1:
                dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
            return inputs.pad_and_mask(dataset, batch_size, per_step, what)

        return self._strategy.distribute_datasets_from_function(dataset_fn)

    def release(self) -> None:
        """Destroys the live training iterator (and its prefetch threads) now.

        A distributed tf.data iterator left to interpreter shutdown can block for
        minutes in its destructor (seen with TF 2.21 on 8 logical CPUs), and one whose
        prefetch threads are inside a Python callback when it is destroyed deadlocks on
        the GIL; `fw.data.numpy_ds` therefore gathers small arrays inside the graph.
        """
        if self._train is not None:
            self._train = None
            gc.collect()
