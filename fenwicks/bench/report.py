"""The report `python -m fenwicks bench` prints: a fixed-column table with a legend, or JSON."""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from fenwicks.bench import timing
from fenwicks.bench.matmul import (
    DTYPES,
    MatmulResult,
    accelerator_name,
    check_args,
    cpu_vs_numpy,
    make_plan,
    or_one,
    speed_ratio,
)
from fenwicks.bench.peaks import CpuInfo, cpu_info
from fenwicks.bench.timing import DEFAULT_TRIALS, measure


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
            _row(HEADER),
            _row(tuple("-" * len(h) for h in HEADER)),
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
HEADER = ("device", "dtype", "N", "reps", "cold s", "cold TF", "min TF", "med TF",
           "max TF", "cold x", "x cpu", "peak TF", "%peak")
WIDTHS = (14, 9, 6, 5, 8, 9, 9, 9, 9, 7, 7, 9, 6)
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
    first = f"{cells[0]:<{WIDTHS[0]}}"
    return first + "".join(f"{c:>{w}}" for c, w in zip(cells[1:], WIDTHS[1:], strict=True))


def _maybe(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _describe_accelerator(acc: Any) -> str:
    if acc.simulated:
        return (f"SIMULATION: cpu:{acc.num_replicas} splits the host CPU into "
                f"{acc.num_replicas} logical devices that share its cores; these are not "
                "TPU numbers")
    if acc.kind == "cpu":
        return "none (CPU only)"
    name = accelerator_name(acc)
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

    Examples:
        >>> print(fw.bench.run(n=1024).table())
    """
    from fenwicks import accel

    check_args(None, or_one(n), "float32", or_one(repeats), trials)
    acc = accel.current()
    cpu32, reference = cpu_vs_numpy(n, repeats, trials)
    results, errors = [cpu32], []
    others = [("cpu", "bfloat16")]
    if acc.kind != "cpu" or acc.simulated:
        others += [(None, dtype) for dtype in _accelerator_dtypes(acc.kind)]
    for device, dtype in others:
        try:
            plan = make_plan(device, n, dtype, repeats, None)
            # pause: the previous row's worker threads may still be spinning. Read from
            # the module, so one setting of timing.INTERLEAVE_PAUSE governs every call.
            row_timing = measure([plan.call], trials, pause=timing.INTERLEAVE_PAUSE)[0]
            results.append(plan.result(row_timing))
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

