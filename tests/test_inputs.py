"""`fenwicks.train.inputs.InputManager`: input_fn to distributed iterator, with no model.

In-process on this process's one replica; the batches are numbered so the resume position
can be read off the first batch the iterator yields."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks.train.inputs import InputManager
from fenwicks.train.options import EstimatorConfig

BATCH = 4


def _manager() -> InputManager:
    config = EstimatorConfig(steps_per_epoch=5, work_dir="/tmp/unused", train_batch_size=BATCH,
                             eval_batch_size=BATCH, predict_batch_size=BATCH,
                             steps_per_loop=5, precision="float32", seed=3)
    return InputManager(config, fw.accel.current())


def _numbered(params: dict) -> tf.data.Dataset:
    """Batch n holds the examples 4n .. 4n + 3 (features) and their labels n."""
    x = tf.data.Dataset.range(1000).map(lambda i: tf.cast(i, tf.float32)[None])
    ds = tf.data.Dataset.zip((x, tf.data.Dataset.range(1000)))
    return ds.batch(params["batch_size"], drop_remainder=True).map(
        lambda x, y: (x, y // BATCH))


def test_probe_checks_the_batch_and_gives_the_params_and_features_spec():
    probe = _manager().probe(_numbered, "train")
    assert probe.params["batch_size"] == BATCH and probe.params["seed"] == 3
    assert probe.features_spec.shape.as_list() == [BATCH, 1]
    with pytest.raises(ValueError, match=r"batches of \[2\] examples per replica, but "
                                         r"params\['batch_size'\] is 4"):
        _manager().probe(lambda params: _numbered({"batch_size": 2}), "train")


def test_the_training_iterator_starts_at_the_given_step():
    manager = _manager()
    iterator = manager.train_iterator(_numbered, start_step=3)
    x, y = next(iterator)
    np.testing.assert_array_equal(np.asarray(x)[:, 0], [12, 13, 14, 15])  # 3 * 4 ...
    assert manager.live_train_iterator(_numbered) is iterator
    assert manager.live_train_iterator(lambda params: _numbered(params)) is None
    manager.release()
    assert manager.live_train_iterator(_numbered) is None
