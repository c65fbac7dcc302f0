"""The learning-rate range test: train briefly with an exponentially growing learning rate.

`find_lr` builds the model with the same ``model_func`` and ``input_fn`` as the estimator,
runs one step per learning rate from `start_lr` to `end_lr`, smooths the loss, stops when
it diverges and suggests the rate where the smoothed loss falls fastest (Smith, 2015;
fast.ai's ``lr_find``).

Steps run through the estimator's own trainer (the same compiled loop) on either engine,
which supplies the batches and the trainer (`Engine.sweep_batches`, `sweep_trainer`).
The recorded loss is the mean over the *global* batch, so the curve with 8 replicas is
the single-device curve (a common bug is to record replica 0's loss only, a noisier
curve on 1/8 of the data).

    result = fw.train.find_lr(model_func, train_input_func, batch_size=512)
    result.suggestion            # e.g. 0.21
    result.plot()
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from fenwicks import accel
from fenwicks._checks import divisible_by_replicas, number, positive_int, steps
from fenwicks.train import engines, inputs
from fenwicks.train.model_func import ModelSpec
from fenwicks.train.runner import InputExhaustedError, LoopOutput
from fenwicks.train.schedules import Schedule


@keras.saving.register_keras_serializable(package="fenwicks")
class ExponentialSweep(Schedule):
    """``start_lr * (end_lr / start_lr) ** (step / (num_steps - 1))``: the LR range test.

    Examples:
        >>> ExponentialSweep(1e-4, 1.0, 5)(2)
        0.01
    """

    def __init__(self, start_lr: float, end_lr: float, num_steps: int) -> None:
        self.start_lr = number("start_lr", start_lr, low_inclusive=False)
        self.end_lr = number("end_lr", end_lr, low_inclusive=False)
        self.num_steps = steps("num_steps", num_steps, 2)
        if self.end_lr <= self.start_lr:
            raise ValueError(f"end_lr={end_lr} must be larger than start_lr={start_lr}")

    def lr(self, step: Any, ops: Any = None) -> Any:
        ratio = self.end_lr / self.start_lr
        return self.start_lr * ratio ** (step / float(self.num_steps - 1))

    def get_config(self) -> dict[str, Any]:
        return {"start_lr": self.start_lr, "end_lr": self.end_lr, "num_steps": self.num_steps}


@dataclasses.dataclass
class LRFinderResult:
    """What `find_lr` measured.

    Attributes:
        lrs: learning rate of each step run.
        losses: mean training loss over the global batch at each step (before its update).
        smoothed: exponentially smoothed, bias-corrected losses.
        suggestion: the rate where the smoothed loss falls fastest per log-lr (None if
            too few steps ran).
        min_loss_lr: the rate of the lowest smoothed loss; a common rule takes 1/10 of it.
        diverged: True if the sweep stopped early because the loss exploded.
    """

    lrs: list[float]
    losses: list[float]
    smoothed: list[float]
    suggestion: float | None
    min_loss_lr: float | None
    diverged: bool

    def plot(self, ax: Any = None) -> Any:
        """Plots smoothed loss against learning rate (log axis); returns the axes."""
        import matplotlib.pyplot as plt

        ax = ax or plt.subplots(figsize=(6, 4))[1]
        ax.plot(self.lrs, self.smoothed)
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("smoothed training loss")
        if self.suggestion is not None:
            ax.axvline(self.suggestion, color="red", linestyle="--",
                       label=f"suggestion {self.suggestion:.2g}")
            ax.legend()
        return ax


def _check_args(start_lr: float, end_lr: float, num_steps: int, smoothing: float,
                diverge_factor: float) -> None:
    ExponentialSweep(start_lr, end_lr, num_steps)
    if not (isinstance(smoothing, (int, float)) and 0 <= smoothing < 1):
        raise ValueError(f"smoothing={smoothing!r} must be in [0, 1), e.g. 0.98")
    if number("diverge_factor", diverge_factor) <= 1:
        raise ValueError(f"diverge_factor={diverge_factor!r} must be > 1, e.g. 4")


@dataclasses.dataclass(frozen=True)
class _Sweep:
    """What the sweep's params and model take from the engine (its replicas, over every
    process, and its precision), as the estimator's do."""

    batch_size: int
    replicas: int
    precision: str
    seed: int | None
    steps_per_epoch: int | None

    def params(self, context: Any = None) -> dict:
        """The estimator's params (`fenwicks.train.inputs.make_params`), for training."""
        return inputs.make_params("train", self.batch_size, self.replicas, seed=self.seed,
                                  precision=self.precision,
                                  steps_per_epoch=self.steps_per_epoch,
                                  input_context=context)


def _build(engine: Any, sweep: _Sweep, model_func: Callable,
           features_spec: Any) -> tuple[ModelSpec, Any]:
    if sweep.seed is not None:
        keras.utils.set_random_seed(sweep.seed)
    return engine.build(model_func, sweep.params(), sweep.precision, features_spec)


def _suggest(lrs: np.ndarray, smoothed: np.ndarray) -> tuple[float | None, float | None]:
    """Steepest descent of the smoothed loss per log-lr, ignoring the noisy first tenth."""
    if len(lrs) < 5:
        return None, None
    best = int(np.argmin(smoothed))
    start = min(len(lrs) // 10, max(best - 1, 0))
    window = slice(start, max(best + 1, start + 2))
    slopes = np.gradient(smoothed[window], np.log(lrs[window]))
    return float(lrs[window][int(np.argmin(slopes))]), float(lrs[best])


def find_lr(model_func: Callable[[dict], ModelSpec], input_fn: Callable[[dict], Any],
            start_lr: float = 1e-7, end_lr: float = 10.0, num_steps: int = 100,
            batch_size: int = 128, smoothing: float = 0.98, diverge_factor: float = 4.0,
            seed: int | None = None, verbose: bool = True,
            steps_per_epoch: int | None = None) -> LRFinderResult:
    """Runs the learning-rate range test and suggests a learning rate.

    The model and optimizer come from `model_func` as in the estimator (same replicas,
    precision, loss reduction); the optimizer's learning rate is replaced by an
    exponential sweep. The model's weights (and BatchNorm statistics) are restored
    afterwards, so a `build_nn` that returns an existing model leaves it untouched.

    Args:
        model_func: ``params -> fw.train.ModelSpec``, e.g. `get_clf_model_func(...)`.
        input_fn: ``params -> tf.data.Dataset`` of per-replica training batches of
            ``params['batch_size']``, repeated (the sweep needs `num_steps` batches).
        start_lr: first learning rate, > 0. Defaults to `1e-7`.
        end_lr: last learning rate, > start_lr. Defaults to `10.0`.
        num_steps: steps (one per learning rate), >= 2. Defaults to `100`.
        batch_size: global batch size, divisible by the replicas. Defaults to `128`.
        smoothing: exponential smoothing of the loss, in [0, 1). Defaults to `0.98`.
        diverge_factor: stop when the smoothed loss exceeds this many times its minimum
            (or is not finite). Defaults to `4.0`.
        seed: seeds Keras and is passed in ``params['seed']``. Defaults to `None`.
        verbose: show a progress bar: steps done of the `num_steps` expected (fewer if
            the loss diverges first), the current rate and loss. Defaults to True.
        steps_per_epoch: given to input and model functions as
            ``params['steps_per_epoch']``, as the estimator does. Defaults to `None`.

    Returns:
        An `LRFinderResult` with the curve, the suggestion and a `plot()` method.

    Raises:
        ValueError: for bad arguments, a model_func that does not return a ModelSpec, or
            an input_fn whose batches do not match ``params['batch_size']``.

    Examples:
        >>> import tempfile
        >>> X, y = np.random.rand(10, 4).astype('float32'), np.arange(10) % 3
        >>> model_func = fw.train.get_clf_model_func(lambda: keras.Sequential(
        ...     [keras.Input((4,)), keras.layers.Dense(3, kernel_initializer='zeros')]),
        ...     fw.train.sgd_optimizer(0.1))
        >>> train_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'])
        >>> result = fw.train.find_lr(model_func, train_fn, batch_size=4, num_steps=20,
        ...                           verbose=False)
        >>> len(result.lrs), float(result.lrs[0])   # 1e-7 to 10, a factor 2.34 a step
        (20, 1e-07)
        >>> opt_func = fw.train.sgd_optimizer(fw.train.one_cycle_lr(
        ...     result.suggestion, total_steps=1000, warmup_steps=100))
    """
    _check_args(start_lr, end_lr, num_steps, smoothing, diverge_factor)
    acc, engine = accel.current(), engines.current()
    positive_int("batch_size", batch_size, example=512)
    replicas = engine.num_replicas(acc)
    batch_size = divisible_by_replicas("batch_size", batch_size, replicas)
    sweep_params = _Sweep(batch_size, replicas, engine.precision(acc), seed, steps_per_epoch)
    batches, release, spec = engine.sweep_batches(input_fn, sweep_params.params, num_steps)
    model_spec, optimizer = _build(engine, sweep_params, model_func, spec[0])
    saved = [w.copy() for w in model_spec.model.get_weights()]
    sweep = ExponentialSweep(start_lr, end_lr, num_steps)
    optimizer.learning_rate = sweep  # Keras allows replacing a schedule with a schedule
    try:
        trainer = engine.sweep_trainer(model_spec, optimizer, batch_size)
        lrs, losses = _sweep(trainer.train, batches, sweep, batch_size, smoothing,
                             diverge_factor, verbose)
    finally:
        model_spec.model.set_weights(saved)
        del batches
        release()  # an iterator's destructor can wait for seconds: off this thread
    return _result(lrs, losses, smoothing, num_steps)


def _sweep(train: Callable[[Any, int], LoopOutput], iterator: Any,
           sweep: ExponentialSweep, batch_size: int, smoothing: float,
           diverge_factor: float, verbose: bool = False) -> tuple[list[float], list[float]]:
    lrs: list[float] = []
    losses: list[float] = []
    average, best = 0.0, math.inf
    with _progress_bar(sweep, batch_size, verbose) as bar:
        for index in range(sweep.num_steps):
            try:
                loss = train(iterator, 1).last_loss  # mean over the global batch
            except InputExhaustedError:
                raise ValueError(f"input_fn ran out of batches after {index} of the "
                                 f"{sweep.num_steps} steps; repeat the dataset "
                                 "(ds.repeat()) or lower num_steps") from None
            lrs.append(sweep(index))
            losses.append(loss)
            average = smoothing * average + (1 - smoothing) * loss
            smoothed = average / (1 - smoothing ** (index + 1))
            if bar is not None:
                bar.set_postfix(lr=f"{lrs[-1]:.2e}", loss=f"{smoothed:.4g}", refresh=False)
                bar.update()
            if not math.isfinite(smoothed) or smoothed > diverge_factor * best:
                break
            best = min(best, smoothed)
    return lrs, losses


def _progress_bar(sweep: ExponentialSweep, batch_size: int, verbose: bool) -> Any:
    """A tqdm bar over the expected steps (a sweep on a CPU can take minutes: say so)."""
    if not verbose:
        return contextlib.nullcontext()
    from tqdm.auto import tqdm  # the widget bar in notebooks

    return tqdm(total=sweep.num_steps, unit="step", dynamic_ncols=True,
                desc=(f"find_lr: lr {sweep.start_lr:.0e} to {sweep.end_lr:.0e}, "
                      f"batch {batch_size}, stops early if the loss diverges"))


def _result(lrs: list[float], losses: list[float], smoothing: float,
            num_steps: int) -> LRFinderResult:
    smoothed, average = [], 0.0
    for index, loss in enumerate(losses):
        average = smoothing * average + (1 - smoothing) * loss
        smoothed.append(average / (1 - smoothing ** (index + 1)))
    diverged = len(lrs) < num_steps or not math.isfinite(smoothed[-1])
    finite = [i for i, s in enumerate(smoothed) if math.isfinite(s)]
    # The diverging tail is not a candidate: drop it before looking for the steepest fall.
    usable = finite[:-1] if diverged and len(finite) > 1 else finite
    suggestion, min_loss_lr = _suggest(np.array([lrs[i] for i in usable]),
                                       np.array([smoothed[i] for i in usable]))
    return LRFinderResult(lrs, losses, smoothed, suggestion, min_loss_lr, diverged)
