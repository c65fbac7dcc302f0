"""fw.layers: shapes and parameter counts by hand, PyTorch initialisation, pooling and
classifier values against numpy, the three BatchNorm modes (ghost groups of 64 on one
replica == 8 replicas x 64), serialization and bad inputs."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import fenwicks as fw
from tests.conftest import shared_snippet

L = fw.layers


def built(layer, shape):
    model = fw.Sequential([keras.Input(shape), layer])
    return model


def bn_params(c):
    return 4 * c  # gamma, beta, moving mean, moving variance


@pytest.mark.parametrize("make,shape,out_shape,params", [
    (lambda: L.ConvBN(8), (6, 6, 3), (6, 6, 8), 3 * 3 * 3 * 8 + bn_params(8)),
    (lambda: L.ConvBN(8, kernel_size=1, strides=2), (6, 6, 3), (3, 3, 8), 3 * 8 + bn_params(8)),
    (lambda: L.ConvBlk(8, convs=2), (6, 6, 3), (3, 3, 8),
     27 * 8 + bn_params(8) + 72 * 8 + bn_params(8)),
    (lambda: L.ConvResBlk(8, res_convs=2), (6, 6, 3), (3, 3, 8),
     27 * 8 + bn_params(8) + 2 * (72 * 8 + bn_params(8))),
    (lambda: L.DenseBN(5, drop_rate=0.5), (7,), (5,), 7 * 5 + bn_params(5)),
    (lambda: L.Classifier(10, weight=0.125), (16,), (10,), 16 * 10),
    (lambda: L.Classifier(10, use_bias=True), (16,), (10,), 16 * 10 + 10),
    (lambda: L.GlobalPools2D(), (5, 5, 6), (12,), 0),
])
def test_shapes_and_parameter_counts(make, shape, out_shape, params):
    model = built(make(), shape)
    assert model.output_shape == (None, *out_shape)
    assert model.count_params() == params
    out = model(np.random.rand(2, *shape).astype("float32"))
    assert tuple(out.shape) == (2, *out_shape)


def test_init_pytorch_bounds_and_independence():
    a, b = keras.layers.Dense(300, kernel_initializer=L.init_pytorch), \
        keras.layers.Dense(300, kernel_initializer=L.init_pytorch)
    a.build((None, 400))
    b.build((None, 400))
    # float32 weights: their bound is 1/sqrt(fan_in) rounded to float32 (0.05 rounds up,
    # to 0.0500000007, and a draw may round to it: a CI run once drew exactly that).
    bound = np.float32(1 / np.sqrt(400))
    w = a.kernel.numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.99 * bound
    assert w.std() == pytest.approx(bound / np.sqrt(3), rel=0.02)  # U(-b, b) has std b/sqrt3
    assert not np.allclose(w, b.kernel.numpy())  # two layers, two draws
    conv = L.ConvBN(16, **L.PYTORCH_PARAMS)
    built(conv, (8, 8, 4))
    assert np.abs(conv.conv.kernel.numpy()).max() <= np.float32(1 / np.sqrt(3 * 3 * 4))
    assert (conv.norm.momentum, conv.norm.epsilon) == (0.9, 1e-5)


def test_global_pools_and_classifier_values():
    x = np.random.RandomState(1).randn(3, 4, 5, 6).astype("float32")
    pooled = L.GlobalPools2D()(x).numpy()
    np.testing.assert_allclose(pooled, np.concatenate([x.max((1, 2)), x.mean((1, 2))], -1),
                               rtol=1e-6)
    head = L.Classifier(4, weight=0.125)
    logits = head(pooled).numpy()
    np.testing.assert_allclose(logits, pooled @ head.dense.kernel.numpy() * 0.125,
                               rtol=1e-5, atol=1e-6)


def test_dense_bn_inference_and_dropout():
    block = L.DenseBN(64, drop_rate=0.5, bn_eps=1e-3)
    x = np.random.RandomState(2).randn(8, 5).astype("float32")
    inference = block(x, training=False).numpy()
    kernel = block.dense.kernel.numpy()
    # Fresh moving statistics are mean 0, variance 1; gamma 1, beta 0.
    np.testing.assert_allclose(inference, np.maximum(x @ kernel / np.sqrt(1 + 1e-3), 0),
                               rtol=1e-5, atol=1e-6)
    trained = block(x, training=True).numpy()
    assert 0.3 < (trained == 0).mean() < 0.8  # ReLU zeros plus about half dropped


def test_res_block_adds_the_residual_branch():
    block = L.ConvResBlk(4, res_convs=1)
    x = np.random.RandomState(3).randn(2, 4, 4, 3).astype("float32")
    out = block(x, training=False).numpy()
    h = block.pool(block.conv_bns[0](x, training=False))
    np.testing.assert_allclose(out, (h + block.res[0](h, training=False)).numpy(), rtol=1e-6)


def test_ghost_batch_norm_by_hand():
    x = np.random.RandomState(4).randn(12, 2, 2, 3).astype("float32") * [1.0, 5.0, 0.1]
    bn = L.BatchNorm(mode=4, momentum=0.9, epsilon=1e-3)
    out = bn(x, training=True).numpy()
    groups = x.reshape(3, 4 * 2 * 2, 3).astype(np.float64)
    mean, var = groups.mean(1), groups.var(1)
    ref = (groups - mean[:, None]) / np.sqrt(var[:, None] + 1e-3)
    np.testing.assert_allclose(out, ref.reshape(x.shape), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bn.moving_mean.numpy(), 0.1 * mean.mean(0), rtol=1e-5)
    np.testing.assert_allclose(bn.moving_variance.numpy(), 0.9 + 0.1 * var.mean(0),
                               rtol=1e-5)
    # Inference uses the moving statistics, whatever the mode.
    np.testing.assert_allclose(bn(x, training=False).numpy(),
                               (x - bn.moving_mean.numpy())
                               / np.sqrt(bn.moving_variance.numpy() + 1e-3),
                               rtol=1e-4, atol=1e-5)


def test_batch_norm_names_match_keras_patterns():
    model = fw.models.mnist_net(c=2)
    paths = [v.path for v in model.trainable_variables if "gamma" in v.path]
    assert paths and all("batch_normalization" in p for p in paths)


def test_serialization_round_trip(tmp_path):
    model = fw.Sequential([keras.Input((8, 8, 3)), L.ConvBN(4, bn=2, **L.PYTORCH_PARAMS),
                           L.ConvResBlk(8, bn="sync"), L.GlobalPools2D(),
                           L.DenseBN(6, drop_rate=0.2), L.Classifier(3, weight=0.5)])
    x = np.random.rand(4, 8, 8, 3).astype("float32")
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), rtol=1e-6)
    assert loaded.layers[0].bn == 2 and loaded.layers[1].conv_args["bn"] == "sync"


@pytest.mark.parametrize("make,name", [
    (lambda: L.ConvBN(8, bn="ghost"), "bn"), (lambda: L.ConvBN(8, bn=0), "bn"),
    (lambda: L.DenseBN(8, bn=True), "bn"), (lambda: L.BatchNorm(mode="batch"), "mode"),
    (lambda: L.ConvBN(0), "c"), (lambda: L.ConvBlk(8, convs=0), "convs"),
    (lambda: L.ConvResBlk(8, res_convs=-1), "res_convs"),
    (lambda: L.DenseBN(8, drop_rate=1.0), "drop_rate"),
    (lambda: L.Classifier(10, weight=float("nan")), "weight"),
    (lambda: L.Classifier(0), "n_classes"),
    (lambda: L.BatchNorm(mode=4, axis=1), "axis"),
])
def test_bad_inputs(make, name):
    with pytest.raises(ValueError, match=name):
        make()


def test_ghost_group_must_divide_the_batch():
    with pytest.raises(ValueError, match="multiple of 64"):
        L.BatchNorm(mode=64)(np.zeros((96, 3), "float32"), training=True)


EIGHT_REPLICAS = """
import json, numpy as np, tensorflow as tf, keras, fenwicks as fw
strategy = fw.train.tf.strategy()
rng = np.random.RandomState(0)
x = (rng.randn(512, 4, 4, 3) * np.linspace(0.2, 5.0, 512)[:, None, None, None]
     ).astype("float32")

def per_replica(a):  # replica r gets examples 64r .. 64r + 63, like an 8-core TPU
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(a[64 * ctx.replica_id_in_sync_group:][:64]))

def run(block, strategy, data, steps=2):
    step = tf.function(lambda b: strategy.run(lambda t: block(t, training=True), args=(b,)))
    for _ in range(steps):
        out = step(data)
    out = tf.concat(strategy.experimental_local_results(out), 0).numpy()
    norm = block if isinstance(block, keras.layers.BatchNormalization) else block.norm
    return out, norm.moving_mean.numpy(), norm.moving_variance.numpy()

def as_json(result):
    return [r.tolist() for r in result]

with strategy.scope():
    replica_bn = fw.layers.BatchNorm(momentum=0.5)
    sync_bn = fw.layers.BatchNorm(mode="sync", momentum=0.5)
    keras_bn = keras.layers.BatchNormalization(momentum=0.5)
    conv8 = fw.layers.ConvBN(5, bn="replica", bn_mom=0.5)
    conv8.build((None, 4, 4, 3))
one = tf.distribute.get_strategy()  # default: the whole batch of 512 on one device
ghost_bn = fw.layers.BatchNorm(mode=64, momentum=0.5)
conv1 = fw.layers.ConvBN(5, bn=64, bn_mom=0.5)
conv1.build((None, 4, 4, 3))
conv1.set_weights(conv8.get_weights())
out = {"replicas": strategy.num_replicas_in_sync,
       "replica": as_json(run(replica_bn, strategy, per_replica(x))),
       "sync": as_json(run(sync_bn, strategy, per_replica(x))),
       "keras": as_json(run(keras_bn, strategy, per_replica(x))),
       "ghost": as_json(run(ghost_bn, one, tf.constant(x))),
       "conv8": as_json(run(conv8, strategy, per_replica(x))),
       "conv1": as_json(run(conv1, one, tf.constant(x)))}
print(json.dumps(out))
"""


def _reference(x, groups, momentum=0.5, eps=1e-3, steps=2):
    """Normalised outputs and moving statistics after `steps` identical steps, by hand."""
    g = x.reshape(groups, -1, x.shape[-1]).astype(np.float64)
    mean, var = g.mean(1), g.var(1)
    out = ((g - mean[:, None]) / np.sqrt(var[:, None] + eps)).reshape(x.shape)
    moving_mean, moving_var = np.zeros(x.shape[-1]), np.ones(x.shape[-1])
    for _ in range(steps):  # the mean over groups (replicas) of each group's statistics
        moving_mean = momentum * moving_mean + (1 - momentum) * mean.mean(0)
        moving_var = momentum * moving_var + (1 - momentum) * var.mean(0)
    return out, moving_mean, moving_var


EIGHT_REPLICAS_RESULT = shared_snippet("cpu:8", "layers", EIGHT_REPLICAS)


def test_batch_norm_modes_on_eight_replicas():
    """Ghost groups of 64 on one device == 8 replicas x 64 with per-replica statistics,
    outputs and moving statistics; 'sync' == statistics of the whole global batch."""
    res = EIGHT_REPLICAS_RESULT()
    assert res["replicas"] == 8
    rng = np.random.RandomState(0)
    x = (rng.randn(512, 4, 4, 3) * np.linspace(0.2, 5.0, 512)[:, None, None, None]
         ).astype("float32")
    per_group, whole = _reference(x, 8), _reference(x, 1)
    for mode, ref in (("replica", per_group), ("ghost", per_group), ("sync", whole)):
        for got, want in zip(res[mode], ref, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=mode)
    # Plain Keras 3 BatchNormalization normalises per replica too, but keeps each replica's
    # moving statistics apart and reports replica 0's: why fw.layers.BatchNorm aggregates.
    np.testing.assert_allclose(res["keras"][0], per_group[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(res["keras"][1], _reference(x[:64], 1)[1], rtol=1e-4,
                               atol=1e-4)
    # The same through a block: ConvBN(bn=64) on one device == ConvBN on 8 replicas.
    for got, want in zip(res["conv1"], res["conv8"], strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert not np.allclose(res["conv8"][1], 0)  # the statistics did move


def test_numpy_integers_work_wherever_an_int_is_asked():
    """`len(np.unique(y))`-style code gives NumPy integers; Keras rejects them itself."""
    layers = [fw.layers.ConvBN(np.int64(3), kernel_size=np.int64(3), strides=np.int32(1),
                               bn=np.int64(2)),
              fw.layers.ConvBlk(np.int32(4), convs=np.int64(2), kernel_size=(np.int64(3), 3)),
              fw.layers.ConvResBlk(np.int64(4), res_convs=np.int64(1)),
              keras.layers.Flatten(), fw.layers.DenseBN(np.int64(5)),
              fw.layers.Classifier(np.int64(7))]
    model = fw.Sequential(layers)
    assert model(np.zeros((2, 8, 8, 3), np.float32)).shape == (2, 7)
    assert type(layers[0].c) is int and layers[0].bn == 2 and type(layers[0].bn) is int
    assert layers[0].conv.kernel_size == (3, 3)
    config = layers[-1].get_config()
    assert config["n_classes"] == 7 and type(config["n_classes"]) is int
    with pytest.raises(ValueError, match="n_classes"):
        fw.layers.Classifier(np.int64(0))


def test_replica_mode_in_batch_replicas_uses_each_slices_statistics():
    """'replica' over 2 replicas' batch (what the JAX engine's global batch is) normalises
    each half by its own statistics (numpy), the moving statistics by their mean."""
    x = np.random.RandomState(3).randn(8, 3, 3, 2).astype("float32")
    layer = fw.layers.BatchNorm(momentum=0.5, epsilon=1e-3, center=False, scale=False)
    layer.build(x.shape)
    with fw.layers.batch_replicas(2):
        out = keras.ops.convert_to_numpy(layer(x, training=True))
    halves = x.reshape(2, 4, 3, 3, 2).astype(np.float64)
    mean = halves.mean(axis=(1, 2, 3), keepdims=True)
    var = halves.var(axis=(1, 2, 3), keepdims=True)
    np.testing.assert_allclose(out, ((halves - mean) / np.sqrt(var + 1e-3)).reshape(x.shape),
                               rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(layer.moving_mean.numpy(), 0.5 * mean.mean(axis=(0, 1, 2, 3)),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.moving_variance.numpy(),
                               0.5 + 0.5 * var.mean(axis=(0, 1, 2, 3)), rtol=1e-5)
    assert fw.layers.current_batch_replicas() == 1  # the context is left
    with pytest.raises(ValueError, match="multiple of 3"), fw.layers.batch_replicas(3):
        layer(x, training=True)
