"""`tfrecord_ds`: TFRecord files to batches fast enough that training never waits."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from fenwicks import _checks, accel
from fenwicks import io as fw_io
from fenwicks._text import first_line
from fenwicks.data import epochs, parsers, pipeline, position, service
from fenwicks.data._checks import RecordError, check_folds
from fenwicks.data.options import PipelineOptions, RecordOptions, Transform, check_record_shuffle
from fenwicks.data.scan import FileScan, scan_tfrecord

logger = logging.getLogger("fenwicks")

Parser = Callable[[tf.Tensor], Any]
_PARSER_CHECKS = 16  # files whose first record is parsed eagerly before the pipeline runs
_PARSE_CHUNK = 256  # records parsed per call when the parser takes batches


def match_files(file_pattern: str | Sequence[str]) -> list[str]:
    """Sorted files matching a glob pattern (or a list of them), local or ``gs://``.

    Raises:
        FileNotFoundError: naming the pattern, if nothing matches.
    """
    patterns = [file_pattern] if isinstance(file_pattern, str) else list(file_pattern)
    files = sorted({f for p in patterns for f in tf.io.gfile.glob(p)})
    if not files:
        raise FileNotFoundError(
            f"file_pattern={file_pattern!r} matches no file; check the path (a sharded "
            "write to fn is read with fn + '*') and, for gs://, the bucket and credentials")
    return files


def count_records(file_pattern: str | Sequence[str], *, skip_corrupt: bool = False) -> int:
    """Records in the files matching ``file_pattern`` (e.g. for steps_per_epoch).

    Each file is walked once (cached, shared with `tfrecord_ds`), so a damaged file is
    found here, as `tfrecord_ds` would find it, not counted short in silence.

    Args:
        file_pattern: glob pattern(s), local or ``gs://``.
        skip_corrupt: count a damaged file's readable records (those before the damage),
            which is what ``tfrecord_ds(..., skip_corrupt=True)`` reads. Defaults to False:
            a damaged file is an error.

    Raises:
        FileNotFoundError: if ``file_pattern`` matches nothing.
        RecordError: naming the first damaged (truncated or corrupted) file.

    Examples:
        >>> fw.data.numpy_tfrecord('cifar/train', np.zeros((1000, 32, 32, 3), 'uint8'),
        ...                        np.arange(1000) % 10, num_shards=4)[-1]
        'cifar/train-00003-of-00004'
        >>> fw.data.count_records('cifar/train*') // 512      # steps per epoch
        1
    """
    skip_corrupt = _checks.boolean("skip_corrupt", skip_corrupt)
    scans = [scan_tfrecord(f) for f in match_files(file_pattern)]
    damaged = [s for s in scans if s.problem]
    if damaged and not skip_corrupt:
        raise RecordError(
            f"{damaged[0].path} is damaged: {damaged[0].problem}; {len(damaged)} of "
            f"{len(scans)} file(s) are damaged, so the count would be short. Re-create the "
            f"file, or pass skip_corrupt=True to count the {damaged[0].records} good "
            "record(s) before the damage (what tfrecord_ds(..., skip_corrupt=True) reads)")
    return sum(s.records for s in scans)


def tfrecord_ds(file_pattern: str | Sequence[str], parser: Parser, batch_size: int,
                training: bool = True, *, shuffle_buf_sz: int = 10_000,
                cache: bool | str = False, transform: Transform | None = None,
                batch_transform: Transform | None = None,
                augmented_epochs: int = 0, seed: int | None = None,
                deterministic: bool | None = None,
                input_context: tf.distribute.InputContext | None = None,
                skip_corrupt: bool = False, verify: bool = True,
                cycle_length: int = 16, n_folds: int = 1, val_fold_idx: int = 0,
                data_service: str | None = None,
                processing_mode: str = "distributed_epoch") -> tf.data.Dataset:
    """A dataset of ``(features, labels)`` batches from TFRecord files.

    Shards are read in parallel and interleaved, records parsed in parallel, decoded
    records optionally cached, then shuffled and repeated (training), augmented, batched
    (``drop_remainder`` when training) and prefetched. Evaluation is one pass that keeps
    the last partial batch.

    Each training epoch's file order and shuffle are seeded by (seed, epoch), so
    a resumed estimator run starts at its epoch directly and drops the records before its
    batch unparsed (`fenwicks.data.epochs`); the estimator then uses the dataset as it is,
    or behind per-batch maps, ``prefetch`` and ``with_options``, which must be
    deterministic per batch (no stateful ``tf.random``: use `fw.transform`). Under
    anything else (unbatch, filter, zip, skip, ...) it is rebuilt and replayed with
    ``.skip``, as user pipelines are.

    Args:
        file_pattern: glob pattern(s), local or ``gs://``.
        parser: serialized record -> ``(features, label)``, e.g. a lambda around
            `tfexample_numpy_image_parser`.
        batch_size: examples per batch (per replica inside an estimator input_fn).
        training: training or a single evaluation pass.
        shuffle_buf_sz: shuffle buffer in examples. Defaults to 10,000.
        cache: cache parsed records before augmentation: True (memory) or a file path
            (local or ``gs://``). Defaults to False. A file cache is reused by later runs:
            delete it when the data changes.
        transform: per-example augmentation of the features, mapped before batching.
        batch_transform: vectorised augmentation of a features batch (much cheaper).
        augmented_epochs: K > 0 augments K epochs once, caches them (as ``cache``) and
            cycles through them, for hosts too slow to augment live. Defaults to 0.
        seed: makes file order, shuffling and augmentation reproducible.
        deterministic: keep order under parallelism. Defaults to True with a seed or
            for evaluation (predictions stay in file order), else False (faster).
        input_context: a `tf.distribute.InputContext`; each input pipeline reads its own
            files (or every N-th record when there are fewer files than pipelines).
        skip_corrupt: drop damaged records (logged and counted) instead of raising.
        verify: check every file's framing and checksums up front (one sequential read,
            cached) so damage is reported with the file name. Defaults to True.
        cycle_length: files read concurrently. Defaults to 16.
        n_folds: k-fold cross-validation: split the records into this many folds
            (record ``i`` of the files in sorted order is in fold ``i % n_folds``, so
            every record is in exactly one fold). Defaults to 1 (no folds).
        val_fold_idx: with ``n_folds > 1``, the held-out fold: ``training=True`` reads
            every other fold, ``training=False`` reads only this one. Defaults to 0.
        data_service: a tf.data service dispatcher (``'grpc://host:5050'``): reading,
            parsing, augmenting and batching run on its workers, which must reach the
            files (`fenwicks.data.service`). Training only. Defaults to None: this host.
            Not deterministic, and a resumed run's input starts again at epoch 0.
        processing_mode: with ``data_service``, ``'distributed_epoch'`` (each worker
            builds whole epochs) or ``'parallel_epochs'`` (unseeded only). Defaults to
            ``'distributed_epoch'``.

    Returns:
        A `tf.data.Dataset`.

    Raises:
        FileNotFoundError: if ``file_pattern`` matches nothing.
        RecordError: for a corrupt or truncated file (without ``skip_corrupt``), or
            records the parser cannot read; the message names the file.
        ValueError: for bad arguments or labels of the wrong dtype or shape.
        ConnectionError: if no dispatcher answers at ``data_service``.

    Examples:
        >>> parser = lambda r: fw.data.tfexample_numpy_image_parser(r, 32, 32, 3)
        >>> ds = fw.data.tfrecord_ds('gs://bucket/cifar/train*', parser, 128,
        ...                          batch_transform=augment, cache=True)
        >>> fold_2 = fw.data.tfrecord_ds(fn, parser, 128, training=False, n_folds=5,
        ...                              val_fold_idx=2)
        >>> remote = fw.data.tfrecord_ds('gs://bucket/cifar/train*', parser, 128,
        ...                              data_service='grpc://10.0.0.2:5050')
    """
    options = check_record_shuffle(PipelineOptions(
        batch_size, training, shuffle_buf_sz=shuffle_buf_sz, cache=cache,
        transform=transform, batch_transform=batch_transform,
        augmented_epochs=augmented_epochs, seed=seed, deterministic=deterministic,
        input_context=input_context), "tfrecord_ds")
    reading = RecordOptions(skip_corrupt=skip_corrupt, verify=verify,
                            cycle_length=cycle_length, n_folds=n_folds,
                            val_fold_idx=val_fold_idx, data_service=data_service,
                            processing_mode=processing_mode)
    if not callable(parser):
        raise ValueError(f"parser={parser!r} must be a function: record -> (features, label)")
    if reading.data_service is not None:
        return _via_service(reading, options, lambda: _read_records(file_pattern, parser,
                                                                    options, reading))
    return _read_records(file_pattern, parser, options, reading)


def _read_records(file_pattern: str | Sequence[str], parser: Parser, options: PipelineOptions,
                  reading: RecordOptions) -> tf.data.Dataset:
    """`tfrecord_ds` on this host, from validated options."""
    num_pipelines, pipeline_id = options.shard
    check_tpu_can_read(file_pattern, "file_pattern")
    if isinstance(options.cache, str):
        check_tpu_can_read(options.cache, "cache")
    files = match_files(file_pattern)
    folds = _fold_spec(files, reading.n_folds, reading.val_fold_idx, options.training)
    by_file = len(files) >= num_pipelines
    if by_file:
        files = files[pipeline_id::num_pipelines]
        folds = folds and Folds(folds.offsets[pipeline_id::num_pipelines], *folds[1:])
    takes = _usable_records(files, reading.skip_corrupt) if reading.verify \
        else [-1] * len(files)
    batched = _check_parser(parser, files, reading.verify)
    deterministic = options.deterministic
    source = record_source(files, [0] * len(files), takes,
                           shuffle=options.training and by_file, seed=options.seed,
                           deterministic=deterministic, cycle_length=reading.cycle_length,
                           ignore_errors=not reading.counted,
                           shard=None if by_file else (num_pipelines, pipeline_id),
                           folds=folds)

    dtype = parsers.stored_dtype(files[0]) if files else None

    def parse(records: tf.data.Dataset) -> tf.data.Dataset:
        with parsers.records_dtype(dtype):  # for tfexample_numpy_image_parser(dtype=None)
            return _parse(records, parser, batched, deterministic)

    if options.training:
        # Unless TensorFlow decides what a damaged file loses, the epoch's size is known.
        size = _records_per_epoch(files, by_file, num_pipelines, pipeline_id, folds) \
            if reading.counted and position.requested_batches(True) else None
        return epochs.training_batches(source, parse, size, options)
    return pipeline.finish(parse(source(None)), options)


def _via_service(reading: RecordOptions, options: PipelineOptions,
                 build: Callable[[], tf.data.Dataset]) -> tf.data.Dataset:
    """The pipeline `build` makes, run on the tf.data service workers at
    ``reading.data_service``.

    The stream is built from its start (a worker cannot honour a mid-epoch position: each
    one builds whole epochs) and claimed as started, so the estimator does not read and
    drop the batches a resumed run already consumed.
    """
    data_service, processing_mode = reading.data_service, reading.processing_mode
    if not options.training:
        raise ValueError(f"data_service={data_service!r} is for training input; "
                         "evaluation and prediction stay on this host (exact evaluation "
                         "needs one ordered pass). Pass data_service=None with "
                         "training=False")
    service.check_processing_mode(processing_mode, options.seed)
    service.check_reachable(data_service, "data_service")
    resumed = position.requested_batches(True)
    with position.resume_at(0):
        local = build()
    ds = service.via_data_service(local, data_service, processing_mode=processing_mode)
    logger.warning("fenwicks: training input through the tf.data service at %s "
                   "(processing_mode=%r): batches arrive in the order the workers finish "
                   "them, so a seed no longer makes the order repeat, and a resumed run "
                   "starts the input again at epoch 0", data_service, processing_mode)
    if resumed:
        logger.warning("fenwicks: the tf.data service cannot start at batch %d of the "
                       "stream; this run's input starts again at epoch 0 (steps, "
                       "schedule and weights resume exactly)", resumed)
        position.claim(ds)
    return ds


def _records_per_epoch(files: list[str], by_file: bool, num_pipelines: int,
                       pipeline_id: int, folds: Folds | None = None) -> int:
    """Records this input pipeline reads per epoch (the scans are cached)."""
    counts = [scan_tfrecord(f).records for f in files]
    if folds:
        counts = [folds.kept(offset, count) for offset, count in zip(folds.offsets, counts,
                                                                     strict=True)]
    total = sum(counts)
    return total if by_file else len(range(pipeline_id, total, num_pipelines))


class Folds(NamedTuple):
    """k-fold selection: record j of a file is global record ``offsets[file] + j`` and
    belongs to fold ``(offsets[file] + j) % n_folds``."""

    offsets: list[int]
    n_folds: int
    val_fold_idx: int
    training: bool

    def kept(self, offset: int, count: int) -> int:
        """How many of records ``offset .. offset + count - 1`` this selection reads."""
        first_val = offset + (self.val_fold_idx - offset) % self.n_folds
        in_val = len(range(first_val, offset + count, self.n_folds))
        return count - in_val if self.training else in_val


def _fold_spec(files: list[str], n_folds: Any, val_fold_idx: Any,
               training: bool) -> Folds | None:
    """Validates the fold arguments; record offsets come from the (cached) file scans,
    over all files, so every input pipeline assigns a record to the same fold."""
    if n_folds == 1 and val_fold_idx == 0:
        return None
    counts = [scan_tfrecord(f).records for f in files]
    n_folds, val_fold_idx = check_folds(n_folds, val_fold_idx, sum(counts))
    if n_folds == 1:
        return None
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(int).tolist()
    return Folds(offsets, int(n_folds), int(val_fold_idx), bool(training))


def _usable_records(files: list[str], skip_corrupt: bool) -> list[int]:
    """Records to take from each file (-1 = all); raises or logs for damaged files."""
    scans = [scan_tfrecord(f) for f in files]
    damaged = [s for s in scans if s.problem]
    if damaged and not skip_corrupt:
        s = damaged[0]
        raise RecordError(
            f"{s.path} is damaged: {s.problem} (TensorFlow would fail there mid-training). "
            f"{len(damaged)} of {len(files)} file(s) are damaged. Re-create the file, or "
            f"pass skip_corrupt=True to read the {s.records} good records before the damage")
    for s in damaged:
        logger.warning("fenwicks: skipping %d record(s) of %s: %s; reading its first %d",
                       s.skipped, s.path, s.problem, s.records)
    if damaged:
        logger.warning("fenwicks: skip_corrupt skipped %d record(s) in %d file(s)",
                       sum(s.skipped for s in damaged), len(damaged))
    if sum(s.records for s in scans) == 0:  # a repeated empty dataset would spin forever
        raise RecordError(f"the {len(files)} file(s) of this input pipeline hold no readable "
                          f"record: {', '.join(files[:3])}{'...' if len(files) > 3 else ''}")
    return [s.records if s.problem else -1 for s in scans]


def _first_records(files: list[str], verify: bool) -> list[tuple[str, tuple[bytes, ...]]]:
    if verify:
        scans: list[FileScan] = [scan_tfrecord(f) for f in files[:_PARSER_CHECKS]]
        return [(s.path, s.first_records) for s in scans if s.first_records]
    records = tuple(r.numpy() for r in tf.data.TFRecordDataset(files[:1]).take(2))
    return [(files[0], records)] if records else []


def _check_parser(parser: Parser, files: list[str], verify: bool) -> bool:
    """Parses the first records of the first files eagerly: a mismatch (wrong size, wrong
    feature names, not an image) fails here, naming the file, not deep inside training.

    Returns:
        Whether ``parser`` also parses a vector of records into a batch, identically.
    """
    firsts = _first_records(files, verify)
    for path, records in firsts:
        try:
            element = parser(tf.constant(records[0]))
        except Exception as err:  # noqa: BLE001 - any parser failure is reported the same way
            raise RecordError(f"the records of {path} do not fit parser={_name(parser)}: "
                              f"{type(err).__name__}: {first_line(err)}") from err
        check_element(element, f"parser={_name(parser)} on {path}")
    pair = [r for _, records in firsts for r in records][:2]
    return len(pair) == 2 and _parses_batches(parser, pair)


def _parses_batches(parser: Parser, pair: list[bytes]) -> bool:
    """True if ``parser`` on a vector of two records equals its two single results."""
    try:
        batch = tf.nest.flatten(parser(tf.constant(pair)))
        singles = [tf.nest.flatten(parser(tf.constant(r))) for r in pair]
    except Exception:  # noqa: BLE001 - a parser for single records only: that is fine
        return False
    if len(batch) != len(singles[0]):
        return False
    return all(tuple(b.shape) == (2, *s0.shape) and np.array_equal(b.numpy(), np.stack(
        [s0.numpy(), s1.numpy()])) for b, s0, s1 in zip(batch, *singles, strict=True))


def _parse(records: tf.data.Dataset, parser: Parser, batched: bool,
           deterministic: bool) -> tf.data.Dataset:
    if not batched:
        return records.map(parser, num_parallel_calls=pipeline.AUTOTUNE,
                            deterministic=deterministic)
    # Parsing 256 records in one call costs a fraction of 256 calls (per-call overhead
    # dominates small records); unbatch then restores the per-example stream.
    chunks = records.batch(_PARSE_CHUNK).map(parser, num_parallel_calls=pipeline.AUTOTUNE,
                                             deterministic=deterministic)
    return chunks.unbatch()


def check_element(element: Any, source: str) -> None:
    """An element must be ``(features, label)`` with a scalar numeric label per example."""
    if not isinstance(element, (tuple, list)) or len(element) != 2:
        return  # features only (prediction data): nothing to check
    label = tf.convert_to_tensor(element[1])
    if not (label.dtype.is_integer or label.dtype.is_floating or label.dtype == tf.bool):
        raise ValueError(f"{source} gives labels of dtype {label.dtype.name}; labels must be "
                         "integer class ids (int32/int64) or floats")
    if label.dtype.is_integer and label.shape.rank != 0:
        raise ValueError(f"{source} gives integer labels of shape {label.shape}; each "
                         "example's class id must be a scalar (tf.reshape(label, []))")


def _name(fn: Any) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def record_source(files: list[str], skips: list[int], takes: list[int], *, shuffle: bool,
                  seed: int | None, deterministic: bool, cycle_length: int,
                  ignore_errors: bool = False,
                  shard: tuple[int, int] | None = None,
                  folds: Folds | None = None) -> epochs.Source:
    """epoch -> the serialized records of ``files`` (each from ``skip``, ``take`` of them,
    -1 = all), files read concurrently; in a file order seeded by (seed, epoch) when
    ``shuffle``. ``shard=(num, index)`` keeps every num-th record (fewer files than input
    pipelines: every pipeline must then read the files in the same order, unshuffled).
    ``folds`` keeps only the records of the training folds or of the held-out fold."""
    # No autograph: nothing to convert, and it trips over this closure (a noisy warning).
    @tf.autograph.experimental.do_not_convert
    def read(path, skip, take, offset):
        records = tf.data.TFRecordDataset(path, buffer_size=1 << 20).skip(skip).take(take)
        # Without the up-front scan, skip_corrupt falls back to TensorFlow's own skipping
        # (it stops the file at the damage and logs it, but cannot count what it lost).
        records = records.ignore_errors(log_warning=True) if ignore_errors else records
        return _in_folds(records, folds, offset + skip) if folds else records

    offsets = folds.offsets if folds else [0] * len(files)
    names = tf.data.Dataset.from_tensor_slices(
        (files, tf.constant(skips, tf.int64), tf.constant(takes, tf.int64),
         tf.constant(offsets, tf.int64)))

    def epoch_records(epoch: tf.Tensor | None) -> tf.data.Dataset:
        ordered = pipeline.seeded_shuffle(names, len(files), epochs.file_order_seed(
            seed, epoch)) if shuffle else names
        records = ordered.interleave(read, cycle_length=max(1, min(cycle_length, len(files))),
                                     num_parallel_calls=pipeline.AUTOTUNE,
                                     deterministic=deterministic)
        return records.shard(*shard) if shard else records

    return epoch_records


def _in_folds(records: tf.data.Dataset, folds: Folds, first: tf.Tensor) -> tf.data.Dataset:
    """The records whose global index (``first`` + position) is in the selected folds."""
    indexed = tf.data.Dataset.zip(tf.data.Dataset.counter(first), records)
    val_fold, n_folds = tf.constant(folds.val_fold_idx, tf.int64), folds.n_folds

    def selected(index: tf.Tensor, _record: tf.Tensor) -> tf.Tensor:
        in_val = tf.equal(index % n_folds, val_fold)
        return tf.logical_not(in_val) if folds.training else in_val

    return indexed.filter(selected).map(lambda _index, record: record)


def tpu_is_remote() -> bool:
    """True on a TPU reached over the network (a TPU node), which reads only gs://."""
    return accel.is_initialized() and accel.current().is_remote


def check_tpu_can_read(path: str | Sequence[str], name: str) -> None:
    """A TPU node (reached over the network) reads only gs://, not the notebook's disk."""
    paths = [path] if isinstance(path, str) else list(path)
    local = [p for p in paths if not fw_io.is_gcs(p)]
    if local and tpu_is_remote():
        raise ValueError(f"{name}={local[0]!r} is local, but this TPU is reached over the "
                         "network and reads only gs:// paths; copy the files to a bucket "
                         "first, e.g. fw.io.stage(local_path, project)")
