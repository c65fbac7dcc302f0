"""Accelerator detection: which engine, which devices, which precision.

The engine (TensorFlow or JAX under Keras) is chosen once, at ``import fenwicks``, from
cheap facts (`fenwicks._engine`): ``FENWICKS_ENGINE``, ``KERAS_BACKEND``, or by itself the
jax engine on a TPU host whose TensorFlow cannot reach the TPU (the 2026 Kaggle and Colab
TPU images). `engine()` says which.

The devices are detected on first use of `current()` and cached for the process, by the
engine's own detector: on the TensorFlow engine the order is TPU VM, TPU node over the
network, multi-worker cluster, GPUs, CPU; on the jax engine it is what ``jax.devices()``
lists. `configure()` or the environment variable ``FENWICKS_DEVICE`` (``tpu``, ``gpu``,
``cpu``, ``cpu:8``) override it. ``cpu:N`` splits the CPU into N logical devices
(TensorFlow's, or N JAX devices through ``XLA_FLAGS``): the TPU-like test mode, N cores
sharing one global batch.

An `Accelerator` describes devices only (kind, count, memory, precision): how an engine
distributes over them is the engine's (the tf engine's ``tf.distribute`` strategy is
`fw.train.tf.strategy()`; JAX places replicas on a mesh).

A device that is present but unusable is never a silent CPU run: a TPU that cannot be
initialised (a CPU-only TensorFlow, a libtpu mismatch, held by JAX in this process or by
another process: `fenwicks._tpu_diagnosis`) or an NVIDIA GPU that the engine does not
list (the CPU-only wheel, a CUDA/cuDNN mismatch) is an `AcceleratorWarning`, shown once
per process, naming the device, the original error, the fix for that cause and
what was chosen instead; it is kept in `Accelerator.warnings` for `fw.info()`, and the
"chosen by" reason names the same cause. ``FENWICKS_DEVICE=tpu`` or ``gpu`` then fails
with the same cause.

Of fenwicks this module imports only its private helpers beside it (``_engine``, the
registry; ``_host``, the machine's evidence; ``_precision``; ``_tpu_diagnosis``;
``_tf_internals`` for JAX's private backend state) and `fenwicks._text`; every higher
layer builds on it. The engines' detectors are found through the registry by name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from fenwicks import _engine, _precision, _tf_internals, _tpu_diagnosis
from fenwicks._engine import ENGINE_ENV, EngineError
from fenwicks._host import (  # noqa: F401 - public here: fw.accel names the machine's evidence
    NVIDIA_PATHS,
    TPU_DEVICE_RE,
    cpu_name,
    libtpu_present,
    nvidia_device_evidence,
    tpu_host_evidence,
)

logger = logging.getLogger("fenwicks")

# What a user calls; the detection steps below are public for tests and diagnostics.
__all__ = [
    "DEVICE_ENV", "ENGINE_ENV", "ENGINES", "KINDS", "PRECISIONS", "Accelerator",
    "AcceleratorError", "AcceleratorWarning", "EngineError", "configure", "cpu_name", "current",
    "distribution", "engine", "engine_choice", "is_initialized", "libtpu_present",
    "nvidia_device_evidence", "parse_device", "tpu_host_evidence",
]

KINDS = ("tpu", "gpu", "cpu")
PRECISIONS = _precision.PRECISIONS
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
        num_replicas: devices sharing each global batch, over all hosts (8 on a TPU
            v2/v3-8; ``jax.device_count()`` on the jax engine). The estimator asks its
            engine (``fw.train.engines.current().num_replicas(acc)``), which agrees.
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
        return _precision.keras_policy(self.precision)

    @property
    def strategy(self) -> Any:
        """Gone: an Accelerator describes devices only. Raises AttributeError naming
        where the tf engine's strategy is."""
        raise AttributeError(
            "fw.accel.current().strategy is gone: the Accelerator describes devices only "
            "(kind, count, memory, precision), and the tf.distribute strategy belongs to "
            "the tf engine: use fw.train.tf.strategy() (FENWICKS_ENGINE=tf; on the jax "
            "engine JAX places the replicas itself and there is no strategy)")


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
    jax_on_cpu = (_jax_on_cpu_while_imported(os.environ)
                  if choice.engine == "tf" and not os.environ.get("JAX_PLATFORMS")
                  else contextlib.nullcontext())
    try:
        with jax_on_cpu:  # TensorFlow imports JAX where it is installed
            import keras  # noqa: F401 - Keras reads KERAS_BACKEND here, once per process
        if choice.engine == "tf":
            keep_jax_off_accelerators(import_jax=False)  # a JAX the user imported first
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


_JAX_CPU_ENV = {"JAX_PLATFORMS": "cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


@contextlib.contextmanager
def _jax_on_cpu_while_imported(env: MutableMapping[str, str]) -> Iterator[None]:
    """``JAX_PLATFORMS=cpu`` (and no preallocation) for a JAX imported meanwhile, then
    the environment as it was: processes started later choose for themselves."""
    saved = {name: env.get(name) for name in _JAX_CPU_ENV}
    for name, value in _JAX_CPU_ENV.items():
        env.setdefault(name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value


def keep_jax_off_accelerators(env: MutableMapping[str, str] | None = None, *,
                              import_jax: bool = True) -> None:
    """On the TensorFlow engine, keeps JAX on the CPU: it must not initialise a GPU nor
    preallocate most of its memory, which TensorFlow needs. JAX comes in with
    orbax-checkpoint (every engine's checkpoints) and, where it is installed, with
    TensorFlow itself (``tensorflow.lite`` imports it).

    JAX reads ``JAX_PLATFORMS`` when it is imported and makes its devices on first use.
    `import_keras` imports TensorFlow with ``JAX_PLATFORMS=cpu`` and
    ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` set for that import only; here a JAX not yet
    imported is imported the same way (if `import_jax`), and a JAX imported earlier whose
    devices do not exist yet is told through its config. Nothing on the jax engine, nor
    when ``JAX_PLATFORMS`` was set by the user.

    Examples:
        >>> keep_jax_off_accelerators()   # on the tf engine, before importing orbax
        >>> import jax; jax.devices()[0].platform
        'cpu'
    """
    env = os.environ if env is None else env
    if engine() == "jax" or env.get("JAX_PLATFORMS"):
        return
    jax = sys.modules.get("jax")
    if jax is None:
        if not import_jax:
            return
        with _jax_on_cpu_while_imported(env):
            import jax
    if not _tf_internals.jax_backends_initialized():
        jax.config.update("jax_platforms", "cpu")


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
        _current = _engine.detector(engine())(request)
        logger.info("fenwicks: using %s with %d replica(s), %s on the %s engine (%s)",
                    _current.kind, _current.num_replicas, _current.precision,
                    _current.engine, _current.reason)
    return _current


# Each engine's devices, as its library sees them (JAX's own, or TensorFlow's).

def distribution() -> str:
    """How the engine spreads work over the devices, in words, for `fw.info()`: the tf
    engine's strategy (``'MirroredStrategy'``), or the jax engine's mesh. Detects the
    devices if needed.

    Examples:
        >>> fw.accel.distribution()
        'OneDeviceStrategy'
    """
    current()
    return _engine.devices_module(engine()).describe_distribution()


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




Unusable = _tpu_diagnosis.Unusable


def finish(found: Accelerator, request: Request, unusable: list[Unusable],
            probe: Any) -> Accelerator:
    """Who chose, the precision, and a warning per device present but unusable: the
    last step of every engine's detector (`probe` lists the GPUs it sees)."""
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


def raise_absent(request: Request, unusable: list[Unusable]) -> None:
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


def skipped(unusable: list[Unusable]) -> str:
    """'a CPU-only TensorFlow cannot use the TPU here (see the WARNING); ' for a reason
    (each engine's detector starts its "chosen by" reason with it)."""
    return "".join(f"{problem.summary} (see the WARNING); " for problem in unusable)




def _with_precision(acc: Accelerator, precision: str, probe: Any) -> Accelerator:
    if precision != "auto":
        return dataclasses.replace(acc, precision=precision)
    gpus = probe.gpus() if acc.kind == "gpu" else []
    return dataclasses.replace(acc, precision=_precision.auto_precision(
        acc.kind, [g.get("compute_capability") for g in gpus]))


@contextlib.contextmanager
def state_for_tests(current: Accelerator | None = None,
                    request: Request | None = None) -> Iterator[None]:
    """Test hook: within the block this process has chosen `current` (None: nothing yet)
    under `request` (None: nothing configured); on leaving, what was there before.

    Devices TensorFlow or JAX already set up stay set up: only Fenwicks' record changes.

    Examples:
        >>> fake_tpu = fw.accel.Accelerator('tpu', 8, 'bfloat16', is_remote=True)
        >>> with fw.accel.state_for_tests(fake_tpu):
        ...     print(fw.accel.current().kind, fw.accel.current().num_replicas)
        tpu 8
        >>> fw.accel.current() is fake_tpu
        False
    """
    global _current, _request
    saved = _current, _request
    _current, _request = current, request or Request()
    try:
        yield
    finally:
        _current, _request = saved
