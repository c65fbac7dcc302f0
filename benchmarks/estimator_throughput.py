"""Training throughput of any model through the estimator: `train_throughput`.

The helper behind tutorial 08's training-speed numbers, kept beside the estimator's own
benchmark (`train_throughput.py`: est vs Keras fit vs a hand-written loop) because it
drives `fw.train`; `fenwicks.bench`, the matmul benchmark, imports nothing of training.

    import sys; sys.path.insert(0, '<fenwicks checkout>')
    from benchmarks.estimator_throughput import train_throughput
    r = train_throughput(model_func, input_fn, batch_size=512)
    print(f"{r.examples_per_second:.0f} examples/s on {r.device}")
"""

from __future__ import annotations

import dataclasses
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from fenwicks import accel, train
from fenwicks.bench.timing import Timing, measure
from fenwicks.train import run_format


def _check_positive(name: str, value: Any, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer; {hint}")
    return value


@dataclasses.dataclass(frozen=True)
class ThroughputResult:
    """Training speed of one model through the estimator.

    Attributes:
        device: e.g. ``'cpu'``, ``'gpu x2'``, ``'tpu x8'``.
        precision: the estimator's compute precision.
        batch_size: global examples per step.
        steps: steps per timed `train` call.
        cold_seconds: the first call: building, tracing and compiling included.
        seconds: the timed warm calls; each also starts the input pipeline and writes
            one checkpoint, as every `train` call does.
    """

    device: str
    precision: str
    batch_size: int
    steps: int
    cold_seconds: float
    seconds: tuple[float, ...]

    @property
    def examples_per_second(self) -> float:
        """Median over the warm calls."""
        return self.steps * self.batch_size / statistics.median(self.seconds)

    @property
    def cold_examples_per_second(self) -> float:
        return self.steps * self.batch_size / self.cold_seconds

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "seconds": list(self.seconds),
                "examples_per_second": self.examples_per_second,
                "cold_examples_per_second": self.cold_examples_per_second}


def train_throughput(model_func: Callable[[dict], Any], input_fn: Callable[[dict], Any],
                     batch_size: int, steps: int = 50, trials: int = 3,
                     work_dir: str | None = None, precision: str = "auto",
                     clock: Callable[[], float] = time.perf_counter) -> ThroughputResult:
    """Examples per second of `model_func` trained through `fw.train`'s estimator.

    Runs ``est.train(input_fn, steps=steps)`` once cold (compiling), once to warm up,
    then `trials` timed times; all `steps` of a call run in one compiled loop.

    Args:
        model_func: ``params -> ModelSpec``, e.g. `fw.train.get_clf_model_func(...)`.
        input_fn: ``params -> tf.data.Dataset`` of repeated training batches.
        batch_size: global batch size (`trn_bs`), divisible by the replicas.
        steps: steps per timed call. Defaults to 50.
        trials: timed calls; the median is reported. Defaults to 3.
        work_dir: an empty checkpoint directory (a resumed run would time other
            steps). Defaults to a temporary one, removed after.
        precision: the estimator's precision. Defaults to ``'auto'``.
        clock: seconds as float. Defaults to `time.perf_counter`.

    Raises:
        ValueError: for a bad argument, or a `work_dir` that holds a checkpoint.

    Example:
        >>> r = train_throughput(model_func, train_input_func, batch_size=512)
        >>> print(f"{r.examples_per_second:.0f} examples/s on {r.device}")
    """
    _check_positive("batch_size", batch_size, "e.g. batch_size=512 (global)")
    _check_positive("steps", steps, "e.g. steps=50 per timed call")
    _check_positive("trials", trials, "e.g. trials=3 timed calls for the median")
    if work_dir is not None and tf.io.gfile.exists(work_dir) and (
            run_format.latest(work_dir) or tf.train.latest_checkpoint(work_dir)):
        raise ValueError(f"work_dir={work_dir!r} holds a checkpoint; a throughput run needs "
                         "an empty directory (or None for a temporary one)")
    scratch = tempfile.mkdtemp(prefix="fenwicks-bench-") if work_dir is None else None
    try:
        timing, used_precision = _time_training(model_func, input_fn, batch_size, steps,
                                                trials, work_dir or scratch, precision, clock)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    acc = accel.current()
    device = acc.kind + (f" x{acc.num_replicas}" if acc.num_replicas > 1 else "")
    return ThroughputResult(device, used_precision, batch_size, steps, timing.cold,
                            timing.warm)


def _time_training(model_func: Callable[[dict], Any], input_fn: Callable[[dict], Any],
                   batch_size: int, steps: int, trials: int, work_dir: str,
                   precision: str, clock: Callable[[], float]) -> tuple[Timing, str]:
    est = train.get_tpu_estimator(steps, model_func, work_dir, trn_bs=batch_size,
                                  steps_per_loop=steps, precision=precision,
                                  save_every_secs=None, verbose=False)
    [timing] = measure([lambda: est.train(input_fn, steps=steps)], trials, clock)
    expected = steps * (2 + trials)  # cold call, warm-up, timed calls
    if est.global_step != expected:  # a call that trained nothing would look infinitely fast
        raise RuntimeError(f"the estimator reached step {est.global_step}, not {expected}: "
                           "some train() calls did not run all their steps, so the timing "
                           "is void")
    return timing, est.config.precision
