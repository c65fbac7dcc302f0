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
            predict_fn=lambda out: {'class': keras.ops.argmax(out['cls'], -1),
                                    'box': out['box']})

Write these functions with `keras.ops` (as the ones here are): they then run in the
TensorFlow engine's `tf.function` and inside the JAX engine's `jax.jit` alike. They must be
pure functions of their arguments (no Python side effects, no reading of concrete values)
since a compiled step traces them once.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np

from fenwicks import _engine

REDUCTIONS = ("mean", "sum")

PerExampleFn = Callable[[Any, Any], Any]


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

    Examples:
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> spec = ModelSpec(model, keras.optimizers.SGD(0.1),
        ...                  loss_fn=squared_error, metric_fns={'mae': absolute_error})
        >>> spec.reduction
        'mean'
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

    def example_values(self, labels: Any, outputs: Any) -> dict[str, Any]:
        """The per-example loss and metrics of a batch: what an engine's step reduces.

        `outputs` are cast to float32 first (`float32_outputs`). Pure when `loss_fn` and
        `metric_fns` are (those of this module are, in `keras.ops`), so an engine calls it
        inside its compiled step: a `tf.function` or `jax.jit`. The engine weights, masks
        (padding rows of exact evaluation, with ``where``: a NaN there must not leak) and
        reduces the values: ``'mean'`` divides the loss sum by the global batch size.

        Returns:
            ``{'loss': [B], <metric>: [B], ...}`` in `metric_fns` order, float32.

        Examples:
            >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            >>> spec = ModelSpec(model, keras.optimizers.SGD(0.1), loss_fn=squared_error,
            ...                  metric_fns={'mae': absolute_error})
            >>> features, labels = np.ones((4, 3), 'float32'), np.zeros((4, 1), 'float32')
            >>> values = spec.example_values(labels, spec.model(features, training=False))
            >>> {name: tuple(value.shape) for name, value in values.items()}   # [B] each
            {'loss': (4,), 'mae': (4,)}
        """
        outputs = float32_outputs(outputs)
        values = {"loss": self.loss_fn(labels, outputs)}
        for name, metric in self.metric_fns.items():
            values[name] = metric(labels, outputs)
        return {name: keras.ops.cast(v, "float32") for name, v in values.items()}


def float32_outputs(outputs: Any) -> Any:
    """`outputs` (a tensor or a structure of them) with floating values cast to float32.

    Mixed-precision models may emit bfloat16/float16; losses are computed in float32.

    Examples:
        >>> out = float32_outputs({'cls': keras.ops.ones((2, 3), 'bfloat16'),
        ...                        'id': keras.ops.ones((2,), 'int32')})   # ids stay ints
        >>> {name: keras.backend.standardize_dtype(v.dtype) for name, v in out.items()}
        {'cls': 'float32', 'id': 'int32'}
    """
    def cast(value: Any) -> Any:
        dtype = keras.backend.standardize_dtype(value.dtype)
        return keras.ops.cast(value, "float32") if "float" in dtype else value

    return keras.tree.map_structure(cast, outputs)


# --------------------------------------------------------------------------- per-example fns


def _concrete(values: Any) -> np.ndarray | None:
    """`values` as numpy if they are concrete (eager), None while a step is being traced.

    Tracing is a `tf.function` on TensorFlow and `jax.jit` on JAX: their values exist
    only when the compiled step runs.
    """
    if _engine.backend_facts().is_symbolic(values):
        return None
    return keras.ops.convert_to_numpy(values)


def _check_labels_eagerly(labels: Any, num_classes: int) -> None:
    """Eager calls (the estimator's input check) get a clear error for bad labels."""
    values = _concrete(labels)
    if values is None or values.size == 0:
        return
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= num_classes:
        bad = low if low < 0 else high
        raise ValueError(f"labels must lie in [0, {num_classes}) for a model with "
                         f"{num_classes} outputs, but a label is {bad}; check the labels "
                         "or the number of classes of the last layer")


def _check_whole_eagerly(labels: Any) -> None:
    """Float class ids (0.5, 1.5) would be truncated to 0 and 1 and train silently."""
    if "float" not in keras.backend.standardize_dtype(labels.dtype):
        return
    values = _concrete(labels)
    if values is None or values.size == 0:
        return
    values = values.ravel()
    odd = values[values != np.floor(values)]
    if odd.size:
        raise ValueError(
            f"labels must be class ids (whole numbers), but they are "
            f"{keras.backend.standardize_dtype(labels.dtype)} and {odd.size} of the first "
            f"{values.size} are not whole (e.g. {odd[0]:g}); a classifier would truncate "
            "them. Give integer class ids (y.astype('int32')) after checking the data, or "
            "for continuous targets use fw.train.get_reg_model_func")


def _sparse_labels(labels: Any, outputs: Any) -> Any:
    labels = keras.ops.convert_to_tensor(labels)
    if len(labels.shape) == len(outputs.shape):  # [B, 1] -> [B]
        labels = keras.ops.squeeze(labels, axis=-1)
    _check_whole_eagerly(labels)
    return keras.ops.cast(labels, "int32")


def sparse_softmax_cross_entropy(labels: Any, outputs: Any, from_logits: bool = True) -> Any:
    """Per-example cross-entropy for integer labels, computed in float32.

    An out-of-range label gives NaN (instead of a silent garbage value on TPU and GPU),
    which the estimator's NaN check then reports; eagerly it raises a ValueError.

    Args:
        labels: integer class ids, shape ``[B]`` or ``[B, 1]``.
        outputs: ``[B, C]`` logits, or probabilities if ``from_logits=False``.
        from_logits: whether `outputs` are logits. Defaults to True.

    Returns:
        ``[B]`` float32 losses.

    Examples:
        >>> sparse_softmax_cross_entropy([0], [[2.0, 0.0]]).numpy().round(3)  # log(1 + e^-2)
        array([0.127], dtype=float32)
    """
    ops = keras.ops
    outputs = ops.cast(outputs, "float32")
    labels = _sparse_labels(labels, outputs)
    num_classes = outputs.shape[-1]
    _check_labels_eagerly(labels, num_classes)
    valid = ops.logical_and(labels >= 0, labels < num_classes)
    safe = ops.where(valid, labels, ops.zeros_like(labels))
    if from_logits:
        # On TensorFlow: tf.nn.sparse_softmax_cross_entropy_with_logits, as before. `+ 0.0`
        # (exact) makes a new tensor: given a Softmax's output, Keras's TensorFlow op would
        # otherwise take that softmax's input instead (its `_keras_logits`), which the
        # JAX op does not; the outputs are what the caller says they are on both.
        loss = ops.sparse_categorical_crossentropy(safe, outputs + 0.0, from_logits=True)
    else:
        # Clip like Keras does, so a probability of exactly 0 gives a large, finite loss
        # (but no renormalisation: Keras's op divides by the sum first).
        probs = ops.clip(outputs, 1e-7, 1.0 - 1e-7)
        loss = -ops.log(ops.take_along_axis(probs, ops.expand_dims(safe, -1), axis=-1)[:, 0])
    return ops.where(valid, loss, ops.full_like(loss, float("nan")))


def accuracy(labels: Any, outputs: Any) -> Any:
    """Per-example accuracy (1.0 if argmax of `outputs` equals the label, else 0.0).

    Examples:
        >>> accuracy([1, 0], [[0.1, 0.9], [0.2, 0.8]]).numpy()
        array([1., 0.], dtype=float32)
    """
    outputs = keras.ops.convert_to_tensor(outputs)
    labels = _sparse_labels(labels, outputs)
    predicted = keras.ops.cast(keras.ops.argmax(outputs, axis=-1), "int32")
    return keras.ops.cast(keras.ops.equal(predicted, labels), "float32")


def _per_example_mean(values: Any) -> Any:
    """Averages every axis but the first, so any output shape gives a [B] vector."""
    values = keras.ops.cast(values, "float32")
    # A tf.TensorShape may have an unknown rank; then the reshape below handles any.
    rank = getattr(values.shape, "rank", None) if hasattr(values.shape, "rank") \
        else len(values.shape)
    if rank is not None and rank <= 1:
        return values
    # Flattened, then one mean: the order of the sum the TensorFlow version had.
    flat = keras.ops.reshape(values, (keras.ops.shape(values)[0], -1))
    return keras.ops.mean(flat, axis=1)


def _float32_pair(labels: Any, outputs: Any) -> tuple[Any, Any]:
    outputs = keras.ops.cast(outputs, "float32")
    labels = keras.ops.cast(keras.ops.convert_to_tensor(labels), "float32")
    return keras.ops.reshape(labels, keras.ops.shape(outputs)), outputs


def squared_error(labels: Any, outputs: Any) -> Any:
    """Per-example mean squared error over the non-batch axes, float32, shape ``[B]``.

    Examples:
        >>> squared_error([[1.0, 2.0]], [[0.0, 0.0]]).numpy()   # [(1 + 4) / 2]
        array([2.5], dtype=float32)
    """
    labels, outputs = _float32_pair(labels, outputs)
    return _per_example_mean(keras.ops.square(labels - outputs))


def absolute_error(labels: Any, outputs: Any) -> Any:
    """Per-example mean absolute error over the non-batch axes, float32, shape ``[B]``."""
    labels, outputs = _float32_pair(labels, outputs)
    return _per_example_mean(keras.ops.abs(labels - outputs))


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

    Examples:
        >>> build_nn = lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> opt_func = fw.train.sgd_optimizer(0.01)
        >>> model_func = get_model_func(build_nn, opt_func, squared_error)
        >>> model_func({'batch_size': 8}).loss_fn is squared_error
        True
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

    Examples:
        >>> build_nn = lambda: fw.models.mnist_net(input_shape=(8, 8, 1))
        >>> opt_func = fw.train.adam_optimizer(1e-3)
        >>> model_func = fw.train.get_clf_model_func(build_nn, opt_func, reduction='mean')
        >>> est = fw.train.get_tpu_estimator(100, model_func, 'runs/digits', trn_bs=128)
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} must be one of {REDUCTIONS}")
    _check_opt_func(opt_func)

    def model_func(params: dict) -> ModelSpec:
        model = _call_builder(build_nn, params)
        logits = (not _ends_in_softmax(model)) if from_logits is None else from_logits

        def loss_fn(labels: Any, outputs: Any) -> Any:
            return sparse_softmax_cross_entropy(labels, outputs, from_logits=logits)

        def predict_fn(outputs: Any) -> Any:
            outputs = keras.ops.cast(outputs, "float32")
            return keras.ops.softmax(outputs) if logits else outputs

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

    Examples:
        >>> build_nn = lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> model_func = fw.train.get_reg_model_func(build_nn, lambda: keras.optimizers.Adam())
        >>> sorted(model_func({'batch_size': 8}).metric_fns)
        ['mae', 'mse']
    """
    return get_model_func(build_nn, opt_func, squared_error,
                          {"mse": squared_error, "mae": absolute_error},
                          reduction=reduction)
