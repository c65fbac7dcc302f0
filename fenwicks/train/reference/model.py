"""The reference engine's model: ``outputs = features @ kernel + bias`` in NumPy, its
mean squared error and that loss's gradient, written out by hand.

`linear_model_func` makes the `ModelSpec` the engine trains: a Keras model of one
``Dense`` layer (what callbacks, ``model.get_weights()`` and ``stop_training`` see) with
`fw.train.squared_error` as its loss and plain SGD as its optimizer. `check_spec` refuses
any other model, loss or optimizer in one sentence: the engine computes gradients itself,
and only these.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from fenwicks import _tf_internals
from fenwicks.train import model_func as model_funcs
from fenwicks.train.model_func import ModelSpec

Params = dict[str, np.ndarray]  # {'kernel': [d, k], 'bias': [k]}


def linear_model_func(features: int, outputs: int = 1, learning_rate: Any = 0.1,
                      reduction: str = "mean",
                      kernel_initializer: Any = "glorot_uniform") -> Any:
    """A model function the reference engine trains: linear regression of `outputs`
    targets on `features` inputs, SGD at `learning_rate` (a float or a Keras schedule);
    ``kernel_initializer='zeros'`` starts from known weights (the bias starts at 0).

    Examples:
        >>> model_func = linear_model_func(4, learning_rate=0.05)
    """
    def build() -> keras.Model:
        return keras.Sequential([keras.Input((features,)), keras.layers.Dense(
            outputs, kernel_initializer=kernel_initializer)])

    return model_funcs.get_reg_model_func(
        build, lambda: keras.optimizers.SGD(learning_rate), reduction=reduction)


def check_spec(spec: ModelSpec, optimizer: Any) -> None:
    """Raises ValueError unless the reference engine can train `spec` with `optimizer`."""
    dense = [layer for layer in spec.model.layers if layer.weights]
    if (len(dense) != 1 or not isinstance(dense[0], keras.layers.Dense)
            or dense[0].activation is not keras.activations.linear
            or len(spec.model.weights) != 2):
        raise ValueError(
            f"model={spec.model.name!r}: the reference engine trains a linear model, one "
            "keras.layers.Dense without activation (reference.linear_model_func); got "
            f"layers {[type(layer).__name__ for layer in spec.model.layers]}")
    if spec.loss_fn is not model_funcs.squared_error:
        raise ValueError(f"loss_fn={spec.loss_fn!r}: the reference engine's gradient is "
                         "that of fw.train.squared_error (fw.train.get_reg_model_func)")
    if type(optimizer) is not keras.optimizers.SGD or float(optimizer.momentum) != 0.0:
        raise ValueError(f"optimizer={type(optimizer).__name__}: the reference engine steps "
                         "with plain SGD (keras.optimizers.SGD without momentum)")


def params_of(model: keras.Model) -> Params:
    """The model's kernel and bias as NumPy arrays (copies)."""
    kernel, bias = model.get_weights()
    return {"kernel": np.array(kernel, np.float32), "bias": np.array(bias, np.float32)}


def set_params(model: keras.Model, params: Params) -> None:
    model.set_weights([params["kernel"], params["bias"]])


def forward(params: Params, features: np.ndarray) -> np.ndarray:
    """``[B, d] -> [B, k]`` float32."""
    x = np.asarray(features, np.float32).reshape(len(features), -1)
    return x @ params["kernel"] + params["bias"]


def example_losses(outputs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """``[B]``: each example's mean squared error over its `k` outputs (as
    `fw.train.squared_error`)."""
    labels = np.asarray(labels, np.float32).reshape(outputs.shape)
    return np.mean(np.square(labels - outputs), axis=1)


def loss_and_gradient(params: Params, features: np.ndarray, labels: np.ndarray,
                      global_batch: int, reduction: str) -> tuple[float, Params]:
    """The step's loss (`reduction` of the per-example losses over `global_batch`) and
    its gradient: with ``L = sum_i mean_j (o_ij - y_ij)^2 / N`` and ``o = x W + b``,
    ``dL/do_ij = 2 (o_ij - y_ij) / (k N)``, ``dL/dW = x^T dL/do``, ``dL/db = sum_i dL/do_i``
    (N is the global batch for 'mean', 1 for 'sum')."""
    x = np.asarray(features, np.float32).reshape(len(features), -1)
    outputs = forward(params, x)
    labels = np.asarray(labels, np.float32).reshape(outputs.shape)
    divisor = global_batch if reduction == "mean" else 1
    loss = float(np.sum(example_losses(outputs, labels)) / divisor)
    d_outputs = 2.0 * (outputs - labels) / (outputs.shape[1] * divisor)
    return loss, {"kernel": x.T @ d_outputs, "bias": d_outputs.sum(axis=0)}


def learning_rate(optimizer: Any, step: int) -> float:
    """The optimizer's learning rate at global step `step` (a schedule is evaluated)."""
    rate = _tf_internals.keras_learning_rate_setting(optimizer)  # a variable or a schedule
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        return float(keras.ops.convert_to_numpy(rate(step)))
    return float(keras.ops.convert_to_numpy(rate))
