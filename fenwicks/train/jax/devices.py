"""The JAX engine's devices: what ``jax.devices()`` lists, described as an
`fw.accel.Accelerator` (kind, count over every process, memory, precision). JAX places
the replicas itself (a mesh, `mesh.py`): no ``tf.distribute`` strategy is made.

`fw.accel.current()` calls `detect_devices` through the engine registry
(`fenwicks._engine.REGISTRY`); tests call `detect_jax` with a fake `JaxProbe`.
``cpu:N`` must already be in ``XLA_FLAGS`` (`fw.accel.setup_engine`, `configure`).
"""

from __future__ import annotations

from typing import Any

from fenwicks import _tf_internals, _tpu_diagnosis, accel
from fenwicks._host import HostProbe
from fenwicks.accel import Accelerator, AcceleratorError, Request, Unusable


def detect_devices(request: Request) -> Accelerator:
    """The registry's detector: JAX's devices for `request`."""
    return detect_jax(request, JaxProbe())


def describe_distribution() -> str:
    """The distribution for `fw.info()`: JAX's mesh, no strategy."""
    acc = accel.current()
    return (f"none: JAX places the {acc.num_replicas} replica(s) on a mesh "
            "(no tf.distribute strategy)")


class JaxProbe(HostProbe):
    """The side-effecting half of detection on the jax engine (JAX's devices)."""

    def devices(self) -> list[dict[str, Any]]:
        """This process's JAX devices as dicts: platform, kind, id, memory, capability."""
        import jax

        found = []
        for device in jax.local_devices():
            try:
                memory = (device.memory_stats() or {}).get("bytes_limit")
            except Exception:  # noqa: BLE001 - CPU devices and older plugins have none
                memory = None
            capability = getattr(device, "compute_capability", None)
            found.append({"platform": device.platform, "kind": device.device_kind,
                          "id": device.id, "memory": memory,
                          "compute_capability": tuple(int(p) for p in str(capability)
                                                      .split(".")) if capability else None})
        return found

    def process_count(self) -> int:
        import jax

        return jax.process_count()

    def backend_errors(self) -> dict[str, str]:
        """JAX's own message per platform it tried and could not start ('tpu': ...)."""
        try:
            return _tf_internals.jax_backend_errors()
        except Exception:  # noqa: BLE001 - a JAX without this internal: no details
            return {}

    def gpus(self) -> list[dict[str, Any]]:
        return [d for d in self.devices() if _jax_kind(d["platform"]) == "gpu"]

    def device_count(self) -> int:
        """Devices of every process: the replicas sharing each global batch."""
        import jax

        return jax.device_count()


def _jax_kind(platform: str) -> str:
    return {"tpu": "tpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu"}.get(platform, "cpu")


def detect_jax(request: Request, probe: Any) -> Accelerator:
    """Describes JAX's devices for `request` on the jax engine, using `probe` (a
    `_JaxProbe` or a fake). ``cpu:N`` must already be in XLA_FLAGS (`setup_engine`,
    `configure`).

    Public for tests and diagnostics; users call `current()`.
    """
    devices = probe.devices()
    kind = _jax_kind(devices[0]["platform"])
    wanted, unusable = request.device, []
    if wanted == "auto" and kind != "tpu":
        evidence = probe.tpu_evidence()
        if evidence:
            unusable.append(_tpu_diagnosis.jax_cause(probe.backend_errors().get("tpu"),
                                                     probe.tpu_facts()))
    if wanted == "auto" and kind == "cpu" and probe.nvidia_evidence():
        unusable.append(_jax_gpu_unusable(probe))
    if wanted in ("tpu", "gpu") and kind != wanted:
        error = probe.backend_errors().get("tpu" if wanted == "tpu" else "cuda")
        raise AcceleratorError(
            f"device={wanted!r} was requested ({request.source}) but JAX sees "
            f"{len(devices)} {devices[0]['platform']} device(s)"
            + (f"; its {wanted} backend failed: {error}" if error else
               f"; JAX has no {wanted} support installed (pip install 'jax[{wanted}]', or "
               "'jax[cuda12]' for NVIDIA GPUs)"))
    if wanted == "cpu" and request.replicas and len(devices) != request.replicas:
        raise AcceleratorError(
            f"cpu:{request.replicas} was requested ({request.source}) but JAX has "
            f"{len(devices)} device(s): it created them before XLA_FLAGS was set. Set "
            f"{accel.DEVICE_ENV}=cpu:{request.replicas} before importing fenwicks")
    found = Accelerator(
        kind, probe.device_count(), "auto",
        devices=tuple(f"{d['kind']} ({d['platform']}:{d['id']})" for d in devices),
        memory=tuple(d["memory"] if kind != "cpu" else probe.host_memory()
                     for d in devices),
        num_workers=probe.process_count(), simulated=kind == "cpu" and len(devices) > 1,
        reason=_jax_reason(kind, devices, wanted, unusable), engine="jax")
    return accel.finish(found, request, unusable, probe)


def _jax_reason(kind: str, devices: list[dict[str, Any]], wanted: str,
                unusable: list[Unusable]) -> str:
    count = len(devices)
    if kind == "cpu" and count > 1:
        return (f"the CPU split into {count} JAX devices (XLA_FLAGS="
                f"--xla_force_host_platform_device_count={count}), to simulate {count} "
                "replicas as on a TPU (for testing: it is not faster)")
    if kind == "cpu":
        return "the CPU, as asked" if wanted == "cpu" else (
            f"{accel.skipped(unusable)}JAX sees no TPU or GPU, so the CPU")
    name = devices[0]["kind"]
    return (f"JAX sees {count} {kind.upper()} device{'s' if count > 1 else ''} ({name}), "
            + ("one replica each" if count > 1 else "one replica"))


def _jax_gpu_unusable(probe: Any) -> Unusable:
    error = probe.backend_errors().get("cuda")
    return Unusable("cuda", "JAX cannot use the GPU here", (
        f"an NVIDIA GPU is on this machine ({probe.nvidia_evidence()}) but JAX lists no "
        "GPU: " + (f"its CUDA backend failed: {error}" if error else
                   "JAX's CUDA support is not installed")
        + ". Fix: pip install -U 'jax[cuda12]' (JAX with the CUDA libraries made for it), "
          "then start a new Python process."))
