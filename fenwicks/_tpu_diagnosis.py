"""Why a TPU that is on this machine could not be used, and the fix for that cause.

`fw.accel` calls `tensorflow_cause` when TensorFlow's TPU initialisation fails, and
`jax_cause` when JAX (the jax engine) sees no TPU on a TPU host. Each returns an
`Unusable`: a short cause for `fw.info()`'s "chosen by" row and the full warning text.
The causes, as the 2026 images produce them:

- ``cpu-build``: TensorFlow is a CPU-only build (``tensorflow-cpu``, or the ``tensorflow``
  wheel): "No OpKernel was registered to support Op 'ConfigureDistributedTPU'". Kaggle's
  TPU image ships ``tensorflow-cpu`` 2.20 beside ``jax[tpu]``.
- ``mixed``: ``tensorflow-tpu`` and another TensorFlow distribution share one
  ``tensorflow`` folder; the files of the last one installed run.
- ``libtpu``: a TPU TensorFlow with a libtpu it cannot use ("No TPU platform found", a
  version mismatch). ``tensorflow-tpu`` 2.20 asks for ``libtpu~=0.0.14``, and pip then picks
  the newest libtpu, which is built for JAX.
- ``this-process``: the other framework in this process initialised the TPU first.
- ``other-process``: another process holds the TPU.
- ``no-chip``: the machine is set up as a TPU host but no TPU chip is attached.
- ``jax-no-tpu``: JAX has no TPU support installed.
- ``unknown``: anything else, with the original error.

No fix installs a second TensorFlow distribution over another one, and none tells the user
to restart where a restart cannot help. This module imports only `fenwicks._text`, a leaf.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence

from fenwicks._text import first_line

# Google's index of TensorFlow TPU builds with the libtpu each is made for (Cloud TPU's
# TensorFlow instructions); PyPI alone gives tensorflow-tpu the newest libtpu, JAX's.
TF_TPU_INDEX = "https://storage.googleapis.com/libtpu-tf-releases/index.html"
NEWEST_TF_TPU = "2.20.0"  # tensorflow-tpu's last release (August 2025); 2.21 has none
_BUSY = re.compile(r"busy|already in use|in use by process", re.I)
_PID = re.compile(r"process with pid (\d+)", re.I)
_NO_KERNEL = re.compile(r"No OpKernel was registered to support Op '\w*TPU\w*'", re.I)
_LIBTPU = re.compile(r"No TPU platform found|version|incompatib|PJRT|symbol", re.I)
_NO_CHIP = re.compile(r"No \w+ device found|no TPU (device|chip)s? (was |were )?found",
                      re.I)


@dataclasses.dataclass(frozen=True)
class TpuFacts:
    """What the diagnosis reads, gathered by the probe (tests pass their own).

    Attributes:
        evidence: why this is a TPU host, in words (``fw.accel`` and `_engine`).
        tensorflows: installed TensorFlow distributions -> version.
        libtpu: the installed libtpu version, or None.
        jax: the installed JAX version, or None.
        holders: other processes with a TPU device file open, in words.
        jax_holds_tpu: True if JAX in this process has already initialised the TPU.
        pid: this process's id (a busy message naming it means this process).
    """

    evidence: Sequence[str]
    tensorflows: Mapping[str, str] = dataclasses.field(default_factory=dict)
    libtpu: str | None = None
    jax: str | None = None
    holders: Sequence[str] = ()
    jax_holds_tpu: bool = False
    pid: int = dataclasses.field(default_factory=os.getpid)

    @property
    def tpu_tensorflow(self) -> tuple[str, str] | None:
        for name in ("tensorflow-tpu", "tf-nightly-tpu"):
            if name in self.tensorflows:
                return name, self.tensorflows[name]
        return None

    @property
    def has_device_file(self) -> bool:
        return any(e.startswith(("/dev/accel", "/dev/vfio/")) for e in self.evidence)


@dataclasses.dataclass(frozen=True)
class Unusable:
    """A device that is present but unusable: the cause in a few words and in full."""

    cause: str  # one of the causes in the module docstring
    summary: str  # for "chosen by": "a CPU-only TensorFlow cannot use the TPU here"
    text: str  # the warning: device, evidence, original error, fix


def _error(error: BaseException | str) -> str:
    if isinstance(error, BaseException):
        return f"{type(error).__name__}: {first_line(error)}"
    return first_line(error)


def _builds(facts: TpuFacts) -> str:
    return ", ".join(f"{name} {version}" for name, version in facts.tensorflows.items()) \
        or "no TensorFlow"


def _tpu_build_install(facts: TpuFacts, version: str = NEWEST_TF_TPU,
                       force: bool = False) -> str:
    replaced = (f"; it replaces libtpu {facts.libtpu}, which JAX or torch_xla here may be "
                "built against" if facts.libtpu else "")
    return (f"pip install {'--force-reinstall ' if force else ''}'tensorflow-tpu=={version}' "
            f"-f {TF_TPU_INDEX} (Google's instructions: the libtpu made for that "
            f"TensorFlow{replaced})")


def _jax_route(facts: TpuFacts) -> str:
    if facts.jax:
        return (f"run on the jax engine, which reaches this TPU through JAX {facts.jax} and "
                "the libtpu installed: set FENWICKS_ENGINE=jax before importing fenwicks, "
                "in a new Python process (the engine is chosen at import)")
    return ("install JAX for this TPU (pip install 'jax[tpu]') and import fenwicks in a "
            "new Python process: it then runs on the jax engine")


def tensorflow_cause(error: BaseException, facts: TpuFacts) -> Unusable:
    """Classifies TensorFlow's failure to initialise the local TPU; see the module doc."""
    where = f"a TPU is on this machine ({', '.join(facts.evidence)})"
    seen = _error(error)
    pid = _PID.search(str(error))
    if facts.jax_holds_tpu or (pid and int(pid.group(1)) == facts.pid):
        return Unusable("this-process", "JAX in this process holds the TPU here", (
            f"{where} but JAX in this process already holds it ({seen}): a TPU serves one "
            "framework per process, and JAX initialised it first (jax.devices() or a JAX "
            "computation ran before Fenwicks). Fix: use the jax engine "
            "(FENWICKS_ENGINE=jax before importing fenwicks), or keep JAX off the TPU "
            "(JAX_PLATFORMS=cpu before importing jax); either way in a new Python process, "
            "since JAX keeps the TPU until its process ends."))
    if facts.holders or _BUSY.search(str(error)):
        return _other_process(where, seen, facts)
    tpu_tf = facts.tpu_tensorflow
    if tpu_tf is None or (_NO_KERNEL.search(str(error)) and len(facts.tensorflows) > 1):
        return _cpu_build(where, seen, facts)
    if _LIBTPU.search(str(error)):
        name, version = tpu_tf
        libtpu = f"libtpu {facts.libtpu}" if facts.libtpu else "the libtpu found"
        also = f" Or {_jax_route(facts)}." if facts.jax else ""
        return Unusable("libtpu", f"{name} {version} cannot use {libtpu} here", (
            f"{where} and {name} {version} is installed, but it cannot use {libtpu} "
            f"({seen}): a TensorFlow TPU build works only with the libtpu made for it, and "
            f"pip alone picks the newest libtpu, which is made for JAX. Fix: "
            f"{_tpu_build_install(facts, version, force=True)}, then start a new Python "
            f"process.{also}"))
    return _unknown(where, seen, facts, "TensorFlow")


def _cpu_build(where: str, seen: str, facts: TpuFacts) -> Unusable:
    others = [name for name in facts.tensorflows if name != "tensorflow-tpu"]
    if facts.tpu_tensorflow and others:
        name, version = facts.tpu_tensorflow
        return Unusable("mixed", "two TensorFlow distributions share one folder here", (
            f"{where} and {name} {version} is installed, but so is "
            f"{', '.join(f'{o} {facts.tensorflows[o]}' for o in others)}: they install "
            "into one `tensorflow` folder, and the files that run (the last installed) "
            f"have no TPU kernels ({seen}). Fix: pip uninstall -y {name} "
            f"{' '.join(others)}, then {_tpu_build_install(facts, version)}, and start a "
            "new Python process."))
    if not facts.tensorflows:
        summary, what = "no TensorFlow is installed here", "there is no TensorFlow"
    else:
        summary = "a CPU-only TensorFlow cannot use the TPU here"
        what = (f"the installed TensorFlow ({_builds(facts)}) is a CPU-only build without "
                f"TPU kernels ({seen})")
    remove = " ".join(facts.tensorflows)
    replace = (f"pip uninstall -y {remove}, then " if remove else "") + \
        _tpu_build_install(facts)
    return Unusable("cpu-build", summary, (
        f"{where} but {what}, so TensorFlow cannot use the TPU. Fix: {_jax_route(facts)}. "
        f"To train on TensorFlow instead, replace it with the TPU build (its newest "
        f"release is {NEWEST_TF_TPU}): {replace}, then start a new Python process."))


def _other_process(where: str, seen: str, facts: TpuFacts) -> Unusable:
    if facts.holders:
        pids = " ".join(h.split()[1] for h in facts.holders if h.startswith("pid "))
        return Unusable("other-process", "another process holds the TPU here", (
            f"{where} but another process holds it: {', '.join(facts.holders)} ({seen}). "
            f"Fix: end that process (kill {pids or '<pid>'}; if it is another notebook's "
            "kernel, stop that notebook's session); restarting this process alone does not "
            "free the TPU."))
    return Unusable("other-process", "another process holds the TPU here", (
        f"{where} but another process holds it ({seen}). Fix: find it with "
        "`lsof -w /dev/accel* /dev/vfio/*` (with sudo on a TPU VM) and end it with "
        "`kill <pid>`; restarting this process alone does not free the TPU."))


def _unknown(where: str, seen: str, facts: TpuFacts, framework: str) -> Unusable:
    versions = f"{_builds(facts)}, libtpu {facts.libtpu or 'not installed'}, " \
               f"JAX {facts.jax or 'not installed'}"
    return Unusable("unknown", f"{framework} could not initialise the TPU here", (
        f"{where} but {framework} could not initialise it: {seen} ({versions}). Fenwicks "
        "does not recognise this error. Fix: check that the TPU is attached and free "
        "(`lsof -w /dev/accel* /dev/vfio/*`) and that libtpu matches "
        f"{framework}; set FENWICKS_DEVICE=tpu to make this an error instead of a CPU "
        "run."))


def jax_cause(error: str | None, facts: TpuFacts) -> Unusable:
    """Classifies why JAX sees no TPU on a TPU host: `error` is JAX's own message for its
    TPU backend (None if JAX never tried one)."""
    where = f"this machine is set up as a TPU host ({', '.join(facts.evidence)})"
    if error is None:
        return Unusable("jax-no-tpu", "JAX has no TPU support installed here", (
            f"{where} but JAX {facts.jax} has no TPU backend: libtpu is not installed for "
            "it. Fix: pip install 'jax[tpu]' (JAX with the libtpu made for it), then start "
            "a new Python process."))
    pid = _PID.search(error)
    if pid and int(pid.group(1)) == facts.pid:
        return Unusable("this-process", "TensorFlow in this process holds the TPU here", (
            f"{where} but TensorFlow in this process already holds the TPU ({error}). Fix: "
            "do not initialise the TPU with TensorFlow (TPUStrategy) in a process that "
            "uses the jax engine, and start a new Python process."))
    if facts.holders or _BUSY.search(error):
        return _other_process(where.replace("this machine is set up as a TPU host",
                                            "a TPU is on this machine"), error, facts)
    if _NO_CHIP.search(error) or not facts.has_device_file:
        return Unusable("no-chip", "no TPU chip is attached here", (
            f"{where} but no TPU chip is attached: libtpu found none ({error}), and there "
            "is no /dev/accel* or /dev/vfio/* device. Fix: choose a TPU runtime (Kaggle: "
            "Settings > Accelerator; Colab: Runtime > Change runtime type); on a copy of a "
            "TPU image without a TPU (a CPU session, a replica) this is expected."))
    if _LIBTPU.search(error):
        return Unusable("libtpu", f"JAX {facts.jax} cannot use libtpu {facts.libtpu} here", (
            f"{where} but JAX {facts.jax} cannot use libtpu {facts.libtpu} ({error}). Fix: "
            f"pip install 'jax[tpu]=={facts.jax}' (the libtpu made for this JAX; on Kaggle "
            "it replaces the libtpu torch_xla there needs), then start a new Python "
            "process."))
    return _unknown(where, error, facts, "JAX")
