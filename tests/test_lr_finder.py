"""fw.train.find_lr on full-batch linear regression, where everything is known by hand:
gradient descent on mean((Xw - y)^2) is stable exactly for lr < 1 / lambda_max(X'X / n),
and the whole loss curve can be replayed in numpy. Also on 8 replicas, and bad inputs."""

from __future__ import annotations

import keras
import numpy as np
import pytest

import fenwicks as fw
from tests.conftest import ROOT, shared_snippet

N, D = 64, 4
RNG = np.random.RandomState(0)
X = (RNG.randn(N, D) * np.array([2.0, 1.0, 0.5, 0.25])).astype("float32")
Y = (X @ np.array([1.0, -2.0, 3.0, 0.5]) + 0.1 * RNG.randn(N)).astype("float32")
W_INIT = RNG.randn(D, 1).astype("float32")
START, END, STEPS = 1e-4, 10.0, 60


def numpy_curve(num_steps):
    """Losses of full-batch GD with the exponential learning rates, by hand."""
    w, losses = W_INIT[:, 0].astype(np.float64), []
    for i in range(num_steps):
        lr = START * (END / START) ** (i / (STEPS - 1))
        err = X @ w - Y
        losses.append(float(np.mean(err ** 2)))
        w = w - lr * 2 * X.T @ err / N
    return losses


def critical_lr():
    return 1.0 / np.linalg.eigvalsh(X.T.astype(np.float64) @ X / N).max()


def make_model():
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(1, use_bias=False)])
    model.layers[0].kernel.assign(W_INIT)
    return model


def input_fn(params):
    import tensorflow as tf

    # Per-replica batches of the 64 rows in order: one global batch is the full data set.
    ds = tf.data.Dataset.from_tensor_slices((X, Y))
    return ds.batch(params["batch_size"], drop_remainder=True).repeat()


def check_result(lrs, losses, diverged, suggestion):
    expected_lrs = START * (END / START) ** (np.arange(len(lrs)) / (STEPS - 1))
    np.testing.assert_allclose(lrs, expected_lrs, rtol=1e-5)
    reference, crit = np.array(numpy_curve(len(losses))), critical_lr()
    stable = expected_lrs < crit  # past the limit float32 rounding grows with the loss
    np.testing.assert_allclose(np.array(losses)[stable], reference[stable], rtol=1e-4)
    np.testing.assert_allclose(losses, reference, rtol=5e-2)
    assert diverged and len(lrs) < STEPS
    assert lrs[-1] > crit                     # no stop while gradient descent is stable
    assert losses[-1] > 4 * min(losses)       # it stopped because the loss blew up
    assert crit / 100 < suggestion < crit      # steepest fall: below the limit, not tiny


@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
def test_find_lr_shows_progress_against_the_expected_steps(capsys):
    model_func = fw.train.get_reg_model_func(make_model, fw.train.sgd_optimizer(0.1, mom=0.0))
    result = fw.train.find_lr(model_func, input_fn, start_lr=START, end_lr=END,
                              num_steps=STEPS, batch_size=N, smoothing=0.5)
    err = capsys.readouterr().err
    assert f"find_lr: lr 1e-04 to 1e+01, batch {N}, stops early if the loss diverges" in err
    # It diverged before the 60 expected steps; the bar ends at the steps actually run.
    assert result.diverged and f"{len(result.lrs)}/{STEPS} " in err, err[-500:]
    final = err.rstrip().rsplit("\r", 1)[-1]
    assert f"lr={result.lrs[-1]:.2e}" in final
    fw.train.find_lr(model_func, input_fn, start_lr=START, end_lr=END, num_steps=STEPS,
                     batch_size=N, smoothing=0.5, verbose=False)
    assert capsys.readouterr().err == ""


@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
def test_find_lr_known_range_and_weights_untouched():
    with fw.train.tf.strategy().scope():  # where the estimator would build it
        model = make_model()  # build_nn returns this same model: it must come back unchanged
    before = [w.copy() for w in model.get_weights()]
    model_func = fw.train.get_reg_model_func(lambda: model,
                                             fw.train.sgd_optimizer(0.1, mom=0.0))
    result = fw.train.find_lr(model_func, input_fn, start_lr=START, end_lr=END,
                              num_steps=STEPS, batch_size=N, smoothing=0.5)
    check_result(result.lrs, result.losses, result.diverged, result.suggestion)
    for got, want in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(got, want)
    average, smoothed = 0.0, []  # bias-corrected exponential smoothing, by hand
    for i, loss in enumerate(result.losses):
        average = 0.5 * average + 0.5 * loss
        smoothed.append(average / (1 - 0.5 ** (i + 1)))
    np.testing.assert_allclose(result.smoothed, smoothed, rtol=1e-6)
    assert result.min_loss_lr == result.lrs[int(np.argmin(smoothed))]


EIGHT = """
import json, sys
sys.path.insert(0, {root!r})
import fenwicks as fw
from tests.test_lr_finder import input_fn, make_model, START, END, STEPS, N
# Making an opt_func and plotting a schedule run no TensorFlow op: 8 replicas still work.
model_func = fw.train.get_reg_model_func(make_model, fw.train.sgd_optimizer(0.1, mom=0.0))
curve = fw.train.one_cycle_lr(0.4, 100, 10, fw.train.cosine_decay())(list(range(100)))
result = fw.train.find_lr(model_func, input_fn, start_lr=START, end_lr=END,
                          num_steps=STEPS, batch_size=N, smoothing=0.5)
print(json.dumps({{"replicas": fw.accel.current().num_replicas, "lrs": result.lrs,
                  "losses": result.losses, "diverged": result.diverged,
                  "suggestion": result.suggestion}}))
"""


EIGHT_RESULT = shared_snippet("cpu:8", "lr_finder", EIGHT.format(root=ROOT))


def test_find_lr_on_eight_replicas_gives_the_single_device_curve():
    out = EIGHT_RESULT()
    assert out["replicas"] == 8
    check_result(out["lrs"], out["losses"], out["diverged"], out["suggestion"])


@pytest.mark.parametrize("kwargs,name", [
    ({"start_lr": 0.0}, "start_lr"), ({"start_lr": -1e-7}, "start_lr"),
    ({"end_lr": float("inf")}, "end_lr"), ({"start_lr": 1.0, "end_lr": 0.1}, "end_lr"),
    ({"num_steps": 1}, "num_steps"), ({"smoothing": 1.0}, "smoothing"),
    ({"diverge_factor": 1.0}, "diverge_factor"), ({"batch_size": 0}, "batch_size"),
])
def test_bad_arguments(kwargs, name):
    model_func = fw.train.get_reg_model_func(make_model, fw.train.sgd_optimizer(0.1))
    with pytest.raises(ValueError, match=name):
        fw.train.find_lr(model_func, input_fn, **kwargs)


def test_bad_model_functions():
    not_a_model = fw.train.get_clf_model_func(lambda: "resnet", fw.train.sgd_optimizer(0.1))
    with pytest.raises(ValueError, match="build_nn"):
        fw.train.find_lr(not_a_model, input_fn, batch_size=N)
    with pytest.raises(ValueError, match="ModelSpec"):
        fw.train.find_lr(lambda params: make_model(), input_fn, batch_size=N)
    model_func = fw.train.get_reg_model_func(make_model, fw.train.sgd_optimizer(0.1))
    with pytest.raises(ValueError, match="batch_size"):  # batches of 8 for a batch of 64
        fw.train.find_lr(model_func, lambda params: input_fn({"batch_size": 8}),
                         batch_size=N)
    with pytest.raises(ValueError, match="repeat"):  # 3 batches for a sweep of 60 steps
        fw.train.find_lr(model_func, lambda params: input_fn(params).take(3), batch_size=N,
                         start_lr=START, end_lr=END, num_steps=STEPS)


@pytest.mark.parametrize("batch_size", [0, 2.5, True])
def test_a_bad_batch_size_is_named_as_a_batch_size_not_steps(batch_size):
    model_func = fw.train.get_reg_model_func(make_model, fw.train.sgd_optimizer(0.1))
    with pytest.raises(ValueError, match=rf"^batch_size={batch_size!r} must be a positive "
                                         r"integer, e.g. batch_size=512$"):
        fw.train.find_lr(model_func, input_fn, batch_size=batch_size)
