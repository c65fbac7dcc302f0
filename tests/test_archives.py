"""fenwicks.archives through fw.io.unzip: zip, tar and 7z unpacked member by member, and
every unsafe archive (paths outside dest_dir, links, more bytes than max_bytes or the disk
has) refused by name before anything is written."""

from __future__ import annotations

import logging
import os
import zipfile

import numpy as np
import pytest

import fenwicks as fw
from fenwicks import archives


def _zip(path, members: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return str(path)


def _tar(path, members: dict[str, bytes], symlink: str | None = None) -> str:
    import io as io_lib
    import tarfile

    with tarfile.open(path, "w:gz") as tf_archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf_archive.addfile(info, io_lib.BytesIO(data))
        if symlink:
            info = tarfile.TarInfo(symlink)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tf_archive.addfile(info)
    return str(path)


def test_unzip_unpacks_zip_and_tar_lists(tmp_path):
    a = _zip(tmp_path / "train.zip", {"train/1.png": b"one", "train/sub/2.png": b"two"})
    b = _tar(tmp_path / "test.tar.gz", {"test/3.png": b"three"})
    dest = tmp_path / "data"
    written = fw.io.unzip([a, b], str(dest))
    assert written == sorted(str(dest / p) for p in ("train/1.png", "train/sub/2.png",
                                                     "test/3.png"))
    assert (dest / "train/sub/2.png").read_bytes() == b"two"
    assert (dest / "test/3.png").read_bytes() == b"three"
    assert fw.io.unzip(a, str(dest)) == []  # dest_dir exists: left alone, as the original
    (dest / "train/1.png").write_bytes(b"changed")
    fw.io.unzip(a, str(dest), overwrite=True)
    assert (dest / "train/1.png").read_bytes() == b"one"


@pytest.mark.parametrize("name", ["../escape.txt", "/tmp/abs-escape.txt", "a/../../up.txt"])
def test_unzip_refuses_members_outside_dest_dir(tmp_path, name):
    dest = tmp_path / "deep" / "dest"
    for archive in (_zip(tmp_path / "bad.zip", {"ok.txt": b"ok", name: b"evil"}),
                    _tar(tmp_path / "bad.tar.gz", {"ok.txt": b"ok", name: b"evil"})):
        with pytest.raises(ValueError, match="outside dest_dir"):
            fw.io.unzip(archive, str(dest), overwrite=True)
    assert not (dest / "ok.txt").exists()  # checked before anything is written
    assert not any(p.name in ("escape.txt", "up.txt") for p in tmp_path.rglob("*"))


def test_unzip_refuses_links_and_unknown_types(tmp_path):
    archive = _tar(tmp_path / "link.tar.gz", {"ok.txt": b"ok"}, symlink="passwd")
    with pytest.raises(ValueError, match="link"):
        fw.io.unzip(archive, str(tmp_path / "d"))
    (tmp_path / "x.rar").write_bytes(b"Rar!")
    with pytest.raises(ValueError, match="unknown archive type"):
        fw.io.unzip(str(tmp_path / "x.rar"), str(tmp_path / "e"))


def test_unzip_unpacks_7z(tmp_path):
    import py7zr  # a test dependency (setup.py, extra "test"): never skipped

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "1.png").write_bytes(b"png-bytes")
    with py7zr.SevenZipFile(tmp_path / "train.7z", "w") as archive:
        archive.write(tmp_path / "src" / "1.png", "train/1.png")
    written = fw.io.unzip([str(tmp_path / "train.7z")], str(tmp_path / "data"))
    assert written == [str(tmp_path / "data" / "train" / "1.png")]
    assert (tmp_path / "data" / "train" / "1.png").read_bytes() == b"png-bytes"
    with py7zr.SevenZipFile(tmp_path / "bad.7z", "w") as archive:
        archive.write(tmp_path / "src" / "1.png", "../escape.png")
    with pytest.raises(ValueError, match="outside dest_dir"):
        fw.io.unzip(str(tmp_path / "bad.7z"), str(tmp_path / "d2"))
    assert not (tmp_path / "escape.png").exists()




# ------------------------------------------------------------------------- size limits


def test_a_zip_of_zeros_over_max_bytes_is_refused_by_name_before_writing(tmp_path):
    # 300,000 zero bytes deflate to well under 1 kB: a small zip bomb
    bomb = _zip(tmp_path / "zeros.zip", {"a.bin": bytes(200_000), "b.bin": bytes(100_000)})
    assert (tmp_path / "zeros.zip").stat().st_size < 2_000
    dest = tmp_path / "out"
    with pytest.raises(ValueError) as refused:
        fw.io.unzip(bomb, str(dest), max_bytes=250_000)
    message = str(refused.value)
    assert bomb in message and "300,000 bytes (293.0 KiB)" in message  # 300000 / 1024
    assert "in 2 member(s)" in message and "max_bytes=250000 (244.1 KiB)" in message
    assert "Nothing was written" in message and not dest.exists()
    # the limit is inclusive: exactly 300,000 bytes unpack
    written = fw.io.unzip(bomb, str(dest), max_bytes=300_000)
    assert [p.rsplit("/", 1)[-1] for p in written] == ["a.bin", "b.bin"]
    assert (dest / "a.bin").read_bytes() == bytes(200_000)


def test_the_limit_counts_every_archive_of_the_call_together(tmp_path):
    first = _zip(tmp_path / "one.zip", {"one.bin": bytes(6_000)})
    second = _tar(tmp_path / "two.tar.gz", {"two.bin": bytes(5_000)})
    dest = tmp_path / "out"
    with pytest.raises(ValueError, match=r"two\.tar\.gz unpacks to 5,000 bytes .* after "
                                         r"6,000 bytes .* max_bytes=10000"):
        fw.io.unzip([first, second], str(dest), max_bytes=10_000)
    assert not dest.exists()  # not even the first archive, which fits on its own
    assert len(fw.io.unzip([first, second], str(dest), max_bytes=None)) == 2


def test_the_default_limit_is_20_gib_and_bad_limits_are_named(tmp_path):
    import inspect

    default = inspect.signature(fw.io.unzip).parameters["max_bytes"].default
    assert default == archives.DEFAULT_MAX_BYTES == 21_474_836_480  # 20 * 1024 ** 3
    archive = _zip(tmp_path / "small.zip", {"x.bin": bytes(2_048)})
    for bad in (0, -5, 1.5, "1GB", True):
        with pytest.raises(ValueError, match=f"max_bytes={bad!r} must be a positive"):
            fw.io.unzip(archive, str(tmp_path / "e"), max_bytes=bad)
    assert not (tmp_path / "e").exists()


def test_more_than_the_disk_has_free_is_refused_before_writing(tmp_path, monkeypatch):
    archive = _zip(tmp_path / "big.zip", {"x.bin": bytes(4_096)})
    usage = archives.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(archives.shutil, "disk_usage",
                        lambda path: usage._replace(free=4_095))
    with pytest.raises(OSError, match=r"4,096 bytes .* has 4,095 bytes .* free"):
        fw.io.unzip(archive, str(tmp_path / "deep" / "out"))
    assert not (tmp_path / "deep").exists()


# ------------------------------------------------------------- damaged archives, odd names


def _damage(path: str, member: str) -> None:
    """Flips bytes in the middle of `member`'s compressed data (its local header is
    30 bytes plus the name and extra field, zipfile's layout)."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_length, extra_length = int.from_bytes(f.read(2), "little"), \
            int.from_bytes(f.read(2), "little")
        start = info.header_offset + 30 + name_length + extra_length
        f.seek(start + info.compress_size // 2)
        f.write(b"\xff" * 8)


def _listing(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_damaged_member_is_named_leaves_nothing_and_unpacks_again_when_fixed(tmp_path):
    good = {"first.csv": b"a,b\n" * 500, "second.csv": bytes(range(256)) * 40}
    archive = _zip(tmp_path / "train.zip", good)
    _damage(archive, "second.csv")
    dest = tmp_path / "out" / "data"  # its parent does not exist either
    before = _listing(tmp_path)
    for _ in range(2):  # was: a half-unpacked folder, then [] from the second call
        with pytest.raises(archives.DamagedArchiveError,
                           match=rf"^{archive}: member 'second.csv' is damaged \(.*\); "
                                 r"nothing was unpacked\. Download or copy the archive "
                                 r"again$"):
            fw.io.unzip(archive, str(dest))
        assert _listing(tmp_path) == before  # no dest, no parent, no temporary folder
    _zip(tmp_path / "train.zip", good)  # downloaded again
    assert fw.io.unzip(archive, str(dest)) == [str(dest / "first.csv"),
                                               str(dest / "second.csv")]
    assert (dest / "second.csv").read_bytes() == bytes(range(256)) * 40


def test_a_failed_overwrite_leaves_what_dest_dir_had(tmp_path):
    dest = tmp_path / "data"
    (dest / "mine").mkdir(parents=True)
    (dest / "first.csv").write_bytes(b"old")
    (dest / "mine" / "notes.txt").write_bytes(b"keep")
    archive = _zip(tmp_path / "train.zip", {"first.csv": b"new" * 300,
                                            "second.csv": b"x" * 5000})
    _damage(archive, "second.csv")
    with pytest.raises(archives.DamagedArchiveError, match="member 'second.csv'"):
        fw.io.unzip(archive, str(dest), overwrite=True)
    assert _listing(tmp_path) == ["data", "data/first.csv", "data/mine",
                                  "data/mine/notes.txt", "train.zip"]
    assert (dest / "first.csv").read_bytes() == b"old"
    fine = _zip(tmp_path / "fine.zip", {"first.csv": b"new", "sub/third.csv": b"3"})
    assert fw.io.unzip(fine, str(dest), overwrite=True) == [
        str(dest / "first.csv"), str(dest / "sub/third.csv")]
    assert (dest / "first.csv").read_bytes() == b"new"  # replaced, as overwrite says
    assert (dest / "mine" / "notes.txt").read_bytes() == b"keep"  # never removed
    clash = _zip(tmp_path / "clash.zip", {"mine": b"a file where dest_dir has a folder"})
    with pytest.raises(ValueError, match=rf"^{clash}: member 'mine' would replace a folder "
                                         r"that dest_dir already has, .*; nothing was "
                                         r"unpacked\. Move it away or unpack elsewhere$"):
        fw.io.unzip(clash, str(dest), overwrite=True)
    assert (dest / "mine" / "notes.txt").read_bytes() == b"keep"


def test_a_file_and_a_folder_of_one_name_are_refused_before_writing(tmp_path):
    archive = _zip(tmp_path / "a.zip", {"data": b"1", "data/x.csv": b"2"})
    with pytest.raises(ValueError, match=rf"^{archive}: member 'data' is a file, but member "
                                         r"'data/x.csv' needs a folder of that name; "
                                         r"nothing was written\. Repack the archive"):
        fw.io.unzip(archive, str(tmp_path / "out"))
    assert _listing(tmp_path) == ["a.zip"]


@pytest.mark.parametrize("name, says", [
    ("", "has no file name (it names dest_dir itself)"),
    (".", "has no file name (it names dest_dir itself)"),
    ("x" * 300, "has a name part of 300 bytes, and files and folders here take at most 255"),
])
def test_a_member_no_file_can_be_named_after_is_refused_by_name(tmp_path, name, says):
    path = tmp_path / "odd.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("ok.csv", b"ok")
        zf.writestr(zipfile.ZipInfo(name), b"data")
    with pytest.raises(ValueError) as refused:
        fw.io.unzip(str(path), str(tmp_path / "out"))
    message = str(refused.value)
    assert message.startswith(f"{path}: member {name[:60]!r}") and says in message, message
    assert "nothing was written. Repack the archive" in message, message
    assert _listing(tmp_path) == ["odd.zip"]


def _cut(path, keep: float = 0.5) -> str:
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:int(len(data) * keep)])
    return str(path)


def _tar_mode(path, mode: str, members: dict[str, bytes]) -> str:
    import io as io_lib
    import tarfile

    with tarfile.open(path, mode) as tf_archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf_archive.addfile(info, io_lib.BytesIO(data))
    return str(path)


@pytest.mark.parametrize("name, mode, after", [
    ("cut.tar.gz", "w:gz", "in or after member 'b.bin'"),
    ("cut.tar.xz", "w:xz", "in or after member 'b.bin'"),
    ("cut.tar", "w", "in or after member 'b.bin'"),
    # bzip2 blocks are 900 kB: half the file holds no whole block, so no member at all
    ("cut.tar.bz2", "w:bz2", "before any member could be read"),
])
def test_a_cut_archive_is_named_with_its_last_member_and_nothing_is_written(
        tmp_path, name, mode, after):
    """`unzip([good.zip, cut.tar.*])` gave a bare EOFError, or for .tar.bz2 "not a gzip
    file" (the last format `r:*` tried); now one sentence naming the archive."""
    rng = np.random.default_rng(0)
    members = {n: rng.bytes(300_000) for n in ("a.bin", "b.bin", "c.bin")}
    good = _zip(tmp_path / "good.zip", {"g.txt": b"good"})
    cut = _cut(_tar_mode(tmp_path / name, mode, members))
    with pytest.raises(archives.DamagedArchiveError, match=(
            rf"^{cut}: the archive is cut short or damaged {after} \((EOFError|ReadError): "
            r".*\); nothing was unpacked from it or the other archives of the call\. "
            "Download or copy it again$")) as caught:
        fw.io.unzip([good, cut], str(tmp_path / "data"))
    assert "gzip" not in str(caught.value) or mode == "w:gz"
    assert not (tmp_path / "data").exists()
    assert sorted(os.listdir(tmp_path)) == sorted(["good.zip", name])  # no staging left


def test_a_cut_zip_and_a_mislabeled_tar_are_named_or_read_as_what_they_are(tmp_path):
    cut = _cut(_zip(tmp_path / "cut.zip", {"a.txt": b"a" * 1000, "b.txt": b"b" * 1000}))
    with pytest.raises(archives.DamagedArchiveError, match=(
            rf"{cut}: the archive is cut short or damaged before any member could be read "
            r"\(BadZipFile: File is not a zip file \(its member list, at the end of a zip, "
            r"is missing: cut short\?\)\)")):
        fw.io.unzip(cut, str(tmp_path / "d1"))
    # a gzip tarball named .tar.bz2: opened as what it is
    wrong = _tar_mode(tmp_path / "x.tar.bz2", "w:gz", {"x.txt": b"x"})
    assert fw.io.unzip(wrong, str(tmp_path / "d2")) == [str(tmp_path / "d2" / "x.txt")]


def test_unzip_into_a_folder_holding_files_says_what_it_skipped(tmp_path, caplog):
    archive = _zip(tmp_path / "test.zip", {"test/1.png": b"one"})
    dest = tmp_path / "data"
    dest.mkdir()
    (dest / "train.csv").write_bytes(b"mine")
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        assert fw.io.unzip(archive, str(dest)) == []
    assert [r.getMessage() for r in caplog.records] == [
        f"fenwicks: unzip skipped {archive}: dest_dir='{dest}' already holds 1 entry (e.g. "
        "'train.csv'), so nothing was unpacked. Pass overwrite=True to unpack into it "
        "(files of the same names are replaced, others kept), or a new dest_dir"]
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == {"train.csv": b"mine"}
    empty = tmp_path / "empty"
    empty.mkdir()  # an empty folder is unpacked into
    assert fw.io.unzip(archive, str(empty)) == [str(empty / "test" / "1.png")]
