"""Faults really injected: SIGKILL mid-training and mid-save, SIGTERM, corrupt and
truncated checkpoints, a full disk, and two processes on one work_dir.

Each run that is killed is a real process (`tests._faults`); the property checked after
every fault is the one users rely on: with a seed, the restarted run ends with the same
weights as a run that was never interrupted, and nothing saved before the fault is lost.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks.train import input_record, lock
from tests import _faults, _flagship
from tests.conftest import run_json, run_module_json, run_process, start_process

pytestmark = pytest.mark.slow


class Trainer:
    """A `python -m tests._faults train` process whose stdout is read line by line."""

    def __init__(self, work_dir, max_steps, steps_per_loop="5", start=None, **env):
        args = ["-m", "tests._faults", "train", str(work_dir), str(max_steps), steps_per_loop]
        self.proc = (start or start_process)(args, env)
        self.lines: list[str] = []
        self.stderr = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def wait_for(self, marker, timeout=240):
        deadline = time.monotonic() + timeout
        while marker not in self.lines:
            assert self.proc.poll() is None or marker in self.lines, self.finish()
            assert time.monotonic() < deadline, f"no {marker!r} in {timeout} s"
            time.sleep(0.05)

    def finish(self, timeout=300):
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        self.stderr = self.proc.stderr.read()
        return self.stderr[-3000:]

    def result(self):
        self.finish()
        assert self.proc.returncode == 0, self.stderr[-3000:]
        return json.loads(self.lines[-1])


def _train(work_dir, max_steps, **env):
    return Trainer(work_dir, max_steps, **env).result()


def _assert_same_weights(got, want):
    for a, b in zip(got["variables"], want["variables"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def _wait_until(condition, timeout=240):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# --------------------------------------------------------------------------- kill, term


def test_killed_at_random_steps_the_run_still_ends_with_the_uninterrupted_weights(tmp_path):
    work, total = tmp_path / "run", 300
    reference = Trainer(tmp_path / "reference", total)
    rng, reached = random.Random(7), []
    for _ in range(3):
        trainer = Trainer(work, total)
        before = _faults.latest_step(str(work))
        _wait_until(lambda b=before: _faults.latest_step(str(work)) > b)  # resumed and saved
        time.sleep(rng.uniform(0.0, 0.8))
        trainer.proc.send_signal(signal.SIGKILL)
        trainer.finish()
        reached.append(_faults.latest_step(str(work)))
    assert reached == sorted(reached) and 0 < reached[-1] < total, reached
    final = Trainer(work, total)
    out = final.result()
    assert out["start"] == reached[-1] and out["step"] == total
    assert "stale lock" in final.stderr  # the killed run's lock did not block the restart
    _assert_same_weights(out, reference.result())


@pytest.fixture(scope="module")
def uninterrupted_30(tmp_path_factory):
    """30 steps in one go: what every killed-and-restarted run must end with."""
    return Trainer(tmp_path_factory.mktemp("reference") / "run", 30).result()


# Checkpoint modes: async (the default: the background writer is killed while training
# goes on) and sync.
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_killed_mid_save_restarts_from_the_previous_complete_checkpoint(
        tmp_path, mode, uninterrupted_30):
    work = tmp_path / "run"
    sync = {"FAULTS_SYNC": "1"} if mode == "sync" else {}
    # Step 10's files written (in orbax's temporary folder), not yet committed.
    trainer = Trainer(work, 30, FAULTS_SLOW_COMMIT="120", **sync)
    trainer.wait_for("COMMIT 10")
    writer = next(line for line in trainer.lines if line.startswith("WRITE 10 "))
    assert writer == ("WRITE 10 IN_THREAD MainThread" if mode == "sync" else
                      "WRITE 10 IN_THREAD fenwicks checkpoint writer 10")
    trainer.proc.send_signal(signal.SIGKILL)
    trainer.finish()
    leftover = list((work / "checkpoints").glob("10.orbax-checkpoint-tmp*"))
    assert leftover and (leftover[0] / "state").is_dir()
    assert _faults.latest_step(str(work)) == 5
    restart = Trainer(work, 30)
    out = restart.result()
    assert out["start"] == 5 and out["step"] == 30
    # the partial save is removed at the next start, by name
    assert not leftover[0].exists()
    assert f"{leftover[0]}, the partial files" in restart.stderr
    _assert_same_weights(out, uninterrupted_30)


def test_killed_mid_async_save_on_gcs_restarts_from_the_previous_checkpoint(
        gcs_emulator, uninterrupted_30):
    work = gcs_emulator.unique_url("killed") + "/work"

    def in_namespace(args, env):
        return gcs_emulator.start_module(*args[1:], env=env)

    trainer = Trainer(work, 30, start=in_namespace, FAULTS_SLOW_COMMIT="120")
    trainer.wait_for("COMMIT 10")  # its files are in the bucket, not its marker
    trainer.proc.send_signal(signal.SIGKILL)
    trainer.finish()
    listed = gcs_emulator.run_json(f"""
import json
import fenwicks as fw
from tests import _faults
print(json.dumps([_faults.latest_step({work!r}),
                  fw.io.exists({work!r} + "/checkpoints/10/state")]))""")
    assert listed == [5, True]  # written, but never committed
    out = Trainer(work, 30, start=in_namespace).result()
    assert out["start"] == 5 and out["step"] == 30
    _assert_same_weights(out, uninterrupted_30)


def test_sigterm_saves_the_step_in_progress_and_the_restart_continues_exactly(tmp_path):
    work, endless = tmp_path / "run", 10**6
    # One compiled loop of a million steps: only a check inside the loop can stop it.
    trainer = Trainer(work, endless, steps_per_loop=str(endless), FAULTS_WARMUP="1")
    trainer.wait_for("READY")
    time.sleep(2.0)
    sent = time.monotonic()
    trainer.proc.send_signal(signal.SIGTERM)
    trainer.finish(timeout=60)
    latency = time.monotonic() - sent
    assert trainer.proc.returncode == fw.train.Preempted(0, None).code == 143
    assert "Traceback" not in trainer.stderr and "SIGTERM received" in trainer.stderr
    saved = _faults.latest_step(str(work))
    assert 1 < saved < endless
    assert latency < 15, latency  # saved within seconds, mid-loop
    resumed = _train(work, saved + 15)
    assert resumed["start"] == saved and resumed["step"] == saved + 15
    _assert_same_weights(resumed, _train(tmp_path / "reference", saved + 15))


# --------------------------------------------------------------------------- damaged files


def _estimator(work_dir, **kwargs):
    return _flagship.estimator("mnist_net", str(work_dir), save_every_loops=1,
                               steps_per_loop=5, **kwargs)


@pytest.fixture(scope="module")
def trained_twice(tmp_path_factory):
    """Steps 5 and 10, trained once for the module's tests (each spoils a copy)."""
    work = tmp_path_factory.mktemp("two_checkpoints") / "run"
    x, y = _flagship.digits("mnist_net")
    est = _estimator(work)
    est.train(_flagship.train_input(x, y), steps=5)
    at_five = [np.asarray(v) for v in est.model.variables]
    est.train(_flagship.train_input(x, y), steps=5)
    assert _faults.latest_step(str(work)) == 10
    return work, at_five, (x, y)


@pytest.fixture
def two_checkpoints(trained_twice, tmp_path):
    """A work_dir of its own holding steps 5 and 10, and the variables at step 5."""
    source, at_five, data = trained_twice
    shutil.copytree(source, tmp_path / "run")
    return tmp_path / "run", at_five, data


def _reopen(work_dir, data):
    est = _estimator(work_dir)
    est.evaluate(_flagship.eval_input(*data))
    return est


@pytest.mark.parametrize("damage", _faults.DAMAGES)
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_with_a_warning(
        two_checkpoints, damage, caplog):
    work, at_five, data = two_checkpoints
    spoil, why = _faults.DAMAGES[damage]
    spoil(work)
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        est = _reopen(work, data)
    assert est.global_step == 5
    for got, want in zip(est.model.variables, at_five, strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)
    assert f"{_faults.step_dir(work)} is unreadable" in caplog.text
    assert f"resumed from the older {_faults.step_dir(work, 5)}" in caplog.text
    assert why in caplog.text
    assert (work / "checkpoints" / "10.corrupt").is_dir()  # kept, not deleted
    assert _faults.latest_step(str(work)) == 5


def test_a_damaged_record_with_another_trn_bs_is_not_trained_on(two_checkpoints, caplog):
    """The record deleted, then a resume with another trn_bs: before the run format,
    training went on silently from step 10 and rewrote the record."""
    work, _, data = two_checkpoints
    _faults.record_file(work).unlink()
    est = _estimator(work, trn_bs=2 * _flagship.GLOBAL_BATCH)
    with pytest.raises(input_record.BatchSizeChangedError,
                       match=rf"trn_bs={2 * _flagship.GLOBAL_BATCH} differs from the "
                             rf"trn_bs={_flagship.GLOBAL_BATCH}"):
        est.train(_flagship.train_input(*data), steps=1)
    assert est.global_step == 5  # step 5, the intact one, was restored and checked


def test_a_read_only_record_cannot_be_met_by_a_fresh_run(tmp_path):
    """Before the run format a read-only ``fenwicks_input.json`` in a fresh work_dir gave
    TensorFlow's raw PermissionDeniedError; a fresh run now reads nor writes any such file."""
    work = tmp_path / "run"
    work.mkdir()
    (work / "fenwicks_input.json").write_text('{"train_batch_size": 32}')
    (work / "fenwicks_input.json").chmod(0o444)
    x, y = _flagship.digits("mnist_net")
    est = _estimator(work)
    est.train(_flagship.train_input(x, y), steps=5)
    assert _faults.latest_step(str(work)) == 5
    assert (work / "fenwicks_input.json").read_text() == '{"train_batch_size": 32}'


@pytest.fixture(scope="module")
def on_jax(tmp_path_factory):
    """The damages above, the record's and the work_dir's faults, on the JAX engine: one
    process runs every case (`tests._faults.damages`)."""
    root = tmp_path_factory.mktemp("jax_damages")
    return run_module_json("tests._faults", "damages", str(root),
                           env={"KERAS_BACKEND": "jax", "FENWICKS_DEVICE": None})


@pytest.mark.parametrize("damage", _faults.DAMAGES)
def test_a_damaged_latest_checkpoint_falls_back_on_the_jax_engine_too(on_jax, damage):
    """Before the run format the JAX engine trained on silently past a garbled
    ``_METADATA``, and called the intact steps damaged when the newest lacked its
    ``default/`` folder ("none can be read")."""
    assert on_jax["engine"] == "jax"
    case = on_jax[damage]
    work = case["work_dir"]
    assert (case.get("error"), case.get("step"), case.get("same_as_five")) == \
        (None, 5, True), case
    assert len(case["warnings"]) == 1, case["warnings"]
    warning = case["warnings"][0]
    assert warning.startswith(f"fenwicks: checkpoint {work}/checkpoints/10 is unreadable ("), \
        warning
    assert _faults.DAMAGES[damage][1] in warning
    assert warning.endswith(f"; resumed from the older {work}/checkpoints/5 instead. Its "
                            f"files are kept as {work}/checkpoints/10.corrupt"), warning
    assert case["listing"] == ["10.corrupt", "5"]  # kept, not deleted; 5 not called damaged


def test_the_record_and_work_dir_faults_on_the_jax_engine(on_jax):
    other = on_jax["other trn_bs"]
    assert other["error"] == "BatchSizeChangedError" and other["step"] == 5, other
    assert other["message"].startswith(f"trn_bs={2 * _flagship.GLOBAL_BATCH} differs from "
                                       f"the trn_bs={_flagship.GLOBAL_BATCH} this work_dir's")
    deleted = on_jax["work_dir deleted"]
    assert deleted["deleted"] and not deleted["recreated"] and deleted["step"] < 40, deleted
    assert deleted["error"] == "WorkDirLostError", deleted
    assert re.match(r"work_dir='[^']+/deleted' was deleted while training \(its lock "
                    r"\S+/fenwicks.lock is gone, and so is the folder\): the checkpoints "
                    r"saved there, the epoch log epochs.jsonl", deleted["message"]), deleted
    assert "The model in memory is intact" in deleted["message"]
    read_only = on_jax["read-only old record"]
    assert "error" not in read_only and read_only["latest"] == 5, read_only
    assert read_only["old_record"] == '{"train_batch_size": 32}'


def _legacy_tf(tmp_path):
    """A work_dir of TensorFlow checkpoints (before the run format): ckpt-21."""
    from tests.test_legacy_work_dirs import LEGACY

    work = tmp_path / "legacy"
    shutil.copytree(LEGACY / "tf", work)
    return work


def _reopen_legacy(work):
    from tests import _cross_engine

    est = _cross_engine.estimator(str(work))
    est.evaluate(_cross_engine.inputs()[1])
    return est


def test_a_full_temp_dir_is_not_taken_for_damaged_checkpoints(tmp_path, small_disk,
                                                              monkeypatch):
    """TensorFlow checkpoints (an old work_dir) are restored after a probe write."""
    work = _legacy_tf(tmp_path)
    _fill(small_disk, leave_bytes=0)
    monkeypatch.setattr(tempfile, "tempdir", str(small_disk))  # as TMPDIR=<tiny tmpfs>
    before = sorted(os.listdir(work))
    with pytest.raises(fw.train.ProbeWriteError, match=rf"{small_disk}.*This is not about "
                                                       r"your checkpoints: nothing in the "
                                                       r"work_dir was read, changed"):
        _reopen_legacy(work)
    assert sorted(os.listdir(work)) == before  # nothing set aside as corrupt


def test_a_file_size_limit_is_not_taken_for_damaged_checkpoints(tmp_path):
    """``ulimit -f``: the 20 kB probe cannot be written; the checkpoints are fine."""
    work = _legacy_tf(tmp_path)
    before = sorted(os.listdir(work))
    out = run_json(f"""
import json, resource
from tests import _cross_engine
resource.setrlimit(resource.RLIMIT_FSIZE, (10_000, 10_000))  # as ulimit -f 10 (kB)
try:
    _cross_engine.estimator({str(work)!r}).evaluate(_cross_engine.inputs()[1])
    print(json.dumps(None))
except Exception as err:
    print(json.dumps([type(err).__name__, str(err)]))
""")
    assert out[0] == "ProbeWriteError" and "File too large" in out[1], out
    assert "nothing in the work_dir was read, changed or set aside" in out[1]
    assert sorted(os.listdir(work)) == before


def test_no_readable_checkpoint_is_a_clear_error_that_changes_nothing(two_checkpoints):
    work, _, data = two_checkpoints
    for step in (5, 10):
        _faults.flip_bytes(_faults.data_file(work, step))
    before = sorted(p.relative_to(work) for p in work.rglob("*"))
    with pytest.raises(fw.train.CheckpointCorruptError,
                       match=r"lists 2 checkpoint\(s\) and none can be read.*checkpoints/10: "
                             r"the array of .*does not match the checksum"):
        _reopen(work, data)
    assert sorted(p.relative_to(work) for p in work.rglob("*")) == before


def test_a_damaged_state_file_finds_the_checkpoints_by_name(tmp_path, caplog):
    work = _legacy_tf(tmp_path)
    (work / "checkpoint").write_text("model_checkpoint_path: {{{ not a proto")
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        est = _reopen_legacy(work)
    assert est.global_step == 21 and "looking for checkpoints by name" in caplog.text


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        message = f"cannot mount a tmpfs (needs root): {done.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(directory, leave_bytes):
    """Fills the file system of `directory` but for about `leave_bytes`."""
    stat = os.statvfs(directory)
    free = stat.f_bavail * stat.f_frsize
    with open(directory / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave_bytes))
    return directory / "filler"


def test_a_full_disk_is_a_clear_error_and_the_previous_checkpoint_still_loads(small_disk):
    x, y = _flagship.digits("mnist_net")
    work = small_disk / "run"
    est = _estimator(work)
    est.train(_flagship.train_input(x, y), steps=5)
    at_five = [np.asarray(v) for v in est.model.variables]
    size = sum(p.stat().st_size for p in _faults.step_dir(work, 5).rglob("*") if p.is_file())
    filler = _fill(small_disk, leave_bytes=16 * 1024)  # room for the lock, not a checkpoint
    assert size > 16 * 1024
    with pytest.raises(fw.train.CheckpointWriteError,
                       match=r"checkpoints/10: .*The previous checkpoint .*checkpoints/5\) "
                             r"is intact"):
        est.train(_flagship.train_input(x, y), steps=5)
    assert [p.name for p in (work / "checkpoints").iterdir()] == ["5"]  # partial: removed
    reopened = _reopen(work, (x, y))
    assert reopened.global_step == 5
    for got, want in zip(reopened.model.variables, at_five, strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)
    filler.unlink()  # space again: the same estimator saves what it trained meanwhile
    est.train(_flagship.train_input(x, y), steps=1)
    assert _faults.latest_step(str(work)) == 11


# --------------------------------------------------------------------------- two runs


def test_a_second_run_on_a_busy_work_dir_is_refused_naming_the_first(tmp_path):
    work = tmp_path / "run"
    first = Trainer(work, 10**6, steps_per_loop="10", FAULTS_WARMUP="1")
    first.wait_for("READY")
    second = run_process(["-m", "tests._faults", "train", str(work), "10"], timeout=300,
                         check=False)
    assert second.returncode != 0
    assert "WorkDirLockedError" in second.stderr
    assert f"pid {first.proc.pid} on host {socket.gethostname()!r}" in second.stderr
    steps_while_refused = _faults.latest_step(str(work))
    first.proc.send_signal(signal.SIGTERM)  # the first run saves and leaves cleanly
    first.finish()
    assert first.proc.returncode == 143
    assert not (work / lock.LOCK_NAME).exists()  # released on the way out
    out = _train(work, _faults.latest_step(str(work)) + 5)
    assert out["start"] >= steps_while_refused


def _write_lock(work_dir, **holder):
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / lock.LOCK_NAME).write_text(json.dumps(holder))


def test_a_lock_from_another_host_blocks_until_its_heartbeat_is_stale(tmp_path, caplog):
    work = tmp_path / "run"
    _write_lock(work, host="tpu-vm-7", pid=4242, heartbeat=time.time() - 5)
    with pytest.raises(fw.train.WorkDirLockedError, match="pid 4242 on host 'tpu-vm-7'"):
        lock.WorkDirLock(str(work)).acquire()
    _write_lock(work, host="tpu-vm-7", pid=4242, heartbeat=time.time() - lock.STALE_SECS - 1)
    taker = lock.WorkDirLock(str(work))
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        taker.acquire()
    assert "stale lock" in caplog.text
    assert json.loads((work / lock.LOCK_NAME).read_text())["pid"] == os.getpid()
    taker.release()
    assert not (work / lock.LOCK_NAME).exists()


def test_the_lock_works_on_gcs(gcs_emulator):
    path = gcs_emulator.unique_url("lock")
    out = gcs_emulator.run_json(f"""
import json
from fenwicks.train import input_record, lock
first, second = lock.WorkDirLock({path!r}), lock.WorkDirLock({path!r})
first.acquire()
try:
    second.acquire()
    refused = None
except lock.WorkDirLockedError as err:
    refused = str(err)
first.release()
second.acquire()
print(json.dumps({{"refused": refused, "holder": second._read()["token"] == second._token}}))
""")
    assert out["refused"] and "is in use" in out["refused"]
    assert out["holder"]



def test_every_temp_dir_full_still_gives_the_probe_message(tmp_path, small_disk,
                                                           monkeypatch):
    """Every candidate temp dir full: Python's own gettempdir() then raises too; the
    probe's message must still be built (not FileNotFoundError while making it)."""
    work = _legacy_tf(tmp_path)
    _fill(small_disk, leave_bytes=0)
    monkeypatch.setattr(tempfile, "tempdir", None)  # forget the temp dir found before
    monkeypatch.setattr(tempfile, "_candidate_tempdir_list", lambda: [str(small_disk)])
    with pytest.raises(FileNotFoundError):
        tempfile.gettempdir()  # the situation: Python finds no usable temp dir
    before = sorted(os.listdir(work))
    with pytest.raises(fw.train.ProbeWriteError, match=rf"a temp dir \(every candidate is full"
                                                       rf".*No usable .*{small_disk}.*TMPDIR"):
        _reopen_legacy(work)
    assert sorted(os.listdir(work)) == before


def test_a_full_disk_before_train_names_the_lock_file_and_leaves_none(small_disk):
    work = small_disk / "run"
    work.mkdir()
    _fill(small_disk, leave_bytes=0)
    x, y = _flagship.digits("mnist_net")
    with pytest.raises(fw.train.WorkDirNotWritableError,
                       match=rf"could not write the work_dir lock {work}/fenwicks.lock "
                             r"\(No space left on device\).*Free space on that disk"):
        _estimator(work).train(_flagship.train_input(x, y), steps=2)
    assert not (work / "fenwicks.lock").exists()


def test_a_full_disk_during_export_is_one_line_and_leaves_no_partial_folder(tmp_path,
                                                                           small_disk):
    """A new export cut short is removed (with the folder made for it); one beside an
    earlier export leaves that one whole."""
    x, y = _flagship.digits("mnist_net")
    est = _estimator(tmp_path / "run")
    est.train(_flagship.train_input(x, y), steps=2)
    previous = small_disk / "previous"
    version = est.export_saved_model(str(previous))
    loaded = tf.saved_model.load(version)  # kept: its variables outlive the call
    want = loaded.serve(x[:5])["predictions"].numpy()
    est.train(_flagship.train_input(x, y), steps=2)  # new weights for the next export
    _fill(small_disk, leave_bytes=16 * 1024)  # room to start an export, not to finish it
    target = small_disk / "export"
    with pytest.raises(fw.train.ExportError,
                       match=rf"could not export the SavedModel to {target}: .*; the "
                             r"partial version was removed and earlier exports there are "
                             r"untouched\. Free space there") as caught:
        est.export_saved_model(str(target))
    assert "\n" not in str(caught.value)
    assert not target.exists()
    with pytest.raises(fw.train.ExportError,
                       match=rf"to {previous}: .*earlier exports there are untouched"):
        est.export_saved_model(str(previous))
    assert sorted(os.listdir(small_disk)) == ["filler", "previous"]
    assert os.listdir(previous) == [os.path.basename(version)]
    reloaded = tf.saved_model.load(fw.train.latest_export(str(previous)))
    got = reloaded.serve(x[:5])["predictions"].numpy()
    np.testing.assert_array_equal(got, want)
    assert _faults.latest_step(str(tmp_path / "run")) == 4
