"""Learning-rate schedules: callables ``step -> lr`` that compose, as in optax.

Every schedule is a `keras.optimizers.schedules.LearningRateSchedule` (pass it to any Keras
optimizer; `optimizer.learning_rate` is then its value at `optimizer.iterations`), works
inside compiled code on a step tensor, returns a Python float (or a numpy array) for
Python/numpy steps so that it plots directly, and survives a
`get_config`/`from_config` round trip (`keras.saving.serialize_keras_object` too).

    spe = 98                                     # steps per epoch
    lr_func = fw.train.piecewise_linear([0, 5, 24], [0, 0.4, 0], steps_per_epoch=spe)
    lr_func = fw.train.one_cycle_lr(0.4, 24 * spe, 5 * spe, fw.train.linear_decay())
    [lr_func(s) for s in range(0, 24 * spe, spe)]          # floats, for a plot
    lr_per_example = lr_func / 512                         # schedules scale like numbers

Tensor steps are computed in float32 (TPUs have no fast float64; exact up to 2**24
steps); Python and numpy steps in float64 with numpy, so plotting runs no backend op.
Tensor steps use `keras.ops` only: the same schedules run in a `tf.function` on the
TensorFlow engine and under `jax.jit` on the JAX engine.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np

from fenwicks._checks import number, steps

_register = keras.saving.register_keras_serializable(package="fenwicks")
_Base = keras.optimizers.schedules.LearningRateSchedule


class _TensorOps:
    """Array operations for steps that are tensors (compiled code, `optimizer.iterations`):
    `keras.ops`, so a schedule traces in a `tf.function` and under `jax.jit` alike. On
    TensorFlow each is the `tf` op the schedules used before (tf.clip_by_value, tf.gather,
    tf.searchsorted, ...), so the values are unchanged."""

    clip, cos, floor = (staticmethod(keras.ops.clip), staticmethod(keras.ops.cos),
                        staticmethod(keras.ops.floor))
    maximum, where = staticmethod(keras.ops.maximum), staticmethod(keras.ops.where)
    take, reshape = staticmethod(keras.ops.take), staticmethod(keras.ops.reshape)
    shape = staticmethod(keras.ops.shape)

    @staticmethod
    def const(value: Any) -> Any:
        return keras.ops.cast(keras.ops.convert_to_tensor(value), "float32")

    @staticmethod
    def searchsorted(sorted_values: Any, values: Any) -> Any:
        return keras.ops.searchsorted(sorted_values, values, side="right")


class _NPOps:
    """The same with numpy, for Python and numpy steps: plotting a schedule runs no
    backend op, so it cannot initialise devices before `fw.accel` chooses them."""

    clip, cos, floor = staticmethod(np.clip), staticmethod(np.cos), staticmethod(np.floor)
    maximum, where = staticmethod(np.maximum), staticmethod(np.where)
    take, reshape, shape = staticmethod(np.take), staticmethod(np.reshape), staticmethod(np.shape)

    @staticmethod
    def const(value: Any) -> Any:
        return np.asarray(value, np.float64)

    @staticmethod
    def searchsorted(sorted_values: Any, values: Any) -> Any:
        return np.searchsorted(sorted_values, values, side="right")


class Schedule(_Base):
    """Base class: subclasses implement `lr(step, ops)`, `ops` being `_TensorOps` or `_NPOps`."""

    def lr(self, step: Any, ops: Any = _TensorOps) -> Any:
        raise NotImplementedError

    def __call__(self, step: Any) -> Any:
        if isinstance(step, (numbers.Number, np.ndarray, list, tuple)):
            value = self.lr(_NPOps.const(step), _NPOps)
            return float(value) if np.ndim(value) == 0 else np.asarray(value)
        return self.lr(_TensorOps.const(step), _TensorOps)

    def __mul__(self, factor: float) -> Schedule:
        return Scaled(self, factor)

    __rmul__ = __mul__

    def __truediv__(self, divisor: float) -> Schedule:
        return Scaled(self, 1.0 / number("divisor", divisor, low_inclusive=False))

    def get_config(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Schedule:
        return cls(**config)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


def _serialize(schedule: Any) -> Any:
    return keras.saving.serialize_keras_object(schedule)


def _deserialize(config: Any) -> Any:
    return keras.saving.deserialize_keras_object(config) if isinstance(config, dict) else config


class _Decay(Schedule):
    """A decay from `init_lr` over `decay_steps`; `with_span` re-targets it (for one-cycle)."""

    def __init__(self, init_lr: float = 1.0, decay_steps: int = 1) -> None:
        self.init_lr = number("init_lr", init_lr)
        self.decay_steps = steps("decay_steps", decay_steps)

    def with_span(self, init_lr: float, decay_steps: int) -> _Decay:
        """A copy starting at `init_lr`, over `decay_steps`, ending lrs scaled alike."""
        config = self.get_config()
        ratio = init_lr / self.init_lr if self.init_lr else 0.0
        for key in ("end_lr", "base_lr"):
            if key in config:
                config[key] *= ratio
        return type(self)(**{**config, "init_lr": init_lr, "decay_steps": decay_steps})

    def _progress(self, step: Any, ops: Any) -> Any:
        return ops.clip(step / float(self.decay_steps), 0.0, 1.0)


@_register
class LinearDecay(_Decay):
    """``init_lr -> end_lr`` linearly over `decay_steps`, then `end_lr`.

    Examples:
        >>> LinearDecay(0.4, 100)(50)
        0.2
    """

    def __init__(self, init_lr: float = 1.0, decay_steps: int = 1, end_lr: float = 0.0) -> None:
        super().__init__(init_lr, decay_steps)
        self.end_lr = number("end_lr", end_lr)

    def lr(self, step: Any, ops: Any = _TensorOps) -> Any:
        return self.init_lr + (self.end_lr - self.init_lr) * self._progress(step, ops)

    def get_config(self) -> dict[str, Any]:
        return {"init_lr": self.init_lr, "decay_steps": self.decay_steps, "end_lr": self.end_lr}


@_register
class CosineDecay(_Decay):
    """Half a cosine from `init_lr` down to `end_lr` over `decay_steps`, then `end_lr`.

    Examples:
        >>> round(CosineDecay(1.0, 100)(50), 6)
        0.5
    """

    def __init__(self, init_lr: float = 1.0, decay_steps: int = 1, end_lr: float = 0.0) -> None:
        super().__init__(init_lr, decay_steps)
        self.end_lr = number("end_lr", end_lr)

    def lr(self, step: Any, ops: Any = _TensorOps) -> Any:
        cosine = 0.5 * (1.0 + ops.cos(math.pi * self._progress(step, ops)))
        return self.end_lr + (self.init_lr - self.end_lr) * cosine

    def get_config(self) -> dict[str, Any]:
        return {"init_lr": self.init_lr, "decay_steps": self.decay_steps, "end_lr": self.end_lr}


@_register
class ExpDecay(_Decay):
    """``base_lr + (init_lr - base_lr) * decay_rate ** (step / decay_steps)``.

    Unlike the linear and cosine decays it keeps decaying after `decay_steps`.

    Examples:
        >>> round(ExpDecay(0.01, 2000, base_lr=1e-4, decay_rate=0.5)(2000), 8)
        0.00505
    """

    def __init__(self, init_lr: float = 1.0, decay_steps: int = 1, base_lr: float = 0.0,
                 decay_rate: float = 1.0 / math.e, staircase: bool = False) -> None:
        super().__init__(init_lr, decay_steps)
        self.base_lr = number("base_lr", base_lr)
        self.decay_rate = number("decay_rate", decay_rate, low_inclusive=False)
        if self.decay_rate > 1:
            raise ValueError(f"decay_rate={decay_rate!r} must be in (0, 1]; it multiplies "
                             "the learning rate every decay_steps")
        self.staircase = bool(staircase)

    def with_span(self, init_lr: float, decay_steps: int) -> _Decay:
        """Keeps its own `decay_steps`: for an exponential they set the rate, not a span."""
        return super().with_span(init_lr, self.decay_steps)

    def lr(self, step: Any, ops: Any = _TensorOps) -> Any:
        exponent = ops.maximum(step, 0.0) / float(self.decay_steps)
        if self.staircase:
            exponent = ops.floor(exponent)
        return self.base_lr + (self.init_lr - self.base_lr) * self.decay_rate ** exponent

    def get_config(self) -> dict[str, Any]:
        return {"init_lr": self.init_lr, "decay_steps": self.decay_steps,
                "base_lr": self.base_lr, "decay_rate": self.decay_rate,
                "staircase": self.staircase}


@_register
class PiecewiseLinear(Schedule):
    """Linear interpolation between (knot, value) points; constant beyond the ends.

    Examples:
        >>> PiecewiseLinear([0, 5, 24], [0, 0.4, 0])(10)   # DavidNet, in epochs
        0.29473684...
    """

    def __init__(self, knots: Sequence[float], values: Sequence[float]) -> None:
        self.knots = [number(f"knots[{i}]", k) for i, k in enumerate(knots)]
        self.values = [number(f"values[{i}]", v) for i, v in enumerate(values)]
        if len(self.knots) < 1 or len(self.knots) != len(self.values):
            raise ValueError(f"knots={list(knots)!r} and values={list(values)!r} must be "
                             "non-empty and of the same length")
        for i in range(1, len(self.knots)):
            if self.knots[i] <= self.knots[i - 1]:
                raise ValueError(f"knots={list(knots)!r} must be strictly increasing; "
                                 f"knots[{i}]={knots[i]} <= knots[{i - 1}]={knots[i - 1]}")

    def lr(self, step: Any, ops: Any = _TensorOps) -> Any:
        knots, values = ops.const(self.knots), ops.const(self.values)
        if len(self.knots) == 1:
            return values[0] + 0.0 * step
        flat = ops.reshape(step, [-1])  # searchsorted wants a vector; steps may be scalars
        # Segment i spans knots[i - 1]..knots[i]; clamping makes the ends constant.
        index = ops.clip(ops.searchsorted(knots, flat), 1, len(self.knots) - 1)
        left, right = ops.take(knots, index - 1), ops.take(knots, index)
        low, high = ops.take(values, index - 1), ops.take(values, index)
        frac = ops.clip((flat - left) / (right - left), 0.0, 1.0)
        return ops.reshape(low + (high - low) * frac, ops.shape(step))

    def get_config(self) -> dict[str, Any]:
        return {"knots": self.knots, "values": self.values}


@_register
class Join(Schedule):
    """Runs `schedules[i]` from `boundaries[i - 1]`, each seeing steps counted from its start.

    Examples:
        >>> warm = LinearDecay(0.0, 10, end_lr=0.1)              # 0 -> 0.1 in 10 steps
        >>> Join([warm, CosineDecay(0.1, 90)], [10])(10)
        0.1
    """

    def __init__(self, schedules: Sequence[Any], boundaries: Sequence[int]) -> None:
        self.schedules = [_deserialize(s) for s in schedules]
        self.boundaries = [steps(f"boundaries[{i}]", b, 0) for i, b in enumerate(boundaries)]
        if len(self.schedules) != len(self.boundaries) + 1:
            raise ValueError(f"Join needs one boundary fewer than schedules; got "
                             f"{len(self.schedules)} schedules, boundaries={boundaries!r}")
        if any(b2 <= b1 for b1, b2 in zip(self.boundaries, self.boundaries[1:], strict=False)):
            raise ValueError(f"boundaries={boundaries!r} must be strictly increasing")

    def lr(self, step: Any, ops: Any = _TensorOps) -> Any:
        starts = [0, *self.boundaries]
        value = _as_lr(self.schedules[-1], step - starts[-1], ops)
        segments = list(zip(self.schedules, starts, starts[1:], strict=False))
        for schedule, start, end in reversed(segments):
            value = ops.where(step < end, _as_lr(schedule, step - start, ops), value)
        return value

    def get_config(self) -> dict[str, Any]:
        return {"schedules": [_serialize(s) for s in self.schedules],
                "boundaries": self.boundaries}


@_register
class Warmup(Schedule):
    """Linear ramp from `start_lr` to ``schedule(0)`` over `warmup_steps`, then
    ``schedule(step - warmup_steps)``. (The peak is read lazily: no TF op at construction.)

    Examples:
        >>> Warmup(CosineDecay(0.1, 90), 10)(5)
        0.05
    """

    def __init__(self, schedule: Any, warmup_steps: int, start_lr: float = 0.0) -> None:
        self.schedule = _deserialize(schedule)
        self.warmup_steps = steps("warmup_steps", warmup_steps)
        self.start_lr = number("start_lr", start_lr)

    def lr(self, step: Any, ops: Any = _TensorOps) -> Any:
        peak = _as_lr(self.schedule, ops.const(0.0), ops)
        ramp = self.start_lr + (peak - self.start_lr) * ops.clip(
            step / float(self.warmup_steps), 0.0, 1.0)
        after = _as_lr(self.schedule, step - float(self.warmup_steps), ops)
        return ops.where(step < self.warmup_steps, ramp, after)

    def get_config(self) -> dict[str, Any]:
        return {"schedule": _serialize(self.schedule), "warmup_steps": self.warmup_steps,
                "start_lr": self.start_lr}


@_register
class Scaled(Schedule):
    """`schedule` times a constant `factor` (e.g. lr per example = lr per batch / batch).

    Examples:
        >>> (LinearDecay(0.4, 10) / 4)(0)
        0.1
    """

    def __init__(self, schedule: Any, factor: float) -> None:
        self.schedule = _deserialize(schedule)
        self.factor = number("factor", factor)

    def lr(self, step: Any, ops: Any = _TensorOps) -> Any:
        return _as_lr(self.schedule, step, ops) * self.factor

    def get_config(self) -> dict[str, Any]:
        return {"schedule": _serialize(self.schedule), "factor": self.factor}


@_register
class Constant(Schedule):
    """A constant learning rate, as a schedule.

    Examples:
        >>> Constant(0.1)(1000)
        0.1
    """

    def __init__(self, value: float) -> None:
        self.value = number("value", value)

    def lr(self, step: Any, ops: Any = _TensorOps) -> Any:
        return self.value + 0.0 * step

    def get_config(self) -> dict[str, Any]:
        return {"value": self.value}


@_register
class FunctionSchedule(Schedule):
    """Wraps a plain function ``step -> lr`` (a tensor in, a tensor out).

    Serializable only if `function` is registered with Keras; prefer the classes above.

    Examples:
        >>> FunctionSchedule(lambda step: 0.1 * 0.5 ** (step // 100))(250)
        0.025
    """

    def __init__(self, function: Callable[[Any], Any]) -> None:
        self.function = _deserialize(function)
        if not callable(self.function):
            raise ValueError(f"function={function!r} must be callable as function(step)")

    def lr(self, step: Any, ops: Any = _TensorOps) -> Any:
        return ops.const(self.function(step))

    def get_config(self) -> dict[str, Any]:
        return {"function": _serialize(self.function)}


def _as_lr(schedule: Any, step: Any, ops: Any = _TensorOps) -> Any:
    if isinstance(schedule, Schedule):
        return schedule.lr(step, ops)
    return ops.const(schedule(step))  # a foreign Keras schedule (keras.ops)


def schedule_value(value: Any, step: Any) -> Any:
    """`value` at `step` if it is a schedule, else `value` itself (a float)."""
    return value(step) if isinstance(value, _Base) else value


def check_lr(lr_func: Any, name: str = "lr_func") -> Any:
    """A learning rate a Keras optimizer accepts: a float > 0 or a schedule.

    Plain functions ``step -> lr`` are wrapped in `FunctionSchedule` (Keras would call
    them with no argument).

    Examples:
        >>> check_lr(0.1)
        0.1
    """
    if isinstance(lr_func, _Base):
        return lr_func
    if callable(lr_func):
        return FunctionSchedule(lr_func)
    return number(name, lr_func, low_inclusive=False)


# ------------------------------------------------------------------- public constructors


def linear_decay(init_lr: float = 1.0, decay_steps: int = 1, end_lr: float = 0.0) -> LinearDecay:
    """Linear decay; with no arguments, the shape `one_cycle_lr` stretches over its decay.

    Examples:
        >>> fw.train.linear_decay(0.1, 1000)(500)
        0.05
    """
    return LinearDecay(init_lr, decay_steps, end_lr)


def cosine_decay(init_lr: float = 1.0, decay_steps: int = 1, end_lr: float = 0.0) -> CosineDecay:
    """Cosine decay; with no arguments, a shape for `one_cycle_lr`.

    Examples:
        >>> lr_func = fw.train.one_cycle_lr(0.1, 1000, 100, fw.train.cosine_decay())
    """
    return CosineDecay(init_lr, decay_steps, end_lr)


def exp_decay_lr(init_lr: float = 0.01, decay_steps: int = 2000, base_lr: float = 0.0,
                 decay_rate: float = 1.0 / math.e, warmup_steps: int = 0,
                 staircase: bool = False) -> Schedule:
    """Exponential decay towards `base_lr`, optionally after a linear warmup.

    ``lr = base_lr + (init_lr - base_lr) * decay_rate ** (step / decay_steps)``.

    Args:
        init_lr: learning rate at step 0 (after warmup). Defaults to `0.01`.
        decay_steps: steps per factor of `decay_rate`. Defaults to `2000`.
        base_lr: the floor the rate decays towards. Defaults to `0.0`.
        decay_rate: factor per `decay_steps`, in (0, 1]. Defaults to `1/e`.
        warmup_steps: linear warmup from 0 first. Defaults to `0`.
        staircase: decay in whole steps of `decay_steps`. Defaults to `False`.

    Examples:
        >>> lr_func = fw.train.exp_decay_lr(init_lr=0.01, decay_steps=2000, base_lr=1e-4)
    """
    decay = ExpDecay(init_lr, decay_steps, base_lr, decay_rate, staircase)
    if base_lr > init_lr:
        raise ValueError(f"base_lr={base_lr} must not exceed init_lr={init_lr}")
    return linear_warmup(decay, warmup_steps) if warmup_steps else decay


def linear_warmup(schedule: Any, warmup_steps: int, start_lr: float = 0.0) -> Schedule:
    """Linear warmup from `start_lr` to ``schedule(0)``, then `schedule` (shifted).

    Examples:
        >>> lr_func = fw.train.linear_warmup(fw.train.cosine_decay(0.1, 900), 100)
        >>> lr_func(50)
        0.05
    """
    return Warmup(check_lr(schedule, "schedule"), warmup_steps, start_lr)


def piecewise_linear(knots: Sequence[float], values: Sequence[float],
                     steps_per_epoch: int = 1) -> PiecewiseLinear:
    """Linear interpolation through (knot, value) points, knots in epochs or steps.

    Args:
        knots: strictly increasing positions, in units of `steps_per_epoch` steps.
        values: the learning rate at each knot (constant beyond the ends).
        steps_per_epoch: multiplies the knots. Defaults to `1` (knots in steps).

    Examples:
        >>> lr_func = fw.train.piecewise_linear([0, 5, 24], [0, 0.4, 0], steps_per_epoch=98)
    """
    spe = steps("steps_per_epoch", steps_per_epoch)
    in_epochs = PiecewiseLinear(knots, values)  # validates, with the user's units in errors
    return PiecewiseLinear([k * spe for k in in_epochs.knots], in_epochs.values)


def one_cycle_lr(init_lr: float, total_steps: int, warmup_steps: int,
                 decay_sched: Any = None, start_lr: float = 0.0) -> Schedule:
    """One-cycle: linear warmup to `init_lr` over `warmup_steps`, then `decay_sched`.

    `decay_sched` gives the shape of the decay (`linear_decay()`, `cosine_decay()`,
    `exp_decay_lr(...)`); it is re-targeted to start at `init_lr` and (linear, cosine)
    to span the remaining ``total_steps - warmup_steps`` steps, its end value scaled
    alike. An exponential decay keeps its own `decay_steps` (its rate).

    Args:
        init_lr: the peak learning rate.
        total_steps: length of the whole cycle.
        warmup_steps: steps of warmup, 0 <= warmup_steps < total_steps.
        decay_sched: the decay shape. Defaults to `None` (linear to 0).
        start_lr: learning rate at step 0. Defaults to `0.0`.

    Examples:
        >>> lr_func = fw.train.one_cycle_lr(0.4, 2400, 500, fw.train.linear_decay())
        >>> lr_func(500), lr_func(1450)
        (0.4, 0.2)
    """
    init_lr = number("init_lr", init_lr, low_inclusive=False)
    total_steps = steps("total_steps", total_steps)
    warmup_steps = steps("warmup_steps", warmup_steps, 0)
    if warmup_steps >= total_steps:
        raise ValueError(f"warmup_steps={warmup_steps} must be shorter than "
                         f"total_steps={total_steps}; the decay needs at least one step")
    decay_sched = LinearDecay() if decay_sched is None else decay_sched
    if not isinstance(decay_sched, _Decay):
        raise ValueError(f"decay_sched={decay_sched!r} must be linear_decay(), cosine_decay() "
                         "or exp_decay_lr(...) (a decay shape)")
    decay = decay_sched.with_span(init_lr, total_steps - warmup_steps)
    if warmup_steps == 0:
        return decay
    return Join([LinearDecay(start_lr, warmup_steps, end_lr=init_lr), decay], [warmup_steps])


def one_cycle_momentum(total_steps: int, warmup_steps: int, max_mom: float = 0.95,
                       min_mom: float = 0.85) -> Schedule:
    """Momentum cycling for one-cycle: `max_mom` -> `min_mom` while the lr warms up,
    then back to `max_mom` (Smith, 2018). Pass it as ``mom`` to `sgd_optimizer`.

    Examples:
        >>> mom = fw.train.one_cycle_momentum(1000, 300)
        >>> opt_func = fw.train.sgd_optimizer(fw.train.one_cycle_lr(0.4, 1000, 300), mom=mom)
    """
    total_steps = steps("total_steps", total_steps)
    warmup_steps = steps("warmup_steps", warmup_steps, 0)
    if warmup_steps >= total_steps:
        raise ValueError(f"warmup_steps={warmup_steps} must be shorter than "
                         f"total_steps={total_steps}")
    for name, value in (("max_mom", max_mom), ("min_mom", min_mom)):
        number(name, value, high=1.0)
    down = LinearDecay(max_mom, max(warmup_steps, 1), end_lr=min_mom)
    up = LinearDecay(min_mom, total_steps - warmup_steps, end_lr=max_mom)
    return Join([down, up], [warmup_steps]) if warmup_steps else up
