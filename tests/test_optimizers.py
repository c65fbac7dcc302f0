"""fw.train optimizers: 5 steps against independent numpy implementations, decay really
shrinks weights, exclusions, clipping after the all-reduce, 8 replicas and loss scaling."""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from packaging.version import Version

import fenwicks as fw
from tests.conftest import shared_snippet

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


@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
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


@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
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


@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
def test_unmatched_exclusion_pattern_warns():
    with pytest.warns(UserWarning, match="batch_normalization"):
        run_keras(fw.train.adam_optimizer(0.1, wd=0.1, exclude_from_wd=["batch_normalization"]),
                  steps=1)
    with warnings.catch_warnings():  # the shortcut covers kinds a model may lack: no warning
        warnings.simplefilter("error")
        run_keras(fw.train.adam_optimizer(0.1, wd=0.1, exclude_from_wd="bn_and_bias"), steps=1)



def _all_layers(layer, seen=None):
    """`layer` and every layer inside it, through public attributes (Keras 3 has no
    public recursive walk): a model's ``layers`` and a block's layer attributes."""
    seen = set() if seen is None else seen
    if id(layer) in seen:
        return
    seen.add(id(layer))
    yield layer
    children = layer.layers if isinstance(layer, keras.Model) else [
        v for v in vars(layer).values() if isinstance(v, keras.layers.Layer)]
    for child in children:
        yield from _all_layers(child, seen)

def test_exclusion_shortcut_covers_fw_blocks():
    model = fw.models.mnist_net(c=2)
    opt = fw.train.sgd_optimizer(0.1, wd=0.1, exclude_from_wd="bn_and_bias")()
    opt.build(model.trainable_variables)
    decayed = {v.path for v in model.trainable_variables if opt.applies_weight_decay(v)}
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
strategy = fw.train.tf.strategy()
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


MULTI_REPLICA_RESULT = shared_snippet("cpu:8", "optimizers", MULTI_REPLICA)


def test_eight_replicas_and_loss_scaling_match_numpy():
    """Decay counted once and clipping on the global gradient: per-replica decay would be
    8x too strong, per-replica clipping would clip 8 different partial gradients."""
    out = MULTI_REPLICA_RESULT()
    assert out["replicas"] == 8
    sgd = np_sgd(0.9, 0.05, True, decay_bias=False, clip=0.5)
    adam = np_adamw(0.1, 0.8, 0.95, 1e-6, decay_bias=False)
    for scale in ("False", "True"):
        for got, ref in ((out["sgd" + scale], sgd), (out["adam" + scale], adam)):
            np.testing.assert_allclose(got[0], ref[0], rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(got[1], ref[1], rtol=1e-4, atol=1e-5)


# ----------------------------------------------------- Keras-spelled arguments are refused

@pytest.mark.parametrize("make,message", [
    (lambda: fw.train.sgd_optimizer(0.1, weight_decay=0.01),
     "weight_decay=0.01: Fenwicks spells it wd=0.01"),
    (lambda: fw.train.sgd_optimizer(0.1, momentum=0.9), "momentum=0.9: Fenwicks spells it mom=0.9"),
    (lambda: fw.train.sgd_optimizer(0.1, global_clipnorm=1.0),
     "global_clipnorm=1.0: Fenwicks spells it clip_norm=1.0"),
    (lambda: fw.train.adam_optimizer(0.1, beta_1=0.8), "beta_1=0.8: Fenwicks spells it beta1=0.8"),
    (lambda: fw.train.adam_optimizer(0.1, beta_2=0.95),
     "beta_2=0.95: Fenwicks spells it beta2=0.95"),
    (lambda: fw.train.adam_optimizer(0.1, weight_decay=0.1),
     "weight_decay=0.1: Fenwicks spells it wd=0.1"),
    (lambda: fw.train.adam_optimizer(0.1, clipnorm=1.0),
     "clipnorm=1.0: fw.train.adam_optimizer does not support it; there is no per-variable "
     "clipping; clip_norm= clips the global norm"),
    (lambda: fw.train.SGD(0.1, weight_decay=5e-4), "weight_decay=0.0005: Fenwicks spells it wd="),
    (lambda: fw.train.SGD(0.1, use_ema=True),
     "use_ema=True: fw.train.SGD does not support it; Fenwicks optimizers keep no moving"),
    (lambda: fw.train.SGD(0.1, clipvalue=1.0), "clipvalue=1.0: fw.train.SGD does not support"),
    (lambda: fw.train.SGD(0.1, loss_scale_factor=128.0), "LossScaleOptimizer"),
    (lambda: fw.train.SGD(0.1, gradient_accumulation_steps=4),
     "gradient_accumulation_steps=4: fw.train.SGD does not support it"),
    (lambda: fw.train.AdamW(0.1, beta_1=0.5), "beta_1=0.5: Fenwicks spells it beta1=0.5"),
    (lambda: fw.train.AdamW(0.1, global_clipnorm=2.0), "Fenwicks spells it clip_norm=2.0"),
    (lambda: fw.train.AdamW(0.1, amsgrad=True), "amsgrad=True: fw.train.AdamW does not"),
    (lambda: fw.train.AdamW(0.1, ema_momentum=0.9), "ema_momentum=0.9"),
    (lambda: fw.train.AdamW(0.1, nesterov=True),
     "nesterov=True: not an argument of fw.train.AdamW, which takes learning_rate, wd,"),
])
def test_keras_spelled_arguments_are_errors(make, message):
    """Before, **kwargs passed these to Keras (which applied its own decay or clipped each
    replica's partial gradient) or AdamW dropped them: a silent change of semantics."""
    with pytest.raises(ValueError) as info:
        make()
    assert message in str(info.value)


def test_every_keras_spelled_argument_is_named():
    with pytest.raises(ValueError) as info:
        fw.train.sgd_optimizer(0.1, weight_decay=0.01, clipnorm=1.0)
    assert "weight_decay=0.01" in str(info.value) and "clipnorm=1.0" in str(info.value)


def test_config_has_only_fenwicks_spellings():
    """from_config hands the config back to __init__, which refuses Keras's spellings."""
    keras_only = {"weight_decay", "clipnorm", "clipvalue", "global_clipnorm", "use_ema",
                  "ema_momentum", "beta_1", "beta_2", "momentum", "amsgrad"}
    for opt in (fw.train.SGD(0.1, wd=1e-4), fw.train.AdamW(0.1, wd=0.1, clip_norm=1.0)):
        config = opt.get_config()
        assert not keras_only & set(config)
        assert type(opt).from_config(config).get_config() == config


# --------------------------------------------------------------- the step, through `apply`

def test_constraints_apply_after_the_update():
    """Keras applies a variable's constraint after each update; so does Fenwicks's apply."""
    layer = keras.layers.Dense(2, kernel_constraint=keras.constraints.NonNeg())
    layer.build((None, 3))
    layer.kernel.assign(W0)
    layer.bias.assign(B0)
    grad_w, grad_b = _grads(W0.astype(np.float64), B0.astype(np.float64))
    opt = fw.train.sgd_optimizer(0.1, mom=0.0)()
    opt.apply([tf.constant(grad_w, tf.float32), tf.constant(grad_b, tf.float32)],
              layer.trainable_variables)
    np.testing.assert_allclose(layer.kernel.numpy(), np.maximum(W0 - 0.1 * grad_w, 0),
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(layer.bias.numpy(), B0 - 0.1 * grad_b, rtol=1e-6, atol=1e-7)


def test_missing_gradient_warns_and_others_still_step():
    layer = keras.layers.Dense(2)
    layer.build((None, 3))
    layer.kernel.assign(W0)
    layer.bias.assign(B0)
    opt = fw.train.sgd_optimizer(0.1, mom=0.0)()
    with pytest.warns(UserWarning, match="no gradient for .*bias"):
        opt.apply([tf.ones((3, 2)), None], layer.trainable_variables)
    np.testing.assert_allclose(layer.kernel.numpy(), W0 - 0.1, rtol=1e-6)
    np.testing.assert_allclose(layer.bias.numpy(), B0)
    assert int(opt.iterations) == 1
    # Without the variables (as Keras's stateless_apply calls it on JAX): those it was
    # built with; an optimizer not built yet cannot know them.
    opt.apply([tf.ones((3, 2)), tf.ones(2)])
    np.testing.assert_allclose(layer.kernel.numpy(), W0 - 0.2, rtol=1e-6)
    np.testing.assert_allclose(layer.bias.numpy(), B0 - 0.1, rtol=1e-6)
    assert int(opt.iterations) == 2
    with pytest.raises(ValueError, match="needs the variables"):
        fw.train.sgd_optimizer(0.1)().apply([tf.ones((3, 2)), tf.ones(2)])


# ---------------------------------------- the BatchNorm name that decay patterns rely on

def test_batchnorm_name_keeps_keras_exclusion_patterns_matching():
    """Why fw.layers.BatchNorm names itself 'batch_normalization' (layers.py, __init__).

    Keras names an unnamed layer after its class: a subclass called BatchNorm would be
    'batch_norm', and the pattern users copy from Keras code and DESIGN.md,
    ``exclude_from_wd=['bias', 'batch_normalization']``, would match none of fw's
    BatchNorm variables: gamma and beta would be decayed, with only a warning. The
    optimizer sees variables, not layers, so the layer's name is what carries its type.
    """
    plain_subclass = type("BatchNorm", (keras.layers.BatchNormalization,), {})()
    assert "batch_normalization" not in plain_subclass.name  # 'batch_norm': the trap
    model = fw.models.mnist_net(c=2)
    opt = fw.train.adam_optimizer(0.1, wd=0.1, exclude_from_wd=["batch_normalization"])()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a pattern matching nothing would warn
        opt.build(model.trainable_variables)
    bn_params = {v.path for layer in _all_layers(model)
                 if isinstance(layer, keras.layers.BatchNormalization)
                 for v in layer.trainable_variables}
    excluded = {v.path for v in model.trainable_variables
                if not opt.applies_weight_decay(v)}
    assert len(bn_params) == 6 and excluded == bn_params  # gamma, beta of 3 ConvBN blocks
    assert fw.layers.BatchNorm(name="bn").name == "bn"  # an explicit name is the user's


# ------------------------------------------ the Keras and TensorFlow this code depends on

def _setup_range(package):
    text = (Path(__file__).resolve().parents[1] / "setup.py").read_text()
    match = re.search(rf'"{package}>=([\d.]+),<([\d.]+)"', text)
    assert match, f"setup.py should declare {package}>=low,<high"
    return Version(match[1]), Version(match[2])


def test_keras_and_tensorflow_versions_and_hooks():
    """Fails loudly when an upgrade moves what fw.train's optimizers are built on.

    Keras >= 3.10 for `add_optimizer_variables`; < 4 because the hooks below are Keras 3's.
    The step uses only public hooks: Keras calls `build` and `update_step`; our `apply`
    replaces Keras's (which clips before its all-reduce) and uses public tf.distribute.
    """
    low, high = _setup_range("keras")
    assert low <= Version(keras.__version__) < high, (keras.__version__, low, high)
    assert Version(tf.__version__) >= Version("2.16"), tf.__version__  # first with Keras 3
    base = keras.optimizers.Optimizer
    expected = {
        "update_step": ["self", "gradient", "variable", "learning_rate"],
        "apply": ["self", "grads", "trainable_variables"],
        "build": ["self", "variables"],
        "add_optimizer_variables": ["self", "trainable_variables", "name", "initializer"],
        "assign": ["self", "variable", "value"],
        "assign_sub": ["self", "variable", "value"],
    }
    for method, params in expected.items():
        assert list(inspect.signature(getattr(base, method)).parameters) == params, method
    adam_step = inspect.signature(keras.optimizers.Adam.update_step).parameters
    assert list(adam_step) == expected["update_step"]
    assert list(inspect.signature(tf.distribute.ReplicaContext.all_reduce).parameters)[:3] \
        == ["self", "reduce_op", "value"]
    assert list(inspect.signature(tf.distribute.StrategyExtended.update).parameters)[:4] \
        == ["self", "var", "fn", "args"]


def test_loss_scale_optimizer_steps_through_our_apply():
    """float16 training wraps the optimizer; the wrapper must call the inner `apply`,
    or clipping and decay would fall back to Keras's step."""
    calls = []

    class Spy(fw.train.SGD):
        def apply(self, grads, trainable_variables=None):
            calls.append(len(grads))
            return super().apply(grads, trainable_variables)

    layer = keras.layers.Dense(2)
    layer.build((None, 3))
    opt = keras.optimizers.LossScaleOptimizer(Spy(0.1, mom=0.0), initial_scale=4.0)
    opt.apply([tf.fill((3, 2), 4.0), tf.fill((2,), 4.0)], layer.trainable_variables)
    assert calls == [2]


def test_no_private_keras_method_is_overridden():
    """The old step overrode Keras's private `_backend_update_step` and `_use_weight_decay`;
    a Keras release could change those without notice. Private helpers here are our own."""
    keras_classes = (keras.optimizers.Optimizer, keras.optimizers.Adam)
    for cls in (fw.train.SGD, fw.train.AdamW):
        ours = {name for klass in cls.__mro__ if klass.__module__.startswith("fenwicks")
                for name in vars(klass) if name.startswith("_") and not name.startswith("__")}
        assert ours and not {name for name in ours
                             if any(hasattr(k, name) for k in keras_classes)}, cls


@pytest.mark.parametrize("opt_func,slots", [
    (fw.train.sgd_optimizer(0.1), ["velocity"]),
    (fw.train.adam_optimizer(0.1, wd=0.1), ["momentum", "velocity"]),
])
def test_optimizer_variables_are_its_own_counter_rate_and_slots(opt_func, slots):
    """The model's variables the optimizer remembers (for `apply(grads)`) must not become
    its own: they would be checkpointed twice and mapped twice by stateless_apply."""
    layer = keras.layers.Dense(2, name="dense")
    layer.build((None, 3))
    opt = opt_func()
    opt.build(layer.trainable_variables)
    name = opt.name
    expected = {f"{name}/iteration", f"{name}/learning_rate"} | {
        f"{name}/dense_{w}_{slot}" for w in ("kernel", "bias") for slot in slots}
    assert {v.path for v in opt.variables} == expected
