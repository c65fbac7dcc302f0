"""Tests for fw.bench: FLOP counts, timing statistics, peak estimates, the table, the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fenwicks import bench
from tests.conftest import run_json

# ---------------------------------------------------------------------------- FLOPs


def _naive_matmul_counting(a: list[list[float]], b: list[list[float]]):
    """Textbook triple loop that counts every multiply and every add it performs."""
    n, ops = len(a), 0
    out = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            for k in range(n):
                out[i][j] += a[i][k] * b[k][j]
                ops += 2  # one multiply, one add
    return np.array(out), ops


def test_flop_count_matches_counted_operations():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
    product, ops = _naive_matmul_counting(a.tolist(), b.tolist())
    np.testing.assert_allclose(product, a @ b)
    assert ops == 54  # 9 outputs x 3 multiply-adds x 2
    assert bench.matmul_flop_count(3) == ops
    assert bench.matmul_flop_count(3, repeats=4, replicas=2) == 8 * ops
    # 1024**3 = 1073741824; x 2 FLOPs x 10 repeats x 8 replicas
    assert bench.matmul_flop_count(1024, repeats=10, replicas=8) == 171_798_691_840


def test_chain_performs_every_product():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 5)).astype(np.float32)
    b = (rng.standard_normal((5, 5)) / 3).astype(np.float32)
    got = np.asarray(bench.matmul_chain(a, b, 4))
    np.testing.assert_allclose(got, a @ np.linalg.matrix_power(b, 4), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(bench.matmul_chain(a, b, 1)), a @ b, rtol=1e-5)


# --------------------------------------------------------------------------- timing


class _FakeClock:
    """Advances by the next preset duration each time a call finishes."""

    def __init__(self, durations: list[float]) -> None:
        self.now, self.durations, self.log = 0.0, list(durations), []

    def __call__(self) -> float:
        return self.now

    def call(self, name: str):
        def run() -> None:
            self.log.append(name)
            self.now += self.durations.pop(0)
        return run


def test_measure_cold_warmup_and_interleaved_trials():
    # a cold, b cold, a warm-up, b warm-up, then rounds a, b, a, b, a, b
    clock = _FakeClock([10.0, 20.0, 99.0, 99.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    timing_a, timing_b = bench.measure([clock.call("a"), clock.call("b")], trials=3,
                                       clock=clock, pause=0.0)
    assert clock.log == ["a", "b", "a", "b", "a", "b", "a", "b", "a", "b"]
    assert timing_a == bench.Timing(10.0, (1.0, 3.0, 5.0))
    assert timing_b == bench.Timing(20.0, (2.0, 4.0, 6.0))


def test_result_statistics_by_hand():
    result = bench.MatmulResult("gpu", "gpu", "float32", 1000, 1, 1, flops=2 * 10**12,
                                cold_seconds=8.0, seconds=(4.0, 1.0, 2.0), peak_tflops=4.0)
    assert result.tflops == pytest.approx(1.0)  # 2e12 FLOPs / median 2 s
    assert result.min_tflops == pytest.approx(0.5)  # slowest call, 4 s
    assert result.max_tflops == pytest.approx(2.0)  # fastest call, 1 s
    assert result.cold_tflops == pytest.approx(0.25)
    assert result.peak_fraction == pytest.approx(0.25)
    assert json.loads(json.dumps(result.as_dict()))["tflops"] == pytest.approx(1.0)


# ------------------------------------------------------------------------ CPU peak


def _cpuinfo(vendor: str, family: int, flags: str, mhz: float,
             cores: list[tuple[int, int]]) -> str:
    """A /proc/cpuinfo with one block per (physical id, core id) logical processor."""
    return "\n\n".join(
        f"processor\t: {i}\nvendor_id\t: {vendor}\ncpu family\t: {family}\n"
        f"model name\t: Test CPU\ncpu MHz\t\t: {mhz}\nphysical id\t: {phys}\n"
        f"core id\t\t: {core}\nflags\t\t: fpu sse sse2 {flags}\n"
        for i, (phys, core) in enumerate(cores)) + "\n"


@pytest.fixture
def no_sysfs(monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "_CPUFREQ_MAX", str(tmp_path / "missing"))
    monkeypatch.setattr(bench, "_CGROUP_CPU_MAX", str(tmp_path / "missing"))


def test_cpu_peak_intel_avx512_amx_with_hyperthreads(no_sysfs):
    # 4 logical processors = 2 cores x 2 hyperthreads, 2000 MHz
    text = _cpuinfo("GenuineIntel", 6, "avx avx2 fma avx512f amx_bf16", 2000.0,
                    [(0, 0), (0, 1), (0, 0), (0, 1)])
    info = bench.cpu_info(text, allowed={0, 1, 2, 3})
    assert (info.cores, info.ghz, info.flops_per_cycle) == (2, 2.0, 64)
    assert info.peak_tflops("float32") == pytest.approx(2 * 2.0 * 64 / 1000)  # 0.256
    assert info.peak_tflops("bfloat16") == pytest.approx(2 * 2.0 * 1024 / 1000)
    assert info.peak_tflops("float16") is None


def test_cpu_peak_zen4_avx512_runs_at_256_bit_rate(no_sysfs):
    text = _cpuinfo("AuthenticAMD", 25, "avx avx2 fma avx512f avx512_bf16", 2596.14,
                    [(0, 0), (0, 1)])
    info = bench.cpu_info(text, allowed={0, 1})
    assert info.isa == "AVX-512" and info.flops_per_cycle == 32
    assert info.peak_tflops() == pytest.approx(2 * 2.59614 * 32 / 1000)  # 0.166
    assert info.peak_tflops("bfloat16") == pytest.approx(2 * 2.59614 * 64 / 1000)
    assert "2 cores x 2.60 GHz" in info.describe()


def test_cpu_peak_avx2_and_affinity_and_cgroup_quota(no_sysfs, monkeypatch, tmp_path):
    text = _cpuinfo("GenuineIntel", 6, "avx avx2 fma", 3000.0, [(0, c) for c in range(8)])
    info = bench.cpu_info(text, allowed={0, 1, 2})  # affinity: 3 of the 8 cores
    assert (info.isa, info.cores, info.flops_per_cycle) == ("AVX2+FMA", 3, 32)
    assert info.peak_tflops("bfloat16") == pytest.approx(3 * 3.0 * 32 / 1000)
    quota = tmp_path / "cpu.max"
    quota.write_text("150000 100000\n")  # 1.5 CPUs of quota -> 2 cores usable
    monkeypatch.setattr(bench, "_CGROUP_CPU_MAX", str(quota))
    assert bench.cpu_info(text, allowed=set(range(8))).cores == 2


def test_cpu_without_cpuinfo_has_no_peak(no_sysfs):
    info = bench.cpu_info("", allowed={0})
    assert info.ghz is None and info.peak_tflops() is None and info.cores == 1


# -------------------------------------------------------------- accelerator peaks


@pytest.mark.parametrize("name,key", [
    ("v2-8", "v2"), ("v3-32", "v3"), ("v4-8", "v4"), ("v5litepod-16", "v5e"),
    ("v5e-1", "v5e"), ("v5p-8", "v5p"), ("v6e-4", "v6e"), ("V3-8", "v3"),
    ("v9-8", None), ("gpu", None), (None, None),
])
def test_tpu_version(name, key):
    assert bench.tpu_version(name) == key


def test_tpu_peaks_per_replica():
    # Datasheet bfloat16 TFLOPS per chip: v2 45 and v3 123 over 2 cores each.
    assert bench.TPU_PEAK_TFLOPS["v2"] * 8 == pytest.approx(180.0)  # a v2-8 board
    assert bench.TPU_PEAK_TFLOPS["v3"] * 8 == pytest.approx(492.0)
    assert bench.TPU_PEAK_TFLOPS["v6e"] == pytest.approx(918.0)


@pytest.mark.parametrize("name,dtype,tf32,peak", [
    ("Tesla T4", "float32", True, 8.1),
    ("Tesla T4", "float16", True, 65.0),
    ("Tesla T4", "bfloat16", True, None),  # Turing has no bfloat16 tensor cores
    ("NVIDIA A100-SXM4-40GB", "float32", True, 156.0),  # TF32 tensor cores
    ("NVIDIA A100-SXM4-40GB", "float32", False, 19.5),
    ("NVIDIA A10", "bfloat16", True, 125.0),  # not mistaken for an A100
    ("Tesla V100-SXM2-16GB", "float16", True, 125.0),
    ("Tesla V100-PCIE-16GB", "float16", True, 112.0),
    ("NVIDIA H100 80GB HBM3", "bfloat16", True, 989.4),
    ("Mystery GPU 9000", "float32", True, None),
])
def test_gpu_peaks(name, dtype, tf32, peak):
    assert bench.gpu_peak_tflops(name, dtype, tf32) == peak


# ----------------------------------------------------------------------- the table


def _row(device, kind, dtype, median_seconds, replicas=1, peak=None):
    return bench.MatmulResult(device, kind, dtype, n=1000, repeats=1, replicas=replicas,
                              flops=2 * 10**9 * replicas, cold_seconds=2 * median_seconds,
                              seconds=(median_seconds,) * 3, peak_tflops=peak)


def test_table_shape_and_speedups():
    info = bench.CpuInfo("Test CPU", 2, 2.5, "test", "AVX2+FMA", 32, 32)
    cpu = _row("cpu", "cpu", "float32", 0.02, peak=0.16)  # 2e9 / 0.02 s = 0.1 TFLOPS
    gpu = _row("gpu", "gpu", "float16", 0.001, peak=65.0)  # 2 TFLOPS: 20x the CPU
    ref = _row("numpy", "numpy", "float32", 0.025)  # 0.08 TFLOPS
    report = bench.Report(info, "gpu x1: Tesla T4", False, (cpu, gpu), ref,
                          ("gpu bfloat16: NotFoundError",))
    lines = report.table().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("device"))
    rows = lines[header + 2: header + 5]
    assert [r.split()[0] for r in rows] == ["cpu", "gpu", "numpy"]
    width = sum(bench._WIDTHS)
    assert {len(line) for line in lines[header: header + 5]} == {width}
    assert all(len(r.split()) == len(bench._HEADER) for r in rows)
    gpu_cells = dict(zip(bench._HEADER, rows[1].split(), strict=True))
    assert gpu_cells["med TF"] == "2.000" and gpu_cells["x cpu"] == "20.0"
    assert gpu_cells["%peak"] == "3%"  # 2 / 65
    assert report.tf_over_numpy == pytest.approx(0.1 / 0.08)
    assert "1.25x" in report.table() and "not run: gpu bfloat16" in report.table()
    assert json.loads(json.dumps(report.as_dict()))["results"][1]["speedup"] == 20.0


def test_table_explains_every_column_in_words():
    info = bench.CpuInfo("Test CPU", 2, 2.5, "test", "AVX2+FMA", 32, 32)
    table = bench.Report(info, "none (CPU only)", False,
                         (_row("cpu", "cpu", "float32", 0.02),)).table()
    legend = table.split("\nColumns:\n", 1)[1].splitlines()
    assert [line.split("  ")[1].strip() for line in legend] == list(bench._HEADER)
    explained = dict(bench.LEGEND)
    assert "compiling" in explained["cold s"] and "median" in explained["med TF"]
    assert "TFLOPS" in table.split("\n\n", 1)[0]  # the unit is spelled out above the table


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs,needle", [
    ({"n": 0}, "n=0"), ({"n": -5}, "n=-5"), ({"n": 2.5}, "n=2.5"), ({"n": True}, "n=True"),
    ({"dtype": "int8"}, "dtype='int8'"), ({"repeats": 0}, "repeats=0"),
    ({"trials": 0}, "trials=0"), ({"device": "npu"}, "device='npu'"),
])
def test_matmul_flops_rejects_bad_input(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        bench.matmul_flops(**kwargs)


def test_numpy_and_throughput_reject_bad_input():
    with pytest.raises(ValueError, match="repeats=-1"):
        bench.numpy_matmul_flops(n=8, repeats=-1)
    with pytest.raises(ValueError, match="batch_size=0"):
        bench.train_throughput(lambda params: None, lambda params: None, batch_size=0)
    with pytest.raises(ValueError, match="steps=0"):
        bench.train_throughput(lambda params: None, lambda params: None, 8, steps=0)


# ------------------------------------------ one subprocess: CLI, simulation, throughput


_SUBPROCESS = """
import contextlib, io, json, tempfile
import numpy as np, keras, tensorflow as tf
import fenwicks as fw
from fenwicks.__main__ import main

fw.bench._INTERLEAVE_PAUSE = 0.01  # tiny matrices: no BLAS threads to wait out
out = {}
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    main(["bench", "--json", "--n", "96", "--repeats", "2", "--trials", "3"])
out["json_text"] = buf.getvalue()
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    main(["bench", "--n", "64", "--repeats", "1", "--trials", "1"])
out["table"] = buf.getvalue()
try:
    fw.bench.matmul_flops(device="tpu", n=8)
except ValueError as err:
    out["tpu_error"] = str(err)

X = np.random.default_rng(0).standard_normal((64, 4)).astype("float32")
y = (X[:, 0] > 0).astype("int32")
def model_func(params):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    return fw.train.ModelSpec(model, keras.optimizers.SGD(0.1),
                              loss_fn=fw.train.sparse_softmax_cross_entropy)
def input_fn(params):
    ds = tf.data.Dataset.from_tensor_slices((X, y)).repeat()
    return ds.batch(params["batch_size"], drop_remainder=True)
work_dir = tempfile.mkdtemp()
result = fw.bench.train_throughput(model_func, input_fn, batch_size=16, steps=5, trials=2,
                                   work_dir=work_dir)
out["throughput"] = result.as_dict()
est = fw.train.get_tpu_estimator(5, model_func, work_dir, trn_bs=16, verbose=False)
eval_fn = lambda params: tf.data.Dataset.from_tensor_slices((X, y)).batch(
    params["batch_size"])
out["global_step"] = est.evaluate(eval_fn)["global_step"]  # restored from the checkpoint
try:
    fw.bench.train_throughput(model_func, input_fn, batch_size=16, work_dir=work_dir)
except ValueError as err:
    out["used_dir_error"] = str(err)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def simulated():
    return run_json(_SUBPROCESS, env={"FENWICKS_DEVICE": "cpu:2"}, timeout=300)


def test_cli_json_parses_with_hand_counted_flops(simulated):
    report = json.loads(simulated["json_text"])
    rows = {(r["device"], r["dtype"]): r for r in report["results"]}
    assert set(rows) == {("cpu", "float32"), ("cpu", "bfloat16"), ("cpu x2 (sim)", "float32")}
    assert rows["cpu", "float32"]["flops"] == 2 * 96**3 * 2  # 3538944
    assert rows["cpu", "float32"]["flops"] == 3_538_944
    # two simulated replicas share the repeats: each runs one product
    assert rows["cpu x2 (sim)", "float32"]["flops"] == 2 * 96**3 * 1 * 2
    assert rows["cpu", "float32"]["speedup"] == pytest.approx(1.0)
    for row in report["results"] + [report["numpy"]]:
        assert len(row["seconds"]) == 3 and row["cold_seconds"] > 0
        assert row["tflops"] == pytest.approx(row["flops"] / np.median(row["seconds"]) / 1e12)
    numpy_row = report["numpy"]
    assert (numpy_row["n"], numpy_row["repeats"], numpy_row["dtype"]) == (96, 2, "float32")
    paired = [n / t for t, n in zip(rows["cpu", "float32"]["seconds"], numpy_row["seconds"],
                                    strict=True)]
    assert report["tf_over_numpy"] == pytest.approx(np.median(paired))
    assert report["simulated"] is True and "SIMULATION" in report["accelerator"]
    assert report["cpu"]["peak_tflops"] > 0


def test_cli_table_says_simulation(simulated):
    table = simulated["table"]
    assert "SIMULATION" in table and "cpu x2 (sim)" in table
    assert "TensorFlow CPU float32 / numpy" in table
    data_rows = [line for line in table.splitlines()
                 if line.split()[:1] in (["cpu"], ["numpy"])]
    assert len(data_rows) == 4  # cpu float32, cpu bfloat16, cpu x2 (sim), numpy


def test_matmul_flops_absent_device_error(simulated):
    assert "device='tpu'" in simulated["tpu_error"] and "'cpu'" in simulated["tpu_error"]


def test_train_throughput_counts_examples(simulated):
    result = simulated["throughput"]
    assert result["device"] == "cpu x2" and result["batch_size"] == 16
    assert len(result["seconds"]) == 2
    assert result["examples_per_second"] == pytest.approx(
        5 * 16 / np.median(result["seconds"]))
    # the cold call, the warm-up and 2 timed calls each trained 5 steps
    assert simulated["global_step"] == 5 * 4
    assert math.isfinite(result["cold_examples_per_second"])
    assert "holds a checkpoint" in simulated["used_dir_error"]


def test_table_flags_rows_above_the_estimated_peak():
    info = bench.CpuInfo("Test CPU", 1, 2.0, "test", "AVX2+FMA", 32, 32)
    cpu = _row("cpu", "cpu", "float32", 0.02, peak=0.064)  # 0.1 TFLOPS > 1 x 2 x 32 GFLOPS
    table = bench.Report(info, "none (CPU only)", False, (cpu,)).table()
    assert "note: cpu float32 ran faster than the estimated peak" in table
    assert "156%" in table  # 0.1 / 0.064


def test_vm_clock_is_flagged_as_base_clock(no_sysfs):
    text = _cpuinfo("AuthenticAMD", 25, "avx2 fma hypervisor", 2500.0, [(0, 0)])
    assert "base clock" in bench.cpu_info(text, allowed={0}).clock_source


def test_table_flags_calls_too_short_to_time():
    info = bench.CpuInfo("Test CPU", 1, 2.0, "test", "AVX2+FMA", 32, 32)
    cpu = _row("cpu", "cpu", "float32", 0.5)
    tpu = _row("tpu x8", "tpu", "bfloat16", 0.005, replicas=8)  # 5 ms < 20 ms
    notes = bench.Report(info, "tpu x8: v3-8", False, (cpu, tpu)).table().splitlines()
    assert [n.split(":")[1].strip() for n in notes if n.startswith("note")] == [
        "tpu x8 bfloat16"]


def test_cli_bad_argument_exits_2_with_message(capsys):
    assert bench.main(n=-3) == 2
    assert "n=-3 must be a positive integer" in capsys.readouterr().err


def test_tf_over_numpy_is_the_median_of_paired_rounds():
    info = bench.CpuInfo("Test CPU", 1, 2.0, "test", "AVX2+FMA", 32, 32)
    flops = 2 * 10**9
    tf_cpu = bench.MatmulResult("cpu", "cpu", "float32", 1000, 1, 1, flops, 1.0, (1.0, 2.0, 4.0))
    ref = bench.MatmulResult("numpy", "numpy", "float32", 1000, 1, 1, flops, 1.0,
                             (1.2, 1.0, 4.8))
    # per round numpy/TF seconds: 1.2, 0.5, 1.2 -> median 1.2 (medians alone: 1.2 / 2 = 0.6)
    report = bench.Report(info, "none (CPU only)", False, (tf_cpu,), ref)
    assert report.tf_over_numpy == pytest.approx(1.2)
