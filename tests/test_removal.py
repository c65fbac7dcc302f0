"""`fenwicks._removal`: the one module that deletes, and only what Fenwicks can prove it
wrote (issue 52): its own names in a work_dir, or a folder exactly as its manifest lists."""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

import pytest

from fenwicks import _removal

PACKAGE = Path(_removal.__file__).parent
# Calls that delete: the names the issue lists, and the ways to reach them (os, shutil,
# pathlib, tf.io.gfile, gcsfs, tempfile's self-removing folder).
_REMOVAL_TEXT = re.compile(
    r"\brmtree\b|\bunlink\b|\brmdir\b|\bremovedirs\b|\bos\.remove\b|gfile\.remove\b"
    r"|\.rm\(|\.rm_file\(|\.delete\(|TemporaryDirectory|\bsend2trash\b")
_REMOVAL_NAMES = {"rmtree", "unlink", "rmdir", "removedirs", "remove", "rm", "rm_file",
                  "TemporaryDirectory"}
# `.remove(x)` on these is a list's, not a file's (preemption.py's watchers).
_LIST_RECEIVERS = {"self._watchers", "self._flushes", "_WAKEUPS"}


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "_removal.py":
            yield path, path.read_text()


def test_only_the_removal_module_calls_removal_functions():
    found = []
    for path, text in _sources():
        for number, line in enumerate(text.splitlines(), 1):
            if _REMOVAL_TEXT.search(line.split("#", 1)[0]):
                found.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module in {"os", "shutil",
                                                                    "tempfile"}:
                names = {a.name for a in node.names} & _REMOVAL_NAMES
                if names:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: imports {names}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "remove"
                    and ast.unparse(node.func.value) not in _LIST_RECEIVERS):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: "
                             f"{ast.unparse(node)}")
    assert found == []


def test_the_grep_sees_a_removal_where_one_is_added(tmp_path):
    """The check itself: each way of deleting is caught (it would pass vacuously)."""
    lines = ["shutil.rmtree(p)", "os.remove(p)", "os.unlink(p)", "Path(p).unlink()",
             "os.rmdir(p)", "tf.io.gfile.rmtree(p)", "tf.io.gfile.remove(p)",
             "fs.rm(p, recursive=True)", "with tempfile.TemporaryDirectory() as t: pass"]
    assert [line for line in lines if not _REMOVAL_TEXT.search(line)] == []
    calls = [ast.unparse(n) for n in ast.walk(ast.parse("gfile.remove(p)\nxs.remove(1)"))
             if isinstance(n, ast.Call) and n.func.attr == "remove"]
    assert calls == ["gfile.remove(p)", "xs.remove(1)"]


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _work_dir(root: Path) -> Path:
    """A work_dir as both engines leave it (names from a real run of each)."""
    files = ["checkpoint", "ckpt-2.index", "ckpt-2.data-00000-of-00001",
             "fenwicks_input.json", "fenwicks.lock", "epochs.jsonl",
             "train/events.out.tfevents.1795878944.vm.7126.0.v2",
             "eval/events.out.tfevents.1795878948.vm.7126.1.v2",
             "orbax/2/_CHECKPOINT_METADATA", "orbax/2/state/array_metadatas/process_0",
             "orbax/4.orbax-checkpoint-tmp-17/_METADATA",
             "train/plugins/profile/2026_01_01/vm.xplane.pb", ".worker-1/ckpt-3.index"]
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(name.encode())
    return root


def test_a_work_dir_of_fenwicks_files_only_is_all_its_own(tmp_path):
    work_dir = _work_dir(tmp_path / "run")
    own, foreign = _removal.classify_work_dir(str(work_dir))
    assert foreign == [] and len(own) == 13
    assert _removal.remove_own_work_files(str(work_dir)) == []
    assert os.listdir(work_dir) == []


@pytest.mark.parametrize("name", ["train.py", "orbax/notes.txt", "train/mine.csv",
                                  "data/ckpt-1.index", "export/saved_model.pb",
                                  "fenwicks_export.json.bak/x"])
def test_a_file_of_the_users_is_foreign_and_kept(tmp_path, name):
    work_dir = _work_dir(tmp_path / "run")
    (work_dir / name).parent.mkdir(parents=True, exist_ok=True)
    (work_dir / name).write_bytes(b"mine")
    own, foreign = _removal.classify_work_dir(str(work_dir))
    assert foreign == [name]
    assert _removal.remove_own_work_files(str(work_dir), own) == [name]
    assert _tree(work_dir) == {name: b"mine"}


def test_a_manifest_proves_exactly_the_files_it_lists(tmp_path):
    folder = tmp_path / "run" / "export" / "1"
    (folder / "variables").mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(b"graph")
    (folder / "variables" / "variables.index").write_bytes(b"index")
    _removal.write_manifest(str(folder))
    record = json.loads((folder / _removal.MANIFEST).read_text())
    assert record["files"]["saved_model.pb"] == {
        "size": 5, "sha256": "f5f1b2a6e6c7ee9c0a69a5e5b0f2a5a4"[:0]
        + __import__("hashlib").sha256(b"graph").hexdigest()}
    assert _removal.manifest_mismatches(str(folder)) == []
    assert _removal.classify_work_dir(str(tmp_path / "run")) == (
        ["export/1/fenwicks_manifest.json", "export/1/saved_model.pb",
         "export/1/variables/variables.index"], [])
    # a file added, and a listed file changed at the same size: neither is proven
    (folder / "variables" / "vocab.txt").write_bytes(b"user")
    (folder / "saved_model.pb").write_bytes(b"GRAPH")
    assert _removal.manifest_mismatches(str(folder)) == [
        "variables/vocab.txt (not written by Fenwicks)",
        "saved_model.pb (changed since it was written)"]
    assert _removal.remove_by_manifest(str(folder)) != []
    assert _removal.classify_work_dir(str(tmp_path / "run"))[1] == [
        "export/1/saved_model.pb", "export/1/variables/vocab.txt"]
    assert (folder / "variables" / "vocab.txt").read_bytes() == b"user"
    (folder / "variables" / "vocab.txt").unlink()
    (folder / "saved_model.pb").write_bytes(b"graph")
    assert _removal.remove_by_manifest(str(folder)) == [] and not folder.exists()


def test_a_manifest_that_is_not_one_proves_nothing(tmp_path):
    folder = tmp_path / "out"
    (folder / "variables").mkdir(parents=True)
    (folder / "variables" / "train.csv").write_bytes(b"a,b\n")
    (folder / _removal.MANIFEST).write_text("not json")
    assert _removal.read_manifest(str(folder)) is None
    assert _removal.remove_by_manifest(str(folder)) == [
        f"variables/train.csv (no {_removal.MANIFEST})"]
    assert _removal.classify_work_dir(str(folder)) == (
        [_removal.MANIFEST], ["variables/train.csv"])
    assert (folder / "variables" / "train.csv").read_bytes() == b"a,b\n"


def test_a_symlink_is_removed_as_a_link_never_followed(tmp_path):
    target = tmp_path / "data"
    target.mkdir()
    (target / "keep.txt").write_bytes(b"keep")
    (tmp_path / "link").symlink_to(target)
    assert _removal.remove_tree(str(tmp_path / "link")) is True
    assert not (tmp_path / "link").exists() and _tree(target) == {"keep.txt": b"keep"}
    assert _removal.remove_tree(str(tmp_path / "link")) is False
    with pytest.raises(FileNotFoundError):
        _removal.remove_tree(str(tmp_path / "link"), missing_ok=False)


def test_remove_file_and_empty_dir(tmp_path):
    (tmp_path / "a").write_bytes(b"x")
    assert _removal.remove_file(str(tmp_path / "a")) is True
    assert _removal.remove_file(str(tmp_path / "a")) is False
    with pytest.raises(FileNotFoundError):
        _removal.remove_file(str(tmp_path / "a"), missing_ok=False)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_bytes(b"x")
    assert _removal.remove_empty_dir(str(tmp_path / "d")) is False
    assert _tree(tmp_path) == {"d/f": b"x"}


def test_a_work_dir_nested_in_another_is_recognised_by_its_run_record(tmp_path):
    """Tutorials put an estimator's work_dir inside the project's (work_dir/model)."""
    root = tmp_path / "run"
    _work_dir(root / "model")
    (root / "other").mkdir()
    (root / "other" / "ckpt-1.index").write_bytes(b"a user's file of that name")
    own, foreign = _removal.classify_work_dir(str(root))
    assert foreign == ["other/ckpt-1.index"] and len(own) == 13
    assert _removal.remove_own_work_files(str(root), own) == ["other/ckpt-1.index"]
    assert _tree(root) == {"other/ckpt-1.index": b"a user's file of that name"}
