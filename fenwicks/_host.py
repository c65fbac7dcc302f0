"""What the machine shows about its devices, read without TensorFlow or JAX: a TPU host's
marks (libtpu, its environment variables, ``/dev/accel*``), an NVIDIA GPU's (its driver,
device files, ``nvidia-smi``), the CPU's name and memory, and who else holds a TPU.

Both engines' device detectors (``devices.py`` in each engine's folder) read the machine
through `HostProbe`; `fw.accel` names these functions for users and `fw.info()`.

Of fenwicks this module imports only the leaves ``_engine`` (the same TPU marks, read
before Keras is imported), ``_tpu_diagnosis`` and ``_tf_internals``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

from fenwicks import _engine, _tf_internals, _tpu_diagnosis

_LIBTPU_FILES = _engine.LIBTPU_FILES
# Where the machine shows its devices (public so that tests can point them at a fake).
NVIDIA_PATHS = ("/proc/driver/nvidia", "/dev/nvidia0")
TPU_DEVICE_RE = re.compile(r"^/dev/(accel[0-9]+|vfio/.*)$")


def libtpu_present() -> bool:
    """True if libtpu is installed: the mark of a TPU VM (Kaggle, Colab TPU, Cloud).

    Needs no TensorFlow; ``import fenwicks`` uses it to name the ``tpu`` extra.

    Examples:
        >>> fw.accel.libtpu_present()
        False
    """
    if importlib.util.find_spec("libtpu") is not None:
        return True
    return any(os.path.exists(path) for path in _LIBTPU_FILES)


def tpu_host_evidence() -> list[str]:
    """What shows that this machine is a TPU host, in words (empty if nothing does): an
    installed libtpu, ``ISTPUVM``, ``TPU_ACCELERATOR_TYPE``, ``TPU_PROCESS_ADDRESSES``,
    ``COLAB_TPU_ADDR``, ``/dev/accel*`` or ``/dev/vfio/<N>``. Needs no TensorFlow or JAX.

    Examples:
        >>> fw.accel.tpu_host_evidence()        # on Kaggle's TPU image
        ['ISTPUVM=1', 'TPU_PROCESS_ADDRESSES=local', 'libtpu 0.0.17 is installed', ...]
    """
    return _engine.tpu_host_evidence(os.environ, _engine.HostFacts.gather())


def nvidia_device_evidence() -> str | None:
    """What shows an NVIDIA GPU on this machine, or None: a driver entry, a device file, or
    ``nvidia-smi -L`` listing a GPU. Needs no TensorFlow.

    Examples:
        >>> fw.accel.nvidia_device_evidence()      # on a Colab T4 runtime
        'nvidia-smi lists GPU 0: Tesla T4 (UUID: GPU-...)'
    """
    for path in NVIDIA_PATHS:
        if os.path.exists(path):
            return f"{path} exists"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = [line.strip() for line in listed.stdout.splitlines()
            if line.strip().startswith("GPU ")]
    return f"nvidia-smi lists {gpus[0]}" if listed.returncode == 0 and gpus else None


class HostProbe:
    """What both engines' probes read about the machine (no TensorFlow, no JAX)."""

    def has_libtpu(self) -> bool:
        return libtpu_present()

    def tpu_evidence(self) -> list[str]:
        """Why this is a TPU host, in words; empty if it is not one."""
        evidence = tpu_host_evidence()
        if not evidence and self.has_libtpu():  # a subclass that says libtpu is there
            evidence = ["libtpu is installed"]
        return evidence

    def tpu_facts(self) -> _tpu_diagnosis.TpuFacts:
        """What the TPU diagnosis reads: versions, holders, who else holds the TPU."""
        facts = _engine.HostFacts.gather()
        try:
            holders = self.tpu_holders()
        except Exception:  # noqa: BLE001 - naming holders is a courtesy, never a failure
            holders = []
        return _tpu_diagnosis.TpuFacts(
            evidence=self.tpu_evidence(), tensorflows=facts.tensorflows,
            libtpu=facts.distributions.get("libtpu") or facts.distributions.get(
                "libtpu-nightly"), jax=facts.jax_version, holders=holders,
            jax_holds_tpu=self.jax_holds_tpu())

    def jax_holds_tpu(self) -> bool:
        """True if JAX in this process has already initialised a TPU backend."""
        if "jax" not in sys.modules:
            return False
        try:
            return "tpu" in _tf_internals.jax_initialized_platforms()
        except Exception:  # noqa: BLE001 - a JAX without these internals: assume not
            return False

    def nvidia_evidence(self) -> str | None:
        return nvidia_device_evidence()

    def tpu_holders(self) -> list[str]:
        """Other processes with a TPU device (/dev/accel*, /dev/vfio/*) open."""
        holders = []
        try:
            pids = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
        except OSError:
            return []
        for pid in pids:
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
                if not any(TPU_DEVICE_RE.match(os.readlink(f"/proc/{pid}/fd/{fd}"))
                           for fd in fds):
                    continue
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:  # the process ended, or is not ours to inspect
                continue
            holders.append(f"pid {pid} ({command[:80] or '?'})")
        return holders

    def host_memory(self) -> int | None:
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None

    def cpu_name(self) -> str:
        return cpu_name()



def cpu_name() -> str:
    """The host CPU's model name (``/proc/cpuinfo``), else what `platform` says.

    Examples:
        >>> fw.accel.cpu_name()
        'AMD EPYC'
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()
