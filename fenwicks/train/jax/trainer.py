"""The inner training loop of the JAX engine (the `Trainer` role): ``train(batches, n)``
runs `n` steps in compiled blocks and returns the same `LoopOutput` as the TensorFlow
engine's `Trainer`.

A loop of `n` steps runs as blocks of ``K`` steps (`steps.make_train_block`), each one
``jax.lax.scan`` call over ``K`` stacked global batches; a remainder of fewer than ``K``
steps runs as blocks of one step, so two compilations serve every loop. ``K`` is the
loop length, capped so that one block of input stays under `BLOCK_BYTES`, and on the CPU
at `CPU_BLOCK_STEPS` (the block is unrolled there: its compile time grows with ``K``).
Blocks are dispatched without waiting for the previous one (JAX runs them
asynchronously): the next block's batches are read and copied to the devices while the
current one computes, and the host waits once, at the end of the loop. Before that
wait it reads the next loop's first block from the input (kept with that input,
`_ReadAhead`), so reading the input is never between two loops' computations either.
SIGTERM and Ctrl-C are looked at between blocks.

`JaxTrainer.last_timing` says where the last loop's wall time went on the host: reading
the input, copying it to the devices, dispatching, and waiting for the devices.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fenwicks.train.jax import mesh, steps
from fenwicks.train.jax.inputs import TrainBatches
from fenwicks.train.jax.state import JaxRunState
from fenwicks.train.runner import InputExhaustedError, LoopOutput

BLOCK_BYTES = 64 << 20  # input of one compiled block: bounded, whatever steps_per_loop is
# Steps of one block on the CPU, where blocks are unrolled (`steps.make_train_block`):
# one step a call is as fast there as an unrolled block of ten (1.5 s vs 2.2 s for ten
# steps of the benchmark's network, under load) and compiles ten times faster; the calls
# are dispatched asynchronously, so the host reads the next batch while one computes.
# Blocks of 2, 3 and 4 unrolled steps, measured again (the benchmark's net, c=8, loaded):
# 83.0, 88.0 and 88.5 CPU ms a step against 83.6 for one-step blocks, for 7.8, 9.9 and
# 13.1 s of compilation each.
CPU_BLOCK_STEPS = 1


def _stack(batches: list[Any]) -> Any:
    """``[len(batches), batch, ...]`` arrays of `batches` (one batch: a view, no copy)."""
    if len(batches) == 1:
        return jax.tree.map(lambda x: x[None], batches[0])
    return jax.tree.map(lambda *xs: np.stack(xs), *batches)


class JaxTrainer:
    """Runs training steps of one `JaxRunState` in compiled blocks.

    Args:
        state: the built `JaxRunState`; its counters advance by the steps run.
        global_batch_size: examples per step over all devices.
        steps_per_loop: the usual loop length (the block length, unless capped).
        stop: a flag with ``numpy()`` (`PreemptionWatcher.flag`); when True the loop
            returns after the block in progress. Defaults to None.
        block_steps: force the block length (benchmarks). Defaults to None.

    Examples:
        >>> from fenwicks.train.options import EstimatorConfig
        >>> acc = fw.accel.current()   # the JAX engine's devices
        >>> config = EstimatorConfig(steps_per_epoch=1, work_dir='run', train_batch_size=4,
        ...                          eval_batch_size=4, predict_batch_size=4, steps_per_loop=1,
        ...                          precision='float32', num_replicas=acc.num_replicas)
        >>> model_func = fw.train.get_clf_model_func(
        ...     lambda: keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]),
        ...     fw.train.sgd_optimizer(0.1))
        >>> from fenwicks.train.jax.inputs import TrainBatches
        >>> from fenwicks.train.jax.state import JaxRunState
        >>> state = JaxRunState(model_func, config, acc)
        >>> state.build(tf.TensorSpec([None, 2], tf.float32), {})
        >>> state.spec.model.set_weights([np.zeros((2, 2)), np.array([1., 0.])])  # class 0
        >>> x, y = np.ones((4, 2), 'float32'), np.array([0, 0, 0, 1])
        >>> batches = TrainBatches(tf.data.Dataset.from_tensors((x, y)).repeat(),
        ...                        replicas=1)   # one global batch of 4 per step
        >>> out = JaxTrainer(state, 4, 2).train(batches, 2)   # 2 steps
        >>> out.losses.round(4), state.global_step
        (array([0.5633, ...], dtype=float32), 2)
        >>> state.close()

        The first loss is (3 log(1 + e^-1) + log(1 + e)) / 4: logits [1, 0] for every
        example, three of class 0 and one of class 1.
    """

    def __init__(self, state: JaxRunState, global_batch_size: int, steps_per_loop: int,
                 stop: Any = None, block_steps: int | None = None) -> None:
        self.state = state
        self._global_batch_size = global_batch_size
        self._steps_per_loop = steps_per_loop
        self._stop = stop
        self._block_steps = block_steps
        self._block = steps.make_train_block(state.spec, state.optimizer, global_batch_size)
        self._ahead = _ReadAhead()
        self.last_timing: dict[str, float] = {}  # seconds of the last loop (module doc)

    @property
    def global_step(self) -> int:
        return self.state.global_step

    def _take(self, batches: TrainBatches, wanted: int) -> list[Any]:
        """Up to one block of batches, the read-ahead first; the first sets the block
        length."""
        ahead = self._ahead.take(batches, wanted)
        if self._block_steps is None:
            taken = ahead or batches.take(1)
            if not taken:
                return taken
            size = sum(x.nbytes for x in jax.tree.leaves(taken[0]))
            cap = CPU_BLOCK_STEPS if jax.default_backend() == "cpu" else self._steps_per_loop
            self._block_steps = max(1, min(self._steps_per_loop, cap, BLOCK_BYTES // size))
        else:
            taken = ahead
        return taken + batches.take(min(wanted, self._block_steps) - len(taken))

    def _stopped(self) -> bool:
        return self._stop is not None and bool(self._stop.numpy())

    def train(self, batches: TrainBatches, num_steps: int) -> LoopOutput:
        """Runs up to `num_steps` steps on `batches`.

        Raises:
            InputExhaustedError: `batches` ran out; the steps that ran stay counted.
        """
        state = self.state
        start, began = state.global_step, time.perf_counter()
        timing = dict.fromkeys(("input", "transfer", "dispatch", "wait"), 0.0)
        clock = _Clock(timing)
        values, outputs, asked, exhausted = state.values(), [], 0, False
        # Placed as the block returns it (replicated), or the block's second call would
        # see another input sharding and compile the whole block again.
        done = jax.device_put(jnp.bool_(False), mesh.replicated())
        try:
            while asked < num_steps and not self._stopped():
                wanted = num_steps - asked
                with clock("input"):
                    taken = self._take(batches, wanted)
                # A full block in one call; fewer steps (a loop's end) one step a call.
                for part in ([taken] if len(taken) == self._block_steps
                             else [[batch] for batch in taken]):
                    with clock("input"):
                        block = _stack(part)
                    with clock("transfer"):
                        block = mesh.put_batch(block, leading=1)
                    with clock("dispatch"):
                        values, done, losses, ran = self._block(values, done, block)
                    outputs.append((losses, ran))
                asked += len(taken)
                if not taken or len(taken) < min(wanted, self._block_steps):
                    exhausted = True
                    break
            if not exhausted and not self._stopped():
                with clock("input"):  # while the devices compute
                    self._ahead.read(batches, self._block_steps or 1)
        finally:
            state.set_values(values)  # the arrays passed in were donated to the block
        # Host-side from here: this waits for the blocks, all their losses fetched in one
        # transfer. No step after a non-finite loss changed the state (`done`), and the
        # steps counted stop at the first non-finite loss: as `done` is False when a loop
        # begins, the steps that did not run (`ran`) are exactly those after it.
        with clock("wait"):
            losses = jax.device_get([loss for loss, _ in outputs])
        losses = np.concatenate(losses) if losses else np.zeros([0], np.float32)
        losses = losses[:_through_first_non_finite(losses)]
        state.step += len(losses)
        state.input_steps_taken += len(losses)
        if exhausted:
            raise InputExhaustedError(state.global_step)
        seconds = time.perf_counter() - began
        self.last_timing = {**timing, "total": seconds}
        return LoopOutput(start, state.global_step, losses.astype(np.float32),
                          _learning_rate(state.optimizer), seconds,
                          len(losses) * self._global_batch_size / max(seconds, 1e-9))


class _ReadAhead:
    """Batches read from one `TrainBatches` before a loop asked for them; a later loop
    on the same input takes them first, a loop on another input drops them (that input
    was replaced, and its position is counted in steps trained, not batches read)."""

    def __init__(self) -> None:
        self._source: TrainBatches | None = None
        self._batches: list[Any] = []

    def read(self, batches: TrainBatches, count: int) -> None:
        if batches is not self._source:
            self._source, self._batches = batches, []
        self._batches += batches.take(count - len(self._batches))

    def take(self, batches: TrainBatches, count: int) -> list[Any]:
        if batches is not self._source:
            self._source, self._batches = None, []
            return []
        taken, self._batches = self._batches[:count], self._batches[count:]
        return taken


class _Clock:
    """``with clock(name):`` adds the block's wall seconds to ``timing[name]``."""

    def __init__(self, timing: dict[str, float]) -> None:
        self._timing = timing

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self._timing[name] += time.perf_counter() - began


def _through_first_non_finite(losses: np.ndarray) -> int:
    bad = np.flatnonzero(~np.isfinite(losses))
    return int(bad[0]) + 1 if len(bad) else len(losses)


def _learning_rate(optimizer: Any) -> float | None:
    try:
        return float(np.asarray(optimizer.learning_rate))
    except (TypeError, ValueError, AttributeError):
        return None
