"""TensorBoard's scalars for training, written with TensorFlow's summary writer on both
engines (TensorBoard reads its event files; ``tf.summary`` writes them, also to
``gs://``). Writing a scalar is a TensorFlow op; written after each training loop they
would cost a call per loop (a millisecond or more, what a small model's loop of ten steps
can take on a CPU), so `scalar_writer` writes any number of loops' scalars in one
compiled call.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import tensorflow as tf

# One compiled writer per summary writer, kept across `train` calls: each call's
# TrainSummaries would otherwise trace it again.
_SCALAR_WRITERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def scalar_writer(writer: Any) -> Callable[..., None]:
    """``write(steps, [[loss, examples/s], ...], rate_steps, rates)``: the scalars of any
    number of training loops in one compiled call (one trace: the lengths are dynamic),
    for `fenwicks.train.progress.TrainSummaries`.

    Examples:
        >>> write = scalar_writer(tf.summary.create_file_writer('/tmp/run/train'))
        >>> write(steps, values, rate_steps, rates)
    """
    if writer in _SCALAR_WRITERS:
        return _SCALAR_WRITERS[writer]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64),
                                  tf.TensorSpec([None, 2], tf.float32),
                                  tf.TensorSpec([None], tf.int64),
                                  tf.TensorSpec([None], tf.float32)])
    def write(steps: tf.Tensor, values: tf.Tensor, rate_steps: tf.Tensor,
              rates: tf.Tensor) -> None:
        with writer.as_default():
            for i in tf.range(tf.shape(steps)[0]):
                with tf.name_scope("/"):  # the loop's own scope would prefix the tags
                    tf.summary.scalar("loss", values[i, 0], step=steps[i])
                    tf.summary.scalar("examples_per_sec", values[i, 1], step=steps[i])
            for i in tf.range(tf.shape(rate_steps)[0]):
                with tf.name_scope("/"):
                    tf.summary.scalar("learning_rate", rates[i], step=rate_steps[i])

    _SCALAR_WRITERS[writer] = write
    return write
