"""Ready-made networks built from `fw.layers`.

Every builder returns a built `keras.Model` (weights exist, `count_params()` works) whose
output is float32 whatever the global mixed-precision policy. The estimator calls a
builder where its engine's variables live (on the tf engine inside its strategy's
scope, `fw.train.tf.strategy()`), so the variables are distributed.

    build_nn = lambda: fw.models.resnet9(n_classes=10, bn=64)
    model_func = fw.train.get_clf_model_func(build_nn, opt_func)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from fenwicks import layers
from fenwicks._checks import positive_int
from fenwicks.layers import check_bn

__all__ = ["ResBlock", "mnist_net", "resnet", "resnet9", "rnn_forecaster"]


def _input_shape(input_shape: Sequence[int], name: str = "input_shape") -> tuple[int, ...]:
    shape = tuple(input_shape)
    if not shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1
                        for d in shape):
        raise ValueError(f"{name}={input_shape!r} must be a tuple of positive ints, "
                         "without the batch dimension, e.g. (32, 32, 3)")
    return shape


def _image_shape(input_shape: Sequence[int], min_side: int) -> tuple[int, ...]:
    shape = _input_shape(input_shape)
    if len(shape) != 3 or min(shape[:2]) < min_side:
        raise ValueError(f"input_shape={input_shape!r} must be (height, width, channels) "
                         f"with height and width >= {min_side} for this network")
    return shape


def mnist_net(n_classes: int = 10, c: int = 32, input_shape: Sequence[int] = (28, 28, 1),
              bn: str | int = "replica") -> keras.Model:
    """The tutorial-1 MNIST network: ConvBN(c) -> ConvBlk(2c) -> ConvBlk(4c) -> pools -> logits.

    Args:
        n_classes: number of classes. Defaults to `10`.
        c: width of the first convolution. Defaults to `32`.
        input_shape: one image, without the batch dimension. Defaults to `(28, 28, 1)`.
        bn: BatchNorm mode (see `fw.layers`). Defaults to ``'replica'``.

    Returns:
        A built Keras model mapping [B, H, W, C] images to [B, n_classes] float32 logits.

    Examples:
        >>> model = fw.models.mnist_net()
        >>> tuple(model(np.zeros((1, 28, 28, 1), 'float32')).shape)
        (1, 10)
    """
    shape, bn = _image_shape(input_shape, 4), check_bn(bn)
    c, n_classes = positive_int("c", c), positive_int("n_classes", n_classes)
    params = {**layers.PYTORCH_PARAMS, "bn": bn}
    model = layers.Sequential(name="mnist_net")
    model.add(keras.Input(shape))
    model.add(layers.ConvBN(c, **params))
    model.add(layers.ConvBlk(2 * c, **params))
    model.add(layers.ConvBlk(4 * c, **params))
    model.add(layers.GlobalPools2D())
    model.add(layers.Classifier(n_classes, kernel_initializer=layers.init_pytorch))
    return model


def resnet9(n_classes: int = 10, c: int = 64, weight: float = 0.125,
            input_shape: Sequence[int] = (32, 32, 3), bn: str | int = "replica") -> keras.Model:
    """ResNet-9 ("DavidNet"), the DAWNBench CIFAR-10 winner, with PyTorch's initialisation.

    prep ConvBN(c) -> ConvResBlk(2c) -> ConvBlk(4c) -> ConvResBlk(8c) -> global max pool
    -> Classifier(weight). Weights use `init_pytorch`, BatchNorm momentum 0.9 and epsilon
    1e-5 (PyTorch's defaults), so the DavidNet recipe (`piecewise_linear` 0 -> 0.4 -> 0,
    SGD with Nesterov, wd 5e-4 * batch, reduction 'sum') carries over.

    Args:
        n_classes: number of classes. Defaults to `10`.
        c: width of the prep layer; the blocks use 2c, 4c, 8c. Defaults to `64`.
        weight: scale of the logits. Defaults to `0.125`.
        input_shape: one image. Defaults to `(32, 32, 3)`; sides must be >= 8.
        bn: BatchNorm mode. Defaults to ``'replica'``.

    Returns:
        A built Keras model with float32 logits [B, n_classes].

    Examples:
        >>> model = fw.models.resnet9(c=64)    # 6.57M parameters, as in DavidNet
    """
    shape, bn = _image_shape(input_shape, 8), check_bn(bn)
    c, n_classes = positive_int("c", c), positive_int("n_classes", n_classes)
    params = {**layers.PYTORCH_PARAMS, "bn": bn}
    model = layers.Sequential(name="resnet9")
    model.add(keras.Input(shape))
    model.add(layers.ConvBN(c, **params))
    model.add(layers.ConvResBlk(2 * c, res_convs=2, **params))
    model.add(layers.ConvBlk(4 * c, **params))
    model.add(layers.ConvResBlk(8 * c, res_convs=2, **params))
    model.add(keras.layers.GlobalMaxPooling2D())
    model.add(layers.Classifier(n_classes, kernel_initializer=layers.init_pytorch,
                                weight=weight))
    return model


@keras.saving.register_keras_serializable(package="fenwicks")
class ResBlock(keras.layers.Layer):
    """ResNet basic block: two 3x3 ConvBNs (no ReLU after the second BN) plus a shortcut.

    The shortcut is a 1x1 strided Conv + BatchNorm when the shape changes, else identity.

    Args:
        c: output channels.
        strides: stride of the first convolution. Defaults to `1`.
        bn: BatchNorm mode. Defaults to ``'replica'``.

    Examples:
        >>> block = fw.models.ResBlock(128, strides=2)
    """

    def __init__(self, c: int, strides: int = 1, bn: str | int = "replica",
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.c, self.strides = positive_int("c", c), positive_int("strides", strides)
        self.bn = bn
        policy = self.dtype_policy
        self.conv1 = layers.ConvBN(c, 3, strides=strides, bn=bn, dtype=policy)
        self.conv2 = keras.layers.Conv2D(c, 3, padding="same", use_bias=False, dtype=policy)
        self.norm2 = layers.BatchNorm(mode=bn, dtype=policy)
        # Attributes, not a list: TensorFlow's checkpoint graph does not follow the lists
        # Keras 3 tracks (see `fw.layers`). None when the shortcut is the identity.
        self.shortcut_conv: keras.layers.Layer | None = None
        self.shortcut_norm: keras.layers.Layer | None = None

    @property
    def shortcut(self) -> list[keras.layers.Layer]:
        """The projection (1x1 conv, BatchNorm) or [] for the identity; set by `build`."""
        return [p for p in (self.shortcut_conv, self.shortcut_norm) if p is not None]

    def build(self, input_shape: Any) -> None:
        if input_shape[-1] != self.c or self.strides != 1:
            policy = self.dtype_policy
            self.shortcut_conv = keras.layers.Conv2D(self.c, 1, strides=self.strides,
                                                     use_bias=False, dtype=policy)
            self.shortcut_norm = layers.BatchNorm(mode=self.bn, dtype=policy)
        layers.build_chain([self.conv1, self.conv2, self.norm2], input_shape)
        layers.build_chain(self.shortcut, input_shape)

    def call(self, inputs: Any, training: Any = None) -> Any:
        h = self.norm2(self.conv2(self.conv1(inputs, training=training)), training=training)
        skip = inputs
        for part in self.shortcut:
            skip = part(skip, training=training)
        return keras.ops.relu(h + skip)

    def compute_output_shape(self, input_shape: Any) -> Any:
        return self.conv1.compute_output_shape(input_shape)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "c": self.c, "strides": self.strides, "bn": self.bn}


def resnet(blocks: Sequence[int] = (2, 2, 2, 2), n_classes: int = 10, c: int = 64,
           input_shape: Sequence[int] = (64, 64, 3), bn: str | int = "replica") -> keras.Model:
    """A small ResNet for larger images (ResNet-18 layout by default).

    Stem: 7x7 stride-2 ConvBN(c) and 3x3 stride-2 max pooling; then one stage per entry
    of `blocks` with `ResBlock`s of width c, 2c, 4c, ... (each stage after the first
    halves the resolution); global average pooling; float32 logits.

    Args:
        blocks: residual blocks per stage; (2, 2, 2, 2) is ResNet-18, (1, 1, 1, 1) a
            ResNet-10. Defaults to `(2, 2, 2, 2)`.
        n_classes: number of classes. Defaults to `10`.
        c: width of the stem and first stage. Defaults to `64`.
        input_shape: one image; sides >= 4 * 2**len(blocks). Defaults to `(64, 64, 3)`.
        bn: BatchNorm mode. Defaults to ``'replica'``.

    Returns:
        A built Keras model with float32 logits [B, n_classes].

    Examples:
        >>> model = fw.models.resnet((1, 1, 1, 1), n_classes=102, input_shape=(128, 128, 3))
    """
    if not blocks or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                         for b in blocks):
        raise ValueError(f"blocks={blocks!r} must be a non-empty sequence of positive ints, "
                         "e.g. (2, 2, 2, 2) for ResNet-18")
    shape, bn = _image_shape(input_shape, 2 ** (len(blocks) + 1)), check_bn(bn)
    c, n_classes = positive_int("c", c), positive_int("n_classes", n_classes)
    model = layers.Sequential(name=f"resnet{2 + 2 * sum(blocks)}")
    model.add(keras.Input(shape))
    model.add(layers.ConvBN(c, kernel_size=7, strides=2, bn=bn))
    model.add(keras.layers.MaxPooling2D(3, strides=2, padding="same"))
    for stage, count in enumerate(blocks):
        for index in range(count):
            strides = 2 if stage > 0 and index == 0 else 1
            model.add(ResBlock(c * 2 ** stage, strides=strides, bn=bn))
    model.add(keras.layers.GlobalAveragePooling2D())
    model.add(layers.Classifier(n_classes))
    return model


def rnn_forecaster(input_shape: Sequence[int], horizon: int = 1, units: int = 32,
                   cell: str = "lstm", num_layers: int = 1,
                   drop_rate: float = 0.0) -> keras.Model:
    """A GRU/LSTM forecaster for multivariate time series (the weather tutorial).

    Reads a window [B, T, F] and predicts the next `horizon` values of one target series
    as [B, horizon] float32 (the head runs in float32 even under mixed precision).

    Args:
        input_shape: (T, F): window length and number of features.
        horizon: future steps predicted. Defaults to `1`.
        units: hidden units per recurrent layer. Defaults to `32`.
        cell: ``'lstm'`` or ``'gru'``. Defaults to ``'lstm'``.
        num_layers: stacked recurrent layers. Defaults to `1`.
        drop_rate: dropout on the recurrent layers' inputs, in [0, 1). Defaults to `0.0`.

    Returns:
        A built Keras model [B, T, F] -> [B, horizon].

    Examples:
        >>> model = fw.models.rnn_forecaster((120, 14), horizon=12, cell='gru')
    """
    shape = _input_shape(input_shape)
    if len(shape) != 2:
        raise ValueError(f"input_shape={input_shape!r} must be (timesteps, features)")
    rnn = {"lstm": keras.layers.LSTM, "gru": keras.layers.GRU}.get(cell)
    if rnn is None:
        raise ValueError(f"cell={cell!r} must be 'lstm' or 'gru'")
    if not 0.0 <= drop_rate < 1.0:
        raise ValueError(f"drop_rate={drop_rate!r} must be in [0, 1)")
    horizon, units = positive_int("horizon", horizon), positive_int("units", units)
    num_layers = positive_int("num_layers", num_layers)
    model = layers.Sequential(name=f"{cell}_forecaster")
    model.add(keras.Input(shape))
    for index in range(num_layers):
        model.add(rnn(units, dropout=drop_rate, return_sequences=index < num_layers - 1))
    model.add(keras.layers.Dense(horizon, dtype="float32"))
    return model
