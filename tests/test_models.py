"""fw.models: parameter counts by hand (ResNet-9 at width 64 = DavidNet's 6.57M), output
shapes, float32 outputs under mixed precision, building under a 2-replica strategy."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import fenwicks as fw
from tests.conftest import shared_snippet


def conv_bn(c_in, c_out, k=3):
    """Conv without bias + BatchNorm (gamma, beta, moving mean, moving variance)."""
    return k * k * c_in * c_out + 4 * c_out


def resnet9_count(c, n_classes):
    prep = conv_bn(3, c)
    layer1 = conv_bn(c, 2 * c) + 2 * conv_bn(2 * c, 2 * c)
    layer2 = conv_bn(2 * c, 4 * c)
    layer3 = conv_bn(4 * c, 8 * c) + 2 * conv_bn(8 * c, 8 * c)
    return prep + layer1 + layer2 + layer3 + 8 * c * n_classes


def resnet_count(blocks, c, n_classes, c_in=3):
    total, width_in = conv_bn(c_in, c, k=7), c
    for stage, count in enumerate(blocks):
        width = c * 2 ** stage
        for index in range(count):
            total += conv_bn(width_in, width) + conv_bn(width, width)
            if width_in != width or (stage > 0 and index == 0):
                total += conv_bn(width_in, width, k=1)  # projection shortcut
            width_in = width
    return total + width_in * n_classes


def test_resnet9_is_davidnet_sized():
    model = fw.models.resnet9(c=64)
    assert model.count_params() == resnet9_count(64, 10)
    # DavidNet's trainable parameters, computed from its layer list by hand: 6,573,120.
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert trainable == 6_573_120
    assert model.output_shape == (None, 10)


@pytest.mark.parametrize("make,count,in_shape,out_shape", [
    (lambda: fw.models.resnet9(c=8, n_classes=5), resnet9_count(8, 5), (32, 32, 3), (5,)),
    (lambda: fw.models.mnist_net(c=4), conv_bn(1, 4) + conv_bn(4, 8) + conv_bn(8, 16)
     + 2 * 16 * 10, (28, 28, 1), (10,)),
    (lambda: fw.models.resnet((1, 1, 1, 1), c=8, n_classes=7),
     resnet_count((1, 1, 1, 1), 8, 7), (64, 64, 3), (7,)),
    (lambda: fw.models.resnet((2, 2), c=4, input_shape=(16, 16, 3)),
     resnet_count((2, 2), 4, 10), (16, 16, 3), (10,)),
    (lambda: fw.models.rnn_forecaster((24, 5), horizon=3, units=8),
     4 * (8 * (5 + 8) + 8) + 8 * 3 + 3, (24, 5), (3,)),
    # Keras GRU (reset_after=True) has two bias vectors per gate.
    (lambda: fw.models.rnn_forecaster((24, 5), horizon=2, units=6, cell="gru", num_layers=2),
     3 * (6 * (5 + 6) + 2 * 6) + 3 * (6 * (6 + 6) + 2 * 6) + 6 * 2 + 2, (24, 5), (2,)),
])
def test_counts_and_shapes(make, count, in_shape, out_shape):
    model = make()
    assert model.count_params() == count
    assert model.input_shape == (None, *in_shape)
    out = model(np.random.rand(2, *in_shape).astype("float32"), training=True)
    assert tuple(out.shape) == (2, *out_shape) and out.dtype == "float32"


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
def test_mixed_precision_float32_outputs_and_variables(policy):
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        models = [fw.models.resnet9(c=4), fw.models.mnist_net(c=2),
                  fw.models.resnet((1, 1), c=4, input_shape=(16, 16, 3)),
                  fw.models.rnn_forecaster((6, 2), units=4, cell="gru")]
        for model in models:
            x = np.random.rand(2, *model.input_shape[1:]).astype("float32")
            assert model(x, training=True).dtype == "float32", model.name
            floating = {v.dtype for v in model.variables if "int" not in v.dtype}
            assert floating == {"float32"}, model.name  # (RNNs also hold an int seed)
            assert model.layers[0].compute_dtype == policy.split("_")[1], model.name
    finally:
        keras.config.set_dtype_policy(previous)


@pytest.mark.parametrize("make,name", [
    (lambda: fw.models.resnet9(input_shape=(4, 4, 3)), "input_shape"),
    (lambda: fw.models.resnet9(input_shape=(32, 32)), "input_shape"),
    (lambda: fw.models.resnet9(c=0), "c"),
    (lambda: fw.models.resnet9(bn="ghost"), "bn"),
    (lambda: fw.models.mnist_net(n_classes=0), "n_classes"),
    (lambda: fw.models.resnet(blocks=()), "blocks"),
    (lambda: fw.models.resnet(blocks=(2, 0)), "blocks"),
    (lambda: fw.models.resnet(input_shape=(8, 8, 3)), "input_shape"),
    (lambda: fw.models.rnn_forecaster((24,)), "input_shape"),
    (lambda: fw.models.rnn_forecaster((24, 5), cell="rnn"), "cell"),
    (lambda: fw.models.rnn_forecaster((24, 5), horizon=0), "horizon"),
    (lambda: fw.models.rnn_forecaster((24, 5), drop_rate=1.5), "drop_rate"),
])
def test_bad_inputs(make, name):
    with pytest.raises(ValueError, match=name):
        make()


UNDER_STRATEGY = """
import json, numpy as np, tensorflow as tf, keras, fenwicks as fw
strategy = fw.train.tf.strategy()
keras.config.set_dtype_policy("mixed_bfloat16")
out = {"replicas": strategy.num_replicas_in_sync}
x = np.random.rand(4, 32, 32, 3).astype("float32")
per_replica = strategy.experimental_distribute_values_from_function(
    lambda ctx: tf.constant(x[2 * ctx.replica_id_in_sync_group:][:2]))
for name, build in [("resnet9", lambda: fw.models.resnet9(c=4, bn="sync")),
                    ("mnist", lambda: fw.models.mnist_net(c=2, input_shape=(32, 32, 3)))]:
    with strategy.scope():
        model = build()
    result = strategy.run(tf.function(lambda t: model(t, training=True)), args=(per_replica,))
    local = strategy.experimental_local_results(result)
    out[name] = {"mirrored": type(model.variables[0].value).__name__,
                 "dtypes": sorted({str(t.dtype.name) for t in local}),
                 "shape": list(tf.concat(local, 0).shape)}
print(json.dumps(out))
"""


UNDER_STRATEGY_RESULT = shared_snippet("cpu:2", "models", UNDER_STRATEGY)


def test_models_build_under_a_strategy_with_mixed_precision():
    out = UNDER_STRATEGY_RESULT()
    assert out["replicas"] == 2
    for name in ("resnet9", "mnist"):
        assert out[name] == {"mirrored": "MirroredVariable", "dtypes": ["float32"],
                             "shape": [4, 10]}, name
