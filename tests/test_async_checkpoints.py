"""Asynchronous saves of the run format (`fenwicks.train.run_format.RunCheckpointer`): a
background save writes what a synchronous save writes, training goes on meanwhile, a
step is only listed once complete, and a failed write is raised at the next sync point
naming the last good checkpoint.

Killed processes (SIGKILL mid-write, SIGTERM) are in test_faults.py, on local disk and
on gs:// through the emulator.
"""

from __future__ import annotations

import errno
import json
import threading

import keras
import numpy as np
import orbax.checkpoint as ocp
import pytest

import fenwicks as fw
from fenwicks.train import run_format
from tests import _flagship
from tests.conftest import run_json

MODEL = "mnist_net"


def _estimator(work_dir, **kwargs):
    return _flagship.estimator(MODEL, str(work_dir), steps_per_loop=5, save_every_loops=1,
                               save_every_secs=None, **kwargs)


@pytest.fixture(scope="module")
def data():
    return _flagship.digits(MODEL)


def _step(work, step):
    path = f"{work}/checkpoints/{step}"
    record = run_format.read_record(path)
    return record, run_format.read_arrays(path, record)


def test_a_background_checkpoint_holds_exactly_what_a_synchronous_one_holds(tmp_path, data):
    est = _estimator(tmp_path / "run")
    est.train(_flagship.train_input(*data), steps=5)
    state = est.parts.state
    # What async_checkpoints=False writes: the same state, written in this thread.
    synchronous = run_format.RunCheckpointer(str(tmp_path / "sync"), state, keep=1,
                                             asynchronous=False)
    synchronous.save(5)
    synchronous.close()
    record, background = _step(tmp_path / "run", 5)
    sync_record, sync_arrays = _step(tmp_path / "sync", 5)
    assert record == sync_record
    for group in run_format.GROUPS:
        assert [a.tobytes() for a in background[group]] == [
            a.tobytes() for a in sync_arrays[group]], group
    # ... and they are the values in memory, read independently of any checkpoint.
    groups = {"trainable": est.model.trainable_variables,
              "non_trainable": est.model.non_trainable_variables,
              "optimizer": state.optimizer.variables}
    for group, variables in groups.items():
        assert [v.path for v in variables] == [p for p, _, _ in record["layout"][group]]
        for variable, array in zip(variables, background[group], strict=True):
            np.testing.assert_array_equal(array, keras.ops.convert_to_numpy(variable))
    assert (record["step"], record["input_steps"], record["train_batch_size"],
            record["engine"]) == (5, 5, _flagship.GLOBAL_BATCH, "tf")


class _Gate(keras.callbacks.Callback):
    """Holds the write of step 5 until the loop after it has run, and records what the
    work_dir says meanwhile."""

    def __init__(self, work_dir, monkeypatch):
        super().__init__()
        self.work_dir, self.seen = str(work_dir), {}
        self.reached, self.open = threading.Event(), threading.Event()
        original = ocp.CheckpointManager.save

        def held(manager, step, *args, **kwargs):
            if step == 5:
                self.seen.setdefault("thread", threading.current_thread().name)
                self.reached.set()
                assert self.open.wait(60), "the gate was never opened"
            return original(manager, step, *args, **kwargs)

        monkeypatch.setattr(ocp.CheckpointManager, "save", held)

    def on_train_batch_end(self, batch, logs=None):
        if batch == 10 and not self.open.is_set():  # the loop after step 5's save
            assert self.reached.wait(60), "step 5 was never written"
            self.seen["latest"] = run_format.latest(self.work_dir)
            self.open.set()


def test_training_goes_on_while_the_checkpoint_is_written(tmp_path, data, monkeypatch):
    work = tmp_path / "run"
    est = _estimator(work)
    gate = _Gate(work, monkeypatch)
    est.train(_flagship.train_input(*data), steps=15, callbacks=[gate])
    # Steps 6-10 ran while step 5 was being written, and it was not yet listed: a process
    # killed then resumes from the checkpoint before.
    assert gate.seen["latest"] is None
    assert gate.seen["thread"].startswith("fenwicks checkpoint writer")
    # The end of train waited for the last write.
    assert run_format.latest(str(work)) == f"{work}/checkpoints/15"
    assert est.parts.state.last_good_checkpoint == f"{work}/checkpoints/15"


def test_synchronous_checkpoints_are_an_option(tmp_path, data, monkeypatch):
    threads = []
    original = ocp.CheckpointManager.save
    monkeypatch.setattr(ocp.CheckpointManager, "save",
                        lambda *a, **k: threads.append(threading.current_thread())
                        or original(*a, **k))
    est = _estimator(tmp_path / "run", async_checkpoints=False)
    est.train(_flagship.train_input(*data), steps=10)
    assert threads and set(threads) == {threading.main_thread()}
    with pytest.raises(ValueError, match=r"async_checkpoints='yes' must be True or False"):
        _estimator(tmp_path / "bad", async_checkpoints="yes")


@pytest.mark.slow  # trains an estimator in this process
def test_the_save_train_waits_for_is_written_in_the_calling_thread(tmp_path, data,
                                                                   monkeypatch):
    """With a callback of the user's, the end of `train` saves after it (the callback may
    have changed the weights) and waits (`save_and_wait`): nothing would run beside a
    background write, so it is written in the calling thread; periodic saves are not.
    (Without one, the last loop's save overlaps the summaries' flush instead.)"""
    threads = {}
    original = ocp.CheckpointManager.save

    def recording(manager, step, *args, **kwargs):
        threads[step] = threading.current_thread().name
        return original(manager, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", recording)
    est = _flagship.estimator(MODEL, str(tmp_path / "run"), steps_per_loop=5,
                              save_every_loops=2, save_every_secs=None)
    est.train(_flagship.train_input(*data), steps=15,  # loops end at steps 5, 10, 15
              callbacks=[keras.callbacks.Callback()])
    assert threads[10].startswith("fenwicks checkpoint writer")  # every 2nd loop
    assert threads[15] == threading.main_thread().name  # the end of train
    assert sorted(threads) == [10, 15]
    assert run_format.latest(str(tmp_path / "run")) == f"{tmp_path / 'run'}/checkpoints/15"


def test_a_failed_background_write_is_raised_at_the_next_save_naming_the_last_good(
        tmp_path, data, monkeypatch):
    work = tmp_path / "run"
    est = _estimator(work)
    original = ocp.CheckpointManager.save

    def disk_full_at_ten(manager, step, *args, **kwargs):
        if step == 10:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(manager, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "save", disk_full_at_ten)
    with pytest.raises(fw.train.CheckpointWriteError,
                       match=r"checkpoints/10: \[Errno 28\] No space left on device\. The "
                             rf"previous checkpoint \({work}/checkpoints/5\) is intact.*in "
                             r"the background"):
        est.train(_flagship.train_input(*data), steps=20)
    # Raised when the save of step 15 waited for it: training had gone on to step 15.
    assert est.global_step == 15
    assert run_format.latest(str(work)) == f"{work}/checkpoints/5"
    assert est.parts.state.last_good_checkpoint == f"{work}/checkpoints/5"
    monkeypatch.setattr(ocp.CheckpointManager, "save", original)
    est.train(_flagship.train_input(*data), steps=5)  # storage is fine again: saved
    assert run_format.latest(str(work)) == f"{work}/checkpoints/20"


@pytest.mark.slow  # trains an estimator in this process
def test_a_step_already_saved_is_not_saved_again_unless_forced(tmp_path, data):
    work = tmp_path / "run"
    est = _estimator(work)
    est.train(_flagship.train_input(*data), steps=5)
    checkpointer = est.parts.state.checkpointer
    kernel = est.model.trainable_variables[0]
    saved = keras.ops.convert_to_numpy(kernel).copy()
    kernel.assign(saved + 1.0)  # other weights at the same step (a callback's restore)
    checkpointer.save(5)
    assert checkpointer.last_blocked_secs is None  # nothing was saved
    checkpointer.wait()
    np.testing.assert_array_equal(_step(work, 5)[1]["trainable"][0], saved)
    checkpointer.save(5, force=True)
    checkpointer.wait()
    assert checkpointer.last_blocked_secs is not None
    np.testing.assert_array_equal(_step(work, 5)[1]["trainable"][0], saved + 1.0)
    # A step restored from disk counts as saved.
    again = _estimator(work)
    again.evaluate(_flagship.eval_input(*data))
    again.parts.state.checkpointer.save(5)
    assert again.parts.state.checkpointer.last_blocked_secs is None


def test_close_and_a_restore_wait_for_the_write(tmp_path, data):
    work = tmp_path / "run"
    est = _estimator(work)
    est.train(_flagship.train_input(*data), steps=5)
    est.parts.state.set_counters(7, 7)  # as if two more steps ran: a save is due
    checkpointer = est.parts.state.checkpointer
    checkpointer.save(7)
    assert checkpointer.pending_step == 7 or (work / "checkpoints" / "7").is_dir()
    est.close()
    assert checkpointer.pending_step is None
    assert run_format.latest(str(work)) == f"{work}/checkpoints/7"
    again = _estimator(work)
    again.evaluate(_flagship.eval_input(*data))
    assert again.global_step == 7


def test_interpreter_exit_waits_for_the_write(tmp_path):
    work = tmp_path / "run"
    out = run_json(f"""
import json, time
import orbax.checkpoint as ocp
from tests import _flagship
original = ocp.CheckpointManager.save

def slow(*args, **kwargs):  # the write of step 7 outlives the script
    time.sleep(2)
    return original(*args, **kwargs)

ocp.CheckpointManager.save = slow
x, y = _flagship.digits("mnist_net")
est = _flagship.estimator("mnist_net", {str(work)!r}, steps_per_loop=5)
est.train(_flagship.train_input(x, y), steps=5)
est.parts.state.set_counters(7, 7)  # as if two more steps ran
est.parts.state.checkpointer.save(7)
print(json.dumps(est.parts.state.checkpointer.pending_step))  # then the interpreter exits
""", fresh=True)
    assert out == 7  # save() had returned with the write of step 7 still running
    assert run_format.latest(str(work)) == f"{work}/checkpoints/7"
    assert json.loads((work / "checkpoints" / "7" / "record" / "metadata").read_text())[
        "step"] == 7


def test_several_processes_agree_on_a_save_that_one_of_them_found_due(tmp_path,
                                                                      monkeypatch):
    """With several JAX processes a save is a collective (orbax's barriers): SIGTERM to
    one host, or one host's clock past save_every_secs, makes every process save and
    stop together. `agree` asks all processes (`processes_where`, faked here: which
    processes' flag is set); with one process it answers the flag itself, asking none."""
    import sys
    import types

    import fenwicks.train.jax as jax_package

    asked = []

    def processes_where(flag):
        asked.append(flag)
        return [1] if flag else [1] if len(asked) == 2 else []  # 2nd call: process 1's

    fake = types.SimpleNamespace(processes_where=processes_where)
    monkeypatch.setitem(sys.modules, "fenwicks.train.jax.processes", fake)
    monkeypatch.setattr(jax_package, "processes", fake, raising=False)
    several = run_format.RunCheckpointer(str(tmp_path / "two"), None, keep=1,
                                         asynchronous=False, processes=2)
    assert several.agree(False) is False  # nobody's flag set
    assert several.agree(False) is True  # process 1's set, this one's not: both save
    assert several.agree(True) is True
    assert asked == [False, False, True]
    one = run_format.RunCheckpointer(str(tmp_path / "one"), None, keep=1,
                                     asynchronous=False)
    assert (one.agree(False), one.agree(True)) == (False, True)
    assert len(asked) == 3  # one process: no collective
    assert not (tmp_path / "two").exists() and not (tmp_path / "one").exists()
