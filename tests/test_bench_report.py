"""Tests for fenwicks.bench.report: the table, its legend and notes, JSON, `main`'s errors."""

from __future__ import annotations

import json

import pytest

from fenwicks.bench import report as bench_report
from fenwicks.bench.matmul import MatmulResult
from fenwicks.bench.peaks import CpuInfo


def _row(device, kind, dtype, median_seconds, replicas=1, peak=None):
    return MatmulResult(device, kind, dtype, n=1000, repeats=1, replicas=replicas,
                        flops=2 * 10**9 * replicas, cold_seconds=2 * median_seconds,
                        seconds=(median_seconds,) * 3, peak_tflops=peak)


def test_table_shape_and_speedups():
    info = CpuInfo("Test CPU", 2, 2.5, "test", "AVX2+FMA", 32, 32)
    cpu = _row("cpu", "cpu", "float32", 0.02, peak=0.16)  # 2e9 / 0.02 s = 0.1 TFLOPS
    gpu = _row("gpu", "gpu", "float16", 0.001, peak=65.0)  # 2 TFLOPS: 20x the CPU
    ref = _row("numpy", "numpy", "float32", 0.025)  # 0.08 TFLOPS
    report = bench_report.Report(info, "gpu x1: Tesla T4", False, (cpu, gpu), ref,
                                 ("gpu bfloat16: NotFoundError",))
    lines = report.table().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("device"))
    rows = lines[header + 2: header + 5]
    assert [r.split()[0] for r in rows] == ["cpu", "gpu", "numpy"]
    width = sum(bench_report.WIDTHS)
    assert {len(line) for line in lines[header: header + 5]} == {width}
    assert all(len(r.split()) == len(bench_report.HEADER) for r in rows)
    gpu_cells = dict(zip(bench_report.HEADER, rows[1].split(), strict=True))
    assert gpu_cells["med TF"] == "2.000" and gpu_cells["x cpu"] == "20.0"
    assert gpu_cells["%peak"] == "3%"  # 2 / 65
    assert report.tf_over_numpy == pytest.approx(0.1 / 0.08)
    assert "1.25x" in report.table() and "not run: gpu bfloat16" in report.table()
    assert json.loads(json.dumps(report.as_dict()))["results"][1]["speedup"] == 20.0


def test_table_explains_every_column_in_words():
    info = CpuInfo("Test CPU", 2, 2.5, "test", "AVX2+FMA", 32, 32)
    table = bench_report.Report(info, "none (CPU only)", False,
                                (_row("cpu", "cpu", "float32", 0.02),)).table()
    legend = table.split("\nColumns:\n", 1)[1].splitlines()
    assert [line.split("  ")[1].strip() for line in legend] == list(bench_report.HEADER)
    explained = dict(bench_report.LEGEND)
    assert "compiling" in explained["cold s"] and "median" in explained["med TF"]
    assert "TFLOPS" in table.split("\n\n", 1)[0]  # the unit is spelled out above the table


def test_table_flags_rows_above_the_estimated_peak():
    info = CpuInfo("Test CPU", 1, 2.0, "test", "AVX2+FMA", 32, 32)
    cpu = _row("cpu", "cpu", "float32", 0.02, peak=0.064)  # 0.1 TFLOPS > 1 x 2 x 32 GFLOPS
    table = bench_report.Report(info, "none (CPU only)", False, (cpu,)).table()
    assert "note: cpu float32 ran faster than the estimated peak" in table
    assert "156%" in table  # 0.1 / 0.064


def test_table_flags_calls_too_short_to_time():
    info = CpuInfo("Test CPU", 1, 2.0, "test", "AVX2+FMA", 32, 32)
    cpu = _row("cpu", "cpu", "float32", 0.5)
    tpu = _row("tpu x8", "tpu", "bfloat16", 0.005, replicas=8)  # 5 ms < 20 ms
    notes = bench_report.Report(info, "tpu x8: v3-8", False, (cpu, tpu)).table().splitlines()
    assert [n.split(":")[1].strip() for n in notes if n.startswith("note")] == [
        "tpu x8 bfloat16"]


def test_tf_over_numpy_is_the_median_of_paired_rounds():
    info = CpuInfo("Test CPU", 1, 2.0, "test", "AVX2+FMA", 32, 32)
    flops = 2 * 10**9
    tf_cpu = MatmulResult("cpu", "cpu", "float32", 1000, 1, 1, flops, 1.0, (1.0, 2.0, 4.0))
    ref = MatmulResult("numpy", "numpy", "float32", 1000, 1, 1, flops, 1.0, (1.2, 1.0, 4.8))
    # per round numpy/TF seconds: 1.2, 0.5, 1.2 -> median 1.2 (medians alone: 1.2 / 2 = 0.6)
    report = bench_report.Report(info, "none (CPU only)", False, (tf_cpu,), ref)
    assert report.tf_over_numpy == pytest.approx(1.2)


def test_cli_bad_argument_exits_2_with_message(capsys):
    assert bench_report.main(n=-3) == 2
    assert "n=-3 must be a positive integer" in capsys.readouterr().err
