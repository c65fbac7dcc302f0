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
- ``tf.gradients``, ``compute_gradients``, ``apply_gradients`` and ``minimize`` of
  ``tf.compat.v1.train`` optimizers (`tf1_gradients`): the gradients are real, and the
  (gradient, variable) pairs given to ``apply_gradients`` are what trains; the optimizer
  is converted to Keras (`convert_v1_optimizer`); ``get_global_step`` /
  ``get_or_create_global_step`` give the optimizer's step;
- ``tf.compat.v1.losses.get_regularization_loss / get_regularization_losses /
  get_total_loss`` and ``get_collection(GraphKeys.REGULARIZATION_LOSSES)`` give the
  layers' regulariser values (`Replay.regularization_losses`): as in TF1, a regulariser
  trains only if the model_fn adds it to its loss (the engine adds none);
  ``get_losses`` / ``get_collection(GraphKeys.LOSSES)`` give this call's
  ``tf.compat.v1.losses`` values (the graph's collection would hold every replica's);
- ``tf.compat.v1.train.init_from_checkpoint`` records a warm start, and
  ``tf.train.list_variables`` / ``load_checkpoint`` read a Fenwicks run (a work_dir, its
  ``checkpoints`` folder or one step) by its variables' TF1 names (BERT's
  ``get_assignment_map_from_checkpoint``);
- ``tf.compat.v1.losses.*`` and Keras loss objects record their per-example values
  beside the scalar, so the evaluation loss of a padded last batch leaves the padding rows
  out; a Keras loss object's value is its replica's batch mean, as TF1's losses' (Keras
  alone would divide it by the replica count);
- ``tf.compat.v1.train.Optimizer`` subclasses with their own ``apply_gradients`` are
  recorded and run by the engine (`V1OptimizerAdapter`) on the recorded gradients;
  ``global_step.assign`` does nothing (the engine counts steps);
- ``tf.compat.v1.trainable_variables(scope)`` gives the model's trainable variables under
  their TF1 names, those whose name `scope` matches;
- ``tf.compat.v1.get_variable`` makes (on the first calls) or hands back a variable by its
  TF1 scope name (BERT's ``output_weights``); inside a TF1 optimizer's own
  ``apply_gradients`` (BERT's ``AdamWeightDecayOptimizer``) it raises, naming the Keras
  replacement.

A Keras object created with other arguments in another mode (``Dropout(0.9 if training
else 0.0)``) is that mode's own object, so each mode runs with its own arguments; one with
weights must be the same in every mode (`Replay.check_variants`).

The patches are undone when the model_fn returns; the model_fn runs on one thread.

The TF1 names' stand-ins live beside this module: `tf1_metrics` (metrics and losses),
`tf1_optimizers` (optimizers), `tf1_variables` (variables, the global step).

Examples:
    >>> def model_fn(features, labels, mode, params):
    ...     return keras.layers.Dense(2, name='logits')(features)   # a new layer each call
    >>> x, step = np.ones((4, 3), 'float32'), lambda: tf.constant(0, tf.int64)
    >>> replay = Replay()
    >>> replay.start('train')   # the first call records the Dense layer it makes
    >>> with tf1_scope(replay, CallRecord(), global_step=step):
    ...     first = call_user(model_fn, x, None, 'train', {}, None)
    >>> replay.recording = False
    >>> replay.start('eval')    # a later call gets the same layer back: the same weights
    >>> with tf1_scope(replay, CallRecord(), global_step=step):
    ...     again = call_user(model_fn, x, None, 'eval', {}, None)
    >>> np.array_equal(first, again), [v.path for v in replay.variables()]
    (True, ['logits/kernel', 'logits/bias'])
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
from fenwicks.train.tf import assignment_map as fenwicks_checkpoints
from fenwicks.train.tf import tf1_gradients
from fenwicks.train.tf import tf1_metrics as metrics
from fenwicks.train.tf.tf1_config import ModelFnError
from fenwicks.train.tf.tf1_optimizers import V1Minimize
from fenwicks.train.tf.tf1_variables import GlobalStep, V1Variables, V1View, patched

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
        attention/self/query/kernel`` from ``Dense(name='query')``), and one made outside
        any scope by its Keras path (``dense/kernel``, TF1's name for it too): the names
        of a TF1 checkpoint, for warm-start maps and the run record (`tf1_names`)."""
        for obj in self.order:
            if not isinstance(obj, keras.layers.Layer):
                continue
            scope = self._scopes.get(id(obj))
            for variable in obj.weights:
                if getattr(variable, "fenwicks_v1_name", None):
                    continue  # tf.compat.v1.get_variable's, or named before
                if not scope:
                    variable.fenwicks_v1_name = variable.path
                elif variable.path == f"{obj.name}/{variable.name}":  # its own
                    variable.fenwicks_v1_name = f"{scope}/{variable.path}"

    def regularization_losses(self, scope: str | None = None) -> list[tf.Tensor]:
        """TF1's ``REGULARIZATION_LOSSES`` collection in a model_fn: each trainable
        variable's regulariser value (``kernel_regularizer=``, ``tf.get_variable(...,
        regularizer=)``) and the activity regularisers of the layers called in this
        call; a `scope` keeps those whose variable's (or layer's) TF1 name it matches at
        the start, as TF1's collection filter did."""
        self.name_v1()
        graph = tf.compat.v1.get_default_graph()
        found = []
        for variable in self.variables():
            regularizer = getattr(variable, "regularizer", None)
            name = getattr(variable, "fenwicks_v1_name", None) or variable.path
            if variable.trainable and regularizer is not None and (
                    scope is None or re.match(scope, name)):
                found.append(tf.cast(regularizer(variable), tf.float32))
        for layer in self.layers():
            prefix = self._scopes.get(id(layer))
            name = f"{prefix}/{layer.name}" if prefix else layer.name
            if scope is not None and not re.match(scope, name):
                continue
            found += [tf.cast(loss, tf.float32) for loss in _tf_internals.keras_own_losses(
                layer) if getattr(loss, "graph", None) is graph]  # this call's only
        return found

    def v1_trainable_variables(self, scope: str | None = None) -> list[Any]:
        """`tf.compat.v1.trainable_variables(scope)` in a model_fn: each variable with its
        TF1 name (BERT's get_assignment_map_from_checkpoint reads ``var.name``); a
        `scope` keeps those whose name it matches at the start (``re.match``), as TF1's
        collection filter did."""
        self.name_v1()
        views = [V1View(v) for v in self.variables() if v.trainable]
        return [view for view in views if scope is None or re.match(scope, view.name)]

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


def _replaying_new(replay: Replay, base: type) -> Any:
    original = base.__dict__.get("__new__")

    def create(cls: type, *args: Any, **kwargs: Any) -> Any:
        return object.__new__(cls)

    original_fn = original.__func__ if isinstance(original, staticmethod) else original
    make = original_fn if original_fn is not None else create

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:  # noqa: N807
        return replay.new(make, cls, args, kwargs)

    return __new__


def _refused_summary(name: str) -> Callable[..., Any]:
    def summary(*args: Any, **kwargs: Any) -> Any:
        raise ModelFnError(
            f"model_fn called tf.summary.{name}, which TF1 wrote through the graph's "
            "summary collection, which TensorFlow 2 does not have, so nothing would reach "
            "TensorBoard: remove it (Fenwicks writes the training loss to TensorBoard "
            "every loop), and report an evaluation value with eval_metrics=(metric_fn, "
            "[value]) and tf.compat.v1.metrics.mean(value)")
    return summary


# tf.compat.v1.layers functions and the Keras layer each became.
V1_LAYERS = {"dense": "Dense", "conv1d": "Conv1D", "conv2d": "Conv2D", "conv3d": "Conv3D",
             "conv2d_transpose": "Conv2DTranspose", "separable_conv2d": "SeparableConv2D",
             "max_pooling1d": "MaxPooling1D", "max_pooling2d": "MaxPooling2D",
             "average_pooling1d": "AveragePooling1D", "average_pooling2d": "AveragePooling2D",
             "dropout": "Dropout", "batch_normalization": "BatchNormalization",
             "flatten": "Flatten"}


class V1Layers:
    """``tf.compat.v1.layers`` in a model_fn: Keras 3 removed its functions, and Keras's
    own error does not say what replaces them; this one names the Keras layer."""

    def __init__(self, original: Any) -> None:
        self._original = original

    def __getattr__(self, name: str) -> Any:
        if name in V1_LAYERS:
            def removed(*args: Any, **kwargs: Any) -> Any:
                raise ModelFnError(
                    f"model_fn called tf.compat.v1.layers.{name}, which Keras 3 removed: "
                    f"call keras.layers.{V1_LAYERS[name]}(...)(inputs) instead, with the "
                    "same arguments (the inputs go to the call; name= keeps the TF1 "
                    "variable names, under tf.compat.v1.variable_scope too)")
            return removed
        return getattr(self._original, name)


@dataclasses.dataclass
class CallRecord:
    """What one model_fn call asked for beside its spec."""

    minimize: V1Minimize | None = None
    applied: tf1_gradients.AppliedGradients | None = None  # apply_gradients' pairs
    init_from_checkpoint: list[tuple[str, Any]] = dataclasses.field(default_factory=list)
    losses: dict[Any, tf.Tensor] = dataclasses.field(default_factory=dict)
    # refs of the regularisation values handed to the model_fn: the same for every example
    regularization: set[Any] = dataclasses.field(default_factory=set)
    # this call's TF1 LOSSES collection (tf.compat.v1.losses.* and add_loss)
    v1_losses: list[tf.Tensor] = dataclasses.field(default_factory=list)


@contextlib.contextmanager
def tf1_scope(replay: Replay, record: CallRecord, global_step: Callable[[], tf.Tensor],
              replicas: int = 1) -> Iterator[None]:
    """Patches the TF1 names listed in the module docstring while a model_fn runs on one
    of `replicas` replicas."""
    v1 = tf.compat.v1

    def step() -> GlobalStep:
        return GlobalStep(global_step())

    def init_from_checkpoint(ckpt_dir_or_file: str, assignment_map: Any) -> None:
        record.init_from_checkpoint.append((ckpt_dir_or_file, assignment_map))

    def list_variables(ckpt_dir_or_file: str) -> list[tuple[str, list[int]]]:
        listed = fenwicks_checkpoints.list_variables(ckpt_dir_or_file)
        return listed if listed is not None else original_list(ckpt_dir_or_file)

    def load_checkpoint(ckpt_dir_or_file: str) -> Any:
        reader = fenwicks_checkpoints.load_checkpoint(ckpt_dir_or_file)
        return reader if reader is not None else original_load(ckpt_dir_or_file)

    original_list, original_load = v1.train.list_variables, v1.train.load_checkpoint

    def regularization_losses(scope: str | None = None) -> list[tf.Tensor]:
        values = replay.regularization_losses(scope)
        record.regularization.update(value.ref() for value in values)
        return values

    def regularization_loss(scope: str | None = None,
                            name: str = "total_regularization_loss") -> tf.Tensor:
        values = regularization_losses(scope)
        total = tf.add_n(values, name=name) if values else tf.constant(0.0)
        record.regularization.add(total.ref())
        return total

    def get_losses(scope: str | None = None,
                   loss_collection: str = v1.GraphKeys.LOSSES) -> list[tf.Tensor]:
        if loss_collection != v1.GraphKeys.LOSSES:
            return original_get_losses(scope=scope, loss_collection=loss_collection)
        # This call's only: the graph's collection also holds the other replicas' losses.
        return [value for value in record.v1_losses
                if scope is None or re.search(f"(^|/){scope}", value.name)]

    def add_loss(loss: Any, loss_collection: str = v1.GraphKeys.LOSSES) -> None:
        if loss_collection == v1.GraphKeys.LOSSES:
            record.v1_losses.append(loss)
        original_add_loss(loss, loss_collection=loss_collection)

    original_get_losses, original_add_loss = v1.losses.get_losses, v1.losses.add_loss

    def total_loss(add_regularization_losses: bool = True, name: str = "total_loss",
                   scope: str | None = None) -> tf.Tensor:
        values = get_losses(scope)
        if add_regularization_losses:
            values += regularization_losses(scope)
        if not values:
            raise ValueError("No losses found.")  # TF1's get_total_loss said so too
        return tf.add_n(values, name=name)

    def get_collection(original: Callable[..., Any], key: Any, scope: Any = None) -> Any:
        if key == v1.GraphKeys.REGULARIZATION_LOSSES:
            return regularization_losses(scope)
        if key == v1.GraphKeys.LOSSES:
            return get_losses(scope)
        return original(key, scope)

    patches = tf1_gradients.patches(record, replay, replicas)
    patches += [(v1.train, "get_global_step", step),
                (v1.train, "get_or_create_global_step", step),
                (v1.train, "init_from_checkpoint", init_from_checkpoint),
                (keras.metrics.Mean, "update_state", metrics.keras_mean_update)]
    for train in {id(m): m for m in (v1.train, tf.train)}.values():
        # A Fenwicks run is listed and read by its variables' TF1 names (BERT's
        # get_assignment_map_from_checkpoint lists its init_checkpoint).
        patches += [(train, "list_variables", list_variables),
                    (train, "load_checkpoint", load_checkpoint)]
    # Layer regularisers reach the loss only through these, as in TF1 (ModelFnNet.losses).
    patches += [(v1.losses, "get_regularization_losses", regularization_losses),
                (v1.losses, "get_regularization_loss", regularization_loss),
                (v1.losses, "get_total_loss", total_loss),
                (v1.losses, "get_losses", get_losses), (v1.losses, "add_loss", add_loss)]
    for module in _tf_internals.v1_api_modules():  # a program may hold either object
        patches += [(module, name, functools.partial(get_collection, getattr(module, name)))
                    for name in ("get_collection", "get_collection_ref")]
        patches += [(module, "trainable_variables", replay.v1_trainable_variables),
                    (module, "get_variable",
                     functools.partial(replay.v1_variables.get, replay)),
                    (module, "layers", V1Layers(v1.layers))]
    patches += [(v1.losses, name, metrics.recording_loss(getattr(v1.losses, name), record))
                for name in metrics.V1_LOSSES if hasattr(v1.losses, name)]
    patches.append((keras.losses.Loss, "__call__",
                    metrics.recording_keras_loss(keras.losses.Loss.__call__, record)))
    patches += [(v1.metrics, name, fn) for name, fn in metrics.V1_METRICS.items()]
    patches += [(v1.metrics, name, metrics.unsupported_metric(name))
                for name in metrics.UNSUPPORTED_METRICS if hasattr(v1.metrics, name)]
    patches += [(base, "__new__", _replaying_new(replay, base)) for base in _RECORDED_BASES]
    patches += [(module, name, _refused_summary(name)) for module in (v1.summary, tf.summary)
                for name in ("scalar", "histogram", "image", "audio", "text")
                if hasattr(module, name)]
    with contextlib.ExitStack() as stack:
        stack.enter_context(_tf_internals.fresh_variable_scope_counts())
        # A Keras loss object's value is its replica's batch mean, as tf.compat.v1.losses'.
        stack.enter_context(_tf_internals.keras_losses_per_replica())
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
    extra = [name for name, p in names.items() if name not in given
             and p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if extra:
        raise ModelFnError(
            f"model_fn{inspect.signature(model_fn)} requires {', '.join(extra)}, which "
            "TPUEstimator does not pass (it passes features, labels, mode, params and "
            f"config, by name): give it a default or bind it first, "
            f"functools.partial(model_fn, {extra[0]}=...)")
    return model_fn(**kwargs)


@tf.autograph.experimental.do_not_convert
def call_in_scope(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Calls a function of the model_fn's (metric_fn, scaffold_fn): what it creates at
    top level is recorded and replayed like the model_fn's own objects."""
    return fn(*args, **kwargs)


# Where `_nested`'s walk up the stack stops: the user's code starts below these frames.
_BOUNDARIES = frozenset(inspect.unwrap(f).__code__ for f in (call_user, call_in_scope))
