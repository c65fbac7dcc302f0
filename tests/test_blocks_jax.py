"""The blocks on the JAX backend: fw.models, fw.layers (every BatchNorm mode), the model
functions' losses and metrics, SGD and AdamW and the schedules, each run the way the JAX
engine runs them (inside ``jax.jit``: `stateless_call`, `stateless_apply`) in ONE
``KERAS_BACKEND=jax`` process (tests/_blocks_jax.py), against TensorFlow's results with
the same weights (this process) or numpy references."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import keras
import numpy as np
import pytest

import fenwicks as fw
from tests import _blocks_jax as blocks
from tests.conftest import run_module_json

RNG = np.random.RandomState(7)
LOGITS = (RNG.randn(8, 3) * 3).astype("float32")
CLF_LABELS = np.array([0, 1, 3, 2, 1, 0, 2, 1], np.int32)  # row 2: not a class (3 outputs)
REG_LABELS = RNG.randn(8, 3).astype("float32")
W0, B0 = RNG.randn(3, 2).astype("float32"), RNG.randn(2).astype("float32")
GRADS = [(RNG.randn(3, 2).astype("float32"), RNG.randn(2).astype("float32"))
         for _ in range(2)]
# TensorFlow's and XLA-on-JAX's convolutions and reductions sum in different orders;
# BatchNorm over 8 examples then scales those differences by 1/std.
MODEL_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
# 2 host devices for the sharded checks. LLVM optimisation off: XLA compiles every op of
# these tiny programs, and each weight shape's random initializer, ~7x faster (resnet9's
# build: 38 -> 5.6 s on this busy machine); at this size they run as fast either way.
XLA_FLAGS = "--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0"


def _perturbed_weights(model: keras.Model) -> list[np.ndarray]:
    """BatchNorm's parameters and statistics away from 1 and 0, so each one matters."""
    for variable in model.weights:
        shape, name = variable.shape, variable.path.rsplit("/", 1)[-1]
        if name in ("gamma", "moving_variance"):
            variable.assign(RNG.uniform(0.5, 1.5, shape).astype("float32"))
        elif name in ("beta", "moving_mean"):
            variable.assign((RNG.randn(*shape) * 0.2).astype("float32"))
    return model.get_weights()


def _tensorflow_side(data: dict, expected: dict) -> None:
    """Inputs and weights for the JAX process; TensorFlow's outputs (this process)."""
    for name, (build, shape) in blocks.MODELS.items():
        keras.utils.set_random_seed(len(data))
        # 2 replicas x 4 examples with 'replica' statistics == ghost groups of 4 on one
        # (tests/test_layers.py proves that on TensorFlow's replicas).
        model = blocks.mnist(bn=4) if name == "replica2" else build()
        x = RNG.randn(blocks.BATCH, *shape).astype("float32")
        for i, weight in enumerate(_perturbed_weights(model)):
            data[f"{name}/weights/{i}"] = weight
        data[f"{name}/x"] = x
        expected[f"{name}/eval"] = keras.ops.convert_to_numpy(model(x, training=False))
        expected[f"{name}/train"] = keras.ops.convert_to_numpy(model(x, training=True))
        for i, variable in enumerate(model.non_trainable_variables):
            expected[f"{name}/moving/{i}"] = variable.numpy()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """(JAX results, TensorFlow results) by name."""
    directory = tmp_path_factory.mktemp("blocks_jax")
    data = {"logits": LOGITS, "clf/labels": CLF_LABELS, "reg/labels": REG_LABELS,
            "opt/w0": W0, "opt/b0": B0}
    for t, (gw, gb) in enumerate(GRADS):
        data[f"opt/gw{t}"], data[f"opt/gb{t}"] = gw, gb
    expected: dict[str, np.ndarray] = {}
    _tensorflow_side(data, expected)
    np.savez(directory / "in.npz", **data)
    out = run_module_json("tests._blocks_jax", str(directory / "in.npz"),
                          str(directory / "out.npz"),
                          env={"KERAS_BACKEND": "jax", "XLA_FLAGS": XLA_FLAGS})
    assert out["backend"] == "jax"
    return dict(np.load(directory / "out.npz")), expected


@pytest.mark.parametrize("name", list(blocks.MODELS))
def test_models_and_batchnorm_modes_match_tensorflow(results, name):
    """Inference, training outputs and the moving statistics after one training call:
    mnist_net ('replica'), resnet9 (ghost 4), resnet ('sync'), DenseBN/Classifier, and
    mnist on 2 replicas' batch (batch_replicas(2)) == ghost groups of 4 on TensorFlow."""
    jax_results, expected = results
    keys = [k for k in expected if k.startswith(f"{name}/")]
    assert len(keys) >= 4
    for key in keys:
        np.testing.assert_allclose(jax_results[key], expected[key], err_msg=key,
                                   **MODEL_TOLERANCE)
    # The training call normalised with batch statistics: outputs differ from inference.
    assert not np.allclose(expected[f"{name}/train"], expected[f"{name}/eval"], atol=1e-3)


def test_replica_statistics_differ_from_the_whole_batch(results):
    """batch_replicas(2) really splits the batch: whole-batch statistics differ."""
    jax_results, _ = results
    assert not np.allclose(jax_results["replica2/train"], jax_results["mnist/train"],
                           atol=1e-3) or not np.allclose(
        jax_results["replica2/moving/0"], jax_results["mnist/moving/0"])


@pytest.mark.parametrize("name", ["replica2", "resnet"])
def test_a_batch_sharded_over_two_devices_gives_the_same_statistics(results, name):
    """Under keras.distribution.DataParallel over 2 devices (the JAX engine's layout),
    'replica' takes the replica count from the distribution (per-device statistics, as
    batch_replicas(2) on one device) and 'sync' normalises over the global batch."""
    jax_results, _ = results
    assert int(jax_results[f"{name}/sharded_devices"]) == 2
    np.testing.assert_allclose(jax_results[f"{name}/sharded_train"],
                               jax_results[f"{name}/train"], rtol=1e-5, atol=1e-6)


def _log_softmax(x):
    shifted = x.astype(np.float64) - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def test_model_funcs_losses_and_metrics_under_jit(results):
    jax_results, _ = results
    rows = np.arange(8)
    safe = np.where(CLF_LABELS < 3, CLF_LABELS, 0)
    ce = -_log_softmax(LOGITS)[rows, safe]
    ce[2] = np.nan  # a label outside the classes: NaN, for the engine's NaN check
    np.testing.assert_allclose(jax_results["clf/loss"], ce, rtol=1e-5)
    accuracy = (LOGITS.argmax(-1) == CLF_LABELS).astype(np.float32)
    assert 0 < accuracy.sum() < 8
    np.testing.assert_array_equal(jax_results["clf/accuracy"], accuracy)
    np.testing.assert_allclose(jax_results["clf/predict"], np.exp(_log_softmax(LOGITS)),
                               rtol=1e-5, atol=1e-7)
    error = REG_LABELS.astype(np.float64) - LOGITS
    np.testing.assert_allclose(jax_results["reg/loss"], (error ** 2).mean(1), rtol=1e-5)
    np.testing.assert_allclose(jax_results["reg/mse"], (error ** 2).mean(1), rtol=1e-5)
    np.testing.assert_allclose(jax_results["reg/mae"], np.abs(error).mean(1), rtol=1e-5)


def _sgd(mom, wd, nesterov, lrs, clip=None):
    params, velocity = [W0.astype(np.float64), B0.astype(np.float64)], [0.0, 0.0]
    for (gw, gb), lr in zip(GRADS, lrs, strict=True):
        grads = [gw.astype(np.float64), gb.astype(np.float64)]
        if clip is not None:
            norm = math.sqrt(sum((g ** 2).sum() for g in grads))
            grads = [g * min(1.0, clip / norm) for g in grads]
        for i in range(2):
            g = grads[i] + wd * params[i]  # coupled L2
            velocity[i] = mom * velocity[i] + g
            params[i] = params[i] - lr * (g + mom * velocity[i] if nesterov else velocity[i])
    return params


def _adamw(wd, lrs, b1=0.9, b2=0.999, eps=1e-7):
    params, m, v = [W0.astype(np.float64), B0.astype(np.float64)], [0.0, 0.0], [0.0, 0.0]
    for t, ((gw, gb), lr) in enumerate(zip(GRADS, lrs, strict=True), start=1):
        params[0] = params[0] * (1 - lr * wd)  # decoupled; the bias is excluded
        for i, g in enumerate((gw.astype(np.float64), gb.astype(np.float64))):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g ** 2
            alpha = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
            params[i] = params[i] - alpha * m[i] / (np.sqrt(v[i]) + eps)
    return params


@pytest.mark.parametrize("name,reference", [
    ("sgd", lambda: _sgd(0.9, 0.1, True, [0.1, 0.08])),
    ("sgd_clip", lambda: _sgd(0.5, 0.0, False, [0.1, 0.1], clip=0.5)),
    ("adamw", lambda: _adamw(0.1, [0.1, 0.08])),
])
def test_optimizers_through_stateless_apply(results, name, reference):
    """Two steps each (the second reads the slots the first wrote), lr schedules read at
    the optimizer's own step inside jit."""
    jax_results, _ = results
    w, b = reference()
    np.testing.assert_allclose(jax_results[f"{name}/w"], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax_results[f"{name}/b"], b, rtol=1e-5, atol=1e-6)
    assert int(jax_results[f"{name}/iterations"]) == 2


def _expected_schedules(s):
    s = s.astype(np.float64)
    decay = np.clip((s - 10) / 30, 0, 1)
    return {
        "piecewise": np.interp(s, [0, 5, 24], [0, 0.4, 0]),
        "one_cycle": np.where(s < 10, 0.04 * s, 0.4 * (1 - decay)),
        "cosine": 0.5 * (1 + np.cos(np.pi * np.clip(s / 20, 0, 1))),
        "exp_warmup": np.where(s < 5, 0.01 * s / 5,
                               1e-4 + (0.01 - 1e-4) * np.exp(-(s - 5) / 10)),
        "momentum": np.where(s < 10, 0.95 - 0.01 * s, 0.85 + 0.1 * decay),
        "scaled": 0.1 * (1 - np.clip(s / 10, 0, 1)),
    }


def test_schedules_under_jit(results):
    jax_results, _ = results
    expected = _expected_schedules(blocks.STEPS)
    assert set(expected) == set(blocks.schedules())
    for name, values in expected.items():
        np.testing.assert_allclose(jax_results[f"schedule/{name}"], values, rtol=2e-6,
                                   atol=1e-7, err_msg=name)


def test_blocks_import_no_tensorflow_at_module_level():
    """Colab's TPU runtime has JAX and no TensorFlow: the blocks reach TensorFlow only
    inside the TensorFlow engine's own code paths (imported there, lazily)."""
    root = Path(fw.__file__).parent
    for module in ("layers.py", "models.py", "keras_models.py", "train/model_func.py",
                   "train/optimizers.py", "train/schedules.py"):
        tree = ast.parse((root / module).read_text())
        top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        names = [a.name for n in top if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] == "tensorflow"], module
