"""Image files on disk to TFRecords, in the layouts Kaggle competitions ship: one folder
per class (`data_dir_tfrecord`, `class_folders_tfrecord`), one folder plus a CSV of
labels, or one unlabelled test folder. Built on the writers of `records`.

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


def _class_folders(data_dir: str, file_ext: str | None,
                   exclude_dirs: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    """Class names (the sorted sub-folders, less ``exclude_dirs``) and each one's images.

    A class folder with no images is an error: its class id would exist with no example,
    which trains a class the model can never be shown and is most often a wrong path or
    a file_ext that does not match.
    """
    if not tf.io.gfile.isdir(data_dir):
        raise FileNotFoundError(f"data_dir={data_dir!r} is not a directory")
    names = sorted(d.rstrip("/") for d in tf.io.gfile.listdir(data_dir)
                   if tf.io.gfile.isdir(_join(data_dir, d))
                   and d.rstrip("/") not in set(exclude_dirs))
    if not names:
        raise ValueError(f"data_dir={data_dir!r} has no class sub-folders; expected one "
                         "folder of images per class, e.g. data_dir/cat/1.jpg, "
                         "data_dir/dog/2.jpg")
    files = [_images_in(_join(data_dir, name), file_ext) for name in names]
    empty = [name for name, found in zip(names, files, strict=True) if not found]
    if empty:
        kinds = f".{file_ext.lstrip('.')}" if file_ext else "JPEG, PNG, GIF or BMP"
        more = f" (nor do {len(empty) - 1} more: {empty[1:4]})" if len(empty) > 1 else ""
        raise ValueError(
            f"class folder {_join(data_dir, empty[0])!r} holds no {kinds} image{more}; "
            f"its class {empty[0]!r} (id {names.index(empty[0])}) would have no "
            "example. Add its images or remove the folder; class_folders_tfrecord (and "
            f"data_dir_tfrecord with shuffle=) can skip it: exclude_dirs=[{empty[0]!r}]")
    return names, files


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

    Examples:
        >>> import os
        >>> png = tf.io.encode_png(tf.zeros([4, 4, 3], tf.uint8)).numpy()
        >>> for path in ['flowers/daisy/1.png', 'flowers/daisy/2.png', 'flowers/rose/1.png']:
        ...     os.makedirs(os.path.dirname(path), exist_ok=True)
        ...     _ = open(path, 'wb').write(png)
        >>> paths, y, labels = fw.data.class_folders_tfrecord('flowers', 'records/train')
        >>> labels, sorted(zip(paths, y))
        (['daisy', 'rose'],
         [('flowers/daisy/1.png', 0), ('flowers/daisy/2.png', 0), ('flowers/rose/1.png', 1)])
    """
    records.check_writable(output_fn, overwrite)
    labels, files = _class_folders(data_dir, file_ext, exclude_dirs)
    paths = [path for found in files for path in found]
    y = [class_id for class_id, found in enumerate(files) for _ in found]
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

    Examples:
        >>> import os
        >>> png = tf.io.encode_png(tf.zeros([4, 4, 3], tf.uint8)).numpy()
        >>> os.makedirs('train', exist_ok=True)
        >>> for file_id in ['1', '2', '3']:
        ...     _ = open(f'train/{file_id}.png', 'wb').write(png)
        >>> _ = open('trainLabels.csv', 'w').write('id,label\\n1,cat\\n2,dog\\n3,cat\\n')
        >>> paths, y, labels = fw.data.data_dir_label_csv_tfrecord(
        ...     'train', 'trainLabels.csv', 'train.tfrec', file_ext='png')
        >>> paths, y, labels
        (['train/1.png', 'train/2.png', 'train/3.png'], [0, 1, 0], ['cat', 'dog'])
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

    Examples:
        >>> import os
        >>> png = tf.io.encode_png(tf.zeros([4, 4, 3], tf.uint8)).numpy()
        >>> os.makedirs('test', exist_ok=True)
        >>> for file_id in ['b', 'a']:
        ...     _ = open(f'test/{file_id}.png', 'wb').write(png)
        >>> paths = fw.data.data_dir_no_label_tfrecord('test', 'test.tfrec', file_ext='png')
        >>> [os.path.basename(p)[:-4] for p in paths]   # the ids, in prediction order
        ['a', 'b']
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


def data_dir_tfrecord(data_dir: str, fn: str, valid_fraction: float = 0.0,
                      valid_fn: str | None = None, num_shards: int = 1,
                      overwrite: bool = False, seed: int = 0, *,
                      shuffle: bool | None = None, file_ext: str | None = None,
                      exclude_dirs: Sequence[str] = ()) -> Any:
    """Writes a one-folder-per-class image tree (the Kaggle layout) as TFRecords.

    Class ids follow the sorted folder names. Examples are shuffled (seeded) before
    writing, so shards mix classes. With ``valid_fraction``, that fraction of each class
    (rounded) goes to ``valid_fn`` instead: a stratified split.

    Args:
        data_dir: folder holding one sub-folder of images per class.
        fn: output path for the (training) records.
        valid_fraction: fraction of each class held out for validation. Defaults to 0.
        valid_fn: output path for the validation records; required with a split.
        num_shards: files per output. Defaults to 1.
        overwrite: replace earlier writes. Defaults to False (refuse).
        seed: seeds the shuffle and the split. Defaults to 0.
        shuffle: the original Fenwicks form: given (True or False), no split is made,
            the records are written in random (seeded) or folder order, and the result
            is `ImageFiles` ``(paths, y, labels)`` in record order, as
            `class_folders_tfrecord` returns. Defaults to None (the form above).
        file_ext: with ``shuffle``, only files with this extension. Defaults to None
            (JPEG, PNG, GIF and BMP).
        exclude_dirs: with ``shuffle``, sub-folders that are not classes.

    Returns:
        The class names, index = class id; with ``shuffle`` given, ``(paths, y, labels)``.

    Examples:
        >>> import os
        >>> png = tf.io.encode_png(tf.zeros([4, 4, 3], tf.uint8)).numpy()
        >>> for path in ['flowers/daisy/1.png', 'flowers/daisy/2.png', 'flowers/rose/1.png']:
        ...     os.makedirs(os.path.dirname(path), exist_ok=True)
        ...     _ = open(path, 'wb').write(png)
        >>> fw.data.data_dir_tfrecord('flowers', 'records/train', valid_fraction=0.5,
        ...                           valid_fn='records/valid')    # or gs:// outputs
        ['daisy', 'rose']
        >>> fw.data.count_records('records/train*'), fw.data.count_records('records/valid*')
        (2, 1)
    """
    if shuffle is not None or file_ext is not None or exclude_dirs:
        if valid_fraction or valid_fn is not None:
            raise ValueError("shuffle=, file_ext= and exclude_dirs= write one file (the "
                             "original Fenwicks form); split with tfrecord_ds(..., n_folds=)"
                             " or drop them to use valid_fraction=/valid_fn=")
        return class_folders_tfrecord(data_dir, fn, True if shuffle is None else shuffle,
                                      overwrite, file_ext, exclude_dirs, num_shards, seed)
    _check_split(fn, valid_fraction, valid_fn)
    for out in (fn, valid_fn):  # check both before writing either: fail without side effects
        if out is not None:
            records.check_writable(out, overwrite)
    names, files = _class_folders(data_dir, None, ())
    rng = random.Random(seed)
    train, valid = [], []
    for label, class_files in enumerate(files):
        class_files = list(class_files)
        rng.shuffle(class_files)
        n_valid = int(round(valid_fraction * len(class_files)))
        valid += [(p, label) for p in class_files[:n_valid]]
        train += [(p, label) for p in class_files[n_valid:]]
    for name, pairs in (("training", train), ("validation", valid)):
        if not pairs and (name == "training" or valid_fraction > 0):
            counts = [len(class_files) for class_files in files]
            raise ValueError(f"the {name} split of data_dir={data_dir!r} is empty: "
                             f"valid_fraction={valid_fraction} of each class's images "
                             f"(rounded; {min(counts)} to {max(counts)} per class) leaves "
                             "none")
    for out, pairs in ((fn, train), (valid_fn, valid)):
        if out is not None and pairs:
            rng.shuffle(pairs)
            records.files_tfrecord(out, [p for p, _ in pairs],
                                   [label for _, label in pairs], num_shards, overwrite)
    return names


def _check_split(fn: str, valid_fraction: float, valid_fn: str | None) -> None:
    if not 0 <= valid_fraction < 1:
        raise ValueError(f"valid_fraction={valid_fraction!r} must be in [0, 1)")
    if valid_fraction > 0 and valid_fn is None:
        raise ValueError(f"valid_fraction={valid_fraction} needs valid_fn, the path for the "
                         "validation records")
    if valid_fn is not None and (valid_fn.startswith(fn) or fn.startswith(valid_fn)):
        raise ValueError(f"fn={fn!r} and valid_fn={valid_fn!r}: one is a prefix of the "
                         "other, so the pattern fn + '*' would read both splits; use e.g. "
                         "'.../train' and '.../valid'")
