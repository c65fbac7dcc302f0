"""Parsers: a serialized `tf.train.Example` to ``(image, label)``, for `tfrecord_ds`."""

from __future__ import annotations

import tensorflow as tf


def _check_size(h, w, c) -> None:
    for name, value in (("h", h), ("w", w), ("c", c)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer (pixels/channels)")


def _features(tfexample: tf.Tensor) -> dict[str, tf.Tensor]:
    spec = {"image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64)}
    tfexample = tf.convert_to_tensor(tfexample)
    if tfexample.shape.rank == 1:  # a batch of records: one vectorised parse
        return tf.io.parse_example(tfexample, spec)
    return tf.io.parse_single_example(tfexample, spec)


def tfexample_numpy_image_parser(tfexample: tf.Tensor, h: int, w: int, c: int = 3,
                                 dtype: tf.DType = tf.uint8) -> tuple[tf.Tensor, tf.Tensor]:
    """Parses a record written by `numpy_tfrecord` into ``(image [h, w, c], label)``.

    Args:
        tfexample: one serialized `tf.train.Example`, or a vector of them (then the
            result is a batch; `tfrecord_ds` parses in chunks this way, ~5x faster).
        h: image height.
        w: image width.
        c: channels. Defaults to 3.
        dtype: dtype of the array that was written. Defaults to `tf.uint8` (images stay
            uint8 until augmentation: 4x less to read, shuffle and cache than float32).

    Returns:
        The image (``dtype``) and its int32 label.

    Example:
        >>> parser = lambda r: fw.data.tfexample_numpy_image_parser(r, 32, 32, 3)
        >>> ds = fw.data.tfrecord_ds('/tmp/cifar/train*', parser, 128)
    """
    _check_size(h, w, c)
    features = _features(tfexample)
    image = tf.io.decode_raw(features["image"], dtype)
    tf.debugging.assert_equal(tf.shape(image)[-1], h * w * c, message=(
        f"a record's image does not have h*w*c = {h}*{w}*{c} values of {dtype.name}"))
    image = tf.reshape(image, tf.concat([tf.shape(image)[:-1], [h, w, c]], 0))
    image = tf.ensure_shape(image, image.shape[:-3].concatenate([h, w, c]))
    return image, tf.cast(features["label"], tf.int32)


def tfexample_image_parser(tfexample: tf.Tensor, h: int, w: int,
                           c: int = 3) -> tuple[tf.Tensor, tf.Tensor]:
    """Parses a record written by `files_tfrecord`: decodes JPEG/PNG/GIF/BMP, resizes.

    Args:
        tfexample: one serialized `tf.train.Example`.
        h: output height.
        w: output width (the image is resized to ``h`` x ``w``, aspect not kept).
        c: channels to decode to (1 = grey, 3 = RGB). Defaults to 3.

    Returns:
        The uint8 image ``[h, w, c]`` (rounded back from bilinear resizing so caches stay
        small) and its int32 label.

    Example:
        >>> parser = lambda r: fw.data.tfexample_image_parser(r, 224, 224)
    """
    _check_size(h, w, c)
    features = _features(tfexample)
    image = tf.io.decode_image(features["image"], channels=c, expand_animations=False)
    image = tf.image.resize(image, [h, w], antialias=True)
    image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
    return tf.ensure_shape(image, [h, w, c]), tf.cast(features["label"], tf.int32)
