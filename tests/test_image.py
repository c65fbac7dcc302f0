"""fw.image: grey to RGB, fixing non-RGB files, dataset mean and standard deviation."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import fenwicks as fw


def test_gray2rgb_repeats_the_channel():
    x = np.arange(12, dtype=np.float32).reshape(2, 2, 3, 1)
    rgb = fw.image.gray2rgb(x)
    assert rgb.shape == (2, 2, 3, 3)
    for channel in range(3):
        np.testing.assert_array_equal(rgb[..., channel], x[..., 0])
    np.testing.assert_allclose(fw.image.gray2rgb(x, normalize=True)[..., 1], x[..., 0] / 11)
    with pytest.raises(ValueError, match="one channel"):
        fw.image.gray2rgb(np.zeros((4, 4, 3)))


def test_check_rgb_finds_and_fixes_non_rgb_images(tmp_path):
    Image.new("RGB", (4, 4), (1, 2, 3)).save(tmp_path / "a.png")
    Image.new("L", (4, 4), 9).save(tmp_path / "b.png")
    Image.new("RGBA", (4, 4), (1, 2, 3, 4)).save(tmp_path / "c.png")
    Image.new("L", (4, 4), 9).save(tmp_path / "d.jpg")  # another extension: not looked at
    found = fw.image.check_rgb(str(tmp_path), file_ext="png", fix=False)
    assert found == [str(tmp_path / "b.png"), str(tmp_path / "c.png")]
    assert Image.open(tmp_path / "b.png").mode == "L"  # fix=False changes nothing
    assert fw.image.check_rgb(str(tmp_path), file_ext="png") == found
    assert Image.open(tmp_path / "b.png").mode == "RGB"
    assert np.asarray(Image.open(tmp_path / "b.png"))[0, 0].tolist() == [9, 9, 9]
    assert fw.image.check_rgb(str(tmp_path), file_ext="png") == []


def test_compute_mean_std_matches_numpy(tmp_path):
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (5, 4, 3), dtype=np.uint8) for _ in range(6)]
    paths = []
    for i, pixels in enumerate(images):
        paths.append(str(tmp_path / f"{i}.png"))
        tf.io.write_file(paths[-1], tf.io.encode_png(pixels))
    fn = str(tmp_path / "all.tfrec")
    fw.data.files_tfrecord(fn, paths, [0] * 6)
    mean, std, h, w = fw.image.compute_mean_std(fn, 6, batch_size=100)
    pixels = np.stack(images).astype(np.float64) / 255.0  # decoded as float32: rtol 1e-6
    np.testing.assert_allclose(mean, pixels.mean(axis=(0, 1, 2)), rtol=1e-6)
    np.testing.assert_allclose(std, pixels.std(axis=(0, 1, 2), ddof=1), rtol=1e-6)
    assert (h, w) == (5, 4)
    first_two, _, _, _ = fw.image.compute_mean_std(fn, 2)
    np.testing.assert_allclose(first_two, pixels[:2].mean(axis=(0, 1, 2)), rtol=1e-6)
