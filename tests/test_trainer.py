"""`fenwicks.train.tf.trainer.Trainer`: the inner loop that the controller and `find_lr`
share. In-process, one replica, a linear model whose numbers are worked out in numpy:
``y = x @ w`` (no bias, zero start), squared error, plain SGD."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks.train.model_func import ModelSpec
from fenwicks.train.tf.trainer import InputExhaustedError, Trainer

LR = 0.05
X = np.array([[1.0, 2.0], [0.5, -1.0], [-2.0, 1.0], [3.0, 0.0]], np.float32)
Y = np.array([1.0, -1.0, 0.5, 2.0], np.float32)


def _trainer(input_steps: bool = False):
    strategy = fw.train.tf.strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(
            1, use_bias=False, kernel_initializer="zeros")])
        optimizer = keras.optimizers.SGD(LR)
        optimizer.build(model.trainable_variables)
        step = tf.Variable(0, dtype=tf.int64)
        position = tf.Variable(0, dtype=tf.int64) if input_steps else None
    spec = ModelSpec(model, optimizer,
                     lambda y, out: tf.square(out[:, 0] - tf.cast(y, tf.float32)))
    trainer = Trainer(strategy, spec, optimizer, step, len(X), input_steps=position)
    return strategy, trainer, model, position


def _iterator(strategy, batches: int | None = None):
    ds = tf.data.Dataset.from_tensors((X, Y))
    ds = ds.repeat() if batches is None else ds.repeat(batches)
    return iter(strategy.experimental_distribute_dataset(ds))


def _numpy_losses(steps: int) -> tuple[list[float], np.ndarray]:
    w, losses = np.zeros(2), []
    for _ in range(steps):
        err = X @ w - Y
        losses.append(float(np.mean(err ** 2)))
        w -= LR * 2 / len(X) * (X.T @ err)
    return losses, w


def test_train_runs_n_steps_and_returns_each_loss_and_the_steps_it_spans():
    strategy, trainer, model, position = _trainer(input_steps=True)
    iterator = _iterator(strategy)
    first = trainer.train(iterator, 3)
    second = trainer.train(iterator, 2)  # another count: the same compiled loop
    losses, w = _numpy_losses(5)
    np.testing.assert_allclose(np.concatenate([first.losses, second.losses]), losses,
                               rtol=1e-5)
    np.testing.assert_allclose(model.get_weights()[0][:, 0], w, rtol=1e-5)
    assert (first.start, first.step, second.start, second.step) == (0, 3, 3, 5)
    assert trainer.global_step == 5 and int(position.numpy()) == 5
    assert second.last_loss == pytest.approx(losses[-1], rel=1e-5)
    assert second.learning_rate == pytest.approx(LR)
    assert first.seconds > 0


def test_running_out_of_data_names_the_step_and_keeps_the_steps_that_ran():
    strategy, trainer, _, position = _trainer(input_steps=True)
    with pytest.raises(InputExhaustedError, match=r"ran out of data at step 2.*repeat\(\)") \
            as caught:
        trainer.train(_iterator(strategy, batches=2), 5)
    assert caught.value.step == 2 and trainer.global_step == 2
    assert int(position.numpy()) == 2  # the input position moved with the steps
    assert isinstance(caught.value, ValueError)
