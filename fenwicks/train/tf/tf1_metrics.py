"""TF1 metrics and losses in a model_fn, as per-example values, so evaluation stays exact.

Inside a model_fn (`fenwicks.train.tf._model_fn.tf1_scope`), ``tf.compat.v1.metrics.
accuracy / mean / mean_squared_error / mean_absolute_error / root_mean_squared_error /
recall_at_k / precision / recall`` and Keras mean-type metrics' ``update_state`` give a
`MetricTerm` (per-example numerators and denominators), and ``tf.compat.v1.losses.*``
record their per-example values beside the scalar (`recording_loss`), so the evaluation
loss of a padded last batch leaves the padding rows out (`example_losses`).

Examples:
    >>> term = V1_METRICS["accuracy"](tf.constant([1, 2]), tf.constant([1, 0]))[0]
    >>> float(tf.reduce_sum(term.numerator) / tf.reduce_sum(term.denominator))
    0.5
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from fenwicks.train.tf.tf1_config import ModelFnError, warn_once

# --------------------------------------------------------------------------- metric terms


@dataclasses.dataclass
class MetricTerm:
    """A metric as ``post(sum(numerator) / sum(denominator))`` over every example."""

    numerator: tf.Tensor  # [B]
    denominator: tf.Tensor  # [B]
    post: str = "none"  # 'none' or 'sqrt'


def _per_example(values: Any, weights: Any) -> MetricTerm:
    """Per-example weighted sums over every non-batch axis."""
    values = tf.cast(values, tf.float32)
    weights = tf.ones_like(values) if weights is None else tf.cast(weights, tf.float32)
    if weights.shape.rank is not None and values.shape.rank is not None:
        while weights.shape.rank < values.shape.rank:
            weights = tf.expand_dims(weights, -1)
    weights = tf.broadcast_to(weights, tf.shape(values))
    if values.shape.rank == 0:
        return MetricTerm(values * weights, weights)
    flat = [tf.shape(values)[0], -1]
    return MetricTerm(tf.reduce_sum(tf.reshape(values * weights, flat), 1),
                      tf.reduce_sum(tf.reshape(weights, flat), 1))


def _same(labels: Any, predictions: Any) -> tf.Tensor:
    labels, predictions = tf.convert_to_tensor(labels), tf.convert_to_tensor(predictions)
    if labels.dtype.is_integer and predictions.dtype.is_integer:
        labels, predictions = tf.cast(labels, tf.int64), tf.cast(predictions, tf.int64)
    else:
        predictions = tf.cast(predictions, labels.dtype)
    if labels.shape.rank == predictions.shape.rank + 1 and labels.shape[-1] == 1:
        labels = tf.squeeze(labels, -1)
    return tf.cast(tf.equal(labels, predictions), tf.float32)


def _pair(term: MetricTerm) -> tuple[MetricTerm, MetricTerm]:
    return term, term  # TF1's (value, update_op)


def _accuracy(labels, predictions, weights=None, *args, **kwargs):
    return _pair(_per_example(_same(labels, predictions), weights))


def _mean(values, weights=None, *args, **kwargs):
    values = tf.convert_to_tensor(values)
    if values.shape.rank == 0 and weights is None:
        # tf.metrics.mean(tf.reduce_mean(per_example)): TF1 weighted each batch's mean
        # alike, so a padded last batch counted its padding rows; the graph shows the
        # per-example values, which make it exact.
        per_example = example_losses(values, {}, None)
        if per_example is not None:
            return _pair(_per_example(per_example, None))
        warn_once("metric_mean_scalar", "eval_metrics' tf.compat.v1.metrics.mean of a "
                  "scalar whose per-example values Fenwicks cannot see counts a padded "
                  "last batch at that batch's mean, so it is not exact: pass the "
                  "per-example [batch] values (tf.compat.v1.metrics.mean(per_example))")
    return _pair(_per_example(values, weights))


def _squared(labels, predictions, weights=None, *args, **kwargs):
    diff = tf.cast(predictions, tf.float32) - tf.cast(labels, tf.float32)
    return _pair(_per_example(tf.square(diff), weights))


def _absolute(labels, predictions, weights=None, *args, **kwargs):
    diff = tf.cast(predictions, tf.float32) - tf.cast(labels, tf.float32)
    return _pair(_per_example(tf.abs(diff), weights))


def _rmse(labels, predictions, weights=None, *args, **kwargs):
    term = _squared(labels, predictions, weights)[0]
    return _pair(dataclasses.replace(term, post="sqrt"))


def _recall_at_k(labels, predictions, k, class_id=None, weights=None, *args, **kwargs):
    if class_id is not None:
        raise ModelFnError("tf.compat.v1.metrics.recall_at_k(class_id=...) is not "
                           "supported; leave class_id=None (one label per example)")
    # TF1's recall_at_k takes tf.nn.top_k's k indices, which break ties towards the lower
    # class index: in_top_k would count every tied class as a hit (a collapsed model with
    # all logits equal would score 1.0).
    labels = tf.reshape(tf.cast(labels, tf.int32), [-1, 1])
    top = tf.math.top_k(tf.cast(predictions, tf.float32), k).indices
    hit = tf.reduce_any(tf.equal(top, labels), axis=1)
    return _pair(_per_example(tf.cast(hit, tf.float32), weights))


def _binary(labels, predictions, weights, count_predicted: bool):
    labels = tf.cast(tf.cast(labels, tf.bool), tf.float32)
    predictions = tf.cast(tf.cast(predictions, tf.bool), tf.float32)
    term = _per_example(labels * predictions, weights)
    total = _per_example(predictions if count_predicted else labels, weights)
    return _pair(MetricTerm(term.numerator, total.numerator))


def _precision(labels, predictions, weights=None, *args, **kwargs):
    return _binary(labels, predictions, weights, count_predicted=True)


def _recall(labels, predictions, weights=None, *args, **kwargs):
    return _binary(labels, predictions, weights, count_predicted=False)


V1_METRICS = {"accuracy": _accuracy, "mean": _mean, "mean_squared_error": _squared,
              "mean_absolute_error": _absolute, "root_mean_squared_error": _rmse,
              "recall_at_k": _recall_at_k, "precision": _precision, "recall": _recall}


def unsupported_metric(name: str) -> Callable[..., Any]:
    def metric(*args: Any, **kwargs: Any) -> Any:
        raise ModelFnError(
            f"tf.compat.v1.metrics.{name} is not supported in eval_metrics: Fenwicks "
            "evaluates exactly by summing per-example values over every example, and "
            f"{name} is not a ratio of such sums. Supported: {', '.join(sorted(V1_METRICS))}"
            " and Keras metrics derived from keras.metrics.Mean (Accuracy, "
            "SparseCategoricalAccuracy, MeanSquaredError, ...)")
    return metric


# TF1 metrics that are not a ratio of per-example sums: refused by name in metric_fn.
UNSUPPORTED_METRICS = ("auc", "precision_at_k", "mean_per_class_accuracy", "mean_iou",
                       "sparse_average_precision_at_k", "false_negatives", "false_positives",
                       "true_positives", "true_negatives", "percentage_below",
                       "mean_cosine_distance", "mean_relative_error", "mean_tensor",
                       "sensitivity_at_specificity", "specificity_at_sensitivity",
                       "precision_at_thresholds", "recall_at_thresholds",
                       "average_precision_at_k")


def keras_mean_update(self: keras.metrics.Mean, values: Any,
                       sample_weight: Any = None) -> None:
    """Replaces `keras.metrics.Mean.update_state` (under every mean-type Keras metric)
    inside metric_fn: records the per-example values instead of adding them up."""
    self.fenwicks_metric_term = _per_example(values, sample_weight)


# --------------------------------------------------------------------------- v1 losses

# Reductions whose scalar is the mean of the per-example values when weights are 1.
MEAN_REDUCTIONS = (tf.compat.v1.losses.Reduction.SUM_BY_NONZERO_WEIGHTS,
                    tf.compat.v1.losses.Reduction.MEAN,
                    tf.compat.v1.losses.Reduction.SUM_OVER_BATCH_SIZE,
                    tf.compat.v1.losses.Reduction.SUM_OVER_NONZERO_WEIGHTS)
V1_LOSSES = ("sparse_softmax_cross_entropy", "softmax_cross_entropy", "sigmoid_cross_entropy",
             "mean_squared_error", "absolute_difference", "log_loss", "hinge_loss",
             "huber_loss")


def _example_means(values: tf.Tensor) -> tf.Tensor | None:
    if values.shape.rank is None or values.shape.rank == 0:
        return None
    if values.shape.rank == 1:
        return values
    return tf.reduce_mean(tf.reshape(values, [tf.shape(values)[0], -1]), axis=1)


def recording_loss(original: Callable[..., Any], record: Any) -> Callable[..., Any]:
    """A `tf.compat.v1.losses` function that also records its per-example values, and
    its scalar in ``record.v1_losses`` if it goes to TF1's ``LOSSES`` collection (the
    graph's collection would also hold the other replicas' losses, traced in the same
    graph)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def loss(*args: Any, **kwargs: Any) -> Any:
        scalar = original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        if bound.arguments.get("loss_collection") == tf.compat.v1.GraphKeys.LOSSES:
            record.v1_losses.append(scalar)
        weights, reduction = bound.arguments.get("weights"), bound.arguments.get("reduction")
        unweighted = isinstance(weights, (int, float)) and weights == 1
        if unweighted and reduction in MEAN_REDUCTIONS and tf.is_symbolic_tensor(scalar):
            values = original(**dict(bound.arguments, reduction="none", loss_collection=None))
            per_example = _example_means(tf.cast(values, tf.float32))
            if per_example is not None:
                record.losses[scalar.ref()] = per_example
        return scalar

    return loss


def example_losses(loss: tf.Tensor, recorded: dict[Any, tf.Tensor],
                   rows: int | None, constants: set[Any] | frozenset = frozenset()
                   ) -> tf.Tensor | None:
    """The per-example ``[B]`` values whose mean is the scalar `loss`, if the graph shows
    them: a recorded `tf.compat.v1.losses` value, or ``reduce_mean`` of a ``[B, ...]``
    tensor (BERT's ``tf.reduce_mean(per_example_loss)``), through identities; plus a
    value the same for every example (`constants`: the regularisation loss a model_fn
    added, ``loss + tf.losses.get_regularization_loss()``)."""
    tensor = loss
    for _ in range(16):
        if not tf.is_symbolic_tensor(tensor):
            return None
        if tensor.ref() in recorded:
            return recorded[tensor.ref()]
        op = tensor.op
        if op.type in ("AddV2", "Add", "AddN") and tensor.shape.rank == 0:
            # loss + regularisation (get_total_loss: add_n of the losses and them)
            inputs = list(op.inputs)
            varying = [i for i, t in enumerate(inputs)
                       if not _same_for_every_example(t, constants)]
            if len(varying) != 1:
                return None
            per_example = example_losses(inputs[varying[0]], recorded, rows, constants)
            if per_example is None:
                return None
            return per_example + tf.add_n([tf.cast(t, tf.float32)
                                           for i, t in enumerate(inputs) if i != varying[0]])
        if op.type == "Identity" or (op.type == "Mean" and op.inputs[0].shape.rank == 0):
            tensor = op.inputs[0]
            continue
        if op.type == "Mean" and tensor.shape.rank == 0:  # every axis reduced
            values = op.inputs[0]
            if rows is not None and values.shape[0] not in (None, rows):
                return None
            return _example_means(tf.cast(values, tf.float32))
        return None
    return None


def _same_for_every_example(tensor: tf.Tensor, constants: set[Any] | frozenset,
                            depth: int = 0) -> bool:
    """Whether a scalar is built only from `constants` and constant ops (the sum of the
    regularisation values, ``tf.add_n(get_regularization_losses())``)."""
    if depth > 8 or not tf.is_symbolic_tensor(tensor) or tensor.shape.rank != 0:
        return False
    if tensor.ref() in constants or tensor.op.type == "Const":
        return True
    return tensor.op.type in ("AddN", "AddV2", "Add", "Mul", "Identity", "Cast") and all(
        _same_for_every_example(t, constants, depth + 1) for t in tensor.op.inputs)


def recording_keras_loss(original: Callable[..., Any], record: Any) -> Callable[..., Any]:
    """`keras.losses.Loss.__call__` in a model_fn: a mean-reduced, unweighted Keras loss
    object also records its per-example values, as `recording_loss` does for TF1's."""

    def __call__(self: keras.losses.Loss, y_true: Any, y_pred: Any,  # noqa: N807
                 sample_weight: Any = None) -> Any:
        scalar = original(self, y_true, y_pred, sample_weight)
        mean = self.reduction in ("sum_over_batch_size", "mean")
        if sample_weight is None and mean and tf.is_symbolic_tensor(scalar):
            def cast(values: Any) -> Any:
                return tf.nest.map_structure(
                    lambda v: tf.cast(tf.convert_to_tensor(v), self.dtype), values)
            per_example = _example_means(tf.cast(self.call(cast(y_true), cast(y_pred)),
                                                 tf.float32))
            if per_example is not None:
                record.losses[scalar.ref()] = per_example
        return scalar

    return __call__

