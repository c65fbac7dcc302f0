"""The input pipelines' settings: typed, frozen dataclasses, validated once when made.

`numpy_ds`, `tfrecord_ds` and `tfds_ds` keep their keyword arguments (the public call
shapes); each turns them into a `PipelineOptions` first, so a bad value fails before any
file is read, and the parts below (`pipeline.finish`, `epochs.training_batches`, the tfds
reader) take that one object instead of a dozen loose parameters. `tfrecord_ds`' own
settings (damaged files, interleaving, folds, the tf.data service) are a `RecordOptions`.

A leaf of `fenwicks.data`: it imports only the shared argument checks, as the estimator's
`EstimatorConfig` does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from fenwicks import _checks
from fenwicks.data._checks import check_batch_size, pipeline_shard

# A per-example or per-batch augmentation of the features (e.g. from `fw.transform`).
Transform = Callable[[tf.Tensor], tf.Tensor]

DEFAULT_SHUFFLE_BUFFER = 10_000  # examples; numpy_ds shuffles all of them by default
_SERVICE_MODE = "distributed_epoch"  # the tf.data service's default processing_mode


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


def check_augmented_epochs(augmented_epochs: Any, training: bool) -> int:
    if not _checks.is_int(augmented_epochs) or augmented_epochs < 0:
        raise ValueError(f"augmented_epochs={augmented_epochs!r} must be an integer >= 0 "
                         "(0 = augment live every epoch)")
    if augmented_epochs and not training:
        raise ValueError("augmented_epochs is for training datasets; evaluation data is "
                         "not augmented. Pass augmented_epochs=0 with training=False")
    return int(augmented_epochs)


def _check_transform(name: str, transform: Any) -> Transform | None:
    if transform is not None and not callable(transform):
        raise ValueError(f"{name}={transform!r} must be a function of the features (e.g. "
                         "fw.transform.random_flip) or None")
    return transform


def default_deterministic(deterministic: bool | None, seed: int | None,
                          training: bool) -> bool:
    """Ordered when reproducibility is asked for (a seed) or needed (evaluation and
    prediction rows must match the input order); otherwise out of order, which is faster."""
    if deterministic is None:
        return seed is not None or not training
    return _checks.boolean("deterministic", deterministic)


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """What every input pipeline does after reading: cache, shuffle, augment, batch.

    The arguments are those of `tfrecord_ds` (see there for each one's meaning); after
    validation ``cache`` is False, True or a path and ``deterministic`` is a bool (its
    default resolved from ``seed`` and ``training``).

    Raises:
        ValueError: a setting out of range, named as the pipeline's argument.

    Examples:
        >>> options = PipelineOptions(batch_size=128, training=True, seed=1)
        >>> options.deterministic, options.cache_suffix
        (True, '')
    """

    batch_size: int
    training: bool = True
    shuffle_buf_sz: int | None = DEFAULT_SHUFFLE_BUFFER
    cache: bool | str = False
    transform: Transform | None = None
    batch_transform: Transform | None = None
    augmented_epochs: int = 0
    seed: int | None = None
    deterministic: bool | None = None
    input_context: tf.distribute.InputContext | None = None

    def __post_init__(self) -> None:
        training = _checks.boolean("training", self.training)
        seed = _checks.seed(self.seed)
        checked = {
            "batch_size": check_batch_size(self.batch_size),
            "training": training,
            "shuffle_buf_sz": _checks.positive_int(
                "shuffle_buf_sz", self.shuffle_buf_sz,
                why="examples held in the shuffle buffer", allow_none=True),
            "cache": check_cache(self.cache),
            "transform": _check_transform("transform", self.transform),
            "batch_transform": _check_transform("batch_transform", self.batch_transform),
            "augmented_epochs": check_augmented_epochs(self.augmented_epochs, training),
            "seed": seed,
            "deterministic": default_deterministic(self.deterministic, seed, training),
        }
        for name, value in checked.items():  # normalised; still frozen
            object.__setattr__(self, name, value)

    @property
    def shard(self) -> tuple[int, int]:
        """``(num_input_pipelines, input_pipeline_id)``; ``(1, 0)`` without a context."""
        return pipeline_shard(self.input_context)

    @property
    def cache_suffix(self) -> str:
        """Appended to a cache file's path, so input pipelines never share a cache file."""
        num, index = self.shard
        return f"-{index}-of-{num}" if num > 1 else ""


def check_record_shuffle(options: PipelineOptions, pipeline: str) -> PipelineOptions:
    """`options`, if a stream of records can follow them: its shuffle needs a buffer size.

    ``shuffle_buf_sz=None`` means "every example" to `numpy_ds`, which holds only indices;
    a stream of records would have to hold the whole dataset in memory.
    """
    if options.training and options.shuffle_buf_sz is None:
        raise ValueError(f"shuffle_buf_sz=None shuffles every example at once, which "
                         f"numpy_ds can do but {pipeline} cannot (its buffer holds the "
                         f"records themselves); give a number of examples, e.g. "
                         f"shuffle_buf_sz={DEFAULT_SHUFFLE_BUFFER}")
    return options


@dataclasses.dataclass(frozen=True)
class RecordOptions:
    """How `tfrecord_ds` reads its files (see there for each setting's meaning).

    ``n_folds`` and ``val_fold_idx`` are checked against the number of records later,
    once the files are scanned; the tf.data service's address and ``processing_mode``
    are checked against the seed where the service is reached (`fenwicks.data.service`).

    Raises:
        ValueError: a setting out of range, named as `tfrecord_ds`' argument.

    Examples:
        >>> RecordOptions(n_folds=5, val_fold_idx=2).n_folds
        5
    """

    skip_corrupt: bool = False
    verify: bool = True
    cycle_length: int = 16
    n_folds: int = 1
    val_fold_idx: int = 0
    data_service: str | None = None
    processing_mode: str = _SERVICE_MODE

    def __post_init__(self) -> None:
        if self.data_service is None and self.processing_mode != _SERVICE_MODE:
            raise ValueError(f"processing_mode={self.processing_mode!r} applies to a tf.data "
                             "service; pass data_service='grpc://host:port' too, or drop it")
        checked = {
            "skip_corrupt": _checks.boolean("skip_corrupt", self.skip_corrupt),
            "verify": _checks.boolean("verify", self.verify),
            "cycle_length": _checks.positive_int("cycle_length", self.cycle_length,
                                                 why="files read concurrently"),
        }
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @property
    def counted(self) -> bool:
        """Whether Fenwicks knows every record read: not when TensorFlow skips damage."""
        return not (self.skip_corrupt and not self.verify)
