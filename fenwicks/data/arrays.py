"""`numpy_ds`: numpy arrays to a tf.data pipeline, without copying them into the graph."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from fenwicks import accel
from fenwicks.data import pipeline, position
from fenwicks.data._checks import check_features, check_folds, check_labels, label_dtype
from fenwicks.data.options import PipelineOptions, Transform

# from_tensor_slices embeds the arrays as graph constants: a protobuf cannot exceed 2 GB.
_GRAPH_CONSTANT_LIMIT = 2**31 - 2**26


def numpy_ds(xs: np.ndarray, ys: np.ndarray | None, batch_size: int, training: bool = True,
             *, shuffle_buf_sz: int | None = None, seed: int | None = None,
             input_context: tf.distribute.InputContext | None = None,
             batch_transform: Transform | None = None,
             deterministic: bool | None = None, n_folds: int = 1,
             val_fold_idx: int = 0) -> tf.data.Dataset:
    """A dataset of ``(features, labels)`` batches drawn from numpy arrays.

    Only example *indices* flow through tf.data; each batch is gathered from the arrays
    with one numpy fancy-index, so arrays of any size (also > 2 GB, also `np.memmap`)
    are used in place: nothing is copied except the batch being built.

    Training data is shuffled (every epoch is a permutation of the examples), repeated
    forever and batched with ``drop_remainder`` (static shapes for TPUs). Evaluation data
    is one pass in order, the last partial batch kept, so every example is seen once.

    A resumed estimator run starts this training dataset at the batch it stopped at
    (`fenwicks.data.position`) without gathering any example before it: it computes that
    epoch's permutation from the seed and starts at the offset (on a TPU reached over the
    network, where the arrays travel in the graph, it is replayed with ``.skip``). The
    estimator uses the dataset as it is, or behind per-batch maps, ``prefetch`` and
    ``with_options``, which must be deterministic per batch (no stateful ``tf.random``:
    use `fw.transform`). Under anything else (unbatch, filter, zip, skip, ...) it is
    rebuilt and replayed with ``.skip``, as user pipelines are.

    Args:
        xs: features, ``[N, ...]``, any numeric dtype (uint8 images stay uint8).
        ys: labels ``[N]`` (integer class ids, yielded as int32) or float targets, or
            None for prediction (then the dataset yields features only).
        batch_size: examples per batch (per replica inside an estimator input_fn).
        training: training (shuffle, repeat, drop remainder) or evaluation pass.
        shuffle_buf_sz: shuffle buffer in examples. Defaults to None: all examples,
            an exact permutation (it holds indices, 8 bytes each, not the data).
        seed: makes the shuffle order and ``batch_transform`` randomness reproducible.
        input_context: a `tf.distribute.InputContext`; with several input pipelines each
            takes every ``num_input_pipelines``-th example.
        batch_transform: a function applied to each features batch, e.g. a vectorised
            augmentation from `fw.transform`.
        deterministic: keep element order under parallelism. Defaults to True when
            ``seed`` is given or ``training`` is False, else False (faster).
        n_folds: k-fold cross-validation: example ``i`` is in fold ``i % n_folds``.
            Defaults to 1 (no folds). The selected rows are copied (fancy indexing).
        val_fold_idx: the held-out fold: training reads every other fold, evaluation
            only this one. Defaults to 0.

    Returns:
        A `tf.data.Dataset` of ``(features, labels)`` (or ``features``) batches.

    Raises:
        ValueError: for arrays of different lengths, bad labels or a bad batch size.

    Examples:
        >>> train_input_func = lambda params: fw.data.numpy_ds(
        ...     X_train, y_train, batch_size=params['batch_size'], training=True)
    """
    xs = check_features(xs)
    ys = None if ys is None else check_labels(ys, len(xs))
    options = PipelineOptions(batch_size, training, shuffle_buf_sz=shuffle_buf_sz,
                              batch_transform=batch_transform, seed=seed,
                              deterministic=deterministic, input_context=input_context)
    n_folds, val_fold_idx = check_folds(n_folds, val_fold_idx, len(xs))
    if n_folds > 1:
        in_val = np.arange(len(xs)) % n_folds == val_fold_idx
        rows = np.flatnonzero(~in_val if options.training else in_val)
        xs, ys = xs[rows], None if ys is None else ys[rows]
    batch_size = options.batch_size
    num_pipelines, pipeline_id = options.shard
    local = len(range(pipeline_id, len(xs), num_pipelines))
    if options.training and local < batch_size:
        raise ValueError(
            f"batch_size={batch_size} is larger than the {local} training examples of this "
            f"input pipeline; a training batch must be full (drop_remainder), so use "
            f"batch_size <= {local}")
    first_batch = 0  # a resumed run's first batch (the constant path reads from 0)
    if _needs_graph_constants():
        batches = _constant_batches(xs, ys, options)
    else:
        first_batch = position.requested_batches(options.training)
        batches = _gathered_batches(xs, ys, options, first_batch * batch_size)
    ds = pipeline.finish(batches, options, batched=True, first_batch=first_batch)
    return position.claim(ds) if first_batch else ds


def _gathered_batches(xs: np.ndarray, ys: np.ndarray | None, options: PipelineOptions,
                      first_index: int) -> tf.data.Dataset:
    """Batches of gathered examples; training starts at example ``first_index`` of the
    endless stream of epochs (a resumed run), without gathering anything before it."""
    num_pipelines, pipeline_id = options.shard
    if options.training and options.shuffle_buf_sz is None:
        indices = _epoch_permutations(len(xs), num_pipelines, pipeline_id, options.seed,
                                      first_index)
    elif options.training:
        indices = _buffer_shuffled(len(xs), num_pipelines, pipeline_id, options.seed,
                                   options.shuffle_buf_sz, first_index)
    else:
        indices = tf.data.Dataset.range(len(xs)).shard(num_pipelines, pipeline_id)
    indices = indices.batch(options.batch_size, drop_remainder=options.training)
    static_batch = options.batch_size if options.training else None
    return indices.map(_gather_fn(xs, ys, static_batch), num_parallel_calls=tf.data.AUTOTUNE,
                       deterministic=options.deterministic)


def _epoch_permutations(n: int, num_pipelines: int, pipeline_id: int,
                        seed: int | None, first_index: int = 0) -> tf.data.Dataset:
    """This pipeline's example indices, a fresh permutation each epoch, forever, from
    index ``first_index`` of that stream on.

    One int64 tensor per epoch (8 bytes per example): a shuffle buffer of n scalar
    elements would cost ~25x that in per-element overhead. Epoch e's permutation is a
    function of (seed, e), so a resumed stream computes its epoch's permutation and
    slices it: O(1) in the steps already taken.
    """
    positions = tf.range(pipeline_id, n, num_pipelines, dtype=tf.int64)
    first_epoch, offset = divmod(first_index, len(range(pipeline_id, n, num_pipelines)))

    def permute(epoch: tf.Tensor) -> tf.Tensor:
        if seed is None:
            order = tf.random.shuffle(positions)
        else:
            order = tf.random.experimental.stateless_shuffle(
                positions, seed=tf.stack([tf.constant(seed, tf.int64), epoch]))
        # Only the resumed epoch starts late; the ones after it are whole.
        return order[tf.where(epoch == first_epoch, tf.constant(offset, tf.int64), 0):]

    return tf.data.Dataset.counter(first_epoch).map(permute).unbatch()


def _buffer_shuffled(n: int, num_pipelines: int, pipeline_id: int, seed: int | None,
                     shuffle_buf_sz: int, first_index: int) -> tf.data.Dataset:
    """Indices through a shuffle buffer, epoch after epoch, from ``first_index`` on.

    Each epoch's shuffle is seeded by (seed, epoch): a resumed stream starts at its epoch
    and skips at most one epoch of indices (integers, nothing gathered).
    """
    first_epoch, offset = divmod(first_index, len(range(pipeline_id, n, num_pipelines)))
    indices = tf.data.Dataset.range(pipeline_id, n, num_pipelines)

    def epoch(e: tf.Tensor) -> tf.data.Dataset:
        return pipeline.seeded_shuffle(indices, shuffle_buf_sz,
                                       pipeline.epoch_seed(seed, e, 0))

    return tf.data.Dataset.counter(first_epoch).flat_map(epoch).skip(offset)


# Arrays up to this size are gathered inside the graph (a copy, but no Python callback):
# a pipeline that calls back into Python makes tearing down a distributed iterator wait
# on the GIL, which took minutes per iterator on 8 logical CPUs (TF 2.21). Larger arrays
# keep the in-place numpy gather, which copies nothing but the batch.
IN_GRAPH_BYTES = 64 * 2**20


def _gather_fn(xs: np.ndarray, ys: np.ndarray | None, static_batch: int | None):
    """A tf function: batch of indices -> batch of examples (in the graph for small
    arrays, by numpy in place for large ones)."""
    y_dtype = None if ys is None else label_dtype(ys)
    if xs.nbytes + (0 if ys is None else ys.nbytes) <= IN_GRAPH_BYTES:
        return _graph_gather(xs, None if ys is None else ys.astype(y_dtype, copy=False))

    def gather(index: np.ndarray):
        if ys is None:
            return (xs[index],)
        return xs[index], ys[index].astype(y_dtype, copy=False)

    def gather_tf(index: tf.Tensor):
        dtypes = [tf.as_dtype(xs.dtype)] + ([] if ys is None else [tf.as_dtype(y_dtype)])
        out = list(tf.numpy_function(gather, [index], dtypes, stateful=False))
        out[0].set_shape([static_batch, *xs.shape[1:]])
        if ys is not None:
            out[1].set_shape([static_batch, *ys.shape[1:]])
        return out[0] if ys is None else (out[0], out[1])

    return gather_tf


def _graph_gather(xs: np.ndarray, ys: np.ndarray | None):
    features = tf.constant(xs)
    labels = None if ys is None else tf.constant(ys)

    def gather_tf(index: tf.Tensor):
        if labels is None:
            return tf.gather(features, index)
        return tf.gather(features, index), tf.gather(labels, index)

    return gather_tf


def _needs_graph_constants() -> bool:
    """A TPU reached over the network runs the input pipeline on its own host, where
    Python (numpy_function) is not available: the arrays must travel in the graph."""
    return accel.is_initialized() and accel.current().is_remote


def _constant_batches(xs: np.ndarray, ys: np.ndarray | None,
                      options: PipelineOptions) -> tf.data.Dataset:
    size = xs.nbytes + (0 if ys is None else ys.nbytes)
    if size > _GRAPH_CONSTANT_LIMIT:
        raise ValueError(
            f"xs and ys take {size / 2**30:.1f} GB; a TPU reached over the network can "
            "only receive arrays under 2 GB in the graph. Write them to gs:// with "
            "fw.data.numpy_tfrecord(...) and read them with fw.data.tfrecord_ds(...)")
    ys = None if ys is None else ys.astype(label_dtype(ys), copy=False)
    ds = tf.data.Dataset.from_tensor_slices(xs if ys is None else (xs, ys))
    num_pipelines, pipeline_id = options.shard
    ds = ds.shard(num_pipelines, pipeline_id)
    if options.training:
        n = len(range(pipeline_id, len(xs), num_pipelines))
        ds = ds.shuffle(options.shuffle_buf_sz or n, seed=options.seed,
                        reshuffle_each_iteration=True)
        ds = ds.repeat()
    return ds.batch(options.batch_size, drop_remainder=options.training)

