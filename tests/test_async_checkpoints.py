"""Tests for fenwicks.train.tf.async_checkpoints: a background save writes what a synchronous
save writes, training goes on meanwhile, the state file names only complete checkpoints,
and a failed write is raised at the next sync point naming the last good checkpoint.

Killed processes (SIGKILL mid-write, SIGTERM) are in test_faults.py, on local disk and
on gs:// through the emulator.
"""

from __future__ import annotations

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks._tf_internals import checkpoint_management_module
from fenwicks.train.tf import async_checkpoints
from tests import _flagship
from tests.conftest import run_json

checkpoint_management = checkpoint_management_module()  # where tests inject faults

MODEL = "mnist_net"


def _estimator(work_dir, **kwargs):
    return _flagship.estimator(MODEL, str(work_dir), steps_per_loop=5, save_every_loops=1,
                               save_every_secs=None, **kwargs)


@pytest.fixture(scope="module")
def data():
    return _flagship.digits(MODEL)


def _tensors(prefix):
    reader = tf.train.load_checkpoint(prefix)
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
            if not key.startswith("save_counter")}


def test_a_background_checkpoint_holds_exactly_what_a_synchronous_one_holds(tmp_path, data):
    est = _estimator(tmp_path / "run")
    est.train(_flagship.train_input(*data), steps=5)
    root = est.parts.state.checkpoint_root
    # What async_checkpoints=False writes: the same root through a CheckpointManager.
    synchronous = _tensors(tf.train.CheckpointManager(root, str(tmp_path / "sync"), 1,
                                                      checkpoint_name="ckpt").save(5))
    background = _tensors(str(tmp_path / "run" / "ckpt-5"))
    # Same keys, same bytes, and the same object graph (so either restores either way).
    assert sorted(background) == sorted(synchronous)
    for key, value in synchronous.items():
        assert np.asarray(background[key]).tobytes() == np.asarray(value).tobytes(), key
    # ... and they are the weights in memory, read independently of any checkpoint.
    for variable in est.model.variables:
        key = next(k for k in background if k.endswith(".ATTRIBUTES/VARIABLE_VALUE")
                   and np.shape(background[k]) == tuple(variable.shape)
                   and np.array_equal(background[k], np.asarray(variable)))
        assert key


class _Gate(keras.callbacks.Callback):
    """Holds ckpt-5's state-file entry until the loop after it has run, and records what
    the work_dir says meanwhile."""

    def __init__(self, work_dir, monkeypatch):
        super().__init__()
        self.work_dir, self.seen = str(work_dir), {}
        self.reached, self.open = threading.Event(), threading.Event()
        original = checkpoint_management.update_checkpoint_state_internal

        def held(*args, **kwargs):
            self.seen.setdefault("thread", threading.current_thread().name)
            self.reached.set()
            assert self.open.wait(60), "the gate was never opened"
            return original(*args, **kwargs)

        monkeypatch.setattr(checkpoint_management, "update_checkpoint_state_internal", held)

    def on_train_batch_end(self, batch, logs=None):
        if batch == 10 and not self.open.is_set():  # the loop after ckpt-5's save
            assert self.reached.wait(60), "ckpt-5's files were never written"
            self.seen["latest"] = tf.train.latest_checkpoint(self.work_dir)
            self.seen["index_written"] = tf.io.gfile.exists(f"{self.work_dir}/ckpt-5.index")
            self.open.set()


def test_training_goes_on_while_the_checkpoint_is_written(tmp_path, data, monkeypatch):
    work = tmp_path / "run"
    est = _estimator(work)
    gate = _Gate(work, monkeypatch)
    est.train(_flagship.train_input(*data), steps=15, callbacks=[gate])
    # Steps 6-10 ran while ckpt-5 was being written; its files were there, but the state
    # file did not name it yet: a process killed then resumes from the checkpoint before.
    assert gate.seen["index_written"] and gate.seen["latest"] is None
    assert gate.seen["thread"].startswith("fenwicks checkpoint writer")
    # The end of train waited for the last write.
    assert tf.train.latest_checkpoint(str(work)) == str(work / "ckpt-15")
    assert est.parts.state.last_good_checkpoint == str(work / "ckpt-15")


def test_synchronous_checkpoints_are_an_option(tmp_path, data, monkeypatch):
    threads = []
    original = checkpoint_management.update_checkpoint_state_internal
    monkeypatch.setattr(checkpoint_management, "update_checkpoint_state_internal",
                        lambda *a, **k: threads.append(threading.current_thread())
                        or original(*a, **k))
    est = _estimator(tmp_path / "run", async_checkpoints=False)
    est.train(_flagship.train_input(*data), steps=10)
    assert threads and set(threads) == {threading.main_thread()}
    with pytest.raises(ValueError, match=r"async_checkpoints='yes' must be True or False"):
        _estimator(tmp_path / "bad", async_checkpoints="yes")


def test_a_failed_background_write_is_raised_at_the_next_save_naming_the_last_good(
        tmp_path, data, monkeypatch):
    work = tmp_path / "run"
    est = _estimator(work)
    original = checkpoint_management.update_checkpoint_state_internal

    def disk_full_at_ten(*args, **kwargs):
        if "ckpt-10" in str(kwargs.get("model_checkpoint_path", args[1:2])):
            raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")
        return original(*args, **kwargs)

    monkeypatch.setattr(checkpoint_management, "update_checkpoint_state_internal",
                        disk_full_at_ten)
    with pytest.raises(fw.train.CheckpointWriteError,
                       match=r"ckpt-10: No space left on device\. The previous checkpoint "
                             rf"\({work / 'ckpt-5'}\) is intact.*in the background"):
        est.train(_flagship.train_input(*data), steps=20)
    # Raised when the save of step 15 waited for it: training had gone on to step 15.
    assert est.global_step == 15
    assert tf.train.latest_checkpoint(str(work)) == str(work / "ckpt-5")
    assert est.parts.state.last_good_checkpoint == str(work / "ckpt-5")
    monkeypatch.setattr(checkpoint_management, "update_checkpoint_state_internal", original)
    est.train(_flagship.train_input(*data), steps=5)  # storage is fine again: saved
    assert tf.train.latest_checkpoint(str(work)) == str(work / "ckpt-20")


def test_close_and_a_restore_wait_for_the_write(tmp_path, data):
    work = tmp_path / "run"
    est = _estimator(work)
    est.train(_flagship.train_input(*data), steps=5)
    est.parts.state.step_counter.assign(7)  # as if two more steps ran: a save is due
    checkpointer = est.parts.state.checkpointer
    checkpointer.save(7)
    assert checkpointer.pending_step == 7 or tf.io.gfile.exists(str(work / "ckpt-7.index"))
    est.close()
    assert checkpointer.pending_step is None
    assert tf.train.latest_checkpoint(str(work)) == str(work / "ckpt-7")
    again = _estimator(work)
    again.evaluate(_flagship.eval_input(*data))
    assert again.global_step == 7


def test_an_object_saving_more_than_variables_is_refused_by_name():
    class Counter(tf.train.Checkpoint):  # a saveable that is not a variable
        def _serialize_to_tensors(self):
            return {"n": tf.constant(1)}

    root = tf.train.Checkpoint(thing=Counter(), v=tf.Variable(1.0))
    with pytest.raises(async_checkpoints.UnsupportedAsyncCheckpointError,
                       match="Counter .* async_checkpoints=False"):
        async_checkpoints.host_copies(root)


def test_interpreter_exit_waits_for_the_write(tmp_path):
    work = tmp_path / "run"
    out = run_json(f"""
import json, time
from fenwicks._tf_internals import checkpoint_management_module
checkpoint_management = checkpoint_management_module()
from tests import _flagship
original = checkpoint_management.update_checkpoint_state_internal

def slow(*args, **kwargs):  # the write of ckpt-7 outlives the script
    time.sleep(2)
    return original(*args, **kwargs)

checkpoint_management.update_checkpoint_state_internal = slow
x, y = _flagship.digits("mnist_net")
est = _flagship.estimator("mnist_net", {str(work)!r}, steps_per_loop=5)
est.train(_flagship.train_input(x, y), steps=5)
est.parts.state.step_counter.assign(7)  # as if two more steps ran
est.parts.state.checkpointer.save(7)
print(json.dumps(est.parts.state.checkpointer.pending_step))  # then the interpreter exits
""", fresh=True)
    assert out == 7  # save() had returned with the write of step 7 still running
    assert tf.train.latest_checkpoint(str(work)) == str(work / "ckpt-7")
