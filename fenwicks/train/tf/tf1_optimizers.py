"""TF1 optimizers in a model_fn, as Keras optimizers the engine steps.

``GradientDescentOptimizer``, ``MomentumOptimizer`` and ``AdamOptimizer`` become their
Keras counterparts (`convert_v1_optimizer`); a TF1 optimizer subclass with its own
``apply_gradients`` (BERT's ``AdamWeightDecayOptimizer``) runs that code as a Keras
optimizer's update (`V1OptimizerAdapter`).

Examples:
    >>> sgd = convert_v1_optimizer(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9))
    >>> float(sgd.momentum), type(sgd).__name__
    (0.9, 'SGD')
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from fenwicks import _tf_internals
from fenwicks.train.tf.tf1_config import ModelFnError
from fenwicks.train.tf.tf1_variables import V1View, patched


@dataclasses.dataclass
class V1Minimize:
    """What ``optimizer.minimize(loss, global_step)`` asked for."""

    optimizer: Any
    learning_rate: Any


def _unwrap(optimizer: Any) -> Any:
    # A CrossShardOptimizer all-reduces gradients: Fenwicks always does.
    return _tf_internals.unwrap_cross_shard(optimizer)


def convert_v1_optimizer(optimizer: Any) -> keras.optimizers.Optimizer:
    """The Keras 3 optimizer that makes the same updates as a `tf.compat.v1` one.

    GradientDescent is exactly SGD, and Adam is Keras's Adam (both use TF1's
    epsilon-hat form). Momentum matches exactly at a constant learning rate; under a
    schedule TF1 scaled the accumulated gradients by the current rate, Keras the new one.
    A TF1 optimizer subclass with its own ``apply_gradients`` (BERT's
    AdamWeightDecayOptimizer) runs that code itself (`V1OptimizerAdapter`). The gradients
    each is given are the model_fn's own (`fenwicks.train.tf.tf1_gradients`).

    Raises:
        ModelFnError: for another optimizer class, naming the Keras one to pass instead.
    """
    optimizer = _unwrap(optimizer)
    name = type(optimizer).__name__
    if custom_apply(optimizer):
        return V1OptimizerAdapter(optimizer)
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


def custom_apply(optimizer: Any) -> bool:
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
    if custom_apply(optimizer):
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
        lr_name = _lr_attribute(v1_optimizer)
        rate = getattr(v1_optimizer, lr_name)
        # A Python number is the rate of every step; a tensor (a schedule of the global
        # step) is set before each step by the model_fn runner.
        start = float(rate) if isinstance(rate, (int, float)) else 0.0
        super().__init__(learning_rate=start, name=type(v1_optimizer).__name__, **kwargs)
        self._v1 = v1_optimizer
        self._v1_lr = lr_name
        self._v1_slots: list[list[Any]] = []
        # Called with the slots' [shape, dtype] per variable once built (the model_fn
        # runner records them, for evaluating or predicting only: `V1SlotsOnly`).
        self.on_build: Callable[[list[list[tuple[list[int], str]]]], None] | None = None

    def build(self, variables: list[Any]) -> None:
        if self.built:
            return
        super().build(variables)
        specs = []
        for variable in variables:
            slots, spec = [], []
            for index, (shape, dtype, initializer) in enumerate(self._slot_requests(variable)):
                slots.append(self.add_variable(
                    shape=shape, dtype=dtype, initializer=initializer or "zeros",
                    name=f"{variable.name}_v1_slot{index}"))
                spec.append((list(shape), dtype))
            self._v1_slots.append(slots)
            specs.append(spec)
        if self.on_build is not None:
            self.on_build(specs)

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


class V1SlotsOnly(keras.optimizers.Optimizer):
    """The variables a `V1OptimizerAdapter` made (its slots, by shape and dtype), made
    again for a TPUEstimator that only evaluates or predicts, whose model_fn cannot make
    the TF1 optimizer (BERT's ``--do_eval`` alone: ``num_train_steps`` is None): the
    trained checkpoint's slots then have somewhere to go. It never steps.
    """

    def __init__(self, slots: list[list[tuple[list[int], str]]], **kwargs: Any) -> None:
        super().__init__(learning_rate=0.0, name="v1_slots", **kwargs)
        # A string: a list attribute would be tracked, a node the checkpoint lacks.
        self._slot_specs = json.dumps(slots)
        self._v1_slots: list[list[Any]] = []  # as the adapter's: the same checkpoint graph

    def build(self, variables: list[Any]) -> None:
        if self.built:
            return
        super().build(variables)
        specs = json.loads(self._slot_specs)
        if len(variables) != len(specs):
            raise ModelFnError(
                f"the model has {len(variables)} trainable variables and the TF1 optimizer "
                f"recorded in model_dir had slots for {len(specs)}: evaluate or predict "
                "with the model_fn the model_dir was trained with")
        for variable, spec in zip(variables, specs, strict=True):
            self._v1_slots.append([
                self.add_variable(shape=tuple(shape), dtype=dtype, initializer="zeros",
                                  name=f"{variable.name}_v1_slot{index}")
                for index, (shape, dtype) in enumerate(spec)])

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        raise ModelFnError("V1SlotsOnly holds a TF1 optimizer's slots for evaluating and "
                           "predicting; training needs the model_fn's own optimizer")

