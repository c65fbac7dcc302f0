"""Model functions: what to train (model, optimizer, loss, metrics, predictions).

A *model function* takes ``params`` and returns a `ModelSpec`. The estimator calls it once,
inside the distribution strategy's scope and under the precision policy, so every variable
it creates is mirrored across replicas and layers compute in the right dtype.

``params`` holds ``'batch_size'`` (per replica), ``'global_batch_size'``,
``'num_replicas'``, ``'seed'``, ``'mode'`` (``'train'``, ``'eval'`` or ``'predict'``) and
``'precision'``.

Losses and metrics are *per example*: each returns a float32 vector of shape ``[B]``. The
estimator reduces them itself, which is what lets it (a) make the update independent of
the replica count and (b) mask out padding rows so evaluation is exact.

Classification::

    model_func = fw.train.get_clf_model_func(build_nn, opt_func, reduction='mean')

Regression (mean squared error, e.g. the time-series tutorial)::

    model_func = fw.train.get_reg_model_func(build_nn, opt_func)

Your own loss, metrics or several outputs: write the function yourself::

    def model_func(params):
        model = build_two_headed_net()            # outputs {'cls': logits, 'box': [B, 4]}

        def loss_fn(labels, outputs):             # labels {'cls': [B], 'box': [B, 4]}
            ce = fw.train.sparse_softmax_cross_entropy(labels['cls'], outputs['cls'])
            return ce + fw.train.squared_error(labels['box'], outputs['box'])

        return fw.train.ModelSpec(
            model=model, optimizer=opt_func(), loss_fn=loss_fn,
            metric_fns={'accuracy': lambda y, out: fw.train.accuracy(y['cls'], out['cls'])},
            predict_fn=lambda out: {'class': tf.argmax(out['cls'], -1), 'box': out['box']})
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

REDUCTIONS = ("mean", "sum")

PerExampleFn = Callable[[Any, Any], tf.Tensor]


def _identity(outputs: Any) -> Any:
    return outputs


@dataclasses.dataclass
class ModelSpec:
    """Everything the estimator needs to train, evaluate and serve one model.

    Attributes:
        model: a Keras model; its outputs should be float32 (a final float32 layer, or
            the estimator casts them).
        optimizer: a fresh Keras 3 optimizer, e.g. from ``opt_func()``. The estimator
            wraps it in a ``LossScaleOptimizer`` under float16.
        loss_fn: ``(labels, outputs) -> [B]`` float32 per-example loss.
        metric_fns: name -> ``(labels, outputs) -> [B]`` per-example values; `evaluate`
            reports the mean of each over every example.
        predict_fn: ``outputs -> predictions`` (a tensor or a dict of tensors, each
            with a leading batch dimension). Defaults to the raw outputs.
        reduction: ``'mean'`` (sum of per-example losses / global batch size) or
            ``'sum'`` (global sum). Either way the update is the same on 1 or 8 replicas.

    Example:
        >>> spec = ModelSpec(model, keras.optimizers.SGD(0.1),
        ...                  loss_fn=squared_error, metric_fns={'mae': absolute_error})
    """

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    loss_fn: PerExampleFn
    metric_fns: dict[str, PerExampleFn] = dataclasses.field(default_factory=dict)
    predict_fn: Callable[[Any], Any] = _identity
    reduction: str = "mean"

    def __post_init__(self) -> None:
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"reduction={self.reduction!r} must be one of {REDUCTIONS}")
        if not isinstance(self.model, keras.Model):
            raise ValueError(f"model={type(self.model).__name__} must be a keras.Model; "
                             "build it with keras layers (fw.Sequential, keras.Model(...))")
        if not callable(self.loss_fn):
            raise ValueError(f"loss_fn={self.loss_fn!r} must be callable (labels, outputs)")
        if "loss" in self.metric_fns:
            raise ValueError("metric_fns must not contain 'loss': the estimator reports "
                             "the loss itself; rename the metric")


# --------------------------------------------------------------------------- per-example fns


def _check_labels_eagerly(labels: tf.Tensor, num_classes: int) -> None:
    """Eager calls (the estimator's input check) get a clear error for bad labels."""
    if not tf.executing_eagerly() or tf.size(labels) == 0:
        return
    low, high = int(tf.reduce_min(labels)), int(tf.reduce_max(labels))
    if low < 0 or high >= num_classes:
        bad = low if low < 0 else high
        raise ValueError(f"labels must lie in [0, {num_classes}) for a model with "
                         f"{num_classes} outputs, but a label is {bad}; check the labels "
                         "or the number of classes of the last layer")


def _check_whole_eagerly(labels: tf.Tensor) -> None:
    """Float class ids (0.5, 1.5) would be truncated to 0 and 1 and train silently."""
    if not labels.dtype.is_floating or not tf.executing_eagerly() or tf.size(labels) == 0:
        return
    values = labels.numpy().ravel()
    odd = values[values != np.floor(values)]
    if odd.size:
        raise ValueError(
            f"labels must be class ids (whole numbers), but they are {labels.dtype.name} "
            f"and {odd.size} of the first {values.size} are not whole (e.g. {odd[0]:g}); "
            "a classifier would truncate them. Give integer class ids (y.astype('int32')) "
            "after checking the data, or for continuous targets use "
            "fw.train.get_reg_model_func")


def _sparse_labels(labels: Any, outputs: tf.Tensor) -> tf.Tensor:
    labels = tf.convert_to_tensor(labels)
    if labels.shape.rank == outputs.shape.rank:  # [B, 1] -> [B]
        labels = tf.squeeze(labels, axis=-1)
    _check_whole_eagerly(labels)
    return tf.cast(labels, tf.int32)


def sparse_softmax_cross_entropy(labels: Any, outputs: tf.Tensor,
                                 from_logits: bool = True) -> tf.Tensor:
    """Per-example cross-entropy for integer labels, computed in float32.

    An out-of-range label gives NaN (instead of a silent garbage value on TPU and GPU),
    which the estimator's NaN check then reports; eagerly it raises a ValueError.

    Args:
        labels: integer class ids, shape ``[B]`` or ``[B, 1]``.
        outputs: ``[B, C]`` logits, or probabilities if ``from_logits=False``.
        from_logits: whether `outputs` are logits. Defaults to True.

    Returns:
        ``[B]`` float32 losses.

    Example:
        >>> sparse_softmax_cross_entropy([0], [[2.0, 0.0]])   # log(1 + e^-2) = 0.127
    """
    outputs = tf.cast(outputs, tf.float32)
    labels = _sparse_labels(labels, outputs)
    num_classes = outputs.shape[-1]
    _check_labels_eagerly(labels, num_classes)
    valid = tf.logical_and(labels >= 0, labels < num_classes)
    safe = tf.where(valid, labels, tf.zeros_like(labels))
    if from_logits:
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(safe, outputs)
    else:
        # Clip like Keras does, so a probability of exactly 0 gives a large, finite loss.
        probs = tf.clip_by_value(outputs, 1e-7, 1.0 - 1e-7)
        loss = -tf.math.log(tf.gather(probs, safe, axis=-1, batch_dims=1))
    return tf.where(valid, loss, tf.fill(tf.shape(loss), float("nan")))


def accuracy(labels: Any, outputs: tf.Tensor) -> tf.Tensor:
    """Per-example accuracy (1.0 if argmax of `outputs` equals the label, else 0.0).

    Example:
        >>> accuracy([1, 0], [[0.1, 0.9], [0.2, 0.8]])   # [1.0, 0.0]
    """
    outputs = tf.convert_to_tensor(outputs)
    labels = _sparse_labels(labels, outputs)
    predicted = tf.argmax(outputs, axis=-1, output_type=tf.int32)
    return tf.cast(tf.equal(predicted, labels), tf.float32)


def _per_example_mean(values: tf.Tensor) -> tf.Tensor:
    """Averages every axis but the first, so any output shape gives a [B] vector."""
    values = tf.cast(values, tf.float32)
    if values.shape.rank is not None and values.shape.rank <= 1:
        return values
    return tf.reduce_mean(tf.reshape(values, [tf.shape(values)[0], -1]), axis=1)


def squared_error(labels: Any, outputs: tf.Tensor) -> tf.Tensor:
    """Per-example mean squared error over the non-batch axes, float32, shape ``[B]``.

    Example:
        >>> squared_error([[1.0, 2.0]], [[0.0, 0.0]])   # [(1 + 4) / 2] = [2.5]
    """
    outputs = tf.cast(outputs, tf.float32)
    labels = tf.reshape(tf.cast(labels, tf.float32), tf.shape(outputs))
    return _per_example_mean(tf.math.squared_difference(labels, outputs))


def absolute_error(labels: Any, outputs: tf.Tensor) -> tf.Tensor:
    """Per-example mean absolute error over the non-batch axes, float32, shape ``[B]``."""
    outputs = tf.cast(outputs, tf.float32)
    labels = tf.reshape(tf.cast(labels, tf.float32), tf.shape(outputs))
    return _per_example_mean(tf.abs(labels - outputs))


# --------------------------------------------------------------------------- model functions


def _call_builder(build_nn: Callable[..., keras.Model], params: Mapping[str, Any]):
    """build_nn() is the contract; build_nn(params) if it has a required argument."""
    try:  # a parameter without a default means it wants params
        takes_params = any(p.default is inspect.Parameter.empty and p.kind in (
            p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            for p in inspect.signature(build_nn).parameters.values())
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        takes_params = False
    model = build_nn(params) if takes_params else build_nn()
    if not isinstance(model, keras.Model):
        raise ValueError(f"build_nn returned {type(model).__name__}; it must return a "
                         "keras.Model (e.g. fw.Sequential or keras.Sequential)")
    return model


def _ends_in_softmax(model: keras.Model) -> bool:
    last = model.layers[-1] if getattr(model, "layers", None) else None
    activation = getattr(last, "activation", None)
    return getattr(activation, "__name__", "") == "softmax" or (
        type(last).__name__ == "Softmax")


def _check_opt_func(opt_func: Callable[[], Any]) -> None:
    if not callable(opt_func):
        raise ValueError(f"opt_func={opt_func!r} must be a zero-argument callable returning "
                         "a fresh Keras optimizer, e.g. lambda: keras.optimizers.SGD(0.1) "
                         "or fw.train.sgd_optimizer(lr_func)")


def get_model_func(build_nn: Callable[..., keras.Model], opt_func: Callable[[], Any],
                   loss_fn: PerExampleFn, metric_fns: Mapping[str, PerExampleFn] | None = None,
                   predict_fn: Callable[[Any], Any] = _identity,
                   reduction: str = "mean") -> Callable[[dict], ModelSpec]:
    """Builds a model function from its parts; the general form of the helpers below.

    Args:
        build_nn: ``() -> keras.Model`` (or ``(params) -> keras.Model``).
        opt_func: ``() -> keras optimizer``, called once per estimator.
        loss_fn: ``(labels, outputs) -> [B]`` per-example loss.
        metric_fns: name -> per-example metric. Defaults to none.
        predict_fn: ``outputs -> predictions``. Defaults to the raw outputs.
        reduction: ``'mean'`` or ``'sum'``. Defaults to ``'mean'``.

    Returns:
        ``model_func(params) -> ModelSpec``.

    Example:
        >>> model_func = get_model_func(build_nn, opt_func, squared_error)
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} must be one of {REDUCTIONS}")
    _check_opt_func(opt_func)
    metric_fns = dict(metric_fns or {})

    def model_func(params: dict) -> ModelSpec:
        return ModelSpec(_call_builder(build_nn, params), opt_func(), loss_fn,
                         dict(metric_fns), predict_fn, reduction)

    return model_func


def get_clf_model_func(build_nn: Callable[..., keras.Model], opt_func: Callable[[], Any],
                       reduction: str = "mean",
                       from_logits: bool | None = None) -> Callable[[dict], ModelSpec]:
    """A model function for classification with integer labels.

    Loss: sparse softmax cross-entropy; metric: accuracy; predictions: class
    probabilities (``[B, C]``, float32).

    Args:
        build_nn: ``() -> keras.Model`` ending in ``C`` outputs (or ``(params) -> model``).
        opt_func: ``() -> keras optimizer``, e.g. ``fw.train.sgd_optimizer(lr_func)``.
        reduction: ``'mean'`` or ``'sum'`` over the global batch. Defaults to ``'mean'``.
        from_logits: whether the model outputs logits. Defaults to None: logits unless
            the last layer applies a softmax.

    Returns:
        ``model_func(params) -> ModelSpec``.

    Example:
        >>> model_func = fw.train.get_clf_model_func(build_nn, opt_func, reduction='mean')
        >>> est = fw.train.get_tpu_estimator(100, model_func, work_dir, trn_bs=128)
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} must be one of {REDUCTIONS}")
    _check_opt_func(opt_func)

    def model_func(params: dict) -> ModelSpec:
        model = _call_builder(build_nn, params)
        logits = (not _ends_in_softmax(model)) if from_logits is None else from_logits

        def loss_fn(labels: Any, outputs: tf.Tensor) -> tf.Tensor:
            return sparse_softmax_cross_entropy(labels, outputs, from_logits=logits)

        def predict_fn(outputs: tf.Tensor) -> tf.Tensor:
            outputs = tf.cast(outputs, tf.float32)
            return tf.nn.softmax(outputs) if logits else outputs

        return ModelSpec(model, opt_func(), loss_fn, {"accuracy": accuracy}, predict_fn,
                         reduction)

    return model_func


def get_reg_model_func(build_nn: Callable[..., keras.Model], opt_func: Callable[[], Any],
                       reduction: str = "mean") -> Callable[[dict], ModelSpec]:
    """A model function for regression: mean squared error loss, MAE and MSE metrics.

    Args:
        build_nn: ``() -> keras.Model`` (or ``(params) -> model``).
        opt_func: ``() -> keras optimizer``.
        reduction: ``'mean'`` or ``'sum'``. Defaults to ``'mean'``.

    Returns:
        ``model_func(params) -> ModelSpec``; `evaluate` reports ``'mse'`` and ``'mae'``.

    Example:
        >>> model_func = fw.train.get_reg_model_func(build_nn, lambda: keras.optimizers.Adam())
    """
    return get_model_func(build_nn, opt_func, squared_error,
                          {"mse": squared_error, "mae": absolute_error},
                          reduction=reduction)
