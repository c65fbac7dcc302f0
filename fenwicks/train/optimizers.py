"""Optimizers with weight decay applied to the variables, after the cross-replica all-reduce.

`sgd_optimizer` and `adam_optimizer` return an ``opt_func``: a zero-argument callable that
builds a fresh Keras 3 optimizer. The estimator's engine calls it where its variables
live (the tf engine: inside its strategy's scope) and wraps the result in
`keras.optimizers.LossScaleOptimizer` for float16.

* `SGD`: PyTorch SGD semantics. Weight decay is coupled L2 (``g + wd * w``) added to the
  all-reduced gradient before momentum; the velocity is not scaled by the learning rate,
  so a changing schedule acts like it does in PyTorch. With ``reduction='sum'`` the
  DavidNet recipe is ``lr = lr_per_example / batch`` and ``wd = 5e-4 * batch``.
* `AdamW`: Keras Adam with decoupled weight decay (``w -= lr * wd * w`` each step).

Decay exclusions are regular expressions searched in each variable's path (e.g.
``'resnet9/conv_bn/batch_normalization/gamma'``); ``exclude_from_wd='bn_and_bias'``
(or `BN_AND_BIAS`) skips every bias and normalisation scale/offset. A pattern that
matches no variable triggers a warning when the optimizer is built.

Both are Keras optimizer subclasses written against public hooks only: `build` makes the
slots, `update_step` updates one variable (decay included, so it acts once per step on
the variable itself), and `apply` runs a step. `apply` is ours because Keras's runs its
clipping (``clipnorm``, ``global_clipnorm``) on each replica's partial gradient *before*
its all-reduce and offers no hook between the all-reduce and the updates. `apply` sums the
gradients over the replicas, clips the global gradient (``clip_norm``) and updates each
variable once, asking the engine's backend facts how (``sum_gradients`` and
``update_each``, `fenwicks._engine.backend_facts`): on TensorFlow an all-reduce in the
replica context and `StrategyExtended.update`; on JAX the gradients are global already
(the step is one `jax.jit` over the global batch), so `apply` clips and updates; Keras's
`stateless_apply` runs it as it is, so the JAX engine's step uses these optimizers
unchanged. The update rules are written in `keras.ops`, the same on both engines.
Keras-spelled arguments (``weight_decay``, ``beta_1``, ``global_clipnorm``, ``use_ema``,
...) are errors that give the Fenwicks spelling, never silently dropped.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import keras

from fenwicks import _engine
from fenwicks._checks import number
from fenwicks.train.schedules import check_lr, schedule_value

_register = keras.saving.register_keras_serializable(package="fenwicks")

# Biases and the scale/offset of BatchNorm (and LayerNorm): decaying these only hurts.
BN_AND_BIAS: tuple[str, ...] = (r"(^|/)bias$", r"(^|/)gamma$", r"(^|/)beta$",
                                r"batch_normalization")
_SHORTCUTS = {"bn_and_bias": BN_AND_BIAS}

OptFunc = Callable[[], keras.optimizers.Optimizer]


# Keras's names for arguments Fenwicks spells otherwise (shared by the classes and the
# opt_func factories), and what to do about Keras options these optimizers do not have.
_SPELLINGS = {"weight_decay": "wd", "global_clipnorm": "clip_norm"}
_SGD_SPELLINGS = {**_SPELLINGS, "momentum": "mom"}
_ADAM_SPELLINGS = {**_SPELLINGS, "beta_1": "beta1", "beta_2": "beta2"}
_FACTORY_SPELLINGS = {"learning_rate": "lr_func"}
_NO_EMA = "Fenwicks optimizers keep no moving average of the weights"
_UNSUPPORTED = {
    "clipnorm": "there is no per-variable clipping; clip_norm= clips the global norm of "
                "all gradients after the all-reduce",
    "clipvalue": "gradients are clipped by global norm only (clip_norm=)",
    "use_ema": _NO_EMA, "ema_momentum": _NO_EMA, "ema_overwrite_frequency": _NO_EMA,
    "loss_scale_factor": "wrap the optimizer in keras.optimizers.LossScaleOptimizer "
                         "(the estimator does so under float16)",
    "gradient_accumulation_steps": "each step applies one global batch",
    "amsgrad": "keras.optimizers.Adam(amsgrad=True) has AMSGrad; fw.train.AdamW does not",
    "decay": "give a schedule as the learning rate instead, e.g. fw.train.exp_decay_lr",
}


def _reject_keras_arguments(where: str, kwargs: dict[str, Any], spellings: dict[str, str],
                            takes: str) -> None:
    """A ValueError naming every argument in `kwargs`, with its Fenwicks spelling if any.

    `kwargs` is what a ``**kwargs`` caught: Keras optimizer arguments that would otherwise
    reach Keras and be honoured with other semantics, or be dropped.
    """
    problems = []
    for key, value in kwargs.items():
        if key in spellings:
            problems.append(f"{key}={value!r}: Fenwicks spells it {spellings[key]}={value!r}")
        elif key in _UNSUPPORTED:
            problems.append(f"{key}={value!r}: {where} does not support it; "
                            f"{_UNSUPPORTED[key]}")
        else:
            problems.append(f"{key}={value!r}: not an argument of {where}, which takes "
                            f"{takes}")
    if problems:
        raise ValueError("; ".join(problems))


def exclusion_patterns(exclude_from_wd: str | Iterable[str] | None) -> tuple[str, ...]:
    """Normalises `exclude_from_wd` to a tuple of regular expressions.

    Examples:
        >>> exclusion_patterns('bn_and_bias') == BN_AND_BIAS
        True
    """
    if exclude_from_wd is None:
        return ()
    if isinstance(exclude_from_wd, str):
        exclude_from_wd = _SHORTCUTS.get(exclude_from_wd, (exclude_from_wd,))
    patterns = tuple(exclude_from_wd)
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise ValueError(f"exclude_from_wd contains {pattern!r}; give regular expression "
                             "strings matched against variable paths, e.g. ['bias']")
        try:
            re.compile(pattern)
        except re.error as err:
            raise ValueError(f"exclude_from_wd pattern {pattern!r} is not a valid regular "
                             f"expression: {err}") from err
    return patterns


def _check_decay(wd: Any, exclude_from_wd: Any, clip_norm: Any
                 ) -> tuple[float, tuple[str, ...], float | None]:
    """The decay and clipping arguments, validated and normalised."""
    clip_norm = None if clip_norm is None else number("clip_norm", clip_norm,
                                                      low_inclusive=False)
    return number("wd", wd), exclusion_patterns(exclude_from_wd), clip_norm


def _check_sgd(lr: Any, mom: Any, wd: Any, exclude_from_wd: Any,
               clip_norm: Any) -> tuple[Any, Any, tuple[float, tuple[str, ...], float | None]]:
    """Validates SGD arguments in plain Python: no backend op, no device touched.

    Returns the learning rate, the momentum and `_check_decay`'s triple, so that one
    construction validates each argument once.
    """
    if not isinstance(mom, keras.optimizers.schedules.LearningRateSchedule):
        mom = number("mom", mom, high=1.0)  # a schedule: momentum cycling
    return check_lr(lr), mom, _check_decay(wd, exclude_from_wd, clip_norm)


def _check_adam(lr: Any, wd: Any, beta1: Any, beta2: Any, epsilon: Any,
                exclude_from_wd: Any, clip_norm: Any) -> tuple[Any, float, float, float, Any]:
    """Validates AdamW arguments in plain Python: no backend op, no device touched."""
    return (check_lr(lr), number("beta1", beta1, high=1.0),
            number("beta2", beta2, high=1.0),
            number("epsilon", epsilon, low_inclusive=False),
            _check_decay(wd, exclude_from_wd, clip_norm))


def _path(variable: Any) -> str:
    return getattr(variable, "path", variable.name)


def _backend_variable(variable: Any) -> Any:
    """The backend's variable behind a `keras.Variable` (a `tf.Variable`, distributed
    under a strategy, on TensorFlow; JAX's current array, on JAX)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


class _VariableIndex:
    """The variables an optimizer was built with and each one's position (its slots').

    Our own index, instead of Keras's private `_get_variable_index`: by the keras.Variable
    and, on TensorFlow, by the variable behind it, as callers may hold either. A plain
    object on purpose: Keras's optimizer tracks the variables in the lists, tuples and
    dicts set on it, and would list the model's variables among its own.
    """

    def __init__(self, variables: tuple[Any, ...]) -> None:
        self.variables = variables
        self.positions: dict[int, int] = {}
        for index, variable in enumerate(variables):
            self.positions[id(variable)] = index
            if _engine.backend_facts().LASTING_BACKEND_VARIABLES:
                self.positions[id(_backend_variable(variable))] = index


class _DecayMixin:
    """Decay decisions from path patterns; a step that clips after the all-reduce."""

    def _init_decay(self, decay: tuple[float, tuple[str, ...], float | None]) -> None:
        """Stores `_check_decay`'s already validated ``(wd, patterns, clip_norm)``."""
        self.wd, self.exclude_from_wd, self.clip_norm = decay
        self._decay_flags: list[bool] = []
        self._built_with = _VariableIndex(())

    def build(self, variables: Sequence[Any]) -> None:
        if self.built:
            return
        super().build(variables)  # the Keras optimizer's own slots
        self._built_with = _VariableIndex(tuple(variables))
        self._build_decay(self._built_with.variables)

    def _build_decay(self, variables: Sequence[Any]) -> None:
        paths = [_path(v) for v in variables]
        compiled = [re.compile(p) for p in self.exclude_from_wd]
        self._decay_flags = [not any(c.search(path) for c in compiled) for path in paths]
        unused = [p for p, c in zip(self.exclude_from_wd, compiled, strict=True)
                  if not any(c.search(path) for path in paths)]
        if unused and self.wd > 0 and not _is_shortcut(self.exclude_from_wd):
            warnings.warn(f"exclude_from_wd patterns {unused} match none of the "
                          f"{len(paths)} trainable variables (paths such as {paths[:2]}); "
                          "they exclude nothing; check them against these paths", stacklevel=3)

    def _index_of(self, variable: Any) -> int:
        """The position of `variable` in the list the optimizer was built with."""
        index = self._built_with.positions.get(id(variable))
        if index is None:
            raise ValueError(f"variable {_path(variable)!r} is not one of the "
                             f"{len(self._built_with.variables)} variables "
                             f"{type(self).__name__} was built with; build a new "
                             "optimizer for another model")
        return index

    def applies_weight_decay(self, variable: Any) -> bool:
        """Whether `variable`, one the optimizer was built with, gets weight decay.

        Examples:
            >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name='fc')],
            ...                          name='net')
            >>> opt = fw.train.sgd_optimizer(0.1, wd=1e-4, exclude_from_wd='bn_and_bias')()
            >>> opt.build(model.trainable_variables)
            >>> [v.path for v in model.trainable_variables if opt.applies_weight_decay(v)]
            ['net/fc/kernel']
        """
        return self._decays(self._index_of(variable))

    def _decays(self, index: int) -> bool:
        """Whether the variable at `index` gets weight decay."""
        return self.wd > 0 and self._decay_flags[index]

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        """Keras's hook: updates one variable (decay included) with its global gradient."""
        self._update_at(gradient, variable, learning_rate, self._index_of(variable))

    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None
              ) -> None:
        """One step: all-reduce the gradients, clip their global norm, update each variable.

        On TensorFlow it is called in a replica context (inside `strategy.run`), as
        Keras's `apply` is; each variable is updated once, with the global gradient,
        through `StrategyExtended.update` (a merge call where the strategy needs one). On
        JAX the gradients are already global (the gradient of the global batch's loss,
        under `jax.jit` over sharded arrays), and `stateless_apply` calls ``apply(grads)``
        without the variables: those the optimizer was built with are meant.
        """
        variables = self._variables_of(trainable_variables)
        pairs = [(g, v) for g, v in zip(grads, variables, strict=True) if g is not None]
        if not pairs:
            raise ValueError(f"no gradient for any of the {len(variables)} variables "
                             f"{[_path(v) for v in variables][:3]}...; does the loss use "
                             "them?")
        if len(pairs) < len(variables):
            missing = [_path(v) for g, v in zip(grads, variables, strict=True) if g is None]
            warnings.warn(f"no gradient for {missing}; they are not updated", stacklevel=2)
        facts = _engine.backend_facts()
        grads = self._global_gradients(facts.sum_gradients([g for g, _ in pairs]))
        learning_rate = self.learning_rate  # at this step, before iterations moves

        def update(variable: Any, copy: Any, grad: Any) -> None:
            self._update_one(copy, grad, learning_rate, self._index_of(variable),
                             getattr(variable, "constraint", None))

        facts.update_each([v for _, v in pairs], grads, update)
        self.iterations.assign_add(1)

    def _variables_of(self, trainable_variables: Sequence[Any] | None) -> list[Any]:
        if trainable_variables is not None:
            variables = list(trainable_variables)
            if not self.built:
                self.build(variables)
            return variables
        if not self.built:
            raise ValueError(f"{type(self).__name__}.apply(grads) needs the variables too: "
                             "apply(grads, model.trainable_variables), or build(variables) "
                             "first")
        return list(self._built_with.variables)

    def _global_gradients(self, grads: list[Any]) -> list[Any]:
        """The summed gradients, clipped to `clip_norm` by their global norm."""
        return grads if self.clip_norm is None else _clip_by_global_norm(grads, self.clip_norm)

    def _update_one(self, variable: Any, gradient: Any, learning_rate: Any, index: int,
                    constraint: Callable[[Any], Any] | None) -> None:
        self._update_at(gradient, variable, learning_rate, index)
        if constraint is not None:  # as Keras does after each update
            self.assign(variable, constraint(variable))

    def _update_at(self, gradient: Any, variable: Any, learning_rate: Any,
                   index: int) -> None:
        raise NotImplementedError

    def _fenwicks_config(self, keras_config: dict[str, Any]) -> dict[str, Any]:
        # Only Fenwicks spellings: from_config passes them back to __init__, which
        # refuses Keras's (weight_decay, clipnorm, ...).
        return {"name": keras_config["name"], "learning_rate": keras_config["learning_rate"],
                "wd": self.wd, "exclude_from_wd": list(self.exclude_from_wd),
                "clip_norm": self.clip_norm}


def _clip_by_global_norm(grads: list[Any], clip_norm: float) -> list[Any]:
    """`tf.clip_by_global_norm` in keras.ops: scale every gradient by
    ``clip_norm / max(global_norm, clip_norm)`` (an infinite or NaN norm makes every
    value NaN, as TensorFlow's does)."""
    norm = keras.ops.sqrt(sum(keras.ops.sum(keras.ops.square(
        keras.ops.cast(g, "float32"))) for g in grads))
    scale = clip_norm * keras.ops.minimum(1.0 / norm, 1.0 / clip_norm)
    scale = keras.ops.where(keras.ops.isfinite(norm), scale, float("nan"))
    return [g * keras.ops.cast(scale, g.dtype) for g in grads]


def _is_shortcut(patterns: tuple[str, ...]) -> bool:
    # The shortcut lists every kind of parameter; a model without some kind is normal.
    return patterns in _SHORTCUTS.values()


@_register
class SGD(_DecayMixin, keras.optimizers.Optimizer):
    """SGD with momentum and coupled L2 weight decay, with PyTorch's update rule.

    For each variable w with all-reduced gradient g (decay only where not excluded)::

        g = g + wd * w
        v = mom * v + g
        w = w - lr * (g + mom * v)    # nesterov; plain momentum: w = w - lr * v

    Args:
        learning_rate: a float or a `keras.optimizers.schedules.LearningRateSchedule`.
        mom: momentum in [0, 1), or a schedule of it (`one_cycle_momentum`).
            Defaults to `0.9`.
        wd: L2 coefficient >= 0. Defaults to `0.0`.
        nesterov: Nesterov momentum. Defaults to `True`.
        exclude_from_wd: regular expressions (or ``'bn_and_bias'``) for variable paths
            that get no decay. Defaults to `None`.
        clip_norm: clip the all-reduced gradients to this global norm. Defaults to `None`.
        name: the optimizer's name. Defaults to `None` (Keras picks one).
        **keras_kwargs: refused with the Fenwicks spelling (``weight_decay`` is ``wd``,
            ``momentum`` is ``mom``, ``global_clipnorm`` is ``clip_norm``).

    Examples:
        >>> opt = fw.train.SGD(fw.train.piecewise_linear([0, 5, 24], [0, 0.4, 0]), wd=5e-4)
    """

    def __init__(self, learning_rate: Any = 0.01, mom: float = 0.9, wd: float = 0.0,
                 nesterov: bool = True, exclude_from_wd: Any = None,
                 clip_norm: float | None = None, name: str | None = None,
                 **keras_kwargs: Any) -> None:
        _reject_keras_arguments("fw.train.SGD", keras_kwargs, _SGD_SPELLINGS,
                                "learning_rate, mom, wd, nesterov, exclude_from_wd, "
                                "clip_norm, name")
        if isinstance(mom, dict):
            mom = keras.saving.deserialize_keras_object(mom)
        learning_rate, mom, decay = _check_sgd(learning_rate, mom, wd, exclude_from_wd,
                                               clip_norm)
        super().__init__(learning_rate=learning_rate, name=name)
        self.mom = mom
        self.nesterov = bool(nesterov)
        self._init_decay(decay)

    def build(self, variables: Sequence[Any]) -> None:
        if self.built:
            return
        super().build(variables)
        self.velocities = self.add_optimizer_variables(variables, "velocity")

    def _update_at(self, gradient: Any, variable: Any, learning_rate: Any,
                   index: int) -> None:
        ops, dtype = keras.ops, variable.dtype
        lr = ops.cast(learning_rate, dtype)
        mom = ops.cast(schedule_value(self.mom, self.iterations), dtype)
        gradient = ops.cast(gradient, dtype)
        if self._decays(index):  # coupled L2: in the gradient, so momentum carries it
            gradient = gradient + ops.cast(self.wd, dtype) * variable
        velocity = self.velocities[index]
        self.assign(velocity, mom * velocity + gradient)
        step = gradient + mom * velocity if self.nesterov else velocity
        self.assign_sub(variable, lr * step)

    def get_config(self) -> dict[str, Any]:
        return {**self._fenwicks_config(super().get_config()), "nesterov": self.nesterov,
                "mom": keras.saving.serialize_keras_object(self.mom)}


@_register
class AdamW(_DecayMixin, keras.optimizers.Adam):
    """Keras Adam with decoupled weight decay on the variables (AdamW).

    Each step, before the Adam update, every variable not excluded shrinks by
    ``w -= lr * wd * w`` (Loshchilov and Hutter; the learning rate includes the schedule).
    The Adam step is Keras's: with t = step + 1,
    ``w -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + epsilon)``.

    Args:
        learning_rate: a float or a `LearningRateSchedule`.
        wd: decoupled decay coefficient >= 0; 0 means plain Adam. Defaults to `0.0`.
        beta1: first-moment decay in [0, 1). Defaults to `0.9`.
        beta2: second-moment decay in [0, 1). Defaults to `0.999`.
        epsilon: > 0. Defaults to `1e-7`.
        exclude_from_wd: regular expressions (or ``'bn_and_bias'``). Defaults to `None`.
        clip_norm: clip the all-reduced gradients to this global norm. Defaults to `None`.
        name: the optimizer's name. Defaults to `None` (Keras picks one).
        **keras_kwargs: refused with the Fenwicks spelling (``weight_decay`` is ``wd``,
            ``beta_1`` is ``beta1``, ``global_clipnorm`` is ``clip_norm``).

    Examples:
        >>> opt = fw.train.AdamW(1e-3, wd=1e-2, exclude_from_wd='bn_and_bias')
    """

    def __init__(self, learning_rate: Any = 0.001, wd: float = 0.0, beta1: float = 0.9,
                 beta2: float = 0.999, epsilon: float = 1e-7, exclude_from_wd: Any = None,
                 clip_norm: float | None = None, name: str | None = None,
                 **keras_kwargs: Any) -> None:
        _reject_keras_arguments("fw.train.AdamW", keras_kwargs, _ADAM_SPELLINGS,
                                "learning_rate, wd, beta1, beta2, epsilon, "
                                "exclude_from_wd, clip_norm, name")
        learning_rate, beta1, beta2, epsilon, decay = _check_adam(
            learning_rate, wd, beta1, beta2, epsilon, exclude_from_wd, clip_norm)
        # Keras's weight_decay attribute reports wd; the decay itself is in _update_at.
        super().__init__(learning_rate=learning_rate, beta_1=beta1, beta_2=beta2,
                         epsilon=epsilon, weight_decay=decay[0] if decay[0] > 0 else None,
                         name=name)
        self._init_decay(decay)

    def _update_at(self, gradient: Any, variable: Any, learning_rate: Any,
                   index: int) -> None:
        if self._decays(index):  # decoupled: on the weights, not through the moments
            lr = keras.ops.cast(learning_rate, variable.dtype)
            self.assign_sub(variable,
                            variable * keras.ops.cast(self.wd, variable.dtype) * lr)
        keras.optimizers.Adam.update_step(self, gradient, variable, learning_rate)

    def get_config(self) -> dict[str, Any]:
        return {**self._fenwicks_config(super().get_config()), "beta1": self.beta_1,
                "beta2": self.beta_2, "epsilon": self.epsilon}


def sgd_optimizer(lr_func: Any, mom: float = 0.9, wd: float = 0.0, nesterov: bool = True,
                  exclude_from_wd: Any = None, clip_norm: float | None = None,
                  **keras_kwargs: Any) -> OptFunc:
    """Returns an ``opt_func`` building `SGD` (PyTorch semantics, coupled L2 decay).

    Args:
        lr_func: learning rate: a float or a schedule such as `one_cycle_lr(...)`.
        mom: momentum in [0, 1), or a schedule such as `one_cycle_momentum(...)`.
            Defaults to `0.9`.
        wd: L2 coefficient >= 0, added to the gradient before momentum. Defaults to `0.0`.
        nesterov: Nesterov momentum. Defaults to `True`.
        exclude_from_wd: patterns of variable paths without decay, or ``'bn_and_bias'``.
            Defaults to `None` (decay everything, as PyTorch SGD does).
        clip_norm: global-norm clipping of the all-reduced gradients. Defaults to `None`.
        **keras_kwargs: refused with the Fenwicks spelling (``learning_rate`` is
            ``lr_func``, ``momentum`` is ``mom``, ``weight_decay`` is ``wd``).

    Returns:
        A zero-argument callable that returns a new `SGD`.

    Raises:
        ValueError: for a negative or non-finite hyperparameter, now rather than later,
            and for a Keras-spelled argument (``weight_decay=5e-4``: use ``wd=5e-4``).

    Examples:
        >>> spe = 50_000 // 512                              # CIFAR-10: steps per epoch
        >>> lr_func = fw.train.piecewise_linear([0, 5 * spe, 24 * spe], [0, 0.4, 0])
        >>> # DavidNet with reduction='sum': lr per example, decay per batch of 512
        >>> opt_func = fw.train.sgd_optimizer(lr_func / 512, wd=5e-4 * 512)
        >>> opt_func().wd                                   # a fresh optimizer per call
        0.256
    """
    # Validate now, in plain Python: creating an optimizer here would initialise
    # TensorFlow's devices before fw.accel chooses them.
    _reject_keras_arguments("fw.train.sgd_optimizer", keras_kwargs,
                            {**_SGD_SPELLINGS, **_FACTORY_SPELLINGS},
                            "lr_func, mom, wd, nesterov, exclude_from_wd, clip_norm")
    _check_sgd(lr_func, mom, wd, exclude_from_wd, clip_norm)
    return lambda: SGD(lr_func, mom=mom, wd=wd, nesterov=nesterov,
                       exclude_from_wd=exclude_from_wd, clip_norm=clip_norm)


def adam_optimizer(lr_func: Any, wd: float | None = None, beta1: float = 0.9,
                   beta2: float = 0.999, epsilon: float = 1e-7, exclude_from_wd: Any = None,
                   clip_norm: float | None = None, **keras_kwargs: Any) -> OptFunc:
    """Returns an ``opt_func`` building `AdamW` (Adam with decoupled weight decay).

    Args:
        lr_func: learning rate: a float or a schedule.
        wd: decoupled decay coefficient >= 0; None or 0 for plain Adam. Defaults to `None`.
        beta1: first-moment decay in [0, 1). Defaults to `0.9`.
        beta2: second-moment decay in [0, 1). Defaults to `0.999`.
        epsilon: > 0. Defaults to `1e-7`.
        exclude_from_wd: patterns of variable paths without decay; ``'bn_and_bias'``
            excludes biases and BatchNorm parameters. Defaults to `None`.
        clip_norm: global-norm clipping of the all-reduced gradients. Defaults to `None`.
        **keras_kwargs: refused with the Fenwicks spelling (``learning_rate`` is
            ``lr_func``, ``weight_decay`` is ``wd``, ``beta_1`` is ``beta1``).

    Returns:
        A zero-argument callable that returns a new `AdamW`.

    Raises:
        ValueError: for an out-of-range hyperparameter or a Keras-spelled argument.

    Examples:
        >>> opt_func = fw.train.adam_optimizer(1e-3, wd=1e-2, exclude_from_wd='bn_and_bias')
    """
    _reject_keras_arguments("fw.train.adam_optimizer", keras_kwargs,
                            {**_ADAM_SPELLINGS, **_FACTORY_SPELLINGS},
                            "lr_func, wd, beta1, beta2, epsilon, exclude_from_wd, clip_norm")
    wd = 0.0 if wd is None else wd
    kwargs = dict(wd=wd, beta1=beta1, beta2=beta2, epsilon=epsilon,
                  exclude_from_wd=exclude_from_wd, clip_norm=clip_norm)
    _check_adam(lr_func, wd, beta1, beta2, epsilon, exclude_from_wd, clip_norm)  # no op
    return lambda: AdamW(lr_func, **kwargs)
