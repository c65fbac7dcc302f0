"""The work_dir is the model: cleaned or replaced between calls, read-only, given as a
`pathlib.Path` or with ``~``. On the flagship mnist_net at width 4, on 8x8 digits.
"""

from __future__ import annotations

import logging
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import fenwicks as fw
from tests import _flagship as flagship


@pytest.fixture(scope="module")
def digits():
    return flagship.digits("mnist_net")


def _estimator(work_dir, **kwargs):
    return flagship.estimator("mnist_net", work_dir, steps_per_loop=5, **kwargs)


def _fold_input(x, y, fold, folds=2):
    """The training examples of every fold but `fold` (k-fold cross-validation)."""
    keep = np.arange(flagship.NUM_TRAIN) % folds != fold
    return flagship.train_input(x[:flagship.NUM_TRAIN][keep], y[:flagship.NUM_TRAIN][keep])


def _values(est):
    return [np.asarray(v) for v in est.model.variables]


def _assert_same(got, want):
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.slow
def test_a_k_fold_loop_that_cleans_the_work_dir_trains_each_fold_from_scratch(
        tmp_path, digits, caplog):
    x, y = digits
    work = str(tmp_path / "kfold")
    est, steps = _estimator(work), []
    for fold in range(2):  # the original Fenwicks' loop: clean, train, evaluate
        fw.io.create_clean_dir(work)  # only the run's own files in it: no force needed
        with caplog.at_level(logging.WARNING, logger="fenwicks"):
            est.train(_fold_input(x, y, fold), steps=10)
        steps.append(est.global_step)
    assert steps == [10, 10]  # not 20: the second fold did not continue the first
    assert caplog.text.count("starting from a fresh initialisation") == 1
    assert "no longer holds checkpoint" in caplog.text and "checkpoints/10" in caplog.text
    fresh = _estimator(str(tmp_path / "fresh"))  # fold 2 by an estimator of its own
    fresh.train(_fold_input(x, y, 1), steps=10)
    _assert_same(_values(est), _values(fresh))


@pytest.mark.slow
def test_checkpoints_replaced_by_another_runs_are_restored(tmp_path, digits):
    x, y = digits
    work, other_dir = tmp_path / "run", tmp_path / "other"
    est = _estimator(str(work))
    est.train(_fold_input(x, y, 0), steps=10)  # step 10 of this run
    other = _estimator(str(other_dir))
    other.train(_fold_input(x, y, 1), steps=10)  # another run's step 10: the same name
    step = work / "checkpoints" / "10"
    own = os.stat(step / "_CHECKPOINT_METADATA")
    fw.io.create_clean_dir(str(work), force=True)
    shutil.copytree(other_dir / "checkpoints" / "10", step)
    # The copy looks like the step it replaced: same name, same metadata size (same
    # model) and, as when both runs wrote within one second, the same time stamps.
    assert os.stat(step / "_CHECKPOINT_METADATA").st_size == own.st_size
    for path in [step, *step.rglob("*")]:
        os.utime(path, ns=(own.st_atime_ns, own.st_mtime_ns))
    est.train(_fold_input(x, y, 1), steps=5)
    other.train(_fold_input(x, y, 1), steps=5)
    assert est.global_step == other.global_step == 15
    _assert_same(_values(est), _values(other))


# --------------------------------------------------------------------------- read-only


@pytest.fixture
def read_only_run(tmp_path, digits):
    """A finished run on a tmpfs that is then remounted read-only (as /kaggle/input is).

    Root ignores file permissions, so a read-only mount is how this is made real as root.
    Yields the work_dir and what the run's own estimator evaluated and predicted.
    """
    mount = tmp_path / "ro"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        message = f"cannot mount a tmpfs (needs root): {done.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    x, y = digits
    try:
        with _estimator(str(mount / "run")) as est:
            est.train(flagship.train_input(x, y), steps=10)
            expected = (est.evaluate(flagship.eval_input(x, y)),
                        est.predict(flagship.eval_input(x, y)))
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        yield mount / "run", expected
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.slow
def test_a_read_only_work_dir_evaluates_predicts_and_exports(read_only_run, digits,
                                                            tmp_path, caplog):
    work, (evaluated, predicted) = read_only_run
    x, y = digits
    before = sorted(os.listdir(work))
    est = _estimator(str(work))
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        result = est.evaluate(flagship.eval_input(x, y))
        est.evaluate(flagship.eval_input(x, y))
        probs = est.predict(flagship.eval_input(x, y))
    assert result == evaluated and result["global_step"] == 10
    np.testing.assert_array_equal(probs, predicted)
    assert caplog.text.count("cannot write TensorBoard summaries") == 1  # one note
    assert "never trained" not in caplog.text
    export_dir = est.export_saved_model(tmp_path / "export")  # a pathlib.Path
    assert os.path.exists(os.path.join(export_dir, "saved_model.pb"))
    with pytest.raises(fw.train.WorkDirNotWritableError) as caught:
        est.train(flagship.train_input(x, y), steps=1)
    message = str(caught.value)
    assert f"work_dir={str(work)!r} is not writable" in message and "\n" not in message
    assert est.global_step == 10 and sorted(os.listdir(work)) == before


# --------------------------------------------------------------------------- paths


def test_work_dir_export_dir_and_warm_start_accept_paths_and_expand_home(
        tmp_path, digits, monkeypatch):
    x, y = digits
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    est = _estimator(pathlib.Path("~/runs/digits"))
    assert est.config.work_dir == str(tmp_path / "home" / "runs" / "digits")
    est.train(flagship.train_input(x, y), steps=5)
    assert (tmp_path / "home" / "runs" / "digits" / "checkpoints" / "5" / "state").is_dir()
    assert not (tmp_path / "~").exists()  # never a folder literally named '~'
    warm = _estimator(str(tmp_path / "warm"), warm_start_from=pathlib.Path("~/runs/digits"))
    warm.train(flagship.train_input(x, y), steps=1)
    assert warm.warm_start_report["loaded"] and not warm.warm_start_report["not_loaded"]
    assert fw.io.create_clean_dir("~/scratch", force=True) == str(tmp_path / "home" / "scratch")
    assert fw.io.exists(pathlib.Path("~/scratch")) and not (tmp_path / "~").exists()
    with pytest.raises(ValueError, match=r"work_dir=3 must be a local path"):
        _estimator(3)


def test_a_relative_work_dir_is_resumed_and_evaluated(tmp_path, digits, monkeypatch):
    """A work_dir given relative to the current folder ('runs/demo', as the docstring of
    get_tpu_estimator shows): orbax reads only absolute paths, the run format resolves it."""
    x, y = digits
    monkeypatch.chdir(tmp_path)
    first = _estimator("runs/demo")
    first.train(flagship.train_input(x, y), steps=5)
    again = _estimator("runs/demo")
    assert again.evaluate(flagship.eval_input(x, y))["global_step"] == 5
    _assert_same(_values(again), _values(first))  # restored from runs/demo/checkpoints/5


def test_a_work_dir_deleted_while_training_stops_it_by_name_and_is_not_recreated(
        tmp_path, digits):
    """Something (a cleanup script, a user in another tab) removes the work_dir during
    train: the run stops at the next loop with an error naming what was lost, and the
    folder is not silently recreated by the next save or epoch log."""
    import keras

    work = tmp_path / "run"
    x, y = digits

    class DeleteWorkDir(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch >= 10 and work.exists() and not deleted:
                est.parts.state.wait()  # between saves (a write in flight would land anyway)
                deleted.append(batch)
                shutil.rmtree(work)

    deleted: list[int] = []
    est = _estimator(work, save_every_loops=1)
    with pytest.raises(fw.train.lock.WorkDirLostError,
                       match=rf"work_dir='{work}' was deleted while training \(its lock "
                             rf"{work}/fenwicks.lock is gone, and so is the folder\): the "
                             r"checkpoints saved there, the epoch log epochs.jsonl"):
        est.train(flagship.train_input(x, y), steps=40, callbacks=[DeleteWorkDir()])
    assert deleted and est.global_step < 40
    assert not work.exists(), sorted(str(p.relative_to(work)) for p in work.rglob("*"))


@pytest.mark.parametrize("write", ["lands", "fails"])
def test_a_work_dir_deleted_during_a_background_write_says_what_became_of_it(
        tmp_path, digits, monkeypatch, write):
    """The work_dir removed while a checkpoint is written in the background: before, the
    error said every checkpoint went with the folder and that it was empty, while the
    write recreated it and left step 5 there (or, failing, left a raw write error)."""
    import threading

    import keras

    from fenwicks.train import run_format

    work = tmp_path / "run"
    x, y = digits
    deleted, writing = threading.Event(), threading.Event()
    original = run_format.RunCheckpointer._write

    def held_write(self, step, frozen, record, force):
        if step == 5:  # the first save: held until the folder is gone
            writing.set()
            assert deleted.wait(120)
            if write == "fails":
                os.makedirs(self.directory)  # as a write recreating its folders would
                raise FileNotFoundError(2, "No such file or directory", self.directory)
        return original(self, step, frozen, record, force)

    class DeleteWorkDir(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if writing.is_set() and not deleted.is_set():
                shutil.rmtree(work)
                deleted.set()

    monkeypatch.setattr(run_format.RunCheckpointer, "_write", held_write)
    est = _estimator(work, save_every_loops=1)
    start = (rf"work_dir='{work}' was deleted while training \(its lock {work}/fenwicks.lock "
             r"is gone, and so is the folder\): the checkpoints saved there, the epoch log "
             r"epochs.jsonl and the TensorBoard logs went with it")
    if write == "lands":
        match = (rf"{start}, but step 5, being written in the background as the folder "
                 rf"went, was saved after it: {work}/checkpoints/5 is all the work_dir holds "
                 r"now, and a new train or evaluate resumes from it. Training stopped there")
    else:
        match = (rf"{start}, and so did step 5, being written in the background as the "
                 r"folder went. Training stopped instead of recreating the folder.*starts "
                 r"afresh, as it is empty")
    with pytest.raises(fw.train.lock.WorkDirLostError, match=match):
        est.train(flagship.train_input(x, y), steps=40, callbacks=[DeleteWorkDir()])
    if write == "lands":
        assert sorted(p.name for p in (work / "checkpoints").iterdir()) == ["5"]
        assert _estimator(work).evaluate(flagship.eval_input(x, y))["global_step"] == 5
    else:
        assert not work.exists()  # the empty folders the failed write made are removed


def test_a_checkpoint_state_file_pointing_outside_the_work_dir_is_refused(tmp_path):
    """A downloaded or shared work_dir of TensorFlow checkpoints (written before the run
    format) whose ``checkpoint`` file names another folder's checkpoint: restoring it
    silently loaded that folder's weights."""
    from tests import _cross_engine
    from tests.test_legacy_work_dirs import LEGACY

    other, work = tmp_path / "other", tmp_path / "run"
    shutil.copytree(LEGACY / "tf", other)
    shutil.copytree(LEGACY / "tf", work)
    (work / "checkpoint").write_text(f'model_checkpoint_path: "{other}/ckpt-21"\n'
                                     f'all_model_checkpoint_paths: "{other}/ckpt-21"\n')
    before = sorted(os.listdir(other))
    eval_fn = _cross_engine.inputs()[1]
    with pytest.raises(fw.train.tf.checkpoints.ForeignCheckpointError,
                       match=rf"{work}/checkpoint names checkpoint\(s\) outside the "
                             rf"work_dir: {other}/ckpt-21\..*delete {work}/checkpoint"):
        _cross_engine.estimator(str(work)).evaluate(eval_fn)
    assert sorted(os.listdir(other)) == before
    (work / "checkpoint").unlink()  # the fix the message gives
    assert _cross_engine.estimator(str(work)).evaluate(eval_fn)["global_step"] == 21
