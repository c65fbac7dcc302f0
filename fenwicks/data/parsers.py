"""Parsers: a serialized `tf.train.Example` to ``(image, label)``, for `tfrecord_ds`."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence

import tensorflow as tf

from fenwicks._checks import positive_int

# The dtype `numpy_tfrecord` stored in the records `tfrecord_ds` is parsing: a parser
# traced for its pipeline (graph mode, where the record's value is not known yet) takes it
# from here when given no dtype.
_RECORDS_DTYPE: contextvars.ContextVar[tf.DType | None] = contextvars.ContextVar(
    "fenwicks_records_dtype", default=None)


def stored_dtype(path: str) -> tf.DType | None:
    """The dtype `numpy_tfrecord` stored in the first record of `path`, or None."""
    try:
        for raw in tf.data.TFRecordDataset(path).take(1):
            feature = tf.train.Example.FromString(raw.numpy()).features.feature.get("dtype")
            if feature is not None and feature.bytes_list.value:
                return tf.as_dtype(feature.bytes_list.value[0].decode())
    except (tf.errors.OpError, TypeError, ValueError):
        return None  # compressed, unreadable or not numpy_tfrecord's: the parser decides
    return None


@contextlib.contextmanager
def records_dtype(dtype: tf.DType | None) -> Iterator[None]:
    """Parsers traced inside read `dtype=None` as `dtype` (see `tfrecord_ds`)."""
    token = _RECORDS_DTYPE.set(dtype)
    try:
        yield
    finally:
        _RECORDS_DTYPE.reset(token)


def _dtype_to_read(features: dict[str, tf.Tensor], dtype: tf.DType | None) -> tf.DType:
    """The dtype asked for; else the one the record says (eagerly) or its pipeline's."""
    if dtype is not None:
        return tf.as_dtype(dtype)
    if tf.executing_eagerly():
        stored = tf.reshape(features["dtype"], [-1]).numpy()
        if len(stored) and stored[0]:
            return tf.as_dtype(stored[0].decode())
    return _RECORDS_DTYPE.get() or tf.uint8


def _check_size(h, w, c) -> tuple[int, int, int]:
    # NumPy integers (e.g. X.shape[1] of a memmap) come back as ints.
    return tuple(positive_int(name, value, why="pixels/channels")
                 for name, value in (("h", h), ("w", w), ("c", c)))


def _features(tfexample: tf.Tensor, numpy_meta: bool = False) -> dict[str, tf.Tensor]:
    spec = {"image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64)}
    if numpy_meta:  # written by numpy_tfrecord since it stores them; "" / [] in older records
        spec.update(dtype=tf.io.FixedLenFeature([], tf.string, default_value=""),
                    shape=tf.io.VarLenFeature(tf.int64))
    tfexample = tf.convert_to_tensor(tfexample)
    if tfexample.shape.rank == 1:  # a batch of records: one vectorised parse
        return tf.io.parse_example(tfexample, spec)
    return tf.io.parse_single_example(tfexample, spec)


def _wanted(h: int, w: int, c: int, dtype: tf.DType) -> str:
    return f"h, w, c = {h}, {w}, {c} and dtype=tf.{dtype.name}"


def _mismatch(stored_dtype: str, stored_shape: list[int], size: int, h: int, w: int, c: int,
              dtype: tf.DType) -> str | None:
    """Why a record does not fit, in words with what to pass; None if it fits."""
    if stored_dtype:  # the record says what it holds: name it exactly
        shape = tuple(stored_shape)
        if stored_dtype == dtype.name and shape in ((h, w, c), ()):
            return None
        hwc = shape if len(shape) == 3 else None
        advice = (f"h, w, c = {', '.join(map(str, hwc))} and " if hwc else "") + \
            f"dtype=tf.{stored_dtype}"
        return (f"the record holds {stored_dtype} values of shape {shape} (numpy_tfrecord "
                f"stored both), but the parser was asked for {_wanted(h, w, c, dtype)}; "
                f"pass {advice} to tfexample_numpy_image_parser")
    expected = h * w * c * dtype.size
    if size == expected:
        return None
    ratio = size / (h * w * c)
    guesses = {1: "uint8 or int8", 2: "float16, bfloat16 or int16", 4: "float32 or int32",
               8: "float64 or int64"}.get(ratio)
    guess = (f"{ratio:g}x {h}*{w}*{c} bytes: written as {guesses}? pass dtype=tf.float32 "
             "or the dtype of the array written" if guesses else
             f"not a multiple of {h}*{w}*{c}: check h, w, c")
    return (f"a record's image has {size} bytes, not h*w*c*{dtype.size} = {h}*{w}*{c}*"
            f"{dtype.size} = {expected} for {dtype.name} ({guess})")


def _check_eagerly(features: dict[str, tf.Tensor], h: int, w: int, c: int,
                   dtype: tf.DType) -> None:
    """Eagerly (as tfrecord_ds checks the first records) a mismatch is a ValueError that
    says what the record holds and what to pass."""
    raw = tf.reshape(features["image"], [-1]).numpy()
    if not len(raw):
        return
    stored = tf.reshape(features["dtype"], [-1]).numpy()[0].decode()
    shape = tf.sparse.to_dense(features["shape"]).numpy()
    shape = shape if shape.ndim == 1 else shape[0]  # a vector of records: the first one
    problem = _mismatch(stored, [int(v) for v in shape], len(raw[0]), h, w, c, dtype)
    if problem:
        raise ValueError(problem)


def tfexample_numpy_image_parser(tfexample: tf.Tensor, h: int, w: int, c: int = 3,
                                 dtype: tf.DType | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """Parses a record written by `numpy_tfrecord` into ``(image [h, w, c], label)``.

    Records written by `numpy_tfrecord` also hold their array's dtype and shape: a record
    that does not match ``h, w, c`` and ``dtype`` is an error that names what to pass
    (`tfrecord_ds` checks the first records before training). Older records without them
    are still read; a wrong size is reported with a guess at the dtype.

    Args:
        tfexample: one serialized `tf.train.Example`, or a vector of them (then the
            result is a batch; `tfrecord_ds` parses in chunks this way, ~5x faster).
        h: image height.
        w: image width.
        c: channels. Defaults to 3.
        dtype: dtype of the array that was written. Defaults to None: the dtype the
            record says it holds (`numpy_tfrecord` stores it; `tfrecord_ds` reads it from
            the first record), else `tf.uint8` (older records). Images stay as written
            (uint8 until augmentation: 4x less to read, shuffle and cache than float32).

    Returns:
        The image (``dtype``) and its int32 label.

    Raises:
        ValueError: eagerly, for a record of another dtype or shape (the message says
            which ``h, w, c`` and ``dtype=`` to pass).

    Examples:
        >>> fw.data.numpy_tfrecord('cifar/train', np.zeros((8, 32, 32, 3), 'uint8'),
        ...                        np.arange(8))
        ['cifar/train']
        >>> parser = lambda r: fw.data.tfexample_numpy_image_parser(r, 32, 32, 3)
        >>> ds = fw.data.tfrecord_ds('cifar/train*', parser, 4)
        >>> [x.shape for x in next(iter(ds))]
        [TensorShape([4, 32, 32, 3]), TensorShape([4])]
    """
    h, w, c = _check_size(h, w, c)
    features = _features(tfexample, numpy_meta=True)
    dtype = _dtype_to_read(features, dtype)
    if tf.executing_eagerly():
        _check_eagerly(features, h, w, c, dtype)
    # In the pipeline (graph mode) the checks are ops; the message cannot be formatted
    # from the data, so the data goes alongside it.
    stored = features["dtype"]
    tf.debugging.Assert(tf.reduce_all((stored == "") | (stored == dtype.name)), [
        f"records hold another dtype than the {dtype.name} asked for; pass dtype= as "
        "stored:", stored], summarize=3)
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

    Examples:
        >>> parser = lambda r: fw.data.tfexample_image_parser(r, 224, 224)
    """
    h, w, c = _check_size(h, w, c)
    features = _features(tfexample)
    image = tf.io.decode_image(features["image"], channels=c, expand_animations=False)
    image = tf.image.resize(image, [h, w], antialias=True)
    image = tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)
    return tf.ensure_shape(image, [h, w, c]), tf.cast(features["label"], tf.int32)


def get_tfexample_image_parser(tfms: Sequence[Callable[[tf.Tensor], tf.Tensor]] | None = None,
                               has_label: bool = True) -> Callable[[tf.Tensor], object]:
    """A parser for encoded-image records that decodes to float32 in ``[0, 1]`` and
    applies ``tfms`` in order: ``record -> (image, label)``, or ``image`` without labels.

    Reads what `files_tfrecord`, `class_folders_tfrecord`, `data_dir_label_csv_tfrecord`
    (``has_label=True``) and `data_dir_no_label_tfrecord` (``has_label=False``) write.
    The last transform should fix the size (``fw.transform.tfm_set_shape(h, w)`` or
    ``tfm_resize``): batches need one image size.

    Args:
        tfms: single-image transforms, e.g. ``fw.transform.get_fastai_transforms(...)``.
            Defaults to none.
        has_label: the records hold a ``label``. Defaults to True.

    Returns:
        The parser, for `tfrecord_ds`.

    Examples:
        >>> import os
        >>> for name, value in [('cat', 0), ('dog', 255)]:   # a black and a white image
        ...     os.makedirs(f'pets/{name}', exist_ok=True)
        ...     png = tf.io.encode_png(tf.fill([4, 4, 3], tf.constant(value, tf.uint8)))
        ...     _ = open(f'pets/{name}/1.png', 'wb').write(png.numpy())
        >>> _ = fw.data.class_folders_tfrecord('pets', 'pets.tfrec', shuffle=False)
        >>> tfms = [fw.transform.tfm_standard_scaler([0.5] * 3, [0.5] * 3),
        ...         fw.transform.tfm_set_shape(4, 4)]
        >>> parser = fw.data.get_tfexample_image_parser(tfms)
        >>> images, labels = next(iter(fw.data.tfrecord_ds('pets.tfrec', parser, 2,
        ...                                                training=False)))
        >>> images.shape, images[:, 0, 0, 0].numpy(), labels.numpy()
        (TensorShape([2, 4, 4, 3]), array([-1.,  1.], dtype=float32), array([0, 1], dtype=int32))
    """
    tfms = list(tfms or [])
    for i, tfm in enumerate(tfms):
        if not callable(tfm):
            raise ValueError(f"tfms[{i}]={tfm!r} is not a function image -> image")
    spec = {"image": tf.io.FixedLenFeature([], tf.string)}
    if has_label:
        spec["label"] = tf.io.FixedLenFeature([], tf.int64)

    def parse(tfexample: tf.Tensor) -> object:
        features = tf.io.parse_single_example(tfexample, spec)
        image = tf.io.decode_image(features["image"], channels=3, expand_animations=False)
        image = tf.image.convert_image_dtype(image, tf.float32)  # uint8 -> [0, 1]
        for tfm in tfms:
            image = tfm(image)
        return (image, tf.cast(features["label"], tf.int32)) if has_label else image

    return parse
