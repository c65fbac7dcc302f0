"""fw.io on local disk (in this process) and its fail-fast gs:// credential check.

The accelerator is always faked here (fw.accel's cached value, restored by monkeypatch):
real detection would fix TensorFlow's devices for every later test in this process.
gs:// round trips against a real server are in test_gcs.py.
"""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

import fenwicks as fw
from fenwicks.accel import Accelerator
from tests.conftest import run_json


@pytest.fixture
def accelerator(monkeypatch, accel_state):
    """Sets the cached accelerator: `accelerator(remote=True)` fakes a TPU node."""
    def set_accelerator(remote: bool = False) -> Accelerator:
        acc = Accelerator("tpu" if remote else "cpu", 8 if remote else 1,
                          "bfloat16" if remote else "float32", is_remote=remote)
        accel_state(acc)
        return acc
    set_accelerator()
    for name in ("FENWICKS_ROOT", "FENWICKS_BUCKET", "COLAB_RELEASE_TAG",
                 "KAGGLE_KERNEL_RUN_TYPE"):
        monkeypatch.delenv(name, raising=False)
    return set_accelerator


def make_tree(root, files: dict[str, bytes]) -> None:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


def tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# --------------------------------------------------------------------------- project dirs


def test_get_project_dirs_local_root_creates_both(tmp_path, accelerator):
    data_dir, work_dir = fw.io.get_project_dirs(str(tmp_path / "root"), "cifar10")
    assert data_dir == os.path.join(str(tmp_path), "root", "data", "cifar10")
    assert work_dir == os.path.join(str(tmp_path), "root", "work", "cifar10")
    assert os.path.isdir(data_dir) and os.path.isdir(work_dir)
    # Idempotent: a second call (a resumed notebook) finds them and changes nothing.
    (tmp_path / "root" / "work" / "cifar10" / "ckpt").write_text("keep")
    assert fw.io.get_project_dirs(str(tmp_path / "root"), "cifar10") == (data_dir, work_dir)
    assert (tmp_path / "root" / "work" / "cifar10" / "ckpt").read_text() == "keep"


def test_get_project_dirs_auto_root(tmp_path, accelerator, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert fw.io.get_project_dirs(None, "a/b")[1] == str(tmp_path / "home/fenwicks/work/a/b")
    monkeypatch.setenv("FENWICKS_ROOT", str(tmp_path / "elsewhere"))
    assert fw.io.get_project_dirs(None, "p")[0] == str(tmp_path / "elsewhere/data/p")
    monkeypatch.delenv("FENWICKS_ROOT")
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-test")
    assert fw.io.default_root() == "/content/fenwicks"


def test_remote_tpu_root_is_the_bucket(accelerator, monkeypatch):
    accelerator(remote=True)
    monkeypatch.setenv("FENWICKS_BUCKET", "my-bucket")
    assert fw.io.default_root() == "gs://my-bucket"
    monkeypatch.setenv("FENWICKS_BUCKET", "gs://my-bucket/team/")
    assert fw.io.default_root() == "gs://my-bucket/team"


def test_remote_tpu_without_bucket_is_a_clear_error(tmp_path, accelerator, monkeypatch):
    accelerator(remote=True)
    with pytest.raises(ValueError, match="FENWICKS_BUCKET is not set"):
        fw.io.get_project_dirs(None, "cifar10")
    with pytest.raises(ValueError, match=r"root_dir=.*is local.*gs://"):
        fw.io.get_project_dirs(str(tmp_path), "cifar10")
    monkeypatch.setenv("FENWICKS_ROOT", str(tmp_path))
    with pytest.raises(ValueError, match="FENWICKS_ROOT=.*is local"):
        fw.io.get_project_dirs(None, "cifar10")
    assert list(tmp_path.iterdir()) == []  # nothing was created on the way


@pytest.mark.parametrize("project", ["", "  ", "../x", "a/../b", "/abs", "a//b", "gs://b",
                                     "x*", None, 5])
def test_get_project_dirs_rejects_bad_project(tmp_path, accelerator, project):
    with pytest.raises(ValueError, match="project="):
        fw.io.get_project_dirs(str(tmp_path), project)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("root_dir", ["", "gs://", "gs:///x", 3])
def test_get_project_dirs_rejects_bad_root(accelerator, root_dir):
    with pytest.raises(ValueError, match="root_dir="):
        fw.io.get_project_dirs(root_dir, "p")


# --------------------------------------------------------------------------- create_clean_dir


_RUN = {"run/checkpoint": b"c", "run/ckpt-2.index": b"i", "run/fenwicks_input.json": b"{}",
        "run/train/events.out.tfevents.1.vm.1.0.v2": b"e", "run/epochs.jsonl": b"{}",
        "run/orbax/2/_CHECKPOINT_METADATA": b"m"}


def test_create_clean_dir_empties_only_that_dir(tmp_path):
    make_tree(tmp_path, {**_RUN, "run2/c": b"3", "run.txt": b"4"})
    assert fw.io.create_clean_dir(str(tmp_path / "run")) == str(tmp_path / "run")
    assert os.listdir(tmp_path / "run") == []
    assert tree(tmp_path) == {"run2/c": b"3", "run.txt": b"4"}
    fw.io.create_clean_dir(str(tmp_path / "new/deep"))  # missing: created
    assert os.path.isdir(tmp_path / "new/deep")


def test_create_clean_dir_never_follows_symlinks(tmp_path):
    make_tree(tmp_path, {"precious/data": b"keep", "run/x": b"1"})
    os.symlink(tmp_path / "precious", tmp_path / "run" / "link")
    fw.io.create_clean_dir(str(tmp_path / "run"), force=True)
    assert tree(tmp_path) == {"precious/data": b"keep"}
    os.symlink(tmp_path / "precious", tmp_path / "alias")
    with pytest.raises(ValueError, match=r"path=.*alias.*symlink"):
        fw.io.create_clean_dir(str(tmp_path / "alias"), force=True)
    assert tree(tmp_path) == {"precious/data": b"keep"}


def test_create_clean_dir_deletes_only_fenwicks_files_unless_forced(tmp_path):
    """Without force a folder holding any other file is refused, naming it; nothing
    is deleted (not even Fenwicks' own files beside it)."""
    make_tree(tmp_path, {**_RUN, "run/notes/b.txt": b"user", "run/train/mine.csv": b"u"})
    before = tree(tmp_path)
    with pytest.raises(ValueError, match=(
            rf"path='{tmp_path}/run' holds '{tmp_path}/run/notes/b.txt' \(and 1 more\), "
            r"which Fenwicks did not write; create_clean_dir deletes only Fenwicks' own "
            r"files .*, so nothing was deleted\. Move that file away, or call "
            rf"fw.io.create_clean_dir\('{tmp_path}/run', force=True\)")):
        fw.io.create_clean_dir(str(tmp_path / "run"))
    assert tree(tmp_path) == before
    fw.io.create_clean_dir(str(tmp_path / "run"), force=True)
    assert tree(tmp_path) == {} and os.listdir(tmp_path / "run") == []


def test_create_clean_dir_deletes_an_export_its_manifest_proves_and_keeps_others(tmp_path):
    from fenwicks.train import export_dirs

    def write(folder):
        with open(os.path.join(folder, "saved_model.pb"), "wb") as f:
            f.write(b"graph")

    make_tree(tmp_path, _RUN)
    version = export_dirs.write(str(tmp_path / "run" / "export"), write)
    fw.io.create_clean_dir(str(tmp_path / "run"))  # all of it Fenwicks': no force
    assert os.listdir(tmp_path / "run") == []
    make_tree(tmp_path, _RUN)
    version = export_dirs.write(str(tmp_path / "run" / "export"), write)
    with open(os.path.join(version, "saved_model.pb"), "wb") as f:
        f.write(b"GRAPH")  # changed since it was written: not provably Fenwicks'
    with pytest.raises(ValueError, match=rf"holds '{version}/saved_model.pb', which "):
        fw.io.create_clean_dir(str(tmp_path / "run"))
    assert tree(tmp_path)[os.path.relpath(version, tmp_path) + "/saved_model.pb"] == b"GRAPH"


@pytest.mark.parametrize("path", ["/tmp", "/usr", "/etc", "/var/tmp", "/var", "/usr/local/x",
                                  "/var/log/x", "/etc/fenwicks", "/dev/shm", "/", "/content",
                                  "/kaggle/working"])
def test_create_clean_dir_refuses_system_folders_even_with_force(path, monkeypatch):
    monkeypatch.setenv("FENWICKS_ROOT", "/")  # every folder inside the storage root
    before = sorted(os.listdir(path)) if os.path.isdir(path) else None
    # why depends on where the test runs (a clone in /tmp: /tmp holds the current folder)
    with pytest.raises(ValueError, match=r"path=.*(system folder|root of the file system|"
                                         r"current directory).*even with force=True"):
        fw.io.create_clean_dir(path, force=True)
    assert (sorted(os.listdir(path)) if os.path.isdir(path) else None) == before


def test_create_clean_dir_refuses_pythons_installation_and_a_mount_point(tmp_path):
    import sys

    with pytest.raises(ValueError, match="system folder"):
        fw.io.create_clean_dir(os.path.join(sys.prefix, "lib"), force=True)
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "fenwicks-test", str(mount)],
                   check=True)
    try:
        (mount / "file").write_bytes(b"on the disk")
        with pytest.raises(ValueError, match=r"path=.*disk.*a mount point"):
            fw.io.create_clean_dir(str(mount), force=True)
        assert (mount / "file").read_bytes() == b"on the disk"
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_create_clean_dir_refuses_dangerous_paths(tmp_path, monkeypatch):
    make_tree(tmp_path, {"home/me/notes": b"n", "work/a/b/c": b"c", "file": b"f"})
    monkeypatch.setenv("HOME", str(tmp_path / "home/me"))
    monkeypatch.chdir(tmp_path / "work/a/b")
    for path in (tmp_path / "home", tmp_path / "home/me", tmp_path / "work/a", "/", "."):
        with pytest.raises(ValueError, match="refusing to delete"):
            fw.io.create_clean_dir(str(path), force=True)
    with pytest.raises(ValueError, match=r"path=.*file.*is a file"):
        fw.io.create_clean_dir(str(tmp_path / "file"), force=True)
    for path in ("gs://bucket", "gs://bucket/", "gs://bucket/a/../b", "gs://bucket/r*"):
        with pytest.raises(ValueError, match="path="):
            fw.io.create_clean_dir(path)
    assert tree(tmp_path) == {"home/me/notes": b"n", "work/a/b/c": b"c", "file": b"f"}


def _needs_root_to_mount() -> None:
    if os.geteuid() != 0 and os.environ.get("CI") != "true":
        pytest.skip("mounting needs root (CI runs as root)")


def test_loss_5_a_bind_mount_on_the_same_disk_is_refused_and_its_source_kept(tmp_path):
    """Loss 5: a bind mount inside the root (same filesystem, so os.path.ismount is
    False) is a mount point all the same; so is a folder holding one."""
    _needs_root_to_mount()
    make_tree(tmp_path, {"source/train.csv": b"id,label\n", "root/work/p/ckpt-1.index": b"c"})
    mount = tmp_path / "root" / "work" / "p" / "data"
    mount.mkdir()
    subprocess.run(["mount", "--bind", str(tmp_path / "source"), str(mount)], check=True)
    try:
        assert not os.path.ismount(mount)  # what the check used to rely on
        with pytest.raises(ValueError, match=(
                rf"path='{mount}/' is a mount point \(an? \w+ mount of .*, folder "
                r"'.*/source' of it\); refusing to delete it \(even with force=True\)")):
            fw.io.create_clean_dir(f"{mount}/", force=True)
        with pytest.raises(ValueError, match=(
                rf"path='{mount.parent}' is a folder holding the mount point '{mount}' .*"
                r"whose files a clean would delete; refusing to delete it")):
            fw.io.create_clean_dir(str(mount.parent), force=True)
    finally:
        subprocess.run(["umount", str(mount)], check=True)
    assert tree(tmp_path) == {"source/train.csv": b"id,label\n",
                              "root/work/p/ckpt-1.index": b"c"}


def test_loss_6_a_symlink_with_a_trailing_slash_is_refused_and_its_target_kept(tmp_path):
    """Loss 6: work/proj -> data/proj, cleaned as 'work/proj/' (and 'work/proj/.')."""
    make_tree(tmp_path, {"data/proj/train.csv": b"x,y\n", "data/proj/ckpt-1.index": b"c",
                         "work/other/ckpt-1.index": b"c"})
    os.symlink(tmp_path / "data" / "proj", tmp_path / "work" / "proj")
    for given in ("work/proj/", "work/proj//", "work/proj/.", "work/other/../proj/"):
        path = f"{tmp_path}/{given}"
        for force in (False, True):
            with pytest.raises(ValueError, match=(
                    rf"path='{path}' is a symlink to '{tmp_path}/data/proj'; "
                    r"create_clean_dir never empties a folder through a link\. Pass the "
                    "real folder if that is the one to clean")):
                fw.io.create_clean_dir(path, force=force)
    assert tree(tmp_path) == {"data/proj/train.csv": b"x,y\n",
                              "data/proj/ckpt-1.index": b"c",
                              "work/other/ckpt-1.index": b"c"}
    # '..' resolved first: 'work/other/..' is 'work', which holds a link: its own
    # entry, never followed, and not Fenwicks' (no force)
    with pytest.raises(ValueError, match=rf"holds '{tmp_path}/work/other/ckpt-1.index'"
                                         r"|holds '.*/work/proj'"):
        fw.io.create_clean_dir(f"{tmp_path}/work/other/../")
    assert (tmp_path / "data/proj/train.csv").read_bytes() == b"x,y\n"


@pytest.mark.parametrize("root", ["/", "~", "HOME"])
def test_a_fenwicks_root_of_slash_or_home_is_refused_when_read(root, monkeypatch, tmp_path,
                                                              accelerator):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "id_ed25519").write_bytes(b"secret")
    value = str(tmp_path) if root == "HOME" else root
    monkeypatch.setenv("FENWICKS_ROOT", value)
    name = "the root of the file system" if root == "/" else "the home folder"
    with pytest.raises(ValueError, match=rf"FENWICKS_ROOT='{value}' is {name}; Fenwicks "
                                         r"keeps every project's data and work folders .*"
                                         r"must be a folder of its own"):
        fw.io.get_project_dirs(None, "p")
    # and a clean of ~/.ssh, whatever the root, finds a file Fenwicks did not write
    with pytest.raises(ValueError, match=r"holds '.*/\.ssh/id_ed25519', which Fenwicks did "
                                         "not write"):
        fw.io.create_clean_dir(str(tmp_path / ".ssh"))
    assert (tmp_path / ".ssh" / "id_ed25519").read_bytes() == b"secret"
    assert os.listdir(tmp_path) == [".ssh"]


# --------------------------------------------------------------------------- gfile ops


def test_exists_glob_listdir_copy(tmp_path):
    make_tree(tmp_path, {"src/a.txt": b"alpha", "src/sub/b.bin": b"\x00\x01", "x.txt": b"x"})
    src = str(tmp_path / "src")
    assert fw.io.exists(src) and not fw.io.exists(str(tmp_path / "nope"))
    assert fw.io.glob(str(tmp_path / "*.txt")) == [str(tmp_path / "x.txt")]
    assert fw.io.listdir(src) == ["a.txt", "sub"]
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        fw.io.listdir(str(tmp_path / "x.txt"))
    copied = fw.io.copy(src, str(tmp_path / "dst"))
    assert copied == [str(tmp_path / "dst/a.txt"), str(tmp_path / "dst/sub/b.bin")]
    assert tree(tmp_path / "dst") == tree(tmp_path / "src")
    (tmp_path / "src/a.txt").write_bytes(b"changed")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        fw.io.copy(src, str(tmp_path / "dst"))
    assert (tmp_path / "dst/a.txt").read_bytes() == b"alpha"  # a refused copy wrote nothing
    fw.io.copy(src, str(tmp_path / "dst"), overwrite=True)
    assert (tmp_path / "dst/a.txt").read_bytes() == b"changed"
    with pytest.raises(FileNotFoundError, match="src="):
        fw.io.copy(str(tmp_path / "missing"), str(tmp_path / "d2"))


# --------------------------------------------------------------------------- transfers


def test_upload_download_local_are_idempotent_and_checksum_based(tmp_path):
    files = {"a.txt": b"alpha", "sub/b.bin": bytes(range(256)) * 40, "sub/deep/c": b""}
    make_tree(tmp_path / "data", files)
    sent = fw.io.upload(str(tmp_path / "data"), str(tmp_path / "remote"), progress=False)
    assert sent == sorted(str(tmp_path / "remote/data" / name) for name in files)
    assert fw.io.upload(str(tmp_path / "data"), str(tmp_path / "remote")) == []
    # Same size, different bytes: only a checksum tells them apart.
    (tmp_path / "data/a.txt").write_bytes(b"ALPHA")
    assert fw.io.upload(str(tmp_path / "data"), str(tmp_path / "remote"), progress=False) == [
        str(tmp_path / "remote/data/a.txt")]
    got = fw.io.download(str(tmp_path / "remote/data"), str(tmp_path / "back"), progress=False)
    assert len(got) == 3
    assert tree(tmp_path / "back/data") == {**files, "a.txt": b"ALPHA"}
    assert fw.io.download(str(tmp_path / "remote/data"), str(tmp_path / "back")) == []
    single = fw.io.upload(str(tmp_path / "data/a.txt"), str(tmp_path / "one"), progress=False)
    assert single == [str(tmp_path / "one/a.txt")]


def test_local_checksum_matches_gcs_spelling(tmp_path):
    import base64

    import google_crc32c

    content = b"The quick brown fox jumps over the lazy dog"
    (tmp_path / "f").write_bytes(content)
    md5 = base64.b64encode(hashlib.md5(content).digest()).decode()
    assert fw.io.local_checksum(str(tmp_path / "f"), "md5Hash") == md5
    crc = google_crc32c.value(content).to_bytes(4, "big")  # GCS: big-endian, base64
    assert fw.io.local_checksum(str(tmp_path / "f"), "crc32c") == base64.b64encode(
        crc).decode()
    assert crc.hex() == "22620404"  # CRC-32C of this sentence (published check value)


def test_transfer_bad_input(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(ValueError, match="local_path='gs://b/x' is on GCS"):
        fw.io.upload("gs://b/x", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="missing"):
        fw.io.upload(str(tmp_path / "missing"), str(tmp_path / "out"))
    with pytest.raises(ValueError, match="workers=0"):
        fw.io.upload(str(tmp_path / "f"), str(tmp_path / "out"), workers=0)
    with pytest.raises(ValueError, match="local_dir='gs://b/d' is on GCS"):
        fw.io.download(str(tmp_path / "f"), "gs://b/d")
    with pytest.raises(ValueError, match="remote_dir="):
        fw.io.upload(str(tmp_path / "f"), "")
    assert not (tmp_path / "out").exists()


def test_stage_is_a_no_op_off_remote_tpus(tmp_path, accelerator):
    (tmp_path / "d.tfrec").write_bytes(b"r")
    assert fw.io.stage(str(tmp_path / "d.tfrec"), "p") == str(tmp_path / "d.tfrec")
    assert fw.io.stage("gs://b/data/d.tfrec", "p") == "gs://b/data/d.tfrec"
    with pytest.raises(FileNotFoundError, match="local_path="):
        fw.io.stage(str(tmp_path / "missing"), "p")


# --------------------------------------------------------------------------- no credentials


def test_gs_without_credentials_fails_fast_and_import_is_quiet(tmp_path):
    """A machine with no Google credentials (the real google.auth lookup, no mocks): every
    gs:// entry point fails at once with what to do. Also: importing fenwicks pulls in
    none of gcsfs, Colab or Kaggle."""
    env = {"HOME": str(tmp_path), "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
           "GOOGLE_APPLICATION_CREDENTIALS": "", "STORAGE_EMULATOR_HOST": "",
           # A CI runner on GCE would otherwise get its VM's service account.
           "NO_GCE_CHECK": "true"}
    (tmp_path / "f").write_bytes(b"x")
    out = run_json(f"""
        import json, sys, time
        import fenwicks as fw
        quiet = [m for m in ("gcsfs", "google.colab", "kaggle_secrets") if m in sys.modules]
        results = {{}}
        calls = {{
            "exists": lambda: fw.io.exists("gs://some-bucket/x"),
            "upload": lambda: fw.io.upload({str(tmp_path / "f")!r}, "gs://some-bucket/d"),
            "download": lambda: fw.io.download("gs://some-bucket/d", {str(tmp_path)!r}),
            "dirs": lambda: fw.io.get_project_dirs("gs://some-bucket", "p"),
            "clean": lambda: fw.io.create_clean_dir("gs://some-bucket/run"),
        }}
        for name, call in calls.items():
            start = time.monotonic()
            try:
                call()
                results[name] = ["no error", 0]
            except fw.gcs.GCSCredentialsError as err:
                results[name] = [str(err), time.monotonic() - start]
        print(json.dumps(dict(quiet=quiet, results=results)))
    """, env=env, timeout=120)
    assert out["quiet"] == []
    for name, (message, seconds) in out["results"].items():
        assert "gs://some-bucket" in message, name
        assert "fw.gcs.setup()" in message and "gcloud auth application-default login" in message
        assert seconds < 10, (name, seconds)


# --------------------------------------------------------------------------- real GCS server


def test_gcs_round_trip_against_emulator(gcs_emulator, tmp_path):
    """fw.io through its normal code path (gcsfs for transfers, tf.io.gfile for the rest)
    against a real GCS server: upload, idempotent re-upload, byte-exact download, the
    gfile ops, prefix-safe create_clean_dir, project dirs and staging for a remote TPU."""
    # Trailing CR / LF bytes: a multipart upload once lost them at the emulator.
    files = {"a.txt": b"alpha", "sub/b.bin": os.urandom(300_000), "sub/deep/c.npy": b"c" * 7,
             "cr": b"x\r", "lf": b"y\n", "crlf": b"z\r\n", "empty": b""}
    make_tree(tmp_path / "up/data", files)
    base = gcs_emulator.unique_url("io")
    out = gcs_emulator.run_json(f"""
        import json
        import fenwicks as fw
        from fenwicks.accel import Accelerator

        base, up, back = {base!r}, {str(tmp_path / "up/data")!r}, {str(tmp_path / "back")!r}
        r = dict(first=fw.io.upload(up, base), again=fw.io.upload(up, base))
        open(up + "/a.txt", "wb").write(b"ALPHA")   # same size, new bytes
        r["changed"] = fw.io.upload(up, base, progress=False)
        r["down"] = fw.io.download(base + "/data", back)
        r["down_again"] = fw.io.download(base + "/data", back)
        r["exists"] = [fw.io.exists(base + "/data/a.txt"), fw.io.exists(base + "/nope")]
        r["glob"] = fw.io.glob(base + "/data/*")
        r["listdir"] = fw.io.listdir(base + "/data/sub")
        for name in ("run/x", "run2/y", "run.txt"):
            fw.io.copy(up + "/a.txt", base + "/" + name)
        # Prefix safety: run2/ and run.txt share the prefix. 'x' is a user's object, so
        # this clean needs force (the refusal: test_create_clean_dir_on_gcs_deletes_only_...).
        fw.io.create_clean_dir(base + "/run", force=True)
        r["after_clean"] = fw.io.glob(base + "/run*") + fw.io.glob(base + "/run*/*")
        r["dirs"] = fw.io.get_project_dirs(base, "proj")
        r["dirs_exist"] = [fw.io.exists(d) for d in r["dirs"]]
        fw.accel._current = Accelerator("tpu", 8, "bfloat16", is_remote=True)
        r["staged"] = fw.io.stage(up + "/sub/b.bin", "staged", root_dir=base)
        r["staged_exists"] = fw.io.exists(r["staged"])
        # data/staged/ holds TensorFlow's folder marker object: not a file to fetch.
        r["staged_down"] = fw.io.download(base + "/data/staged", back, progress=False)
        print(json.dumps(r))
    """)
    expected = sorted(f"{base}/data/{name}" for name in files)
    assert out["first"] == expected
    assert out["again"] == []
    assert out["changed"] == [f"{base}/data/a.txt"]
    assert out["down"] == sorted(str(tmp_path / "back/data" / name) for name in files)
    assert out["down_again"] == []
    assert tree(tmp_path / "back/data") == {**files, "a.txt": b"ALPHA"}
    assert out["exists"] == [True, False]
    assert out["glob"] == sorted(f"{base}/data/{name}" for name in
                                 ("a.txt", "sub", "cr", "lf", "crlf", "empty"))
    assert out["listdir"] == ["b.bin", "deep"]
    assert out["after_clean"] == [f"{base}/run", f"{base}/run.txt", f"{base}/run2",
                                  f"{base}/run2/y"]
    assert out["dirs"] == [f"{base}/data/proj", f"{base}/work/proj"]
    assert out["dirs_exist"] == [True, True]
    assert out["staged"] == f"{base}/data/staged/b.bin"
    assert out["staged_exists"] is True
    assert out["staged_down"] == [str(tmp_path / "back/staged/b.bin")]
    assert (tmp_path / "back/staged/b.bin").read_bytes() == files["sub/b.bin"]


# --------------------------------------------------------------------------- deadlines


@pytest.fixture
def deadline(monkeypatch):
    """fenwicks._deadline with a 0.5 s operation deadline and no outage on record."""
    from fenwicks import _deadline

    monkeypatch.setenv(_deadline.DEADLINE_ENV, "0.5")
    _deadline.reset_for_tests(join_secs=0)  # no outage or abandoned call on record
    yield _deadline
    _deadline.reset_for_tests(join_secs=0)


def test_a_gs_call_past_its_deadline_raises_naming_the_path(deadline):
    import threading
    import time

    release = threading.Event()
    start = time.monotonic()
    with pytest.raises(deadline.StorageTimeoutError,
                       match=r"checkpoint save of gs://b/w/ckpt-2 got no answer .* 0.5 s \(FEN"):
        deadline.run(release.wait, 30, what="checkpoint save", path="gs://b/w/ckpt-2")
    assert time.monotonic() - start < 5  # the 0.5 s deadline, not the 30 s call
    assert isinstance(deadline.StorageTimeoutError("x"), OSError)
    assert deadline.in_outage()
    # Clean-up is skipped while storage is down; a later call first waits for the
    # abandoned one, so two writes never overlap.
    assert deadline.run(lambda: 1 / 0, what="cleanup", path="gs://b/w",
                        best_effort=True) is None
    release.set()
    assert deadline.run(lambda: 7, what="read", path="gs://b/w") == 7
    assert not deadline.in_outage() and deadline.abandoned_calls() == []


def test_local_calls_and_errors_pass_through(deadline):
    import threading

    assert deadline.run(threading.get_ident, what="x", path="/tmp/a") == threading.get_ident()
    assert deadline.run(threading.get_ident, what="x", path="gs://b/a") != threading.get_ident()
    with pytest.raises(ZeroDivisionError):
        deadline.run(lambda: 1 / 0, what="x", path="gs://b/a")
    assert not deadline.in_outage()  # not a storage error


def test_tensorflow_settings_are_defaults_the_user_can_override(deadline, monkeypatch):
    for name in deadline.tensorflow_settings():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GCS_RETRY_CONFIG_MAX_RETRIES", "3")
    monkeypatch.setenv(deadline.REQUEST_TIMEOUT_ENV, "7")
    assert deadline.configure_tensorflow() is False  # TensorFlow is imported already
    assert os.environ["GCS_RETRY_CONFIG_MAX_RETRIES"] == "3"
    assert os.environ["GCS_REQUEST_IDLE_TIMEOUT_SECS"] == "7"
    assert os.environ["GCS_RETRY_CONFIG_MAX_DELAY_TIME_US"] == "16000000"
    monkeypatch.setenv(deadline.DEADLINE_ENV, "soon")
    with pytest.raises(ValueError, match="FENWICKS_GCS_DEADLINE='soon' must be a positive"):
        deadline.deadline_secs()


@pytest.mark.slow  # a fresh interpreter importing TensorFlow: ~20 s on a busy machine
def test_import_sets_tensorflow_gcs_settings_before_tensorflow():
    names = ["GCS_RETRY_CONFIG_MAX_RETRIES", "GCS_REQUEST_IDLE_TIMEOUT_SECS",
             "GCS_REQUEST_CONNECTION_TIMEOUT_SECS"]
    code = ("import json, os, sys\n"
            f"for n in {names!r}: os.environ.pop(n, None)\n"
            "import fenwicks\n"
            f"print(json.dumps([os.environ.get(n) for n in {names!r}]))")
    assert run_json(code, fresh=True) == ["6", "20", "20"]  # a new interpreter


# ------------------------------------------------------------------------ upload_to_gcs


def test_upload_to_gcs_copies_once_to_the_full_path(tmp_path):
    local = tmp_path / "train.tfrec"
    local.write_bytes(b"records")
    bucket = tmp_path / "bucket" / "data"
    assert fw.io.upload_to_gcs(str(local), str(bucket / "train.tfrec")) == [
        str(bucket / "train.tfrec")]
    assert (bucket / "train.tfrec").read_bytes() == b"records"
    local.write_bytes(b"newer")
    assert fw.io.upload_to_gcs(str(local), str(bucket / "train.tfrec")) == []  # skipped
    assert (bucket / "train.tfrec").read_bytes() == b"records"
    fw.io.upload_to_gcs(str(local), str(bucket / "renamed.tfrec"))  # another file name
    assert (bucket / "renamed.tfrec").read_bytes() == b"newer"


@pytest.mark.slow  # ~19 s: a subprocess in the emulator's namespace
def test_upload_to_gcs_against_emulator(gcs_emulator, tmp_path):
    """The original call `upload_to_gcs(local_fn, gs_fn)` on a real GCS server."""
    (tmp_path / "train.tfrec").write_bytes(b"records\n")
    target = gcs_emulator.unique_url("compat") + "/data/train.tfrec"
    out = gcs_emulator.run_json(f"""
        import json
        import tensorflow as tf
        import fenwicks as fw

        first = fw.io.upload_to_gcs({str(tmp_path / "train.tfrec")!r}, {target!r})
        again = fw.io.upload_to_gcs({str(tmp_path / "train.tfrec")!r}, {target!r})
        data = tf.io.gfile.GFile({target!r}, "rb").read().decode()
        print(json.dumps(dict(first=first, again=again, data=data)))
    """)
    assert out == {"first": [target], "again": [], "data": "records\n"}


def gcs_clean(root: str) -> dict:
    """create_clean_dir on gs:// (run inside the emulator's namespace): a run's own
    objects go without force; a folder with a user's object is refused, that object
    kept; a sibling sharing the prefix survives."""
    import tensorflow as tf

    def put(path: str, data: bytes = b"x") -> None:
        with tf.io.gfile.GFile(path, "wb") as f:
            f.write(data)

    work, out = f"{root}/work/run", {}
    for name in ("checkpoint", "ckpt-2.index", "fenwicks_input.json",
                 "train/events.out.tfevents.1.vm.1.0.v2", "orbax/2/_CHECKPOINT_METADATA"):
        put(f"{work}/{name}")
    put(f"{work}/notes/train.csv", b"id,label\n")
    put(f"{root}/work/run2/keep.txt", b"sibling")
    try:
        fw.io.create_clean_dir(work)
    except ValueError as err:
        out["refused"] = str(err)
    out["after_refusal"] = sorted(
        f"{r[len(work):].strip('/')}/{f}".lstrip("/") for r, _, files in tf.io.gfile.walk(work)
        for f in files)
    tf.io.gfile.remove(f"{work}/notes/train.csv")  # the user moves it away
    out["cleaned"] = fw.io.create_clean_dir(work)
    out["left"] = [f for _, _, files in tf.io.gfile.walk(work) for f in files]
    with tf.io.gfile.GFile(f"{root}/work/run2/keep.txt", "rb") as f:
        out["sibling"] = f.read().decode()
    return out


def test_create_clean_dir_on_gcs_deletes_only_fenwicks_objects(gcs_emulator):
    root = gcs_emulator.unique_url("clean")
    work = f"{root}/work/run"
    out = gcs_emulator.run_json("import json\nfrom tests.test_io import gcs_clean\n"
                                f"print(json.dumps(gcs_clean({root!r})))")
    assert out["refused"].startswith(
        f"path='{work}' holds '{work}/notes/train.csv', which Fenwicks did not write; "
        "create_clean_dir deletes only Fenwicks' own files")
    assert len(out["after_refusal"]) == 6 and "notes/train.csv" in out["after_refusal"]
    assert out["cleaned"] == work and out["left"] == [] and out["sibling"] == "sibling"
