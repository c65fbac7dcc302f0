"""fw.train schedules: values at chosen steps against hand computation, Python/numpy/tensor
inputs, compiled use, Keras optimizer use, config round trips, bad inputs."""

from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw

T = fw.train


@pytest.mark.parametrize("schedule,step,expected", [
    # DavidNet: 0 -> 0.4 over epochs 0..5, back to 0 at 24; constant outside.
    (T.piecewise_linear([0, 5, 24], [0, 0.4, 0]), 2.5, 0.2),
    (T.piecewise_linear([0, 5, 24], [0, 0.4, 0]), 5, 0.4),
    (T.piecewise_linear([0, 5, 24], [0, 0.4, 0]), 14.5, 0.2),
    (T.piecewise_linear([0, 5, 24], [0, 0.4, 0]), 30, 0.0),
    (T.piecewise_linear([0, 5, 24], [0, 0.4, 0], steps_per_epoch=10), 25, 0.2),
    (T.piecewise_linear([2], [0.3]), 100, 0.3),
    (T.linear_decay(0.1, 1000), 250, 0.075),
    (T.linear_decay(0.1, 1000, end_lr=0.02), 2000, 0.02),
    (T.cosine_decay(1.0, 100), 25, 0.5 * (1 + math.cos(math.pi / 4))),
    (T.cosine_decay(1.0, 100, end_lr=0.1), 100, 0.1),
    (T.exp_decay_lr(0.01, 2000, base_lr=1e-4), 4000, 1e-4 + (0.01 - 1e-4) * math.exp(-2)),
    (T.exp_decay_lr(0.01, 100, decay_rate=0.5, staircase=True), 150, 0.005),
    (T.exp_decay_lr(0.01, 100, decay_rate=0.5, warmup_steps=10), 5, 0.005),
    (T.exp_decay_lr(0.01, 100, decay_rate=0.5, warmup_steps=10), 110, 0.005),
    (T.one_cycle_lr(0.4, 100, 20, T.linear_decay()), 10, 0.2),
    (T.one_cycle_lr(0.4, 100, 20, T.linear_decay()), 20, 0.4),
    (T.one_cycle_lr(0.4, 100, 20, T.linear_decay()), 60, 0.2),
    (T.one_cycle_lr(0.4, 100, 20, T.linear_decay()), 100, 0.0),
    (T.one_cycle_lr(0.4, 100, 20, T.cosine_decay()), 40, 0.4 * 0.5 * (1 + math.cos(math.pi / 4))),
    (T.one_cycle_lr(1.0, 100, 0, T.linear_decay(end_lr=0.1)), 100, 0.1),
    (T.one_cycle_lr(1.0, 30, 10, T.exp_decay_lr(1.0, 5, decay_rate=0.5)), 20, 0.25),
    (T.linear_warmup(T.cosine_decay(0.1, 90), 10), 5, 0.05),
    (T.linear_warmup(T.cosine_decay(0.1, 90), 10), 55, 0.05),
    (T.one_cycle_momentum(100, 20, 0.95, 0.85), 10, 0.90),
    (T.one_cycle_momentum(100, 20, 0.95, 0.85), 60, 0.90),
    (T.linear_decay(0.4, 10) / 4, 5, 0.05),
    (2 * T.linear_decay(0.4, 10), 5, 0.4),
])
def test_values_by_hand(schedule, step, expected):
    assert schedule(step) == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert isinstance(schedule(step), float)
    # The same value from a tensor and from inside compiled code.
    tensor = tf.function(lambda s: schedule(s))(tf.constant(step, tf.float32))
    assert float(tensor) == pytest.approx(expected, rel=1e-5, abs=1e-7)


def test_numpy_steps_give_arrays_for_plots():
    schedule = T.piecewise_linear([0, 5, 24], [0, 0.4, 0])
    steps = np.arange(0, 30)
    np.testing.assert_allclose(schedule(steps), np.interp(steps, [0, 5, 24], [0, 0.4, 0]),
                               rtol=1e-5, atol=1e-7)
    assert schedule(np.int64(5)) == pytest.approx(0.4)


def test_int64_step_variable_like_keras_iterations():
    schedule = T.one_cycle_lr(0.4, 100, 20)
    step = tf.Variable(60, dtype=tf.int64)
    assert float(schedule(step)) == pytest.approx(0.2)


def test_keras_optimizer_reads_schedule_at_iterations():
    opt = keras.optimizers.SGD(T.one_cycle_lr(0.4, 100, 20))
    var = keras.Variable(1.0)
    for _ in range(10):
        opt.apply_gradients([(tf.constant(0.0), var)])
    assert float(opt.learning_rate) == pytest.approx(0.2)


@pytest.mark.parametrize("schedule", [
    T.one_cycle_lr(0.4, 100, 20, T.cosine_decay(end_lr=0.1)),
    T.exp_decay_lr(0.01, 100, base_lr=1e-4, warmup_steps=5, staircase=True),
    T.piecewise_linear([0, 5, 24], [0, 0.4, 0], steps_per_epoch=3) / 512,
    T.one_cycle_momentum(100, 20),
    T.Constant(0.3),
])
def test_config_round_trip(schedule):
    steps = np.array([0, 3, 10, 20, 37, 60, 99, 150])
    config = keras.saving.serialize_keras_object(schedule)
    clone = keras.saving.deserialize_keras_object(config)
    assert type(clone) is type(schedule)
    np.testing.assert_allclose(clone(steps), schedule(steps))
    again = type(schedule).from_config(schedule.get_config())
    np.testing.assert_allclose(again(steps), schedule(steps))


def test_function_schedule_wraps_plain_functions():
    opt = T.sgd_optimizer(lambda step: 0.1 * 0.5 ** tf.floor(step / 10))()
    assert float(opt.learning_rate) == pytest.approx(0.1)


@pytest.mark.parametrize("make,name", [
    (lambda: T.one_cycle_lr(0.4, 100, 100), "warmup_steps"),
    (lambda: T.one_cycle_lr(0.4, 100, 150), "warmup_steps"),
    (lambda: T.one_cycle_lr(-0.4, 100, 10), "init_lr"),
    (lambda: T.one_cycle_lr(float("inf"), 100, 10), "init_lr"),
    (lambda: T.one_cycle_lr(0.4, 0, 0), "total_steps"),
    (lambda: T.one_cycle_lr(0.4, 100, 10, decay_sched=0.5), "decay_sched"),
    (lambda: T.piecewise_linear([0, 5, 5], [0, 0.4, 0]), "knots"),
    (lambda: T.piecewise_linear([0, 24, 5], [0, 0.4, 0]), "knots"),
    (lambda: T.piecewise_linear([0, 5], [0, 0.4, 0]), "knots"),
    (lambda: T.piecewise_linear([0, 5], [0, float("nan")]), "values"),
    (lambda: T.linear_decay(0.1, -5), "decay_steps"),
    (lambda: T.linear_decay(float("nan"), 5), "init_lr"),
    (lambda: T.cosine_decay(0.1, 10, end_lr=-1), "end_lr"),
    (lambda: T.exp_decay_lr(0.01, 100, decay_rate=1.5), "decay_rate"),
    (lambda: T.exp_decay_lr(0.01, 100, base_lr=0.1), "base_lr"),
    (lambda: T.exp_decay_lr(0.01, 100, warmup_steps=-1), "warmup_steps"),
    (lambda: T.linear_warmup(T.cosine_decay(0.1, 90), 0), "warmup_steps"),
    (lambda: T.one_cycle_momentum(100, 20, max_mom=1.2), "max_mom"),
    (lambda: T.one_cycle_momentum(100, 120), "warmup_steps"),
    (lambda: T.linear_decay(0.1, 10) / 0, "divisor"),
])
def test_bad_inputs_name_the_argument(make, name):
    with pytest.raises(ValueError, match=name):
        make()
