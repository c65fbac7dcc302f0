"""A clear message when no TensorFlow is installed (it is an extra, not a dependency)."""

import importlib.util

MIN_VERSION = (2, 16)

_INSTALL_HINT = (
    "Fenwicks needs TensorFlow >= 2.16 (Keras 3) and does not install it itself, so that it "
    "never replaces the TensorFlow your machine ships (Colab: tensorflow, TPU VM: "
    "tensorflow-tpu). On a machine without one: pip install 'fenwicks[cpu]' (CPU only), "
    "'fenwicks[gpu]' (NVIDIA GPUs) or 'fenwicks[tensorflow]'."
)


def require_tensorflow() -> None:
    """Raises ImportError with install advice if TensorFlow is absent or too old."""
    if importlib.util.find_spec("tensorflow") is None:
        raise ImportError(_INSTALL_HINT)
    from importlib import metadata

    for dist in ("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-nightly",
                 "tensorflow-macos", "tensorflow-intel"):
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        numbers = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
        if numbers < MIN_VERSION:
            raise ImportError(f"{dist} {version} is installed. {_INSTALL_HINT}")
        return
