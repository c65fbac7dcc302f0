"""Tests for benchmarks/estimator_throughput.py (examples/s through the estimator) and for
the trial protocol of benchmarks/train_throughput.py (estimator vs fit vs a hand loop)."""

from __future__ import annotations

import math
import types

import numpy as np
import pytest

from benchmarks import train_throughput as compare
from benchmarks.estimator_throughput import train_throughput
from tests.conftest import shared_snippet


def test_throughput_rejects_bad_input():
    with pytest.raises(ValueError, match="batch_size=0"):
        train_throughput(lambda params: None, lambda params: None, batch_size=0)
    with pytest.raises(ValueError, match="steps=0"):
        train_throughput(lambda params: None, lambda params: None, 8, steps=0)


_SUBPROCESS = """
import json, tempfile
import numpy as np, keras, tensorflow as tf
import fenwicks as fw
from benchmarks.estimator_throughput import train_throughput

out = {}
X = np.random.default_rng(0).standard_normal((64, 4)).astype("float32")
y = (X[:, 0] > 0).astype("int32")
def model_func(params):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    return fw.train.ModelSpec(model, keras.optimizers.SGD(0.1),
                              loss_fn=fw.train.sparse_softmax_cross_entropy)
def input_fn(params):
    ds = tf.data.Dataset.from_tensor_slices((X, y)).repeat()
    return ds.batch(params["batch_size"], drop_remainder=True)
work_dir = tempfile.mkdtemp()
result = train_throughput(model_func, input_fn, batch_size=16, steps=5, trials=2,
                          work_dir=work_dir)
out["throughput"] = result.as_dict()
est = fw.train.get_tpu_estimator(5, model_func, work_dir, trn_bs=16, verbose=False)
eval_fn = lambda params: tf.data.Dataset.from_tensor_slices((X, y)).batch(
    params["batch_size"])
out["global_step"] = est.evaluate(eval_fn)["global_step"]  # restored from the checkpoint
try:
    train_throughput(model_func, input_fn, batch_size=16, work_dir=work_dir)
except ValueError as err:
    out["used_dir_error"] = str(err)
print(json.dumps(out))
"""


_RESULT = shared_snippet("cpu:2", "bench_throughput", _SUBPROCESS)


def test_train_throughput_counts_examples():
    out = _RESULT()
    result = out["throughput"]
    assert result["device"] == "cpu x2" and result["batch_size"] == 16
    assert len(result["seconds"]) == 2
    assert result["examples_per_second"] == pytest.approx(
        5 * 16 / np.median(result["seconds"]))
    # the cold call, the warm-up and 2 timed calls each trained 5 steps
    assert out["global_step"] == 5 * 4
    assert math.isfinite(result["cold_examples_per_second"])
    assert "holds a checkpoint" in out["used_dir_error"]


# ------------------------------------------------- train_throughput.py's trial protocol


def _fake_runs(seconds: dict[str, list[float]], monkeypatch) -> tuple[dict, list[str]]:
    """Runs that take the given seconds on a fake clock, in the order they are called."""
    now, order = [0.0], []
    monkeypatch.setattr(compare, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    def run(name):
        durations = iter(seconds[name])

        def call(steps):
            order.append(name)
            now[0] += next(durations)
        return call

    return {name: run(name) for name in seconds}, order


def test_trials_alternate_with_est_and_the_control_next_to_hand(monkeypatch):
    seconds = {"est": [1.25, 1.0, 2.0], "hand": [1.0, 1.0, 1.0], "hand2": [0.8, 1.0, 1.0],
               "fit": [3.0, 3.0, 3.0]}
    runs, order = _fake_runs(seconds, monkeypatch)
    rates = compare.time_trials(runs, steps=10, batch=4, trials=3)
    assert order == ["est", "hand", "hand2", "fit", "fit", "hand2", "hand", "est",
                     "est", "hand", "hand2", "fit"]
    # examples/s: 10 steps x 4 examples over the best and the median trial's seconds
    assert rates["est"] == pytest.approx(40 / 1.0)
    assert rates["median"]["est"] == pytest.approx(40 / 1.25)
    assert rates["hand2"] == pytest.approx(40 / 0.8)
    assert rates["median"]["hand2"] == pytest.approx(40 / 1.0)
    # each trial's est/hand: 0.8, 1.0, 0.5; hand2/hand: 1.25, 1.0, 1.0
    assert rates["paired"] == pytest.approx(0.8)
    assert rates["control_paired"] == pytest.approx(1.0)


def test_without_the_control_nothing_extra_runs(monkeypatch):
    runs, order = _fake_runs({"est": [1.0, 2.0], "hand": [1.0, 1.0], "fit": [1.0, 1.0]},
                             monkeypatch)
    rates = compare.time_trials(runs, steps=10, batch=4, trials=2)
    assert order == ["est", "hand", "fit", "fit", "hand", "est"]
    assert "control_paired" not in rates
    assert rates["paired"] == pytest.approx(0.75)  # the median of 1.0 and 0.5


def test_each_replica_count_child_gets_the_options_and_the_flag_only_when_set():
    with_control = compare.child_argv(compare.make_parser().parse_args(
        ["--trials", "5", "--control", "--replicas", "1"]))
    assert "--control" in with_control and "--trials=5" in with_control
    assert not any(arg.startswith("--replicas") for arg in with_control)
    assert compare.make_parser().parse_args(["--child", *with_control]).control is True
    without = compare.child_argv(compare.make_parser().parse_args(["--trials", "5"]))
    assert not any(arg.startswith("--control") for arg in without)
    assert compare.make_parser().parse_args(["--child", *without]).control is False
