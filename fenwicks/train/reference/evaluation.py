"""Exact evaluation and prediction on the reference engine (the `Evaluator` role): each
padded, masked global batch (`ReferenceInputManager.padded_batches`) through the linear
model in NumPy, the spec's own loss and metrics on its outputs, and the masked sums in
`fenwicks.train.eval_sums`' layout, added up by the shared `Evaluator` in float64.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from fenwicks.train import eval_sums
from fenwicks.train.eval_sums import EvalTotals
from fenwicks.train.evaluation import Evaluator
from fenwicks.train.inputs import InputFn, unpack
from fenwicks.train.reference import model as linear


def _rows(mask: np.ndarray, bad: np.ndarray | None) -> float:
    return 0.0 if bad is None else float(np.sum(mask & bad))


def _non_finite_rows(features: Any) -> np.ndarray | None:
    rows = None
    for leaf in keras.tree.flatten(features):
        leaf = np.asarray(leaf)
        if np.issubdtype(leaf.dtype, np.floating):
            bad = np.any(~np.isfinite(leaf.reshape(len(leaf), -1)), axis=1)
            rows = bad if rows is None else rows | bad
    return rows


def eval_row(spec: Any, params: linear.Params, batch: Any, mask: np.ndarray) -> list[float]:
    """One global batch's sums (`eval_sums.row`) over the rows where `mask` is True."""
    features, labels, weights = unpack(batch)
    with np.errstate(all="ignore"):  # NaN features: counted below, never summed
        outputs = linear.forward(params, features)
    values = {name: np.asarray(keras.ops.convert_to_numpy(value), np.float32)
              for name, value in spec.example_values(labels, outputs).items()}
    weight = np.ones(mask.shape, np.float32) if weights is None else \
        np.asarray(weights, np.float32).reshape(mask.shape)
    # where, not multiply: a NaN on a padding row must not leak into the sum.
    sums = [float(np.sum(np.where(mask, weight * value, 0.0))) for value in values.values()]
    checks = [_rows(mask, ~np.isfinite(values["loss"])), _rows(mask, _non_finite_rows(features)),
              0.0]  # no class labels: a linear regression
    return eval_sums.row(sums, float(mask.sum()), float(np.sum(np.where(mask, weight, 0.0))),
                         checks)


class ReferenceEvaluator(Evaluator):
    """`Evaluator` of the reference engine's linear model, in NumPy.

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
        >>> from fenwicks.train.reference.model import linear_model_func
        >>> from fenwicks.train.reference.state import ReferenceRunState
        >>> state = ReferenceRunState(linear_model_func(3, kernel_initializer='zeros'),
        ...                           config, fw.accel.current())
        >>> inputs = ReferenceInputManager(config, fw.accel.current())
        >>> eval_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'],
        ...                                           training=False)
        >>> probe = inputs.probe(eval_fn, 'eval')
        >>> state.build(probe.features_spec, probe.params)
        >>> evaluator = ReferenceEvaluator(config, fw.accel.current(), state, inputs)
        >>> evaluator.evaluate(eval_fn, None)
        {'loss': 9.0, 'mse': 9.0, 'mae': 3.0, 'global_step': 0, 'num_examples': 16}
    """

    def _eval_totals(self, input_fn: InputFn, global_batch: int,
                     steps: int | None) -> EvalTotals:
        spec, params = self._state.spec, linear.params_of(self._state.spec.model)
        rows = []
        for batch, mask in self._inputs.padded_batches(input_fn, global_batch, "eval"):
            if steps is not None and len(rows) == steps:
                break
            rows.append(eval_row(spec, params, batch, mask))
        return EvalTotals.of(rows, list(spec.metric_fns))

    def _predictions(self, input_fn: InputFn, global_batch: int) -> list[Any]:
        spec, params = self._state.spec, linear.params_of(self._state.spec.model)
        results = []
        for batch, mask in self._inputs.padded_batches(input_fn, global_batch, "predict"):
            outputs = linear.forward(params, unpack(batch)[0])
            results.append((keras.tree.map_structure(
                lambda value: np.asarray(keras.ops.convert_to_numpy(value)),
                spec.predict_fn(outputs)), mask))
        return results

    def is_out_of_memory(self, err: BaseException) -> bool:
        return isinstance(err, MemoryError)
