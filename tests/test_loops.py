"""The compiled loops (`fenwicks.train.tf.loops`) and evaluation's padding and masking
(`fenwicks.train.inputs.pad_and_mask`, `fenwicks.train.evaluation`), on their own.

In-process, on this process's one replica, with a model whose every number is worked out
by hand: ``y = x @ w`` (no bias), squared error, plain SGD. The estimator's tests prove
the same loops end to end; these fail on their own when a loop breaks.
"""

from __future__ import annotations

import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks.train import eval_sums, inputs
from fenwicks.train.model_func import ModelSpec
from fenwicks.train.tf import loops
from fenwicks.train.tf.evaluation import TFEvaluator

LR = 0.1
BATCH = 4
X = np.array([[1.0, 2.0], [0.5, -1.0], [-2.0, 1.0], [3.0, 0.0]], np.float32)
Y = np.array([1.0, -1.0, 0.5, 2.0], np.float32)


def _squared_error(labels, outputs):
    return tf.square(outputs[:, 0] - tf.cast(labels, tf.float32))


def _setup(reduction: str = "mean", jit_compile: bool = False, stop: bool | None = None):
    """A zero-initialised linear model, its loop, and the step counter."""
    strategy = fw.train.tf.strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)),
                                  keras.layers.Dense(1, use_bias=False,
                                                     kernel_initializer="zeros")])
        optimizer = keras.optimizers.SGD(LR)
        optimizer.build(model.trainable_variables)
        step = tf.Variable(0, dtype=tf.int64)
        flag = None if stop is None else tf.Variable(stop)
    spec = ModelSpec(model, optimizer, _squared_error, reduction=reduction)
    loop = loops.make_train_loop(strategy, spec, optimizer, step, BATCH, jit_compile, flag)
    return strategy, model, step, loop, flag


def _iterator(strategy, labels=Y):
    ds = tf.data.Dataset.from_tensors((X, labels)).repeat()
    return iter(strategy.experimental_distribute_dataset(ds))


def _numpy_sgd(steps: int, reduction: str = "mean") -> tuple[np.ndarray, list[float]]:
    """The same training by hand: returns the weights and each step's mean loss."""
    w, losses = np.zeros(2, np.float64), []
    for _ in range(steps):
        err = X @ w - Y
        losses.append(float(np.mean(err ** 2)))
        scale = 2 / BATCH if reduction == "mean" else 2
        w -= LR * scale * (X.T @ err)
    return w, losses


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_the_loop_runs_n_steps_and_equals_sgd_by_hand(reduction):
    strategy, model, step, loop, _ = _setup(reduction)
    losses = loop(_iterator(strategy), tf.constant(5, tf.int64)).numpy()
    w, want = _numpy_sgd(5, reduction)
    # The loop reports the mean loss per example whatever the reduction.
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    np.testing.assert_allclose(model.trainable_variables[0].numpy()[:, 0], w, rtol=1e-5)
    assert int(step.numpy()) == 5


def test_a_new_step_count_does_not_retrace_and_the_counter_goes_on():
    strategy, _, step, loop, _ = _setup()
    iterator = _iterator(strategy)
    first = loop(iterator, tf.constant(3, tf.int64)).numpy()
    second = loop(iterator, tf.constant(4, tf.int64)).numpy()
    assert (len(first), len(second)) == (3, 4)
    assert loop.experimental_get_tracing_count() == 1
    assert int(step.numpy()) == 7
    np.testing.assert_allclose(np.concatenate([first, second]), _numpy_sgd(7)[1], rtol=1e-5)


def test_the_loop_stops_after_the_first_non_finite_loss():
    strategy, _, step, loop, _ = _setup()
    ds = tf.data.Dataset.from_tensors((X, Y)).repeat(2).concatenate(
        tf.data.Dataset.from_tensors((X, np.full(BATCH, np.nan, np.float32)))).repeat()
    losses = loop(iter(strategy.experimental_distribute_dataset(ds)),
                  tf.constant(10, tf.int64)).numpy()
    # The NaN step ran (and is counted), so the caller can name it; nothing after it.
    assert len(losses) == 3 and np.isnan(losses[2])
    np.testing.assert_allclose(losses[:2], _numpy_sgd(2)[1], rtol=1e-5)
    assert int(step.numpy()) == 3


def test_the_stop_flag_is_read_before_every_step():
    strategy, model, step, loop, flag = _setup(stop=True)
    iterator = _iterator(strategy)
    assert loop(iterator, tf.constant(5, tf.int64)).numpy().shape == (0,)
    assert int(step.numpy()) == 0 and not model.trainable_variables[0].numpy().any()
    flag.assign(False)
    assert len(loop(iterator, tf.constant(2, tf.int64)).numpy()) == 2


def test_a_jit_compiled_step_gives_the_same_numbers():
    strategy, model, _, loop, _ = _setup(jit_compile=True)
    np.testing.assert_allclose(loop(_iterator(strategy), tf.constant(3, tf.int64)).numpy(),
                               _numpy_sgd(3)[1], rtol=1e-5)
    np.testing.assert_allclose(model.trainable_variables[0].numpy()[:, 0], _numpy_sgd(3)[0],
                               rtol=1e-5)


# ------------------------------------------------------------- evaluation: padding, masking


def _batches(n: int, batch_size: int, weights: bool = False) -> tf.data.Dataset:
    x = np.arange(1, 2 * n + 1, dtype=np.float32).reshape(n, 2)
    y = np.arange(n, dtype=np.float32)
    elem = (x, y, np.linspace(0.5, 2.0, n).astype(np.float32)) if weights else (x, y)
    return tf.data.Dataset.from_tensor_slices(elem).batch(batch_size)


def test_padding_gives_full_batches_masks_and_whole_groups_of_replicas():
    # 7 examples in batches of 2: 4 batches, the last one partial; for 3 replicas the
    # batches become a multiple of 3 by 2 all-masked fillers.
    padded = inputs.pad_and_mask(_batches(7, 2), 2, 3, "evaluation")
    assert padded.element_spec[0][0].shape == (2, 2)  # static: what XLA and TPUs need
    out = list(padded.as_numpy_iterator())
    masks = [mask.tolist() for _, mask in out]
    assert masks == [[True, True]] * 3 + [[True, False]] + [[False, False]] * 2
    x = np.concatenate([elem[0] for elem, _ in out])
    np.testing.assert_array_equal(x[:7], np.arange(1, 15).reshape(7, 2))
    assert not x[7:].any()  # padding and fillers are zeros
    # A batch larger than the static size is refused. (The message is TensorFlow's shape
    # error: pad_and_mask's own "batch larger than params['batch_size']" assertion loses
    # the race to ensure_shape; the estimator's input check names it before this point.)
    with pytest.raises(tf.errors.InvalidArgumentError):
        list(inputs.pad_and_mask(_batches(7, 4), 2, 1, "evaluation"))


def _eval_spec(kernel=(1.0, -1.0)) -> ModelSpec:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
    model.layers[0].kernel.assign(np.array(kernel, np.float32).reshape(2, 1))
    # log(|output|): -inf on an all-zero padding row. Multiplying by a 0 mask would give
    # NaN; the loop must leave padding rows out altogether.
    loss = lambda labels, outputs: tf.math.log(tf.abs(outputs[:, 0]))
    metric = lambda labels, outputs: tf.abs(outputs[:, 0] - labels)
    return ModelSpec(model, keras.optimizers.SGD(0.1), loss, metric_fns={"err": metric})


@pytest.mark.parametrize("weights", [False, True], ids=["unweighted", "sample_weight"])
def test_eval_loop_sums_every_real_example_once(weights):
    strategy = fw.train.tf.strategy()
    spec = _eval_spec()
    loop = loops.make_eval_loop(strategy, spec, jit_compile=False)
    padded = inputs.pad_and_mask(_batches(5, 2, weights), 2, 1, "evaluation")
    per_step = loop(iter(strategy.experimental_distribute_dataset(padded))).numpy()
    # steps x (loss, err, count, weight, then the check counts)
    assert per_step.shape == (3, 4 + len(eval_sums.CHECKS))
    sums = per_step.astype(np.float64).sum(axis=0)
    # Finite features, a finite loss on every real row, float (regression) labels: the
    # checks count nothing, and the -inf loss of the padding rows is not counted either.
    np.testing.assert_array_equal(sums[4:], 0)
    sums = sums[:4]
    x = np.arange(1, 11, dtype=np.float64).reshape(5, 2)
    y = np.arange(5, dtype=np.float64)
    w = np.linspace(0.5, 2.0, 5) if weights else np.ones(5)
    out = x @ np.array([1.0, -1.0])  # -1 for every example
    np.testing.assert_allclose(sums, [np.sum(w * np.log(np.abs(out))),
                                      np.sum(w * np.abs(out - y)), 5, w.sum()], rtol=1e-6)


def test_predict_loop_returns_every_row_in_input_order():
    strategy = fw.train.tf.strategy()
    spec = _eval_spec(kernel=(2.0, 1.0))
    loop = loops.make_predict_loop(strategy, spec, jit_compile=False)
    padded = inputs.pad_and_mask(_batches(5, 2), 2, 1, "prediction")
    results = loop(iter(strategy.experimental_distribute_dataset(padded)))
    mask = np.concatenate([np.asarray(m) for _, m in results])
    rows = np.concatenate([np.asarray(p) for p, _ in results])[mask]
    x = np.arange(1, 11, dtype=np.float32).reshape(5, 2)
    np.testing.assert_allclose(rows[:, 0], x @ np.array([2.0, 1.0]))


def test_an_out_of_memory_evaluation_retries_with_half_the_batch():
    # The engine's 8 replicas, as the estimator's config carries them (the accelerator's
    # count is not read).
    config = types.SimpleNamespace(num_replicas=8)
    evaluator = TFEvaluator(config, fw.accel.current(), None, None)
    tried = []

    def run(batch):
        tried.append(batch)
        if batch > 16:
            raise tf.errors.ResourceExhaustedError(None, None, "OOM")
        return batch

    assert evaluator.with_smaller_batches(run, 64, "evaluation") == 16
    assert tried == [64, 32, 16]  # always a multiple of the 8 replicas
    tried.clear()
    with pytest.raises(tf.errors.ResourceExhaustedError):  # 8 cannot halve: give up
        evaluator.with_smaller_batches(lambda b: run(b * 100), 16, "evaluation")
