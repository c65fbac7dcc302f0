"""The inner loop's contract, shared by both engines (as Orbit's ``runner.py``): a
trainer's ``train(iterator, num_steps)`` runs that many steps of the engine's training
iterator (`InputManager.train_iterator`) in one compiled call and returns a
`LoopOutput`; it raises `InputExhaustedError` when the data ran out. The controller
(`controller.py`) and `find_lr` (`lr_finder.py`) call a trainer through this contract
only; `fenwicks.train.tf.trainer.Trainer` and `fenwicks.train.jax.trainer.JaxTrainer`
implement it.

    output = trainer.train(iterator, 100)
    output.step, output.losses[-1], output.examples_per_sec
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np


class InputExhaustedError(ValueError):
    """The training input ran out of data; the steps that did run are counted.

    Attributes:
        step: the global step reached (every step before it ran completely).
    """

    def __init__(self, step: int) -> None:
        super().__init__(f"the training input ran out of data at step {step}; end the "
                         "input_fn's dataset with .repeat() so it can feed any number of "
                         "steps")
        self.step = step


@dataclasses.dataclass(frozen=True)
class LoopOutput:
    """What one ``Trainer.train`` call did.

    Attributes:
        start: the global step before the loop.
        step: the global step after it.
        losses: the mean loss over the global batch of each step run, float32; shorter
            than asked if a loss was not finite or a stop was requested.
        learning_rate: the optimizer's learning rate after the loop, or None if it has
            no single value.
        seconds: wall time of the compiled call, compile time included on the first.
        examples_per_sec: examples trained per second of that call (over all replicas).
    """

    start: int
    step: int
    losses: np.ndarray
    learning_rate: float | None
    seconds: float
    examples_per_sec: float

    @property
    def last_loss(self) -> float:
        """The last step's loss (NaN when no step ran)."""
        return float(self.losses[-1]) if len(self.losses) else float("nan")


class Trainer(Protocol):
    """What the controller and `find_lr` ask of an engine's trainer."""

    @property
    def global_step(self) -> int:
        """The run's global step, as the trainer last advanced it."""

    def train(self, iterator: Any, num_steps: int) -> LoopOutput:
        """Runs `num_steps` steps of `iterator` (fewer if a loss is not finite or a stop
        is requested).

        Raises:
            InputExhaustedError: the training input ran out of data.
        """
