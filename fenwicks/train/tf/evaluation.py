"""Exact evaluation and prediction on the TensorFlow engine: the compiled loops
(`loops.py`) over the strategy's padded, masked datasets (`TFInputManager.padded_dataset`).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from fenwicks import accel
from fenwicks.train import building
from fenwicks.train.eval_sums import EvalTotals
from fenwicks.train.evaluation import Evaluator
from fenwicks.train.inputs import InputFn, InputManager, discard
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.run_state import RunState
from fenwicks.train.tf import devices, loops


class TFEvaluator(Evaluator):
    """`Evaluator` whose steps are ``tf.function`` loops under the strategy.

    Examples:
        >>> from fenwicks.train.options import EstimatorConfig
        >>> acc = fw.accel.current()
        >>> config = EstimatorConfig(steps_per_epoch=1, work_dir='run', train_batch_size=4,
        ...                          eval_batch_size=4, predict_batch_size=4, steps_per_loop=1,
        ...                          precision='float32', num_replicas=acc.num_replicas)
        >>> from fenwicks.train.tf.inputs import TFInputManager
        >>> from fenwicks.train.tf.state import TFRunState
        >>> model_func = fw.train.get_clf_model_func(
        ...     lambda: keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]),
        ...     fw.train.sgd_optimizer(0.1))
        >>> state, inputs = TFRunState(model_func, config, acc), TFInputManager(config, acc)
        >>> state.build(tf.TensorSpec([None, 2], tf.float32), {})
        >>> state.spec.model.set_weights([np.zeros((2, 2)), np.array([1., 0.])])  # class 0
        >>> evaluator = TFEvaluator(config, acc, state, inputs)
        >>> x, y = np.ones((5, 2), 'float32'), np.array([0, 0, 0, 1, 1])
        >>> eval_input_fn = lambda params: tf.data.Dataset.from_tensor_slices(
        ...     (x, y)).batch(params['batch_size'])   # 5 examples: batches of 4 and 1
        >>> evaluator.evaluate(eval_input_fn, None)
        {'loss': 0.7132..., 'accuracy': 0.6, 'global_step': 0, 'num_examples': 5}
        >>> state.close()

        Every example counts once: the loss is (3 log(1 + e^-1) + 2 log(1 + e)) / 5.
    """

    def __init__(self, config: EstimatorConfig, accelerator: accel.Accelerator,
                 state: RunState, input_manager: InputManager) -> None:
        super().__init__(config, accelerator, state, input_manager)
        self._strategy = devices.strategy()

    def is_out_of_memory(self, err: BaseException) -> bool:
        """TensorFlow's out-of-memory error (the device's, or tf.data's)."""
        return isinstance(err, tf.errors.ResourceExhaustedError)

    def _loop(self, kind: str) -> Any:
        if kind not in self._loops:
            make = loops.make_eval_loop if kind == "eval" else loops.make_predict_loop
            self._loops[kind] = make(self._strategy, self._state.spec, self.config.jit_compile)
        return self._loops[kind]

    def _run_loop(self, kind: str, dataset: Any) -> Any:
        """The `kind` loop over a new iterator of `dataset`, which `discard` then destroys
        (off this thread: its destructor can wait for seconds)."""
        loop = self._loop(kind)
        holder = [iter(dataset)]
        try:
            with building.training_randomness_kept(self._state.spec.model):
                return loop(holder[0])
        finally:
            discard(holder)

    def _eval_totals(self, input_fn: InputFn, global_batch: int,
                     steps: int | None) -> EvalTotals:
        """The masked sums of the evaluation (`eval_sums`' columns) over every example,
        added up in float64."""
        per_step = self._run_loop("eval", self._inputs.padded_dataset(
            input_fn, global_batch, "eval", steps)).numpy()
        return EvalTotals.of(per_step, list(self._state.spec.metric_fns))

    def _predictions(self, input_fn: InputFn, global_batch: int) -> list[Any]:
        """``[(predictions, mask)]`` per global batch, in input order."""
        return self._run_loop("predict", self._inputs.padded_dataset(
            input_fn, global_batch, "predict", None))

    def reset(self) -> None:
        """Forgets the compiled loops (after the model was rebuilt)."""
        self._loops.clear()

