"""tensorflow-datasets as a source: `tfds_load` (tfds.load that fails fast offline) and
`tfds_ds` (a training or evaluation pipeline over a tfds split).

Without a network, ``tfds.load`` of a dataset that is not on disk retries its downloads
for minutes before it fails. Here a dataset that is not prepared in ``data_dir`` is
downloaded only after a few seconds' check that the download server answers; otherwise
the error says so at once and how to point ``data_dir`` at a local copy or a bucket.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from fenwicks import io as fw_io
from fenwicks.data import epochs, pipeline, readers
from fenwicks.data.options import PipelineOptions, Transform, check_record_shuffle
from fenwicks.data.readers import check_tpu_can_read, tpu_is_remote

# tfds fetches prepared data from its bucket (gs://tfds-data) and most sources from
# Google's storage: if that host does not answer, a download cannot work.
_DOWNLOAD_HOST = ("storage.googleapis.com", 443)
_PROBE_SECONDS = 5.0  # DNS and TCP connect together; an offline machine fails in ms


class DatasetUnavailableError(FileNotFoundError):
    """A tensorflow-datasets dataset is not in ``data_dir`` and cannot be downloaded."""


def _probe_target() -> tuple[str, int]:
    """The download host, or the HTTPS proxy that downloads would go through."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    if proxy:
        parsed = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
        if parsed.hostname:
            return parsed.hostname, parsed.port or 80
    return _DOWNLOAD_HOST


def network_problem(timeout: float = _PROBE_SECONDS) -> str | None:
    """Why a download cannot work (host unreachable, no answer), or None if it may.

    A thread bounds the whole probe: ``socket.create_connection``'s timeout does not
    cover the name lookup, which can hang on a machine without DNS.
    """
    host, port = _probe_target()
    failures: list[str] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
        except OSError as err:
            failures.append(f"{host}:{port} is unreachable ({err})")

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return f"{host}:{port} did not answer within {timeout:.0f} s"
    return failures[0] if failures else None


def _where(data_dir: str | None) -> str:
    if data_dir is not None:
        return f"data_dir={data_dir!r}"
    import tensorflow_datasets as tfds

    return f"data_dir=None (tfds' default, {tfds.core.constants.DATA_DIR})"


def _how_to_fix(name: str) -> str:
    return (f"Point data_dir at a folder or bucket holding a prepared copy ({name}/<version>/ "
            "as tfds writes it, e.g. a copy of ~/tensorflow_datasets, or "
            "data_dir='gs://my-bucket/tensorflow_datasets'), or set TFDS_DATA_DIR; "
            f"prepare it where there is a network with tfds.builder({name!r}, "
            "data_dir=...).download_and_prepare()")


def _absent_variant(record: logging.LogRecord) -> bool:
    """tfds' "Variant folder <dir> has no dataset_info.json" about a folder that does
    not exist: ``builder.is_prepared()`` looks into the folder a dataset would be in."""
    return (record.msg == "Variant folder %s has no %s" and bool(record.args)
            and not fw_io.exists(str(record.args[0])))


@contextlib.contextmanager
def _quiet_absent_variants() -> Iterator[None]:
    """Drops `_absent_variant` warnings of absl's logger (tfds logs through absl);
    every other line, and that warning for a folder that exists (a broken copy), still
    shows."""
    logger = logging.getLogger("absl")
    keep = lambda record: not _absent_variant(record)  # noqa: E731
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def _builder(name: str, data_dir: str | None):
    import tensorflow_datasets as tfds

    try:
        return tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as err:
        # tfds' own message lists every dataset it knows (over a thousand lines).
        raise DatasetUnavailableError(
            f"tensorflow-datasets has no dataset {name!r} and {_where(data_dir)} holds none "
            "by that name; check the spelling (tfds.list_builders()) or the data_dir. "
            + _how_to_fix(name)) from err


def tfds_builder(name: str, data_dir: str | None = None, download: bool = True):
    """A prepared `tfds.core.DatasetBuilder`: read from ``data_dir``, else downloaded.

    Args:
        name: a tfds name, e.g. ``'mnist'`` or ``'cifar10:3.0.2'``.
        data_dir: where tfds keeps its files, local or ``gs://``. Defaults to None:
            tfds' default (``TFDS_DATA_DIR`` or ``~/tensorflow_datasets``) locally, the
            bucket on a TPU reached over the network (see `tfds_ds`).
        download: download and prepare the data if it is not in ``data_dir``.
            Defaults to True.

    Returns:
        The builder, with ``builder.is_prepared()`` true.

    Raises:
        DatasetUnavailableError: within seconds, if the dataset is not in ``data_dir``
            and cannot be downloaded (no network, or ``download=False``).

    Examples:
        >>> builder = fw.data.tfds_builder('mnist', data_dir='gs://my-bucket/tfds')
        >>> builder.info.splits['train'].num_examples
        60000
    """
    data_dir = tfds_data_dir(data_dir)
    builder = _builder(name, data_dir)
    with _quiet_absent_variants():
        prepared = builder.is_prepared()
    if prepared:
        return builder
    missing = f"{name!r} is not in {_where(data_dir)} (no {builder.data_dir})"
    if not download:
        raise DatasetUnavailableError(f"{missing} and download=False. {_how_to_fix(name)}")
    problem = network_problem()
    if problem:
        raise DatasetUnavailableError(f"tensorflow-datasets could not download {name!r}: "
                                      f"{problem}; and {missing}. {_how_to_fix(name)}")
    builder.download_and_prepare()
    return builder


def tfds_load(name: str, split: Any = None, data_dir: str | None = None,
              download: bool = True, **as_dataset_kwargs: Any) -> Any:
    """`tfds.load` that fails within seconds when the data cannot be had.

    Args:
        name: a tfds name, e.g. ``'mnist'``.
        split: e.g. ``'train'``, ``'test[:10%]'``. Defaults to None: every split.
        data_dir: as in `tfds_builder`.
        download: as in `tfds_builder`.
        **as_dataset_kwargs: passed to ``builder.as_dataset``, e.g. ``as_supervised=True``,
            ``shuffle_files=True``, ``read_config=...``.

    Returns:
        What ``tfds.load(name, split=split, ...)`` returns.

    Raises:
        DatasetUnavailableError: as in `tfds_builder`.

    Examples:
        >>> ds = fw.data.tfds_load('mnist', split='train', as_supervised=True)
    """
    return tfds_builder(name, data_dir, download).as_dataset(split=split, **as_dataset_kwargs)


def tfds_ds(name: str, split: str, batch_size: int, training: bool = True, *,
            data_dir: str | None = None, shuffle_buf_sz: int = 10_000,
            cache: bool | str = False, transform: Transform | None = None,
            batch_transform: Transform | None = None,
            augmented_epochs: int = 0, seed: int | None = None,
            deterministic: bool | None = None,
            input_context: tf.distribute.InputContext | None = None,
            download: bool = True) -> tf.data.Dataset:
    """A dataset of ``(image, label)`` batches from tensorflow-datasets.

    The same pipeline as `tfrecord_ds` after reading: cache, shuffle, repeat, augment,
    batch, prefetch. Training reads the split's files in a shuffled order; for TFRecord
    splits with ``(image, label)`` supervised keys it reads them itself, decoding as tfds
    does, so that a resumed run starts at its batch without reading the epochs before it,
    as `tfrecord_ds` does (other splits are read by tfds and replayed with ``.skip``).

    Args:
        name: a tfds name, e.g. ``'cifar10'``.
        split: e.g. ``'train'``, ``'test'``, ``'train[:90%]'``.
        batch_size: examples per batch (per replica inside an estimator input_fn).
        training: training or a single evaluation pass.
        data_dir: where tfds keeps its files. Defaults to None: tfds' default locally;
            on a TPU reached over the network (it reads only gs://),
            ``fw.io.default_root() + '/tensorflow_datasets'`` (the bucket).
        download: let tfds download and prepare the data if absent. Defaults to True.
            Without a network this fails within seconds (`DatasetUnavailableError`).
        deterministic: as in `tfrecord_ds`; so are `shuffle_buf_sz`, `cache`,
            `transform`, `batch_transform`, `augmented_epochs` and `seed`.
        input_context: a `tf.distribute.InputContext`; each input pipeline reads its own
            files of the split, or every N-th example when the split has fewer files
            than pipelines. Either way each example is read by exactly one pipeline.

    Returns:
        A `tf.data.Dataset` of ``(image, label)`` batches (labels int64 as tfds gives them).

    Examples:
        >>> ds = fw.data.tfds_ds('cifar10', 'train', 128, data_dir='gs://bucket/tfds')
    """
    options = check_record_shuffle(PipelineOptions(
        batch_size, training, shuffle_buf_sz=shuffle_buf_sz, cache=cache,
        transform=transform, batch_transform=batch_transform,
        augmented_epochs=augmented_epochs, seed=seed, deterministic=deterministic,
        input_context=input_context), "tfds_ds")
    import tensorflow_datasets as tfds  # after the checks: a bad option fails at once

    num_pipelines, pipeline_id = options.shard
    builder = tfds_builder(name, data_dir, download)
    by_file = len(builder.info.splits[split].file_instructions) >= num_pipelines
    files = _record_files(builder, split) if training else None
    if files is not None:
        if by_file:
            files = files[pipeline_id::num_pipelines]
        return _training_batches(builder, files, None if by_file else (num_pipelines,
                                                                       pipeline_id), options)
    # Sharding by example needs the same file order in every pipeline: no file shuffle
    # (the shuffle buffer still mixes examples).
    read_config = tfds.ReadConfig(input_context=input_context if by_file else None,
                                  shuffle_seed=options.seed, interleave_cycle_length=16,
                                  try_autocache=False)
    ds = builder.as_dataset(split=split, as_supervised=True,
                            shuffle_files=options.training and by_file,
                            read_config=read_config)
    if not by_file:
        ds = ds.shard(num_pipelines, pipeline_id)
    return pipeline.finish(ds, options)


def _record_files(builder: Any, split: str) -> list[tuple[str, int, int]] | None:
    """The split as ``(file, skip, take)``, if Fenwicks can read its TFRecords itself (and
    so start a resumed run at its epoch and record); None otherwise (other file formats,
    nested supervised keys): then tfds reads the split and a resume replays the data."""
    import tensorflow_datasets as tfds

    keys = builder.info.supervised_keys
    if builder.info.file_format != tfds.core.FileFormat.TFRECORD or not (
            isinstance(keys, tuple) and len(keys) == 2 and all(isinstance(k, str)
                                                                for k in keys)):
        return None
    return [(os.fspath(f.filename), f.skip,
             f.take if f.take >= 0 else f.examples_in_shard - f.skip)
            for f in builder.info.splits[split].file_instructions]


def _training_batches(builder: Any, files: list[tuple[str, int, int]],
                      shard: tuple[int, int] | None,
                      options: PipelineOptions) -> tf.data.Dataset:
    """tfds' TFRecord files through the same epoch stream as `tfrecord_ds`: each example is
    read and decoded as tfds does (``features.deserialize_example``)."""
    names, skips, takes = (list(column) for column in zip(*files, strict=True))
    source = readers.record_source(names, skips, takes, shuffle=shard is None,
                                   seed=options.seed, cycle_length=16,
                                   deterministic=options.deterministic, shard=shard)
    features, (image_key, label_key) = builder.info.features, builder.info.supervised_keys

    def parse(records: tf.data.Dataset) -> tf.data.Dataset:
        def supervised(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            example = features.deserialize_example(record)
            return example[image_key], example[label_key]

        return records.map(supervised, num_parallel_calls=pipeline.AUTOTUNE,
                           deterministic=options.deterministic)

    total = sum(takes)
    size = total if shard is None else len(range(shard[1], total, shard[0]))
    return epochs.training_batches(source, parse, size, options)


def tfds_data_dir(data_dir: str | None) -> str | None:
    """tfds' own default locally; ``<storage root>/tensorflow_datasets`` on a TPU node."""
    if data_dir is None:
        remote = tpu_is_remote()
        return fw_io.join(fw_io.default_root(), "tensorflow_datasets") if remote else None
    check_tpu_can_read(data_dir, "data_dir")
    return data_dir
