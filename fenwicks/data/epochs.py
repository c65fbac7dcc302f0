"""The training stream of a record source (TFRecord files, a tfds split), startable anywhere.

Epoch e reads the files in an order seeded by (seed, e) and shuffles its records with a
buffer seeded by (seed, e). tf.data's ``reshuffle_each_iteration`` would draw each epoch's
order from a generator that has to step through every earlier epoch; seeds computed from
the epoch number let a resumed run open its epoch directly. Inside that epoch it drops the
records before its position as serialized bytes: parsing comes after the shuffle buffer,
which gives the same order (a shuffle never looks at the records) and means skipped
records are read but never parsed or augmented.

With a cache, records are parsed once, in epoch 0's file order (the order the cache
holds), and every epoch shuffles the cached records. With ``augmented_epochs`` = K, the
first K epochs are augmented, batched and cached, and the stream cycles through them.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from fenwicks.data import pipeline, position
from fenwicks.data.options import PipelineOptions

# epoch (int64 scalar tensor) -> this input pipeline's serialized records of that epoch,
# in that epoch's file order.
Source = Callable[[tf.Tensor], tf.data.Dataset]
Parse = Callable[[tf.data.Dataset], tf.data.Dataset]

_FILE_ORDER_SALT = 10  # salts: the file order and the record shuffle use different seeds
_RECORD_ORDER_SALT = 11


def file_order_seed(seed: int | None, epoch: tf.Tensor) -> tf.Tensor | None:
    return pipeline.epoch_seed(seed, epoch, _FILE_ORDER_SALT)


def training_batches(source: Source, parse: Parse, records_per_epoch: int | None,
                     options: PipelineOptions) -> tf.data.Dataset:
    """Endless training batches (static size); a resumed run starts at its batch.

    Args:
        source: epoch -> serialized records of that epoch.
        parse: serialized records -> parsed ``(features, label)`` elements.
        records_per_epoch: records ``source`` gives per epoch, or None if unknown (then
            a resumed run is fast-forwarded by the caller with ``.skip``).
        options: the pipeline's settings (batch size, shuffle buffer, cache,
            augmentation, seed, ...), as `tfrecord_ds` takes them.
    """
    first_batch = position.requested_batches(True) if records_per_epoch else 0
    cache, batch_size = options.cache, options.batch_size

    # With a cache: parsed once, in epoch 0's file order, and shared by every epoch.
    cached = pipeline.cached(parse(source(tf.constant(0, tf.int64))), cache,
                             options.cache_suffix) if cache else None
    after_shuffle = (lambda records: records) if cache else parse

    def epoch(e: tf.Tensor) -> tf.data.Dataset:
        records = cached if cache else source(e)
        return pipeline.seeded_shuffle(
            records, options.shuffle_buf_sz,
            pipeline.epoch_seed(options.seed, e, _RECORD_ORDER_SALT))
    if options.augmented_epochs:
        records = after_shuffle(tf.data.Dataset.range(options.augmented_epochs).flat_map(epoch))
        ds = _augment_and_batch(records, options, 0, 0)
        ds = pipeline.cached(ds, cache, options.cache_suffix + ".augmented").repeat()
        cycle = options.augmented_epochs * (records_per_epoch or 0) // batch_size
        # A resumed run re-fills the cache from its start, as the first run did.
        ds = ds.skip(first_batch % cycle) if first_batch and cycle else ds
    else:
        first_epoch, offset = divmod(first_batch * batch_size, records_per_epoch or 1)
        records = tf.data.Dataset.counter(first_epoch).flat_map(epoch).skip(offset)
        ds = _augment_and_batch(after_shuffle(records), options, first_batch * batch_size,
                                first_batch)
    ds = pipeline.prefetched(ds, options.deterministic)
    return position.claim(ds) if first_batch else ds


def _augment_and_batch(records: tf.data.Dataset, options: PipelineOptions, first_record: int,
                       first_batch: int) -> tf.data.Dataset:
    """Per-example augmentation seeded by the record's index in the endless stream, then
    static batches, then per-batch augmentation seeded by the batch's index."""
    seed, deterministic = options.seed, options.deterministic
    ds = pipeline.apply_transform(records, options.transform, seed, 0, deterministic,
                                  first_record)
    ds = ds.batch(options.batch_size, drop_remainder=True,
                  num_parallel_calls=pipeline.AUTOTUNE, deterministic=deterministic)
    return pipeline.apply_transform(ds, options.batch_transform, seed, 1, deterministic,
                                    first_batch)
