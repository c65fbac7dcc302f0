"""Tests for benchmarks/estimator_throughput.py: examples/s through the estimator."""

from __future__ import annotations

import math

import numpy as np
import pytest

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
