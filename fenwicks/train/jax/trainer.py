"""The inner training loop of the JAX engine (the `Trainer` role): ``train(batches, n)``
runs `n` steps in compiled blocks and returns the same `LoopOutput` as the TensorFlow
engine's `Trainer`.

A loop of `n` steps runs as blocks of ``K`` steps (`steps.make_train_block`), each one
``jax.lax.scan`` call over ``K`` stacked global batches; the last block is padded with
steps that do nothing, so every block reuses one compilation. ``K`` is the loop length,
capped so that one block of input stays under `BLOCK_BYTES`. Blocks are dispatched
without waiting for the previous one (JAX runs them asynchronously): the next block's
batches are read and copied to the devices while the current one computes, and the host
waits once, at the end of the loop. SIGTERM and Ctrl-C are looked at between blocks.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fenwicks.train.jax import mesh, steps
from fenwicks.train.jax.inputs import TrainBatches
from fenwicks.train.jax.state import JaxRunState
from fenwicks.train.trainer import InputExhaustedError, LoopOutput

BLOCK_BYTES = 64 << 20  # input of one compiled block: bounded, whatever steps_per_loop is


def _stack(batches: list[Any], length: int) -> Any:
    """``[length, batch, ...]`` arrays of `batches`, padded with zero batches."""
    padding = [jax.tree.map(np.zeros_like, batches[0])] * (length - len(batches))
    return jax.tree.map(lambda *xs: np.stack(xs), *batches, *padding)


class JaxTrainer:
    """Runs training steps of one `JaxRunState` in compiled blocks.

    Args:
        state: the built `JaxRunState`; its counters advance by the steps run.
        global_batch_size: examples per step over all devices.
        steps_per_loop: the usual loop length (the block length, unless capped).
        stop: a flag with ``numpy()`` (`PreemptionWatcher.flag`); when True the loop
            returns after the block in progress. Defaults to None.
        block_steps: force the block length (benchmarks). Defaults to None.

    Example:
        >>> trainer = JaxTrainer(state, 512, 100)
        >>> trainer.train(batches, 100).losses    # 100 per-step losses
    """

    def __init__(self, state: JaxRunState, global_batch_size: int, steps_per_loop: int,
                 stop: Any = None, block_steps: int | None = None) -> None:
        self.state = state
        self._global_batch_size = global_batch_size
        self._steps_per_loop = steps_per_loop
        self._stop = stop
        self._block_steps = block_steps
        self._block = steps.make_train_block(state.spec, state.optimizer, global_batch_size)

    @property
    def global_step(self) -> int:
        return self.state.global_step

    def _take(self, batches: TrainBatches, wanted: int) -> list[Any]:
        """Up to one block of batches; the first sets the block length."""
        if self._block_steps is None:
            taken = batches.take(1)
            if not taken:
                return taken
            size = sum(x.nbytes for x in jax.tree.leaves(taken[0]))
            self._block_steps = max(1, min(self._steps_per_loop, BLOCK_BYTES // size))
            return taken + batches.take(min(wanted, self._block_steps) - 1)
        return batches.take(min(wanted, self._block_steps))

    def _stopped(self) -> bool:
        return self._stop is not None and bool(self._stop.numpy())

    def train(self, batches: TrainBatches, num_steps: int) -> LoopOutput:
        """Runs up to `num_steps` steps on `batches`.

        Raises:
            InputExhaustedError: `batches` ran out; the steps that ran stay counted.
        """
        state = self.state
        start, began = state.global_step, time.perf_counter()
        values, outputs, asked, exhausted = state.values(), [], 0, False
        try:
            while asked < num_steps and not self._stopped():
                wanted = num_steps - asked
                taken = self._take(batches, wanted)
                if taken:
                    block = mesh.put_batch(_stack(taken, self._block_steps), leading=1)
                    values, losses, ran = self._block(values, block, jnp.int32(len(taken)))
                    outputs.append((losses, ran))
                    asked += len(taken)
                if not taken or len(taken) < min(wanted, self._block_steps):
                    exhausted = True
                    break
        finally:
            state.set_values(values)  # the arrays passed in were donated to the block
        # Host-side from here: this waits for the blocks. A block after a non-finite loss
        # starts on NaN weights; the steps counted stop at the first non-finite loss.
        losses = [np.asarray(loss)[np.asarray(ran)] for loss, ran in outputs]
        losses = np.concatenate(losses) if losses else np.zeros([0], np.float32)
        losses = losses[:_through_first_non_finite(losses)]
        state.step += len(losses)
        state.input_steps_taken += len(losses)
        if exhausted:
            raise InputExhaustedError(state.global_step)
        seconds = time.perf_counter() - began
        return LoopOutput(start, state.global_step, losses.astype(np.float32),
                          _learning_rate(state.optimizer), seconds,
                          len(losses) * self._global_batch_size / max(seconds, 1e-9))


def _through_first_non_finite(losses: np.ndarray) -> int:
    bad = np.flatnonzero(~np.isfinite(losses))
    return int(bad[0]) + 1 if len(bad) else len(losses)


def _learning_rate(optimizer: Any) -> float | None:
    try:
        return float(np.asarray(optimizer.learning_rate))
    except (TypeError, ValueError, AttributeError):
        return None
