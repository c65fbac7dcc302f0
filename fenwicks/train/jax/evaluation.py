"""Exact evaluation and prediction on the JAX engine (the `Evaluator` role).

Batches come padded and masked (`JaxInputManager.padded_batches`), every one of the
same static shape, so one compiled step serves a whole evaluation; the per-batch sums
leave the devices in float32 and are added up on the host in float64, as on the
TensorFlow engine. What the sums mean, the checks and the result are `Evaluator`'s.

Steps are dispatched without waiting for the one before (JAX runs them asynchronously),
so the next batch is read and copied to the devices while the current one computes; the
host waits for a step's result only once `IN_FLIGHT` later steps are dispatched, which
bounds the batches held on the devices.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from fenwicks.train.eval_sums import EvalTotals
from fenwicks.train.evaluation import Evaluator
from fenwicks.train.inputs import InputFn, unpack
from fenwicks.train.jax import mesh, steps


class JaxEvaluator(Evaluator):
    """`Evaluator` whose steps are jitted JAX functions over the mesh.

    Examples:
        >>> from fenwicks.train.options import EstimatorConfig
        >>> acc = fw.accel.current()   # the JAX engine's devices
        >>> config = EstimatorConfig(steps_per_epoch=1, work_dir='run', train_batch_size=4,
        ...                          eval_batch_size=4, predict_batch_size=4, steps_per_loop=1,
        ...                          precision='float32', num_replicas=acc.num_replicas)
        >>> model_func = fw.train.get_clf_model_func(
        ...     lambda: keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]),
        ...     fw.train.sgd_optimizer(0.1))
        >>> from fenwicks.train.jax.inputs import JaxInputManager
        >>> from fenwicks.train.jax.state import JaxRunState
        >>> state, inputs = JaxRunState(model_func, config, acc), JaxInputManager(config, acc)
        >>> state.build(tf.TensorSpec([None, 2], tf.float32), {})
        >>> state.spec.model.set_weights([np.zeros((2, 2)), np.array([1., 0.])])  # class 0
        >>> evaluator = JaxEvaluator(config, acc, state, inputs)
        >>> x, y = np.ones((5, 2), 'float32'), np.array([0, 0, 0, 1, 1])
        >>> eval_input_fn = lambda params: tf.data.Dataset.from_tensor_slices(
        ...     (x, y)).batch(params['batch_size'])   # 5 examples: batches of 4 and 1
        >>> evaluator.evaluate(eval_input_fn, None)
        {'loss': 0.7132..., 'accuracy': 0.6, 'global_step': 0, 'num_examples': 5}
        >>> state.close()

        Every example counts once: the loss is (3 log(1 + e^-1) + 2 log(1 + e)) / 5.
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
        per_batch = _pipelined(
            (step(trainable, non_trainable, mesh.put_batch(batch), mesh.put_batch(mask))
             for batch, mask in self._inputs.padded_batches(
                 input_fn, global_batch, "eval", num_steps)),
            np.asarray)
        return EvalTotals.of(per_batch, list(self._state.spec.metric_fns))

    def is_out_of_memory(self, err: BaseException) -> bool:
        """XLA's out-of-memory error (``RESOURCE_EXHAUSTED``), or tf.data's."""
        return ("RESOURCE_EXHAUSTED" in str(err)
                or isinstance(err, tf.errors.ResourceExhaustedError))

    def _predictions(self, input_fn: InputFn, global_batch: int) -> list[Any]:
        step = self._step("predict")
        trainable, non_trainable, _ = self._state.values()
        return _pipelined(
            ((step(trainable, non_trainable, mesh.put_batch(unpack(batch)[0])), mask)
             for batch, mask in self._inputs.padded_batches(
                 input_fn, global_batch, "predict", None)),
            lambda result: (_to_numpy(result[0]), result[1]))


IN_FLIGHT = 2  # steps dispatched ahead of the one the host waits for


def _pipelined(results: Iterator[Any], to_host: Callable[[Any], Any]) -> list[Any]:
    """`to_host` of every item of `results` (each a dispatched step), in order, waiting
    for an item only when `IN_FLIGHT` later ones have been dispatched."""
    pending: collections.deque = collections.deque()
    done = []
    for result in results:
        pending.append(result)
        if len(pending) > IN_FLIGHT:
            done.append(to_host(pending.popleft()))
    done.extend(to_host(result) for result in pending)
    return done


def _to_numpy(tree: Any) -> Any:
    import jax

    return jax.tree.map(np.asarray, tree)
