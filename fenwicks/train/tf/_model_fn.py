"""Running a TPUEstimator ``model_fn(features, labels, mode, params)`` in TensorFlow 2.

A TPUEstimator model_fn builds its network on every call (``keras.layers.Dense(10)(x)``
inside the function) and relied on TF1's graph to share the variables between calls. Here
the first calls record every top-level Keras object the model_fn creates (layers, models,
optimizers, metrics), and later calls get the same objects back in the same order, per
class: one set of variables for train, eval and predict, and no variable is ever created
inside a later `tf.function` trace (TensorFlow 2 forbids that).

While the model_fn runs, a few TF1 names are replaced by recorders, because their TF1
implementations need a graph collection TensorFlow 2 no longer has:

- ``tf.compat.v1.metrics.accuracy / mean / mean_squared_error / mean_absolute_error /
  root_mean_squared_error / recall_at_k / precision / recall`` (and Keras mean-type
  metrics' ``update_state``) record per-example values, so evaluation stays exact;
- ``tf.compat.v1.train.Optimizer.minimize`` records the optimizer, converted to Keras
  (`convert_v1_optimizer`); ``get_global_step`` / ``get_or_create_global_step`` give the
  optimizer's step;
- ``tf.compat.v1.train.init_from_checkpoint`` records a warm start;
- ``tf.compat.v1.losses.*`` record their per-example values beside the scalar, so the
  evaluation loss of a padded last batch leaves the padding rows out;
- ``tf.compat.v1.train.Optimizer`` subclasses with their own ``apply_gradients`` are
  recorded and run by the engine (`V1OptimizerAdapter`); ``tf.gradients`` of
  ``tf.compat.v1.trainable_variables()`` gives zeros in the model_fn (the engine computes
  the gradients), ``tf.clip_by_global_norm`` records its norm, ``global_step.assign``
  does nothing (the engine counts steps);
- ``tf.compat.v1.get_variable`` makes (on the first calls) or hands back a variable by its
  TF1 scope name (BERT's ``output_weights``); inside a TF1 optimizer's own
  ``apply_gradients`` (BERT's ``AdamWeightDecayOptimizer``) it raises, naming the Keras
  replacement.

A Keras object created with other arguments in another mode (``Dropout(0.9 if training
else 0.0)``) is that mode's own object, so each mode runs with its own arguments; one with
weights must be the same in every mode (`Replay.check_variants`).

The patches are undone when the model_fn returns; the model_fn runs on one thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

import keras
import tensorflow as tf

from fenwicks import _tf_internals

TF2_INCOMPATIBLE = (
    "model_fn used {what}, which needs TF1's graph and variable scopes; TensorFlow 2 has "
    "neither, so its variables could not be shared between train, eval and predict. Build "
    "the network from Keras layers (keras.layers.Dense(...)(x), a keras.Model) inside the "
    "model_fn instead; see tutorials/PORTING.md, 'TPUEstimator programs'")


class ModelFnError(ValueError):
    """A model_fn that cannot run in TensorFlow 2, or returned an unusable spec."""


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


def _unsupported_metric(name: str) -> Callable[..., Any]:
    def metric(*args: Any, **kwargs: Any) -> Any:
        raise ModelFnError(
            f"tf.compat.v1.metrics.{name} is not supported in eval_metrics: Fenwicks "
            "evaluates exactly by summing per-example values over every example, and "
            f"{name} is not a ratio of such sums. Supported: {', '.join(sorted(V1_METRICS))}"
            " and Keras metrics derived from keras.metrics.Mean (Accuracy, "
            "SparseCategoricalAccuracy, MeanSquaredError, ...)")
    return metric


def _keras_mean_update(self: keras.metrics.Mean, values: Any,
                       sample_weight: Any = None) -> None:
    """Replaces `keras.metrics.Mean.update_state` (under every mean-type Keras metric)
    inside metric_fn: records the per-example values instead of adding them up."""
    self.fenwicks_metric_term = _per_example(values, sample_weight)


# --------------------------------------------------------------------------- v1 losses

# Reductions whose scalar is the mean of the per-example values when weights are 1.
_MEAN_REDUCTIONS = (tf.compat.v1.losses.Reduction.SUM_BY_NONZERO_WEIGHTS,
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


def _recording_loss(original: Callable[..., Any], record: CallRecord) -> Callable[..., Any]:
    """A `tf.compat.v1.losses` function that also records its per-example values."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def loss(*args: Any, **kwargs: Any) -> Any:
        scalar = original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        weights, reduction = bound.arguments.get("weights"), bound.arguments.get("reduction")
        unweighted = isinstance(weights, (int, float)) and weights == 1
        if unweighted and reduction in _MEAN_REDUCTIONS and tf.is_symbolic_tensor(scalar):
            values = original(**dict(bound.arguments, reduction="none", loss_collection=None))
            per_example = _example_means(tf.cast(values, tf.float32))
            if per_example is not None:
                record.losses[scalar.ref()] = per_example
        return scalar

    return loss


def example_losses(loss: tf.Tensor, recorded: dict[Any, tf.Tensor],
                   rows: int | None) -> tf.Tensor | None:
    """The per-example ``[B]`` values whose mean is the scalar `loss`, if the graph shows
    them: a recorded `tf.compat.v1.losses` value, or ``reduce_mean`` of a ``[B, ...]``
    tensor (BERT's ``tf.reduce_mean(per_example_loss)``), through identities."""
    tensor = loss
    for _ in range(16):
        if not tf.is_symbolic_tensor(tensor):
            return None
        if tensor.ref() in recorded:
            return recorded[tensor.ref()]
        op = tensor.op
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


# --------------------------------------------------------------------------- v1 optimizers


@dataclasses.dataclass
class V1Minimize:
    """What ``optimizer.minimize(loss, global_step)`` asked for."""

    optimizer: Any
    learning_rate: Any


def _unwrap(optimizer: Any) -> Any:
    # A CrossShardOptimizer all-reduces gradients: Fenwicks always does.
    return _tf_internals.unwrap_cross_shard(optimizer)


def convert_v1_optimizer(optimizer: Any, clip_norm: float | None = None
                         ) -> keras.optimizers.Optimizer:
    """The Keras 3 optimizer that makes the same updates as a `tf.compat.v1` one.

    GradientDescent is exactly SGD, and Adam is Keras's Adam (both use TF1's
    epsilon-hat form). Momentum matches exactly at a constant learning rate; under a
    schedule TF1 scaled the accumulated gradients by the current rate, Keras the new one.
    A TF1 optimizer subclass with its own ``apply_gradients`` (BERT's
    AdamWeightDecayOptimizer) runs that code itself (`V1OptimizerAdapter`), after
    ``tf.clip_by_global_norm``'s clipping (`clip_norm`) if the model_fn asked for it.

    Raises:
        ModelFnError: for another optimizer class, naming the Keras one to pass instead.
    """
    optimizer = _unwrap(optimizer)
    name = type(optimizer).__name__
    if _custom_apply(optimizer):
        return V1OptimizerAdapter(optimizer, global_clipnorm=clip_norm)
    lr = _tf_internals.v1_optimizer_arg(optimizer, "learning_rate")
    start = float(lr) if isinstance(lr, (int, float)) else 0.0  # a tensor: set per step
    if name == "GradientDescentOptimizer":
        return keras.optimizers.SGD(start)
    if name == "MomentumOptimizer":
        arg = functools.partial(_tf_internals.v1_optimizer_arg, optimizer)
        return keras.optimizers.SGD(start, momentum=float(arg("momentum")),
                                    nesterov=bool(arg("use_nesterov")))
    if name == "AdamOptimizer":
        arg = functools.partial(_tf_internals.v1_optimizer_arg, optimizer)
        return keras.optimizers.Adam(start, beta_1=float(arg("beta1")),
                                     beta_2=float(arg("beta2")), epsilon=float(arg("epsilon")))
    raise ModelFnError(
        f"tf.compat.v1.train.{name}.minimize cannot run in TensorFlow 2, and Fenwicks "
        "converts only GradientDescentOptimizer, MomentumOptimizer and AdamOptimizer. "
        "Pass a Keras optimizer instead: TPUEstimatorSpec(mode, loss=loss, "
        "optimizer=keras.optimizers.RMSprop(...)) (or an fw.train optimizer function)")


def _custom_apply(optimizer: Any) -> bool:
    """True for a TF1 optimizer subclass that writes its own update (apply_gradients)."""
    base = tf.compat.v1.train.Optimizer.apply_gradients
    method = type(optimizer).apply_gradients
    return method is not base and type(optimizer).__module__.split(".")[0] != "tensorflow"


_LR_ATTRIBUTES = ("learning_rate", "_learning_rate", "_lr", "lr")


def _lr_attribute(optimizer: Any) -> str:
    for name in _LR_ATTRIBUTES:
        if name in vars(optimizer):
            return name
    raise ModelFnError(
        f"{type(optimizer).__name__} keeps no learning rate Fenwicks can find (one of "
        f"{', '.join(_LR_ATTRIBUTES)}): give the spec a Keras optimizer instead: "
        "TPUEstimatorSpec(mode, loss=loss, optimizer=keras.optimizers.AdamW(...))")


def v1_learning_rate(optimizer: Any) -> Any:
    """The learning rate a TF1 optimizer was made with (a number, or a tensor computed
    from the global step in the model_fn)."""
    optimizer = _unwrap(optimizer)
    if _custom_apply(optimizer):
        return getattr(optimizer, _lr_attribute(optimizer))
    return _tf_internals.v1_optimizer_arg(optimizer, "learning_rate")


class V1OptimizerAdapter(keras.optimizers.Optimizer):
    """Runs a TF1 optimizer's own ``apply_gradients`` as a Keras optimizer's update, one
    variable at a time, so the engine's distribution, loss scaling and checkpoints apply.

    The slots it asks for with ``tf.compat.v1.get_variable`` become this optimizer's
    variables (found by running its ``apply_gradients`` once on a throwaway graph), the
    variable reaches it with its TF1 name (weight-decay exclusions match names), and its
    learning rate is the engine's, set every step from the model_fn's schedule.
    """

    def __init__(self, v1_optimizer: Any, **kwargs: Any) -> None:
        super().__init__(learning_rate=0.0, name=type(v1_optimizer).__name__, **kwargs)
        self._v1 = v1_optimizer
        self._v1_lr = _lr_attribute(v1_optimizer)
        self._v1_slots: list[list[Any]] = []

    def build(self, variables: list[Any]) -> None:
        if self.built:
            return
        super().build(variables)
        for variable in variables:
            slots = []
            for index, (shape, dtype, initializer) in enumerate(self._slot_requests(variable)):
                slots.append(self.add_variable(
                    shape=shape, dtype=dtype, initializer=initializer or "zeros",
                    name=f"{variable.name}_v1_slot{index}"))
            self._v1_slots.append(slots)

    def _slot_requests(self, variable: Any) -> list[tuple[Any, Any, Any]]:
        requests: list[tuple[Any, Any, Any]] = []

        def get_variable(name: str, shape: Any = None, dtype: Any = None,
                         initializer: Any = None, **unused: Any) -> Any:
            dtype = tf.as_dtype(dtype or tf.float32)
            requests.append((tuple(tf.TensorShape(shape).as_list()), dtype.name, initializer))
            return tf.compat.v1.Variable(tf.zeros(shape, dtype), trainable=False)

        name = getattr(variable, "fenwicks_v1_name", None) or variable.path
        with tf.Graph().as_default():  # only the get_variable calls matter here
            param = tf.compat.v1.Variable(tf.zeros(variable.shape, variable.dtype), name=name)
            with patched(tf.compat.v1, "get_variable", get_variable), \
                    patched(self._v1, self._v1_lr, tf.constant(0.0)):
                type(self._v1).apply_gradients(self._v1, [(tf.zeros_like(param), param)])
        return requests

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        index = self._get_variable_index(variable)
        slots = iter(self._v1_slots[index])
        model_variable = self._trainable_variables[index]  # `variable` may be its replica's
        name = getattr(model_variable, "fenwicks_v1_name", None) or model_variable.path
        with patched(tf.compat.v1, "get_variable", lambda *a, **k: next(slots)), \
                patched(self._v1, self._v1_lr, tf.cast(learning_rate, variable.dtype)):
            type(self._v1).apply_gradients(self._v1, [(gradient, V1View(variable, name))])


# --------------------------------------------------------------------------- object replay


_RECORDED_BASES = (keras.layers.Layer, _tf_internals.keras_base_optimizer(),
                   keras.metrics.Metric)


def _restoring_init(cls: type) -> Callable[..., None]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        self.__class__ = cls  # the object was built on the first call: not again
    return __init__


class Replay:
    """Hands out the Keras objects of the first calls again, in creation order per class.

    ``recording`` (the build calls) creates and records what is new; afterwards a new
    object is an error, because it would create variables inside a traced function.
    """

    def __init__(self) -> None:
        self.objects: dict[type, list[Any]] = {}
        self.order: list[Any] = []
        self.recording = True
        self._next: dict[type, int] = {}
        self._skip_init: dict[type, type] = {}
        self.mode = ""
        self.v1_variables = V1Variables()
        self._arguments: dict[int, Any] = {}  # id(object) -> its constructor arguments
        # (class, index, mode) -> a mode's own object, made with other arguments
        self._variants: dict[tuple[type, int, str], Any] = {}
        self._described: dict[int, tuple[str, str]] = {}  # id(object) -> (mode, arguments)
        self._scopes: dict[int, str] = {}  # id(object) -> the TF1 variable scope it was made in

    def start(self, mode: str) -> None:
        self._next = {}
        self.mode = mode

    def layers(self) -> list[Any]:
        return [obj for obj in self.order if isinstance(obj, keras.layers.Layer)]

    def variables(self) -> list[Any]:
        seen, out = set(), []
        for obj in self.order:
            for variable in getattr(obj, "variables", []):
                if id(variable) not in seen:
                    seen.add(id(variable))
                    out.append(variable)
        return out

    def _no_init(self, cls: type) -> type:
        if cls not in self._skip_init:
            self._skip_init[cls] = type(cls.__name__, (cls,),
                                        {"__init__": _restoring_init(cls),
                                         "__module__": cls.__module__})
        return self._skip_init[cls]

    def new(self, original: Callable[..., Any], cls: type, args: tuple, kwargs: dict) -> Any:
        if _nested(sys._getframe(2)):
            return original(cls, *args, **kwargs)
        index = self._next.get(cls, 0)
        self._next[cls] = index + 1
        known = self.objects.setdefault(cls, [])
        arguments = _signature((args, kwargs))
        if index < len(known):
            for obj in (known[index], self._variants.get((cls, index, self.mode))):
                if obj is not None and self._arguments[id(obj)] == arguments:
                    obj.__class__ = self._no_init(cls)
                    return obj
        if not self.recording:
            raise ModelFnError(
                f"model_fn created a {cls.__name__}{_describe(args, kwargs)} in mode "
                f"{self.mode!r} that it did not create when it was first called in that "
                f"mode ({len(known)} {cls.__name__}s then): a model_fn must create the same "
                "Keras layers, with the same arguments, on every call in a mode (they are "
                "shared, as TPUEstimator shared variables by name)")
        obj = original(cls, *args, **kwargs)
        self._scopes[id(obj)] = tf.compat.v1.get_variable_scope().name
        self._arguments[id(obj)] = arguments
        self._described[id(obj)] = (self.mode, _describe(args, kwargs))
        if index < len(known):  # other arguments in this mode: the mode's own object
            self._variants[(cls, index, self.mode)] = obj
            self._described[id(obj)] += (known[index],)
        else:
            known.append(obj)
        self.order.append(obj)
        return obj

    def name_v1(self) -> None:
        """Names each variable of a layer made inside ``tf.compat.v1.variable_scope`` as
        TF1 did, ``<scope>/<layer name>/<variable>`` (BERT's ``bert/encoder/layer_0/
        attention/self/query/kernel`` from ``Dense(name='query')``): the names of a TF1
        checkpoint, for warm-start maps."""
        for obj in self.order:
            scope = self._scopes.get(id(obj))
            if not scope or not isinstance(obj, keras.layers.Layer):
                continue
            for variable in obj.weights:
                if variable.path == f"{obj.name}/{variable.name}":  # its own, not a sublayer's
                    variable.fenwicks_v1_name = f"{scope}/{variable.path}"

    def v1_trainable_variables(self) -> list[Any]:
        """`tf.compat.v1.trainable_variables()` in a model_fn: each variable with its TF1
        name (BERT's get_assignment_map_from_checkpoint reads ``var.name``)."""
        self.name_v1()
        return [V1View(v) for v in self.variables() if v.trainable]

    def check_variants(self) -> None:
        """Raises if a mode's own object (made with other arguments) has weights: they
        would not be shared with the other modes' object."""
        for obj in self._variants.values():
            if getattr(obj, "weights", None):
                mode, described, first = self._described[id(obj)]
                first_mode, first_described = self._described[id(first)][:2]
                raise ModelFnError(
                    f"model_fn created {type(first).__name__}{first_described} in mode "
                    f"{first_mode!r} and {type(obj).__name__}{described} in mode {mode!r} "
                    "at the same place: a layer with weights must have the same arguments "
                    "in every mode, so train, eval and predict share its weights; pass "
                    "what differs per mode when calling it (layer(x, training=...))")


def _signature(value: Any, depth: int = 0) -> Any:
    """A comparable summary of constructor arguments: values, configs of Keras objects
    (a new initializer per call is the same initializer), code of functions."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if depth > 6:
        return "..."
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_signature(v, depth + 1) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((str(k), _signature(v, depth + 1))
                                     for k, v in value.items())))
    if hasattr(value, "item") and getattr(value, "shape", None) == ():  # NumPy scalars
        return value.item()
    if isinstance(value, _RECORDED_BASES):
        return ("object", id(value))  # replayed itself: the same object on every call
    if tf.is_tensor(value):
        return ("tensor",)  # a value computed anew on every call: not compared
    if hasattr(value, "__code__"):
        return ("function", value.__code__)
    if callable(getattr(value, "get_config", None)):
        try:
            return (type(value).__name__, _signature(value.get_config(), depth + 1))
        except Exception:  # noqa: BLE001 - fall back to the type
            pass
    return (type(value).__name__,)


def _describe(args: tuple, kwargs: dict) -> str:
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    text = ", ".join(parts)
    return f"({text[:80]}{'...' if len(text) > 80 else ''})"


def _nested(frame: Any) -> bool:
    """True if a Keras object is being made by another one (its __init__, build, call)."""
    while frame is not None and frame.f_code not in _BOUNDARIES:
        owner = frame.f_locals.get("self")
        if isinstance(owner, _RECORDED_BASES):
            return True
        frame = frame.f_back
    return False




@contextlib.contextmanager
def patched(target: Any, name: str, value: Any) -> Iterator[None]:
    had = name in vars(target) if isinstance(target, type) else hasattr(target, name)
    old = getattr(target, name, None)
    setattr(target, name, value)
    try:
        yield
    finally:
        if had:
            setattr(target, name, old)
        elif name == "__new__":
            # Deleting a __new__ set on a class leaves CPython calling object.__new__ with
            # the constructor's arguments (a TypeError): put a neutral one in its place.
            setattr(target, name, _plain_new)
        else:
            delattr(target, name)


def _plain_new(cls: type, *args: Any, **kwargs: Any) -> Any:
    return object.__new__(cls)


def _replaying_new(replay: Replay, base: type) -> Any:
    original = base.__dict__.get("__new__")

    def create(cls: type, *args: Any, **kwargs: Any) -> Any:
        return object.__new__(cls)

    original_fn = original.__func__ if isinstance(original, staticmethod) else original
    make = original_fn if original_fn is not None else create

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
        return replay.new(make, cls, args, kwargs)

    return __new__


CUSTOM_V1_OPTIMIZER = (
    "model_fn's train_op comes from {name}.apply_gradients, a TF1 optimizer of its own "
    "(it makes its slots with tf.get_variable and steps the global step itself), which "
    "only a TF1 session can run: give the spec a Keras optimizer instead, one line, e.g. "
    "for BERT's optimization.create_optimizer: TPUEstimatorSpec(mode, loss=total_loss, "
    "optimizer=fw.train.adam_optimizer(fw.train.one_cycle_lr(init_lr, num_train_steps, "
    "num_warmup_steps, fw.train.linear_decay()), wd=0.01, epsilon=1e-6, clip_norm=1.0, "
    "exclude_from_wd=['LayerNorm', 'layer_norm', 'bias'])); see tutorials/PORTING.md, "
    "'TPUEstimator programs'")


def _v1_optimizer_in_stack(frame: Any) -> Any:
    """The `tf.compat.v1.train.Optimizer` whose method is running, if one is."""
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, tf.compat.v1.train.Optimizer):
            return owner
        frame = frame.f_back
    return None


class V1View:
    """A variable as TF1 named it: ``name`` is ``'<TF1 name>:0'``; anything else (shape,
    dtype, assign, use in an op) is the variable's."""

    def __init__(self, variable: Any, name: str | None = None) -> None:
        self.variable = variable
        name = name or getattr(variable, "fenwicks_v1_name", None) or variable.path
        self.name = f"{name}:0"
        self.shape = tf.TensorShape(variable.shape)  # TF1's: shape.as_list()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.variable, name)

    def _value(self) -> tf.Tensor:
        return tf.convert_to_tensor(self.variable)

    def __add__(self, other: Any) -> tf.Tensor:
        return self._value() + other

    def __radd__(self, other: Any) -> tf.Tensor:
        return other + self._value()

    def __sub__(self, other: Any) -> tf.Tensor:
        return self._value() - other

    def __rsub__(self, other: Any) -> tf.Tensor:
        return other - self._value()

    def __mul__(self, other: Any) -> tf.Tensor:
        return self._value() * other

    def __rmul__(self, other: Any) -> tf.Tensor:
        return other * self._value()

    def __truediv__(self, other: Any) -> tf.Tensor:
        return self._value() / other


tf.register_tensor_conversion_function(
    V1View, lambda view, dtype=None, name=None, as_ref=False: tf.convert_to_tensor(
        view.variable, dtype=dtype, name=name))


class GlobalStep:
    """`tf.compat.v1.train.get_or_create_global_step()` in a model_fn: the optimizer's
    step as a tensor. ``assign(global_step + 1)`` (BERT's create_optimizer, for an
    optimizer that does not count steps) does nothing: the engine counts every step."""

    def __init__(self, value: tf.Tensor) -> None:
        self.value = value

    def assign(self, value: Any, *args: Any, **kwargs: Any) -> Any:
        return tf.no_op()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.value, name)

    def __add__(self, other: Any) -> tf.Tensor:
        return self.value + other

    def __radd__(self, other: Any) -> tf.Tensor:
        return other + self.value

    def __sub__(self, other: Any) -> tf.Tensor:
        return self.value - other


tf.register_tensor_conversion_function(
    GlobalStep, lambda step, dtype=None, name=None, as_ref=False: tf.convert_to_tensor(
        step.value, dtype=dtype, name=name))


class V1Variables:
    """`tf.compat.v1.get_variable` in a model_fn: a variable per TF1 scope name, made on the
    first calls as a weight of one Keras layer (so it is checkpointed with the model) and
    handed back by name on later calls, as TF1's variable scopes shared it."""

    def __init__(self) -> None:
        self.layer = keras.layers.Layer(name="v1_variables")
        self.by_name: dict[str, Any] = {}

    def get(self, replay: Replay, name: str, shape: Any = None, dtype: Any = None,
            initializer: Any = None, regularizer: Any = None, trainable: bool | None = None,
            **unused: Any) -> Any:
        optimizer = _v1_optimizer_in_stack(sys._getframe(1))
        if optimizer is not None:  # its apply_gradients ran in the model_fn: refuse
            raise ModelFnError(CUSTOM_V1_OPTIMIZER.format(name=type(optimizer).__name__))
        scope = tf.compat.v1.get_variable_scope().name
        full = f"{scope}/{name}" if scope else name
        if full in self.by_name:
            return self.by_name[full]
        if not replay.recording or shape is None:
            raise ModelFnError(
                f"model_fn called tf.compat.v1.get_variable({full!r}) in mode "
                f"{replay.mode!r}, which it did not call on its first calls"
                + ("" if shape is not None else " (and gave no shape)")
                + ": a model_fn must make the same variables in every mode")
        variable = self.layer.add_weight(
            name=name.replace("/", "_"), shape=tuple(tf.TensorShape(shape).as_list()),
            dtype=tf.as_dtype(dtype or tf.float32).name,
            initializer=initializer or "glorot_uniform",
            regularizer=regularizer, trainable=True if trainable is None else trainable)
        variable.fenwicks_v1_name = full  # its name for warm-start maps
        # An attribute each: TensorFlow's checkpoint graph does not see the weights list.
        setattr(self.layer, "v1_" + re.sub(r"\W", "_", full), variable)
        self.by_name[full] = variable
        if self.layer not in replay.order:
            replay.order.append(self.layer)
        return variable


@dataclasses.dataclass
class CallRecord:
    """What one model_fn call asked for beside its spec."""

    minimize: V1Minimize | None = None
    init_from_checkpoint: list[tuple[str, Any]] = dataclasses.field(default_factory=list)
    losses: dict[Any, tf.Tensor] = dataclasses.field(default_factory=dict)
    clip_norm: float | None = None


@contextlib.contextmanager
def tf1_scope(replay: Replay, record: CallRecord,
              global_step: Callable[[], tf.Tensor]) -> Iterator[None]:
    """Patches the TF1 names listed in the module docstring while a model_fn runs."""
    v1 = tf.compat.v1

    def minimize(self: Any, loss: Any, global_step: Any = None, *args: Any,
                 **kwargs: Any) -> Any:
        record.minimize = V1Minimize(self, v1_learning_rate(self))
        return tf.no_op()

    def apply_gradients(self: Any, grads_and_vars: Any, global_step: Any = None,
                        name: Any = None) -> Any:
        # The update itself runs in the engine's optimizer step (convert_v1_optimizer).
        record.minimize = V1Minimize(self, v1_learning_rate(self))
        return tf.no_op()

    original_init = v1.train.Optimizer.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if _custom_apply(self) or "CrossShard" in type(self).__name__:
            # An instance attribute: it shadows the subclass's own apply_gradients.
            self.apply_gradients = functools.partial(apply_gradients, self)

    original_clip = tf.clip_by_global_norm

    def clip_by_global_norm(t_list: Any, clip_norm: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(clip_norm, (int, float)):
            record.clip_norm = float(clip_norm)
        return original_clip(t_list, clip_norm, *args, **kwargs)

    def step() -> GlobalStep:
        return GlobalStep(global_step())

    original_gradients = tf.gradients

    def gradients(ys: Any, xs: Any, *args: Any, **kwargs: Any) -> Any:
        listed = list(xs) if isinstance(xs, (list, tuple)) else [xs]
        if any(isinstance(x, V1View) for x in listed):
            # Gradients of tf.trainable_variables() for an optimizer's apply_gradients
            # (BERT's create_optimizer): the engine computes them after the model_fn
            # and hands them to that apply_gradients itself (V1OptimizerAdapter).
            return [tf.zeros(x.shape, x.dtype) for x in listed]
        return original_gradients(ys, xs, *args, **kwargs)

    def init_from_checkpoint(ckpt_dir_or_file: str, assignment_map: Any) -> None:
        record.init_from_checkpoint.append((ckpt_dir_or_file, assignment_map))

    patches = [(v1.train.Optimizer, "minimize", minimize),
               (v1.train, "get_global_step", step),
               (v1.train, "get_or_create_global_step", step),
               (v1.train.Optimizer, "__init__", init),
               (v1, "clip_by_global_norm", clip_by_global_norm),
               (v1, "gradients", gradients), (tf, "gradients", gradients),
               (tf, "clip_by_global_norm", clip_by_global_norm),
               (v1.train, "init_from_checkpoint", init_from_checkpoint),
               (v1, "trainable_variables", lambda *a, **k: replay.v1_trainable_variables()),
               (v1, "get_variable", functools.partial(replay.v1_variables.get, replay)),
               (keras.metrics.Mean, "update_state", _keras_mean_update)]
    patches += [(v1.losses, name, _recording_loss(getattr(v1.losses, name), record))
                for name in V1_LOSSES if hasattr(v1.losses, name)]
    patches += [(v1.metrics, name, fn) for name, fn in V1_METRICS.items()]
    patches += [(v1.metrics, name, _unsupported_metric(name))
                for name in ("auc", "precision_at_k", "mean_per_class_accuracy",
                             "mean_iou", "sparse_average_precision_at_k",
                             "false_negatives", "false_positives", "true_positives",
                             "true_negatives", "percentage_below", "mean_cosine_distance",
                             "mean_relative_error", "mean_tensor", "sensitivity_at_specificity",
                             "specificity_at_sensitivity", "precision_at_thresholds",
                             "recall_at_thresholds", "average_precision_at_k")
                if hasattr(v1.metrics, name)]
    patches += [(base, "__new__", _replaying_new(replay, base)) for base in _RECORDED_BASES]
    with contextlib.ExitStack() as stack:
        stack.enter_context(_tf_internals.fresh_variable_scope_counts())
        for target, name, value in patches:
            stack.enter_context(patched(target, name, value))
        yield


@tf.autograph.experimental.do_not_convert  # TF1 never converted a model_fn either
def call_user(model_fn: Callable[..., Any], features: Any, labels: Any, mode: str,
              params: dict, config: Any) -> Any:
    """Calls model_fn with the arguments its signature names (as TPUEstimator did)."""
    names = inspect.signature(model_fn).parameters
    given = {"features": features, "labels": labels, "mode": mode, "params": params,
             "config": config}
    kwargs = {name: value for name, value in given.items() if name in names}
    if "features" not in names:
        raise ModelFnError(f"model_fn{inspect.signature(model_fn)} must take features "
                           "(and usually labels, mode, params)")
    if "labels" not in names and labels is not None and mode != "infer":
        raise ModelFnError("model_fn takes no labels, but the input_fn gives labels")
    return model_fn(**kwargs)


@tf.autograph.experimental.do_not_convert
def call_in_scope(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Calls a function of the model_fn's (metric_fn, scaffold_fn): what it creates at
    top level is recorded and replayed like the model_fn's own objects."""
    return fn(*args, **kwargs)


# Where `_nested`'s walk up the stack stops: the user's code starts below these frames.
_BOUNDARIES = frozenset(inspect.unwrap(f).__code__ for f in (call_user, call_in_scope))
