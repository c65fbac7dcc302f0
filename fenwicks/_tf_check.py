"""A clear message when no TensorFlow is installed (it is an extra, not a dependency).

TensorFlow is needed on both engines: on the jax engine it still runs the input pipelines
(`tf.data`). The message names the extra for this machine: ``tpu`` on a TPU host (Colab's
TPU runtime ships JAX and no TensorFlow), ``gpu`` where an NVIDIA GPU is present, else
``cpu``. Importing TensorFlow also needs a usable temporary folder (absl asks `tempfile`
for one), which `require_temp_dir` checks first.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import warnings

# The supported range, kept green by tools/tf_matrix.sh; setup.py and the README agree.
MIN_VERSION = (2, 20)
MAX_TESTED = (2, 21)
DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-nightly",
                 "tensorflow-macos", "tensorflow-intel")

_WHY = ("Fenwicks needs TensorFlow 2.20 or 2.21 (on the jax engine too: it runs the input "
        "pipelines, tf.data) and does not install it itself, so that it never installs a "
        "second TensorFlow over the one your machine ships (Colab GPU/CPU: tensorflow, "
        "Kaggle TPU: tensorflow-cpu 2.20; Colab's TPU runtime has none).")


def suggested_extra() -> tuple[str, str]:
    """The extra to install on this machine and why: ('tpu'|'gpu'|'cpu', reason)."""
    from fenwicks import accel  # imports no TensorFlow

    tpu = accel.tpu_host_evidence()
    if tpu:
        return "tpu", f"this is a TPU host ({', '.join(tpu)})"
    evidence = accel.nvidia_device_evidence()
    if evidence:
        return "gpu", f"an NVIDIA GPU is present ({evidence})"
    return "cpu", "no TPU (libtpu) and no NVIDIA GPU was found"


def install_hint() -> str:
    """The advice `require_tensorflow` gives, naming this machine's extra first."""
    extra, reason = suggested_extra()
    return (f"{_WHY} On this machine {reason}: pip install 'fenwicks[{extra}]' (from a "
            f"clone: pip install -e '.[{extra}]'). The extras are tpu (tensorflow-cpu for "
            "tf.data and jax: the TPU is reached through JAX, whose libtpu stays as "
            "installed), gpu (tensorflow[and-cuda]), cpu (tensorflow-cpu) and tensorflow.")


def _version(numbers: str) -> tuple[int, ...]:
    return tuple(int(p) for p in numbers.split(".")[:2] if p.isdigit())


def require_tensorflow() -> None:
    """Raises ImportError with install advice if TensorFlow is absent or too old.

    A TensorFlow newer than the tested range imports with a warning.

    Examples:
        >>> require_tensorflow()      # silent where TensorFlow 2.20 or 2.21 is installed
    """
    if importlib.util.find_spec("tensorflow") is None:
        raise ImportError(install_hint())
    from importlib import metadata

    for dist in DISTRIBUTIONS:
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        if _version(version) < MIN_VERSION:
            raise ImportError(f"{dist} {version} is installed, older than 2.20. "
                              f"{install_hint()}")
        if _version(version) > MAX_TESTED:
            warnings.warn(f"{dist} {version} is newer than the TensorFlow versions "
                          "Fenwicks is tested with (2.20 and 2.21); if something fails, "
                          "tools/tf_matrix.sh checks a version", stacklevel=3)
        return


def require_temp_dir() -> None:
    """Raises ImportError naming every folder tried if Python has no usable temp folder.

    TensorFlow's import (absl's logging) asks `tempfile.gettempdir`, which otherwise
    fails deep inside it with a bare ``FileNotFoundError``.

    Examples:
        >>> require_temp_dir()      # silent where /tmp (or $TMPDIR) is writable
    """
    try:
        tempfile.gettempdir()
    except OSError as err:  # "No usable temporary directory found in [...]"
        raise ImportError(
            f"No usable temporary folder: Python tried {_temp_candidates()} and none is "
            "writable with free space, and TensorFlow needs one when Fenwicks imports it; "
            "set TMPDIR to a writable folder with free space (e.g. mkdir -p ~/tmp && "
            "export TMPDIR=~/tmp) before starting Python.") from err


def _temp_candidates() -> str:
    """The folders `tempfile` tries, in its documented order, for a message."""
    tried = [f"{os.environ[name]} (${name})" for name in ("TMPDIR", "TEMP", "TMP")
             if os.environ.get(name)]
    tried += ["/tmp", "/var/tmp", "/usr/tmp"]
    try:
        tried.append(f"{os.getcwd()} (the current folder)")
    except OSError:  # a current folder since removed: tempfile skips it too
        pass
    return ", ".join(tried)
