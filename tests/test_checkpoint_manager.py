"""`fenwicks.train.tf.checkpoint_manager`: the compiled write and the keep-N bookkeeping,
through their public surface, in this process.

Every value checked is one the test assigned before the save; the files and the state
file are read back with TensorFlow's own public readers (`tf.train.load_checkpoint`,
`tf.train.get_checkpoint_state`, `tf.train.CheckpointManager`).
"""

from __future__ import annotations

import os
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks._text import first_line
from fenwicks._tf_internals import checkpoint_management_module
from fenwicks.train.tf import checkpoints
from fenwicks.train.tf.checkpoint_manager import CheckpointManager, CompiledWrite
from fenwicks.train.tf.checkpointer import AsyncCheckpointer


def _values(prefix: str) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(prefix)
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()}


def _names(directory: str) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith("ckpt-"))


def test_compiled_writes_keep_the_newest_and_the_books_tensorflow_reads(tmp_path):
    directory = str(tmp_path / "run")
    weights, step = tf.Variable([0.0, 0.0]), tf.Variable(0, dtype=tf.int64)
    root = tf.train.Checkpoint(weights=weights, step=step)
    manager = CheckpointManager(root, directory, max_to_keep=2)
    for k in (1, 2, 3, 4):
        weights.assign([k, -k / 4])
        step.assign(10 * k)
        assert manager.save(checkpoint_number=k) == f"{directory}/ckpt-{k}"
        assert manager.write.traced == (k > 1)  # the first write of a graph is eager
    # The newest two, each with the values of its own moment, in one data file each.
    assert _names(directory) == ["ckpt-3.data-00000-of-00001", "ckpt-3.index",
                                 "ckpt-4.data-00000-of-00001", "ckpt-4.index"]
    for k in (3, 4):
        saved = _values(f"{directory}/ckpt-{k}")
        np.testing.assert_array_equal(saved["weights/.ATTRIBUTES/VARIABLE_VALUE"],
                                      np.float32([k, -k / 4]))
        assert saved["step/.ATTRIBUTES/VARIABLE_VALUE"] == 10 * k
        assert saved["save_counter/.ATTRIBUTES/VARIABLE_VALUE"] == k  # saves made
    # The same keys and object graph as an eager write of the same root.
    eager = _values(root.write(str(tmp_path / "eager" / "probe")))
    traced = _values(f"{directory}/ckpt-4")
    assert sorted(eager) == sorted(traced)
    assert eager["_CHECKPOINTABLE_OBJECT_GRAPH"] == traced["_CHECKPOINTABLE_OBJECT_GRAPH"]
    # The state file, as TensorFlow reads it: relative paths, one time per checkpoint.
    state = tf.train.get_checkpoint_state(directory)
    assert list(state.all_model_checkpoint_paths) == [f"{directory}/ckpt-3",
                                                      f"{directory}/ckpt-4"]
    assert len(state.all_model_checkpoint_timestamps) == 2
    assert "ckpt-4" in open(f"{directory}/checkpoint").read().split("\n")[0]
    assert directory not in open(f"{directory}/checkpoint").read()
    assert tf.train.latest_checkpoint(directory) == f"{directory}/ckpt-4"
    # TensorFlow's own manager, opened on the directory, counts them towards its keep.
    tf.train.CheckpointManager(root, directory, max_to_keep=2).save(checkpoint_number=5)
    assert [n for n in _names(directory) if n.endswith(".index")] == ["ckpt-4.index",
                                                                      "ckpt-5.index"]
    # A new manager reads the state file: keep 1 leaves the one it writes.
    again = CheckpointManager(root, directory, max_to_keep=1)
    assert again.latest_checkpoint == f"{directory}/ckpt-5"
    again.save(checkpoint_number=6)
    assert _names(directory) == ["ckpt-6.data-00000-of-00001", "ckpt-6.index"]
    assert again.checkpoints == [f"{directory}/ckpt-6"]
    with pytest.raises(ValueError, match=r"max_to_keep=0 must be a positive int"):
        CheckpointManager(root, directory, max_to_keep=0)


def _slots_model() -> tuple[keras.Model, keras.optimizers.Optimizer, tf.train.Checkpoint]:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)  # slots not built yet
    return model, optimizer, tf.train.Checkpoint(model=model, optimizer=optimizer)


def _momenta(prefix: str) -> dict[tuple[int, ...], np.ndarray]:
    """The momentum slots in checkpoint `prefix`, by shape (the only variables saved
    under ``optimizer/_variables/``)."""
    return {value.shape: value for key, value in _values(prefix).items()
            if key.startswith("optimizer/_variables/")}


def _set_slots(optimizer: keras.optimizers.Optimizer, value: float) -> None:
    for slot in optimizer.variables:
        if slot.shape.rank:
            slot.assign(np.full(slot.shape, value, np.float32))


@pytest.mark.parametrize("kind", ["compiled", "background"])
def test_slots_built_after_the_write_was_compiled_are_in_the_next_checkpoint(
        tmp_path, monkeypatch, kind):
    directory = str(tmp_path / "run")
    model, optimizer, root = _slots_model()
    if kind == "compiled":
        manager = CheckpointManager(root, directory, max_to_keep=5)

        def save(step: int) -> None:
            manager.save(checkpoint_number=step)
            _set_slots(optimizer, 100.0)  # after the write: not in it
    else:
        # Each background write waits until training has changed the slots again: the
        # checkpoint must hold the copies taken when save() was called.
        released = threading.Semaphore(0)
        write = CompiledWrite.__call__
        monkeypatch.setattr(CompiledWrite, "__call__", lambda self, prefix: (
            released.acquire(timeout=60) and write(self, prefix)))
        checkpointer = AsyncCheckpointer(root, directory, keep=5)

        def save(step: int) -> None:
            checkpointer.save(step)
            _set_slots(optimizer, 100.0)  # training goes on while the write waits
            released.release()
            checkpointer.wait()

    save(1)
    save(2)  # compiled from here on (in the background, the copies too)
    assert _momenta(f"{directory}/ckpt-2") == {}
    optimizer.build(model.trainable_variables)  # two slots: (3, 2) and (2,)
    for step, scale in ((3, 0.5), (4, 0.25), (5, -2.0)):
        _set_slots(optimizer, scale)
        save(step)
        momenta = _momenta(f"{directory}/ckpt-{step}")
        assert sorted(momenta) == [(2,), (3, 2)]
        np.testing.assert_array_equal(momenta[(3, 2)], np.full((3, 2), scale, np.float32))
        np.testing.assert_array_equal(momenta[(2,)], np.full(2, scale, np.float32))
    if kind == "compiled":
        assert manager.write.traced  # traced again for the graph with the slots


def test_a_failed_compiled_write_names_tensorflows_cause_and_keeps_the_latest(tmp_path):
    directory = str(tmp_path / "run")
    manager = CheckpointManager(tf.train.Checkpoint(v=tf.Variable([1.0])), directory, 3)
    checkpoints.save(manager, 1)
    checkpoints.save(manager, 2)
    assert manager.write.traced
    for name in os.listdir(directory):
        os.remove(os.path.join(directory, name))
    os.rmdir(directory)
    open(directory, "w").close()  # the work_dir is now a file: no write can succeed
    with pytest.raises(fw.train.CheckpointWriteError) as raised:
        checkpoints.save(manager, 3)
    cause = raised.value.__cause__
    assert isinstance(cause, tf.errors.FailedPreconditionError)
    # TensorFlow's own words, not the compiled function's "Graph execution error:".
    assert first_line(cause) == f"{directory}/ckpt-3_temp; Not a directory"
    assert str(raised.value).startswith(f"could not write checkpoint {directory}/ckpt-3: "
                                        f"{directory}/ckpt-3_temp; Not a directory. The "
                                        f"previous checkpoint ({directory}/ckpt-2) is intact")
    assert manager.latest_checkpoint == f"{directory}/ckpt-2"


def test_an_async_save_waited_for_is_written_in_the_calling_thread(tmp_path, monkeypatch):
    directory = str(tmp_path / "run")
    threads = []
    module = checkpoint_management_module()  # the documented hook: who names a checkpoint
    original = module.update_checkpoint_state_internal
    monkeypatch.setattr(module, "update_checkpoint_state_internal", lambda *a, **k: (
        threads.append(threading.current_thread().name), original(*a, **k))[1])
    variable = tf.Variable([0.0, 0.0])
    checkpointer = AsyncCheckpointer(tf.train.Checkpoint(v=variable), directory, keep=2)
    for step in (1, 2, 3):
        variable.assign([step, 2 * step])
        checkpointer.save_and_wait(step)
        assert checkpointer.pending_step is None
        assert checkpointer.latest == tf.train.latest_checkpoint(directory) == (
            f"{directory}/ckpt-{step}")
        np.testing.assert_array_equal(
            _values(f"{directory}/ckpt-{step}")["v/.ATTRIBUTES/VARIABLE_VALUE"],
            np.float32([step, 2 * step]))
    checkpointer.save(4)  # the ordinary save still writes in the background
    checkpointer.wait()
    # One naming per save, and a second once the oldest is removed (keep=2: saves 3, 4).
    assert threads == ["MainThread"] * 4 + ["fenwicks checkpoint writer (ckpt-4)"] * 2
