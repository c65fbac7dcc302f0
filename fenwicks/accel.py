"""Accelerator detection: which engine, which device, which strategy, which precision.

The engine (TensorFlow or JAX under Keras) is chosen once, at ``import fenwicks``, from
cheap facts (`fenwicks._engine`): ``FENWICKS_ENGINE``, ``KERAS_BACKEND``, or by itself the
jax engine on a TPU host whose TensorFlow cannot reach the TPU (the 2026 Kaggle and Colab
TPU images). `engine()` says which.

The device is detected on first use of `current()` and cached for the process. On the
TensorFlow engine the order is TPU VM, TPU node over the network, multi-worker cluster,
GPUs, CPU; on the jax engine it is what ``jax.devices()`` lists. `configure()` or the
environment variable ``FENWICKS_DEVICE`` (``tpu``, ``gpu``, ``cpu``, ``cpu:8``) override
it. ``cpu:N`` splits the CPU into N logical devices (`MirroredStrategy`, or N JAX devices
through ``XLA_FLAGS``): the TPU-like test mode, N cores sharing one global batch.

A device that is present but unusable is never a silent CPU run: a TPU that cannot be
initialised (a CPU-only TensorFlow, a libtpu mismatch, held by JAX in this process or by
another process: `fenwicks._tpu_diagnosis`) or an NVIDIA GPU that TensorFlow does not
list (the CPU-only wheel, a CUDA/cuDNN mismatch) is an `AcceleratorWarning`, shown once
per process, naming the device, the original error, the fix for that cause and
what was chosen instead; it is kept in `Accelerator.warnings` for `fw.info()`, and the
"chosen by" reason names the same cause. ``FENWICKS_DEVICE=tpu`` or ``gpu`` then fails
with the same cause.

Of fenwicks this module imports only its private helpers beside it (``_engine``,
``_tpu_diagnosis``, ``_tf_internals`` for JAX's private backend state) and `fenwicks._text`
(a leaf of message helpers); every higher layer
builds on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from fenwicks import _engine, _tf_internals, _tpu_diagnosis
from fenwicks._engine import ENGINE_ENV, EngineError
from fenwicks._text import first_line

logger = logging.getLogger("fenwicks")

# What a user calls; the detection steps below are public for tests and diagnostics.
__all__ = [
    "DEVICE_ENV", "ENGINE_ENV", "ENGINES", "KINDS", "PRECISIONS", "Accelerator",
    "AcceleratorError", "AcceleratorWarning", "EngineError", "configure", "cpu_name", "current",
    "engine", "engine_choice", "is_initialized", "parse_device",
]

KINDS = ("tpu", "gpu", "cpu")
PRECISIONS = ("auto", "float32", "bfloat16", "float16")
DEVICE_ENV = "FENWICKS_DEVICE"
ENGINES = _engine.ENGINES
_DEVICE_RE = re.compile(r"^(auto|tpu|gpu|cpu)(?::([0-9]+))?$")


class AcceleratorError(RuntimeError):
    """The requested accelerator is absent, or configuration came too late."""


class AcceleratorWarning(UserWarning):
    """A TPU or GPU is present but unusable; the message says why, the fix, and what runs."""


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """What `current()` found.

    Attributes:
        kind: ``'tpu'``, ``'gpu'`` or ``'cpu'``.
        strategy: the `tf.distribute.Strategy` every model and loop runs under; on the
            jax engine TensorFlow's default strategy (`tf.distribute.get_strategy()`),
            so that code entering ``strategy.scope()`` still runs.
        num_replicas: replicas in sync over all workers (8 on a TPU v2/v3-8); on the
            jax engine ``jax.local_device_count()``.
        precision: resolved compute precision: ``'float32'``, ``'bfloat16'`` or
            ``'float16'`` (float16 implies loss scaling). Variables stay float32.
        is_remote: True for a TPU node reached over the network; such a TPU can only
            read and write ``gs://`` paths.
        devices: device names the replicas run on.
        memory: bytes of memory per device where known, else None.
        num_workers: hosts in the cluster (1 unless multi-worker or a TPU pod).
        simulated: True under ``cpu:N`` with N > 1 (logical CPU devices).
        reason: why this accelerator, in words, for `fw.info()` and logs: who chose
            (auto-detection, ``FENWICKS_DEVICE`` or `configure`) and what was found.
        warnings: devices that are present but could not be used, each with the original
            error, the fix and what was chosen instead (empty when nothing was skipped).
        engine: ``'tf'`` or ``'jax'``: what Keras runs on (`engine()`).
    """

    kind: str
    strategy: Any
    num_replicas: int
    precision: str
    is_remote: bool = False
    devices: tuple[str, ...] = ()
    memory: tuple[int | None, ...] = ()
    num_workers: int = 1
    simulated: bool = False
    reason: str = ""
    warnings: tuple[str, ...] = ()
    engine: str = "tf"

    @property
    def compute_dtype(self) -> str:
        """The dtype layers compute in under `precision`."""
        return self.precision

    @property
    def keras_policy(self) -> str:
        """The Keras mixed-precision policy name for `precision`."""
        return "float32" if self.precision == "float32" else f"mixed_{self.precision}"


@dataclasses.dataclass(frozen=True)
class Request:
    """What the user asked for: `configure()` arguments merged with FENWICKS_DEVICE."""

    device: str = "auto"
    replicas: int | None = None
    precision: str = "auto"
    # Who asked, for fw.info()'s "chosen by"; not part of the request's identity.
    source: str = dataclasses.field(default="auto-detection", compare=False)


_request = Request()
_current: Accelerator | None = None


def parse_device(value: str) -> tuple[str, int | None]:
    """Parses a device spec such as ``'cpu:8'`` into ``('cpu', 8)``.

    Args:
        value: ``'auto'``, ``'tpu'``, ``'gpu'``, ``'cpu'``, optionally ``':N'`` replicas.

    Returns:
        The kind and the replica count (None when not given).

    Raises:
        ValueError: if the spec is malformed.

    Examples:
        >>> parse_device('cpu:8')
        ('cpu', 8)
    """
    match = _DEVICE_RE.match(str(value).strip().lower())
    if not match or match.group(2) == "0":
        raise ValueError(
            f"device={value!r} is not a device spec; use 'auto', 'tpu', 'gpu', 'cpu' "
            "or 'cpu:N' with N >= 1 logical CPU replicas, e.g. FENWICKS_DEVICE=cpu:8"
        )
    replicas = int(match.group(2)) if match.group(2) else None
    return match.group(1), replicas


def configure(device: str = "auto", replicas: int | None = None,
              precision: str = "auto", engine: str | None = None) -> None:
    """Overrides detection. Call before the first use of the accelerator.

    Args:
        device: ``'auto'``, ``'tpu'``, ``'gpu'``, ``'cpu'`` or ``'cpu:N'``. Defaults to
            ``'auto'`` (detect; ``FENWICKS_DEVICE`` still applies).
        replicas: number of replicas; only meaningful for ``'cpu'`` (logical devices)
            and ``'gpu'`` (use the first N GPUs). Defaults to all available.
        precision: ``'auto'``, ``'float32'``, ``'bfloat16'`` or ``'float16'``.
            Defaults to ``'auto'``: bfloat16 on TPU, float16 on GPUs of compute
            capability >= 7.0, float32 otherwise.
        engine: ``'tf'`` or ``'jax'``, accepted only if it is the engine Keras already
            runs on (`engine()`): Keras fixes its backend when it is imported, so another
            engine is chosen with ``FENWICKS_ENGINE`` before ``import fenwicks``.
            Defaults to None (the engine as chosen).

    Raises:
        ValueError: for an unknown device, precision or engine, or replicas < 1.
        AcceleratorError: if the accelerator was already initialised differently, or
            `engine` is not the one Keras runs on.

    Examples:
        >>> fw.accel.configure(device='cpu', replicas=8)   # 8 TPU-like replicas on a CPU
    """
    global _request
    kind, spec_replicas = parse_device(device)
    if replicas is not None and spec_replicas is not None and replicas != spec_replicas:
        raise ValueError(f"device={device!r} and replicas={replicas} disagree; give one")
    replicas = replicas if replicas is not None else spec_replicas
    if replicas is not None and (not isinstance(replicas, int) or replicas < 1):
        raise ValueError(f"replicas={replicas!r} must be a positive integer")
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} must be one of {PRECISIONS}")
    _check_engine(engine)
    source = "auto-detection" if kind == "auto" else f"fw.accel.configure(device={device!r})"
    new = Request(kind, replicas, precision, source)
    if _current is not None and new != _request:
        raise AcceleratorError(
            f"the accelerator is already initialised as {_current.kind} with "
            f"{_current.num_replicas} replicas; call fw.accel.configure() before anything "
            "that uses it (TensorFlow and JAX fix their devices at start-up), or restart "
            "the runtime")
    if engine_choice().splits_cpu_by_flags and kind == "cpu":
        _prepare_jax_cpu(replicas)
    _request = new


def _check_engine(engine: str | None) -> None:
    if engine is None:
        return
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} must be one of {ENGINES}")
    choice = engine_choice()
    if engine != choice.engine:
        raise AcceleratorError(
            f"engine={engine!r} was asked, but Keras in this process runs on "
            f"{choice.keras_backend!r} (the {choice.engine} engine, chosen at import "
            f"fenwicks: {choice.reason}); Keras fixes its backend when it is imported, so "
            f"set {ENGINE_ENV}={engine} before `import fenwicks`, in a new Python process")


# ------------------------------------------------------------------------------ engine

_engine_choice: _engine.EngineChoice | None = None


def setup_engine(env: Any = None) -> _engine.EngineChoice:
    """Chooses the engine once, before Keras is imported (``import fenwicks`` calls it).

    Prints one line when the jax engine was chosen by itself, and on the jax engine
    applies ``FENWICKS_DEVICE=cpu[:N]`` for JAX (``XLA_FLAGS``, ``JAX_PLATFORMS``).
    `import_keras` then imports Keras on the chosen backend.

    Raises:
        EngineError: see `fenwicks._engine.choose_engine`.
    """
    global _engine_choice
    if _engine_choice is not None:
        return _engine_choice
    env = os.environ if env is None else env
    choice = _engine.choose_engine(env, _engine.HostFacts.gather())
    if choice.splits_cpu_by_flags and env.get(DEVICE_ENV):
        try:
            kind, replicas = parse_device(env[DEVICE_ENV])
        except ValueError as err:
            raise EngineError(str(err)) from err
        if kind == "cpu":
            _prepare_jax_cpu(replicas, env)
    if choice.announce:
        print(_engine.announcement(choice), file=sys.stderr, flush=True)
    _engine_choice = choice
    return choice


def import_keras() -> None:
    """Imports Keras on the chosen engine's backend: ``KERAS_BACKEND`` is set for this
    import only (so that ``~/.keras/keras.json`` cannot pick another backend), then
    restored, so that processes started later choose for themselves."""
    choice = engine_choice()
    if "keras" in sys.modules:  # choose_engine checked that it runs on this backend
        return
    previous = os.environ.get("KERAS_BACKEND")
    os.environ["KERAS_BACKEND"] = choice.keras_backend
    try:
        import keras  # noqa: F401 - Keras reads KERAS_BACKEND here, once per process
    finally:
        if previous is None:
            del os.environ["KERAS_BACKEND"]
        else:
            os.environ["KERAS_BACKEND"] = previous


def engine_choice() -> _engine.EngineChoice:
    """The engine and why it was chosen (`setup_engine` on first call)."""
    return _engine_choice if _engine_choice is not None else setup_engine()


def engine() -> str:
    """``'tf'`` or ``'jax'``: the engine Keras runs on in this process, chosen at ``import
    fenwicks`` (``FENWICKS_ENGINE``, ``KERAS_BACKEND``, else by the machine).

    Examples:
        >>> fw.accel.engine()      # on Colab's GPU runtime; 'jax' on Kaggle's TPU image
        'tf'
    """
    return engine_choice().engine


def _prepare_jax_cpu(replicas: int | None, env: Any = None) -> None:
    """``cpu[:N]`` on the jax engine: XLA_FLAGS and JAX's platform, before JAX makes its
    devices; once it has made them, a different device count is an error."""
    env = os.environ if env is None else env
    jax = sys.modules.get("jax")
    if jax is not None and _jax_backends_initialised():
        have = jax.local_device_count() if jax.default_backend() == "cpu" else 0
        if replicas is not None and have != replicas:
            raise AcceleratorError(
                f"cannot split the CPU into {replicas} JAX devices: JAX already created its "
                f"devices ({jax.local_device_count()} {jax.default_backend()}). Set "
                f"{DEVICE_ENV}=cpu:{replicas} before importing fenwicks, or call "
                "fw.accel.configure() before anything runs on JAX")
        return
    _engine.force_cpu_devices(env, replicas)
    if jax is not None:  # JAX read JAX_PLATFORMS when it was imported: tell it now
        jax.config.update("jax_platforms", "cpu")


def _jax_backends_initialised() -> bool:
    return _tf_internals.jax_backends_initialized()


def current() -> Accelerator:
    """Returns the accelerator, detecting it on first call.

    Examples:
        >>> acc = fw.accel.current()
        >>> acc.kind, acc.num_replicas, acc.engine
        ('cpu', 1, 'tf')
    """
    global _current
    if _current is None:
        request = effective_request(os.environ)
        _current = _DETECTORS[engine()](request)
        logger.info("fenwicks: using %s with %d replica(s), %s on the %s engine (%s)",
                    _current.kind, _current.num_replicas, _current.precision,
                    _current.engine, _current.reason)
    return _current


# Each engine's devices, as its library sees them (JAX's own, or TensorFlow's).
_DETECTORS = {"tf": lambda request: detect(request, TFProbe()),
              "jax": lambda request: detect_jax(request, _JaxProbe())}


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


def is_initialized() -> bool:
    """True once `current()` has run (devices are then fixed for the process)."""
    return _current is not None


def effective_request(env: Mapping[str, str]) -> Request:
    """configure() wins over FENWICKS_DEVICE, which wins over auto-detection."""
    if _request.device != "auto" or DEVICE_ENV not in env:
        return _request
    kind, replicas = parse_device(env[DEVICE_ENV])
    source = "auto-detection" if kind == "auto" else f"{DEVICE_ENV}={env[DEVICE_ENV]}"
    return dataclasses.replace(_request, device=kind,
                               replicas=_request.replicas or replicas, source=source)


# --------------------------------------------------------------------------- detection


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


class _HostProbe:
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


class TFProbe(_HostProbe):
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


Unusable = _tpu_diagnosis.Unusable


def detect(request: Request, probe: Any, env: Mapping[str, str] | None = None) -> Accelerator:
    """Chooses the accelerator for `request` on the TensorFlow engine, using `probe` for
    every side effect.

    Public for tests and diagnostics; users call `current()`.
    """
    env = os.environ if env is None else env
    wanted = request.device
    unusable: list[Unusable] = []  # devices present but unusable: cause, error, fix
    steps: list[Callable[[], Accelerator | None]] = []
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
            return _finish(found, request, unusable, probe)
    _raise_absent(request, unusable)
    raise AssertionError("unreachable")


def _finish(found: Accelerator, request: Request, unusable: list[Unusable],
            probe: Any) -> Accelerator:
    """Who chose, the precision, and a warning per device present but unusable."""
    # Read after the label "chosen by": "auto-detection: no TPU or GPU was found..."
    reason = f"{request.source}: {found.reason}"
    found = _with_precision(dataclasses.replace(found, reason=reason), request.precision,
                            probe)
    notes = tuple(f"{problem.text} Fenwicks chose {_describe(found)} instead."
                  for problem in unusable)
    for note in notes:
        _warn_once(note)
    return dataclasses.replace(found, warnings=notes)


# The diagnoses shown in this process: each is shown once, however often detection runs.
_SHOWN: dict = {}


def _warn_once(note: str) -> None:
    """Shows `note` once per process, as one `AcceleratorWarning` without a source line.

    Line 0 of a file named "fenwicks" has no source text to print after the message, and
    the registry makes Python's "default" action show each text once. Filters apply as
    to any warning: ``warnings.simplefilter('error', fw.accel.AcceleratorWarning)`` makes
    it an error.
    """
    warnings.warn_explicit(note, AcceleratorWarning, filename="fenwicks", lineno=0,
                           module="fenwicks.accel", registry=_SHOWN)


def _raise_absent(request: Request, unusable: list[Unusable]) -> None:
    wanted = request.device
    if unusable:  # FENWICKS_DEVICE=tpu|gpu: the device is there but failed; say why
        raise AcceleratorError(
            f"device={wanted!r} was requested ({request.source}) but cannot be used: "
            + " ".join(problem.text for problem in unusable))
    raise AcceleratorError(
        f"device={wanted!r} was requested but no {wanted.upper()} was found; "
        f"check the runtime type (Colab: Runtime > Change runtime type), or use "
        f"{DEVICE_ENV}=auto to fall back to what is present")


def _describe(acc: Accelerator) -> str:
    """'the CPU (1 replica, float32)' for the "chosen instead" part of a warning."""
    name = {"tpu": "the TPU", "gpu": "the GPU", "cpu": "the CPU"}[acc.kind]
    return (f"{name} ({acc.num_replicas} replica{'s' if acc.num_replicas > 1 else ''}, "
            f"{acc.precision})")


def _skipped(unusable: list[Unusable]) -> str:
    """'a CPU-only TensorFlow cannot use the TPU here (see the WARNING); ' for a reason."""
    return "".join(f"{problem.summary} (see the WARNING); " for problem in unusable)


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



def _try_tpu_vm(probe: Any, unusable: list[Unusable]) -> Accelerator | None:
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


def _try_tpu_node(probe: Any, env: Mapping[str, str]) -> Accelerator | None:
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


def _tpu(strategy: Any, resolver: Any, remote: bool, reason: str) -> Accelerator:
    replicas = int(strategy.num_replicas_in_sync)
    try:
        workers = max(1, len(resolver.cluster_spec().as_dict().get("worker", [])))
    except Exception:  # noqa: BLE001 - a resolver without a cluster spec
        workers = 1
    devices = tuple(f"TPU:{i}" for i in range(replicas))
    return Accelerator("tpu", strategy, replicas, "auto", is_remote=remote, devices=devices,
                       memory=(None,) * replicas, num_workers=workers, reason=reason)


def _try_multi_worker(probe: Any, env: Mapping[str, str]) -> Accelerator | None:
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
    return Accelerator(kind, strategy, replicas, "auto", devices=tuple(workers),
                       memory=(None,) * len(workers), num_workers=len(workers),
                       reason=f"TF_CONFIG describes a cluster; this is task {task.get('type')}:"
                              f"{task.get('index')} of {len(workers)} workers training together")


def _try_gpu(probe: Any, replicas: int | None, auto: bool = True,
             unusable: list[Unusable] | None = None) -> Accelerator | None:
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
    before = (_skipped(unusable or []) or "no TPU answered; ") if auto else ""
    return Accelerator("gpu", strategy, len(gpus), "auto",
                       devices=tuple(g["name"] for g in gpus),
                       memory=tuple(g.get("memory") for g in gpus),
                       reason=before + f"TensorFlow sees {kind}, so "
                              + ("it trains alone" if len(gpus) == 1 else
                                 "they train in sync, one replica each"))


def _cpu(probe: Any, replicas: int, auto: bool = True,
         unusable: list[Unusable] | None = None) -> Accelerator:
    strategy = probe.cpu_strategy(replicas)
    name = probe.cpu_name()
    single = "the CPU, as asked"
    if auto:
        single = (f"{_skipped(unusable)}no other TPU or GPU was found, so the CPU"
                  if unusable else "no TPU or GPU was found, so the CPU")
    reason = (single if replicas == 1 else
              f"the CPU split into {replicas} logical devices, to simulate {replicas} "
              "replicas as on a TPU (for testing: it is not faster)")
    return Accelerator("cpu", strategy, replicas, "auto",
                       devices=tuple(f"{name} (logical {i})" if replicas > 1 else name
                                     for i in range(replicas)),
                       memory=(probe.host_memory(),) * replicas, simulated=replicas > 1,
                       reason=reason)


# ------------------------------------------------------------------------- jax engine


class _JaxProbe(_HostProbe):
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

    def strategy(self) -> Any:
        import tensorflow as tf

        return tf.distribute.get_strategy()


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
            f"{DEVICE_ENV}=cpu:{request.replicas} before importing fenwicks")
    found = Accelerator(
        kind, probe.strategy(), len(devices), "auto",
        devices=tuple(f"{d['kind']} ({d['platform']}:{d['id']})" for d in devices),
        memory=tuple(d["memory"] if kind != "cpu" else probe.host_memory()
                     for d in devices),
        num_workers=probe.process_count(), simulated=kind == "cpu" and len(devices) > 1,
        reason=_jax_reason(kind, devices, wanted, unusable), engine="jax")
    return _finish(found, request, unusable, probe)


def _jax_reason(kind: str, devices: list[dict[str, Any]], wanted: str,
                unusable: list[Unusable]) -> str:
    count = len(devices)
    if kind == "cpu" and count > 1:
        return (f"the CPU split into {count} JAX devices (XLA_FLAGS="
                f"--xla_force_host_platform_device_count={count}), to simulate {count} "
                "replicas as on a TPU (for testing: it is not faster)")
    if kind == "cpu":
        return "the CPU, as asked" if wanted == "cpu" else (
            f"{_skipped(unusable)}JAX sees no TPU or GPU, so the CPU")
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


def _with_precision(acc: Accelerator, precision: str, probe: Any) -> Accelerator:
    if precision != "auto":
        return dataclasses.replace(acc, precision=precision)
    return dataclasses.replace(acc, precision=auto_precision(acc.kind, probe))


def auto_precision(kind: str, probe: Any = None) -> str:
    """bfloat16 on TPU, float16 on GPUs with compute capability >= 7.0, else float32.

    float16 on older GPUs (Pascal and before) has no tensor cores and runs slower than
    float32, so it is not worth the loss-scaling bookkeeping there.
    """
    if kind == "tpu":
        return "bfloat16"
    if kind == "gpu":
        gpus = (probe or TFProbe()).gpus()
        capabilities = [g.get("compute_capability") or (0, 0) for g in gpus]
        if capabilities and all(tuple(c) >= (7, 0) for c in capabilities):
            return "float16"
    return "float32"


@contextlib.contextmanager
def state_for_tests(current: Accelerator | None = None,
                    request: Request | None = None) -> Iterator[None]:
    """Test hook: within the block this process has chosen `current` (None: nothing yet)
    under `request` (None: nothing configured); on leaving, what was there before.

    Devices TensorFlow or JAX already set up stay set up: only Fenwicks' record changes.

    Examples:
        >>> with fw.accel.state_for_tests(fake_tpu):
        ...     assert fw.io.default_root() == 'gs://bucket/fenwicks'
    """
    global _current, _request
    saved = _current, _request
    _current, _request = current, request or Request()
    try:
        yield
    finally:
        _current, _request = saved
