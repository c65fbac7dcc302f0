"""Exact evaluation and prediction on the JAX engine (the `Evaluator` role).

Batches come padded and masked (`JaxInputManager.padded_batches`), every one of the
same static shape, so one compiled step serves a whole evaluation; the per-batch sums
leave the devices in float32 and are added up on the host in float64, as on the
TensorFlow engine. What the sums mean, the checks and the result are `Evaluator`'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fenwicks.train.eval_sums import EvalTotals
from fenwicks.train.evaluation import Evaluator
from fenwicks.train.inputs import InputFn
from fenwicks.train.jax import mesh, steps


class JaxEvaluator(Evaluator):
    """`Evaluator` whose steps are jitted JAX functions over the mesh.

    Example:
        >>> evaluator = JaxEvaluator(config, fw.accel.current(), state, input_manager)
        >>> evaluator.evaluate(eval_input_fn, None)   # {'loss', 'accuracy', ...}
    """

    def _step(self, kind: str) -> Any:
        if kind not in self._loops:
            make = steps.make_eval_step if kind == "eval" else steps.make_predict_step
            self._loops[kind] = make(self._state.spec)
        return self._loops[kind]

    def _eval_totals(self, input_fn: InputFn, global_batch: int,
                     num_steps: int | None) -> EvalTotals:
        step = self._step("eval")
        trainable, non_trainable, _ = self._state.values()
        per_batch = [np.asarray(step(trainable, non_trainable, mesh.put_batch(batch),
                                     mesh.put_batch(mask)))
                     for batch, mask in self._inputs.padded_batches(
                         input_fn, global_batch, "eval", num_steps)]
        return EvalTotals.of(per_batch, list(self._state.spec.metric_fns))

    def _predictions(self, input_fn: InputFn, global_batch: int) -> list[Any]:
        from fenwicks.train.inputs import unpack

        step = self._step("predict")
        trainable, non_trainable, _ = self._state.values()
        results = [(step(trainable, non_trainable, mesh.put_batch(unpack(batch)[0])), mask)
                   for batch, mask in self._inputs.padded_batches(
                       input_fn, global_batch, "predict", None)]
        return [(_to_numpy(predictions), mask) for predictions, mask in results]


def _to_numpy(tree: Any) -> Any:
    import jax

    return jax.tree.map(np.asarray, tree)
