"""Fenwicks: train Keras models on a TPU, GPUs or the CPU with the same code.

    import fenwicks as fw
    fw.info()

Importing Fenwicks chooses the engine Keras runs on (TensorFlow or JAX: `fw.accel.engine`,
from environment variables and installed packages only), then imports TensorFlow and
Keras, but probes no device, opens no connection and imports nothing of Colab or Kaggle:
detection runs on first use.
"""

import importlib

from fenwicks import _quiet

# `python -m fenwicks` (not a library user's import): before TensorFlow is loaded.
_quiet.quiet_command_line()

from fenwicks import _deadline, _tf_check, accel  # noqa: E402

_tf_check.require_temp_dir()  # before TensorFlow's import fails on it, naming nothing
# Before Keras is imported: Keras fixes its backend then.
accel.setup_engine()
_tf_check.require_tensorflow()
# TensorFlow reads its GCS retry and timeout settings once, when it is imported.
_deadline.configure_tensorflow()
accel.import_keras()

from fenwicks import (  # noqa: E402  (after the TensorFlow check, on purpose)
    anim,
    colab_utils,
    data,
    gcs,
    image,
    io,
    keras_models,
    layers,
    models,
    plt,
    train,
    transform,
)
from fenwicks._removed import removed_error  # noqa: E402
from fenwicks.layers import Sequential  # noqa: E402
from fenwicks.report import info  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Sequential",
    "__version__",
    "accel",
    "anim",
    "bench",
    "colab_utils",
    "data",
    "gcs",
    "image",
    "info",
    "io",
    "keras_models",
    "layers",
    "models",
    "plt",
    "train",
    "transform",
]

# PEP 562: `import fenwicks` leaves these out (a benchmark is no part of training);
# `fw.bench` imports it on first use.
_ON_FIRST_USE = ("bench",)


# Modules of the original Fenwicks (2019) that have no place here: what to use instead.
_REMOVED = {
    "datasets": "keras.utils.get_file(fname, origin, extract=True) instead of "
                "fw.datasets.untar_data, the Kaggle CLI ('!kaggle competitions download -c "
                "cifar-10') instead of fw.datasets.URLs, or tensorflow-datasets via "
                "fw.data.tfds_ds",
    "vision": "fw.image, fw.transform and fw.keras_models",
    "core": "fw.transform.compose for sequential transforms",
    "audio": "nothing in Fenwicks (speech support was dropped); tf.signal.stft",
    "tokenizer": "nothing in Fenwicks (NLP support was dropped); keras_hub",
    "text": "nothing in Fenwicks (NLP support was dropped); keras_hub",
    "bert": "nothing in Fenwicks (NLP support was dropped); keras_hub.models.BertClassifier",
    "android": "nothing in Fenwicks; export with est.export_saved_model and convert with "
               "tf.lite.TFLiteConverter",
    "pytorch_keras": "nothing in Fenwicks (model conversion was dropped)",
}


def __getattr__(name: str) -> object:
    if name in _ON_FIRST_USE:
        return importlib.import_module(f"fenwicks.{name}")  # also binds fenwicks.<name>
    raise removed_error("fenwicks", name, _REMOVED)


def __dir__() -> list[str]:
    return sorted({*globals(), *_ON_FIRST_USE})
