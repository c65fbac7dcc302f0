"""Image augmentations with per-example randomness, per example or vectorised over a batch.

Every random transform accepts either one image ``[H, W, C]`` (use it in
``dataset.map`` before batching) or a batch ``[B, H, W, C]`` (use it in a map after
``batch``). The two forms are separate code, each fast for its use, and draw from the
same distributions (the tests check it statistically); the batch form costs a handful
of ops per batch instead of per image, which is what lets a two-core Colab host keep up
with a TPU::

    def augment(x):
        x = fw.transform.random_pad_crop(x, 4)
        x = fw.transform.random_flip(x)
        return fw.transform.cutout(x, 8, 8)

    ds = fw.data.tfrecord_ds(pattern, parser, 512, batch_transform=augment)

Randomness is stateful (``tf.random``) by default. Inside `seeded` (the input pipelines
enter it when given a ``seed``) every draw is a stateless function of a per-element seed,
so a parallel ``map`` still gives the same numbers on every run.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from fenwicks._removed import removed_error

__all__ = [
    "compose",
    "cutout",
    "get_fastai_transforms",
    "imagenet_normalize_caffe",
    "imagenet_normalize_pytorch",
    "imagenet_normalize_tf",
    "random_lighting",
    "random_rotate_90",
    "random_rotate_zoom",
    "random_crop_resize",
    "random_flip",
    "random_pad_crop",
    "reverse_standard_scaler",
    "seeded",
    "standard_scaler",
    "tfm_cutout",
    "tfm_pad_crop",
    "tfm_random_flip",
    "tfm_resize",
    "tfm_reverse_standard_scaler",
    "tfm_set_shape",
    "tfm_standard_scaler",
]

_state = threading.local()  # trace-time only: the seed scope of the function being traced


@contextlib.contextmanager
def seeded(seed: tf.Tensor) -> Iterator[None]:
    """Makes the transforms traced inside draw stateless numbers from ``seed``.

    Args:
        seed: an int64 (or int32) tensor of shape ``[2]``, different for each element.

    Examples:
        >>> def fn(i, x):
        ...     with fw.transform.seeded(tf.stack([i, 42])):
        ...         return fw.transform.random_flip(x)
        >>> ds = tf.data.Dataset.from_tensor_slices(tf.zeros([4, 8, 8, 3]))
        >>> ds = ds.enumerate().map(fn, num_parallel_calls=tf.data.AUTOTUNE)
        >>> [x.shape for x in ds.take(1)]
        [TensorShape([8, 8, 3])]
    """
    outer = getattr(_state, "scope", None)
    # The counter gives every draw in the traced function its own stream: tracing
    # visits draws in the same order every time, so the mapping is stable.
    _state.scope = [tf.cast(seed, tf.int64), 0]
    try:
        yield
    finally:
        _state.scope = outer


def _uniform(shape: Sequence, minval, maxval, dtype=tf.float32) -> tf.Tensor:
    scope = getattr(_state, "scope", None)
    if scope is None:
        return tf.random.uniform(shape, minval, maxval, dtype=dtype)
    scope[1] += 1
    seed = scope[0] + tf.constant([0, 1_000_003], tf.int64) * scope[1]
    return tf.random.stateless_uniform(shape, seed, minval, maxval, dtype=dtype)


def _image_or_batch(x: tf.Tensor) -> tf.Tensor:
    x = tf.convert_to_tensor(x)
    if x.shape.rank not in (3, 4):
        raise ValueError(f"x has shape {x.shape} (rank {x.shape.rank}); augmentations take "
                         "one image [H, W, C] or a batch [B, H, W, C]")
    return x


def _non_negative_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name}={value!r} must be a non-negative integer (pixels)")
    return int(value)


def random_pad_crop(x: tf.Tensor, pad: int, mode: str = "CONSTANT") -> tf.Tensor:
    """Pads by ``pad`` pixels on each side and crops back to the input size at random.

    Each image gets its own offset, uniform over the ``(2 * pad + 1) ** 2`` positions.

    Args:
        x: an image ``[H, W, C]`` or a batch ``[B, H, W, C]``.
        pad: pixels of padding on each side.
        mode: ``'CONSTANT'`` (zeros), ``'REFLECT'`` or ``'SYMMETRIC'``, as in `tf.pad`.
            Defaults to ``'CONSTANT'``.

    Returns:
        A tensor of the shape and dtype of ``x``.

    Examples:
        >>> fw.transform.random_pad_crop(tf.zeros([32, 32, 3]), 4).shape
        TensorShape([32, 32, 3])
    """
    pad = _non_negative_int("pad", pad)
    x = _image_or_batch(x)
    if x.shape.rank == 3:
        padded = tf.pad(x, [[pad, pad], [pad, pad], [0, 0]], mode=mode)
        offset = _uniform([2], 0, 2 * pad + 1, tf.int32)
        out = tf.slice(padded, [offset[0], offset[1], 0], tf.shape(x))
        return tf.ensure_shape(out, x.shape)
    shape = tf.shape(x)
    # Rows of W * C values: pad and slice move runs of bytes, not 3-byte pixels (~3x faster).
    if mode.upper() == "CONSTANT":
        rows = tf.reshape(x, [shape[0], shape[1], shape[2] * shape[3]])
        padded = tf.pad(rows, [[0, 0], [pad, pad], [pad * shape[3], pad * shape[3]]])
    else:
        padded = tf.pad(x, [[0, 0], [pad, pad], [pad, pad], [0, 0]], mode=mode)
        padded = tf.reshape(padded, [shape[0], shape[1] + 2 * pad, -1])
    out = _crop_by_group(padded, _uniform([shape[0]], 0, 2 * pad + 1, tf.int32), 2 * pad + 1,
                         axis=1, size=shape[1], stride=1)
    out = _crop_by_group(out, _uniform([shape[0]], 0, 2 * pad + 1, tf.int32), 2 * pad + 1,
                         axis=2, size=shape[2] * shape[3], stride=shape[3])
    return tf.ensure_shape(tf.reshape(out, shape), x.shape)


def _crop_by_group(x: tf.Tensor, offsets: tf.Tensor, num_offsets: int, axis: int,
                   size: tf.Tensor, stride: tf.Tensor | int) -> tf.Tensor:
    """Crops ``size`` along ``axis`` of ``[B, rows, values]`` from each image's offset.

    Images are grouped by offset and each group is cut with one plain slice: memory
    copies, where a per-image gather is several times slower on a CPU.
    """
    groups = tf.dynamic_partition(x, offsets, num_offsets)
    positions = tf.dynamic_partition(tf.range(tf.shape(x)[0]), offsets, num_offsets)
    cropped = []
    for offset, group in enumerate(groups):
        begin, length = [0, 0, 0], [-1, -1, -1]
        begin[axis], length[axis] = offset * stride, size
        cropped.append(tf.slice(group, begin, length))
    return tf.dynamic_stitch(positions, cropped)


def random_flip(x: tf.Tensor) -> tf.Tensor:
    """Mirrors each image left-right with probability 1/2.

    Args:
        x: an image ``[H, W, C]`` or a batch ``[B, H, W, C]``.

    Returns:
        A tensor of the shape and dtype of ``x``.

    Examples:
        >>> images = tf.reshape(tf.range(8.0), [2, 1, 4, 1])   # [B, H, W, C]
        >>> flipped = fw.transform.random_flip(images)         # each image or its mirror
        >>> flipped.shape
        TensorShape([2, 1, 4, 1])
    """
    x = _image_or_batch(x)
    if x.shape.rank == 3:
        flip = _uniform([], 0.0, 1.0) < 0.5
        return tf.cond(flip, lambda: tf.reverse(x, axis=[1]), lambda: x)
    flip = tf.cast(_uniform([tf.shape(x)[0]], 0.0, 1.0) < 0.5, tf.int32)
    # Partition + stitch moves whole images; tf.where with a broadcast [B, 1, 1, 1]
    # condition is about ten times slower on a CPU.
    positions = tf.dynamic_partition(tf.range(tf.shape(x)[0]), flip, 2)
    kept, flipped = tf.dynamic_partition(x, flip, 2)
    out = tf.dynamic_stitch(positions, [kept, tf.reverse(flipped, axis=[2])])
    return tf.ensure_shape(out, x.shape)


def cutout(x: tf.Tensor, h: int, w: int, fill: float = 0) -> tf.Tensor:
    """Blanks an ``h`` x ``w`` rectangle centred on a uniformly random pixel.

    The rectangle is clipped at the image border (DeVries & Taylor, 2017), so it covers
    fewer pixels when its centre lies near an edge.

    Args:
        x: an image ``[H, W, C]`` or a batch ``[B, H, W, C]``.
        h: height of the rectangle in pixels.
        w: width of the rectangle in pixels.
        fill: the value written into the rectangle. Defaults to 0 (the mean after
            `standard_scaler`).

    Returns:
        A tensor of the shape and dtype of ``x``.

    Examples:
        >>> x = fw.transform.cutout(tf.ones([2, 32, 32, 3]), 8, 8)
        >>> bool(tf.reduce_sum(x) < 2 * 32 * 32 * 3)    # an 8x8 hole (clipped at edges)
        True
    """
    h, w = _non_negative_int("h", h), _non_negative_int("w", w)
    x = _image_or_batch(x)
    batch = x if x.shape.rank == 4 else x[tf.newaxis]
    shape = tf.shape(batch)
    top = _uniform([shape[0]], 0, shape[1], tf.int32)[:, None] - h // 2
    left = _uniform([shape[0]], 0, shape[2], tf.int32)[:, None] - w // 2
    rows = tf.range(shape[1])[None]
    cols = (tf.range(shape[2] * shape[3]) // shape[3])[None]  # column of each (x, c) pair
    outside_rows = (rows < top) | (rows >= top + h)  # [B, H]
    outside_cols = (cols < left) | (cols >= left + w)  # [B, W * C]
    # A boolean outer OR at full size [B, H, W * C] then one same-shape multiply: ~4x
    # faster on a CPU than tf.where or a multiply broadcast along the channel axis.
    keep = outside_rows[:, :, None] | outside_cols[:, None, :]
    keep = tf.reshape(tf.cast(keep, batch.dtype), shape)
    out = batch * keep
    if fill != 0:
        out += tf.cast(fill, batch.dtype) * (1 - keep)
    return out if x.shape.rank == 4 else out[0]


def random_crop_resize(x: tf.Tensor, size: int | Sequence[int],
                       scale: tuple[float, float] = (0.08, 1.0),
                       ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tf.Tensor:
    """Crops a random region and resizes it to ``size`` (Inception-style augmentation).

    The region covers a fraction of the image area uniform in ``scale`` and has an
    aspect ratio (width / height) log-uniform in ``ratio``; a side longer than the image
    is clipped to it (instead of re-drawing, which a vectorised op cannot do cheaply).

    Args:
        x: an image ``[H, W, C]`` or a batch ``[B, H, W, C]``.
        size: output size, an int or ``(height, width)``.
        scale: range of the crop's area as a fraction of the image. Defaults to
            ``(0.08, 1.0)``.
        ratio: range of the crop's aspect ratio. Defaults to ``(3/4, 4/3)``.

    Returns:
        float32 images of spatial size ``size`` (bilinear interpolation).

    Examples:
        >>> fw.transform.random_crop_resize(tf.zeros([64, 48, 3]), 32).shape
        TensorShape([32, 32, 3])
    """
    out_h, out_w = (size, size) if isinstance(size, (int, np.integer)) else tuple(size)
    out_h, out_w = int(out_h), int(out_w)
    if not 0 < scale[0] <= scale[1] <= 1:
        raise ValueError(f"scale={scale!r} must satisfy 0 < low <= high <= 1")
    if not 0 < ratio[0] <= ratio[1]:
        raise ValueError(f"ratio={ratio!r} must satisfy 0 < low <= high")
    x = _image_or_batch(x)
    # One image is cropped as a batch of one: crop_and_resize is the op either way.
    batch = x if x.shape.rank == 4 else x[tf.newaxis]
    boxes = _random_boxes(tf.shape(batch), scale, ratio)
    out = tf.image.crop_and_resize(tf.cast(batch, tf.float32), boxes,
                                   tf.range(tf.shape(batch)[0]), [out_h, out_w])
    return out if x.shape.rank == 4 else out[0]


def _random_boxes(shape: tf.Tensor, scale, ratio) -> tf.Tensor:
    """Normalised ``[y1, x1, y2, x2]`` boxes, one per image of a batch of ``shape``."""
    n, height, width = shape[0], tf.cast(shape[1], tf.float32), tf.cast(shape[2], tf.float32)
    area = _uniform([n], scale[0], scale[1]) * height * width
    log_ratio = tf.math.log(tf.constant(ratio, tf.float32))
    aspect = tf.exp(_uniform([n], log_ratio[0], log_ratio[1]))
    crop_h = tf.minimum(tf.sqrt(area / aspect), height)
    crop_w = tf.minimum(tf.sqrt(area * aspect), width)
    top = _uniform([n], 0.0, 1.0) * (height - crop_h)
    left = _uniform([n], 0.0, 1.0) * (width - crop_w)
    # crop_and_resize maps 0 and 1 to the centres of the first and last pixels.
    return tf.stack([top / (height - 1), left / (width - 1),
                     (top + crop_h - 1) / (height - 1), (left + crop_w - 1) / (width - 1)],
                    axis=1)


def _per_channel(value, x: tf.Tensor) -> tf.Tensor:
    value = tf.cast(value, tf.float32)
    if x.shape.rank is not None and x.shape.rank >= 3:
        # Expanded to one whole image: broadcasting over the batch axis is ~4x faster on
        # a CPU than broadcasting a [C] vector along the innermost axis.
        value = tf.broadcast_to(value, tf.shape(x)[-3:])
    return value


def standard_scaler(x: tf.Tensor, mean, std) -> tf.Tensor:
    """Returns ``(x - mean) / std`` in float32; ``mean`` and ``std`` broadcast (per channel).

    Examples:
        >>> x = tf.fill([1, 2, 2, 3], 125.0)
        >>> x = fw.transform.standard_scaler(x, [125.0, 123.0, 113.0], [1.0, 2.0, 4.0])
        >>> x[0, 0, 0].numpy().round(2).tolist()        # (125 - mean) / std per channel
        [0.0, 1.0, 3.0]
    """
    x = tf.convert_to_tensor(x)
    scale = 1 / _per_channel(std, x)
    return tf.cast(x, tf.float32) * scale - _per_channel(mean, x) * scale


def reverse_standard_scaler(x: tf.Tensor, mean, std) -> tf.Tensor:
    """Undoes `standard_scaler`: returns ``x * std + mean`` in float32.

    Examples:
        >>> x = tf.constant([[0.0, 1.0, 3.0]])
        >>> fw.transform.reverse_standard_scaler(x, [125.0, 123.0, 113.0],
        ...                                      [1.0, 2.0, 4.0]).numpy().tolist()
        [[125.0, 125.0, 125.0]]
    """
    x = tf.convert_to_tensor(x)
    return tf.cast(x, tf.float32) * _per_channel(std, x) + _per_channel(mean, x)


def tfm_standard_scaler(mean, std) -> Callable[[tf.Tensor], tf.Tensor]:
    """`standard_scaler` with ``mean`` and ``std`` bound, for ``map`` or ``transform=``."""
    return functools.partial(standard_scaler, mean=mean, std=std)


def tfm_reverse_standard_scaler(mean, std) -> Callable[[tf.Tensor], tf.Tensor]:
    """`reverse_standard_scaler` with ``mean`` and ``std`` bound, e.g. to plot images.

    Examples:
        >>> show = fw.transform.tfm_reverse_standard_scaler([125.0, 123.0, 113.0],
        ...                                                 [1.0, 2.0, 4.0])
        >>> show(tf.constant([[0.0, 1.0, 3.0]])).numpy().tolist()
        [[125.0, 125.0, 125.0]]
    """
    return functools.partial(reverse_standard_scaler, mean=mean, std=std)


def tfm_pad_crop(pad: int, mode: str = "CONSTANT") -> Callable[[tf.Tensor], tf.Tensor]:
    """`random_pad_crop` with its arguments bound."""
    return functools.partial(random_pad_crop, pad=pad, mode=mode)


def tfm_cutout(h: int, w: int, fill: float = 0) -> Callable[[tf.Tensor], tf.Tensor]:
    """`cutout` with its arguments bound."""
    return functools.partial(cutout, h=h, w=w, fill=fill)


def compose(*transforms: Callable[[tf.Tensor], tf.Tensor]) -> Callable[[tf.Tensor], tf.Tensor]:
    """Chains transforms left to right.

    Examples:
        >>> augment = fw.transform.compose(fw.transform.tfm_pad_crop(4),
        ...                                fw.transform.random_flip)
    """
    def composed(x: tf.Tensor) -> tf.Tensor:
        for transform in transforms:
            x = transform(x)
        return x

    return composed


# ----------------------------------------------------------------- single-image transforms
# The transforms below take one image [H, W, C] (float, values in [0, 1] unless said
# otherwise): they are what `fw.data.get_tfexample_image_parser` applies per record.


def tfm_random_flip(flip_vert: bool = False) -> Callable[[tf.Tensor], tf.Tensor]:
    """`random_flip`, plus (``flip_vert=True``) a random multiple of 90 degrees of rotation.

    With ``flip_vert`` every one of the 8 symmetries of a square is equally likely
    (satellite or microscope images have no "up"); images must then be square.

    Examples:
        >>> tfms = [fw.transform.tfm_random_flip(flip_vert=True)]
    """
    if not flip_vert:
        return random_flip
    return lambda x: random_rotate_90(random_flip(x))


def random_rotate_90(x: tf.Tensor) -> tf.Tensor:
    """Rotates one square image ``[H, H, C]`` by 0, 90, 180 or 270 degrees, uniformly.

    Examples:
        >>> fw.transform.random_rotate_90(tf.zeros([8, 8, 3])).shape
        TensorShape([8, 8, 3])
    """
    x = _image_or_batch(x)
    if x.shape.rank != 3:
        raise ValueError(f"x has shape {x.shape}; random_rotate_90 takes one image [H, W, C]")
    quarter_turns = _uniform([], 0, 4, tf.int32)
    return tf.ensure_shape(tf.image.rot90(x, quarter_turns), x.shape)


def tfm_set_shape(h: int | None = None, w: int | None = None,
                  c: int = 3) -> Callable[[tf.Tensor], tf.Tensor]:
    """Declares the static shape ``[h, w, c]`` of a decoded image (None = unknown).

    A decoded JPEG has an unknown height and width; models and TPUs need them known.
    The shape is checked when the data flows: a record of another size is an error.

    Examples:
        >>> tfms = [fw.transform.tfm_set_shape(32, 32)]
    """
    shape = [_optional_size("h", h), _optional_size("w", w), _optional_size("c", c)]
    return lambda x: tf.ensure_shape(x, shape)


def _optional_size(name: str, value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer or None")
    return int(value)


def tfm_resize(h: int, w: int) -> Callable[[tf.Tensor], tf.Tensor]:
    """Resizes an image to ``h`` x ``w`` (bilinear, aspect not kept), float32 out.

    Examples:
        >>> fw.transform.tfm_resize(4, 6)(tf.zeros([8, 8, 3])).shape
        TensorShape([4, 6, 3])
    """
    size = [_optional_size("h", h), _optional_size("w", w)]
    if None in size:
        raise ValueError(f"h={h!r}, w={w!r}: both are needed to resize")
    return lambda x: tf.image.resize(tf.cast(x, tf.float32), size)


def random_rotate_zoom(x: tf.Tensor, max_rotate: float = 10.0, max_zoom: float = 1.1,
                       p: float = 0.75) -> tf.Tensor:
    """Rotates (uniform in +-``max_rotate`` degrees) and zooms in (uniform in
    ``[1, max_zoom]``) about the centre, each with probability ``p``; fastai's affine set.

    Pixels that come from outside the image are filled by reflection, as fastai does, so
    no black corners appear.

    Args:
        x: one image ``[H, W, C]``.
        max_rotate: largest rotation in degrees. Defaults to 10.
        max_zoom: largest zoom factor (>= 1). Defaults to 1.1.
        p: probability of each of rotation and zoom. Defaults to 0.75.

    Returns:
        The float32 image, same shape.

    Examples:
        >>> y = fw.transform.random_rotate_zoom(tf.random.uniform([32, 32, 3]))
    """
    if max_zoom < 1 or not 0 <= p <= 1:
        raise ValueError(f"max_zoom={max_zoom!r} must be >= 1 and p={p!r} in [0, 1]")
    x = tf.cast(_image_or_batch(x), tf.float32)
    if x.shape.rank != 3:
        raise ValueError(f"x has shape {x.shape}; random_rotate_zoom takes one image")
    angle = _uniform([], -max_rotate, max_rotate) * (np.pi / 180)
    angle *= tf.cast(_uniform([], 0.0, 1.0) < p, tf.float32)
    zoom = tf.where(_uniform([], 0.0, 1.0) < p, _uniform([], 1.0, max_zoom), 1.0)
    height, width = tf.cast(tf.shape(x)[0], tf.float32), tf.cast(tf.shape(x)[1], tf.float32)
    # The transform maps output pixel (col, row) to the input pixel it samples: rotate
    # by `angle` and shrink by 1 / zoom about the centre (cx, cy).
    cos, sin = tf.cos(angle) / zoom, tf.sin(angle) / zoom
    cx, cy = (width - 1) / 2, (height - 1) / 2
    matrix = tf.stack([cos, -sin, cx - cos * cx + sin * cy,
                       sin, cos, cy - sin * cx - cos * cy, 0.0, 0.0])
    out = tf.raw_ops.ImageProjectiveTransformV3(
        images=x[tf.newaxis], transforms=matrix[tf.newaxis],
        output_shape=tf.shape(x)[:2], fill_value=0.0, interpolation="BILINEAR",
        fill_mode="REFLECT")
    return tf.ensure_shape(out[0], x.shape)


def random_lighting(x: tf.Tensor, max_lighting: float = 0.2, p: float = 0.75) -> tf.Tensor:
    """Random brightness (+-``max_lighting / 2``) and contrast (factor in
    ``[1 - max_lighting, 1 / (1 - max_lighting)]``), each with probability ``p``;
    for images in ``[0, 1]``, clipped back to it.

    Examples:
        >>> y = fw.transform.random_lighting(tf.random.uniform([32, 32, 3]))
    """
    if not 0 <= max_lighting < 1 or not 0 <= p <= 1:
        raise ValueError(f"max_lighting={max_lighting!r} must be in [0, 1) and p={p!r} "
                         "in [0, 1]")
    x = tf.cast(x, tf.float32)
    delta = _uniform([], -max_lighting / 2, max_lighting / 2)
    x = x + delta * tf.cast(_uniform([], 0.0, 1.0) < p, tf.float32)
    # Contrast: log-uniform so that shrinking and stretching are equally likely.
    log_low = float(np.log(1 - max_lighting))
    factor = tf.exp(_uniform([], log_low, -log_low))
    factor = tf.where(_uniform([], 0.0, 1.0) < p, factor, 1.0)
    mean = tf.reduce_mean(x, axis=[0, 1], keepdims=True)
    return tf.clip_by_value((x - mean) * factor + mean, 0.0, 1.0)


# ImageNet normalisations the Keras applications expect, from images in [0, 1].
_IMAGENET_MEAN, _IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
_CAFFE_BGR_MEAN = (103.939, 116.779, 123.68)  # in 0..255 pixel units, BGR order


def imagenet_normalize_tf(x: tf.Tensor) -> tf.Tensor:
    """``[0, 1]`` -> ``[-1, 1]``: Inception, Xception, MobileNet, ResNet V2, EfficientNetV2."""
    return tf.cast(x, tf.float32) * 2.0 - 1.0


def imagenet_normalize_pytorch(x: tf.Tensor) -> tf.Tensor:
    """``[0, 1]`` -> ImageNet mean/std standardised per channel: DenseNet."""
    return standard_scaler(x, _IMAGENET_MEAN, _IMAGENET_STD)


def imagenet_normalize_caffe(x: tf.Tensor) -> tf.Tensor:
    """``[0, 1]`` RGB -> BGR in 0..255 minus the ImageNet BGR mean: VGG, ResNet (V1)."""
    return tf.cast(x, tf.float32)[..., ::-1] * 255.0 - tf.constant(_CAFFE_BGR_MEAN)


def get_fastai_transforms(h: int, w: int, training: bool,
                          normalizer: Callable[[tf.Tensor], tf.Tensor] = imagenet_normalize_tf,
                          flip_vert: bool = False, max_rotate: float = 10.0,
                          max_zoom: float = 1.1, max_lighting: float = 0.2,
                          p_affine: float = 0.75,
                          p_lighting: float = 0.75) -> list[Callable[[tf.Tensor], tf.Tensor]]:
    """The fastai default augmentation set, as a list for `get_tfexample_image_parser`.

    Training: resize to ``h`` x ``w``, random flip (and with ``flip_vert`` quarter
    turns), rotation and zoom (each with probability ``p_affine``), brightness and
    contrast (each with probability ``p_lighting``), then ``normalizer``. Evaluation:
    resize and normalise only.

    Args:
        h: output height.
        w: output width.
        training: augment (True) or only resize and normalise (False).
        normalizer: images in ``[0, 1]`` -> model input, e.g. a Keras application's
            (`fw.keras_models.get_model` gives it). Defaults to `imagenet_normalize_tf`.
        flip_vert, max_rotate, max_zoom, max_lighting, p_affine, p_lighting: the
            fastai ``get_transforms`` options. Defaults to fastai's.

    Returns:
        A list of single-image transforms, applied in order.

    Examples:
        >>> tfms = fw.transform.get_fastai_transforms(224, 224, training=True)
        >>> parser = fw.data.get_tfexample_image_parser(tfms)
    """
    resize = tfm_resize(h, w)
    if not training:
        return [resize, normalizer]
    return [resize, tfm_random_flip(flip_vert and h == w),
            functools.partial(random_rotate_zoom, max_rotate=max_rotate, max_zoom=max_zoom,
                              p=p_affine),
            functools.partial(random_lighting, max_lighting=max_lighting, p=p_lighting),
            normalizer]


_REMOVED = {
    "tfm_fastai": "get_fastai_transforms(h, w, training=True) (a list of transforms)",
    "fastai_transforms": "get_fastai_transforms(h, w, training=True)",
    "get_inception_transforms": "random_crop_resize(x, size) then random_flip",
    "random_rotate": "random_rotate_zoom(x, max_rotate=10, max_zoom=1.0, p=1.0)",
    "random_zoom": "random_rotate_zoom(x, max_rotate=0, max_zoom=1.1, p=1.0)",
    "random_dihedral": "tfm_random_flip(flip_vert=True)",
    "tfm_central_crop": "a lambda around tf.image.central_crop",
    "distort_color": "random_lighting",
    "reverse_imagenet_normalize_tf": "lambda x: (x + 1) / 2",
}


def __getattr__(name: str) -> object:
    raise removed_error("fenwicks.transform", name, _REMOVED)
