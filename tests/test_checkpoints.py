"""`fenwicks.train.tf.checkpoints` and `fenwicks.train.tf.checkpointer` through their public
surface, on a tiny Keras model (Dense 3 -> 2 with SGD momentum) in this process.

Every value a test checks is one the test assigned to the variables itself before a
save; a restore into a second, freshly built model must give those values back.
Killed processes, storage outages and the estimator's own use are in test_faults.py,
test_storage_faults.py, test_async_checkpoints.py and test_work_dir.py.
"""

from __future__ import annotations

import logging
import os
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks._tf_internals import checkpoint_management_module
from fenwicks.train.tf import checkpointer as checkpointer_lib
from fenwicks.train.tf import checkpoints
from fenwicks.train.tf.checkpointer import AsyncCheckpointer, SyncCheckpointer

checkpoint_management = checkpoint_management_module()  # where tests inject faults

KINDS = [SyncCheckpointer, AsyncCheckpointer]


class _Run:
    """A tiny run's state: model, optimizer with momentum, step and input position."""

    def __init__(self, units: int = 2) -> None:
        self.model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units)])
        self.optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
        self.optimizer.build(self.model.trainable_variables)
        self.step = tf.Variable(0, dtype=tf.int64, name="global_step")
        self.position = tf.Variable(0, dtype=tf.int64, name="input_steps")
        self.root = checkpoints.make_checkpoint(self.model, self.optimizer, self.step,
                                                self.position)

    def set(self, version: float, step: int) -> None:
        """Assigns values that depend on `version` (and the counters on `step`)."""
        kernel, bias = self.model.layers[0].kernel, self.model.layers[0].bias
        kernel.assign(version + np.arange(6, dtype=np.float32).reshape(3, 2) / 8)
        bias.assign([-version, 2 * version])
        momenta = {tuple(v.shape): v for v in self.optimizer.variables if v.shape.rank}
        momenta[(3, 2)].assign(np.full((3, 2), 10 * version, np.float32))
        momenta[(2,)].assign([version / 2, -version / 2])
        self.optimizer.iterations.assign(step)
        self.step.assign(step)
        self.position.assign(3 * step)  # three batches read per step, say

    def check(self, version: float, step: int) -> None:
        """The values `set(version, step)` assigned, written out by hand."""
        kernel = version + np.array([[0, 1], [2, 3], [4, 5]], np.float32) / 8
        np.testing.assert_array_equal(self.model.layers[0].kernel.numpy(), kernel)
        np.testing.assert_array_equal(self.model.layers[0].bias.numpy(),
                                      np.float32([-version, 2 * version]))
        momenta = {tuple(v.shape): v.numpy() for v in self.optimizer.variables
                   if v.shape.rank}
        np.testing.assert_array_equal(momenta[(3, 2)], np.full((3, 2), 10 * version))
        np.testing.assert_array_equal(momenta[(2,)], np.float32([version / 2, -version / 2]))
        assert int(self.optimizer.iterations.numpy()) == step
        assert (int(self.step.numpy()), int(self.position.numpy())) == (step, 3 * step)


def _restored(directory: str, path: str | None = None) -> tuple[_Run, str | None]:
    """A fresh run restored from `directory` (or `path`), and what was restored."""
    run = _Run()
    return run, SyncCheckpointer(run.root, directory).restore(path)


def _saved(directory: str, kind=SyncCheckpointer, versions=((1.0, 1), (2.0, 2))):
    """Saves one checkpoint per ``(version, step)``; the run and its checkpointer."""
    run = _Run()
    checkpointer = kind(run.root, directory)
    for version, step in versions:
        run.set(version, step)
        checkpointer.save(step)
    checkpointer.wait()
    return run, checkpointer


def _flip_bytes(path: str, count: int = 16) -> None:
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    for i in range(len(raw) // 3, len(raw) // 3 + count):
        raw[i] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(raw))


@pytest.fixture
def state_file_fails(monkeypatch):
    """``fails.add('ckpt-N')``: naming that checkpoint in the state file raises ENOSPC
    (its data and index are written first, as TensorFlow does)."""
    failing: set[str] = set()
    original = checkpoint_management.update_checkpoint_state_internal

    def update(*args, **kwargs):
        named = str(kwargs.get("model_checkpoint_path", args[1:2]))
        if any(named.endswith(name) for name in failing):
            raise tf.errors.ResourceExhaustedError(None, None, "No space left on device")
        return original(*args, **kwargs)

    monkeypatch.setattr(checkpoint_management, "update_checkpoint_state_internal", update)
    return failing


# --------------------------------------------------------------------------- save, restore


@pytest.mark.parametrize("kind", KINDS)
def test_a_restore_gives_back_every_value_set_before_the_save(tmp_path, kind):
    directory = str(tmp_path / "run")
    _, checkpointer = _saved(directory, kind, versions=[(1.5, 7)])
    assert checkpointer.latest == f"{directory}/ckpt-7"
    assert tf.train.latest_checkpoint(directory) == f"{directory}/ckpt-7"
    assert checkpointer.last_save_secs > 0
    run, restored = _restored(directory)
    assert restored == f"{directory}/ckpt-7"
    run.check(1.5, 7)


def test_a_restore_of_a_given_checkpoint_and_the_newest_kept(tmp_path):
    directory = str(tmp_path / "run")
    _, checkpointer = _saved(directory, versions=[(1.0, 1), (2.0, 2), (3.0, 3)])
    run, restored = _restored(directory, f"{directory}/ckpt-2")
    assert restored == f"{directory}/ckpt-2"
    run.check(2.0, 2)
    # keep defaults to 3: a fourth save removes the first.
    run.set(4.0, 4)
    checkpointer_4 = SyncCheckpointer(run.root, directory)
    checkpointer_4.save(4)
    assert sorted(os.path.basename(p) for p in tf.io.gfile.glob(f"{directory}/ckpt-*.index")
                  ) == ["ckpt-2.index", "ckpt-3.index", "ckpt-4.index"]
    assert checkpointer_4.latest == f"{directory}/ckpt-4"


def test_a_restore_from_a_missing_directory_returns_none_and_creates_nothing(tmp_path):
    directory = str(tmp_path / "never")
    run = _Run()
    for kind in KINDS:
        checkpointer = kind(run.root, directory)
        assert checkpointer.restore() is None and checkpointer.latest is None
        checkpointer.close()
    assert not os.path.exists(directory)


@pytest.mark.parametrize("kind", KINDS)
def test_a_step_already_saved_is_not_saved_again_unless_forced(tmp_path, kind):
    directory = str(tmp_path / "run")
    run, checkpointer = _saved(directory, kind, versions=[(1.0, 3)])
    assert checkpointer.last_blocked_secs is not None
    run.set(2.0, 3)  # other weights at the same step
    checkpointer.save(3)
    checkpointer.wait()
    assert checkpointer.last_blocked_secs is None  # nothing was saved
    _restored(directory)[0].check(1.0, 3)
    checkpointer.save(3, force=True)
    checkpointer.wait()
    _restored(directory)[0].check(2.0, 3)
    # A step restored from disk counts as saved.
    again = kind(run.root, directory)
    assert again.restore() == f"{directory}/ckpt-3"
    again.save(3)
    assert again.last_blocked_secs is None


# --------------------------------------------------------------------------- asynchronous


def test_an_async_save_returns_before_the_write_and_writes_the_values_of_its_call(
        tmp_path, monkeypatch):
    directory = str(tmp_path / "run")
    gate = threading.Event()
    original = checkpoint_management.update_checkpoint_state_internal

    def held(*args, **kwargs):
        assert gate.wait(60), "never released"
        return original(*args, **kwargs)

    monkeypatch.setattr(checkpoint_management, "update_checkpoint_state_internal", held)
    run = _Run()
    checkpointer = AsyncCheckpointer(run.root, directory)
    run.set(1.0, 5)
    checkpointer.save(5)
    # Returned while the write waits at the gate: not durable, not yet named.
    assert checkpointer.pending_step == 5 and tf.train.latest_checkpoint(directory) is None
    run.set(9.0, 6)  # training goes on and changes every variable
    checkpointer.save(5)  # the step being written is not saved again
    gate.set()
    checkpointer.wait()
    assert checkpointer.pending_step is None
    assert checkpointer.latest == tf.train.latest_checkpoint(directory) == f"{directory}/ckpt-5"
    _restored(directory)[0].check(1.0, 5)  # the values of save(5)'s moment, not 9.0


@pytest.mark.parametrize("kind", KINDS)
def test_a_failed_write_is_raised_once_naming_the_last_good_checkpoint(
        tmp_path, kind, state_file_fails):
    directory = str(tmp_path / "run")
    run, checkpointer = _saved(directory, kind, versions=[(1.0, 1)])
    state_file_fails.add("ckpt-2")
    run.set(2.0, 2)
    message = (rf"could not write checkpoint {directory}/ckpt-2: No space left on device\. "
               rf"The previous checkpoint \({directory}/ckpt-1\) is intact")
    with pytest.raises(fw.train.CheckpointWriteError, match=message):
        checkpointer.save(2)  # synchronous: here; asynchronous: at the wait
        checkpointer.wait()
    checkpointer.wait()  # raised once
    assert checkpointer.latest == f"{directory}/ckpt-1"
    assert tf.train.latest_checkpoint(directory) == f"{directory}/ckpt-1"
    _restored(directory)[0].check(1.0, 1)
    state_file_fails.clear()  # storage is fine again: the same step is saved, not skipped
    checkpointer.save(2)
    checkpointer.wait()
    assert checkpointer.latest == f"{directory}/ckpt-2"
    _restored(directory)[0].check(2.0, 2)


def test_an_async_failure_is_raised_at_the_next_save_which_then_writes_nothing(
        tmp_path, state_file_fails):
    directory = str(tmp_path / "run")
    run, checkpointer = _saved(directory, AsyncCheckpointer, versions=[(1.0, 1)])
    state_file_fails.add("ckpt-2")
    run.set(2.0, 2)
    checkpointer.save(2)
    run.set(3.0, 3)
    with pytest.raises(fw.train.CheckpointWriteError, match=r"ckpt-1\) is intact.*background"):
        checkpointer.save(3)
    assert checkpointer.pending_step is None and checkpointer.latest == f"{directory}/ckpt-1"


def test_close_waits_is_idempotent_and_a_closed_checkpointer_refuses_work(tmp_path):
    directory = str(tmp_path / "run")
    run = _Run()
    checkpointer = AsyncCheckpointer(run.root, directory)
    run.set(1.0, 4)
    with checkpointer:
        checkpointer.save(4)
    assert tf.train.latest_checkpoint(directory) == f"{directory}/ckpt-4"  # waited
    checkpointer.close()
    with pytest.raises(ValueError, match=r"cannot save: this AsyncCheckpointer of .*closed"):
        checkpointer.save(5)
    with pytest.raises(ValueError, match="cannot restore"):
        checkpointer.restore()


# --------------------------------------------------------------------------- damage, mismatch


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(tmp_path, caplog):
    directory = str(tmp_path / "run")
    _saved(directory)  # ckpt-1 (version 1.0), ckpt-2 (version 2.0)
    data = f"{directory}/ckpt-2.data-00000-of-00001"
    _flip_bytes(data)
    assert checkpoints.diagnose(f"{directory}/ckpt-2").startswith(f"{data} is cut short or "
                                                                  "damaged")
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        run, restored = _restored(directory)
    assert restored == f"{directory}/ckpt-1"
    run.check(1.0, 1)
    assert f"checkpoint {directory}/ckpt-2 is unreadable" in caplog.text
    assert os.path.exists(data + ".corrupt") and not os.path.exists(data)  # kept aside
    assert tf.train.latest_checkpoint(directory) == f"{directory}/ckpt-1"


def test_no_readable_checkpoint_and_a_missing_file_are_named(tmp_path):
    directory = str(tmp_path / "run")
    _saved(directory)
    for step in (1, 2):
        _flip_bytes(f"{directory}/ckpt-{step}.data-00000-of-00001")
    before = sorted(os.listdir(directory))
    with pytest.raises(fw.train.CheckpointCorruptError,
                       match=r"lists 2 checkpoint\(s\) and none can be read"):
        _restored(directory)
    assert sorted(os.listdir(directory)) == before  # nothing set aside or removed
    os.remove(f"{directory}/ckpt-1.index")
    assert checkpoints.diagnose(f"{directory}/ckpt-1") == f"{directory}/ckpt-1.index is missing"


def test_another_models_checkpoint_is_refused_naming_the_variable(tmp_path):
    directory = str(tmp_path / "run")
    _saved(directory)
    wider = _Run(units=3)
    with pytest.raises(fw.train.CheckpointMismatchError,
                       match=r"kernel.*: checkpoint \[3, 2\] vs model \[3, 3\]"):
        SyncCheckpointer(wider.root, directory).restore()
    np.testing.assert_array_equal(wider.model.layers[0].bias.numpy(), np.zeros(3))


# --------------------------------------------------------------------------- following a work_dir


def test_a_change_on_disk_is_seen_by_contents(tmp_path):
    directory = str(tmp_path / "run")
    _, ours = _saved(directory, versions=[(1.0, 1)])
    assert ours.change_on_disk() is None
    other = _Run()
    other.set(5.0, 1)  # another run writes its own ckpt-1 over ours: same name
    SyncCheckpointer(other.root, directory).save(1)
    assert ours.change_on_disk() == "replaced"
    assert ours.restore() == f"{directory}/ckpt-1"
    assert ours.change_on_disk() is None
    for path in tf.io.gfile.glob(f"{directory}/ckpt-*"):
        os.remove(path)
    assert ours.change_on_disk() == "removed"
    assert checkpoints.fingerprint(None) is None


# --------------------------------------------------------------------------- choosing one


def test_create_chooses_async_sync_or_the_workers_scratch_saves(tmp_path, caplog):
    run, directory = _Run(), str(tmp_path / "run")
    assert type(checkpointer_lib.create(run.root, directory)) is AsyncCheckpointer
    assert type(checkpointer_lib.create(run.root, directory, asynchronous=False)
                ) is SyncCheckpointer
    # Several workers save together: synchronous, even when asked for async.
    assert type(checkpointer_lib.create(run.root, directory, workers=2)) is SyncCheckpointer

    class Counter(tf.train.Checkpoint):  # saves a tensor that is not a variable
        def _serialize_to_tensors(self):
            return {"n": tf.constant(1)}

    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        fallback = checkpointer_lib.create(tf.train.Checkpoint(c=Counter()), directory)
    assert type(fallback) is SyncCheckpointer and "saved synchronously" in caplog.text
    worker = checkpointer_lib.create(run.root, directory, workers=2, worker_id=1)
    assert type(worker) is checkpointer_lib.WorkerCheckpointer
    run.set(1.0, 4)
    worker.save(4)
    # It took part in the save and kept nothing: the chief's ckpt-4 is the run's.
    assert not os.path.exists(directory) or os.listdir(directory) == []
    assert worker.latest == f"{directory}/ckpt-4"


def test_a_failed_saves_clean_up_removes_only_that_checkpoints_files(tmp_path):
    """Issue 52: the clean-up after a failed save of ckpt-2 globbed ckpt-2*, which also
    took ckpt-20 and ckpt-21 (another run's, or a later one's)."""
    from fenwicks.train.tf import checkpoints as tf_checkpoints

    keep = ["ckpt-20.index", "ckpt-20.data-00000-of-00001", "ckpt-21.index", "mine.txt"]
    partial = ["ckpt-2.index", "ckpt-2.data-00000-of-00001.tempstate123",
               "ckpt-2_temp/part-00000-of-00001.data-00000-of-00001"]
    for name in keep + partial:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(name.encode())
    tf_checkpoints._remove_partial(str(tmp_path / "ckpt-2"))
    assert sorted(os.listdir(tmp_path)) == sorted(keep)
    assert all((tmp_path / name).read_bytes() == name.encode() for name in keep)
