"""Fenwicks: train TensorFlow models on a TPU, GPUs or the CPU with the same code.

    import fenwicks as fw
    fw.info()

Importing Fenwicks imports TensorFlow and Keras but probes no device, opens no
connection and imports nothing of Colab or Kaggle: detection runs on first use.
"""

import importlib

from fenwicks import _deadline, _tf_check

_tf_check.require_tensorflow()
# TensorFlow reads its GCS retry and timeout settings once, when it is imported.
_deadline.configure_tensorflow()

from fenwicks import (  # noqa: E402  (after the TensorFlow check, on purpose)
    accel,
    colab_utils,
    data,
    gcs,
    io,
    layers,
    models,
    plt,
    train,
    transform,
)
from fenwicks.layers import Sequential  # noqa: E402
from fenwicks.report import info  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Sequential",
    "__version__",
    "accel",
    "bench",
    "colab_utils",
    "data",
    "gcs",
    "info",
    "io",
    "layers",
    "models",
    "plt",
    "train",
    "transform",
]

# PEP 562: `import fenwicks` leaves these out (a benchmark is no part of training);
# `fw.bench` imports it on first use.
_ON_FIRST_USE = ("bench",)


def __getattr__(name: str) -> object:
    if name in _ON_FIRST_USE:
        return importlib.import_module(f"fenwicks.{name}")  # also binds fenwicks.<name>
    raise AttributeError(f"module 'fenwicks' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_ON_FIRST_USE})
