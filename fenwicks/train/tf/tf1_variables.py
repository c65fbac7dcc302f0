"""TF1 variables in a model_fn: `V1View` (a variable under its TF1 name), `GlobalStep`
(``get_or_create_global_step()``), `V1Variables` (``tf.compat.v1.get_variable`` by scope
name), and `patched`, which swaps a TF1 name for the length of a ``with``.

Examples:
    >>> step = tf.constant(7, tf.int64)
    >>> with patched(tf.compat.v1.train, "get_global_step", lambda: GlobalStep(step)):
    ...     int(tf.compat.v1.train.get_global_step() + 1)   # as a model_fn reads it
    8
    >>> tf.compat.v1.train.get_global_step.__name__   # TF1's own again after the with
    'get_global_step'
    >>> V1View(keras.Variable(np.zeros((2, 3)), name='kernel'), 'dense/kernel').name
    'dense/kernel:0'
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from fenwicks.train.tf.tf1_config import ModelFnError


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



CUSTOM_V1_OPTIMIZER = (
    "model_fn's train_op comes from {name}.apply_gradients, a TF1 optimizer of its own "
    "(it makes its slots with tf.get_variable and steps the global step itself), which "
    "only a TF1 session can run: give the spec a Keras optimizer instead, one line, e.g. "
    "for BERT's optimization.create_optimizer: TPUEstimatorSpec(mode, loss=total_loss, "
    "optimizer=fw.train.adam_optimizer(fw.train.one_cycle_lr(init_lr, num_train_steps, "
    "num_warmup_steps, fw.train.linear_decay()), wd=0.01, epsilon=1e-6, clip_norm=1.0, "
    "exclude_from_wd=['LayerNorm', 'layer_norm', 'bias'])); see tutorials/PORTING.md, "
    "'TPUEstimator programs'")


def v1_optimizer_in_stack(frame: Any) -> Any:
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

    def get(self, replay: Any, name: str, shape: Any = None, dtype: Any = None,
            initializer: Any = None, regularizer: Any = None, trainable: bool | None = None,
            **unused: Any) -> Any:
        optimizer = v1_optimizer_in_stack(sys._getframe(1))
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
