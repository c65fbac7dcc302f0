"""fw.transform: geometry of each augmentation, and the per-example and batched forms
drawing from the same distributions (checked statistically on a few thousand draws)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

import fenwicks as fw

N = 2000  # draws per form: enough for a chi-square test, a second of CPU
H, W = 6, 5


def _coded_images(n: int) -> np.ndarray:
    """Images whose pixels are all distinct and non-zero, so a crop reveals its offset."""
    one = (np.arange(H * W, dtype=np.float32) + 1).reshape(H, W, 1)
    return np.repeat(one[None], n, axis=0)


def _both_forms(fn, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per-example via Dataset.map, batched in one call) outputs of ``fn``."""
    per_example = tf.data.Dataset.from_tensor_slices(images).map(fn).batch(len(images))
    return next(iter(per_example)).numpy(), fn(tf.constant(images)).numpy()


def _offset(out: np.ndarray, padded: np.ndarray) -> tuple[int, int]:
    """The offset at which ``out`` is a window of ``padded``, found by exhaustive search."""
    for dy in range(padded.shape[0] - H + 1):
        for dx in range(padded.shape[1] - W + 1):
            if np.array_equal(padded[dy:dy + H, dx:dx + W], out):
                return dy, dx
    raise AssertionError("output is not a window of the padded image")


def _same_distribution(a, b, categories) -> float:
    table = np.array([[np.sum(a == c) for c in categories], [np.sum(b == c) for c in categories]])
    return stats.chi2_contingency(table[:, table.sum(0) > 0])[1]


def test_random_pad_crop_is_a_window_of_the_padded_image_at_uniform_offsets():
    pad = 2
    images = _coded_images(N)
    padded = np.pad(images[0], [(pad, pad), (pad, pad), (0, 0)])
    forms = _both_forms(lambda x: fw.transform.random_pad_crop(x, pad), images)
    codes = []
    for out in forms:
        offsets = np.array([_offset(o, padded) for o in out[:600]])
        assert offsets.min() >= 0 and offsets.max() <= 2 * pad  # inside the padding bounds
        code = offsets[:, 0] * (2 * pad + 1) + offsets[:, 1]
        counts = np.bincount(code, minlength=(2 * pad + 1) ** 2)
        assert stats.chisquare(counts).pvalue > 1e-3  # uniform over the 25 positions
        codes.append(code)
    assert _same_distribution(*codes, range((2 * pad + 1) ** 2)) > 1e-3


@pytest.mark.parametrize("mode", ["REFLECT", "SYMMETRIC"])
def test_random_pad_crop_other_padding_modes(mode):
    images = _coded_images(200)
    padded = np.pad(images[0], [(2, 2), (2, 2), (0, 0)], mode=mode.lower())
    for out in _both_forms(lambda x: fw.transform.random_pad_crop(x, 2, mode=mode), images):
        offsets = np.array([_offset(o, padded) for o in out])
        assert len(np.unique(offsets, axis=0)) > 15  # of 25 positions, in 200 draws


def test_random_flip_is_a_mirror_half_the_time_in_both_forms():
    images = _coded_images(N)
    flipped_fractions = []
    for out in _both_forms(fw.transform.random_flip, images):
        same = np.all(out == images, axis=(1, 2, 3))
        mirrored = np.all(out == images[:, :, ::-1], axis=(1, 2, 3))
        assert np.all(same ^ mirrored)  # each image is itself or its left-right mirror
        flipped_fractions.append(mirrored.mean())
    # Binomial(2000, 1/2): standard deviation 0.011; 4.5 sigma bounds.
    assert all(abs(f - 0.5) < 0.05 for f in flipped_fractions)


def _expected_cutout_extent(size: int, box: int) -> float:
    """Mean covered length on one axis: centre uniform on [0, size), box clipped at edges."""
    starts = np.arange(size) - box // 2
    return float(np.mean(np.minimum(starts + box, size) - np.maximum(starts, 0)))


def test_cutout_blanks_one_clipped_rectangle_of_the_right_area():
    h, w = 3, 2
    images = np.ones((N, H, W, 1), np.float32)
    heights = []
    for out in _both_forms(lambda x: fw.transform.cutout(x, h, w), images):
        zero = out[..., 0] == 0
        rows, cols = zero.any(axis=2), zero.any(axis=1)
        # The zeros form exactly the rectangle rows x cols, of at most h x w.
        assert np.array_equal(zero, rows[:, :, None] & cols[:, None, :])
        assert rows.sum(1).max() == h and cols.sum(1).max() == w
        expected_area = _expected_cutout_extent(H, h) * _expected_cutout_extent(W, w)
        assert zero.sum((1, 2)).mean() == pytest.approx(expected_area, rel=0.06)
        heights.append(rows.sum(1))
    assert _same_distribution(*heights, range(h + 1)) > 1e-3


@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
def test_random_crop_resize_identity_box_and_same_distributions():
    ramp = np.broadcast_to(np.arange(H, dtype=np.float32)[:, None, None], (H, H, 1))
    # scale 1 and ratio 1 on a square image: the crop is the whole image, resized to itself.
    whole = fw.transform.random_crop_resize(ramp, H, scale=(1.0, 1.0), ratio=(1.0, 1.0))
    np.testing.assert_allclose(whole.numpy(), ramp, atol=1e-4)
    images = np.repeat(ramp[None], N, axis=0)
    outs = _both_forms(lambda x: fw.transform.random_crop_resize(x, 4, scale=(0.2, 1.0)), images)
    for out in outs:
        assert out.shape == (N, 4, 4, 1)
        assert out.min() >= 0 and out.max() <= H - 1  # samples stay inside the image
    # The vertical extent of each crop shows in the ramp's range: compare the two forms.
    spans = [o.max(axis=(1, 2, 3)) - o.min(axis=(1, 2, 3)) for o in outs]
    assert stats.ks_2samp(*spans).pvalue > 1e-3
    assert spans[0].std() > 0.5  # crops really vary in size


def test_standard_scaler_and_its_reverse():
    x = np.array([[[0, 128, 255]]], np.uint8)
    mean, std = np.array([1.0, 2.0, 3.0]), np.array([2.0, 4.0, 5.0])
    scaled = fw.transform.standard_scaler(x, mean, std).numpy()
    np.testing.assert_allclose(scaled, (x - mean) / std, rtol=1e-6)
    back = fw.transform.tfm_reverse_standard_scaler(mean, std)(scaled).numpy()
    np.testing.assert_allclose(back, x, atol=1e-4)
    assert fw.transform.tfm_standard_scaler(mean, std)(x).dtype == tf.float32


def test_seeded_scope_is_reproducible_and_seed_dependent():
    images = tf.constant(_coded_images(64))
    augment = fw.transform.compose(fw.transform.tfm_pad_crop(2), fw.transform.random_flip,
                                   fw.transform.tfm_cutout(2, 2))

    def run(seed):
        with fw.transform.seeded(tf.constant([seed, 0], tf.int64)):
            return augment(images).numpy()

    np.testing.assert_array_equal(run(1), run(1))
    assert not np.array_equal(run(1), run(2))


@pytest.mark.parametrize("call, match", [
    (lambda: fw.transform.random_flip(tf.zeros([4, 4])), "rank 2"),
    (lambda: fw.transform.random_pad_crop(tf.zeros([4, 4, 1]), -1), "pad=-1"),
    (lambda: fw.transform.cutout(tf.zeros([4, 4, 1]), 2.5, 2), "h=2.5"),
    (lambda: fw.transform.random_crop_resize(tf.zeros([4, 4, 1]), 2, scale=(0.5, 2)),
     "scale="),
])
def test_bad_arguments_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------- single-image (original-style) tfms


def _radial(size: int = 9) -> tf.Tensor:
    """An image whose value is the distance from the centre: rotations keep it."""
    r = np.arange(size) - (size - 1) / 2
    dist = np.sqrt(r[:, None] ** 2 + r[None, :] ** 2) / 10
    return tf.constant(np.repeat(dist[..., None], 3, axis=2), tf.float32)


def test_random_rotate_zoom_rotates_about_the_centre_and_zooms_in():
    x = _radial()
    centre = (4, 4)
    for _ in range(5):
        rotated = fw.transform.random_rotate_zoom(x, max_rotate=45, max_zoom=1.0, p=1.0)
        # Rotation keeps the distance from the centre (bilinear error grows with it).
        np.testing.assert_allclose(rotated.numpy()[2:7, 2:7], x.numpy()[2:7, 2:7], atol=0.02)
    zoomed = fw.transform.random_rotate_zoom(x, max_rotate=0, max_zoom=2.0, p=1.0)
    zoomed, plain = zoomed.numpy()[..., 0], x.numpy()[..., 0]
    assert zoomed[centre] == pytest.approx(0.0, abs=1e-6)
    # Zooming in by z samples radius r / z: every ring moves inwards, none outwards.
    assert np.all(zoomed[4, 5:] <= plain[4, 5:] + 1e-6) and zoomed[4, 8] < plain[4, 8]
    same = fw.transform.random_rotate_zoom(x, max_rotate=30, max_zoom=1.5, p=0.0)
    np.testing.assert_allclose(same.numpy(), x.numpy(), atol=1e-6)  # p=0: unchanged


def test_random_lighting_changes_brightness_and_contrast_within_range():
    x = tf.random.stateless_uniform([8, 8, 3], [1, 2], 0.3, 0.7)
    means = [float(tf.reduce_mean(fw.transform.random_lighting(x, 0.2, p=1.0)))
             for _ in range(40)]
    # Brightness moves the mean by at most +-0.1 (contrast keeps it, no clipping here).
    assert max(abs(m - float(tf.reduce_mean(x))) for m in means) <= 0.1 + 1e-5
    assert np.std(means) > 0.01
    np.testing.assert_allclose(fw.transform.random_lighting(x, 0.2, p=0.0), x, atol=1e-6)


def test_tfm_random_flip_with_flip_vert_reaches_all_eight_symmetries():
    x = tf.reshape(tf.range(9, dtype=tf.float32), [3, 3, 1])
    seen = {tuple(fw.transform.tfm_random_flip(flip_vert=True)(x).numpy().ravel())
            for _ in range(200)}
    assert len(seen) == 8
    flips = {tuple(fw.transform.tfm_random_flip()(x).numpy().ravel()) for _ in range(40)}
    assert flips == {tuple(range(9)), (2, 1, 0, 5, 4, 3, 8, 7, 6)}


def test_tfm_set_shape_declares_and_checks_the_shape():
    spec = tf.TensorSpec([None, None, 3], tf.float32)
    traced = tf.function(fw.transform.tfm_set_shape(4, 5)).get_concrete_function(spec)
    assert traced.output_shapes == tf.TensorShape([4, 5, 3])
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)):
        fw.transform.tfm_set_shape(4, 5)(tf.zeros([4, 6, 3]))
    with pytest.raises(ValueError, match="h=0"):
        fw.transform.tfm_set_shape(0, 5)


def test_imagenet_normalizers_match_keras_preprocessing():
    import keras

    x = np.random.default_rng(0).uniform(0, 1, (2, 4, 4, 3)).astype(np.float32)
    for ours, family in [(fw.transform.imagenet_normalize_tf, "mobilenet_v2"),
                         (fw.transform.imagenet_normalize_caffe, "resnet50"),
                         (fw.transform.imagenet_normalize_pytorch, "densenet")]:
        module = getattr(keras.applications, family)
        expected = module.preprocess_input(x * 255.0)
        np.testing.assert_allclose(ours(x).numpy(), expected, rtol=1e-4, atol=1e-3)


def test_get_fastai_transforms_training_and_evaluation():
    x = tf.random.stateless_uniform([12, 10, 3], [3, 4])
    train = fw.transform.get_fastai_transforms(8, 8, training=True)
    evaluate = fw.transform.get_fastai_transforms(8, 8, training=False,
                                                  normalizer=lambda im: im)
    out = x
    for tfm in train:
        out = tfm(out)
    assert out.shape == (8, 8, 3) and -1 <= float(tf.reduce_min(out))
    assert float(tf.reduce_max(out)) <= 1  # imagenet_normalize_tf: [-1, 1]
    plain = x
    for tfm in evaluate:
        plain = tfm(plain)
    np.testing.assert_allclose(plain, tf.image.resize(x, [8, 8]), atol=1e-6)
    assert len(train) > len(evaluate)
