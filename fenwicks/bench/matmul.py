"""The workload: chains of N x N matrix products in TensorFlow (and numpy, the reference).

``C <- C @ B`` repeated `repeats` times inside one compiled call (a chain, so no product
can be skipped or merged), N x N matrices, float32, bfloat16 and, on GPUs, float16. A
product costs 2 * N**3 FLOPs (N**3 multiply-adds).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from typing import Any

from fenwicks.bench.peaks import accelerator_peak_tflops, cpu_info, tpu_type_from_env
from fenwicks.bench.timing import DEFAULT_TRIALS, Timing, measure

DTYPES = ("float32", "bfloat16", "float16")
DEVICES = (None, "cpu", "gpu", "tpu")
DEFAULT_N = {"cpu": 2048, "gpu": 8192, "tpu": 8192}  # each large enough to saturate
DEFAULT_REPEATS = {"cpu": 5, "gpu": 20, "tpu": 50}  # seconds per call, not milliseconds


def matmul_flop_count(n: int, repeats: int = 1, replicas: int = 1) -> int:
    """FLOPs of `repeats` chained N x N products on each of `replicas` devices.

    One product has N**2 outputs, each a dot product of N multiply-adds: 2 * N**3 FLOPs.

    Examples:
        >>> matmul_flop_count(1024, repeats=10)
        21474836480
    """
    return 2 * n**3 * repeats * replicas



@dataclasses.dataclass(frozen=True)
class MatmulResult:
    """One benchmark row.

    Attributes:
        device: the row's label, e.g. ``'cpu'``, ``'tpu x8'``, ``'numpy'``.
        kind: ``'cpu'``, ``'gpu'``, ``'tpu'`` or ``'numpy'``.
        dtype: the matrices' dtype.
        n: matrix size (N x N).
        repeats: chained products per call and replica.
        replicas: devices computing at once (each its own chain).
        flops: FLOPs per call, 2 * N**3 * repeats * replicas.
        cold_seconds: the first call, tracing and compilation included.
        seconds: the timed warm calls.
        peak_tflops: theoretical peak of all replicas together, or None if unknown.
        simulated: logical CPU devices standing in for replicas (``cpu:N``).
    """

    device: str
    kind: str
    dtype: str
    n: int
    repeats: int
    replicas: int
    flops: int
    cold_seconds: float
    seconds: tuple[float, ...]
    peak_tflops: float | None = None
    simulated: bool = False

    def _tflops(self, seconds: float) -> float:
        return self.flops / seconds / 1e12

    @property
    def tflops(self) -> float:
        """Warm steady state: FLOPs over the median warm call."""
        return self._tflops(statistics.median(self.seconds))

    @property
    def min_tflops(self) -> float:
        return self._tflops(max(self.seconds))

    @property
    def max_tflops(self) -> float:
        return self._tflops(min(self.seconds))

    @property
    def cold_tflops(self) -> float:
        return self._tflops(self.cold_seconds)

    @property
    def peak_fraction(self) -> float | None:
        return None if not self.peak_tflops else self.tflops / self.peak_tflops

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "seconds": list(self.seconds),
                "tflops": self.tflops, "min_tflops": self.min_tflops,
                "max_tflops": self.max_tflops, "cold_tflops": self.cold_tflops,
                "peak_fraction": self.peak_fraction}


def speed_ratio(result: MatmulResult, reference: MatmulResult) -> float:
    """How many times faster `result` ran than `reference` (TFLOPS over TFLOPS).

    For two benchmarks timed interleaved by `measure` (same FLOPs, same number of
    rounds) this is the median of the per-round ratios: load from other processes
    drifts over seconds, so it cancels within a round; otherwise the ratio of medians.

    Examples:
        >>> tf_cpu, np_cpu = fw.bench.cpu_vs_numpy(n=2048)
        >>> fw.bench.speed_ratio(tf_cpu, np_cpu)
        1.09
    """
    if len(result.seconds) != len(reference.seconds) or result.flops != reference.flops:
        return result.tflops / reference.tflops
    return statistics.median(
        ref / ours for ours, ref in zip(result.seconds, reference.seconds, strict=True))



# ---------------------------------------------------------------------- the workloads


def _check_positive(name: str, value: Any, hint: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer; {hint}")
    return value


def or_one(value: Any) -> Any:
    """None (use the default) validates as 1; 0 must still be rejected."""
    return 1 if value is None else value


def check_args(device: str | None, n: int, dtype: str, repeats: int, trials: int) -> None:
    """Raises a ValueError naming the first argument of a matmul benchmark out of range."""
    if device not in DEVICES:
        raise ValueError(f"device={device!r} must be None (the current accelerator), "
                         "'cpu', 'gpu' or 'tpu'")
    if dtype not in DTYPES:
        raise ValueError(f"dtype={dtype!r} must be one of {DTYPES}")
    _check_positive("n", n, "e.g. n=2048 on a CPU, n=8192 on a GPU or TPU")
    _check_positive("repeats", repeats, "e.g. repeats=10 chained products per call")
    _check_positive("trials", trials, "e.g. trials=5 timed calls for the median")


def _operands(strategy: Any, device: str, n: int, dtype: str) -> tuple[Any, Any]:
    """A and B as variables on the device (mirrored to every replica under `strategy`).

    Made once, outside the timed calls: generating 2 * N**2 random numbers per call
    would add ~10% to a one-product call on a CPU. Entries are N(0, 1/N), so C @ B keeps
    C's scale: a long chain stays finite in float16 and never sinks into (slow, on
    CPUs) denormals.
    """
    import tensorflow as tf

    scale = 1.0 / math.sqrt(n)
    with strategy.scope() if strategy is not None else tf.device(device):
        return tuple(tf.Variable(tf.cast(tf.random.stateless_normal(
            [n, n], seed=[seed, 7], stddev=scale), dtype), trainable=False)
            for seed in (1, 2))


def matmul_chain(a: Any, b: Any, repeats: Any) -> Any:
    """``A @ B @ B ... @ B`` with `repeats` products, in graph or eager mode.

    Each product needs the previous one, so no compiler can merge or skip them (a loop
    of independent ``A @ B`` would be computed once).
    """
    import tensorflow as tf

    c = a
    for _ in tf.range(repeats):
        c = tf.matmul(c, b)
    return c


def _tf_call(device: str, strategy: Any, n: int, dtype: str, repeats: int,
             jit_compile: bool | None) -> Callable[[], float]:
    """A zero-argument callable running the chain and returning c[0, 0] on the host."""
    import tensorflow as tf

    a, b = _operands(strategy, device, n, dtype)

    def replica_fn(reps: Any) -> Any:
        return tf.cast(matmul_chain(a, b, reps)[0, 0], tf.float32)

    @tf.function(jit_compile=jit_compile)
    def step(reps: Any) -> Any:
        if strategy is None:
            with tf.device(device):
                return replica_fn(reps)
        values = strategy.run(replica_fn, args=(reps,))
        return strategy.reduce("SUM", values, axis=None)

    reps = tf.constant(repeats, tf.int32)
    # .numpy() waits for the device: the clock never stops on an asynchronous launch.
    return lambda: float(step(reps).numpy())


def _numpy_call(n: int, repeats: int) -> Callable[[], float]:
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), dtype=np.float32) / np.float32(math.sqrt(n))
            for _ in range(2))

    def call() -> float:
        c = a
        for _ in range(repeats):
            c = c @ b
        return float(c[0, 0])

    return call


@dataclasses.dataclass(frozen=True)
class _Plan:
    """A benchmark ready to time: its row metadata and its call."""

    device: str
    kind: str
    dtype: str
    n: int
    repeats: int
    replicas: int
    peak_tflops: float | None
    simulated: bool
    call: Callable[[], Any]

    def result(self, timing: Timing) -> MatmulResult:
        flops = matmul_flop_count(self.n, self.repeats, self.replicas)
        return MatmulResult(self.device, self.kind, self.dtype, self.n, self.repeats,
                            self.replicas, flops, timing.cold, timing.warm,
                            self.peak_tflops, self.simulated)


def accelerator_name(acc: Any) -> str:
    """The name the peak table knows `acc` by: the TPU type, else the first device."""
    if acc.kind == "tpu":
        return tpu_type_from_env() or "TPU"
    return acc.devices[0] if acc.devices else acc.kind


def make_plan(device: str | None, n: int | None, dtype: str, repeats: int | None,
              jit_compile: bool | None) -> _Plan:
    """Resolves `device` against `fw.accel.current()` and builds the call."""
    from fenwicks import accel

    acc = accel.current()
    target = acc.kind if device is None else device
    if target != "cpu" and target != acc.kind:
        raise ValueError(f"device={device!r} is not present: this runtime's accelerator is "
                         f"{acc.kind!r}; use device=None or 'cpu'")
    n = n or DEFAULT_N[target]
    repeats = repeats or DEFAULT_REPEATS[target]
    if target == "cpu" and not (device is None and acc.simulated):
        peak = cpu_info().peak_tflops(dtype)
        call = _tf_call("/CPU:0", None, n, dtype, repeats, jit_compile)
        return _Plan("cpu", "cpu", dtype, n, repeats, 1, peak, False, call)
    replicas = acc.num_replicas
    if acc.simulated:  # the host's cores are shared: split the work instead of multiplying
        repeats = max(1, math.ceil(repeats / replicas))
        peak = cpu_info().peak_tflops(dtype)
    else:
        one = accelerator_peak_tflops(acc.kind, accelerator_name(acc), dtype)
        peak = None if one is None else one * replicas
    label = acc.kind + (f" x{replicas}" if replicas > 1 else "") + (
        " (sim)" if acc.simulated else "")
    call = _tf_call("", _strategy(acc), n, dtype, repeats, jit_compile)
    return _Plan(label, acc.kind, dtype, n, repeats, replicas, peak, acc.simulated, call)


def _strategy(acc: Any) -> Any:
    """Every replica's device: the tf engine's strategy (`fw.train.tf.strategy`); on the
    jax engine, where JAX holds the accelerator and there is no strategy, TensorFlow's
    default (one device)."""
    if acc.engine == "tf":
        from fenwicks.train.tf import devices

        return devices.strategy()
    import tensorflow as tf

    return tf.distribute.get_strategy()


def matmul_flops(device: str | None = None, n: int | None = None, dtype: str = "float32",
                 repeats: int | None = None, trials: int = DEFAULT_TRIALS,
                 jit_compile: bool | None = None) -> MatmulResult:
    """Measures the TFLOPS of a chain of N x N matrix products on one device kind.

    Args:
        device: ``'cpu'`` (the host, one device on all cores), ``'gpu'`` or ``'tpu'``
            (every replica of `fw.accel.current()`'s strategy, each its own chain), or
            None for the current accelerator. Under ``cpu:N`` None means the N simulated
            replicas. Defaults to None.
        n: matrix size. Defaults to 2048 on a CPU, 8192 on a GPU or TPU.
        dtype: ``'float32'``, ``'bfloat16'`` or ``'float16'``. Defaults to ``'float32'``.
        repeats: chained products per call. Defaults to 5 on a CPU, 20 on a GPU, 50 on
            a TPU (under ``cpu:N``, split between the N replicas).
        trials: timed warm calls; the report gives their min, median and max.
            Defaults to 5.
        jit_compile: XLA-compile the call. Defaults to None (TensorFlow decides: XLA on
            TPUs, oneDNN/cuBLAS kernels on CPUs and GPUs).

    Returns:
        A `MatmulResult`; ``.tflops`` is the warm median, ``.cold_tflops`` the first call.

    Raises:
        ValueError: for a bad argument or an absent device, before anything runs.

    Examples:
        >>> r = fw.bench.matmul_flops('cpu', n=1024, repeats=10)
        >>> print(f"{r.tflops:.3f} TFLOPS, {r.peak_fraction:.0%} of peak")
        0.098 TFLOPS, 59% of peak
    """
    check_args(device, or_one(n), dtype, or_one(repeats), trials)
    plan = make_plan(device, n, dtype, repeats, jit_compile)
    [timing] = measure([plan.call], trials)
    return plan.result(timing)


def numpy_matmul_flops(n: int = DEFAULT_N["cpu"], repeats: int = DEFAULT_REPEATS["cpu"],
                       trials: int = DEFAULT_TRIALS) -> MatmulResult:
    """The same float32 chain with numpy's ``@`` (its BLAS): the reference for the CPU.

    Examples:
        >>> fw.bench.numpy_matmul_flops(n=1024, repeats=10).tflops
        0.095
    """
    check_args("cpu", n, "float32", repeats, trials)
    plan = _numpy_plan(n, repeats)
    [timing] = measure([plan.call], trials)
    return plan.result(timing)


def cpu_vs_numpy(n: int | None = None, repeats: int | None = None,
                 trials: int = DEFAULT_TRIALS,
                 jit_compile: bool | None = None) -> tuple[MatmulResult, MatmulResult]:
    """TensorFlow's and numpy's float32 CPU TFLOPS on the same chain, timed interleaved.

    Args:
        n: matrix size. Defaults to 2048.
        repeats: chained products per call. Defaults to 5.
        trials: timed calls of each. Defaults to 5.
        jit_compile: XLA-compile TensorFlow's call. Defaults to None (oneDNN kernels).

    Returns:
        (TensorFlow's result, numpy's result).

    Examples:
        >>> tf_cpu, np_cpu = fw.bench.cpu_vs_numpy(n=2048)
        >>> tf_cpu.tflops / np_cpu.tflops
        1.04
    """
    check_args("cpu", or_one(n), "float32", or_one(repeats), trials)
    plan = make_plan("cpu", n, "float32", repeats, jit_compile)
    reference = _numpy_plan(plan.n, plan.repeats)
    tf_timing, numpy_timing = measure([plan.call, reference.call], trials)
    return plan.result(tf_timing), reference.result(numpy_timing)


def _numpy_plan(n: int, repeats: int) -> _Plan:
    return _Plan("numpy", "numpy", "float32", n, repeats, 1, cpu_info().peak_tflops(),
                 False, _numpy_call(n, repeats))

