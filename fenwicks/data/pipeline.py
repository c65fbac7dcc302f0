"""The shared tail of every input pipeline: cache, shuffle, repeat, augment, batch, prefetch.

Order matters and is the same everywhere: decoded records are cached *before* the random
augmentation (so each epoch still gets fresh randomness), and training batches have a
static size (``drop_remainder``) because TPUs and XLA compile for fixed shapes.
"""

from __future__ import annotations

import tensorflow as tf

from fenwicks import transform as fw_transform
from fenwicks.data.options import PipelineOptions, Transform

AUTOTUNE = tf.data.AUTOTUNE


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


def finish(ds: tf.data.Dataset, options: PipelineOptions, *, batched: bool = False,
           first_batch: int = 0) -> tf.data.Dataset:
    """Cache, shuffle and repeat (training), augment, batch, prefetch, as `options` say.

    ``batched=True`` means ``ds`` already yields batches (numpy_ds gathers whole batches),
    so shuffle, repeat and batch were done upstream; its first batch is batch
    ``first_batch`` of the stream (a resumed run), which seeds ``batch_transform``.

    Examples:
        >>> from fenwicks.data.options import PipelineOptions
        >>> ds = finish(tf.data.Dataset.range(5), PipelineOptions(batch_size=2,
        ...                                                       training=False))
        >>> [batch.numpy().tolist() for batch in ds]   # evaluation keeps the last batch
        [[0, 1], [2, 3], [4]]
    """
    if first_batch and not batched:
        raise ValueError("first_batch is for streams that are batched upstream")
    seed, deterministic = options.seed, options.deterministic
    ds = cached(ds, options.cache, options.cache_suffix)
    if options.training and not batched:
        ds = ds.shuffle(options.shuffle_buf_sz, seed=seed, reshuffle_each_iteration=True)
        # augmented_epochs: run K epochs of augmentation once, cache them, cycle them.
        ds = ds.repeat(options.augmented_epochs or None)
    ds = apply_transform(ds, options.transform, seed, 0, deterministic)
    if not batched:
        ds = ds.batch(options.batch_size, drop_remainder=options.training,
                      num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    ds = apply_transform(ds, options.batch_transform, seed, 1, deterministic, first_batch)
    if options.training and options.augmented_epochs and not batched:
        ds = cached(ds, options.cache, options.cache_suffix + ".augmented").repeat()
    return prefetched(ds, deterministic)


def prefetched(ds: tf.data.Dataset, deterministic: bool) -> tf.data.Dataset:
    options = tf.data.Options()
    options.deterministic = deterministic
    return ds.with_options(options).prefetch(AUTOTUNE)


# Stands in for a graph-level seed of 0 while a seeded shuffle is built (see below).
_ZERO_GLOBAL_SEED_STAND_IN = 0x5EED


def seeded_shuffle(ds: tf.data.Dataset, buffer_size: int,
                   seed: tf.Tensor | int | None) -> tf.data.Dataset:
    """``ds.shuffle(buffer_size, seed=seed)``, also under a global seed of 0.

    TensorFlow's seed resolution compares ``(global seed, op seed)`` with ``(0, 0)`` in
    Python: with ``tf.random.set_seed(0)`` (``keras.utils.set_random_seed(0)``, which an
    estimator with ``seed=0`` calls) and an op seed that is a tensor (`epoch_seed`'s),
    building the shuffle inside a traced function raised OperatorNotAllowedInGraphError.
    The traced function's graph seed is set to a fixed stand-in while the shuffle is built.
    """
    graph = tf.compat.v1.get_default_graph()
    if tf.executing_eagerly() or seed is None or not tf.is_tensor(seed) or graph.seed != 0:
        return ds.shuffle(buffer_size, seed=seed)
    graph.seed = _ZERO_GLOBAL_SEED_STAND_IN
    try:
        return ds.shuffle(buffer_size, seed=seed)
    finally:
        graph.seed = 0


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

