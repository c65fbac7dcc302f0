"""fw.keras_models: a Keras application as a pretrained base, built offline."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import fenwicks as fw

SMALL = dict(input_shape=(32, 32, 3), alpha=0.35)  # the narrowest MobileNetV2


def test_get_model_builds_a_headless_base_with_the_native_defaults():
    base_model = fw.keras_models.get_model("ResNet50", "gs://unused-bucket", weights=None)
    assert base_model.img_size == 224 and base_model.weight_dir is None
    assert base_model.weight_vars is None
    assert base_model.normalizer is fw.transform.imagenet_normalize_caffe
    inception = fw.keras_models.get_model("InceptionV3", weights=None)
    assert inception.img_size == 299
    assert inception.normalizer is fw.transform.imagenet_normalize_tf
    with pytest.raises(ValueError, match="'MobileNetV2'"):
        fw.keras_models.get_model("MobileNetV9")


def test_model_func_builds_a_frozen_or_trainable_base():
    base_model = fw.keras_models.get_model("MobileNetV2", weights=None, **SMALL)
    assert base_model.img_size == 32
    base = base_model.model_func()
    assert base.output_shape == (None, 1, 1, 1280) and base.trainable_weights
    base.trainable = False
    model = fw.Sequential([base, keras.layers.Flatten(), fw.layers.Classifier(3)])
    assert model(np.zeros((2, 32, 32, 3), np.float32)).shape == (2, 3)
    assert len(model.trainable_weights) == 1  # only the head's kernel


@pytest.mark.slow  # ~5 s on a loaded machine: two MobileNetV2 builds
def test_imagenet_weights_come_through_keras_get_file(tmp_path, monkeypatch):
    # Stand-in for the download on Colab: a weights file saved here, served by a
    # stand-in for keras' get_file (what keras.applications calls for weights='imagenet').
    reference = keras.applications.MobileNetV2(include_top=False, weights=None, **SMALL)
    weights_file = str(tmp_path / "mobilenet_v2.weights.h5")
    reference.save_weights(weights_file)
    requested = []

    def fake_get_file(fname=None, origin=None, **kwargs):
        requested.append((fname, origin))
        return weights_file

    from keras.src.applications import mobilenet_v2

    monkeypatch.setattr(mobilenet_v2.file_utils, "get_file", fake_get_file)
    base = fw.keras_models.get_model("MobileNetV2", **SMALL).model_func()
    assert requested and "mobilenet_v2" in requested[0][0] and "imagenet" not in str(base)
    for ours, theirs in zip(base.weights, reference.weights, strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
