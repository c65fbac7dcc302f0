"""The reference engine's inner loop (the `Trainer` role): plain SGD steps on a dict of
NumPy arrays, one global batch a step, returning the `LoopOutput` the real engines'
trainers return. A stop request (SIGTERM, Ctrl-C: the watcher's `HostFlag`) is looked at
before each step; a non-finite loss ends the loop after its step without applying that
step's update, and the steps counted stop there, as on the real engines.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fenwicks.train.inputs import unpack
from fenwicks.train.reference import model as linear
from fenwicks.train.reference.inputs import TrainBatches
from fenwicks.train.reference.state import ReferenceRunState
from fenwicks.train.runner import InputExhaustedError, LoopOutput


class ReferenceTrainer:
    """Runs SGD steps of one `ReferenceRunState`.

    Args:
        state: the built state; its counters advance by the steps run.
        global_batch_size: examples per step.
        stop: a flag with ``numpy()`` (`PreemptionWatcher.flag`), or None.

    Examples:
        >>> import tempfile
        >>> from fenwicks.train.options import EstimatorConfig
        >>> config = EstimatorConfig(steps_per_epoch=4, work_dir=tempfile.mkdtemp(),
        ...                          train_batch_size=8, eval_batch_size=4,
        ...                          predict_batch_size=4, steps_per_loop=2,
        ...                          precision='float32', num_replicas=1, verbose=False)
        >>> X = np.ones((16, 3), 'float32')
        >>> y = X.sum(1, keepdims=True)   # 3: a zero model's squared error is 9
        >>> from fenwicks.train.reference.inputs import ReferenceInputManager
        >>> from fenwicks.train.reference.state import ReferenceRunState
        >>> from fenwicks.train.reference.model import linear_model_func
        >>> state = ReferenceRunState(linear_model_func(3, kernel_initializer='zeros'),
        ...                           config, fw.accel.current())
        >>> train_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'])
        >>> probe = ReferenceInputManager(config, fw.accel.current()).probe(train_fn, 'train')
        >>> state.build(probe.features_spec, probe.params)   # restores work_dir's latest
        >>> batches = ReferenceInputManager(config, fw.accel.current()).train_iterator(
        ...     train_fn, start_step=0)
        >>> trainer = ReferenceTrainer(state, 8)
        >>> trainer.train(batches, 3).losses.round(4)   # SGD at 0.1: x 0.04 each step
        array([9.    , 0.36  , 0.0144], dtype=float32)
    """

    def __init__(self, state: ReferenceRunState, global_batch_size: int,
                 stop: Any = None) -> None:
        self.state = state
        self._global_batch_size = global_batch_size
        self._stop = stop

    @property
    def global_step(self) -> int:
        return self.state.global_step

    def _stopped(self) -> bool:
        return self._stop is not None and bool(self._stop.numpy())

    def train(self, batches: TrainBatches, num_steps: int) -> LoopOutput:
        """Runs up to `num_steps` steps of `batches`.

        Raises:
            InputExhaustedError: `batches` ran out; the steps that ran stay counted.
        """
        state, spec = self.state, self.state.spec
        start, began = state.global_step, time.perf_counter()
        tree = state.tree()  # what callbacks left in the model
        params, step = tree["params"], state.step
        losses: list[float] = []
        exhausted = False
        while len(losses) < num_steps and not self._stopped():
            taken = batches.take(1)
            if not taken:
                exhausted = True
                break
            features, labels, weights = unpack(taken[0])
            if weights is not None:
                raise ValueError("the reference engine trains without sample weights; "
                                 "yield (features, labels) pairs")
            with np.errstate(all="ignore"):  # a non-finite loss is the news, below
                loss, gradient = linear.loss_and_gradient(
                    params, features, labels, self._global_batch_size, spec.reduction)
            losses.append(loss)
            if not np.isfinite(loss):
                break  # the state stays that of the step before
            rate = linear.learning_rate(state.optimizer, step)
            params = {name: (value - rate * gradient[name]).astype(np.float32)
                      for name, value in params.items()}
            step += 1
        tree["params"] = params
        tree["counters"] = {"global_step": np.int64(start + len(losses)),
                            "input_steps": np.int64(state.input_steps_taken + len(losses))}
        state.set_tree(tree)
        state.optimizer.iterations.assign(step)  # as a real optimizer would count them
        if exhausted:
            raise InputExhaustedError(state.global_step)
        seconds = time.perf_counter() - began
        return LoopOutput(start, state.global_step, np.asarray(losses, np.float32),
                          linear.learning_rate(state.optimizer, step), seconds,
                          len(losses) * self._global_batch_size / max(seconds, 1e-9))

