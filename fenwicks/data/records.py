"""Writing TFRecord files: numpy arrays and encoded image files (folder layouts of image
files are `image_folders`, built on these writers).

Records stream to disk one at a time (constant memory) into a hidden temporary file
beside the target, which is renamed to its final name only after every shard closed
cleanly: a failed or interrupted write never leaves a half-written file under the name a
`tfrecord_ds` pattern would pick up. Works for local paths and ``gs://``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import uuid
from collections.abc import Iterable, Sequence

import numpy as np
import tensorflow as tf

from fenwicks import _removal
from fenwicks.data._checks import check_features, check_labels

logger = logging.getLogger("fenwicks")

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")
_MAGIC = {b"\xff\xd8\xff": "jpeg", b"\x89PNG": "png", b"GIF8": "gif", b"BM": "bmp"}


def _bytes_feature(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _int64_feature(value: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))


def image_example(image: bytes, label: int) -> bytes:
    """A serialized `tf.train.Example` with features ``image`` (bytes) and ``label``."""
    features = {"image": _bytes_feature(image), "label": _int64_feature(label)}
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def shard_paths(fn: str, num_shards: int) -> list[str]:
    """The files a write to ``fn`` produces: ``fn`` itself, or ``fn-00000-of-00004``..."""
    if isinstance(num_shards, bool) or not isinstance(num_shards, (int, np.integer)) \
            or num_shards < 1:
        raise ValueError(f"num_shards={num_shards!r} must be a positive integer")
    num_shards = int(num_shards)
    if num_shards == 1:
        return [fn]
    return [f"{fn}-{i:05d}-of-{num_shards:05d}" for i in range(num_shards)]


def _existing_outputs(fn: str) -> list[str]:
    """Files a previous write to ``fn`` left, whatever its shard count."""
    found = tf.io.gfile.glob(f"{fn}-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9]")
    return sorted(found + ([fn] if tf.io.gfile.exists(fn) else []))


def check_writable(fn: str, overwrite: bool) -> list[str]:
    """Returns earlier output of ``fn``; raises FileExistsError if any and not overwrite."""
    previous = _existing_outputs(fn)
    if previous and not overwrite:
        raise FileExistsError(f"{previous[0]} already exists ({len(previous)} file(s) from "
                              f"an earlier write to fn={fn!r}); pass overwrite=True to "
                              "replace them, or choose another fn")
    return previous


def _temp_path(path: str) -> str:
    # Hidden and prefixed, so a pattern such as `fn*` never matches a half-written file.
    head, tail = posixpath.split(path) if "://" in path else os.path.split(path)
    name = f".tmp-{uuid.uuid4().hex[:12]}-{tail}"
    return posixpath.join(head, name) if "://" in path else os.path.join(head, name)


def write_records(fn: str, records: Iterable[bytes], num_shards: int = 1,
                  overwrite: bool = False) -> list[str]:
    """Streams serialized records round-robin into ``num_shards`` files named from ``fn``.

    Returns:
        The paths written, in shard order.

    Raises:
        FileExistsError: if output of an earlier write to ``fn`` exists and not ``overwrite``.
    """
    paths = shard_paths(fn, num_shards)
    previous = check_writable(fn, overwrite)
    parent = posixpath.dirname(fn) if "://" in fn else os.path.dirname(fn)
    if parent and not tf.io.gfile.exists(parent):
        tf.io.gfile.makedirs(parent)
    temps = [_temp_path(p) for p in paths]
    try:
        count = _write_round_robin(temps, records)
    except BaseException:
        for temp in temps:
            _removal.remove_file(temp)
        raise
    for temp, path in zip(temps, paths, strict=True):
        tf.io.gfile.rename(temp, path, overwrite=True)
    for stale in set(previous) - set(paths):  # shards of an earlier, different shard count
        _removal.remove_file(stale)
    logger.info("fenwicks: wrote %d records to %d file(s) at %s", count, len(paths), fn)
    return paths


def _write_round_robin(paths: Sequence[str], records: Iterable[bytes]) -> int:
    # Round robin, not blocks, so every shard is a uniform sample even when the input is
    # sorted by class: interleaving a few shards then still mixes classes.
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(tf.io.TFRecordWriter(p)) for p in paths]
        count = 0
        for count, record in enumerate(records, start=1):
            writers[(count - 1) % len(writers)].write(record)
    return count


def numpy_tfrecord(fn: str, X: np.ndarray, y: np.ndarray, num_shards: int = 1,
                   overwrite: bool = False) -> list[str]:
    """Writes arrays as TFRecords: each example's raw bytes as ``image``, its ``label``,
    and its ``dtype`` and ``shape`` (so the parser can tell you what to pass).

    Read them back with `tfexample_numpy_image_parser` (give the dtype of ``X`` if it is
    not uint8). ``X`` may be an `np.memmap`: examples stream one at a time.

    Args:
        fn: output path, local or ``gs://``. With ``num_shards > 1`` the files are
            ``fn-00000-of-0000N``...; read them all with the pattern ``fn + '*'``.
        X: examples ``[N, ...]`` (e.g. uint8 images ``[N, H, W, C]``).
        y: integer class ids ``[N]`` (or ``[N, 1]``, as ``keras.datasets`` gives them).
        num_shards: files to spread the examples over, round robin. Defaults to 1.
        overwrite: replace an earlier write to ``fn``. Defaults to False (refuse).

    Returns:
        The paths written.

    Raises:
        ValueError: for ``X`` and ``y`` of different lengths or non-integer labels.
        FileExistsError: if ``fn`` was written before and ``overwrite`` is False.

    Examples:
        >>> X_train = np.zeros((100, 32, 32, 3), 'uint8')   # a bucket works too: gs://...
        >>> y_train = np.arange(100) % 10
        >>> fw.data.numpy_tfrecord('cifar/train', X_train, y_train, num_shards=4)[0]
        'cifar/train-00000-of-00004'
        >>> parser = lambda r: fw.data.tfexample_numpy_image_parser(r, 32, 32, 3)
        >>> ds = fw.data.tfrecord_ds('cifar/train*', parser, 32)
        >>> images, labels = next(iter(ds))
        >>> images.shape, images.dtype
        (TensorShape([32, 32, 32, 3]), tf.uint8)
    """
    X = check_features(X, "X")
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1:] == (1,) and y.dtype.kind in "iu":
        y = y.reshape(-1)  # [N, 1] class ids, as keras.datasets.cifar10 gives them
    y = check_labels(y, len(X), "y")
    if y.dtype.kind == "f":
        raise ValueError(f"y has dtype {y.dtype}; numpy_tfrecord stores integer class ids")
    records = (numpy_example(x, label) for x, label in zip(X, y, strict=True))
    return write_records(fn, records, num_shards, overwrite)


def numpy_example(x: np.ndarray, label: int) -> bytes:
    """A serialized `tf.train.Example`: ``x``'s raw bytes as ``image``, its ``label``, and
    its ``dtype`` name and ``shape``, so a parser can check it reads what was written."""
    x = np.ascontiguousarray(x)
    features = {"image": _bytes_feature(x.tobytes()), "label": _int64_feature(label),
                "dtype": _bytes_feature(x.dtype.name.encode()),
                "shape": tf.train.Feature(int64_list=tf.train.Int64List(value=x.shape))}
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def image_format(data: bytes) -> str | None:
    """``'jpeg'``, ``'png'``, ``'gif'`` or ``'bmp'`` from the file's first bytes, else None."""
    for magic, name in _MAGIC.items():
        if data.startswith(magic):
            return name
    return None


def unlabelled_example(image: bytes) -> bytes:
    """A serialized `tf.train.Example` with only the feature ``image`` (a test set)."""
    features = {"image": _bytes_feature(image)}
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def read_image(path: str) -> bytes:
    """An image file's bytes; a ValueError if it is not a JPEG, PNG, GIF or BMP."""
    with tf.io.gfile.GFile(path, "rb") as f:
        data = f.read()
    if image_format(data) is None:
        raise ValueError(f"{path} is not a JPEG, PNG, GIF or BMP image (first bytes "
                         f"{data[:8]!r}); remove it from paths")
    return data


def files_tfrecord(fn: str, paths: Sequence[str], labels: Sequence[int], num_shards: int = 1,
                   overwrite: bool = False) -> list[str]:
    """Writes encoded image files as TFRecords, their bytes kept as they are.

    Re-encoding would lose quality and time; decode at read time with
    `tfexample_image_parser`.

    Args:
        fn: output path, local or ``gs://`` (sharded as in `numpy_tfrecord`).
        paths: image files (JPEG, PNG, GIF or BMP), local or ``gs://``.
        labels: one integer class id per path.
        num_shards: files to spread the examples over. Defaults to 1.
        overwrite: replace an earlier write to ``fn``. Defaults to False (refuse).

    Returns:
        The paths written.

    Examples:
        >>> png = tf.io.encode_png(tf.zeros([4, 4, 3], tf.uint8)).numpy()
        >>> image_paths = [f'{i}.png' for i in range(4)]
        >>> for path in image_paths:
        ...     _ = open(path, 'wb').write(png)
        >>> fw.data.files_tfrecord('pets/train', image_paths, [0, 1, 0, 1], num_shards=2)
        ['pets/train-00000-of-00002', 'pets/train-00001-of-00002']
    """
    paths = list(paths)
    if not paths:
        raise ValueError("paths is empty; give at least one image file")
    labels = check_labels(labels, len(paths), "labels")
    if labels.dtype.kind == "f":
        raise ValueError(f"labels has dtype {labels.dtype}; give integer class ids")
    records = (image_example(read_image(p), label) for p, label in zip(paths, labels, strict=True))
    return write_records(fn, records, num_shards, overwrite)
