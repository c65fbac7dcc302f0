"""Image files on disk to TFRecords, in the layouts Kaggle competitions ship: one folder
per class, one folder plus a CSV of labels, or one unlabelled test folder.

Each writer returns what a notebook needs next: the image paths in the order they were
written (so prediction ``i`` belongs to ``paths[i]``), their integer labels and the class
names (index = class id).
"""

from __future__ import annotations

import csv
import os
import posixpath
import random
from collections.abc import Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from fenwicks.data import records


class ImageFiles(NamedTuple):
    """What an image-folder writer wrote: ``paths[i]`` has class id ``y[i]``, whose name
    is ``labels[y[i]]``. Unpacks as ``paths, y, labels = ...``."""

    paths: list[str]
    y: list[int]
    labels: list[str]


def _join(folder: str, name: str) -> str:
    return posixpath.join(folder, name) if "://" in folder else os.path.join(folder, name)


def _check_no_extractor(extractor: Any) -> None:
    if extractor is not None:
        raise TypeError("extractor= is not supported: turn files into arrays yourself and "
                        "write them with fw.data.numpy_tfrecord(fn, X, y)")


def _shuffled(paths: list[str], y: list[int], shuffle: bool,
              seed: int | None) -> tuple[list[str], list[int]]:
    if not shuffle:
        return paths, y
    order = list(range(len(paths)))
    random.Random(seed).shuffle(order)
    return [paths[i] for i in order], [y[i] for i in order]


def _images_in(folder: str, file_ext: str | None) -> list[str]:
    """Sorted image files directly in ``folder``: those ending in ``.file_ext``, or any
    JPEG/PNG/GIF/BMP extension when ``file_ext`` is None."""
    if not tf.io.gfile.isdir(folder):
        raise FileNotFoundError(f"data_dir={folder!r} is not a directory")
    ends = (f".{file_ext.lstrip('.').lower()}",) if file_ext else records.IMAGE_EXTENSIONS
    return sorted(_join(folder, f) for f in tf.io.gfile.listdir(folder)
                  if f.lower().endswith(ends) and not tf.io.gfile.isdir(_join(folder, f)))


def class_folders_tfrecord(data_dir: str, output_fn: str, shuffle: bool = True,
                           overwrite: bool = False, file_ext: str | None = None,
                           exclude_dirs: Sequence[str] = (), num_shards: int = 1,
                           seed: int | None = 0) -> ImageFiles:
    """Writes a one-folder-per-class image tree as TFRecords; returns what it wrote.

    Class ids follow the sorted folder names. With ``shuffle`` the records are written
    in a seeded random order, so shards and k-fold splits (`tfrecord_ds`'s ``n_folds``)
    mix classes.

    Args:
        data_dir: folder holding one sub-folder of images per class.
        output_fn: output path (local or ``gs://``).
        shuffle: write in random order. Defaults to True.
        overwrite: replace an earlier write. Defaults to False (refuse).
        file_ext: only files with this extension (e.g. ``'png'``). Defaults to None
            (JPEG, PNG, GIF and BMP).
        exclude_dirs: sub-folder names that are not classes.
        num_shards: files to write. Defaults to 1.
        seed: seeds the shuffle. Defaults to 0.

    Returns:
        `ImageFiles` ``(paths, y, labels)``, in record order.

    Example:
        >>> paths, y, labels = fw.data.class_folders_tfrecord('/data/flowers', fn)
    """
    records.check_writable(output_fn, overwrite)
    labels = sorted(d.rstrip("/") for d in tf.io.gfile.listdir(data_dir)
                    if tf.io.gfile.isdir(_join(data_dir, d))
                    and d.rstrip("/") not in set(exclude_dirs))
    if not labels:
        raise ValueError(f"data_dir={data_dir!r} has no class sub-folders; expected e.g. "
                         "data_dir/cat/1.jpg, data_dir/dog/2.jpg")
    paths, y = [], []
    for class_id, name in enumerate(labels):
        found = _images_in(_join(data_dir, name), file_ext)
        paths += found
        y += [class_id] * len(found)
    paths, y = _shuffled(paths, y, shuffle, seed)
    records.files_tfrecord(output_fn, paths, y, num_shards, overwrite)
    return ImageFiles(paths, y, labels)


def data_dir_label_csv_tfrecord(data_dir: str, csv_fn: str, output_fn: str,
                                shuffle: bool = False, overwrite: bool = False,
                                extractor: None = None, file_ext: str = "jpg",
                                id_col: str = "id", label_col: str = "label",
                                _labels: Sequence[str] | None = None,
                                seed: int | None = 0) -> ImageFiles:
    """Writes a Kaggle-style image folder, labelled by a CSV file, as TFRecords.

    Row ``r`` of the CSV names the file ``data_dir/<r[id_col]>.<file_ext>`` and its class
    ``r[label_col]``. Class ids follow the sorted class names, or ``_labels``' order.

    Args:
        data_dir: the folder of images.
        csv_fn: the CSV, with a header row naming ``id_col`` and ``label_col``.
        output_fn: output path (local or ``gs://``).
        shuffle: write in random order (seeded). Defaults to False (CSV order).
        overwrite: replace an earlier write. Defaults to False (refuse).
        extractor: not supported (a TypeError names the replacement).
        file_ext: the images' extension. Defaults to ``'jpg'``.
        id_col: the CSV column of file names (without extension). Defaults to ``'id'``.
        label_col: the CSV column of class names. Defaults to ``'label'``.
        _labels: the class names in class-id order. Defaults to the sorted names found.
        seed: seeds the shuffle. Defaults to 0.

    Returns:
        `ImageFiles` ``(paths, y, labels)``, in record order.

    Raises:
        ValueError: a missing column, an unknown class, or a listed file that is absent.

    Example:
        >>> paths, y, labels = fw.data.data_dir_label_csv_tfrecord(
        ...     './data/train', './trainLabels.csv', './data/train.tfrec', file_ext='png')
    """
    _check_no_extractor(extractor)
    records.check_writable(output_fn, overwrite)
    rows = _read_label_csv(csv_fn, id_col, label_col)
    labels = list(_labels) if _labels is not None else sorted({label for _, label in rows})
    class_ids = {name: i for i, name in enumerate(labels)}
    unknown = sorted({label for _, label in rows} - set(class_ids))
    if unknown:
        raise ValueError(f"{csv_fn} has classes {unknown[:5]} that are not in _labels="
                         f"{labels!r}; add them or leave _labels=None")
    ext = file_ext.lstrip(".")
    paths = [_join(data_dir, f"{file_id}.{ext}") for file_id, _ in rows]
    missing = [p for p in paths[:1000] if not tf.io.gfile.exists(p)]  # a quick check
    if missing:
        raise ValueError(f"{missing[0]} (row id of {csv_fn}) does not exist: check "
                         f"data_dir={data_dir!r}, file_ext={file_ext!r} and id_col")
    paths, y = _shuffled(paths, [class_ids[label] for _, label in rows], shuffle, seed)
    records.files_tfrecord(output_fn, paths, y, 1, overwrite)
    return ImageFiles(paths, y, labels)


def _read_label_csv(csv_fn: str, id_col: str, label_col: str) -> list[tuple[str, str]]:
    with tf.io.gfile.GFile(csv_fn, "r") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        for name, col in (("id_col", id_col), ("label_col", label_col)):
            if col not in columns:
                raise ValueError(f"{name}={col!r} is not a column of {csv_fn}; its "
                                 f"columns are {columns}")
        rows = [(row[id_col].strip(), row[label_col].strip()) for row in reader]
    if not rows:
        raise ValueError(f"{csv_fn} has no rows under its header")
    return rows


def data_dir_no_label_tfrecord(data_dir: str, output_fn: str, shuffle: bool = False,
                               overwrite: bool = False, extractor: None = None,
                               file_ext: str = "jpg", seed: int | None = 0) -> list[str]:
    """Writes an unlabelled folder of images (a competition's test set) as TFRecords.

    The records hold only the image; read them with
    ``get_tfexample_image_parser(tfms, has_label=False)``. Files are written in sorted
    order (or shuffled), and prediction ``i`` belongs to the returned ``paths[i]``.

    Args:
        data_dir: the folder of images.
        output_fn: output path (local or ``gs://``).
        shuffle: write in random order (seeded). Defaults to False.
        overwrite: replace an earlier write. Defaults to False (refuse).
        extractor: not supported (a TypeError names the replacement).
        file_ext: the images' extension. Defaults to ``'jpg'``.
        seed: seeds the shuffle. Defaults to 0.

    Returns:
        The image paths, in record order.

    Example:
        >>> paths = fw.data.data_dir_no_label_tfrecord('./data/test', fn, file_ext='png')
        >>> ids = [os.path.basename(p)[:-4] for p in paths]
    """
    _check_no_extractor(extractor)
    records.check_writable(output_fn, overwrite)
    paths = _images_in(data_dir, file_ext)
    if not paths:
        raise ValueError(f"data_dir={data_dir!r} has no .{file_ext} files")
    paths, _ = _shuffled(paths, [0] * len(paths), shuffle, seed)
    examples = (records.unlabelled_example(records.read_image(p)) for p in paths)
    records.write_records(output_fn, examples, 1, overwrite)
    return paths
