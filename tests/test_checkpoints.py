"""Reading the TensorFlow checkpoints of work_dirs written before the run format
(`fenwicks.train.tf.checkpoints`, `fenwicks.train.tf.legacy_reader`) through their
public surface, on a tiny Keras model (Dense 3 -> 2 with SGD momentum) in this process.

Fenwicks no longer writes them: the checkpoints here are written with TensorFlow's own
``tf.train.CheckpointManager`` from the root Fenwicks saved (`checkpoints.make_checkpoint`),
the files the TensorFlow engine wrote before the run format. Every value a test checks
is one the test assigned to the variables itself before that save; a restore into a
second, freshly built model must give those values back. Work_dirs written by that code
itself are in test_legacy_work_dirs.py; the run format's saves in test_async_checkpoints.py,
test_faults.py and test_storage_faults.py.
"""

from __future__ import annotations

import logging
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks.train.tf import checkpoints
from fenwicks.train.tf.legacy_reader import LegacyReader


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
    return run, LegacyReader(run.root, directory).restore(path)


def _saved(directory: str, versions=((1.0, 1), (2.0, 2))) -> _Run:
    """Writes one checkpoint per ``(version, step)``, as the TensorFlow engine did before
    the run format (``ckpt-<step>``, keep 3); the run."""
    run = _Run()
    manager = tf.train.CheckpointManager(run.root, directory, max_to_keep=3)
    for version, step in versions:
        run.set(version, step)
        manager.save(checkpoint_number=step)
    return run


def _flip_bytes(path: str, count: int = 16) -> None:
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    for i in range(len(raw) // 3, len(raw) // 3 + count):
        raw[i] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(raw))


# --------------------------------------------------------------------------- restore


def test_a_restore_gives_back_every_value_set_before_the_save(tmp_path):
    directory = str(tmp_path / "run")
    _saved(directory, versions=[(1.5, 7)])
    reader = LegacyReader(_Run().root, directory)
    assert reader.last_good is None
    run, restored = _restored(directory)
    assert restored == f"{directory}/ckpt-7"
    run.check(1.5, 7)


def test_a_restore_of_a_given_checkpoint(tmp_path):
    directory = str(tmp_path / "run")
    _saved(directory, versions=[(1.0, 1), (2.0, 2), (3.0, 3)])
    run = _Run()
    reader = LegacyReader(run.root, directory)
    assert reader.restore(f"{directory}/ckpt-2") == f"{directory}/ckpt-2"
    run.check(2.0, 2)
    assert reader.last_good == f"{directory}/ckpt-2"
    assert sorted(os.listdir(directory)) == [  # read, nothing written
        "checkpoint", *(f"ckpt-{k}.{ext}" for k in (1, 2, 3)
                        for ext in ("data-00000-of-00001", "index"))]


def test_a_restore_from_a_missing_directory_returns_none_and_creates_nothing(tmp_path):
    directory = str(tmp_path / "never")
    reader = LegacyReader(_Run().root, directory)
    assert reader.restore() is None and reader.last_good is None
    assert reader.change_on_disk() is None
    reader.close()
    assert not os.path.exists(directory)


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
        LegacyReader(wider.root, directory).restore()
    np.testing.assert_array_equal(wider.model.layers[0].bias.numpy(), np.zeros(3))


# --------------------------------------------------------------------------- following a work_dir


def test_a_change_on_disk_is_seen_by_contents(tmp_path):
    directory = str(tmp_path / "run")
    _saved(directory, versions=[(1.0, 1)])
    ours = LegacyReader(_Run().root, directory)
    ours.restore()
    assert ours.change_on_disk() is None
    _saved(directory, versions=[(5.0, 1)])  # another ckpt-1 over ours: same name
    assert ours.change_on_disk() == "replaced"
    assert ours.restore() == f"{directory}/ckpt-1"
    assert ours.change_on_disk() is None
    for path in tf.io.gfile.glob(f"{directory}/ckpt-*"):
        os.remove(path)
    assert ours.change_on_disk() == "removed"
    assert checkpoints.fingerprint(None) is None
