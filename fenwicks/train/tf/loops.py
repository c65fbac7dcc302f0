"""Compiled loops: many steps per `tf.function` call, as on a TPU.

`make_train_loop` returns ``loop(iterator, num_steps) -> per-step losses``: a
`tf.while_loop` over a tensor step count, so calling it with another count does not
retrace. It stops early after a non-finite loss, so the caller can name the step.
Each replica's step (`strategy.run`) is XLA-compiled when ``jit_compile`` is set: that is
what a TPU runs, and on the CPU it proves every shape is static.

Loss scaling across replicas: each replica contributes ``sum(per-example loss) /
global batch`` (``'mean'``) or the plain sum (``'sum'``) and the optimizer all-reduces
gradients with SUM, so the update equals the single-device one for any replica count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from fenwicks.train import eval_sums, inputs
from fenwicks.train.model_func import ModelSpec


def _float32(outputs: Any) -> Any:
    """Mixed-precision models may emit bfloat16/float16; losses are computed in float32."""
    return tf.nest.map_structure(
        lambda t: tf.cast(t, tf.float32) if t.dtype.is_floating else t, outputs)


def train_step_fn(spec: ModelSpec, optimizer: Any, global_batch_size: int,
                  num_replicas: int) -> Callable[[Any], tf.Tensor]:
    """One replica's training step on a batch: ``batch -> loss`` (not yet compiled).

    `make_train_loop` runs it under the strategy; `fw.train.check_tpu_ready` compiles it
    alone for TPU.

    Examples:
        >>> model = keras.Sequential([keras.Input((2,)),
        ...                            keras.layers.Dense(1, kernel_initializer='ones')])
        >>> spec = fw.train.ModelSpec(model, keras.optimizers.SGD(0.1),
        ...                           loss_fn=fw.train.squared_error)
        >>> x, y = np.array([[1., 2.], [3., 4.]], 'float32'), np.zeros((2, 1), 'float32')
        >>> step = tf.function(train_step_fn(spec, spec.optimizer, 2, 1))   # batch 2, 1 replica
        >>> float(step((x, y)))   # outputs 3 and 7: the sum of the squared errors
        58.0
        >>> model.layers[-1].bias.numpy()   # d(58 / 2)/d(bias) = (2 x 3 + 2 x 7) / 2 = 10
        array([-1.], dtype=float32)
    """
    model = spec.model
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)

    def step(batch: Any) -> tf.Tensor:
        features, labels, weights = inputs.unpack(batch)
        with tf.GradientTape() as tape:
            outputs = _float32(model(features, training=True))
            loss_sum = tf.reduce_sum(_weighted(spec.loss_fn(labels, outputs), weights))
            loss = loss_sum / global_batch_size if spec.reduction == "mean" else loss_sum
            if model.losses:  # regularisers: gradients are summed over replicas, so / R
                loss += tf.add_n([tf.cast(x, tf.float32) for x in model.losses]) / num_replicas
            if scaled:
                loss = optimizer.scale_loss(loss)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss_sum

    return step


def _sum_over_replicas(strategy: tf.distribute.Strategy, per_replica: Any) -> tf.Tensor:
    """The global sum of a per-replica scalar.

    When every replica is on this host, an add_n of the local values is measurably
    cheaper per step than `strategy.reduce` (benchmarks/train_throughput.py, cpu:2). With
    several workers it must be a real all-reduce: every worker has to see the same loss,
    or they would disagree on stopping after a NaN and wait on each other forever.
    """
    local = strategy.experimental_local_results(per_replica)
    if len(local) == strategy.num_replicas_in_sync:
        return tf.add_n(list(local))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)


def make_train_loop(strategy: tf.distribute.Strategy, spec: ModelSpec, optimizer: Any,
                    global_step: tf.Variable, global_batch_size: int,
                    jit_compile: bool, stop: tf.Variable | None = None,
                    input_steps: tf.Variable | None = None,
                    ) -> Callable[[Any, tf.Tensor], tf.Tensor]:
    """Builds the compiled training loop.

    Args:
        stop: a boolean variable read before every step; when it turns True the loop
            returns after the step in progress (preemption, see `preemption.py`).
        input_steps: the input position, counted with `global_step` inside each step, so
            the two agree however the loop is left (an interrupt, an exception).

    Returns:
        ``loop(iterator, num_steps)`` returning a float32 vector of the mean loss of each
        step run (shorter than `num_steps` if a loss was not finite or `stop` was set).
    """
    step = tf.function(train_step_fn(spec, optimizer, global_batch_size,
                                   strategy.num_replicas_in_sync), jit_compile=jit_compile)

    @tf.function
    def loop(iterator: Any, num_steps: tf.Tensor) -> tf.Tensor:
        def cond(i, last, losses):
            go = tf.logical_and(i < num_steps, tf.math.is_finite(last))
            return go if stop is None else tf.logical_and(go, tf.logical_not(stop))

        def body(i, last, losses):
            per_replica = strategy.run(step, args=(next(iterator),))
            loss = _sum_over_replicas(strategy, per_replica) / global_batch_size
            with tf.control_dependencies([loss]):  # count a step only once it has run
                global_step.assign_add(1)
                if input_steps is not None:
                    input_steps.assign_add(1)
            return i + 1, loss, losses.write(tf.cast(i, tf.int32), loss)

        losses = tf.TensorArray(tf.float32, size=0, dynamic_size=True)
        _, _, losses = tf.while_loop(
            cond, body, (tf.constant(0, num_steps.dtype), tf.constant(0.0), losses))
        return losses.stack()

    return loop


def _weighted(values: tf.Tensor, weights: Any) -> tf.Tensor:
    """Per-example values times the sample weights (Keras's ``sample_weight``), if any."""
    if weights is None:
        return values
    return tf.cast(values, tf.float32) * tf.reshape(tf.cast(weights, tf.float32),
                                                    tf.shape(values))


def _non_finite_rows(features: Any) -> tf.Tensor:
    """Per example: True if any floating feature value is NaN or infinite."""
    rows = None
    for t in tf.nest.flatten(features):
        if not t.dtype.is_floating:
            continue
        bad = tf.logical_not(tf.math.is_finite(t))
        bad = tf.reduce_any(tf.reshape(bad, [tf.shape(t)[0], -1]), axis=1)
        rows = bad if rows is None else tf.logical_or(rows, bad)
    return rows


def _bad_label_rows(labels: Any, outputs: Any) -> tf.Tensor | None:
    """Per example: True if an integer class label lies outside the outputs' classes.

    Only for one integer label per example and one ``[B, C]`` output (a classifier).
    """
    if not (isinstance(labels, tf.Tensor) and isinstance(outputs, tf.Tensor)):
        return None
    if not labels.dtype.is_integer or outputs.shape.rank != 2 or not outputs.shape[-1]:
        return None
    if labels.shape.rank == 2 and labels.shape[-1] == 1:
        labels = labels[:, 0]
    if labels.shape.rank != 1:
        return None
    return tf.logical_or(labels < 0, labels >= outputs.shape[-1])


def eval_step_fn(spec: ModelSpec) -> Callable[[Any], tf.Tensor]:
    """One replica's evaluation step: ``(element, mask) -> sums`` in the
    `eval_sums` layout (not yet compiled).

    Examples:
        >>> model = keras.Sequential([keras.Input((2,)),
        ...                            keras.layers.Dense(1, kernel_initializer='ones')])
        >>> spec = fw.train.ModelSpec(model, keras.optimizers.SGD(0.1),
        ...                           loss_fn=fw.train.squared_error)
        >>> x, y = np.array([[1., 2.], [3., 4.]], 'float32'), np.zeros((2, 1), 'float32')
        >>> mask = np.array([True, False])   # the second row pads the batch
        >>> tf.function(eval_step_fn(spec))(((x, y), mask)).numpy()   # 3 x 3 on the first row only
        array([9., 1., 1., 0., 0., 0.], dtype=float32)

        The columns are `eval_sums`': loss sum, count, weight sum, then the three checks.
    """
    names = list(spec.metric_fns)
    width = eval_sums.width(len(names))

    def step(batch: Any) -> tf.Tensor:
        _, mask = batch
        if mask.shape[0]:  # static and non-empty: every batch of a single-host run
            return sums(batch)
        # Several workers: one that has run out of batches gets empty ones while the
        # others finish, and some CPU kernels (oneDNN's batch norm) fail on 0 rows.
        return tf.cond(tf.size(mask) > 0, lambda: sums(batch), lambda: tf.zeros([width]))

    def sums(batch: Any) -> tf.Tensor:
        element, mask = batch
        features, labels, weights = inputs.unpack(element)
        outputs = _float32(spec.model(features, training=False))
        values = [spec.loss_fn(labels, outputs)]
        values += [spec.metric_fns[name](labels, outputs) for name in names]
        ones = tf.ones_like(mask, tf.float32)
        weight = ones if weights is None else _weighted(ones, weights)
        # where, not multiply: a NaN on a padding row must not leak into the sum.
        sums = [tf.reduce_sum(tf.where(mask, weight * tf.cast(v, tf.float32), 0.0))
                for v in values]
        count = tf.reduce_sum(tf.cast(mask, tf.float32))

        def masked_count(rows: tf.Tensor | None) -> tf.Tensor:
            if rows is None:
                return tf.constant(0.0)
            return tf.reduce_sum(tf.cast(tf.logical_and(mask, rows), tf.float32))

        checks = [masked_count(tf.logical_not(tf.math.is_finite(
                      tf.cast(values[0], tf.float32)))),
                  masked_count(_non_finite_rows(features)),
                  masked_count(_bad_label_rows(labels, outputs))]
        return tf.stack(eval_sums.row(sums, count, tf.reduce_sum(tf.where(mask, weight, 0.0)),
                                      checks))

    return step


def make_eval_loop(strategy: tf.distribute.Strategy, spec: ModelSpec,
                   jit_compile: bool) -> Callable[[Any], tf.Tensor]:
    """Builds ``loop(dist_iterator) -> [steps, eval_sums.width(metrics)]`` masked sums.

    The iterator is created eagerly (``iter(dist_dataset)``): iterating a dataset inside
    the function makes tf.data read its options in graph mode, which warns on every call
    ("To make it possible to preserve tf.data options across serialization boundaries").

    The columns are `eval_sums`' layout; per-step sums leave the device in float32 and
    are added up on the host in float64 (`eval_sums.EvalTotals`).
    """
    step = tf.function(eval_step_fn(spec), jit_compile=jit_compile)

    @tf.function
    def loop(iterator: Any) -> tf.Tensor:
        sums = tf.TensorArray(tf.float32, size=0, dynamic_size=True)
        i = tf.constant(0)
        for batch in iterator:
            per_replica = strategy.run(step, args=(batch,))
            sums = sums.write(i, strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                                                 axis=None))
            i += 1
        return sums.stack()

    return loop


def predict_step_fn(spec: ModelSpec) -> Callable[[Any], Any]:
    """One replica's prediction step: ``(element, mask) -> (predictions, mask)`` (not
    yet compiled).

    Examples:
        >>> model = keras.Sequential([keras.Input((2,)),
        ...                            keras.layers.Dense(1, kernel_initializer='ones')])
        >>> spec = fw.train.ModelSpec(model, keras.optimizers.SGD(0.1),
        ...                           loss_fn=fw.train.squared_error)
        >>> x, y = np.array([[1., 2.], [3., 4.]], 'float32'), np.zeros((2, 1), 'float32')
        >>> predictions, mask = tf.function(predict_step_fn(spec))((x, np.array([True, False])))
        >>> predictions.numpy()[:, 0], mask.numpy()
        (array([3., 7.], dtype=float32), array([ True, False]))
    """
    def step(batch: Any) -> Any:
        element, mask = batch
        features, _, _ = inputs.unpack(element)  # labels and weights are not needed
        predictions = spec.predict_fn(_float32(spec.model(features, training=False)))
        return predictions, mask

    return step


def make_predict_loop(strategy: tf.distribute.Strategy, spec: ModelSpec,
                      jit_compile: bool) -> Callable[[Any], list[Any]]:
    """Builds ``loop(iterator) -> [(predictions, mask) per step]`` in input order.

    Each step's replica results are concatenated in replica order, which is input order
    because the pipeline deals batches to replicas round-robin. One call per step: the
    output structure is the user's, so it is collected on the host rather than in a
    compiled loop.
    """
    step = tf.function(predict_step_fn(spec), jit_compile=jit_compile)

    @tf.function
    def predict_step(iterator: Any) -> Any:
        out = strategy.run(step, args=(next(iterator),))
        return tf.nest.map_structure(
            lambda t: tf.concat(strategy.experimental_local_results(t), axis=0), out)

    def loop(iterator: Any) -> list[Any]:
        results = []
        while True:
            try:
                results.append(predict_step(iterator))
            except (tf.errors.OutOfRangeError, StopIteration):
                return results

    return loop
