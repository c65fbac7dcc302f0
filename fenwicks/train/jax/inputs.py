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

Several processes (a multi-host TPU slice; `mesh`): each calls the input_fn for its own
share, with ``params['input_context']`` = ``InputContext(P, p, R)`` (P processes, this
one p, R replicas in all), as the TensorFlow engine's multi-worker runs do, and
``params['batch_size']`` still the per-replica batch. Each training step takes
``L = R / P`` per-replica batches from each process's pipeline, one per local device;
process p's batches fill replicas ``p * L .. (p + 1) * L - 1`` of the global batch. A
pipeline that shards by the context reads only its share (``fw.data.numpy_ds`` takes
every P-th example). For the same weights as one process, pipeline p must yield batches
``s * R + p * L .. s * R + p * L + L - 1`` of the one-process stream at step s.
Evaluation is exact across processes: every process reads the whole input (no
input_context, as on the TensorFlow engine), pads it to whole global batches and keeps
its replicas' rows, so each example is counted once and all run the same steps. A check
that fails on one process (a batch of the wrong size) fails on all of them
(`_agreed`), rather than leaving the others waiting in a collective.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
import tensorflow as tf

from fenwicks.train import inputs as input_fns
from fenwicks.train.inputs import InputFn, InputManager, Probe, discard
from fenwicks.train.jax import mesh, processes

logger = logging.getLogger("fenwicks")


def _merge_replicas(tree: Any) -> Any:
    """``[R, b, ...]`` -> ``[R * b, ...]``: R per-replica batches as one global batch."""
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), tree)


# Bytes of one read from the training input (module doc): global batches of static shape
# come in reads of several steps, up to this size and at most a loop's worth.
READ_BYTES = 8 << 20


class TrainBatches:
    """The training input as NumPy global batches, taken a number of steps at a time.

    Each global batch is R per-replica batches of the input_fn joined (``batch(R)``).
    When their shapes are static, one read takes the batches of several steps at once
    (``batch(R * n)``, up to `READ_BYTES` and `max_steps_per_read`), and the steps
    are views of it: one tf.data element and one conversion to NumPy serve n steps. On
    the benchmark's network (`benchmarks/jax_engine.py`, 400 KB a step) reads of ten
    steps took 0.72 ms of process CPU a step where reads of one took 1.06, and 0.10 ms
    of the main thread's where they took 0.37 (loaded machine). What was read and not
    taken stays for the next `take`; a finite input's last read keeps its whole steps,
    dropping the rest (fewer than R batches), as ``batch(R, drop_remainder=True)`` does.

    Args:
        dataset: the input_fn's dataset of per-replica batches.
        replicas: per-replica batches a step takes (this process's).
        max_steps_per_read: most steps one read holds. Defaults to 1.

    Examples:
        >>> dataset = tf.data.Dataset.range(24).batch(2, drop_remainder=True)  # 12 of 2
        >>> batches = TrainBatches(dataset, replicas=2, max_steps_per_read=3)
        >>> batches.steps_per_read   # static shapes: one read holds 3 steps
        3
        >>> batches.take(2)   # a global batch: 2 per-replica batches of 2
        [array([0, 1, 2, 3]), array([4, 5, 6, 7])]
        >>> len(batches.take(5))   # 4: the input ran out
        4
    """

    def __init__(self, dataset: tf.data.Dataset, replicas: int,
                 max_steps_per_read: int = 1) -> None:
        self._replicas = replicas
        self.steps_per_read = steps_per_read(dataset.element_spec, replicas,
                                             max_steps_per_read)
        dataset = dataset.batch(replicas * self.steps_per_read,
                                drop_remainder=self.steps_per_read == 1).prefetch(2)
        self._iterator = dataset.as_numpy_iterator()
        self._read: list[Any] = []  # global batches read and not yet taken

    def take(self, num_steps: int) -> list[Any]:
        """The next `num_steps` global batches; fewer only when the input ran out."""
        while len(self._read) < num_steps:
            try:
                element = next(self._iterator)
            except StopIteration:
                break
            self._read += self._steps(element)
        taken, self._read = self._read[:num_steps], self._read[num_steps:]
        return taken

    def _steps(self, element: Any) -> list[Any]:
        """``[R * n, b, ...]`` -> n global batches ``[R * b, ...]`` (views)."""
        if self.steps_per_read == 1:
            return [_merge_replicas(element)]
        r = self._replicas
        return [_merge_replicas(jax.tree.map(lambda x, i=i: x[i * r:(i + 1) * r], element))
                for i in range(len(jax.tree.leaves(element)[0]) // r)]

    def release(self) -> None:
        holder, self._iterator, self._read = [self._iterator], None, []
        discard(holder)


def steps_per_read(spec: Any, replicas: int, most: int) -> int:
    """Steps one read of `TrainBatches` holds: as many as fit in `READ_BYTES`, up to
    `most`; one unless every component has a static shape and a numeric dtype (only
    batches of one shape can be read together).

    Examples:
        >>> spec = (tf.TensorSpec([16, 28, 28, 1]), tf.TensorSpec([16], tf.int32))
        >>> steps_per_read(spec, replicas=8, most=10)
        10
    """
    step_bytes = 0
    for component in tf.nest.flatten(spec):
        if (not isinstance(component, tf.TensorSpec) or not component.shape.is_fully_defined()
                or not component.dtype.is_numpy_compatible or component.dtype == tf.string):
            return 1
        step_bytes += replicas * component.shape.num_elements() * component.dtype.size
    return max(1, min(most, READ_BYTES // max(step_bytes, 1)))


class JaxInputManager(InputManager):
    """`InputManager` whose iterators yield NumPy global batches (see the module doc)."""

    @property
    def _local_replicas(self) -> int:
        """Per-replica batches this process reads per step (all of them on one host)."""
        return self.num_replicas // mesh.num_processes()

    def _context(self) -> tf.distribute.InputContext:
        return tf.distribute.InputContext(mesh.num_processes(), mesh.process_index(),
                                          self.num_replicas)

    def probe(self, input_fn: InputFn, mode: str, global_batch: int | None = None) -> Probe:
        return _agreed(lambda: super(JaxInputManager, self).probe(input_fn, mode,
                                                                  global_batch),
                       input_fns.MODE_NOUNS[mode])

    def _drop_train_iterator(self) -> None:
        if self._train is not None:
            batches, self._train = self._train[1], None
            batches.release()

    def read_steps(self, iterator: TrainBatches, num_steps: int) -> int:
        """NumPy batches from the pipeline, copied to the devices (waited for)."""
        examples = 0
        for _ in range(num_steps):
            taken = iterator.take(1)
            if not taken:
                raise tf.errors.OutOfRangeError(None, None, "the training input ran out")
            jax.block_until_ready(mesh.put_batch(taken[0]))
            examples += len(jax.tree.leaves(taken[0])[0])
        return examples

    def train_iterator(self, input_fn: InputFn, start_step: int) -> TrainBatches:
        """Global batches of `input_fn` from training step `start_step` on (this
        process's share of them, with several processes)."""
        params = self.params("train", self.config.train_batch_size, self._context())
        self._last_probe = None
        self._drop_train_iterator()

        def dataset() -> tf.data.Dataset:
            found = input_fns.resumed_train_dataset(input_fn, params,
                                                    start_step * self._local_replicas)
            input_fns.check_train_spec(found.element_spec,
                                       self.config.train_batch_per_replica)
            return found

        dataset = _agreed(dataset, "training")
        if start_step:
            logger.info("fenwicks: resuming the training input after %d steps", start_step)
        batches = TrainBatches(dataset, self._local_replicas, self.config.steps_per_loop)
        self._train = (input_fn, batches)
        return batches

    def padded_batches(self, input_fn: InputFn, global_batch: int, mode: str,
                       steps: int | None) -> Iterator[tuple[Any, np.ndarray]]:
        """``(global batch, mask)`` pairs covering every example once (`pad_and_mask`):
        the last partial batch padded to the static shape, filler batches masked out."""
        what = input_fns.MODE_NOUNS[mode]
        batch_size = self.probe(input_fn, mode, global_batch).params["batch_size"]
        shared = mesh.num_processes() > 1
        # Several processes: each reads the whole input, without an input_context, so
        # that each example is counted once whether or not the input_fn shards by it.
        params = self.params(mode, global_batch, None if shared else self._context())
        dataset = input_fns.call_input_fn(input_fn, params, what)
        if steps is not None:
            dataset = dataset.take(steps * self.num_replicas)
        # Each batch padded to `batch_size` in tf.data; the last group of fewer than R
        # batches filled up with zero batches here, on the host (`_fill_group`), rather
        # than by `pad_and_mask`'s filler, which starts a second pass of the input.
        dataset = input_fns.pad_and_mask(dataset, batch_size, 1, what)
        dataset = dataset.batch(self.num_replicas).prefetch(2)
        first, count = mesh.process_index() * self._local_replicas, self._local_replicas
        self._last_probe = None
        holder = [dataset.as_numpy_iterator()]  # the only reference: `discard` drops it
        try:
            for element, mask in holder[0]:
                element, mask = _fill_group(element, mask, self.num_replicas)
                if shared:  # this process's replicas' rows of each global batch
                    element, mask = jax.tree.map(lambda x: x[first:first + count],
                                                 (element, mask))
                yield _merge_replicas(element), mask.reshape(-1)
        finally:
            discard(holder)


def _agreed(make: Any, what: str) -> Any:
    """``make()``, or its error, on every process: a check that fails on one process
    (its input_fn's batch size, say) raises there and, naming that process, on the
    others, so that none goes on alone into a collective the failed one never joins."""
    error = None
    try:
        result = make()
    except ValueError as err:
        error = err
    failed = processes.processes_where(error is not None)
    if error is not None:
        raise error
    if failed:
        raise ValueError(
            f"the {what} input_fn failed its checks on process(es) {failed} of "
            f"{mesh.num_processes()}, so this process stops too: see the error printed by "
            f"process {failed[0]} (each process calls the input_fn with its own "
            "params['input_context'])")
    return result


def _fill_group(element: Any, mask: np.ndarray, replicas: int) -> tuple[Any, np.ndarray]:
    """``[r, b, ...]`` with r < `replicas` (the input's last group) -> ``[replicas, b,
    ...]``, the added batches zero and masked out; a full group as it is."""
    missing = replicas - mask.shape[0]
    if not missing:
        return element, mask

    def fill(x: np.ndarray) -> np.ndarray:
        return np.concatenate([x, np.zeros((missing,) + x.shape[1:], x.dtype)])

    return jax.tree.map(fill, element), fill(mask)
