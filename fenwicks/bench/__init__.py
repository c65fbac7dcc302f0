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

`import fenwicks` does not import this package: ``fw.bench`` imports it on first use.

    peaks    datasheet peaks of TPUs and GPUs; the CPU's from /proc/cpuinfo
    timing   the harness: cold call, warm-up, interleaved timed rounds
    matmul   the workloads: TensorFlow and numpy matrix-product chains
    report   the table (with its legend) or JSON, and `run` that fills it

Training throughput through the estimator is measured beside the estimator's benchmark,
in ``benchmarks/`` (it needs `fw.train`, which this package does not import).
"""

from __future__ import annotations

from fenwicks.bench.matmul import (
    DEFAULT_N,
    DEFAULT_REPEATS,
    DEVICES,
    DTYPES,
    MatmulResult,
    cpu_vs_numpy,
    matmul_chain,
    matmul_flop_count,
    matmul_flops,
    numpy_matmul_flops,
    speed_ratio,
)
from fenwicks.bench.peaks import (
    GPU_PEAK_TFLOPS,
    TPU_PEAK_TFLOPS,
    CpuInfo,
    accelerator_peak_tflops,
    cpu_info,
    gpu_peak_tflops,
    tpu_version,
)
from fenwicks.bench.report import LEGEND, Report, main, run
from fenwicks.bench.timing import DEFAULT_TRIALS, Timing, measure

__all__ = [
    "DEFAULT_N", "DEFAULT_REPEATS", "DEFAULT_TRIALS", "DEVICES", "DTYPES", "GPU_PEAK_TFLOPS",
    "LEGEND", "TPU_PEAK_TFLOPS",
    "CpuInfo", "MatmulResult", "Report", "Timing",
    "accelerator_peak_tflops", "cpu_info", "cpu_vs_numpy", "gpu_peak_tflops", "main",
    "matmul_chain", "matmul_flop_count", "matmul_flops", "measure", "numpy_matmul_flops",
    "run", "speed_ratio", "tpu_version",
]

_MOVED = {"train_throughput", "ThroughputResult"}


def __getattr__(name: str) -> object:
    if name in _MOVED:  # an actionable error for code written against the old fw.bench
        raise AttributeError(
            f"fw.bench.{name} moved beside the estimator's benchmark: "
            f"benchmarks/estimator_throughput.py in the Fenwicks repository; in a notebook, "
            "time est.train(input_fn, steps=n) with fw.bench.measure (see tutorial 08)")
    raise AttributeError(f"module 'fenwicks.bench' has no attribute {name!r}")
