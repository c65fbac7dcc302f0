"""Input functions to distributed datasets: checks, resume position, exact-eval padding.

A TPU (and XLA anywhere) needs static shapes, so every batch a compiled step sees has the
same per-replica batch size. Training datasets must already have it (``drop_remainder``).
Evaluation and prediction datasets may end with a partial batch: it is padded to the full
size with a boolean ``mask`` that is False on padding rows, and all-masked batches are
appended so that every replica gets a batch in the last step. Metrics ignore masked rows,
so `evaluate` sees every example exactly once.

With one input pipeline feeding R replicas (one host), `distribute_datasets_from_function`
hands the pipeline's batches out round-robin: step s gives replica r batch ``s * R + r``.
`predict` relies on this to put outputs back in input order.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from fenwicks.data import position

logger = logging.getLogger("fenwicks")

InputFn = Callable[[dict], tf.data.Dataset]


def unpack(element: Any) -> tuple[Any, Any, Any]:
    """``(features, labels, sample_weight)`` of a dataset element, by Keras's convention.

    An element is ``features`` alone, ``(features,)``, ``(features, labels)`` or
    ``(features, labels, sample_weight)``; what is absent comes back as None. The same
    function unpacks element specs. (`keras.utils.unpack_x_y_sample_weight`.)

    Example:
        >>> unpack((x, y))
        (x, y, None)
    """
    return keras.utils.unpack_x_y_sample_weight(element)


def call_input_fn(input_fn: InputFn, params: dict, what: str) -> tf.data.Dataset:
    """Calls a user input function and checks that it returned a dataset."""
    if not callable(input_fn):
        raise ValueError(f"{what} input_fn={input_fn!r} must be a callable params -> "
                         "tf.data.Dataset, e.g. lambda params: fw.data.numpy_ds(X, y, "
                         "params['batch_size'])")
    _check_takes_params(input_fn, what)
    dataset = input_fn(params)
    if not isinstance(dataset, tf.data.Dataset):
        raise ValueError(f"{what} input_fn returned {type(dataset).__name__}; it must return "
                         "a tf.data.Dataset of (features, labels) batches")
    return dataset


def _check_takes_params(input_fn: InputFn, what: str) -> None:
    try:
        signature = inspect.signature(input_fn)
    except (TypeError, ValueError):
        return  # a builtin or C callable: no signature to check
    try:
        signature.bind({})
    except TypeError:
        raise ValueError(
            f"{what} input_fn must take one argument, params (a dict; "
            f"params['batch_size'] is the per-replica batch size), but its signature is "
            f"{getattr(input_fn, '__name__', type(input_fn).__name__)}{signature}; e.g. "
            "lambda params: fw.data.numpy_ds(X, y, params['batch_size'])") from None


def explain_one_hot(labels: Any, outputs: Any, err: BaseException) -> None:
    """Raises a ValueError naming both fixes if `labels` look one-hot for `outputs`,
    which a sparse (class index) loss rejected with `err`; else returns."""
    if not (isinstance(labels, tf.Tensor) and isinstance(outputs, tf.Tensor)):
        return
    shape = labels.shape
    if (shape.rank is None or shape.rank != outputs.shape.rank or shape.rank < 2
            or shape[-1] != outputs.shape[-1] or (shape[-1] or 0) < 2):
        return
    raise ValueError(
        f"the labels have shape {shape.as_list()}, one-hot (or probabilities) over the "
        f"model's {shape[-1]} outputs, but the loss takes class indices, shape "
        f"{shape.as_list()[:-1]}. Either argmax the labels (y.argmax(axis=-1) in NumPy, "
        "or ds.map(lambda x, y: (x, tf.argmax(y, -1))) in the input_fn), or use a "
        "categorical loss: fw.train.get_model_func(build_nn, opt_func, loss_fn=lambda y, "
        "out: keras.losses.categorical_crossentropy(y, out, from_logits=True), "
        "metric_fns=...)") from err


def resumed_train_dataset(input_fn: InputFn, params: dict,
                          skip_batches: int) -> tf.data.Dataset:
    """The training dataset from batch ``skip_batches`` of its stream on (a resumed run).

    Fenwicks' own pipelines (``numpy_ds``, ``tfrecord_ds``, ``tfds_ds``), returned as they
    are or behind per-batch maps, start there directly: `fenwicks.data.position` asks them
    to, and they compute where that batch is rather than reading what comes before it.
    Any other dataset is fast-forwarded with ``.skip``, which reads and drops the batches.
    """
    if not skip_batches:
        return call_input_fn(input_fn, params, "training")
    with position.resume_at(skip_batches) as request:
        dataset = call_input_fn(input_fn, params, "training")
    if request.started(dataset):
        logger.info("fenwicks: the training input starts at batch %d directly",
                    skip_batches)
        return dataset
    if request.claimed:
        # A Fenwicks pipeline started late, but under ops that change what "batch n" is
        # (zip, unbatch, filter...): build it again from its start and replay it.
        logger.info("fenwicks: the training input_fn wraps a Fenwicks pipeline in ops "
                    "that are not per batch")
        dataset = call_input_fn(input_fn, params, "training")
    logger.info("fenwicks: the training input reads and drops %d batches to resume",
                skip_batches)
    return dataset.skip(skip_batches)


def _batch_dims(spec: Any) -> set:
    return {s.shape[0] if s.shape.rank else "scalar" for s in tf.nest.flatten(spec)}


def check_pair(spec: Any, what: str) -> None:
    """The element must be (features, labels) or (features, labels, sample_weight),
    batched."""
    if not (isinstance(spec, tuple) and len(spec) in (2, 3)):
        raise ValueError(f"{what} input_fn must yield (features, labels) pairs (or "
                         f"(features, labels, sample_weight)), but its element spec is "
                         f"{spec}; map the dataset to a tuple, e.g. "
                         "ds.map(lambda d: (d['image'], d['label']))")
    if "scalar" in _batch_dims(spec):
        raise ValueError(f"{what} input_fn yields unbatched elements ({spec}); batch it "
                         "with params['batch_size']")


def check_train_spec(spec: Any, batch_size: int) -> None:
    """Training batches: a pair with the static per-replica batch size."""
    check_pair(spec, "training")
    dims = _batch_dims(spec)
    if None in dims:
        raise ValueError(
            "training input_fn yields batches of dynamic size (batch dimension None); a "
            "compiled step (TPU, XLA) needs a static batch: use ds.batch(params['batch_size'], "
            "drop_remainder=True), and ds.repeat() so it does not run out")
    if dims != {batch_size}:
        raise ValueError(f"training input_fn yields batches of {sorted(dims)} examples per "
                         f"replica, but params['batch_size'] is {batch_size}; batch with "
                         "params['batch_size'] (the per-replica size, trn_bs / replicas)")


def check_eval_spec(spec: Any, batch_size: int, what: str) -> None:
    """Evaluation batches may be partial but never larger than the per-replica size."""
    dims = _batch_dims(spec) - {None}
    if "scalar" in dims:
        raise ValueError(f"{what} input_fn yields unbatched elements ({spec}); batch it "
                         "with params['batch_size']")
    if any(d > batch_size for d in dims):
        raise ValueError(f"{what} input_fn yields batches of {sorted(dims)} examples per "
                         f"replica, more than params['batch_size'] = {batch_size}; batch "
                         "with params['batch_size']")


def _pad_to(x: tf.Tensor, batch_size: int) -> tf.Tensor:
    extra = batch_size - tf.shape(x)[0]
    # Only the last batch is partial: full ones pass through without a copy.
    padded = tf.cond(extra > 0,
                     lambda: tf.pad(x, [[0, extra]] + [[0, 0]] * (x.shape.rank - 1)),
                     lambda: x)
    return tf.ensure_shape(padded, [batch_size] + x.shape.as_list()[1:])


def pad_and_mask(dataset: tf.data.Dataset, batch_size: int, num_replicas: int,
                 what: str) -> tf.data.Dataset:
    """(elem) -> (padded elem, mask); the number of batches becomes a multiple of replicas.

    Args:
        dataset: batches of up to `batch_size` examples (any nested structure).
        batch_size: the static per-replica batch size.
        num_replicas: replicas fed round-robin by this one pipeline.
        what: ``'evaluation'`` or ``'prediction'``, for error messages.
    """

    def pad(*elem: Any) -> tuple[Any, tf.Tensor]:
        elem = elem[0] if len(elem) == 1 else elem
        rows = tf.shape(tf.nest.flatten(elem)[0])[0]
        tf.debugging.assert_less_equal(
            rows, batch_size, message=f"{what} batch larger than params['batch_size']")
        mask = tf.range(batch_size) < rows
        return tf.nest.map_structure(lambda t: _pad_to(t, batch_size), elem), mask

    padded = dataset.map(pad, num_parallel_calls=tf.data.AUTOTUNE)
    if num_replicas == 1:
        return padded
    # Filler batches: the first batch zeroed and fully masked (works for any shapes).
    filler = padded.take(1).map(
        lambda elem, mask: (tf.nest.map_structure(tf.zeros_like, elem),
                            tf.zeros_like(mask))).repeat(num_replicas - 1)
    # Groups of R consecutive batches, dropping an incomplete last group: only fillers
    # are ever dropped, since there are R - 1 of them after the real batches.
    return (padded.concatenate(filler).batch(num_replicas, drop_remainder=True)
            .unbatch())
