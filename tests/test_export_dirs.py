"""`fenwicks.train.export_dirs`: an export replaces only an empty folder or an earlier
export of Fenwicks', only once complete, and never deletes a user's file (issue 46)."""

from __future__ import annotations

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks.train import export_dirs


def _tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _writer(payload: bytes):
    def write(folder: str) -> None:  # stands in for tf.saved_model.save
        with open(os.path.join(folder, "saved_model.pb"), "wb") as f:
            f.write(payload)
    return write


def test_a_new_folder_gets_the_export_and_the_marker(tmp_path):
    target = tmp_path / "deep" / "model"
    assert export_dirs.write(str(target), _writer(b"v1")) == str(target)
    files = _tree(tmp_path)
    assert files.pop("deep/model/saved_model.pb") == b"v1"
    assert json.loads(files.pop("deep/model/fenwicks_export.json"))["written_by"] == "fenwicks"
    assert files == {}  # no staging folder left beside it


def test_an_earlier_export_is_replaced_and_neighbours_named_like_staging_survive(tmp_path):
    target = tmp_path / "model"
    export_dirs.write(str(target), _writer(b"v1"))
    # the names the old write-beside-and-swap used for its own folders: a user's here
    for name in ("model.old", "model.new"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "mine.txt").write_bytes(b"keep")
    export_dirs.write(str(target), _writer(b"v2"))
    files = _tree(tmp_path)
    assert files["model/saved_model.pb"] == b"v2"
    assert files["model.old/mine.txt"] == files["model.new/mine.txt"] == b"keep"
    assert sorted(os.listdir(tmp_path)) == ["model", "model.new", "model.old"]


@pytest.mark.parametrize("own", [False, True])
def test_a_folder_with_a_users_files_is_refused_before_any_work(tmp_path, own):
    target = tmp_path / "out"
    if own:  # an export of ours to which the user added a file
        export_dirs.write(str(target), _writer(b"v1"))
    else:
        target.mkdir()
    (target / "notes.txt").write_bytes(b"mine")
    before = _tree(tmp_path)
    calls = []
    whose = "an earlier Fenwicks export that now also holds" if own else \
        "a folder Fenwicks did not write, holding"
    with pytest.raises(ValueError, match=rf"export_dir='{target}' is {whose} notes.txt; "
                                         r".*never deletes other files.*out/model"):
        export_dirs.write(str(target), calls.append)
    assert calls == [] and _tree(tmp_path) == before
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_an_unmarked_savedmodel_and_a_file_are_refused(tmp_path):
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "saved_model.pb").write_bytes(b"someone's")
    with pytest.raises(ValueError, match="Fenwicks did not write, holding saved_model.pb"):
        export_dirs.write(str(tmp_path / "theirs"), _writer(b"v1"))
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"export_dir=.*f' is a file"):
        export_dirs.write(str(tmp_path / "f"), _writer(b"v1"))
    assert _tree(tmp_path) == {"theirs/saved_model.pb": b"someone's", "f": b"x"}


def test_a_failed_writer_leaves_the_previous_export_and_no_staging(tmp_path):
    target = tmp_path / "model"
    export_dirs.write(str(target), _writer(b"v1"))

    def broken(folder: str) -> None:
        _writer(b"half")(folder)
        raise OSError(28, "No space left on device")

    with pytest.raises(export_dirs.ExportError, match=rf"the previous export in {target} is "
                                                      "untouched"):
        export_dirs.write(str(target), broken)
    with pytest.raises(export_dirs.ExportError, match="the partial folder was removed"):
        export_dirs.write(str(tmp_path / "new"), broken)
    assert sorted(os.listdir(tmp_path)) == ["model"]
    assert _tree(target)["saved_model.pb"] == b"v1"


def _digits_estimator(work_dir):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)

    def build():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])

    model_func = fw.train.get_clf_model_func(build, fw.train.sgd_optimizer(0.1))
    est = fw.train.get_tpu_estimator(2, model_func, str(work_dir), trn_bs=32, val_bs=32,
                                     verbose=False)
    est.train(lambda params: fw.data.numpy_ds(x, y, params["batch_size"]), steps=2)
    return est, x


def test_the_estimators_export_keeps_the_users_files(tmp_path):
    """The reproduction of issue 46: export into a folder holding a user's file, and a
    folder named like the old swap's ``d.old``."""
    est, x = _digits_estimator(tmp_path / "run")
    user = tmp_path / "d"
    user.mkdir()
    (user / "report.csv").write_bytes(b"a,b\n")
    (tmp_path / "d.old").mkdir()
    (tmp_path / "d.old" / "keep.txt").write_bytes(b"keep")
    with pytest.raises(ValueError, match="report.csv"):
        est.export_saved_model(str(user))
    assert _tree(tmp_path / "d") == {"report.csv": b"a,b\n"}
    exported = est.export_saved_model(str(tmp_path / "d" / "model"))
    again = est.export_saved_model(exported)  # its own export: replaced
    want = est.predict(lambda params: fw.data.numpy_ds(x, None, params["batch_size"],
                                                      training=False))
    loaded = tf.saved_model.load(again)  # kept: its variables outlive the call
    got = loaded.serve(x)["predictions"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert _tree(tmp_path / "d.old") == {"keep.txt": b"keep"}
    assert (tmp_path / "d" / "report.csv").read_bytes() == b"a,b\n"
