"""Where a resumed run's training input starts, without reading what comes before it.

The estimator knows how many batches a resumed run already consumed, but an input
function (``lambda params: fw.data.numpy_ds(X, y, params['batch_size'], seed=1)``) takes
no position. So the estimator calls it inside `resume_at`. Fenwicks' own training
pipelines read the request (`requested_batches`), build a dataset whose first batch is
that batch of the uninterrupted stream (computing the epoch and the offset in it rather
than reading and decoding every batch before it) and `claim` it. A dataset that nobody
claimed, a user's own pipeline, is fast-forwarded by the caller with ``.skip``.

The request is a `contextvars.ContextVar`: each call of the input function (one per input
pipeline) gets its own, and a call outside `resume_at` (the estimator's first-batch
probe, evaluation) starts at batch 0.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator

import tensorflow as tf

from fenwicks import _tf_internals


@dataclasses.dataclass
class ResumeRequest:
    """A request to start a training dataset at batch ``batches`` (0-based).

    Attributes:
        batches: batches of this input pipeline already consumed.
        claimed: datasets that Fenwicks' pipelines built to start there.
    """

    batches: int
    claimed: list[tf.data.Dataset] = dataclasses.field(default_factory=list)

    def started(self, dataset: tf.data.Dataset) -> bool:
        """Whether ``dataset`` starts at the requested batch: it is a claimed dataset,
        or one behind per-batch maps, ``prefetch`` and ``with_options`` only."""
        while not any(dataset is c for c in self.claimed):
            # Only per-batch maps, prefetch and with_options keep "batch n"; anything
            # else (unbatch, filter, zip, skip, shuffle...) changes it: fall back to .skip.
            inputs = _tf_internals.dataset_inputs(dataset)
            if not _tf_internals.maps_batches_one_to_one(dataset) or len(inputs) != 1:
                return False
            dataset = inputs[0]
        return True


_request: contextvars.ContextVar[ResumeRequest | None] = contextvars.ContextVar(
    "fenwicks_resume_request", default=None)


@contextlib.contextmanager
def resume_at(batches: int) -> Iterator[ResumeRequest]:
    """Training pipelines built inside start at batch ``batches`` of their stream.

    Examples:
        >>> X, y = np.arange(16.0).reshape(8, 2), np.arange(8)
        >>> stream = fw.data.numpy_ds(X, y, 2, seed=0)
        >>> with fw.data.position.resume_at(batches=3) as request:
        ...     resumed = fw.data.numpy_ds(X, y, 2, seed=0)
        >>> request.started(resumed)   # Fenwicks' pipelines start there themselves
        True
        >>> np.array_equal(next(iter(resumed))[1], list(stream.take(4))[3][1])
        True
        >>> with fw.data.position.resume_at(batches=3) as request:
        ...     dataset = tf.data.Dataset.range(10).batch(2)   # a user's own pipeline
        >>> if not request.started(dataset):
        ...     dataset = dataset.skip(3)   # read and drop
        >>> next(iter(dataset)).numpy()
        array([6, 7])
    """
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
        raise ValueError(f"batches={batches!r} must be an integer >= 0")
    request = ResumeRequest(batches)
    token = _request.set(request)
    try:
        yield request
    finally:
        _request.reset(token)


def requested_batches(training: bool) -> int:
    """The batch a training pipeline built now should start at (0 outside `resume_at`)."""
    request = _request.get()
    return request.batches if training and request is not None else 0


def claim(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Marks ``dataset`` as starting at the requested batch; returns it."""
    request = _request.get()
    if request is not None:
        request.claimed.append(dataset)
    return dataset
