"""The shared tail of every input pipeline: cache, shuffle, repeat, augment, batch, prefetch.

Order matters and is the same everywhere: decoded records are cached *before* the random
augmentation (so each epoch still gets fresh randomness), and training batches have a
static size (``drop_remainder``) because TPUs and XLA compile for fixed shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from fenwicks import transform as fw_transform
from fenwicks._checks import positive_int

AUTOTUNE = tf.data.AUTOTUNE
Transform = Callable[[tf.Tensor], tf.Tensor]


def check_cache(cache: Any) -> bool | str:
    """``False``/``None`` (no cache), ``True``/``'memory'``, or a file path (local or gs://)."""
    if cache is None or cache is False:
        return False
    if cache is True or cache == "memory":
        return True
    if isinstance(cache, str) and cache:
        return cache
    raise ValueError(f"cache={cache!r} must be False, True ('memory') or a file path "
                     "such as '/tmp/cifar_cache' or 'gs://bucket/cache/cifar'")


def check_shuffle_buffer(shuffle_buf_sz: Any) -> None:
    positive_int("shuffle_buf_sz", shuffle_buf_sz,
                 why="examples held in the shuffle buffer", allow_none=True)


def cached(ds: tf.data.Dataset, cache: bool | str, suffix: str) -> tf.data.Dataset:
    if cache is False:
        return ds
    if cache is True:
        return ds.cache()
    path = cache + suffix
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    if parent and not tf.io.gfile.exists(parent):
        tf.io.gfile.makedirs(parent)
    return ds.cache(path)


def apply_transform(ds: tf.data.Dataset, transform: Transform | None, seed: int | None,
                    salt: int, deterministic: bool, start: int = 0) -> tf.data.Dataset:
    """Maps ``transform`` over the features of each element, in parallel.

    With a seed, each element gets the stateless seed ``[index, 2 * seed + salt]`` so a
    parallel map is reproducible (stateful random ops in a parallel map are not).
    ``start`` is the index of the first element: a resumed stream counts on from there.
    """
    if transform is None:
        return ds

    def on_features(element):
        if isinstance(element, tuple):
            return (transform(element[0]), *element[1:])
        return transform(element)

    if seed is None:
        return ds.map(lambda *e: on_features(e if len(e) > 1 else e[0]),
                      num_parallel_calls=AUTOTUNE, deterministic=deterministic)

    def seeded(index, element):
        with fw_transform.seeded(tf.stack([index, tf.constant(2 * seed + salt, tf.int64)])):
            return on_features(element)

    return ds.enumerate(start).map(seeded, num_parallel_calls=AUTOTUNE, deterministic=deterministic)


def finish(ds: tf.data.Dataset, *, batch_size: int, training: bool,
           shuffle_buf_sz: int | None, cache: bool | str = False,
           transform: Transform | None = None, batch_transform: Transform | None = None,
           augmented_epochs: int = 0, seed: int | None = None, deterministic: bool = True,
           cache_suffix: str = "", batched: bool = False,
           first_batch: int = 0) -> tf.data.Dataset:
    """Cache, shuffle and repeat (training), augment, batch, prefetch.

    ``batched=True`` means ``ds`` already yields batches (numpy_ds gathers whole batches),
    so shuffle, repeat and batch were done upstream; its first batch is batch
    ``first_batch`` of the stream (a resumed run), which seeds ``batch_transform``.
    """
    if first_batch and not batched:
        raise ValueError("first_batch is for streams that are batched upstream")
    ds = cached(ds, cache, cache_suffix)
    if training and not batched:
        ds = ds.shuffle(shuffle_buf_sz, seed=seed, reshuffle_each_iteration=True)
        # augmented_epochs: run K epochs of augmentation once, cache them, cycle them.
        ds = ds.repeat(augmented_epochs or None)
    ds = apply_transform(ds, transform, seed, 0, deterministic)
    if not batched:
        ds = ds.batch(batch_size, drop_remainder=training, num_parallel_calls=AUTOTUNE,
                      deterministic=deterministic)
    ds = apply_transform(ds, batch_transform, seed, 1, deterministic, first_batch)
    if training and augmented_epochs and not batched:
        ds = cached(ds, cache, cache_suffix + ".augmented").repeat()
    return prefetched(ds, deterministic)


def prefetched(ds: tf.data.Dataset, deterministic: bool) -> tf.data.Dataset:
    options = tf.data.Options()
    options.deterministic = deterministic
    return ds.with_options(options).prefetch(AUTOTUNE)


def epoch_seed(seed: int | None, epoch: tf.Tensor, salt: int) -> tf.Tensor | None:
    """A shuffle seed for one epoch, a pure function of (seed, epoch, salt).

    tf.data's ``reshuffle_each_iteration`` draws each epoch's order from a seed generator
    that has to step through every earlier epoch; a seed computed from the epoch number
    lets a resumed run start at epoch 50 directly.
    """
    if seed is None:
        return None
    key = tf.stack([tf.constant(2 * seed + salt, tf.int64), tf.cast(epoch, tf.int64)])
    return tf.random.stateless_uniform([], seed=key, minval=None, maxval=None,
                                       dtype=tf.int64)


def check_augmented_epochs(augmented_epochs: Any, training: bool) -> int:
    if isinstance(augmented_epochs, bool) \
            or not isinstance(augmented_epochs, (int, np.integer)) \
            or augmented_epochs < 0:
        raise ValueError(f"augmented_epochs={augmented_epochs!r} must be an integer >= 0 "
                         "(0 = augment live every epoch)")
    if augmented_epochs and not training:
        raise ValueError("augmented_epochs is for training datasets; evaluation data is "
                         "not augmented. Pass augmented_epochs=0 with training=False")
    return int(augmented_epochs)


def default_deterministic(deterministic: bool | None, seed: int | None,
                          training: bool) -> bool:
    """Ordered when reproducibility is asked for (a seed) or needed (evaluation and
    prediction rows must match the input order); otherwise out of order, which is faster."""
    if deterministic is None:
        return seed is not None or not training
    return bool(deterministic)
