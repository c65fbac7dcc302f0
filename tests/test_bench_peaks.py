"""Tests for fenwicks.bench.peaks: the CPU's peak from /proc/cpuinfo, TPU and GPU datasheets."""

from __future__ import annotations

import pytest

from fenwicks.bench import peaks

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
    monkeypatch.setattr(peaks, "CPUFREQ_MAX", str(tmp_path / "missing"))
    monkeypatch.setattr(peaks, "CGROUP_CPU_MAX", str(tmp_path / "missing"))


def test_cpu_peak_intel_avx512_amx_with_hyperthreads(no_sysfs):
    # 4 logical processors = 2 cores x 2 hyperthreads, 2000 MHz
    text = _cpuinfo("GenuineIntel", 6, "avx avx2 fma avx512f amx_bf16", 2000.0,
                    [(0, 0), (0, 1), (0, 0), (0, 1)])
    info = peaks.cpu_info(text, allowed={0, 1, 2, 3})
    assert (info.cores, info.ghz, info.flops_per_cycle) == (2, 2.0, 64)
    assert info.peak_tflops("float32") == pytest.approx(2 * 2.0 * 64 / 1000)  # 0.256
    assert info.peak_tflops("bfloat16") == pytest.approx(2 * 2.0 * 1024 / 1000)
    assert info.peak_tflops("float16") is None


def test_cpu_peak_zen4_avx512_runs_at_256_bit_rate(no_sysfs):
    text = _cpuinfo("AuthenticAMD", 25, "avx avx2 fma avx512f avx512_bf16", 2596.14,
                    [(0, 0), (0, 1)])
    info = peaks.cpu_info(text, allowed={0, 1})
    assert info.isa == "AVX-512" and info.flops_per_cycle == 32
    assert info.peak_tflops() == pytest.approx(2 * 2.59614 * 32 / 1000)  # 0.166
    assert info.peak_tflops("bfloat16") == pytest.approx(2 * 2.59614 * 64 / 1000)
    assert "2 cores x 2.60 GHz" in info.describe()


def test_cpu_peak_avx2_and_affinity_and_cgroup_quota(no_sysfs, monkeypatch, tmp_path):
    text = _cpuinfo("GenuineIntel", 6, "avx avx2 fma", 3000.0, [(0, c) for c in range(8)])
    info = peaks.cpu_info(text, allowed={0, 1, 2})  # affinity: 3 of the 8 cores
    assert (info.isa, info.cores, info.flops_per_cycle) == ("AVX2+FMA", 3, 32)
    assert info.peak_tflops("bfloat16") == pytest.approx(3 * 3.0 * 32 / 1000)
    quota = tmp_path / "cpu.max"
    quota.write_text("150000 100000\n")  # 1.5 CPUs of quota -> 2 cores usable
    monkeypatch.setattr(peaks, "CGROUP_CPU_MAX", str(quota))
    assert peaks.cpu_info(text, allowed=set(range(8))).cores == 2


def test_cpu_without_cpuinfo_has_no_peak(no_sysfs):
    info = peaks.cpu_info("", allowed={0})
    assert info.ghz is None and info.peak_tflops() is None and info.cores == 1


def test_vm_clock_is_flagged_as_base_clock(no_sysfs):
    text = _cpuinfo("AuthenticAMD", 25, "avx2 fma hypervisor", 2500.0, [(0, 0)])
    assert "base clock" in peaks.cpu_info(text, allowed={0}).clock_source


# -------------------------------------------------------------- accelerator peaks


@pytest.mark.parametrize("name,key", [
    ("v2-8", "v2"), ("v3-32", "v3"), ("v4-8", "v4"), ("v5litepod-16", "v5e"),
    ("v5e-1", "v5e"), ("v5p-8", "v5p"), ("v6e-4", "v6e"), ("V3-8", "v3"),
    ("v9-8", None), ("gpu", None), (None, None),
])
def test_tpu_version(name, key):
    assert peaks.tpu_version(name) == key


def test_tpu_peaks_per_replica():
    # Datasheet bfloat16 TFLOPS per chip: v2 45 and v3 123 over 2 cores each.
    assert peaks.TPU_PEAK_TFLOPS["v2"] * 8 == pytest.approx(180.0)  # a v2-8 board
    assert peaks.TPU_PEAK_TFLOPS["v3"] * 8 == pytest.approx(492.0)
    assert peaks.TPU_PEAK_TFLOPS["v6e"] == pytest.approx(918.0)


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
    assert peaks.gpu_peak_tflops(name, dtype, tf32) == peak
