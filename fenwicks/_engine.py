"""Which engine runs Keras, TensorFlow or JAX: decided once, when ``import fenwicks`` runs.

Keras fixes its backend when ``keras`` is imported, so the choice has to be made before
that, from cheap facts only: environment variables, installed distributions (their
metadata, via `importlib.metadata`) and files that exist. Nothing here probes a device or
imports TensorFlow or JAX.

The rule (`choose_engine`):

1. ``FENWICKS_ENGINE=tf|jax`` insists on one; a ``KERAS_BACKEND`` that says otherwise is
   an error (Keras would run on the other one).
2. Else ``KERAS_BACKEND=jax`` means the JAX engine, ``KERAS_BACKEND=tensorflow`` the
   TensorFlow one; any other backend (torch, numpy, openvino) is an error: Fenwicks needs
   TensorFlow or JAX under Keras.
3. Else auto: a TPU host (`tpu_host_evidence`) whose TensorFlow cannot reach the TPU (no
   ``tensorflow-tpu`` distribution installed, or no TensorFlow at all) and that has JAX
   installed runs on JAX, and says so in one line; everything else runs on TensorFlow.
   This is the 2026 Kaggle TPU image (``tensorflow-cpu`` 2.20 beside ``jax[tpu]``) and
   Colab's TPU runtime (JAX, no TensorFlow).

Keras imported before Fenwicks keeps its backend: under 3 Fenwicks follows it (tensorflow
or jax) and says so in one line; under 1 or 2 a different backend is an error.

`setup` then sets ``KERAS_BACKEND`` for Keras (so that ``~/.keras/keras.json`` cannot
pick a third backend) and, on the JAX engine, turns ``FENWICKS_DEVICE=cpu:N`` into
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` before JAX creates its devices.

Each engine is one `EngineEntry` in `REGISTRY`: its name, Keras backend, the modules of
its roles, device detector and backend facts, and its checkpoint reader. Everything else
that knows the engines reads this table. This module imports nothing of Fenwicks: the
entries name modules, which `detector`, `backend_facts` and `fenwicks.train.engines`
import on first use.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Mapping, MutableMapping
from importlib import metadata
from types import ModuleType
from typing import Any

ENGINE_ENV = "FENWICKS_ENGINE"
DEVICE_ENV = "FENWICKS_DEVICE"


@dataclasses.dataclass(frozen=True)
class EngineEntry:
    """One engine: what Fenwicks needs to know to choose it and find its parts.

    Attributes:
        name: the engine's name (`Engine.name`; ``FENWICKS_ENGINE`` for an engine of its
            own Keras backend).
        keras_backend: the Keras backend that means this engine; None for an engine that
            runs under any backend (chosen by name only, `fenwicks.train.engines.use`).
        module: the module whose ``ENGINE`` implements `fenwicks.train.engines.Engine`.
        devices: its device detector: ``detect_devices(request) -> Accelerator`` and
            ``describe_distribution() -> str`` (for `fw.info`); None without a backend.
        facts: its backend facts for the layers and optimizers below `fenwicks.train`:
            ``is_symbolic``, ``data_parallel_replicas``, ``SYNCS_BATCHNORM``,
            ``LASTING_BACKEND_VARIABLES``, ``sum_gradients``, ``update_each``; None
            without a backend.
        reader: the module reading this engine's checkpoints into
            `cross_engine.SavedWeights`, importable on any engine (``NAME``, ``TITLE``,
            ``latest``, ``all_checkpoints``, ``work_dir_of``, ``is_checkpoint``,
            ``read``); None if another engine cannot read them.
        libraries: its own libraries beyond TensorFlow and Keras (`fw.info` rows).
        splits_cpu_by_flags: whether ``FENWICKS_DEVICE=cpu:N`` must be set as flags before
            the engine's library makes its devices (JAX's ``XLA_FLAGS``), rather than as
            logical devices.
    """

    name: str
    keras_backend: str | None
    module: str
    devices: str | None
    facts: str | None
    reader: str | None
    libraries: tuple[str, ...] = ()
    splits_cpu_by_flags: bool = False


REGISTRY = {entry.name: entry for entry in (
    EngineEntry("tf", "tensorflow", module="fenwicks.train.tf.engine",
                devices="fenwicks.train.tf.devices", facts="fenwicks.train.tf.backend",
                reader="fenwicks.train.tf.weights"),
    EngineEntry("jax", "jax", module="fenwicks.train.jax.engine",
                devices="fenwicks.train.jax.devices", facts="fenwicks.train.jax.backend",
                reader="fenwicks.train.jax.weights", libraries=("jax",),
                splits_cpu_by_flags=True),
    # NumPy gradient steps for the tests of the shared code, under any Keras backend.
    EngineEntry("reference", None, module="fenwicks.train.reference.engine", devices=None,
                facts=None, reader="fenwicks.train.reference.weights"),
)}
# The engines of a Keras backend: what FENWICKS_ENGINE chooses from.
KERAS_BACKEND = {name: entry.keras_backend for name, entry in REGISTRY.items()
                 if entry.keras_backend}
ENGINES = tuple(KERAS_BACKEND)
# Environment variables a TPU VM image sets: Kaggle's TPU image sets ISTPUVM=1 and
# TPU_PROCESS_ADDRESSES=local (Kaggle/docker-python, tpu/Dockerfile); Cloud TPU VMs set
# TPU_ACCELERATOR_TYPE; Colab's TPU runtimes set COLAB_TPU_ADDR.
TPU_ENV = ("ISTPUVM", "TPU_ACCELERATOR_TYPE", "TPU_PROCESS_ADDRESSES", "COLAB_TPU_ADDR")
# TPU chips as device files: /dev/accel<N> (v2-v4), /dev/vfio/<N> (v5e and later). A bare
# /dev/vfio/vfio is only the VFIO driver, present on many machines without a TPU.
TPU_DEVICE_GLOBS = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")
LIBTPU_FILES = ("/lib/libtpu.so", "/usr/lib/libtpu.so", "/usr/local/lib/libtpu.so")
# Every distribution that installs the `tensorflow` package; the TPU builds are the ones
# TensorFlow can reach a TPU VM's chips with.
TF_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-nightly",
                    "tf-nightly-cpu", "tf-nightly-tpu", "tensorflow-intel", "tensorflow-macos")
TPU_TF_DISTRIBUTIONS = ("tensorflow-tpu", "tf-nightly-tpu")
_WATCHED = (*TF_DISTRIBUTIONS, "jax", "jaxlib", "libtpu", "libtpu-nightly")
_XLA_DEVICES_FLAG = "--xla_force_host_platform_device_count"


class EngineError(ImportError):
    """The engine cannot be chosen: a bad FENWICKS_ENGINE or KERAS_BACKEND, JAX missing,
    or Keras already imported on another backend. Raised by ``import fenwicks``."""


@dataclasses.dataclass(frozen=True)
class HostFacts:
    """What the decision reads besides the environment; `gather` reads this machine.

    Attributes:
        distributions: installed distribution name -> version, for TensorFlow's
            distributions, jax, jaxlib and libtpu.
        tpu_files: TPU device files and libtpu.so files found.
        libtpu_module: True if a ``libtpu`` package is importable (pip's libtpu).
        keras_backend: the backend of a ``keras`` imported before Fenwicks, else None.
        jax_module: True if ``jax`` is importable (also without distribution metadata).
        orbax_module: True if ``orbax.checkpoint`` is importable: every engine's
            checkpoints (the run format). Defaults to True.
        tensorstore_module: True if ``tensorstore`` is importable: what orbax writes
            arrays with. Defaults to True.
    """

    distributions: Mapping[str, str]
    tpu_files: tuple[str, ...] = ()
    libtpu_module: bool = False
    keras_backend: str | None = None
    jax_module: bool = False
    orbax_module: bool = True
    tensorstore_module: bool = True

    @classmethod
    def gather(cls) -> HostFacts:
        """Reads this machine: distribution metadata, device files, `sys.modules`."""
        found = {}
        for name in _WATCHED:
            try:
                found[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        files = [path for pattern in TPU_DEVICE_GLOBS for path in sorted(glob.glob(pattern))]
        files += [path for path in LIBTPU_FILES if os.path.exists(path)]
        keras = sys.modules.get("keras")
        backend = None
        if keras is not None:
            try:
                backend = keras.backend.backend()
            except Exception:  # noqa: BLE001 - a keras half imported: nothing to compare
                backend = None
        return cls(found, tuple(files), _importable("libtpu"), backend,
                   _importable("jax"), _importable("orbax.checkpoint"),
                   _importable("tensorstore"))

    @property
    def jax_version(self) -> str | None:
        if "jax" in self.distributions:
            return self.distributions["jax"]
        return "(version unknown)" if self.jax_module else None

    @property
    def tensorflows(self) -> dict[str, str]:
        """The installed TensorFlow distributions and their versions."""
        return {name: version for name, version in self.distributions.items()
                if name in TF_DISTRIBUTIONS}

    @property
    def tpu_tensorflow(self) -> str | None:
        """'tensorflow-tpu 2.20.0' if a TPU build is installed, else None."""
        for name in TPU_TF_DISTRIBUTIONS:
            if name in self.distributions:
                return f"{name} {self.distributions[name]}"
        return None


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules, a bad path
        return False


def tpu_host_evidence(env: Mapping[str, str], facts: HostFacts) -> list[str]:
    """What shows that this machine is a TPU host, in words; empty if nothing does.

    Examples:
        >>> tpu_host_evidence({"ISTPUVM": "1"}, HostFacts({"libtpu": "0.0.17"}))
        ['ISTPUVM=1', 'libtpu 0.0.17 is installed']
    """
    evidence = [f"{name}={env[name]}" for name in TPU_ENV if env.get(name)]
    for name in ("libtpu", "libtpu-nightly"):
        if name in facts.distributions:
            evidence.append(f"{name} {facts.distributions[name]} is installed")
            break
    else:
        if facts.libtpu_module:
            evidence.append("libtpu is installed")
    evidence += [f"{path} exists" for path in facts.tpu_files]
    return evidence


@dataclasses.dataclass(frozen=True)
class EngineChoice:
    """The engine, why, and whether to say so at import (the auto-chosen JAX engine)."""

    engine: str
    reason: str
    announce: bool = False

    @property
    def keras_backend(self) -> str:
        return KERAS_BACKEND[self.engine]

    @property
    def libraries(self) -> tuple[str, ...]:
        """The engine's own libraries beyond TensorFlow and Keras (`fw.info` rows)."""
        return REGISTRY[self.engine].libraries

    @property
    def splits_cpu_by_flags(self) -> bool:
        """See `EngineEntry.splits_cpu_by_flags`."""
        return REGISTRY[self.engine].splits_cpu_by_flags


def choose_engine(env: Mapping[str, str], facts: HostFacts) -> EngineChoice:
    """Decides the engine from the environment and `facts` (see the module docstring).

    Raises:
        EngineError: for a FENWICKS_ENGINE or KERAS_BACKEND Fenwicks cannot run on, or a
            JAX engine asked for without JAX installed.

    Examples:
        >>> choose_engine({"FENWICKS_ENGINE": "jax"}, HostFacts({"jax": "0.7.2"})).engine
        'jax'
    """
    forced = env.get(ENGINE_ENV, "").strip()
    backend = env.get("KERAS_BACKEND", "").strip()
    if forced:
        choice = _forced(forced, backend, facts)
    elif backend:
        choice = _from_keras_backend(backend, facts)
    else:
        choice = _auto(env, facts)
    _require_orbax(_what(choice, forced, backend), facts)
    if facts.keras_backend and facts.keras_backend != choice.keras_backend:
        if not forced and not backend and facts.keras_backend in KERAS_BACKEND.values():
            # Nobody asked for an engine: follow the Keras that is already running, and say
            # what auto-detection would have chosen.
            engine = "tf" if facts.keras_backend == "tensorflow" else "jax"
            return EngineChoice(engine, (
                f"keras was imported before fenwicks, on {facts.keras_backend!r}; "
                f"auto-detection would have chosen {choice.engine} ({choice.reason})"),
                announce=True)
        raise EngineError(
            f"keras was imported before fenwicks with the {facts.keras_backend!r} backend, "
            f"but Fenwicks runs Keras on {choice.keras_backend!r} here ({choice.reason}); "
            "Keras fixes its backend when it is first imported, so restart the Python "
            f"process and import fenwicks before keras, or set KERAS_BACKEND="
            f"{facts.keras_backend} before both if Fenwicks supports it (tensorflow or "
            "jax).")
    return choice


def _forced(forced: str, backend: str, facts: HostFacts) -> EngineChoice:
    engine = forced.lower()
    if engine not in ENGINES:
        raise EngineError(f"{ENGINE_ENV}={forced!r} is not an engine Fenwicks has; set "
                          f"{ENGINE_ENV}=tf or {ENGINE_ENV}=jax (or unset it to choose "
                          "automatically) before importing fenwicks.")
    if backend and backend.lower() != KERAS_BACKEND[engine]:
        raise EngineError(f"{ENGINE_ENV}={forced} and KERAS_BACKEND={backend} disagree: "
                          f"the {engine} engine runs Keras on {KERAS_BACKEND[engine]!r}; "
                          "unset KERAS_BACKEND or set it to "
                          f"{KERAS_BACKEND[engine]} before importing fenwicks.")
    if engine == "jax":
        _require_jax(f"{ENGINE_ENV}={forced} is set", facts)
    return EngineChoice(engine, f"{ENGINE_ENV}={forced}")


def _from_keras_backend(backend: str, facts: HostFacts) -> EngineChoice:
    name = backend.lower()
    if name == "tensorflow":
        return EngineChoice("tf", f"KERAS_BACKEND={backend}")
    if name == "jax":
        _require_jax(f"KERAS_BACKEND={backend} is set", facts)
        return EngineChoice("jax", f"KERAS_BACKEND={backend}")
    raise EngineError(
        f"KERAS_BACKEND={backend} is set, but Fenwicks runs Keras only on TensorFlow or "
        "JAX; unset KERAS_BACKEND (or set it to tensorflow or jax) before importing "
        "fenwicks, in a new Python process.")


def _require_jax(what: str, facts: HostFacts) -> None:
    if facts.jax_version is None:
        raise EngineError(
            f"{what}, but JAX is not installed; Fenwicks runs Keras on JAX only where JAX "
            "is installed: pip install jax (on a TPU VM: pip install 'jax[tpu]'), or "
            f"unset it to run on TensorFlow.")
    _require_orbax(what, facts)


def _what(choice: EngineChoice, forced: str, backend: str) -> str:
    """How `_require_orbax`'s sentence starts for `choice`."""
    if forced:
        return f"{ENGINE_ENV}={forced} is set"
    if backend:
        return f"KERAS_BACKEND={backend} is set"
    return f"Fenwicks chose the {choice.engine} engine ({choice.reason})"


def _require_orbax(what: str, facts: HostFacts) -> None:
    # Found here, not at the first checkpoint: train() would fail after building the model.
    if not facts.orbax_module:
        raise EngineError(
            f"{what}, but orbax-checkpoint, which Fenwicks saves its checkpoints with on "
            "every engine, is not installed: pip install orbax-checkpoint (a dependency of "
            "fenwicks: pip install fenwicks installs it), then restart Python.")
    if not facts.tensorstore_module:
        raise EngineError(
            f"{what}, but tensorstore, which orbax-checkpoint writes Fenwicks' checkpoints "
            "with, is not installed: pip install tensorstore (a dependency of fenwicks), "
            "then restart Python.")


def _auto(env: Mapping[str, str], facts: HostFacts) -> EngineChoice:
    evidence = tpu_host_evidence(env, facts)
    if not evidence:
        return EngineChoice("tf", "auto: not a TPU host")
    if facts.tpu_tensorflow:
        return EngineChoice("tf", f"auto: this TPU host has {facts.tpu_tensorflow}")
    tensorflows = facts.tensorflows
    if tensorflows:
        builds = ", ".join(f"{name} {version}" for name, version in tensorflows.items())
        lacks = (f"its TensorFlow is a CPU-only build ({builds}; the TPU build is "
                 "tensorflow-tpu)")
    else:
        lacks = "it has no TensorFlow"
    if facts.jax_version is None:
        return EngineChoice("tf", f"auto: a TPU host where {lacks}, and JAX is not "
                                  "installed")
    reason = (f"auto: this is a TPU host ({', '.join(evidence)}) and {lacks}, so "
              f"TensorFlow cannot reach the TPU; JAX {facts.jax_version} can")
    _require_orbax("Fenwicks chose the jax engine (this TPU host's TensorFlow cannot "
                   "reach the TPU)", facts)
    return EngineChoice("jax", reason, announce=True)


def announcement(choice: EngineChoice) -> str:
    """The one line ``import fenwicks`` prints when nobody asked for the engine it runs:
    the jax engine chosen by itself, or the engine of a Keras imported before Fenwicks."""
    if choice.reason.startswith("keras was imported"):
        other = "jax" if choice.engine == "tf" else "tf"
        return (f"fenwicks: Keras runs on {choice.keras_backend} (the {choice.engine} engine) "
                f"because {choice.reason}. To run on the {other} engine, import fenwicks "
                "before keras, in a new Python process.")
    why = choice.reason.removeprefix("auto: ")
    return (f"fenwicks: Keras runs on JAX (the jax engine) because {why}; TensorFlow only "
            f"feeds tf.data. Set {ENGINE_ENV}=tf before importing fenwicks to insist on "
            "TensorFlow.")


def force_cpu_devices(env: MutableMapping[str, str], replicas: int | None) -> None:
    """Sets `env` so that JAX uses the CPU, split into `replicas` devices (``cpu:N``):
    ``XLA_FLAGS`` gets ``--xla_force_host_platform_device_count=N`` appended (replacing
    an earlier value of that one flag) and ``JAX_PLATFORMS=cpu``. XLA reads its flags when
    JAX creates its devices, so this must run before; `fw.accel` also tells an already
    imported jax about the platform.

    Examples:
        >>> env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
        >>> force_cpu_devices(env, 8); env["XLA_FLAGS"]
        '--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=8'
    """
    if replicas is not None:
        kept = [flag for flag in env.get("XLA_FLAGS", "").split()
                if not re.match(re.escape(_XLA_DEVICES_FLAG) + r"(=|$)", flag)]
        env["XLA_FLAGS"] = " ".join([*kept, f"{_XLA_DEVICES_FLAG}={replicas}"])
    env["JAX_PLATFORMS"] = "cpu"


# ----------------------------------------------------------- finding an engine's parts


def devices_module(name: str) -> ModuleType:
    """Engine `name`'s device module (`EngineEntry.devices`); `name` is one of `ENGINES`."""
    return importlib.import_module(str(REGISTRY[name].devices))


def detector(name: str) -> Callable[[Any], Any]:
    """Engine `name`'s device detector, ``detect_devices(request) -> Accelerator``."""
    return devices_module(name).detect_devices


def readers() -> dict[str, str]:
    """Engine name -> the module reading its checkpoints (`EngineEntry.reader`), for
    every engine whose checkpoints another engine can read."""
    return {name: entry.reader for name, entry in REGISTRY.items() if entry.reader}


def entry_for_backend(keras_backend: str) -> EngineEntry | None:
    """The engine that runs Keras on `keras_backend`, or None."""
    for entry in REGISTRY.values():
        if entry.keras_backend == keras_backend:
            return entry
    return None


def backend_facts() -> ModuleType:
    """The facts of the Keras backend running now that the layers, optimizers and loss
    checks need (they sit below `fenwicks.train`): the registry entry's ``facts`` module.

    Raises:
        ValueError: Keras runs on a backend no engine implements.
    """
    import keras  # imported lazily: this module is read before Keras is

    return _facts_of(keras.backend.backend())


@functools.cache
def _facts_of(backend: str) -> ModuleType:
    # Cached, and a C-level wrapper: a compiled step (a tf.function that AutoGraph
    # converts) calls it as it is, and never traces the import machinery.
    entry = entry_for_backend(backend)
    if entry is None:
        raise ValueError(f"Keras runs on {backend!r}; Fenwicks' engines run on "
                         f"{sorted(KERAS_BACKEND.values())}: set KERAS_BACKEND (or "
                         f"{ENGINE_ENV}) before importing Keras")
    return importlib.import_module(str(entry.facts))
