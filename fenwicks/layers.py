"""Keras 3 building blocks: conv/dense + BatchNorm + ReLU blocks, pooling, classifier head.

Every block takes a BatchNorm mode `bn`:

* ``'replica'`` (default): statistics over each replica's own batch, as Keras does.
* ``'sync'``: statistics over the global batch, all-reduced across replicas.
* an int ``G`` ("ghost" BatchNorm): statistics over fixed groups of ``G`` consecutive
  examples. One GPU with batch 512 and ``bn=64`` computes exactly what an 8-core TPU
  with 64 examples per core and ``bn='replica'`` computes, outputs and moving statistics.

The blocks are written in `keras.ops` and run on both engines. On TensorFlow each replica
calls the model on its own batch (`tf.distribute`). On JAX the engine calls it once on the
global batch under `jax.jit`, sharded over the devices, so there ``'sync'`` is Keras's
plain BatchNorm (its mean over the global batch is the cross-replica statistic) and
``'replica'`` splits the batch into the replicas' slices, each with its own statistics,
when the engine says how many replicas share it (`batch_replicas`).

Moving statistics are created with ``aggregation='mean'``: plain Keras 3 BatchNormalization
leaves them unaggregated, so under `MirroredStrategy`/`TPUStrategy` every replica keeps its
own moving mean and only replica 0's is read and saved. With mean aggregation the replicas
stay in sync and the saved value is the mean over replicas, the same as ghost groups give.

    model = fw.Sequential()
    model.add(fw.layers.ConvBN(64, kernel_size=3, **fw.layers.PYTORCH_PARAMS))
    model.add(fw.layers.ConvResBlk(128, res_convs=2, bn=64))
    model.add(fw.layers.GlobalPools2D())
    model.add(fw.layers.Classifier(10, weight=0.125))
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

from fenwicks import _engine
from fenwicks._checks import positive_int

__all__ = ["BN_MODES", "PYTORCH_PARAMS", "BatchNorm", "Classifier", "ConvBN", "ConvBlk",
           "ConvResBlk", "DenseBN", "GlobalPools2D", "Sequential", "batch_replicas",
           "build_chain", "check_bn", "current_batch_replicas", "init_pytorch"]

_PACKAGE = "fenwicks"
_register = keras.saving.register_keras_serializable(package=_PACKAGE)
BN_MODES = ("replica", "sync")


def check_bn(bn: Any, name: str = "bn") -> str | int:
    """Validates a BatchNorm mode: ``'replica'``, ``'sync'`` or a group size (int >= 1).

    Examples:
        >>> check_bn(64)
        64
    """
    if isinstance(bn, str) and bn in BN_MODES:
        return bn
    if isinstance(bn, (int, np.integer)) and not isinstance(bn, bool) and bn >= 1:
        return int(bn)  # a NumPy integer (e.g. from np.unique) is as good as an int
    raise ValueError(f"{name}={bn!r} is not a BatchNorm mode; use 'replica' (per-replica "
                     "statistics), 'sync' (across replicas) or an int group size such as "
                     "64 (ghost BatchNorm over groups of 64 examples)")


# How many replicas' batches the batch a layer sees is made of (see `batch_replicas`).
_BATCH_REPLICAS: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "fenwicks_batch_replicas", default=None)


@contextlib.contextmanager
def batch_replicas(num_replicas: int) -> Iterator[None]:
    """Within this context the batch a model sees is `num_replicas` replicas' batches.

    For an engine that calls the model once on the global batch (the JAX engine: one
    `jax.jit` over arrays sharded across the devices) rather than once per replica
    (TensorFlow's `strategy.run`). BatchNorm's ``'replica'`` mode then computes its
    statistics over each of the `num_replicas` equal, consecutive slices of the batch,
    which is what each replica computes on the TensorFlow engine, outputs and moving
    statistics alike. Read when the step is traced: enter it around the tracing call.

    Args:
        num_replicas: replicas (devices along the batch axis) sharing the batch.

    Examples:
        >>> model = fw.models.mnist_net(input_shape=(8, 8, 1), c=4, bn=2)  # ghost BN
        >>> trainable = [v.value for v in model.trainable_variables]
        >>> non_trainable = [v.value for v in model.non_trainable_variables]
        >>> x = np.zeros((8, 8, 8, 1), 'float32')   # the global batch of 8 replicas
        >>> with fw.layers.batch_replicas(8):
        ...     outputs, state = model.stateless_call(trainable, non_trainable, x,
        ...                                           training=True)
        >>> tuple(outputs.shape)
        (8, 10)
    """
    token = _BATCH_REPLICAS.set(positive_int("num_replicas", num_replicas))
    try:
        yield
    finally:
        _BATCH_REPLICAS.reset(token)


def current_batch_replicas() -> int:
    """The replicas sharing the batch a layer sees: `batch_replicas`'s number if set,
    else the batch axis of a `keras.distribution.DataParallel` distribution on JAX (as
    Keras's own ``fit`` shards the batch), else 1 (the batch is one replica's).

    Examples:
        >>> fw.layers.current_batch_replicas()
        1
    """
    value = _BATCH_REPLICAS.get()
    if value is not None:
        return value
    return _engine.backend_facts().data_parallel_replicas() or 1


def _plain_ints(value: Any) -> Any:
    """NumPy integers (what ``len(np.unique(y))``-style code gives) as Python ints: Keras
    rejects them ("expected a positive integer") deep inside its own checks."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (tuple, list)):
        return type(value)(_plain_ints(v) for v in value)
    return value


def _unique_name(prefix: str) -> str:
    """`prefix`, `prefix_1`, ... the way Keras names layers."""
    uid = keras.backend.get_uid(prefix)
    return prefix if uid == 1 else f"{prefix}_{uid - 1}"


@_register
def init_pytorch(shape: Any, dtype: Any = None) -> Any:
    """PyTorch's default Conv2d/Linear weight initialisation: U(-1/sqrt(fan_in), +...).

    PyTorch uses kaiming_uniform with a=sqrt(5), whose bound is 1/sqrt(fan_in), with
    fan_in = kernel height * kernel width * input channels. A new Keras initializer is
    drawn on every call so layers of the same shape get different weights (a shared seeded
    instance would give them identical ones); `keras.utils.set_random_seed` still makes
    the whole model reproducible.

    Examples:
        >>> layer = keras.layers.Conv2D(64, 3, kernel_initializer=fw.layers.init_pytorch)
    """
    # VarianceScaling uniform has limit sqrt(3 * scale / fan_in): scale 1/3 gives 1/sqrt(fan_in).
    initializer = keras.initializers.VarianceScaling(scale=1.0 / 3.0, mode="fan_in",
                                                     distribution="uniform")
    return initializer(shape, dtype=dtype)


# PyTorch defaults: BatchNorm momentum 0.1 there is 0.9 here (Keras counts the other way).
PYTORCH_PARAMS: dict[str, Any] = {"kernel_initializer": init_pytorch, "bn_mom": 0.9,
                                  "bn_eps": 1e-5}


def _initializer(value: Any) -> Any:
    """A per-layer initializer: clones unseeded Keras instances (see `init_pytorch`)."""
    if isinstance(value, keras.initializers.Initializer):
        return value.__class__.from_config(value.get_config())
    return value


def _serialize_initializer(value: Any) -> Any:
    return keras.saving.serialize_keras_object(value)


def _deserialize_initializer(value: Any) -> Any:
    return keras.saving.deserialize_keras_object(value) if isinstance(value, dict) else value


@_register
class BatchNorm(keras.layers.BatchNormalization):
    """BatchNormalization with a replica / synchronized / ghost-group statistics mode.

    Args:
        mode: ``'replica'`` (statistics per replica, the Keras default), ``'sync'``
            (statistics of the global batch, all-reduced across replicas) or an int ``G``
            (ghost BatchNorm: statistics per group of ``G`` consecutive examples; the
            per-replica batch must be a multiple of ``G``). Defaults to ``'replica'``.
        momentum: moving-average momentum. Defaults to `0.99`.
        epsilon: added to the variance. Defaults to `1e-3`.
        **kwargs: passed to `keras.layers.BatchNormalization` (channels-last only for
            ghost mode).

    In training, ghost mode normalises each group by its own mean and (biased) variance
    and moves the moving statistics towards the mean over groups of those; in
    inference every mode uses the moving statistics. On JAX (one call on the global
    batch), ``'sync'`` is Keras's BatchNorm over that batch, and ``'replica'`` is ghost
    BatchNorm with one group per replica inside `batch_replicas` (else Keras's).

    Examples:
        >>> bn = fw.layers.BatchNorm(mode=64)    # 1 GPU x 512 behaves as 8 TPU cores x 64
    """

    def __init__(self, mode: str | int = "replica", momentum: float = 0.99,
                 epsilon: float = 1e-3, **kwargs: Any) -> None:
        self.mode = check_bn(mode, "mode")
        kwargs.pop("synchronized", None)
        if kwargs.get("name") is None:  # Keras's BN name, so wd exclusion patterns carry over
            kwargs["name"] = _unique_name("batch_normalization")
        # Keras synchronises only on TensorFlow (it refuses synchronized=True elsewhere);
        # on JAX the statistics of the global batch under jit are the synchronized ones.
        super().__init__(momentum=momentum, epsilon=epsilon,
                         synchronized=self.mode == "sync"
                         and _engine.backend_facts().SYNCS_BATCHNORM, **kwargs)
        if isinstance(self.mode, int) and self.axis not in (-1,):
            raise ValueError(f"axis={self.axis} is not supported with ghost BatchNorm "
                             f"(mode={self.mode}); use channels-last inputs and axis=-1")

    def add_weight(self, *args: Any, **kwargs: Any) -> Any:
        # Moving statistics: mean over replicas instead of Keras 3's unaggregated
        # per-replica copies (see the module docstring).
        if not kwargs.get("trainable", True):
            kwargs["aggregation"] = "mean"
        return super().add_weight(*args, **kwargs)

    def call(self, inputs: Any, training: Any = None, mask: Any = None) -> Any:
        group = self._group_size(inputs) if training and self.trainable else None
        if group is None:
            return super().call(inputs, training=training, mask=mask)
        if mask is not None:
            raise ValueError(f"BatchNorm mode={self.mode!r} over groups of examples does "
                             "not support masks; use mode='sync' or one replica")
        return self._ghost_call(inputs, group)

    def _group_size(self, inputs: Any) -> int | None:
        """Examples per statistics group in training, None for Keras's whole batch."""
        if isinstance(self.mode, int):
            return self.mode
        replicas = current_batch_replicas() if self.mode == "replica" else 1
        if replicas == 1:
            return None
        batch = inputs.shape[0]
        if batch is None or batch % replicas or self.axis not in (-1, len(inputs.shape) - 1):
            raise ValueError(f"BatchNorm mode='replica' over {replicas} replicas' batches "
                             f"needs a channels-last input whose batch is a known multiple "
                             f"of {replicas}; got shape {tuple(inputs.shape)} and axis="
                             f"{self.axis}. Use a global batch divisible by {replicas}")
        return batch // replicas

    def _ghost_call(self, inputs: Any, group: int) -> Any:
        ops = keras.ops
        x = ops.cast(inputs, "float32")  # statistics in float32, as Keras does
        shape = ops.shape(x)
        batch = x.shape[0]
        if batch is not None and batch % group:
            raise ValueError(f"ghost BatchNorm mode={self.mode} needs a per-replica batch "
                             f"that is a multiple of {group}; got batch {batch}. "
                             "Change the batch size or the group size")
        groups = ops.reshape(x, (-1, group, *shape[1:]))
        axes = list(range(1, len(x.shape)))  # within a group: examples and spatial dims
        mean, variance = ops.moments(groups, axes, keepdims=True)  # tf.nn.moments on TF
        # tf.nn.batch_normalization's formula, written out: keras.ops.batch_normalization
        # wants [C] statistics, these are [groups, 1, ..., C].
        inv = ops.rsqrt(variance + self.epsilon)
        if self.scale:
            inv = inv * ops.cast(self.gamma, "float32")
        offset = -mean * inv if not self.center else ops.cast(self.beta, "float32") - mean * inv
        out = groups * inv + offset
        over_groups = list(range(len(x.shape)))  # every axis but channels -> shape [C]
        self._update_moving(ops.mean(mean, axis=over_groups),
                            ops.mean(variance, axis=over_groups))
        return ops.cast(ops.reshape(out, shape), self.compute_dtype)

    def _update_moving(self, mean: Any, variance: Any) -> None:
        momentum = self.momentum
        self.moving_mean.assign(self.moving_mean * momentum + mean * (1.0 - momentum))
        self.moving_variance.assign(
            self.moving_variance * momentum + variance * (1.0 - momentum))

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.pop("synchronized", None)
        return {**config, "mode": self.mode}


def _batch_norm(bn: str | int, momentum: float, epsilon: float, dtype: Any) -> BatchNorm:
    return BatchNorm(mode=bn, momentum=momentum, epsilon=epsilon, dtype=dtype)


def build_chain(parts: list[keras.layers.Layer], shape: Any) -> Any:
    """Builds `parts` in order from `shape`; returns the output shape of the last.

    For composite layers' `build` (built from shapes, so that `from_config` and
    `build_config` restore real weights).

    Examples:
        >>> conv = keras.layers.Conv2D(64, 3, padding='same')
        >>> norm = keras.layers.BatchNormalization()
        >>> fw.layers.build_chain([conv, norm], (None, 32, 32, 3))
        (None, 32, 32, 64)
    """
    for part in parts:
        if not part.built:
            part.build(shape)
        shape = part.compute_output_shape(shape)
    return shape


class _Block(keras.layers.Layer):
    """A layer made of sublayers applied in order; subclasses register them with `_add`.

    Each sublayer is stored as an attribute, never only in a list: TensorFlow's checkpoint
    object graph follows attributes, but not the Python lists Keras 3 tracks (Keras's
    ``TrackedList`` is not a TensorFlow ``Trackable``), so a sublayer kept in a list has
    its variables in ``model.variables`` yet missing from ``tf.train.Checkpoint``.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._part_names: tuple[str, ...] = ()

    def _add(self, **parts: keras.layers.Layer) -> None:
        """Adds `parts` (name -> layer), in order, after those added before."""
        for name, part in parts.items():
            setattr(self, name, part)
        self._part_names = (*self._part_names, *parts)

    @property
    def _parts(self) -> list[keras.layers.Layer]:
        return [getattr(self, name) for name in self._part_names]

    def build(self, input_shape: Any) -> None:
        # Built from shapes so that `from_config` + `build_config` restore real weights.
        build_chain(self._parts, input_shape)

    def compute_output_shape(self, input_shape: Any) -> Any:
        shape = input_shape
        for part in self._parts:  # a residual branch keeps the shape: `_parts` decide
            shape = part.compute_output_shape(shape)
        return shape

    def _apply(self, parts: list[keras.layers.Layer], x: Any, training: Any) -> Any:
        for part in parts:
            x = part(x, training=training)
        return x

    def call(self, inputs: Any, training: Any = None) -> Any:
        return self._apply(self._parts, inputs, training)


@_register
class ConvBN(_Block):
    """Conv2D (no bias, 'same' padding) -> BatchNorm -> ReLU.

    Args:
        c: output channels.
        kernel_size: convolution window. Defaults to `3`.
        strides: convolution strides. Defaults to `1`.
        kernel_initializer: Keras initializer; `init_pytorch` for PyTorch's default.
            Defaults to `'glorot_uniform'`.
        bn_mom: BatchNorm momentum. Defaults to `0.99`.
        bn_eps: BatchNorm epsilon. Defaults to `1e-3`.
        bn: BatchNorm mode (``'replica'``, ``'sync'`` or a ghost group size). Defaults to
            ``'replica'``.

    Examples:
        >>> block = fw.layers.ConvBN(64, kernel_size=3, **fw.layers.PYTORCH_PARAMS)
    """

    def __init__(self, c: int, kernel_size: Any = 3, strides: Any = 1,
                 kernel_initializer: Any = "glorot_uniform", bn_mom: float = 0.99,
                 bn_eps: float = 1e-3, bn: str | int = "replica", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.c = positive_int("c", c)
        self.kernel_size, self.strides = _plain_ints(kernel_size), _plain_ints(strides)
        self.kernel_initializer = _deserialize_initializer(kernel_initializer)
        self.bn_mom, self.bn_eps, self.bn = bn_mom, bn_eps, check_bn(bn)
        self._add(conv=keras.layers.Conv2D(
                      self.c, self.kernel_size, strides=self.strides, padding="same",
                      use_bias=False,
                      kernel_initializer=_initializer(self.kernel_initializer),
                      dtype=self.dtype_policy),
                  norm=_batch_norm(self.bn, bn_mom, bn_eps, self.dtype_policy),
                  relu=keras.layers.ReLU(dtype=self.dtype_policy))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "c": self.c, "kernel_size": self.kernel_size,
                "strides": self.strides, "bn_mom": self.bn_mom, "bn_eps": self.bn_eps,
                "kernel_initializer": _serialize_initializer(self.kernel_initializer),
                "bn": self.bn}


@_register
class ConvBlk(_Block):
    """`convs` ConvBN layers followed by a pooling layer (2x2 max pooling by default).

    Args:
        c: output channels.
        pool: a Keras pooling layer, or None for `MaxPooling2D(2)`. Defaults to `None`.
        convs: number of ConvBN layers. Defaults to `1`.
        kernel_size, kernel_initializer, bn_mom, bn_eps, bn: as for `ConvBN`.

    Examples:
        >>> block = fw.layers.ConvBlk(128, convs=2, bn='sync')
    """

    def __init__(self, c: int, pool: Any = None, convs: int = 1, kernel_size: Any = 3,
                 kernel_initializer: Any = "glorot_uniform", bn_mom: float = 0.99,
                 bn_eps: float = 1e-3, bn: str | int = "replica", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.c, self.convs = positive_int("c", c), positive_int("convs", convs)
        self.conv_args = dict(kernel_size=_plain_ints(kernel_size), bn_mom=bn_mom, bn_eps=bn_eps,
                              bn=check_bn(bn),
                              kernel_initializer=_deserialize_initializer(kernel_initializer))
        self._add(**{f"conv_bn_{i}": ConvBN(self.c, dtype=self.dtype_policy, **self.conv_args)
                     for i in range(self.convs)})
        if isinstance(pool, dict):
            pool = keras.saving.deserialize_keras_object(pool)
        self._add(pool=pool if pool is not None else keras.layers.MaxPooling2D(
            2, dtype=self.dtype_policy))

    @property
    def conv_bns(self) -> list[ConvBN]:
        """The `convs` ConvBN layers, in order."""
        return [getattr(self, f"conv_bn_{i}") for i in range(self.convs)]

    def get_config(self) -> dict[str, Any]:
        args = {**self.conv_args,
                "kernel_initializer": _serialize_initializer(
                    self.conv_args["kernel_initializer"])}
        return {**super().get_config(), "c": self.c, "convs": self.convs,
                "pool": keras.saving.serialize_keras_object(self.pool), **args}


@_register
class ConvResBlk(ConvBlk):
    """A `ConvBlk` whose output h is returned as h + res(h), res being `res_convs` ConvBNs.

    This is the residual block of ResNet-9 ("DavidNet"): conv -> pool -> two 3x3 ConvBNs
    added back to the pooled features.

    Args:
        c: output channels.
        pool, convs, kernel_size, kernel_initializer, bn_mom, bn_eps, bn: as for `ConvBlk`.
        res_convs: ConvBN layers on the residual branch. Defaults to `2`.

    Examples:
        >>> block = fw.layers.ConvResBlk(128, res_convs=2, **fw.layers.PYTORCH_PARAMS)
    """

    def __init__(self, c: int, pool: Any = None, convs: int = 1, res_convs: int = 2,
                 **kwargs: Any) -> None:
        super().__init__(c, pool=pool, convs=convs, **kwargs)
        self.res_convs = positive_int("res_convs", res_convs)
        for i in range(self.res_convs):  # attributes, not a list: see `_Block`
            setattr(self, f"res_{i}", ConvBN(self.c, dtype=self.dtype_policy, **self.conv_args))

    @property
    def res(self) -> list[ConvBN]:
        """The residual branch's `res_convs` ConvBN layers, in order."""
        return [getattr(self, f"res_{i}") for i in range(self.res_convs)]

    def build(self, input_shape: Any) -> None:
        build_chain(self.res, build_chain(self._parts, input_shape))

    def call(self, inputs: Any, training: Any = None) -> Any:
        h = self._apply(self._parts, inputs, training)
        return h + self._apply(self.res, h, training)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "res_convs": self.res_convs}


@_register
class DenseBN(_Block):
    """Dense (no bias) -> BatchNorm -> ReLU -> optional Dropout.

    Args:
        c: units.
        kernel_initializer: Keras initializer. Defaults to `'glorot_uniform'`.
        bn_mom: BatchNorm momentum. Defaults to `0.99`.
        bn_eps: BatchNorm epsilon. Defaults to `1e-3`.
        drop_rate: dropout rate in [0, 1); 0 means no dropout layer. Defaults to `0.0`.
        bn: BatchNorm mode. Defaults to ``'replica'``.

    Examples:
        >>> block = fw.layers.DenseBN(200, drop_rate=0.5)
    """

    def __init__(self, c: int, kernel_initializer: Any = "glorot_uniform",
                 bn_mom: float = 0.99, bn_eps: float = 1e-3, drop_rate: float = 0.0,
                 bn: str | int = "replica", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not 0.0 <= drop_rate < 1.0:
            raise ValueError(f"drop_rate={drop_rate!r} must be in [0, 1)")
        self.c, self.drop_rate = positive_int("c", c), float(drop_rate)
        self.kernel_initializer = _deserialize_initializer(kernel_initializer)
        self.bn_mom, self.bn_eps, self.bn = bn_mom, bn_eps, check_bn(bn)
        self._add(dense=keras.layers.Dense(
                      self.c, use_bias=False, dtype=self.dtype_policy,
                      kernel_initializer=_initializer(self.kernel_initializer)),
                  norm=_batch_norm(self.bn, bn_mom, bn_eps, self.dtype_policy),
                  relu=keras.layers.ReLU(dtype=self.dtype_policy))
        if drop_rate > 0:
            self._add(dropout=keras.layers.Dropout(drop_rate, dtype=self.dtype_policy))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "c": self.c, "bn_mom": self.bn_mom,
                "bn_eps": self.bn_eps, "drop_rate": self.drop_rate, "bn": self.bn,
                "kernel_initializer": _serialize_initializer(self.kernel_initializer)}


@_register
class Classifier(keras.layers.Layer):
    """The classification head: Dense (no bias) to logits, multiplied by `weight`.

    Outputs float32 logits even under mixed precision (the layer's dtype defaults to
    float32): softmax and cross-entropy are sensitive to bfloat16/float16 rounding.

    Args:
        n_classes: number of classes.
        kernel_initializer: Keras initializer. Defaults to `'glorot_uniform'`.
        weight: constant (not trained) output scale; DavidNet uses 0.125 so the
            softmax starts out soft. Defaults to `1.0`.
        use_bias: add a bias. Defaults to `False`.
        **kwargs: Keras layer arguments; pass ``dtype=None`` to follow the global policy.

    Examples:
        >>> head = fw.layers.Classifier(10, weight=0.125)
    """

    def __init__(self, n_classes: int, kernel_initializer: Any = "glorot_uniform",
                 weight: float = 1.0, use_bias: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        if not math.isfinite(weight) or weight == 0:
            raise ValueError(f"weight={weight!r} must be a finite non-zero number")
        self.n_classes = positive_int("n_classes", n_classes)
        self.weight, self.use_bias = float(weight), use_bias
        self.kernel_initializer = _deserialize_initializer(kernel_initializer)
        self.dense = keras.layers.Dense(
            self.n_classes, use_bias=use_bias, dtype=self.dtype_policy,
            kernel_initializer=_initializer(self.kernel_initializer))

    def build(self, input_shape: Any) -> None:
        self.dense.build(input_shape)

    def call(self, inputs: Any) -> Any:
        return self.dense(inputs) * self.weight

    def compute_output_shape(self, input_shape: Any) -> tuple[Any, ...]:
        return (*input_shape[:-1], self.n_classes)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "n_classes": self.n_classes, "weight": self.weight,
                "use_bias": self.use_bias,
                "kernel_initializer": _serialize_initializer(self.kernel_initializer)}


@_register
class GlobalPools2D(keras.layers.Layer):
    """Concatenated global max and global average pooling: [B, H, W, C] -> [B, 2C].

    Examples:
        >>> tuple(fw.layers.GlobalPools2D()(keras.ops.ones((2, 4, 4, 3))).shape)
        (2, 6)
    """

    def call(self, inputs: Any) -> Any:
        return keras.ops.concatenate([keras.ops.max(inputs, axis=(1, 2)),
                                      keras.ops.mean(inputs, axis=(1, 2))], axis=-1)

    def compute_output_shape(self, input_shape: Any) -> tuple[Any, ...]:
        return (input_shape[0], 2 * input_shape[-1])


@_register
class Sequential(keras.Sequential):
    """A Keras Sequential model: start empty, `.add` layers, call it.

    Examples:
        >>> model = fw.Sequential()
        >>> model.add(fw.layers.ConvBN(32))
        >>> model.add(fw.layers.GlobalPools2D())
        >>> model.add(fw.layers.Classifier(10))
    """
