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

# epoch (int64 scalar tensor) -> this input pipeline's serialized records of that epoch,
# in that epoch's file order.
Source = Callable[[tf.Tensor], tf.data.Dataset]
Parse = Callable[[tf.data.Dataset], tf.data.Dataset]

_FILE_ORDER_SALT = 10  # salts: the file order and the record shuffle use different seeds
_RECORD_ORDER_SALT = 11


def file_order_seed(seed: int | None, epoch: tf.Tensor) -> tf.Tensor | None:
    return pipeline.epoch_seed(seed, epoch, _FILE_ORDER_SALT)


def training_batches(source: Source, parse: Parse, records_per_epoch: int | None, *,
                     batch_size: int, shuffle_buf_sz: int, cache: bool | str,
                     transform: pipeline.Transform | None,
                     batch_transform: pipeline.Transform | None, augmented_epochs: int,
                     seed: int | None, deterministic: bool,
                     cache_suffix: str) -> tf.data.Dataset:
    """Endless training batches (static size); a resumed run starts at its batch.

    Args:
        source: epoch -> serialized records of that epoch.
        parse: serialized records -> parsed ``(features, label)`` elements.
        records_per_epoch: records ``source`` gives per epoch, or None if unknown (then
            a resumed run is fast-forwarded by the caller with ``.skip``).
        batch_size, shuffle_buf_sz, cache, transform, batch_transform, augmented_epochs,
            seed, deterministic, cache_suffix: as in `tfrecord_ds`.
    """
    first_batch = position.requested_batches(True) if records_per_epoch else 0

    # With a cache: parsed once, in epoch 0's file order, and shared by every epoch.
    cached = pipeline.cached(parse(source(tf.constant(0, tf.int64))), cache, cache_suffix) \
        if cache else None
    after_shuffle = (lambda records: records) if cache else parse

    def epoch(e: tf.Tensor) -> tf.data.Dataset:
        records = cached if cache else source(e)
        return records.shuffle(shuffle_buf_sz,
                               seed=pipeline.epoch_seed(seed, e, _RECORD_ORDER_SALT))
    if augmented_epochs:
        records = after_shuffle(tf.data.Dataset.range(augmented_epochs).flat_map(epoch))
        ds = _augment_and_batch(records, batch_size, transform, batch_transform, seed,
                                deterministic, 0, 0)
        ds = pipeline.cached(ds, cache, cache_suffix + ".augmented").repeat()
        cycle = augmented_epochs * (records_per_epoch or 0) // batch_size
        # A resumed run re-fills the cache from its start, as the first run did.
        ds = ds.skip(first_batch % cycle) if first_batch and cycle else ds
    else:
        first_epoch, offset = divmod(first_batch * batch_size, records_per_epoch or 1)
        records = tf.data.Dataset.counter(first_epoch).flat_map(epoch).skip(offset)
        ds = _augment_and_batch(after_shuffle(records), batch_size, transform,
                                batch_transform, seed, deterministic,
                                first_batch * batch_size, first_batch)
    ds = pipeline.prefetched(ds, deterministic)
    return position.claim(ds) if first_batch else ds


def _augment_and_batch(records: tf.data.Dataset, batch_size: int,
                       transform: pipeline.Transform | None,
                       batch_transform: pipeline.Transform | None, seed: int | None,
                       deterministic: bool, first_record: int,
                       first_batch: int) -> tf.data.Dataset:
    """Per-example augmentation seeded by the record's index in the endless stream, then
    static batches, then per-batch augmentation seeded by the batch's index."""
    ds = pipeline.apply_transform(records, transform, seed, 0, deterministic, first_record)
    ds = ds.batch(batch_size, drop_remainder=True, num_parallel_calls=pipeline.AUTOTUNE,
                  deterministic=deterministic)
    return pipeline.apply_transform(ds, batch_transform, seed, 1, deterministic, first_batch)
