"""`Estimator.check_input` (fenwicks/train/input_check.py) and `train(profile_steps=...)`
(fenwicks/train/profiling.py): a deliberately slow input is judged input-bound, the
vectorised `fw.data` pipeline on the digits is not, and a profile lands where TensorBoard
looks for it."""

from __future__ import annotations

import glob
import os
import re
import time

import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_digits

import fenwicks as fw
from fenwicks.train import input_check
from tests.conftest import run_json

# Seconds per batch in the slow input, against a training step of ~3 ms. Not 50 ms: on
# a busy 2-core host the loop after compilation then ran up to 8% below the input's rate.
SLEEP = 0.1
BATCH = 32        # global batch of the slow run (one replica in this process)
FAST_BATCH = 64   # the demo's global batch


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits(return_X_y=True)
    return (x.reshape(-1, 8, 8, 1) / 16).astype(np.float32), y.astype(np.int32)


def _estimator(work_dir, batch_size, steps_per_loop, width=4):
    opt_func = fw.train.sgd_optimizer(0.01, mom=0.9)
    model_func = fw.train.get_clf_model_func(
        lambda: fw.models.mnist_net(c=width, input_shape=(8, 8, 1)), opt_func)
    return fw.train.get_tpu_estimator(1000, model_func, str(work_dir), trn_bs=batch_size,
                                      steps_per_loop=steps_per_loop, seed=1, verbose=False)


def _slow_input(x, y):
    """Batches of indices that each wait SLEEP seconds in Python, then gather digits."""
    def wait(indices):
        time.sleep(SLEEP)
        return indices

    def input_fn(params):
        batch = params["batch_size"]
        ds = tf.data.Dataset.range(len(x)).repeat().batch(batch, drop_remainder=True)
        ds = ds.map(lambda i: tf.ensure_shape(tf.py_function(wait, [i], tf.int64), [batch]))
        return ds.map(lambda i: (tf.gather(x, i), tf.gather(y, i)))
    return input_fn


def _fast_input(x, y):
    return lambda params: fw.data.numpy_ds(x, y, params["batch_size"], seed=1,
                                           input_context=params.get("input_context"))


@pytest.mark.slow  # 3 s of deliberately slow input, and the compilation
def test_a_slow_python_input_is_judged_input_bound(tmp_path, digits):
    est = _estimator(tmp_path, BATCH, steps_per_loop=10)
    input_fn = _slow_input(*digits)
    est.train(input_fn, steps=30)
    verdict = est.check_input(input_fn, num_batches=10, warmup_batches=2)
    # One batch per SLEEP at most: the waits run one after another (a sequential map).
    ceiling = BATCH / SLEEP  # 320 examples/s
    assert ceiling / 3 < verdict.input_examples_per_sec <= ceiling * 1.02, verdict
    # Training waited for that input: its loops (the first, with compilation, left out)
    # ran at about the same rate; the median of the last two of three loops.
    rates = [rate for _, rate in est.history.examples_per_sec]
    assert len(rates) == 3
    assert verdict.train_examples_per_sec == pytest.approx(np.median(rates[1:]))
    assert verdict.ratio == pytest.approx(verdict.input_examples_per_sec
                                          / verdict.train_examples_per_sec)
    assert verdict.ratio < 1.1 and verdict.input_bound
    assert verdict.verdict == "input-bound"
    line = str(verdict)
    assert line.startswith(f"input delivers {verdict.input_examples_per_sec:,.0f} ex/s, "
                           f"training consumed {verdict.train_examples_per_sec:,.0f} ex/s")
    assert ": input-bound; fix: " in line and "\n" not in line
    # The fixes that apply to this pipeline: its Python, its sequential maps, no prefetch;
    # not the tf.data service (its workers cannot run this process's Python).
    assert "tf.py_function" in line and "num_parallel_calls" in line
    assert ".prefetch" in line and "data service" not in line
    assert est.global_step == 30  # timing the input changed nothing of the run


@pytest.mark.slow  # among the fast subset's longest (several compiled runs)
def test_fw_data_on_the_digits_is_not_input_bound(tmp_path, digits):
    est = _estimator(tmp_path, FAST_BATCH, steps_per_loop=20, width=8)
    input_fn = _fast_input(*digits)
    before = est.check_input(input_fn, num_batches=20, warmup_batches=2)
    assert before.train_examples_per_sec is None and before.ratio is None
    assert before.verdict == "no verdict" and not before.input_bound
    assert "(no steps trained by this estimator yet): no verdict" in str(before)

    est.train(input_fn, steps=100)
    verdict = est.check_input(input_fn, num_batches=100)
    # Every timed step delivered one full global batch: the count is exact.
    assert verdict.input_examples_per_sec == pytest.approx(
        100 * FAST_BATCH / verdict.seconds)
    assert verdict.ratio >= 1.5, verdict
    assert verdict.verdict == "not input-bound" and verdict.advice == ()
    assert str(verdict).endswith(f"({verdict.ratio:.2f}x): not input-bound")
    # The input position belongs to training: checking did not move it.
    est.train(input_fn, steps=1)
    assert est.global_step == 101


def test_the_verdict_thresholds():
    assert input_check.judge(109.0, 100.0)[1] == "input-bound"
    assert input_check.judge(80.0, 100.0)[1] == "input-bound"
    assert input_check.judge(110.0, 100.0)[1] == "close to input-bound"
    assert input_check.judge(150.0, 100.0) == (1.5, "not input-bound")
    assert input_check.judge(150.0, None) == (None, "no verdict")
    # The first loop (compilation) is left out when there are others; the median.
    assert input_check.training_rate([(5, 10.0), (10, 300.0), (15, 100.0),
                                      (20, 200.0)]) == 200.0
    assert input_check.training_rate([(5, 10.0)]) == 10.0
    assert input_check.training_rate([]) is None


def test_the_advice_fits_the_pipeline(tmp_path):
    x = np.zeros((64, 4, 4, 1), np.uint8)
    y = np.zeros(64, np.int32)
    fw.data.numpy_tfrecord(str(tmp_path / "r"), x, y, num_shards=2)
    files = sorted(glob.glob(str(tmp_path / "r*")))

    def parser(record):
        return fw.data.tfexample_numpy_image_parser(record, 4, 4, 1)

    plain = input_check.advice(tf.data.TFRecordDataset(files).map(parser).batch(8))
    assert [fix.split(" (")[0] for fix in plain] == [
        "cache after decoding", "more parallel maps", "more parallel reads",
        "end with .prefetch(tf.data.AUTOTUNE)",
        "the tf.data service: the input work on other machines"]
    # fw.data.tfrecord_ds reads in parallel, maps in parallel and prefetches; only the
    # cache (when not asked for) and the tf.data service are left.
    tuned = input_check.advice(fw.data.tfrecord_ds(str(tmp_path / "r*"), parser, 8))
    assert [fix.split(" (")[0] for fix in tuned] == [
        "cache after decoding", "the tf.data service: the input work on other machines"]
    cached = input_check.advice(fw.data.tfrecord_ds(str(tmp_path / "r*"), parser, 8,
                                                    cache=True))
    assert [fix.split(":")[0] for fix in cached] == ["the tf.data service"]


@pytest.mark.parametrize("kwargs, message", [
    ({"num_batches": 0}, "num_batches=0 must be a positive integer"),
    ({"num_batches": True}, "num_batches=True must be a positive integer"),
    ({"num_batches": "10"}, "num_batches='10' must be a positive integer"),
    ({"warmup_batches": -1}, "warmup_batches=-1 must be an integer >= 0"),
    ({"warmup_batches": 1.5}, "warmup_batches=1.5 must be an integer >= 0"),
])
def test_check_input_rejects_bad_arguments(tmp_path, digits, kwargs, message):
    est = _estimator(tmp_path, FAST_BATCH, steps_per_loop=5)
    with pytest.raises(ValueError, match=message):
        est.check_input(_fast_input(*digits), **kwargs)


def test_check_input_rejects_inputs_that_train_would_reject(tmp_path, digits):
    est = _estimator(tmp_path, FAST_BATCH, steps_per_loop=5)
    with pytest.raises(ValueError, match="input_fn=3 must be a callable"):
        est.check_input(3)
    x, y = digits
    dynamic = lambda params: tf.data.Dataset.from_tensor_slices((x, y)).batch(  # noqa: E731
        params["batch_size"])
    with pytest.raises(ValueError, match="batches of dynamic size"):
        est.check_input(dynamic)
    finite = lambda params: tf.data.Dataset.from_tensor_slices((x[:640], y[:640])).batch(  # noqa: E731, E501
        params["batch_size"], drop_remainder=True)
    with pytest.raises(ValueError, match=r"ran out of data within 110 steps; end the "
                                         r"input_fn's dataset with \.repeat\(\)"):
        est.check_input(finite)


@pytest.mark.slow  # among the fast subset's longest (several compiled runs)
def test_a_file_cache_still_being_written_by_training_is_a_clear_error(tmp_path, digits):
    x, y = digits
    cache = str(tmp_path / "cache")

    def input_fn(params):
        ds = tf.data.Dataset.from_tensor_slices((x, y)).cache(cache).repeat()
        return ds.batch(params["batch_size"], drop_remainder=True)

    est = _estimator(tmp_path / "run", FAST_BATCH, steps_per_loop=5)
    est.train(input_fn, steps=5)  # 320 of the 1,797 digits: the cache is not complete
    with pytest.raises(ValueError, match=re.escape(
            f"file cache '{cache}' is being written by another iterator, the training "
            "input's")):
        est.check_input(input_fn, num_batches=5, warmup_batches=1)
    est.train(input_fn, steps=25)  # 30 x 64 = 1,920 examples: one whole pass, cached
    assert est.check_input(input_fn, num_batches=5, warmup_batches=1).ratio > 0


@pytest.mark.parametrize("profile_steps", [(5, 5), (6, 2), (-1, 3), (1.0, 3), (1, 2, 3),
                                           "1,3", (True, 3)])
def test_bad_profile_steps_are_errors_naming_them_before_anything_trains(
        tmp_path, digits, profile_steps):
    est = _estimator(tmp_path, FAST_BATCH, steps_per_loop=5)
    with pytest.raises(ValueError, match=r"profile_steps=.* must be two global steps "
                                         r"\(a, b\) with 0 <= a < b"):
        est.train(_fast_input(*digits), steps=10, profile_steps=profile_steps)
    assert tf.train.latest_checkpoint(str(tmp_path)) is None


def test_profile_steps_outside_the_call_are_errors_naming_the_steps(tmp_path, digits):
    est = _estimator(tmp_path, FAST_BATCH, steps_per_loop=5)
    with pytest.raises(ValueError, match=r"profile_steps=\(5, 15\) are global steps, but "
                                         r"this train call runs from global step 0 to 10; "
                                         r"e.g. profile_steps=\(0, 10\)"):
        est.train(_fast_input(*digits), steps=10, profile_steps=(5, 15))
    assert est.global_step == 0 and tf.train.latest_checkpoint(str(tmp_path)) is None


@pytest.mark.slow  # among the fast subset's longest (several compiled runs)
def test_profile_steps_write_a_profile_of_exactly_those_steps(tmp_path, digits):
    est = _estimator(tmp_path, FAST_BATCH, steps_per_loop=3)
    est.train(_fast_input(*digits), steps=9, profile_steps=(2, 4))
    # Loops of 3 steps, cut at 2 and 4 so the profiler runs for steps 2 to 4 only.
    assert [step for step, _ in est.history.examples_per_sec] == [2, 4, 7, 9]
    profiles = glob.glob(str(tmp_path / "train" / "plugins" / "profile" / "*" /
                             "*.xplane.pb"))
    assert len(profiles) == 1 and os.path.getsize(profiles[0]) > 0, profiles


def test_two_replicas_count_both_replicas_batches(tmp_path):
    """Under cpu:2 a step is two per-replica batches: the rate counts the global batch."""
    result = run_json(f"""
        import json
        import numpy as np
        import fenwicks as fw
        from tests.test_input_check import _estimator, _fast_input
        from sklearn.datasets import load_digits
        x, y = load_digits(return_X_y=True)
        x = (x.reshape(-1, 8, 8, 1) / 16).astype(np.float32)
        est = _estimator({str(tmp_path)!r}, 64, steps_per_loop=10)
        input_fn = _fast_input(x, y.astype(np.int32))
        est.train(input_fn, steps=30)
        v = est.check_input(input_fn, num_batches=50, warmup_batches=2)
        print(json.dumps({{"replicas": est.num_replicas, "rate": v.input_examples_per_sec,
                          "seconds": v.seconds, "verdict": v.verdict}}))
        """, env={"FENWICKS_DEVICE": "cpu:2"})
    assert result["replicas"] == 2
    assert result["rate"] == pytest.approx(50 * 64 / result["seconds"])
    assert result["verdict"] != "no verdict"


@pytest.mark.slow  # among the fast subset's longest (several compiled runs)
def test_a_profiler_already_running_is_a_warning_and_training_goes_on(tmp_path, digits,
                                                                     caplog):
    est = _estimator(tmp_path / "run", FAST_BATCH, steps_per_loop=3)
    tf.profiler.experimental.start(str(tmp_path / "mine"))  # the user's own profile
    try:
        with caplog.at_level("WARNING", logger="fenwicks"):
            est.train(_fast_input(*digits), steps=6, profile_steps=(3, 6))
    finally:
        tf.profiler.experimental.stop()
    assert est.global_step == 6
    assert "could not start the profiler" in caplog.text
    assert "training goes on without profile_steps=(3, 6)" in caplog.text
    assert glob.glob(str(tmp_path / "mine" / "plugins" / "profile" / "*" / "*.xplane.pb"))
