"""Unpacking archives safely: `unzip`, the original Fenwicks call (``fw.io.unzip``).

An archive comes from elsewhere (a competition download, a URL), so nothing is written
until every member of every archive in the call has been checked:

* its path stays inside ``dest_dir`` (no ``../x``, no ``/etc/x``: "zip slip");
* it is a regular file or a folder: links and device files are refused;
* the uncompressed sizes add up to at most ``max_bytes`` (`DEFAULT_MAX_BYTES`) and fit
  on the destination's disk. A 200 kB zip of zeros can hold 200 MB ("zip bomb"); an
  archive that would fill the disk is refused by name instead of failing half-written.

The sizes checked are those the archive declares, and they bound what is written:
`zipfile` and `tarfile` read exactly a member's declared size (zipfile fails on the
checksum when the data runs on), and py7zr writes each file's declared size.

A leaf module: the standard library only (py7zr for ``.7z``, imported when needed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import numbers
import os
import shutil
from collections.abc import Callable
from typing import Any, BinaryIO

# Kaggle's whole working disk (/kaggle/working) is 20 GiB; a bigger real archive is
# unpacked with max_bytes= raised (or None) by someone who knows its size.
DEFAULT_MAX_BYTES = 20 * 2**30
_TAR_ENDINGS = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")


def unzip(fn: str | os.PathLike | list[str | os.PathLike], dest_dir: str = ".",
          overwrite: bool = False, *, max_bytes: int | None = DEFAULT_MAX_BYTES) -> list[str]:
    """Unpacks ``.zip``, ``.tar``, ``.tar.gz``/``.tgz``, ``.tar.bz2``, ``.tar.xz`` or
    ``.7z`` archives (one path or a list) into ``dest_dir``.

    Only regular files and folders are unpacked. Before anything is written, every
    member of every archive is checked: a path that would leave ``dest_dir`` (``../x``,
    ``/etc/x``), a link, a device file, or more than ``max_bytes`` unpacked in all is an
    error naming the archive. ``.7z`` needs ``pip install py7zr``.

    Args:
        fn: archive path, or a list of them.
        dest_dir: where to unpack. Defaults to ``'.'``.
        overwrite: unpack even if ``dest_dir`` exists (replacing files). Defaults to
            False: an existing ``dest_dir`` is left alone, as the original did.
        max_bytes: the most bytes the archives may unpack to, together. Defaults to
            `DEFAULT_MAX_BYTES` (20 GiB); None for no limit (the disk's free space still
            is one).

    Returns:
        The files written, sorted (empty if ``dest_dir`` existed).

    Raises:
        ValueError: an unknown archive type, an unsafe member, or more than
            ``max_bytes`` to unpack (each named).
        OSError: more to unpack than the disk under ``dest_dir`` has free.

    Example:
        >>> fw.io.unzip(['./train.7z', './test.7z'], './data')
        >>> fw.io.unzip('./imagenet.tar', './data', max_bytes=200 * 2**30)
    """
    archives = [fn] if isinstance(fn, (str, os.PathLike)) else list(fn)
    limit = _check_max_bytes(max_bytes)
    if os.path.exists(dest_dir) and not overwrite:
        return []
    dest = os.path.realpath(dest_dir)
    with contextlib.ExitStack() as stack:
        opened = [_open(os.fspath(archive), dest, stack) for archive in archives]
        _check_sizes(opened, dest, limit)
        written = [path for archive in opened for path in archive.extract()]
    return sorted(written)


@dataclasses.dataclass(frozen=True)
class _Member:
    """One member to unpack: its entry in the archive, where it goes, its size."""

    entry: Any  # the ZipInfo, TarInfo or py7zr FileInfo
    name: str
    target: str
    size: int
    is_dir: bool


@dataclasses.dataclass
class _Archive:
    """An open archive whose members were all checked, and how to write them."""

    path: str
    members: list[_Member]
    extract: Callable[[], list[str]]  # writes the members; returns the files written

    @property
    def size(self) -> int:
        return sum(m.size for m in self.members)


def _check_max_bytes(max_bytes: Any) -> int | None:
    if max_bytes is None:
        return None
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, numbers.Integral) \
            or max_bytes < 1:
        raise ValueError(f"max_bytes={max_bytes!r} must be a positive number of bytes, "
                         f"e.g. max_bytes={DEFAULT_MAX_BYTES} (20 GiB), or None for no limit")
    return int(max_bytes)


def _human(size: int) -> str:
    """``'293.0 KiB'``: a size in the largest binary unit it reaches."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def _readable(size: int) -> str:
    """``'300,000 bytes (293.0 KiB)'``: exact, and at a glance."""
    return f"{size:,} bytes" + (f" ({_human(size)})" if size >= 2**10 else "")


def _check_sizes(archives: list[_Archive], dest: str, limit: int | None) -> None:
    """Refuses, before any write, more than `limit` bytes or more than the disk has free."""
    total = 0
    for archive in archives:
        total += archive.size
        if limit is not None and total > limit:
            earlier = total - archive.size
            before = f", after {_readable(earlier)} from the archives before it" \
                if earlier else ""
            raise ValueError(
                f"{archive.path} unpacks to {_readable(archive.size)} in "
                f"{len(archive.members)} member(s){before}: over the limit, max_bytes="
                f"{limit} ({_human(limit)}). Nothing was written. If you trust this "
                "archive, pass a larger max_bytes (or max_bytes=None)")
    existing = dest
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    free = shutil.disk_usage(existing).free
    if total > free:
        raise OSError(f"{', '.join(a.path for a in archives)} unpack(s) to "
                      f"{_readable(total)}, but the disk under dest_dir={dest!r} has "
                      f"{_readable(free)} free. Nothing was written. Free some space or "
                      "unpack elsewhere")


def _target(dest: str, name: str, archive: str) -> str:
    target = os.path.realpath(os.path.join(dest, name))
    if os.path.isabs(name) or os.path.commonpath([dest, target]) != dest:
        raise ValueError(f"{archive}: member {name!r} would be written outside "
                         f"dest_dir={dest!r}; refusing to unpack this archive")
    return target


def _refuse_link(archive: str, name: str) -> None:
    raise ValueError(f"{archive}: member {name!r} is a link or special file; refusing "
                     "to unpack this archive")


def _write(target: str, source: BinaryIO) -> str:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as out:
        shutil.copyfileobj(source, out)
    return target


def _write_members(members: list[_Member], open_member: Callable[[Any], Any]) -> list[str]:
    written = []
    for member in members:
        if member.is_dir:
            os.makedirs(member.target, exist_ok=True)
            continue
        with open_member(member.entry) as source:
            written.append(_write(member.target, source))
    return written


def _open(archive: str, dest: str, stack: contextlib.ExitStack) -> _Archive:
    lower = archive.lower()
    if lower.endswith(".zip"):
        return _open_zip(archive, dest, stack)
    if lower.endswith(_TAR_ENDINGS):
        return _open_tar(archive, dest, stack)
    if lower.endswith(".7z"):
        return _open_7z(archive, dest, stack)
    raise ValueError(f"fn={archive!r}: unknown archive type; give a .zip, .tar(.gz/.bz2/.xz)"
                     " or .7z file")


def _open_zip(archive: str, dest: str, stack: contextlib.ExitStack) -> _Archive:
    import zipfile

    zf = stack.enter_context(zipfile.ZipFile(archive))
    members = []
    for info in zf.infolist():
        target = _target(dest, info.filename, archive)
        if (info.external_attr >> 16) & 0o170000 == 0o120000:  # a symlink's mode bits
            _refuse_link(archive, info.filename)
        members.append(_Member(info, info.filename, target, info.file_size, info.is_dir()))
    return _Archive(archive, members, lambda: _write_members(members, zf.open))


def _open_tar(archive: str, dest: str, stack: contextlib.ExitStack) -> _Archive:
    import tarfile

    tar = stack.enter_context(tarfile.open(archive))
    members = []
    for info in tar.getmembers():
        target = _target(dest, info.name, archive)
        if not (info.isfile() or info.isdir()):
            _refuse_link(archive, info.name)
        members.append(_Member(info, info.name, target, info.size if info.isfile() else 0,
                               info.isdir()))
    return _Archive(archive, members, lambda: _write_members(members, tar.extractfile))


def _open_7z(archive: str, dest: str, stack: contextlib.ExitStack) -> _Archive:
    try:
        import py7zr
    except ImportError as err:
        raise ImportError(f"fn={archive!r} is a .7z archive: pip install py7zr") from err
    sz = stack.enter_context(py7zr.SevenZipFile(archive))
    members = []
    for info in sz.list():
        target = _target(dest, info.filename, archive)
        if getattr(info, "is_symlink", False):  # py7zr < 1.0 has no is_symlink
            _refuse_link(archive, info.filename)
        members.append(_Member(info, info.filename, target, int(info.uncompressed or 0),
                               info.is_directory))

    def extract() -> list[str]:
        # Every name was checked above; py7zr then writes exactly those members.
        sz.extract(path=dest, targets=[m.name for m in members])
        return [m.target for m in members if not m.is_dir]

    return _Archive(archive, members, extract)
