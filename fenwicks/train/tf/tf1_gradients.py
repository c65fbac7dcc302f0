"""TF1 gradient code in a model_fn trains as TF1 trained it.

In a model_fn, ``tf.gradients`` of the loss with respect to ``tf.trainable_variables()``
gives the real gradients (of this replica's batch), and what the program does with them
(``tf.clip_by_global_norm``, ``tf.clip_by_norm``, a scale, a freeze, a subset of the
variables) is what trains: ``apply_gradients`` records the (gradient, variable) pairs it
is given (`AppliedGradients`), and the model_fn runner makes them the step's gradients
(`gradient_surrogate`). ``compute_gradients`` and ``minimize(var_list=...)`` are the same
two steps, as in TF1.

Across replicas, TF1's rule: ``CrossShardOptimizer.apply_gradients`` summed the replicas'
gradients (``cross_replica_sum``), and its ``compute_gradients`` first divided the loss by
the replica count (its default ``reduction=MEAN``), so ``minimize`` steps by the mean
gradient while BERT's ``tf.gradients`` + ``apply_gradients`` steps by the sum. Without
``CrossShardOptimizer`` each TPU core applied its own gradients to its own copy (the
copies drifted apart); here the replicas' gradients are averaged, which is TF1's update on
one replica and the update ``minimize`` makes with ``CrossShardOptimizer``.

``ExponentialMovingAverage.apply`` is refused in one sentence (`EMA_REFUSAL`).

Examples:
    >>> def model_fn(features, labels, mode, params):   # BERT's way: tf.gradients, clipped
    ...     logits = keras.layers.Dense(2, kernel_initializer='zeros', name='logits')(features)
    ...     loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    ...     tvars = tf.compat.v1.trainable_variables()
    ...     grads = tf.gradients(loss, tvars)
    ...     grads, _ = tf.clip_by_global_norm(grads, 1.0)
    ...     optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    ...     global_step = tf.compat.v1.train.get_or_create_global_step()
    ...     train_op = optimizer.apply_gradients(zip(grads, tvars), global_step)
    ...     return fw.train.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)
    >>> x, y = np.ones((8, 3), 'float32'), np.zeros(8, 'int64')
    >>> input_fn = lambda params: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
    ...     params['batch_size'], drop_remainder=True)
    >>> est = fw.train.TPUEstimator(model_fn, model_dir='run', train_batch_size=8, verbose=False)
    >>> est.train(input_fn, max_steps=1).get_variable_names()
    ['logits/kernel', 'logits/bias']

    The gradients of the 8 weights are all +-0.5 (logits 0, so softmax 0.5 each), their
    global norm sqrt(2): clipped to norm 1, one step of 0.1 moves the bias by
    0.1 x 0.5 / sqrt(2):

    >>> est.estimator.model.layers[-1].bias.numpy().round(4)
    array([ 0.0354, -0.0354], dtype=float32)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import keras
import tensorflow as tf

from fenwicks import _tf_internals
from fenwicks.train.tf.tf1_config import ModelFnError
from fenwicks.train.tf.tf1_optimizers import V1Minimize, v1_learning_rate
from fenwicks.train.tf.tf1_variables import V1View

EMA_REFUSAL = (
    "model_fn called tf.compat.v1.train.ExponentialMovingAverage(...).apply(...), whose "
    "shadow variables and their update op need TF1's graph collections and session, so "
    "the average would silently never be kept: remove the ExponentialMovingAverage lines "
    "(and the ema.average(...) reads), so that the trained weights themselves are "
    "evaluated, predicted with and exported")


@dataclasses.dataclass
class AppliedGradients:
    """What a model_fn's ``apply_gradients`` was given."""

    pairs: list[tuple[Any, Any]]  # (gradient or None, the Keras variable)
    summed: bool  # CrossShardOptimizer: summed over replicas; otherwise averaged


def is_cross_shard(optimizer: Any) -> bool:
    return "CrossShard" in type(optimizer).__name__


def model_variable(variable: Any) -> Any:
    """The Keras variable behind what a model_fn holds (`V1View`, a Keras variable)."""
    if isinstance(variable, V1View):
        return variable.variable
    if isinstance(variable, keras.Variable):
        return variable
    raise ModelFnError(
        f"model_fn passed {variable!r} to apply_gradients, which is not a variable of the "
        "model: pass the variables of tf.compat.v1.trainable_variables() (or of the Keras "
        "layers the model_fn made)")


def _graph_tensor(x: Any) -> Any:
    """What `tf.gradients` differentiates with respect to: the variable under a view."""
    if isinstance(x, (V1View, keras.Variable)):
        return model_variable(x).value
    return x


def patches(record: Any, replay: Any, replicas: int) -> list[tuple[Any, str, Any]]:
    """The (target, name, value) patches of TF1's gradient names for one model_fn call;
    `record` gets ``applied`` and ``minimize``."""
    v1 = tf.compat.v1
    original_gradients = tf.gradients

    def gradients(ys: Any, xs: Any, grad_ys: Any = None, *args: Any, **kwargs: Any) -> Any:
        listed = list(xs) if isinstance(xs, (list, tuple)) else [xs]
        if tf.distribute.in_cross_replica_context() and any(
                isinstance(x, (V1View, keras.Variable)) for x in listed):
            # The runner's first calls, which only record what the model_fn makes, run
            # outside the replicas, where a mirrored variable has no one value to
            # differentiate by; every step runs inside them.
            return [tf.zeros(x.shape, x.dtype) for x in listed]
        return original_gradients(ys, [_graph_tensor(x) for x in listed], grad_ys,
                                  *args, **kwargs)

    def compute_gradients(self: Any, loss: Any, var_list: Any = None, gate_gradients: Any = 1,
                          aggregation_method: Any = None,
                          colocate_gradients_with_ops: bool = False,
                          grad_loss: Any = None) -> list[tuple[Any, Any]]:
        variables = (list(var_list) if var_list is not None
                     else replay.v1_trainable_variables())
        reduction = (_tf_internals.v1_optimizer_arg(self, "reduction")
                     if is_cross_shard(self) else None)
        if reduction == v1.losses.Reduction.MEAN:  # TF1 divided by the shard count
            loss = loss / replicas
        grads = gradients(loss, variables, grad_loss, aggregation_method=aggregation_method)
        return list(zip(grads, variables, strict=True))

    def apply_gradients(self: Any, grads_and_vars: Any, global_step: Any = None,
                        name: Any = None) -> Any:
        pairs = [(grad, model_variable(var)) for grad, var in grads_and_vars]
        if not pairs:
            raise ModelFnError(f"model_fn called {type(self).__name__}.apply_gradients with "
                               "no (gradient, variable) pairs: pass zip(grads, tvars)")
        record.applied = AppliedGradients(pairs, summed=is_cross_shard(self))
        record.minimize = V1Minimize(self, v1_learning_rate(self))
        return tf.no_op()  # the engine's optimizer step applies them

    def minimize(self: Any, loss: Any, global_step: Any = None, var_list: Any = None,
                 gate_gradients: Any = 1, aggregation_method: Any = None,
                 colocate_gradients_with_ops: bool = False, name: Any = None,
                 grad_loss: Any = None) -> Any:
        pairs = self.compute_gradients(loss, var_list=var_list, grad_loss=grad_loss,
                                       aggregation_method=aggregation_method)
        return self.apply_gradients(pairs, global_step)

    original_init = v1.train.Optimizer.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if is_cross_shard(self):  # instance attributes shadow the wrapper's own methods
            self.compute_gradients = functools.partial(compute_gradients, self)
        if is_cross_shard(self) or type(self).apply_gradients is not \
                v1.train.Optimizer.apply_gradients:  # a subclass's own (BERT's)
            self.apply_gradients = functools.partial(apply_gradients, self)

    def ema_apply(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise ModelFnError(EMA_REFUSAL)

    return [(module, "gradients", gradients) for module in _tf_internals.v1_api_modules()] + [
            (tf, "gradients", gradients),
            (v1.train.Optimizer, "compute_gradients", compute_gradients),
            (v1.train.Optimizer, "apply_gradients", apply_gradients),
            (v1.train.Optimizer, "minimize", minimize),
            (v1.train.Optimizer, "__init__", init),
            (v1.train.ExponentialMovingAverage, "apply", ema_apply)]


def gradient_surrogate(loss: tf.Tensor, applied: AppliedGradients, trainable: list[Any],
                       global_batch: int, replicas: int) -> tf.Tensor:
    """The per-example loss `loss` with the same value, whose gradient in the engine's
    step is the recorded gradients: ``stop_gradient(loss) + c * (S - stop_gradient(S))``
    with ``S = sum(stop_gradient(g) * v)``. The engine divides by the global batch and
    sums the replicas' gradients, so ``c = global_batch / rows`` leaves each replica's
    ``g`` (scaled by ``1/replicas`` where TF1's rule averages). A trainable variable not
    in the list gets a zero gradient, as TF1 left it alone."""
    scale = 1.0 if applied.summed else 1.0 / replicas
    terms, listed = [], set()
    for grad, variable in applied.pairs:
        listed.add(id(variable))
        if grad is None:
            continue
        value = variable.value
        if isinstance(grad, tf.IndexedSlices):  # embeddings: only the rows looked up
            values = tf.stop_gradient(tf.cast(grad.values, value.dtype)) * scale
            product = values * tf.gather(value, grad.indices)
        else:
            product = tf.stop_gradient(tf.cast(grad, value.dtype)) * scale * value
        terms.append(tf.cast(tf.reduce_sum(product), tf.float32))
    terms += [tf.cast(tf.reduce_sum(v.value), tf.float32) * 0.0 for v in trainable
              if id(v) not in listed]
    surrogate = tf.add_n(terms) if terms else tf.constant(0.0)
    rows = tf.cast(tf.shape(loss)[0], tf.float32)
    return tf.stop_gradient(loss) + (global_batch / rows) * (
        surrogate - tf.stop_gradient(surrogate))
