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
        >>> import glob, tempfile
        >>> logdir = tempfile.mkdtemp()
        >>> writer = tf.summary.create_file_writer(logdir)
        >>> write = scalar_writer(writer)
        >>> write(tf.constant([10, 20], tf.int64),             # two loops' last steps
        ...       tf.constant([[0.9, 510.0], [0.7, 530.0]]),   # [loss, examples/s] each
        ...       tf.constant([10], tf.int64), tf.constant([0.1]))   # a learning rate
        >>> writer.flush()
        >>> [(event.step, value.tag) for path in glob.glob(logdir + '/events.*')
        ...  for event in tf.compat.v1.train.summary_iterator(path)
        ...  for value in event.summary.value]
        [(10, 'loss'), (10, 'examples_per_sec'), (20, 'loss'), (20, 'examples_per_sec'),
         (10, 'learning_rate')]
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
