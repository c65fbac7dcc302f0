"""Pretrained Keras applications (ResNet50, MobileNetV2, ...) as the base of a model.

`get_model` says how to build the application and what input it expects::

    base_model = fw.keras_models.get_model('MobileNetV2')
    tfms = fw.transform.get_fastai_transforms(base_model.img_size, base_model.img_size,
                                              training=True,
                                              normalizer=base_model.normalizer)

    def build_nn():
        base = base_model.model_func()      # ImageNet weights, downloaded once by Keras
        base.trainable = False              # frozen; leave it True to fine-tune
        model = fw.Sequential([base, keras.layers.GlobalAveragePooling2D(),
                               fw.layers.Classifier(n_classes)])
        return model

`model_func` is called inside ``build_nn``, so every fresh model (a new estimator, or a
k-fold loop that empties the work_dir) starts from the pretrained weights again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import keras

from fenwicks import transform

__all__ = ["KerasModel", "MODELS", "get_model"]


class KerasModel(NamedTuple):
    """A pretrained base: ``model_func()`` builds it; the original Fenwicks's
    ``weight_dir`` and ``weight_vars`` are None (the weights come with ``model_func``),
    so passing them on to `get_tpu_estimator` changes nothing."""

    model_func: Callable[[], keras.Model]
    weight_dir: str | None
    weight_vars: list[str] | None
    img_size: int
    normalizer: Callable[[Any], Any]


def _scale_255(x: Any) -> Any:
    """``[0, 1]`` -> ``[0, 255]``: EfficientNet and ConvNeXt rescale inside the model."""
    return x * 255.0


_TF, _CAFFE, _TORCH = (transform.imagenet_normalize_tf, transform.imagenet_normalize_caffe,
                       transform.imagenet_normalize_pytorch)

# name -> (keras.applications attribute, native image size, input normalisation)
MODELS: dict[str, tuple[str, int, Callable[[Any], Any]]] = {
    "VGG16": ("VGG16", 224, _CAFFE), "VGG19": ("VGG19", 224, _CAFFE),
    "ResNet50": ("ResNet50", 224, _CAFFE), "ResNet101": ("ResNet101", 224, _CAFFE),
    "ResNet152": ("ResNet152", 224, _CAFFE),
    "ResNet50V2": ("ResNet50V2", 224, _TF), "ResNet101V2": ("ResNet101V2", 224, _TF),
    "ResNet152V2": ("ResNet152V2", 224, _TF),
    "InceptionV3": ("InceptionV3", 299, _TF),
    "InceptionResNetV2": ("InceptionResNetV2", 299, _TF),
    "Xception": ("Xception", 299, _TF),
    "MobileNet": ("MobileNet", 224, _TF), "MobileNetV2": ("MobileNetV2", 224, _TF),
    "NASNetLarge": ("NASNetLarge", 331, _TF), "NASNetMobile": ("NASNetMobile", 224, _TF),
    "DenseNet121": ("DenseNet121", 224, _TORCH), "DenseNet169": ("DenseNet169", 224, _TORCH),
    "DenseNet201": ("DenseNet201", 224, _TORCH),
    "EfficientNetB0": ("EfficientNetB0", 224, _scale_255),
    "EfficientNetV2B0": ("EfficientNetV2B0", 224, _scale_255),
}


def get_model(model_name: str, root_dir: str | None = None, model_dir: str | None = None,
              include_top: bool = False, pooling: str | None = None,
              overwrite: bool = False, *, weights: str | None = "imagenet",
              input_shape: tuple[int, int, int] | None = None,
              **app_kwargs: Any) -> KerasModel:
    """A pretrained Keras application as a `KerasModel` (builder, image size, normaliser).

    Args:
        model_name: a key of `MODELS`, e.g. ``'ResNet50'``, ``'MobileNetV2'``.
        root_dir: the original's bucket argument; unused (Keras caches the weights in
            ``~/.keras/models``).
        model_dir: unused, as ``root_dir``.
        include_top: keep the ImageNet classifier. Defaults to False.
        pooling: None (a feature map), ``'avg'`` or ``'max'``. Defaults to None.
        overwrite: unused.
        weights: ``'imagenet'`` (downloaded by Keras on first use, e.g. on Colab), a
            path to a weights file, or None (random). Defaults to ``'imagenet'``.
        input_shape: ``(h, w, 3)``. Defaults to the native size, square.
        **app_kwargs: more arguments for the application (e.g. ``alpha=0.35``).

    Returns:
        `KerasModel` ``(model_func, weight_dir=None, weight_vars=None, img_size,
        normalizer)``; ``img_size`` is ``input_shape[0]``.

    Raises:
        ValueError: an unknown ``model_name`` (the known ones are listed).

    Examples:
        >>> base_model = fw.keras_models.get_model('ResNet50')
        >>> base = base_model.model_func()
    """
    del root_dir, model_dir, overwrite  # the original's weight-checkpoint places
    if model_name not in MODELS:
        raise ValueError(f"model_name={model_name!r} is not known; use one of "
                         f"{sorted(MODELS)}")
    attribute, size, normalizer = MODELS[model_name]
    input_shape = tuple(int(v) for v in input_shape) if input_shape else (size, size, 3)
    model_func = functools.partial(getattr(keras.applications, attribute),
                                   include_top=include_top, weights=weights,
                                   input_shape=input_shape, pooling=pooling, **app_kwargs)
    return KerasModel(model_func, None, None, input_shape[0], normalizer)
