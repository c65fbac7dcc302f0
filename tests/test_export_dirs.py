"""`fenwicks.train.export_dirs`: each export is a new version folder, visible only when
complete, and nothing that exists is replaced or deleted (issues 46 and 52). Every test
starts from a folder holding a user's file and ends with it intact, byte for byte."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

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
        os.makedirs(os.path.join(folder, "variables"), exist_ok=True)
        with open(os.path.join(folder, "saved_model.pb"), "wb") as f:
            f.write(payload)
        with open(os.path.join(folder, "variables", "variables.index"), "wb") as f:
            f.write(payload * 2)
    return write


def test_an_export_is_a_new_version_folder_with_its_manifest(tmp_path):
    base = tmp_path / "deep" / "model"
    before = int(time.time())
    path = export_dirs.write(str(base), _writer(b"v1"))
    version = os.path.basename(path)
    assert os.path.dirname(path) == str(base) and before <= int(version) <= time.time()
    files = _tree(base)
    manifest = json.loads(files.pop(f"{version}/fenwicks_manifest.json"))
    assert files == {f"{version}/saved_model.pb": b"v1",
                     f"{version}/variables/variables.index": b"v1v1"}
    assert manifest["files"] == {
        "saved_model.pb": {"size": 2, "sha256": hashlib.sha256(b"v1").hexdigest()},
        "variables/variables.index": {"size": 4,
                                      "sha256": hashlib.sha256(b"v1v1").hexdigest()}}
    assert sorted(os.listdir(base)) == [version]  # no staging folder left
    assert os.stat(path).st_mode & 0o777 == 0o777 & ~_umask()  # readable by a server
    assert export_dirs.latest_export(str(base)) == path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_versions_increase_even_within_one_second(tmp_path):
    paths = [export_dirs.write(str(tmp_path), _writer(f"v{i}".encode())) for i in range(3)]
    numbers = [int(os.path.basename(p)) for p in paths]
    assert numbers == sorted(set(numbers)) and numbers[2] - numbers[0] >= 2
    assert fw.train.latest_export(str(tmp_path)) == paths[-1]
    assert export_dirs.versions(str(tmp_path)) == paths


def test_loss_1_a_users_file_inside_an_earlier_export_survives_the_next(tmp_path):
    """Loss 1: export to d, add d/<version>/assets/vocab.txt and a file in variables/,
    export to d again: both files stay, and the first export stays loadable as it was."""
    first = export_dirs.write(str(tmp_path / "d"), _writer(b"v1"))
    os.makedirs(f"{first}/assets")
    with open(f"{first}/assets/vocab.txt", "wb") as f:
        f.write(b"the\nand\n")
    with open(f"{first}/variables/mine.bin", "wb") as f:
        f.write(b"\x00\x01")
    second = export_dirs.write(str(tmp_path / "d"), _writer(b"v2"))
    assert second != first
    assert (tmp_path / "d" / os.path.basename(first) / "assets" / "vocab.txt"
            ).read_bytes() == b"the\nand\n"
    assert (tmp_path / "d" / os.path.basename(first) / "variables" / "mine.bin"
            ).read_bytes() == b"\x00\x01"
    assert _tree(tmp_path / "d")[f"{os.path.basename(second)}/saved_model.pb"] == b"v2"


def test_loss_1_an_export_of_the_old_layout_keeps_the_users_files(tmp_path):
    """An export written by the code before versions (the SavedModel directly in d),
    with a user's assets/vocab.txt added: still read, and nothing in it touched."""
    d = tmp_path / "d"
    _writer(b"old")(str(d))
    (d / "fenwicks_export.json").write_text('{"written_by": "fenwicks"}')
    (d / "assets").mkdir()
    (d / "assets" / "vocab.txt").write_bytes(b"vocab")
    before = _tree(d)
    assert fw.train.latest_export(str(d)) == str(d)  # migration: read as it is
    path = export_dirs.write(str(d), _writer(b"new"))
    after = _tree(d)
    assert {k: after[k] for k in before} == before
    assert fw.train.latest_export(str(d)) == path


def test_loss_2_a_fake_marker_proves_nothing_and_nothing_is_replaced(tmp_path):
    """Loss 2: a folder holding a fenwicks_export.json that is not JSON, and CSVs."""
    d = tmp_path / "d"
    (d / "variables").mkdir(parents=True)
    (d / "fenwicks_export.json").write_bytes(b"not json at all")
    (d / "variables" / "train.csv").write_bytes(b"x,y\n1,2\n")
    path = export_dirs.write(str(d), _writer(b"v1"))
    assert _tree(d)["variables/train.csv"] == b"x,y\n1,2\n"
    assert _tree(d)["fenwicks_export.json"] == b"not json at all"
    assert fw.train.latest_export(str(d)) == path


def test_loss_4_a_file_put_in_while_an_export_is_written_survives(tmp_path):
    """Loss 4: a user's file written into the export folder (and into the earlier
    version) while the next export runs."""
    d = tmp_path / "d"
    first = export_dirs.write(str(d), _writer(b"v1"))

    def writer_and_user(folder: str) -> None:
        (d / "notes.txt").write_bytes(b"written meanwhile")
        with open(f"{first}/notes.txt", "wb") as f:
            f.write(b"also meanwhile")
        _writer(b"v2")(folder)

    second = export_dirs.write(str(d), writer_and_user)
    files = _tree(d)
    assert files["notes.txt"] == b"written meanwhile"
    assert files[f"{os.path.basename(first)}/notes.txt"] == b"also meanwhile"
    assert files[f"{os.path.basename(first)}/saved_model.pb"] == b"v1"
    assert files[f"{os.path.basename(second)}/saved_model.pb"] == b"v2"


def test_a_failed_writer_removes_only_its_own_partial_version(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "mine.txt").write_bytes(b"keep")
    first = export_dirs.write(str(d), _writer(b"v1"))

    def broken(folder: str) -> None:
        _writer(b"half")(folder)
        raise OSError(28, "No space left on device")

    with pytest.raises(export_dirs.ExportError,
                       match=rf"could not export the SavedModel to {d}: \[Errno 28\] No "
                             r"space left on device; the partial version was removed and "
                             r"earlier exports there are untouched\. Free space"):
        export_dirs.write(str(d), broken)
    assert sorted(os.listdir(d)) == sorted([os.path.basename(first), "mine.txt"])
    assert (d / "mine.txt").read_bytes() == b"keep"
    assert fw.train.latest_export(str(d)) == first


def test_a_version_without_its_manifest_is_incomplete_and_skipped(tmp_path):
    """What a kill mid-export leaves on gs:// (written in place, manifest last)."""
    first = export_dirs.write(str(tmp_path), _writer(b"v1"))
    cut = tmp_path / str(int(os.path.basename(first)) + 5)
    cut.mkdir()
    (cut / "saved_model.pb").write_bytes(b"half")
    assert fw.train.latest_export(str(tmp_path)) == first
    assert int(os.path.basename(export_dirs.write(str(tmp_path), _writer(b"v2")))) > int(
        cut.name)  # never written into
    assert (cut / "saved_model.pb").read_bytes() == b"half"


def test_export_dir_that_is_a_symlink_gets_the_version_in_the_linked_folder(tmp_path,
                                                                            caplog):
    """Was: the link replaced by a local folder, then 'Cannot call rmtree on a symbolic
    link', and the linked folder got nothing."""
    real = tmp_path / "data" / "models"
    real.mkdir(parents=True)
    (real / "mine.txt").write_bytes(b"keep")
    (tmp_path / "link").symlink_to(real)
    with caplog.at_level(logging.INFO, logger="fenwicks"):
        path = export_dirs.write(str(tmp_path / "link"), _writer(b"v1"))
    assert f"fenwicks: export_dir_base='{tmp_path}/link' is a symlink to '{real}'; the new " \
           "version goes into that folder" in [r.getMessage() for r in caplog.records]
    assert (tmp_path / "link").is_symlink()  # the link is still a link
    assert _tree(real)[f"{os.path.basename(path)}/saved_model.pb"] == b"v1"
    assert (real / "mine.txt").read_bytes() == b"keep"


def test_export_dir_dot_is_a_version_in_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_bytes(b"print(1)\n")
    path = export_dirs.write(".", _writer(b"v1"))
    assert os.path.dirname(path) == "." and os.path.basename(path).isdigit()
    assert (tmp_path / "train.py").read_bytes() == b"print(1)\n"
    assert sorted(os.listdir(tmp_path)) == sorted(["train.py", os.path.basename(path)])


def test_export_dir_that_is_or_lies_under_a_file_is_refused_in_one_sentence(tmp_path):
    (tmp_path / "notes.txt").write_bytes(b"mine")
    calls = []
    with pytest.raises(ValueError, match=rf"export_dir_base='{tmp_path}/notes.txt' is a file; "
                                         r"exports go to version folders inside a folder\. "
                                         rf"Pass a folder, e\.g\. {tmp_path}/notes.txt_export"):
        export_dirs.write(str(tmp_path / "notes.txt"), calls.append)
    with pytest.raises(ValueError, match=rf"export_dir_base='{tmp_path}/notes.txt/model' lies "
                                         rf"under '{tmp_path}/notes.txt', which is a file, so "
                                         "no folder can be made there"):
        export_dirs.check_base(str(tmp_path / "notes.txt" / "model"))
    assert calls == [] and _tree(tmp_path) == {"notes.txt": b"mine"}


def test_latest_export_of_a_folder_without_one_says_so(tmp_path):
    (tmp_path / "mine.txt").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match=rf"export_dir_base='{tmp_path}' holds no "
                                                r"complete export"):
        fw.train.latest_export(str(tmp_path))


def _best(base, writer="BestExporter", payload=b"v"):
    return export_dirs.write(str(base), _writer(payload), extra_files={"best.json": "{}"},
                             manifest_extra={"writer": writer})


def test_keep_n_removes_only_unchanged_versions_it_wrote_and_warns_once(tmp_path, caplog):
    base = tmp_path / "best"
    versions = [_best(base, payload=bytes([i])) for i in range(4)]
    other = export_dirs.write(str(base), _writer(b"est"))  # the estimator's, not its own
    with open(f"{versions[0]}/assets.txt", "wb") as f:  # a user's file in its oldest
        f.write(b"mine")
    with open(f"{versions[1]}/saved_model.pb", "wb") as f:  # changed, same size
        f.write(b"\x09")
    warned: set[str] = set()
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        removed = export_dirs.remove_old_versions(str(base), 1, "BestExporter", warned)
        export_dirs.remove_old_versions(str(base), 1, "BestExporter", warned)
    assert removed == [versions[2]]
    assert sorted(os.listdir(base)) == sorted(
        os.path.basename(v) for v in [versions[0], versions[1], versions[3], other])
    assert (base / os.path.basename(versions[0]) / "assets.txt").read_bytes() == b"mine"
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        f"fenwicks: BestExporter left {versions[0]} in place: it holds assets.txt (not "
        "written by Fenwicks), and it removes only exports exactly as it wrote them; "
        "delete that folder yourself once it is not needed",
        f"fenwicks: BestExporter left {versions[1]} in place: it holds saved_model.pb "
        "(changed since it was written), and it removes only exports exactly as it wrote "
        "them; delete that folder yourself once it is not needed"]


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


def test_the_estimators_exports_keep_the_users_files_and_serve(tmp_path):
    """Issue 46's and 52's reproductions through the estimator: a folder of the user's
    gets a version folder beside its files; a second export is another version."""
    est, x = _digits_estimator(tmp_path / "run")
    user = tmp_path / "d"
    (user / "variables").mkdir(parents=True)
    (user / "report.csv").write_bytes(b"a,b\n")
    (user / "variables" / "train.csv").write_bytes(b"c,d\n")
    first = est.export_saved_model(str(user))
    second = est.export_saved_model(user)  # a pathlib.Path
    assert first != second and os.path.dirname(second) == str(user)
    want = est.predict(lambda params: fw.data.numpy_ds(x, None, params["batch_size"],
                                                      training=False))
    loaded = tf.saved_model.load(fw.train.latest_export(str(user)))  # kept: owns variables
    got = loaded.serve(x)["predictions"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert (user / "report.csv").read_bytes() == b"a,b\n"
    assert (user / "variables" / "train.csv").read_bytes() == b"c,d\n"
    assert export_dirs.versions(str(user)) == [first, second]


def _loss_3(first: dict, killed, read: dict) -> None:
    assert killed.returncode in (-9, 137), killed.stderr[-3000:]  # SIGKILLed midway
    assert read["latest"] == first["version"]  # the cut version is skipped
    assert read["served"] == first["served"]  # and the earlier one serves as before
    assert read["user_file"] == "id,label\n1,cat\n"
    assert os.path.basename(first["version"]) in read["entries"] and "notes" in read["entries"]


def test_loss_3_an_export_killed_between_objects_leaves_the_earlier_one_whole(tmp_path):
    """Loss 3 on local disk: a wider model's export SIGKILLed after two objects."""
    from tests.conftest import run_module_json, run_process

    base, work = str(tmp_path / "export"), str(tmp_path / "work")
    first = run_module_json("tests._export_kill", "first", base, work + "1")
    killed = run_process(["-m", "tests._export_kill", "killed", base, work + "2"],
                         check=False)
    read = run_module_json("tests._export_kill", "read", base)
    _loss_3(first, killed, read)
    assert [n for n in read["entries"] if n.startswith(".tmp-")]  # the cut staging, kept


def test_loss_3_on_gcs_an_export_killed_between_objects_leaves_the_earlier_one(
        gcs_emulator):
    """Loss 3 as reported: gs:// (no rename: written in place, manifest last), a wider
    model exported over an earlier one, the process killed after two objects."""
    base = gcs_emulator.unique_url("export-kill") + "/export"
    work = gcs_emulator.unique_url("export-kill-work")
    first = gcs_emulator.run_module_json("tests._export_kill", "first", base, work + "1")
    killed = gcs_emulator.run_module("tests._export_kill", "killed", base, work + "2",
                                     check=False)
    read = gcs_emulator.run_module_json("tests._export_kill", "read", base)
    _loss_3(first, killed, read)
    cut = [n for n in read["entries"] if n.isdigit() and n != os.path.basename(
        first["version"])]
    assert len(cut) == 1  # the cut version is there, without its manifest, and skipped


def gcs_losses(root: str) -> dict:
    """Losses 1, 2 and 4 on ``gs://`` (run inside the emulator's namespace)."""
    def put(path: str, data: bytes) -> None:
        with tf.io.gfile.GFile(path, "wb") as f:
            f.write(data)

    def get(path: str) -> str:
        with tf.io.gfile.GFile(path, "rb") as f:
            return f.read().decode()

    def writer(payload: bytes):
        return lambda folder: (put(f"{folder}/saved_model.pb", payload),
                               put(f"{folder}/variables/variables.index", payload * 2))

    out = {}
    d = f"{root}/d1"  # loss 1: files of the user's in and beside an earlier export
    first = export_dirs.write(d, writer(b"v1"))
    put(f"{first}/assets/vocab.txt", b"vocab")
    put(f"{d}/assets/vocab.txt", b"top")
    second = export_dirs.write(d, writer(b"v2"))
    out["loss1"] = [get(f"{first}/assets/vocab.txt"), get(f"{d}/assets/vocab.txt"),
                    get(f"{first}/saved_model.pb"), get(f"{second}/saved_model.pb"),
                    export_dirs.latest_export(d) == second != first]
    d = f"{root}/d2"  # loss 2: a marker that proves nothing, and CSVs
    put(f"{d}/fenwicks_export.json", b"not json")
    put(f"{d}/variables/train.csv", b"x,y")
    version = export_dirs.write(d, writer(b"v1"))
    out["loss2"] = [get(f"{d}/variables/train.csv"), get(f"{d}/fenwicks_export.json"),
                    export_dirs.latest_export(d) == version]
    d = f"{root}/d4"  # loss 4: files written while the next export runs
    first = export_dirs.write(d, writer(b"v1"))

    def meanwhile(folder: str) -> None:
        put(f"{d}/notes.txt", b"meanwhile")
        put(f"{first}/notes.txt", b"in the old one")
        writer(b"v2")(folder)

    second = export_dirs.write(d, meanwhile)
    out["loss4"] = [get(f"{d}/notes.txt"), get(f"{first}/notes.txt"),
                    get(f"{first}/saved_model.pb"), get(f"{second}/saved_model.pb")]
    return out


def test_losses_1_2_4_on_gcs_keep_the_users_files(gcs_emulator):
    root = gcs_emulator.unique_url("export-losses")
    out = gcs_emulator.run_json(
        "import json\nfrom tests.test_export_dirs import gcs_losses\n"
        f"print(json.dumps(gcs_losses({root!r})))")
    assert out == {"loss1": ["vocab", "top", "v1", "v2", True],
                   "loss2": ["x,y", "not json", True],
                   "loss4": ["meanwhile", "in the old one", "v1", "v2"]}
