"""The TensorFlow engine's devices: what TensorFlow can reach, and the ``tf.distribute``
strategy that trains on them, which this engine makes and holds (`strategy`).

The order is TPU VM, TPU node over the network, multi-worker cluster (``TF_CONFIG``),
GPUs, CPU (``cpu:N``: N logical CPU devices under `MirroredStrategy`). `detect` describes
what it found as an `fw.accel.Accelerator` (devices only: kind, count, memory, precision);
the strategy made on the way stays here, for this engine's roles.

`fw.accel.current()` calls `detect_devices` through the engine registry
(`fenwicks._engine.REGISTRY`); tests call `detect` with a fake `TFProbe`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from fenwicks import _tpu_diagnosis, accel
from fenwicks._host import HostProbe
from fenwicks._text import first_line
from fenwicks.accel import Accelerator, AcceleratorError, Request, Unusable

# An Accelerator and the strategy that runs on its devices.
Found = tuple[Accelerator, Any]
# The strategies `detect_devices` made, each with the accelerator it was made for (one in
# a process, unless a test detects fakes too).
_made: list[Found] = []


def detect_devices(request: Request, probe: Any = None,
                   env: Mapping[str, str] | None = None) -> Accelerator:
    """The registry's detector: describes TensorFlow's devices for `request` (through
    `probe`, a `TFProbe` unless a test gives a fake) and keeps the strategy made for them
    (`strategy`, while that accelerator is `fw.accel.current()`)."""
    found = _detect(request, TFProbe() if probe is None else probe, env)
    _made.append(found)
    return found[0]


def _strategy_of(acc: Accelerator) -> Any:
    return next((made for detected, made in reversed(_made) if detected is acc), None)


def strategy() -> Any:
    """The `tf.distribute.Strategy` this process trains under on the tf engine: made when
    `fw.accel.current()` first detected the devices (`TPUStrategy`, `MirroredStrategy`,
    `MultiWorkerMirroredStrategy` or `OneDeviceStrategy`).

    Raises:
        AcceleratorError: the process runs on another engine (jax), or the accelerator
            was not detected by this engine (a test's `fw.accel.state_for_tests`).

    Examples:
        >>> strategy = fw.train.tf.strategy()   # here: the CPU, one replica
        >>> type(strategy).__name__, strategy.num_replicas_in_sync
        ('OneDeviceStrategy', 1)
    """
    acc = accel.current()
    made = _strategy_of(acc)
    if made is None and acc.engine != "tf":
        raise AcceleratorError(
            f"fw.train.tf.strategy() is the tf engine's tf.distribute strategy, and this "
            f"process runs on the {acc.engine} engine, which places the replicas itself "
            "(no strategy exists); set FENWICKS_ENGINE=tf before importing fenwicks to "
            "train under one")
    if made is None:
        raise AcceleratorError(
            f"no tf.distribute strategy was made for the accelerator in use ({acc.kind}, "
            f"{acc.engine} engine, {acc.reason or 'set by a test'}): TensorFlow's engine "
            "makes it when it detects the devices; run with FENWICKS_ENGINE=tf and let "
            "fw.accel.current() detect them")
    return made


def describe_distribution() -> str:
    """The distribution for `fw.info()`: the strategy's class name (no strategy for an
    accelerator this engine did not detect: a test's `fw.accel.state_for_tests`)."""
    made = _strategy_of(accel.current())
    if made is not None:
        return type(made).__name__
    return "none (the accelerator was not detected by the tf engine)"


def detect(request: Request, probe: Any, env: Mapping[str, str] | None = None) -> Accelerator:
    """Chooses the accelerator for `request` on the TensorFlow engine, using `probe` (a
    `TFProbe` or a fake with its methods) for every side effect.

    Public for tests and diagnostics; users call `fw.accel.current()`.
    """
    return _detect(request, probe, env)[0]


def _detect(request: Request, probe: Any, env: Mapping[str, str] | None = None) -> Found:
    """The accelerator for `request` and the strategy made for it."""
    env = os.environ if env is None else env
    wanted = request.device
    unusable: list[Unusable] = []  # devices present but unusable: cause, error, fix
    steps: list[Callable[[], Found | None]] = []
    if wanted in ("auto", "tpu"):
        steps += [lambda: _try_tpu_vm(probe, unusable), lambda: _try_tpu_node(probe, env)]
    if wanted == "auto":
        steps.append(lambda: _try_multi_worker(probe, env))
    if wanted in ("auto", "gpu"):
        steps.append(lambda: _try_gpu(probe, request.replicas, wanted == "auto", unusable))
    if wanted in ("auto", "cpu"):
        steps.append(lambda: _cpu(probe, request.replicas or 1, wanted == "auto", unusable))
    for step in steps:
        found = step()
        if found is not None:
            return accel.finish(found[0], request, unusable, probe), found[1]
    accel.raise_absent(request, unusable)
    raise AssertionError("unreachable")


class TFProbe(HostProbe):
    """The side-effecting half of TensorFlow detection. Tests substitute a fake with the
    same methods."""

    def tf_build(self) -> dict[str, Any]:
        """How the installed TensorFlow was built: is_cuda_build, cuda_version, cudnn_version."""
        import tensorflow as tf

        info = dict(tf.sysconfig.get_build_info())
        return {"is_cuda_build": bool(info.get("is_cuda_build")),
                "cuda_version": info.get("cuda_version"),
                "cudnn_version": info.get("cudnn_version")}

    def cuda_load_error(self, build: Mapping[str, Any]) -> str | None:
        """The loader's error for the first CUDA library TensorFlow needs and cannot open."""
        import ctypes

        cuda = str(build.get("cuda_version") or "").split(".")[0]
        cudnn = str(build.get("cudnn_version") or "").split(".")[0]
        names = ["libcuda.so.1"] + ([f"libcudart.so.{cuda}"] if cuda else []) \
            + ([f"libcudnn.so.{cudnn}"] if cudnn else [])
        for name in names:
            try:
                ctypes.CDLL(name)
            except OSError as err:
                return str(err)
        return None

    def tpu_strategy(self, tpu: str) -> tuple[Any, Any]:
        """Connects to a TPU ('local' or a gRPC address); returns (resolver, strategy)."""
        import tensorflow as tf

        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        if tpu != "local":
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return resolver, tf.distribute.TPUStrategy(resolver)

    def multi_worker_strategy(self) -> Any:
        import tensorflow as tf

        return tf.distribute.MultiWorkerMirroredStrategy()

    def gpus(self) -> list[dict[str, Any]]:
        """Physical GPUs as dicts with name, compute_capability and memory (bytes)."""
        import tensorflow as tf

        found = []
        for gpu in tf.config.list_physical_devices("GPU"):
            details = tf.config.experimental.get_device_details(gpu)
            found.append({"name": details.get("device_name", gpu.name),
                          "compute_capability": details.get("compute_capability"),
                          "memory": None})
        return found

    def gpu_strategy(self, count: int) -> Any:
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")[:count]
        for gpu in gpus:  # grow instead of grabbing all memory: notebooks share GPUs
            tf.config.experimental.set_memory_growth(gpu, True)
        if count == 1:
            return tf.distribute.OneDeviceStrategy("/gpu:0")
        return tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(count)])

    def cpu_strategy(self, replicas: int) -> Any:
        import tensorflow as tf

        if replicas == 1:
            return tf.distribute.OneDeviceStrategy("/cpu:0")
        cpu = tf.config.list_physical_devices("CPU")[0]
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
        except RuntimeError as err:  # devices already initialised by earlier TF use
            have = len(tf.config.list_logical_devices("CPU"))
            if have < replicas:
                raise AcceleratorError(
                    f"cannot split the CPU into {replicas} replicas: TensorFlow already "
                    f"initialised {have} CPU device(s). Set FENWICKS_DEVICE=cpu:{replicas} "
                    "or call fw.accel.configure() before any TensorFlow op runs") from err
        devices = [f"/cpu:{i}" for i in range(replicas)]
        # ReductionToOneDevice: NCCL all-reduce does not exist for CPU devices.
        return tf.distribute.MirroredStrategy(
            devices, cross_device_ops=tf.distribute.ReductionToOneDevice())




def _gpu_unusable(probe: Any, evidence: str) -> Unusable:
    """The warning for an NVIDIA GPU that TensorFlow does not list: the cause and fix."""
    cause = "TensorFlow's build information is empty"
    try:
        build = probe.tf_build()
    except Exception as err:  # noqa: BLE001
        build, cause = {}, f"TensorFlow's build information is unreadable ({err})"
    if build and not build.get("is_cuda_build"):
        return Unusable("cpu-build", "a CPU-only TensorFlow cannot use the GPU here", (
            f"an NVIDIA GPU is on this machine ({evidence}) but TensorFlow lists no "
            "GPU: the installed TensorFlow is built without CUDA (the CPU-only wheel, "
            "e.g. tensorflow-cpu). Fix: pip uninstall -y tensorflow-cpu, then "
            "pip install 'fenwicks[gpu]' (tensorflow[and-cuda]), and restart."))
    if build:
        wants = (f"CUDA {build.get('cuda_version')} and cuDNN {build.get('cudnn_version')}")
        try:
            error = probe.cuda_load_error(build)
        except Exception as err:  # noqa: BLE001
            error = str(err)
        cause = (f"TensorFlow was built for {wants}, and "
                 + (f"loading them failed: {error}" if error else
                    "they load, so the driver is likely too old for them"))
    return Unusable("cuda", "TensorFlow cannot load CUDA for the GPU here", (
        f"an NVIDIA GPU is on this machine ({evidence}) but TensorFlow lists no GPU: "
        f"{cause}. Fix: match the CUDA and cuDNN versions to TensorFlow's, e.g. "
        "pip install 'fenwicks[gpu]' (tensorflow[and-cuda] brings matching CUDA "
        "libraries) and update the NVIDIA driver if it is older, then restart."))



def _try_tpu_vm(probe: Any, unusable: list[Unusable]) -> Found | None:
    evidence = probe.tpu_evidence()
    if not [e for e in evidence if not e.startswith("COLAB_TPU_ADDR=")]:
        return None  # COLAB_TPU_ADDR alone is a TPU node, reached over the network
    try:
        resolver, strategy = probe.tpu_strategy("local")
    except Exception as err:  # noqa: BLE001 - a busy TPU, a libtpu mismatch: say so loudly
        unusable.append(_tpu_diagnosis.tensorflow_cause(err, probe.tpu_facts()))
        return None
    return _tpu(strategy, resolver, remote=False,
                reason=f"a TPU on this machine answered (a TPU VM: {', '.join(evidence)})")


def _try_tpu_node(probe: Any, env: Mapping[str, str]) -> Found | None:
    if env.get("TPU_NAME"):
        address, source = env["TPU_NAME"], "TPU_NAME"
    elif env.get("COLAB_TPU_ADDR"):
        address, source = "grpc://" + env["COLAB_TPU_ADDR"], "COLAB_TPU_ADDR"
    else:
        return None
    try:
        resolver, strategy = probe.tpu_strategy(address)
    except Exception as err:  # noqa: BLE001
        raise AcceleratorError(
            f"{source}={env[source]!r} is set but the TPU there did not answer "
            f"({type(err).__name__}: {first_line(err)}); check the address (Colab: "
            f"Runtime > Restart session if another notebook holds it), or unset {source} "
            "to use another device") from err
    return _tpu(strategy, resolver, remote=True,
                reason=f"{source} is set and the TPU node there answered (a TPU reached "
                       "over the network: it reads and writes only gs://)")


def _tpu(strategy: Any, resolver: Any, remote: bool, reason: str) -> Found:
    replicas = int(strategy.num_replicas_in_sync)
    try:
        workers = max(1, len(resolver.cluster_spec().as_dict().get("worker", [])))
    except Exception:  # noqa: BLE001 - a resolver without a cluster spec
        workers = 1
    devices = tuple(f"TPU:{i}" for i in range(replicas))
    return Accelerator("tpu", replicas, "auto", is_remote=remote, devices=devices,
                       memory=(None,) * replicas, num_workers=workers, reason=reason), strategy


def _try_multi_worker(probe: Any, env: Mapping[str, str]) -> Found | None:
    raw = env.get("TF_CONFIG")
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as err:
        raise AcceleratorError(f"TF_CONFIG is not valid JSON: {err}") from err
    workers = config.get("cluster", {}).get("worker", [])
    if len(workers) < 2:
        return None
    strategy = probe.multi_worker_strategy()
    replicas = int(strategy.num_replicas_in_sync)
    gpus = probe.gpus()
    kind = "gpu" if gpus else "cpu"
    task = config.get("task", {})
    reason = (f"TF_CONFIG describes a cluster; this is task {task.get('type')}:"
              f"{task.get('index')} of {len(workers)} workers training together")
    return Accelerator(kind, replicas, "auto", devices=tuple(workers),
                       memory=(None,) * len(workers), num_workers=len(workers),
                       reason=reason), strategy


def _try_gpu(probe: Any, replicas: int | None, auto: bool = True,
             unusable: list[Unusable] | None = None) -> Found | None:
    gpus = probe.gpus()
    if not gpus:
        evidence = probe.nvidia_evidence()
        if evidence and unusable is not None:
            unusable.append(_gpu_unusable(probe, evidence))
        return None
    if replicas is not None and replicas > len(gpus):
        raise AcceleratorError(
            f"replicas={replicas} GPUs were requested but only {len(gpus)} are present")
    gpus = gpus[: replicas or len(gpus)]
    strategy = probe.gpu_strategy(len(gpus))
    kind = "one GPU" if len(gpus) == 1 else f"{len(gpus)} GPUs"
    before = (accel.skipped(unusable or []) or "no TPU answered; ") if auto else ""
    return Accelerator("gpu", len(gpus), "auto",
                       devices=tuple(g["name"] for g in gpus),
                       memory=tuple(g.get("memory") for g in gpus),
                       reason=before + f"TensorFlow sees {kind}, so "
                              + ("it trains alone" if len(gpus) == 1 else
                                 "they train in sync, one replica each")), strategy


def _cpu(probe: Any, replicas: int, auto: bool = True,
         unusable: list[Unusable] | None = None) -> Found:
    strategy = probe.cpu_strategy(replicas)
    name = probe.cpu_name()
    single = "the CPU, as asked"
    if auto:
        single = (f"{accel.skipped(unusable)}no other TPU or GPU was found, so the CPU"
                  if unusable else "no TPU or GPU was found, so the CPU")
    reason = (single if replicas == 1 else
              f"the CPU split into {replicas} logical devices, to simulate {replicas} "
              "replicas as on a TPU (for testing: it is not faster)")
    return Accelerator("cpu", replicas, "auto",
                       devices=tuple(f"{name} (logical {i})" if replicas > 1 else name
                                     for i in range(replicas)),
                       memory=(probe.host_memory(),) * replicas, simulated=replicas > 1,
                       reason=reason), strategy
