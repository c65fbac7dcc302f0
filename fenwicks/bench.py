"""Accelerator benchmark: matrix-product TFLOPS on the CPU and on each accelerator.

    python -m fenwicks bench            # fixed-column table
    python -m fenwicks bench --json     # the same numbers for scripts

One workload everywhere: ``C <- C @ B`` repeated `repeats` times inside one compiled call
(a chain, so no product can be skipped or merged), N x N matrices, float32, bfloat16 and,
on GPUs, float16. A product costs 2 * N**3 FLOPs (N**3 multiply-adds). Each device gets
a cold call (tracing and compilation included), one untimed warm-up call, then `trials`
timed calls; the clock stops only after a scalar result reaches the host, which waits for
the device. Calls of different benchmarks are interleaved round-robin, so that load from
other processes on a shared machine hits them alike.

Peaks are estimates: vendor datasheet figures (dense, boost clock) for TPUs and NVIDIA
GPUs, and cores x clock x FLOPs per cycle for the CPU, the FLOPs per cycle inferred from
the instruction set in ``/proc/cpuinfo``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "CpuInfo", "MatmulResult", "Report", "ThroughputResult", "Timing",
    "accelerator_peak_tflops", "cpu_info", "cpu_vs_numpy", "gpu_peak_tflops", "main",
    "matmul_chain", "matmul_flop_count", "matmul_flops", "measure", "numpy_matmul_flops",
    "run", "speed_ratio", "tpu_version", "train_throughput",
]

DTYPES = ("float32", "bfloat16", "float16")
DEVICES = (None, "cpu", "gpu", "tpu")
DEFAULT_N = {"cpu": 2048, "gpu": 8192, "tpu": 8192}  # each large enough to saturate
DEFAULT_REPEATS = {"cpu": 5, "gpu": 20, "tpu": 50}  # seconds per call, not milliseconds
DEFAULT_TRIALS = 5
_CPUFREQ_MAX = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"  # kHz
_CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"  # "quota period" or "max period"

# TPU bfloat16 peak TFLOPS per replica (Google Cloud TPU docs, per chip). v2 and v3 chips
# hold two TensorCores and each core is a replica, so a replica gets half a chip; v4 and
# v5p fuse a chip's two cores into one "megacore" replica; v5e and v6e have one core.
TPU_PEAK_TFLOPS = {"v2": 45 / 2, "v3": 123 / 2, "v4": 275.0, "v5e": 197.0,
                   "v5p": 459.0, "v6e": 918.0}

# NVIDIA peak TFLOPS (datasheets; dense, boost clock): name pattern, float32, TF32 tensor
# cores (float32 matmuls use them when TensorFloat-32 is on, TensorFlow's default),
# float16 and bfloat16 tensor cores. None: no such unit. First match wins: A100 before A10.
GPU_PEAK_TFLOPS: tuple[tuple[str, float, float | None, float | None, float | None], ...] = (
    (r"H100.*PCIe", 51.0, 378.0, 756.0, 756.0),
    (r"H100", 67.0, 494.7, 989.4, 989.4),
    (r"A100", 19.5, 156.0, 312.0, 312.0),
    (r"A10G", 31.2, 35.0, 70.0, 70.0),
    (r"A10\b", 31.2, 62.5, 125.0, 125.0),
    (r"\bL4\b", 30.3, 60.0, 121.0, 121.0),
    (r"RTX 4090", 82.6, 82.6, 165.2, 165.2),
    (r"RTX 3090", 35.6, 35.6, 71.0, 71.0),
    (r"V100.*PCIE", 14.0, None, 112.0, None),
    (r"V100", 15.7, None, 125.0, None),
    (r"\bT4\b", 8.1, None, 65.0, None),
    (r"P100", 9.3, None, 18.7, None),
    (r"\bP4\b", 5.5, None, None, None),
    (r"K80", 4.37, None, None, None),
)


def matmul_flop_count(n: int, repeats: int = 1, replicas: int = 1) -> int:
    """FLOPs of `repeats` chained N x N products on each of `replicas` devices.

    One product has N**2 outputs, each a dot product of N multiply-adds: 2 * N**3 FLOPs.

    Example:
        >>> matmul_flop_count(1024, repeats=10)
        21474836480
    """
    return 2 * n**3 * repeats * replicas


# ----------------------------------------------------------------------------- CPU peak


@dataclasses.dataclass(frozen=True)
class CpuInfo:
    """The host CPU and its estimated peak.

    Attributes:
        name: the model name.
        cores: physical cores this process may use (SMT siblings share FMA units).
        ghz: clock in GHz: the maximum from cpufreq, else ``cpu MHz`` (None if unknown).
        clock_source: where `ghz` came from.
        isa: the widest vector instruction set found, e.g. ``'AVX-512'``.
        flops_per_cycle: float32 FLOPs per cycle per core, an estimate from `isa`.
        bf16_flops_per_cycle: bfloat16 FLOPs per cycle per core (native dot-product
            instructions double the float32 rate; without them bfloat16 runs at best at
            the float32 rate).
        note: why `flops_per_cycle` is what it is.
    """

    name: str
    cores: int
    ghz: float | None
    clock_source: str
    isa: str
    flops_per_cycle: int
    bf16_flops_per_cycle: int
    note: str = ""

    def peak_tflops(self, dtype: str = "float32") -> float | None:
        """cores x GHz x FLOPs/cycle / 1000 for `dtype`; None where unknown.

        Example:
            >>> cpu_info().peak_tflops('float32')
            0.166
        """
        per_cycle = {"float32": self.flops_per_cycle,
                     "bfloat16": self.bf16_flops_per_cycle}.get(dtype)
        if self.ghz is None or per_cycle is None:
            return None
        return self.cores * self.ghz * per_cycle / 1000.0

    def describe(self) -> str:
        clock = f"{self.ghz:.2f} GHz" if self.ghz else "unknown clock"
        peak = self.peak_tflops()
        peak_text = f"{peak:.3f} TFLOPS" if peak is not None else "unknown"
        return (f"{self.name}: {self.cores} cores x {clock} ({self.clock_source}) x "
                f"{self.flops_per_cycle} FLOP/cycle ({self.isa}{self.note}) = "
                f"{peak_text} float32 peak (estimate)")


def _cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    """/proc/cpuinfo as one dict per logical processor."""
    blocks = []
    for chunk in text.strip().split("\n\n"):
        fields = {}
        for line in chunk.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        if fields:
            blocks.append(fields)
    return blocks


def _vector_flops(flags: set[str], vendor: str, family: int) -> tuple[str, int, int, str]:
    """(isa, float32 and bfloat16 FLOPs/cycle/core, note) from the CPU flags.

    Assumes two FMA units per core, as in every server core of the last decade; a core
    with one 512-bit unit (some Xeon Silver/Bronze) reaches half the AVX-512 figure.
    """
    note = ""
    if "avx512f" in flags:
        isa, fp32 = "AVX-512", 64  # 2 units x 16 float32 lanes x 2 (multiply + add)
        if vendor == "AuthenticAMD" and family == 0x19:
            # Zen 4 executes each 512-bit op as two 256-bit halves: AVX2's rate.
            fp32, note = 32, ", Zen 4: 256-bit datapaths"
    elif {"avx2", "fma"} <= flags:
        isa, fp32 = "AVX2+FMA", 32
    elif "avx" in flags:
        isa, fp32 = "AVX", 16  # separate 8-lane add and multiply, no FMA
    elif "sse2" in flags:
        isa, fp32 = "SSE2", 8
    else:
        isa, fp32 = "scalar", 2
    bf16 = fp32
    if "amx_bf16" in flags:
        bf16, isa = 1024, isa + "+AMX"  # Intel's figure for AMX: 1024 bf16 FLOPs/cycle
    elif "avx512_bf16" in flags:
        bf16 = 2 * fp32  # VDPBF16PS: two bfloat16 products per float32 lane
    return isa, fp32, bf16, note


def _usable_cores(blocks: list[dict[str, str]], allowed: set[int]) -> int:
    """Physical cores among the processors this process may run on."""
    cores = {(b.get("physical id", "0"), b.get("core id", b.get("processor")))
             for b in blocks if int(b.get("processor", -1)) in allowed}
    count = len(cores) or len(allowed)
    try:  # a container's CPU quota (cgroup v2) caps the usable cores further
        with open(_CGROUP_CPU_MAX, encoding="utf-8") as f:
            quota, period = f.read().split()
        if quota != "max":
            count = min(count, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return count


def _clock_ghz(blocks: list[dict[str, str]]) -> tuple[float | None, str]:
    """The maximum clock from cpufreq if the kernel exposes it, else /proc/cpuinfo."""
    try:
        with open(_CPUFREQ_MAX, encoding="utf-8") as f:
            return int(f.read()) / 1e6, "cpufreq max"
    except (OSError, ValueError):
        pass
    mhz = [float(b["cpu MHz"]) for b in blocks if "cpu MHz" in b]
    if mhz:
        return max(mhz) / 1000.0, "/proc/cpuinfo cpu MHz"
    return None, "clock unknown"


def cpu_info(cpuinfo_text: str | None = None, allowed: set[int] | None = None) -> CpuInfo:
    """Reads the host CPU and estimates its peak FLOPs.

    The peak is cores x clock x FLOPs per cycle per core, the last inferred from the
    instruction set (AVX-512: 64 float32 FLOPs/cycle with two FMA units, but 32 on AMD
    Zen 4, which splits 512-bit ops into 256-bit halves; AVX2+FMA: 32, AVX: 16, SSE2: 8).
    It is an estimate: turbo clocks (a VM reports its base clock), AVX-512 down-clocking
    and single-FMA-unit parts move the true figure.

    Args:
        cpuinfo_text: the text of ``/proc/cpuinfo``. Defaults to reading it.
        allowed: processor numbers this process may use. Defaults to its affinity.

    Example:
        >>> fw.bench.cpu_info().describe()
        'AMD EPYC: 2 cores x 2.60 GHz (...) x 32 FLOP/cycle (AVX-512...) = 0.166 TFLOPS ...'
    """
    if cpuinfo_text is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                cpuinfo_text = f.read()
        except OSError:  # not Linux: no instruction set to read, so no peak
            cpuinfo_text = ""
    if allowed is None:
        allowed = (os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity")
                   else set(range(os.cpu_count() or 1)))
    blocks = _cpuinfo_blocks(cpuinfo_text)
    first = blocks[0] if blocks else {}
    isa, fp32, bf16, note = _vector_flops(set(first.get("flags", "").split()),
                                          first.get("vendor_id", ""),
                                          int(first.get("cpu family", "0") or 0))
    ghz, source = _clock_ghz(blocks)
    if "hypervisor" in first.get("flags", "").split() and source.startswith("/proc"):
        source += ", a VM's base clock: turbo runs faster"  # KVM reports the TSC rate
    name = first.get("model name") or (os.uname().machine if hasattr(os, "uname") else "CPU")
    return CpuInfo(name, _usable_cores(blocks, allowed), ghz, source, isa, fp32, bf16, note)


# ------------------------------------------------------------------- accelerator peaks


def tpu_version(accelerator_type: str | None) -> str | None:
    """Normalises a TPU type such as ``'v3-8'`` or ``'v5litepod-4'`` to a key of
    `TPU_PEAK_TFLOPS`, or None if unrecognised.

    Example:
        >>> tpu_version('v5litepod-8')
        'v5e'
    """
    match = re.match(r"^(?:tpu[-_ ]?)?v(\d)(p|e|lite|litepod)?\b", (accelerator_type or "").lower())
    if not match:
        return None
    suffix = {"lite": "e", "litepod": "e"}.get(match.group(2), match.group(2) or "")
    key = f"v{match.group(1)}{suffix}"
    return key if key in TPU_PEAK_TFLOPS else None


def _tpu_type_from_env() -> str | None:
    """TPU VMs and GKE set the type; Colab's TPU node (COLAB_TPU_ADDR) was always a v2-8."""
    for name in ("TPU_ACCELERATOR_TYPE", "ACCELERATOR_TYPE"):
        if os.environ.get(name):
            return os.environ[name]
    return "v2-8" if os.environ.get("COLAB_TPU_ADDR") else None


def gpu_peak_tflops(name: str, dtype: str, tf32: bool = True) -> float | None:
    """Datasheet peak TFLOPS of the NVIDIA GPU called `name` for `dtype`, or None.

    Args:
        name: the device name TensorFlow reports, e.g. ``'Tesla T4'``.
        dtype: ``'float32'``, ``'bfloat16'`` or ``'float16'``.
        tf32: whether float32 matmuls use TensorFloat-32 tensor cores (Ampere and
            later, on by default in TensorFlow). Defaults to True.

    Example:
        >>> gpu_peak_tflops('NVIDIA A100-SXM4-40GB', 'bfloat16')
        312.0
    """
    for pattern, fp32, tf32_peak, fp16, bf16 in GPU_PEAK_TFLOPS:
        if re.search(pattern, name, re.IGNORECASE):
            if dtype == "float32":
                return tf32_peak if tf32 and tf32_peak is not None else fp32
            return {"float16": fp16, "bfloat16": bf16}.get(dtype)
    return None


def accelerator_peak_tflops(kind: str, device_name: str, dtype: str) -> float | None:
    """Peak TFLOPS of one replica of a `kind` ('gpu' or 'tpu') device, or None.

    On a TPU, float32 matmuls run as single bfloat16 passes at TensorFlow's default
    precision (with TensorFloat-32 on), so they share the bfloat16 peak.
    """
    import tensorflow as tf

    tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
    if kind == "gpu":
        return gpu_peak_tflops(device_name, dtype, tf32)
    if kind == "tpu" and (dtype == "bfloat16" or (dtype == "float32" and tf32)):
        return TPU_PEAK_TFLOPS.get(tpu_version(device_name) or "")
    return None


# ------------------------------------------------------------------------------ timing


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds of one cold call and of the timed warm calls."""

    cold: float
    warm: tuple[float, ...]


def measure(calls: Sequence[Callable[[], Any]], trials: int = DEFAULT_TRIALS,
            clock: Callable[[], float] = time.perf_counter,
            pause: float | None = None) -> list[Timing]:
    """Times each call cold, warms it up once, then times `trials` rounds.

    Each call must block until its device has finished (fetch a result to the host).
    Rounds interleave the calls (a, b, a, b, ...), so load from other processes on a
    shared machine falls on every call alike instead of on whichever ran last.

    Args:
        calls: zero-argument callables, one per benchmark.
        trials: timed calls of each. Defaults to 5.
        clock: seconds as float. Defaults to `time.perf_counter`.
        pause: seconds to sleep before each timed call. Defaults to None: 0.25 s when
            interleaving several calls, since a BLAS library's idle worker threads keep
            spinning for ~0.1 s after a call (OpenBLAS) and would steal the cores of the
            next call, made by another library; 0 for a single call.

    Example:
        >>> [t] = measure([lambda: sum(range(10**6))], trials=3)
        >>> len(t.warm)
        3
    """
    if pause is None:
        pause = _INTERLEAVE_PAUSE if len(calls) > 1 else 0.0
    cold = [_timed(call, clock, pause) for call in calls]
    for call in calls:
        call()  # warm-up: caches, allocator and thread pools settle before the clock runs
    warm: list[list[float]] = [[] for _ in calls]
    for _ in range(trials):
        for seconds, call in zip(warm, calls, strict=True):
            seconds.append(_timed(call, clock, pause))
    return [Timing(c, tuple(w)) for c, w in zip(cold, warm, strict=True)]


_INTERLEAVE_PAUSE = 0.25  # seconds; > OpenBLAS's ~0.1 s spin-wait (2**28 cycles)


def _timed(call: Callable[[], Any], clock: Callable[[], float], pause: float = 0.0) -> float:
    if pause:
        time.sleep(pause)
    start = clock()
    call()
    return clock() - start


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

    Example:
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


def _or_one(value: Any) -> Any:
    """None (use the default) validates as 1; 0 must still be rejected."""
    return 1 if value is None else value


def _check_args(device: str | None, n: int, dtype: str, repeats: int, trials: int) -> None:
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


def _accelerator_name(acc: Any) -> str:
    if acc.kind == "tpu":
        return _tpu_type_from_env() or "TPU"
    return acc.devices[0] if acc.devices else acc.kind


def _plan(device: str | None, n: int | None, dtype: str, repeats: int | None,
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
        one = accelerator_peak_tflops(acc.kind, _accelerator_name(acc), dtype)
        peak = None if one is None else one * replicas
    label = acc.kind + (f" x{replicas}" if replicas > 1 else "") + (
        " (sim)" if acc.simulated else "")
    call = _tf_call("", acc.strategy, n, dtype, repeats, jit_compile)
    return _Plan(label, acc.kind, dtype, n, repeats, replicas, peak, acc.simulated, call)


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

    Example:
        >>> r = fw.bench.matmul_flops('cpu', n=1024, repeats=10)
        >>> print(f"{r.tflops:.3f} TFLOPS, {r.peak_fraction:.0%} of peak")
        0.098 TFLOPS, 59% of peak
    """
    _check_args(device, _or_one(n), dtype, _or_one(repeats), trials)
    plan = _plan(device, n, dtype, repeats, jit_compile)
    [timing] = measure([plan.call], trials)
    return plan.result(timing)


def numpy_matmul_flops(n: int = DEFAULT_N["cpu"], repeats: int = DEFAULT_REPEATS["cpu"],
                       trials: int = DEFAULT_TRIALS) -> MatmulResult:
    """The same float32 chain with numpy's ``@`` (its BLAS): the reference for the CPU.

    Example:
        >>> fw.bench.numpy_matmul_flops(n=1024, repeats=10).tflops
        0.095
    """
    _check_args("cpu", n, "float32", repeats, trials)
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

    Example:
        >>> tf_cpu, np_cpu = fw.bench.cpu_vs_numpy(n=2048)
        >>> tf_cpu.tflops / np_cpu.tflops
        1.04
    """
    _check_args("cpu", _or_one(n), "float32", _or_one(repeats), trials)
    plan = _plan("cpu", n, "float32", repeats, jit_compile)
    reference = _numpy_plan(plan.n, plan.repeats)
    tf_timing, numpy_timing = measure([plan.call, reference.call], trials)
    return plan.result(tf_timing), reference.result(numpy_timing)


def _numpy_plan(n: int, repeats: int) -> _Plan:
    return _Plan("numpy", "numpy", "float32", n, repeats, 1, cpu_info().peak_tflops(),
                 False, _numpy_call(n, repeats))


# ---------------------------------------------------------------------------- the report


@dataclasses.dataclass(frozen=True)
class Report:
    """Everything `python -m fenwicks bench` prints.

    Attributes:
        cpu: the host CPU and its estimated peak.
        accelerator: what `fw.accel.current()` found, in words.
        simulated: True under ``cpu:N``: the replicas are logical devices on the host.
        results: one row per device and dtype; the CPU float32 row comes first.
        numpy: the numpy reference with the CPU float32 row's N and repeats, or None.
        errors: rows that could not run (e.g. bfloat16 on a GPU without support).
    """

    cpu: CpuInfo
    accelerator: str
    simulated: bool
    results: tuple[MatmulResult, ...]
    numpy: MatmulResult | None = None
    errors: tuple[str, ...] = ()

    @property
    def baseline(self) -> MatmulResult | None:
        """The CPU float32 row (one device, all cores): what speed-ups are relative to."""
        return next((r for r in self.results if r.kind == "cpu" and r.replicas == 1
                     and r.dtype == "float32"), None)

    def speedup(self, result: MatmulResult, cold: bool = False) -> float | None:
        """`result`'s TFLOPS (cold or warm median) over the CPU's float32 warm median."""
        if self.baseline is None:
            return None
        return (result.cold_tflops if cold else result.tflops) / self.baseline.tflops

    @property
    def tf_over_numpy(self) -> float | None:
        """TensorFlow's CPU float32 TFLOPS over numpy's on the same chain.

        The median of the per-round ratios: each round timed the two back to back, so
        load from other processes, which drifts over seconds, cancels within a round.
        """
        if self.numpy is None or self.baseline is None:
            return None
        return speed_ratio(self.baseline, self.numpy)

    def as_dict(self) -> dict[str, Any]:
        rows = [{**r.as_dict(), "speedup": self.speedup(r),
                 "cold_speedup": self.speedup(r, cold=True)} for r in self.results]
        return {"cpu": {**dataclasses.asdict(self.cpu), "peak_tflops": self.cpu.peak_tflops(),
                        "bf16_peak_tflops": self.cpu.peak_tflops("bfloat16")},
                "accelerator": self.accelerator, "simulated": self.simulated,
                "results": rows, "numpy": self.numpy and self.numpy.as_dict(),
                "tf_over_numpy": self.tf_over_numpy, "errors": list(self.errors)}

    def table(self) -> str:
        """The report as fixed-column text."""
        lines = [
            "What is timed: chains of N x N matrix products C <- C @ B, 'reps' products per "
            "call;",
            "each product is 2 * N^3 floating-point operations (FLOPs), on every replica. "
            "TF = TFLOPS,",
            "trillions of FLOPs per second: higher is faster.",
            f"host CPU    {self.cpu.describe()}",
            f"accelerator {self.accelerator}",
            "",
            _row(_HEADER),
            _row(tuple("-" * len(h) for h in _HEADER)),
        ]
        lines += [_row(self._cells(r)) for r in self.results]
        if self.numpy is not None:
            lines.append(_row(self._cells(self.numpy)))
            lines.append(f"\nTensorFlow CPU float32 / numpy (same N and reps, median of "
                         f"paired rounds): {self.tf_over_numpy:.2f}x")
        lines += [f"not run: {e}" for e in self.errors] + self._notes()
        lines += ["", "Columns:"] + [f"  {name:<8} {meaning}" for name, meaning in LEGEND]
        return "\n".join(lines)

    def _notes(self) -> list[str]:
        """Warnings about rows whose numbers mean less than they seem to."""
        notes = []
        short = [f"{r.device} {r.dtype}" for r in self.results
                 if statistics.median(r.seconds) < _SHORT_CALL_SECONDS]
        if short:
            notes.append(f"note: {', '.join(short)}: calls under "
                         f"{_SHORT_CALL_SECONDS * 1000:.0f} ms, where launch overhead "
                         "counts; raise repeats or n for the device's real speed")
        over = [f"{r.device} {r.dtype}" for r in (*self.results, self.numpy)
                if r is not None and r.peak_tflops and r.max_tflops > r.peak_tflops]
        if over:
            notes.append(f"note: {', '.join(over)} ran faster than the estimated peak at "
                         "times: the real clock (turbo) is above the one used, so %peak "
                         "overstates the fraction")
        return notes

    def _cells(self, r: MatmulResult) -> tuple[str, ...]:
        speedup, cold_speedup = self.speedup(r), self.speedup(r, cold=True)
        return (r.device, r.dtype, str(r.n), str(r.repeats), f"{r.cold_seconds:.3f}",
                f"{r.cold_tflops:.3f}", f"{r.min_tflops:.3f}", f"{r.tflops:.3f}",
                f"{r.max_tflops:.3f}", _maybe(cold_speedup, "{:.1f}"),
                _maybe(speedup, "{:.1f}"), _maybe(r.peak_tflops, "{:.3f}"),
                _maybe(r.peak_fraction and 100 * r.peak_fraction, "{:.0f}%"))


_SHORT_CALL_SECONDS = 0.02  # below this, per-call dispatch and sync overhead shows
_HEADER = ("device", "dtype", "N", "reps", "cold s", "cold TF", "min TF", "med TF",
           "max TF", "cold x", "x cpu", "peak TF", "%peak")
_WIDTHS = (14, 9, 6, 5, 8, 9, 9, 9, 9, 7, 7, 9, 6)
# Printed under the table: every column in words, for someone new to benchmarks.
LEGEND = (
    ("device", "where it ran: cpu = all host cores as one device; the accelerator with "
               "its replicas (x8 = 8 at once); numpy = the same chain in numpy, for reference"),
    ("dtype", "number format: float32 (full precision); bfloat16 and float16 are 16-bit, "
              "faster on hardware built for them"),
    ("N", "matrix size: N x N"),
    ("reps", "products chained in one timed call"),
    ("cold s", "seconds of the first call, which includes compiling it"),
    ("cold TF", "TFLOPS of that first call"),
    ("min TF", "TFLOPS of the slowest warm call (every call after the first)"),
    ("med TF", "median TFLOPS of the warm calls: the speed to expect"),
    ("max TF", "TFLOPS of the fastest warm call"),
    ("cold x", "cold TF / the CPU float32 med TF"),
    ("x cpu", "med TF / the CPU float32 med TF: times faster than the plain CPU"),
    ("peak TF", "the device's theoretical maximum: datasheet for TPUs and GPUs, estimated "
                "(cores x clock x FLOPs per cycle) for the CPU"),
    ("%peak", "med TF as a share of peak TF: how much of the hardware the code uses"),
)


def _row(cells: Sequence[str]) -> str:
    first = f"{cells[0]:<{_WIDTHS[0]}}"
    return first + "".join(f"{c:>{w}}" for c, w in zip(cells[1:], _WIDTHS[1:], strict=True))


def _maybe(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _describe_accelerator(acc: Any) -> str:
    if acc.simulated:
        return (f"SIMULATION: cpu:{acc.num_replicas} splits the host CPU into "
                f"{acc.num_replicas} logical devices that share its cores; these are not "
                "TPU numbers")
    if acc.kind == "cpu":
        return "none (CPU only)"
    name = _accelerator_name(acc)
    return f"{acc.kind} x{acc.num_replicas}: {name}"


def _accelerator_dtypes(kind: str) -> tuple[str, ...]:
    return {"gpu": DTYPES, "tpu": ("float32", "bfloat16")}.get(kind, ("float32",))


def run(n: int | None = None, repeats: int | None = None,
        trials: int = DEFAULT_TRIALS) -> Report:
    """Benchmarks the CPU (float32 against numpy, and bfloat16) and the accelerator.

    Args:
        n: matrix size for every row. Defaults to 2048 on the CPU, 8192 on GPUs/TPUs.
        repeats: chained products per call for every row. Defaults per device kind.
        trials: timed warm calls per row. Defaults to 5.

    Returns:
        A `Report`; ``print(report.table())`` or ``report.as_dict()``.

    Example:
        >>> print(fw.bench.run(n=1024).table())
    """
    from fenwicks import accel

    _check_args(None, _or_one(n), "float32", _or_one(repeats), trials)
    acc = accel.current()
    cpu32, reference = cpu_vs_numpy(n, repeats, trials)
    results, errors = [cpu32], []
    others = [("cpu", "bfloat16")]
    if acc.kind != "cpu" or acc.simulated:
        others += [(None, dtype) for dtype in _accelerator_dtypes(acc.kind)]
    for device, dtype in others:
        try:
            plan = _plan(device, n, dtype, repeats, None)
            # pause: the previous row's worker threads may still be spinning
            timing = measure([plan.call], trials, pause=_INTERLEAVE_PAUSE)[0]
            results.append(plan.result(timing))
        except Exception as err:  # noqa: BLE001 - e.g. a dtype the device lacks
            errors.append(f"{device or acc.kind} {dtype}: {type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}")
    return Report(cpu_info(), _describe_accelerator(acc), acc.simulated, tuple(results),
                  reference, tuple(errors))


def main(json_output: bool = False, n: int | None = None, repeats: int | None = None,
         trials: int = DEFAULT_TRIALS) -> int:
    """``python -m fenwicks bench [--json] [--n N] [--repeats R] [--trials T]``.

    Returns:
        The exit status: 0, or 2 for a bad argument (the message goes to stderr).
    """
    try:
        report = run(n=n, repeats=repeats, trials=trials)
    except ValueError as err:
        print(f"python -m fenwicks bench: {err}", file=sys.stderr)
        return 2
    if json_output:
        print(json.dumps(report.as_dict()))
    else:
        print(report.table())
    sys.stdout.flush()
    return 0


# ----------------------------------------------------------------- training throughput


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
        >>> r = fw.bench.train_throughput(model_func, train_input_func, batch_size=512)
        >>> print(f"{r.examples_per_second:.0f} examples/s on {r.device}")
    """
    import tensorflow as tf

    from fenwicks import accel

    _check_positive("batch_size", batch_size, "e.g. batch_size=512 (global)")
    _check_positive("steps", steps, "e.g. steps=50 per timed call")
    _check_positive("trials", trials, "e.g. trials=3 timed calls for the median")
    if work_dir is not None and tf.io.gfile.exists(work_dir) and \
            tf.train.latest_checkpoint(work_dir):
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
    from fenwicks import train

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
