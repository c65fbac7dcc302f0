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

import tensorflow as tf

__all__ = [
    "compose",
    "cutout",
    "random_crop_resize",
    "random_flip",
    "random_pad_crop",
    "reverse_standard_scaler",
    "seeded",
    "standard_scaler",
    "tfm_cutout",
    "tfm_pad_crop",
    "tfm_reverse_standard_scaler",
    "tfm_standard_scaler",
]

_state = threading.local()  # trace-time only: the seed scope of the function being traced


@contextlib.contextmanager
def seeded(seed: tf.Tensor) -> Iterator[None]:
    """Makes the transforms traced inside draw stateless numbers from ``seed``.

    Args:
        seed: an int64 (or int32) tensor of shape ``[2]``, different for each element.

    Example:
        >>> def fn(i, x):
        ...     with fw.transform.seeded(tf.stack([i, 42])):
        ...         return fw.transform.random_flip(x)
        >>> ds = ds.enumerate().map(fn, num_parallel_calls=tf.data.AUTOTUNE)
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
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}={value!r} must be a non-negative integer (pixels)")
    return value


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

    Example:
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

    Example:
        >>> flipped = fw.transform.random_flip(images)   # images: [B, H, W, C]
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

    Example:
        >>> x = fw.transform.cutout(x, 8, 8)
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

    Example:
        >>> fw.transform.random_crop_resize(tf.zeros([64, 48, 3]), 32).shape
        TensorShape([32, 32, 3])
    """
    out_h, out_w = (size, size) if isinstance(size, int) else tuple(size)
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

    Example:
        >>> x = fw.transform.standard_scaler(x, [125.3, 123.0, 113.9], [63.0, 62.1, 66.7])
    """
    x = tf.convert_to_tensor(x)
    scale = 1 / _per_channel(std, x)
    return tf.cast(x, tf.float32) * scale - _per_channel(mean, x) * scale


def reverse_standard_scaler(x: tf.Tensor, mean, std) -> tf.Tensor:
    """Undoes `standard_scaler`: returns ``x * std + mean`` in float32.

    Example:
        >>> pixels = fw.transform.reverse_standard_scaler(x, mean, std)
    """
    x = tf.convert_to_tensor(x)
    return tf.cast(x, tf.float32) * _per_channel(std, x) + _per_channel(mean, x)


def tfm_standard_scaler(mean, std) -> Callable[[tf.Tensor], tf.Tensor]:
    """`standard_scaler` with ``mean`` and ``std`` bound, for ``map`` or ``transform=``."""
    return functools.partial(standard_scaler, mean=mean, std=std)


def tfm_reverse_standard_scaler(mean, std) -> Callable[[tf.Tensor], tf.Tensor]:
    """`reverse_standard_scaler` with ``mean`` and ``std`` bound, e.g. to plot images.

    Example:
        >>> show = fw.transform.tfm_reverse_standard_scaler(mean, std)
        >>> pixels = show(x_batch)
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

    Example:
        >>> augment = fw.transform.compose(fw.transform.tfm_pad_crop(4),
        ...                                fw.transform.random_flip)
    """
    def composed(x: tf.Tensor) -> tf.Tensor:
        for transform in transforms:
            x = transform(x)
        return x

    return composed
