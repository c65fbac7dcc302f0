"""The inner training loop, as Orbit's `StandardTrainer`: ``trainer.train(n)`` runs `n`
steps in one compiled call and returns what they did.

The `Trainer` owns the compiled loop (`loops.make_train_loop`, built on first use), the
step counters it advances (``global_step`` and the input position, counted together
inside each step) and running out of data. It knows nothing of checkpoints, callbacks,
progress or epochs: the controller (`controller.py`) and `find_lr` (`lr_finder.py`) decide
how many steps to ask for and what to do with the result.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from fenwicks.train.model_func import ModelSpec
from fenwicks.train.runner import InputExhaustedError, LoopOutput
from fenwicks.train.tf import loops


class Trainer:
    """Runs training steps of one model in compiled loops.

    Args:
        strategy: the `tf.distribute.Strategy` the variables live in.
        spec: the built `ModelSpec`.
        optimizer: the built optimizer to step with.
        global_step: an int64 variable counting steps; the loop advances it.
        global_batch_size: examples per step over all replicas (the loss divisor).
        jit_compile: XLA-compile each replica's step. Defaults to False.
        stop: a bool variable; when it turns True the loop returns after the step in
            progress (preemption). Defaults to None.
        input_steps: the input position, advanced with `global_step`. Defaults to None.

    Examples:
        >>> strategy = fw.train.tf.strategy()   # made when fw.accel.current() found the devices
        >>> with strategy.scope():   # the variables live where the strategy puts them
        ...     model = keras.Sequential([keras.Input((2,)),
        ...                               keras.layers.Dense(1, kernel_initializer='ones')])
        ...     spec = fw.train.ModelSpec(model, keras.optimizers.SGD(0.01),
        ...                               loss_fn=fw.train.squared_error)
        ...     step_counter = tf.Variable(0, dtype=tf.int64)
        >>> x, y = np.array([[1., 2.], [3., 4.]], 'float32'), np.zeros((2, 1), 'float32')
        >>> batches = strategy.experimental_distribute_dataset(
        ...     tf.data.Dataset.from_tensors((x, y)).repeat())
        >>> trainer = Trainer(strategy, spec, spec.optimizer, step_counter, 2)
        >>> out = trainer.train(iter(batches), 3)   # 3 steps in one compiled call
        >>> out.losses.round(2), trainer.global_step
        (array([29.  , 13.58, ...], dtype=float32), 3)

        The first loss is (3^2 + 7^2) / 2; one step of 0.01 makes the weights [0.76, 0.66]
        and the bias -0.1, so the second is (1.98^2 + 4.82^2) / 2.
    """

    def __init__(self, strategy: tf.distribute.Strategy, spec: ModelSpec, optimizer: Any,
                 global_step: tf.Variable, global_batch_size: int,
                 jit_compile: bool = False, stop: tf.Variable | None = None,
                 input_steps: tf.Variable | None = None) -> None:
        self.global_step_variable = global_step
        self._make_loop = lambda: loops.make_train_loop(
            strategy, spec, optimizer, global_step, global_batch_size, jit_compile, stop,
            input_steps)
        self._loop: Callable[[Any, tf.Tensor], tf.Tensor] | None = None
        self._optimizer = optimizer
        self._global_batch_size = global_batch_size
        self._counts: dict[int, tf.Tensor] = {}  # num_steps as made once

    @property
    def global_step(self) -> int:
        return int(self.global_step_variable.numpy())

    def train(self, iterator: Any, num_steps: int) -> LoopOutput:
        """Runs up to `num_steps` steps on batches from `iterator`.

        Raises:
            InputExhaustedError: `iterator` ran out; the steps that ran stay counted.
        """
        if self._loop is None:
            self._loop = self._make_loop()
        start, began = self.global_step, time.perf_counter()
        if num_steps not in self._counts:
            self._counts[num_steps] = tf.constant(num_steps, tf.int64)
        try:
            # A tensor count: asking for another number of steps does not retrace.
            losses = self._loop(iterator, self._counts[num_steps]).numpy()
        except tf.errors.OutOfRangeError as err:
            raise InputExhaustedError(self.global_step) from err
        # Each step run adds one loss and one to global_step (`loops.make_train_loop`):
        # the step reached is known without reading the variable again.
        seconds, step = time.perf_counter() - began, start + len(losses)
        return LoopOutput(start, step, losses, self._learning_rate(), seconds,
                          (step - start) * self._global_batch_size / max(seconds, 1e-9))

    def _learning_rate(self) -> float | None:
        try:
            return float(np.asarray(self._optimizer.learning_rate))
        except (TypeError, ValueError, AttributeError):
            return None
