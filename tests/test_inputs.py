"""`fenwicks.train.inputs.InputManager`: input_fn to distributed iterator, with no model.

In-process on this process's one replica; the batches are numbered so the resume position
can be read off the first batch the iterator yields."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks import _tf_internals
from fenwicks.train import inputs
from fenwicks.train.inputs import InputManager
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.tf.inputs import TFInputManager
from tests._estimator_helpers import handle_deaths, join_discards
from tests.conftest import last_json, run_python

BATCH = 4


def _manager() -> InputManager:
    config = EstimatorConfig(steps_per_epoch=5, work_dir="/tmp/unused", train_batch_size=BATCH,
                             eval_batch_size=BATCH, predict_batch_size=BATCH,
                             steps_per_loop=5, precision="float32", seed=3)
    return TFInputManager(config, fw.accel.current())


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


def _py_function_input(params: dict) -> tf.data.Dataset:
    """A tf.py_function (shape unknown to TensorFlow), batched with drop_remainder."""
    x = tf.data.Dataset.from_tensor_slices(np.zeros((16, 3), np.float32))
    ds = tf.data.Dataset.zip((x, tf.data.Dataset.range(16)))
    return ds.map(lambda x, y: (tf.py_function(lambda a: a * 2, [x], tf.float32), y)).batch(
        params["batch_size"], drop_remainder=True)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_a_py_function_of_unknown_shape_is_told_ensure_shape_not_batch_it(mode):
    """Issue 52: it was told "yields unbatched elements; batch it", though it was batched."""
    what = {"train": "training", "eval": "evaluation"}[mode]
    with pytest.raises(ValueError, match=(
            rf"^{what} input_fn yields a tensor of unknown shape \(component 0 of the "
            r"flattened element .*\), as tf.py_function and tf.numpy_function give: "
            r"batching cannot restore it\. Set it in the map that calls them, e\.g\. "
            r"x = tf.ensure_shape\(tf.py_function\(f, \[x\], tf.float32\), \[32, 32, 3\]\)$")):
        _manager().probe(_py_function_input, mode)

    def fixed(params):  # the advice followed: accepted
        return _py_function_input(params).map(lambda x, y: (tf.ensure_shape(x, [BATCH, 3]), y))

    assert _manager().probe(fixed, mode).features_spec.shape.as_list() == [BATCH, 3]


def test_the_training_iterator_starts_at_the_given_step():
    manager = _manager()
    iterator = manager.train_iterator(_numbered, start_step=3)
    x, y = next(iterator)
    np.testing.assert_array_equal(np.asarray(x)[:, 0], [12, 13, 14, 15])  # 3 * 4 ...
    assert manager.live_train_iterator(_numbered) is iterator
    assert manager.live_train_iterator(lambda params: _numbered(params)) is None
    manager.release()
    assert manager.live_train_iterator(_numbered) is None


# ------------------------------------------------------------------ discarding iterators
# TensorFlow 2.21's iterator destructor sleeps until each autotuning thread next wakes
# (seconds to minutes on 8 replicas), so `discard` drops iterators' resource handles on
# threads of its own. These check where the handles die on this process's one
# replica; test_estimator checks a closed estimator's 8-replica iterator (the stall was
# measured: close() after 64 steps on cpu:8 took 3-17 s, now 0.3 s; see the commit).


class _Deaths:
    """Where an iterator's resource handles are destroyed: `all_on_discard_threads` once
    every one of them died on a `discard` thread."""

    def __init__(self, iterator: object) -> None:
        self.count, self.threads = handle_deaths(iterator)
        assert self.count, "no resource handle found"

    def all_on_discard_threads(self) -> bool:
        return self.threads == [inputs.DISCARD_THREAD] * self.count


def test_released_training_iterators_are_destroyed_off_the_callers_thread():
    manager = _manager()
    died = _Deaths(manager.train_iterator(_numbered, start_step=0))
    manager.release()
    join_discards(60)
    assert died.all_on_discard_threads(), died.threads
    # A new iterator (another input_fn, or a restart) lets go of the old one the same way.
    died = _Deaths(manager.train_iterator(_numbered, start_step=0))
    manager.train_iterator(lambda params: _numbered(params), start_step=0)
    join_discards(60)
    assert died.all_on_discard_threads(), died.threads
    died = _Deaths(manager.live_train_iterator(manager.training_input))
    manager.restart_training_input()
    join_discards(60)
    assert died.all_on_discard_threads() and manager.training_input is None


def test_discard_empties_the_holder_and_destroys_on_its_thread():
    holder = [iter(tf.data.Dataset.range(3))]
    died = _Deaths(holder[0])
    inputs.discard(holder)
    assert holder == []
    join_discards(60)
    assert died.all_on_discard_threads(), died.threads


@pytest.fixture
def full_collections(monkeypatch) -> list[tuple]:
    """The arguments of every `gc.collect` call from here on (it still collects)."""
    calls: list[tuple] = []
    collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *args: calls.append(args) or collect(*args))
    return calls


def test_discard_frees_an_iterator_without_a_full_collection(full_collections):
    # A full collection walks every object of the process (0.25 s of CPU beside
    # TensorFlow); when nothing but discard holds the handles none is needed, and they
    # still die on discard threads.
    strategy = tf.distribute.OneDeviceStrategy("CPU:0")
    distributed = strategy.distribute_datasets_from_function(
        lambda ctx: tf.data.Dataset.range(8).batch(2).repeat())
    for holder in ([iter(tf.data.Dataset.range(5).prefetch(1))], [iter(distributed)]):
        next(holder[0])
        died = _Deaths(holder[0])
        inputs.discard(holder)
        join_discards(60)
        assert died.all_on_discard_threads(), died.threads
    assert full_collections == []


def test_discard_leaves_what_is_still_used_intact(full_collections):
    # The dataset behind the iterator, which the caller still holds, still iterates, and
    # the iterator's handle still dies on a discard thread.
    dataset = tf.data.Dataset.range(5).map(lambda x: x * 2).prefetch(1)
    holder = [iter(dataset)]
    next(holder[0])
    died = _Deaths(holder[0])
    inputs.discard(holder)
    join_discards(60)
    assert died.all_on_discard_threads(), died.threads
    assert [int(x) for x in dataset] == [0, 2, 4, 6, 8]
    # A handle something else still holds (here this test) makes discard ask the full
    # collector, and the handle lives on.
    holder = [iter(dataset)]
    kept = _tf_internals.iterator_resources(holder)
    full_collections.clear()
    inputs.discard(holder)
    join_discards(60)
    assert full_collections == [()] and kept[0].dtype == tf.resource


def test_discard_at_exit_leaves_the_handles_to_the_process_end():
    # Once the main thread ended no thread would be joined, and a destructor still
    # running while TensorFlow is torn down aborts the process: nothing is destroyed.
    out = run_python("""
        import atexit, json, threading, weakref
        import tensorflow as tf
        from fenwicks.train import inputs
        def at_exit():
            holder, died = [iter(tf.data.Dataset.range(3))], []
            weakref.finalize(holder[0]._iterator_resource, lambda: died.append(1))
            inputs.discard(holder)
            print(json.dumps([threading.main_thread().is_alive(), holder, died]))
        atexit.register(at_exit)
    """)
    assert last_json(out.stdout) == [False, [], []]  # and the exit status was 0
