"""fw.train optimizers: 5 steps against independent numpy implementations, decay really
shrinks weights, exclusions, clipping after the all-reduce, 8 replicas and loss scaling."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from tests.conftest import run_json

RNG = np.random.RandomState(0)
X = RNG.randn(16, 3).astype("float32")
Y = RNG.randn(16, 2).astype("float32")
W0 = RNG.randn(3, 2).astype("float32")
B0 = RNG.randn(2).astype("float32")
LRS = [0.1, 0.08, 0.06, 0.04, 0.02]  # LinearDecay(0.1, 5) at steps 0..4


def _grads(w, b):
    """Gradient of mean over the batch of 0.5 * ||x w + b - y||^2 (by hand)."""
    err = X @ w + b - Y
    return X.T @ err / len(X), err.mean(0)


def np_sgd(mom, wd, nesterov, decay_bias=True, clip=None, moms=None):
    w, b = W0.astype(np.float64), B0.astype(np.float64)
    vel = [np.zeros_like(w), np.zeros_like(b)]
    for t, lr in enumerate(LRS):
        mom = moms[t] if moms is not None else mom
        grads = list(_grads(w, b))
        if clip is not None:
            norm = np.sqrt(sum((g ** 2).sum() for g in grads))
            grads = [g * min(1.0, clip / norm) for g in grads]
        params = [w, b]
        for i, use in enumerate([True, decay_bias]):
            g = grads[i] + (wd * params[i] if use else 0.0)
            vel[i] = mom * vel[i] + g
            params[i] = params[i] - lr * (g + mom * vel[i] if nesterov else vel[i])
        w, b = params
    return w, b


def np_adamw(wd, b1, b2, eps, decay_bias=True):
    w, b = W0.astype(np.float64), B0.astype(np.float64)
    m, v = [np.zeros_like(w), np.zeros_like(b)], [np.zeros_like(w), np.zeros_like(b)]
    for t, lr in enumerate(LRS, start=1):
        grads = _grads(w, b)
        params = [w * (1 - lr * wd), b * (1 - lr * wd) if decay_bias else b]
        for i in range(2):
            m[i] = b1 * m[i] + (1 - b1) * grads[i]
            v[i] = b2 * v[i] + (1 - b2) * grads[i] ** 2
            alpha = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
            params[i] = params[i] - alpha * m[i] / (np.sqrt(v[i]) + eps)
        w, b = params
    return w, b


def run_keras(opt_func, steps=5):
    layer = keras.layers.Dense(2, name="dense")
    layer.build((None, 3))
    layer.kernel.assign(W0)
    layer.bias.assign(B0)
    opt = opt_func()

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(0.5 * tf.reduce_sum((layer(X) - Y) ** 2, axis=1))
        grads = tape.gradient(loss, layer.trainable_variables)
        opt.apply_gradients(zip(grads, layer.trainable_variables, strict=True))

    for _ in range(steps):
        step()
    return layer.kernel.numpy(), layer.bias.numpy(), opt


def _lr():
    return fw.train.linear_decay(0.1, 5)


@pytest.mark.parametrize("mom,wd,nesterov", [(0.9, 0.05, True), (0.9, 0.05, False),
                                             (0.0, 0.0, True)])
def test_sgd_matches_numpy(mom, wd, nesterov):
    w, b, opt = run_keras(fw.train.sgd_optimizer(_lr(), mom=mom, wd=wd, nesterov=nesterov))
    ref_w, ref_b = np_sgd(mom, wd, nesterov)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, ref_b, rtol=1e-5, atol=1e-6)
    # The current LR is readable: the schedule at optimizer.iterations (5 -> 0.0).
    assert int(opt.iterations) == 5 and float(opt.learning_rate) == pytest.approx(0.0)


def test_sgd_momentum_schedule():
    """Momentum cycling: the momentum at each step comes from a schedule (0.9 -> 0.5)."""
    mom = fw.train.linear_decay(0.9, 5, end_lr=0.5)
    w, b, _ = run_keras(fw.train.sgd_optimizer(_lr(), mom=mom, wd=0.01))
    ref_w, ref_b = np_sgd(None, 0.01, True, moms=[0.9, 0.82, 0.74, 0.66, 0.58])
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, ref_b, rtol=1e-5, atol=1e-6)


def test_sgd_exclusion_and_clipping():
    opt_func = fw.train.sgd_optimizer(_lr(), mom=0.9, wd=0.05, exclude_from_wd=["bias"],
                                      clip_norm=0.5)
    w, b, _ = run_keras(opt_func)
    ref_w, ref_b = np_sgd(0.9, 0.05, True, decay_bias=False, clip=0.5)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, ref_b, rtol=1e-5, atol=1e-6)


def test_adamw_matches_numpy_and_excludes():
    w, b, _ = run_keras(fw.train.adam_optimizer(_lr(), wd=0.1, beta1=0.8, beta2=0.95,
                                                epsilon=1e-6, exclude_from_wd="bn_and_bias"))
    ref_w, ref_b = np_adamw(0.1, 0.8, 0.95, 1e-6, decay_bias=False)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, ref_b, rtol=1e-5, atol=1e-6)


def test_decay_really_shrinks_weights():
    """With zero gradients, only decay moves the weights: by (1 - lr wd) per step."""
    layer = keras.layers.Dense(2)
    layer.build((None, 3))
    layer.kernel.assign(W0)
    for opt_func, factor in [(fw.train.adam_optimizer(0.1, wd=0.5), 1 - 0.1 * 0.5),
                             (fw.train.sgd_optimizer(0.1, mom=0.0, wd=0.5), 1 - 0.1 * 0.5)]:
        layer.kernel.assign(W0)
        opt = opt_func()
        zeros = [tf.zeros_like(v) for v in layer.trainable_variables]
        for _ in range(3):
            opt.apply_gradients(zip(zeros, layer.trainable_variables, strict=True))
        np.testing.assert_allclose(layer.kernel.numpy(), W0 * factor ** 3, rtol=1e-5)


def test_unmatched_exclusion_pattern_warns():
    with pytest.warns(UserWarning, match="batch_normalization"):
        run_keras(fw.train.adam_optimizer(0.1, wd=0.1, exclude_from_wd=["batch_normalization"]),
                  steps=1)
    with warnings.catch_warnings():  # the shortcut covers kinds a model may lack: no warning
        warnings.simplefilter("error")
        run_keras(fw.train.adam_optimizer(0.1, wd=0.1, exclude_from_wd="bn_and_bias"), steps=1)


def test_exclusion_shortcut_covers_fw_blocks():
    model = fw.models.mnist_net(c=2)
    opt = fw.train.sgd_optimizer(0.1, wd=0.1, exclude_from_wd="bn_and_bias")()
    opt.build(model.trainable_variables)
    decayed = {v.path for v, flag in zip(model.trainable_variables, opt._decay_flags,
                                         strict=True) if flag}
    kernels = {v.path for v in model.trainable_variables if v.path.endswith("kernel")}
    assert decayed == kernels


def test_config_round_trip():
    opt = fw.train.SGD(fw.train.one_cycle_lr(0.4, 100, 10),
                       mom=fw.train.one_cycle_momentum(100, 10), wd=5e-4,
                       exclude_from_wd=["bias"])
    clone = fw.train.SGD.from_config(opt.get_config())
    assert clone.wd == 5e-4 and clone.exclude_from_wd == ("bias",) and clone.nesterov
    assert clone.mom(10) == pytest.approx(0.85) and float(clone.learning_rate) == pytest.approx(0.0)
    adam = fw.train.AdamW.from_config(fw.train.AdamW(0.01, wd=0.1, beta1=0.5).get_config())
    assert (adam.wd, adam.beta_1, adam.weight_decay) == (0.1, 0.5, 0.1)


@pytest.mark.parametrize("kwargs,name", [
    ({"lr_func": -0.1}, "lr_func"), ({"lr_func": float("nan")}, "lr_func"),
    ({"lr_func": 0.1, "mom": 1.5}, "mom"), ({"lr_func": 0.1, "wd": -1e-4}, "wd"),
    ({"lr_func": 0.1, "wd": float("inf")}, "wd"), ({"lr_func": 0.1, "clip_norm": 0.0},
                                                   "clip_norm"),
    ({"lr_func": 0.1, "exclude_from_wd": ["("]}, "exclude_from_wd")])
def test_sgd_bad_inputs(kwargs, name):
    with pytest.raises(ValueError, match=name):
        fw.train.sgd_optimizer(**kwargs)


@pytest.mark.parametrize("kwargs,name", [
    ({"beta1": 1.0}, "beta1"), ({"beta2": -0.1}, "beta2"), ({"epsilon": 0.0}, "epsilon"),
    ({"wd": -0.01}, "wd"), ({"clip_norm": float("nan")}, "clip_norm")])
def test_adam_bad_inputs(kwargs, name):
    with pytest.raises(ValueError, match=name):
        fw.train.adam_optimizer(0.1, **kwargs)


MULTI_REPLICA = """
import json, numpy as np, tensorflow as tf, keras, fenwicks as fw
strategy = fw.accel.current().strategy
rng = np.random.RandomState(0)
X = rng.randn(16, 3).astype("float32"); Y = rng.randn(16, 2).astype("float32")
W0 = rng.randn(3, 2).astype("float32"); B0 = rng.randn(2).astype("float32")
def train(opt_func, loss_scale):
    with strategy.scope():
        layer = keras.layers.Dense(2, name="dense"); layer.build((None, 3))
        layer.kernel.assign(W0); layer.bias.assign(B0)
        opt = opt_func()
        if loss_scale:
            opt = keras.optimizers.LossScaleOptimizer(opt, initial_scale=2.0 ** 10)
    # Replica r gets rows 2r, 2r + 1 of the global batch of 16. (Values, not a distributed
    # tf.data iterator: with 8 logical CPUs on 2 cores that stalls for minutes at times.)
    per_replica = lambda a: strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(a[2 * ctx.replica_id_in_sync_group:][:2]))
    batches = [(per_replica(X), per_replica(Y))] * 5
    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example = 0.5 * tf.reduce_sum((layer(x) - y) ** 2, axis=1)
            loss = tf.reduce_sum(per_example) / 16.0   # global mean
            scaled = opt.scale_loss(loss) if loss_scale else loss
        grads = tape.gradient(scaled, layer.trainable_variables)
        opt.apply_gradients(zip(grads, layer.trainable_variables))
    step = tf.function(lambda x, y: strategy.run(replica_step, args=(x, y)))
    for x, y in batches:
        step(x, y)
    return [layer.kernel.numpy().tolist(), layer.bias.numpy().tolist()]
lr = fw.train.linear_decay(0.1, 5)
out = {"replicas": strategy.num_replicas_in_sync}
for scale in (False, True):
    out[f"sgd{scale}"] = train(fw.train.sgd_optimizer(
        lr, mom=0.9, wd=0.05, exclude_from_wd=["bias"], clip_norm=0.5), scale)
    out[f"adam{scale}"] = train(fw.train.adam_optimizer(
        lr, wd=0.1, beta1=0.8, beta2=0.95, epsilon=1e-6, exclude_from_wd="bn_and_bias"), scale)
print(json.dumps(out))
"""


def test_eight_replicas_and_loss_scaling_match_numpy():
    """Decay counted once and clipping on the global gradient: per-replica decay would be
    8x too strong, per-replica clipping would clip 8 different partial gradients."""
    out = run_json(MULTI_REPLICA, env={"FENWICKS_DEVICE": "cpu:8"})
    assert out["replicas"] == 8
    sgd = np_sgd(0.9, 0.05, True, decay_bias=False, clip=0.5)
    adam = np_adamw(0.1, 0.8, 0.95, 1e-6, decay_bias=False)
    for scale in ("False", "True"):
        for got, ref in ((out["sgd" + scale], sgd), (out["adam" + scale], adam)):
            np.testing.assert_allclose(got[0], ref[0], rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(got[1], ref[1], rtol=1e-4, atol=1e-5)
