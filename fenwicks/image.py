"""Small image helpers for notebooks: grey to RGB for display, fixing non-RGB files, and
the per-channel mean and standard deviation of an image dataset (for standardising)."""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import tensorflow as tf

from fenwicks import data

logger = logging.getLogger("fenwicks")

__all__ = ["check_rgb", "compute_mean_std", "gray2rgb"]


def gray2rgb(x: Any, normalize: bool = False) -> np.ndarray:
    """Repeats a one-channel image (``[..., 1]``) three times: ``[..., 3]``.

    Args:
        x: an image or a batch with one channel last.
        normalize: divide by the maximum first (so the brightest pixel is 1). Defaults
            to False.

    Returns:
        The RGB array (float if ``normalize``).

    Examples:
        >>> fw.image.gray2rgb(np.zeros((28, 28, 1))).shape
        (28, 28, 3)
    """
    x = np.asarray(x)
    if x.ndim < 2 or x.shape[-1] != 1:
        raise ValueError(f"x has shape {x.shape}; gray2rgb takes images with one channel "
                         "last, [..., H, W, 1]")
    if normalize:
        peak = np.max(x)
        x = x / peak if peak else x.astype(np.float32)
    return np.concatenate([x, x, x], axis=-1)


def check_rgb(data_dir: str, file_ext: str = "jpg", fix: bool = True) -> list[str]:
    """Finds images in ``data_dir`` (one folder, not recursive) that are not RGB
    (grey, palette, RGBA, CMYK) and, with ``fix``, rewrites them as RGB in place.

    Args:
        data_dir: the folder of images.
        file_ext: only files with this extension. Defaults to ``'jpg'``.
        fix: convert and overwrite them. Defaults to True.

    Returns:
        The paths of the images that were not RGB.

    Examples:
        >>> import os
        >>> os.makedirs('train/cats', exist_ok=True)
        >>> png = tf.io.encode_png(tf.zeros([4, 4, 3], tf.uint8)).numpy()
        >>> _ = open('train/cats/0.png', 'wb').write(png)
        >>> fw.image.check_rgb('train', file_ext='png')       # every image RGB already
        []
    """
    from PIL import Image  # Pillow comes with Keras; imported only when used

    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"data_dir={data_dir!r} is not a directory")
    found = []
    ext = "." + file_ext.lstrip(".").lower()
    for name in sorted(os.listdir(data_dir)):
        if not name.lower().endswith(ext):
            continue
        path = os.path.join(data_dir, name)
        with Image.open(path) as image:
            if image.mode == "RGB":
                continue
            found.append(path)
            logger.warning("fenwicks: %s is %s, not RGB%s", path, image.mode,
                           "; converting it" if fix else "")
            if fix:
                image.convert("RGB").save(path)
    return found


def compute_mean_std(fn_data: str, n_data: int | None = None,
                     batch_size: int = 1) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Per-channel mean and standard deviation of the images of an encoded-image
    TFRecord file, as ``get_tfexample_image_parser`` decodes them (float in ``[0, 1]``).

    Args:
        fn_data: the records' path or pattern (written by `data_dir_tfrecord`,
            `data_dir_label_csv_tfrecord`, ...).
        n_data: use only the first ``n_data`` images. Defaults to all.
        batch_size: accepted for the original call; images are read one at a time
            (they may differ in size).

    Returns:
        ``(mean [3], std [3], h, w)``: the sample standard deviation over all pixels,
        and the size of the last image read.

    Examples:
        >>> import os
        >>> for name, value in [('cat', 0), ('dog', 255)]:   # a black and a white image
        ...     os.makedirs(f'pets/{name}', exist_ok=True)
        ...     png = tf.io.encode_png(tf.fill([4, 4, 3], tf.constant(value, tf.uint8)))
        ...     _ = open(f'pets/{name}/1.png', 'wb').write(png.numpy())
        >>> _ = fw.data.class_folders_tfrecord('pets', 'pets.tfrec')
        >>> mean, std, h, w = fw.image.compute_mean_std('pets.tfrec')
        >>> mean.tolist(), std.round(4).tolist(), (h, w)   # std: sqrt(0.25 * 32 / 31)
        ([0.5, 0.5, 0.5], [0.508, 0.508, 0.508], (4, 4))
        >>> tfms = [fw.transform.tfm_standard_scaler(mean, std)]
    """
    parser = data.get_tfexample_image_parser(has_label=False)
    records = tf.data.TFRecordDataset(data.match_files(fn_data))
    if n_data is not None:
        records = records.take(int(n_data))
    count, total, total_sq = 0, np.zeros(3), np.zeros(3)
    h = w = 0
    for image in records.map(parser, num_parallel_calls=tf.data.AUTOTUNE):
        pixels = image.numpy().astype(np.float64)
        h, w = pixels.shape[:2]
        count += h * w
        total += pixels.sum(axis=(0, 1))
        total_sq += (pixels * pixels).sum(axis=(0, 1))
    if count < 2:
        raise ValueError(f"fn_data={fn_data!r} holds fewer than 2 pixels")
    mean = total / count
    std = np.sqrt((total_sq - count * mean * mean) / (count - 1))
    return mean, std, int(h), int(w)
