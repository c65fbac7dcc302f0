"""Peak FLOPs: vendor datasheets for TPUs and NVIDIA GPUs, ``/proc/cpuinfo`` for the CPU.

Peaks are estimates: datasheet figures (dense, boost clock) for TPUs and NVIDIA GPUs, and
cores x clock x FLOPs per cycle for the CPU, the FLOPs per cycle inferred from the
instruction set in ``/proc/cpuinfo``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

# What the host says of its CPUs (public so that tests can point them at a fake).
CPUFREQ_MAX = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"  # kHz
CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"  # "quota period" or "max period"

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

        Examples:
            >>> cpu = fw.bench.CpuInfo('Xeon', cores=2, ghz=2.5, clock_source='cpufreq',
            ...                        isa='AVX2+FMA', flops_per_cycle=32,
            ...                        bf16_flops_per_cycle=32)
            >>> cpu.peak_tflops('float32')   # 2 cores x 2.5 GHz x 32 FLOP/cycle
            0.16
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
        with open(CGROUP_CPU_MAX, encoding="utf-8") as f:
            quota, period = f.read().split()
        if quota != "max":
            count = min(count, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return count


def _clock_ghz(blocks: list[dict[str, str]]) -> tuple[float | None, str]:
    """The maximum clock from cpufreq if the kernel exposes it, else /proc/cpuinfo."""
    try:
        with open(CPUFREQ_MAX, encoding="utf-8") as f:
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

    Examples:
        >>> cpuinfo = ('processor : 0\\nvendor_id : GenuineIntel\\ncpu family : 6\\n'
        ...            'model name : Intel Xeon\\ncpu MHz : 2000.0\\nflags : sse2 avx avx2 fma\\n')
        >>> cpu = fw.bench.cpu_info(cpuinfo, allowed={0})
        >>> cpu.name, cpu.cores, cpu.isa, cpu.flops_per_cycle
        ('Intel Xeon', 1, 'AVX2+FMA', 32)
        >>> print('This machine:', fw.bench.cpu_info().describe())
        This machine: ... cores x ... FLOP/cycle (...) = ... float32 peak (estimate)
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

    Examples:
        >>> tpu_version('v5litepod-8')
        'v5e'
    """
    match = re.match(r"^(?:tpu[-_ ]?)?v(\d)(p|e|lite|litepod)?\b", (accelerator_type or "").lower())
    if not match:
        return None
    suffix = {"lite": "e", "litepod": "e"}.get(match.group(2), match.group(2) or "")
    key = f"v{match.group(1)}{suffix}"
    return key if key in TPU_PEAK_TFLOPS else None


def tpu_type_from_env() -> str | None:
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

    Examples:
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

