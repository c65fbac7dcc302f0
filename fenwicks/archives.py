"""Unpacking archives safely: `unzip`, the original Fenwicks call (``fw.io.unzip``).

An archive comes from elsewhere (a competition download, a URL), so nothing is written
until every member of every archive in the call has been checked:

* its path stays inside ``dest_dir`` (no ``../x``, no ``/etc/x``: "zip slip");
* it is a regular file or a folder: links and device files are refused;
* the uncompressed sizes add up to at most ``max_bytes`` (`DEFAULT_MAX_BYTES`) and fit
  on the destination's disk. A 200 kB zip of zeros can hold 200 MB ("zip bomb"); an
  archive that would fill the disk is refused by name instead of failing half-written.

* it names a file (not ``''`` or ``'.'``), each part of its name fits the filesystem
  (255 bytes), and no member is a file where another needs a folder (``data`` and
  ``data/x.csv``).

The archives are unpacked into a temporary folder beside ``dest_dir`` (the same
filesystem) and moved into place only once every member is written: a damaged member
(``Error -3 while decompressing``) is named with its archive and leaves nothing behind,
so the same call unpacks again once the archive is replaced. Nothing that was in
``dest_dir`` before is removed; ``overwrite=True`` replaces the files of the same names.

The sizes checked are those the archive declares, and they bound what is written:
`zipfile` and `tarfile` read exactly a member's declared size (zipfile fails on the
checksum when the data runs on), and py7zr writes each file's declared size.

The standard library only (py7zr for ``.7z``, imported when needed), and Fenwicks' leaves
`fenwicks._removal` (its one way to delete) and `fenwicks._text`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import numbers
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from fenwicks import _removal
from fenwicks._text import first_line

logger = logging.getLogger("fenwicks")

# Kaggle's whole working disk (/kaggle/working) is 20 GiB; a bigger real archive is
# unpacked with max_bytes= raised (or None) by someone who knows its size.
DEFAULT_MAX_BYTES = 20 * 2**30
_TAR_ENDINGS = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
_NAME_MAX = 255  # bytes in one file or folder name on ext4, xfs, btrfs, tmpfs
_READ_CHUNK = 2**20


class DamagedArchiveError(ValueError):
    """A member's data cannot be read (cut short, altered); nothing was unpacked."""


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
        overwrite: unpack even if ``dest_dir`` holds files (replacing files of the same
            names). Defaults to False: a ``dest_dir`` holding anything is left alone, as
            the original did, with a warning naming what was skipped; an empty one is
            unpacked into.
        max_bytes: the most bytes the archives may unpack to, together. Defaults to
            `DEFAULT_MAX_BYTES` (20 GiB); None for no limit (the disk's free space still
            is one).

    Returns:
        The files written, sorted (empty if ``dest_dir`` held something).

    Raises:
        ValueError: an unknown archive type, an unsafe or unnamable member, or more
            than ``max_bytes`` to unpack (each named); `DamagedArchiveError` for a
            member whose data cannot be read, or an archive cut short or damaged (named,
            with the last member read before the damage). Nothing is left in
            ``dest_dir`` then.
        OSError: more to unpack than the disk under ``dest_dir`` has free.

    Examples:
        >>> import os, tempfile, zipfile
        >>> folder = tempfile.mkdtemp()
        >>> with zipfile.ZipFile(os.path.join(folder, 'train.zip'), 'w') as archive:
        ...     archive.writestr('train/cat.txt', 'a cat')
        >>> written = fw.io.unzip(os.path.join(folder, 'train.zip'), folder + '/data')
        >>> [os.path.relpath(path, folder) for path in written]
        ['data/train/cat.txt']
        >>> fw.io.unzip(os.path.join(folder, 'train.zip'), folder + '/data')  # not empty
        []

        A list of archives is unpacked together (``fw.io.unzip(['train.7z',
        'test.7z'], './data')``); a big one needs ``max_bytes`` raised
        (``max_bytes=200 * 2**30``).
    """
    archives = [fn] if isinstance(fn, (str, os.PathLike)) else list(fn)
    limit = _check_max_bytes(max_bytes)
    if os.path.exists(dest_dir) and not overwrite and _skipped(archives, dest_dir):
        return []
    dest = os.path.realpath(dest_dir)
    with contextlib.ExitStack() as stack:
        opened = [_open(os.fspath(archive), dest, stack) for archive in archives]
        _check_names(opened)
        _check_sizes(opened, dest, limit)
        with _staging(dest) as staging:
            for archive in opened:
                archive.extract(staging)
            return sorted(_move_into_place(opened, staging, dest))


def _skipped(archives: list, dest_dir: str) -> bool:
    """Whether the call skips: `dest_dir` already holds something (as the original, so a
    re-run notebook cell does not unpack again), said in one warning. An empty folder
    is unpacked into."""
    held = sorted(os.listdir(dest_dir)) if os.path.isdir(dest_dir) else None
    if held == []:
        return False
    names = ", ".join(os.fspath(a) for a in archives)
    what = (f"already holds {len(held)} entr{'y' if len(held) == 1 else 'ies'} (e.g. "
            f"{held[0]!r})" if held else "is a file")
    logger.warning("fenwicks: unzip skipped %s: dest_dir=%r %s, so nothing was unpacked. "
                   "Pass overwrite=True to unpack into it (files of the same names are "
                   "replaced, others kept), or a new dest_dir", names, dest_dir, what)
    return True


@dataclasses.dataclass(frozen=True)
class _Member:
    """One member to unpack: its entry in the archive, where it goes, its size."""

    entry: Any  # the ZipInfo, TarInfo or py7zr FileInfo
    name: str
    relative: str  # its path under dest_dir, normalised ('a/b.csv'; '.' for dest_dir)
    size: int
    is_dir: bool


@dataclasses.dataclass
class _Archive:
    """An open archive whose members were all checked, and how to write them."""

    path: str
    members: list[_Member]
    extract: Callable[[str], None]  # writes the members under the folder it is given

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


def _relative(dest: str, name: str, archive: str) -> str:
    """Where member `name` goes, relative to `dest`; refuses a path that leaves it."""
    target = os.path.realpath(os.path.join(dest, name))
    if os.path.isabs(name) or os.path.commonpath([dest, target]) != dest:
        raise ValueError(f"{archive}: member {name!r} would be written outside "
                         f"dest_dir={dest!r}; refusing to unpack this archive")
    return os.path.relpath(target, dest)


def _refuse_link(archive: str, name: str) -> None:
    raise ValueError(f"{archive}: member {name!r} is a link or special file; refusing "
                     "to unpack this archive")


def _check_names(archives: list[_Archive]) -> None:
    """Refuses, before any write, names no file can have and a file where a member
    needs a folder."""
    files: dict[str, str] = {}  # relative path -> the member writing it
    folders: dict[str, str] = {}
    for archive in archives:
        for member in archive.members:
            if member.relative == "." and not member.is_dir:
                raise ValueError(f"{archive.path}: member {member.name!r} has no file name "
                                 "(it names dest_dir itself), so it cannot be unpacked; "
                                 "nothing was written. Repack the archive without it")
            too_long = [part for part in member.relative.split(os.sep)
                        if len(os.fsencode(part)) > _NAME_MAX]
            if too_long:
                raise ValueError(
                    f"{archive.path}: member {member.name[:60]!r}... has a name part of "
                    f"{len(os.fsencode(too_long[0]))} bytes, and files and folders here "
                    f"take at most {_NAME_MAX}; nothing was written. Repack the archive "
                    "with shorter names")
            _check_no_clash(archive.path, member, files, folders)


def _check_no_clash(archive: str, member: _Member, files: dict[str, str],
                    folders: dict[str, str]) -> None:
    """Records `member` in `files` or `folders` (relative path -> member name); refuses
    a path that is a file of one member and a folder of another."""
    parts = member.relative.split(os.sep)
    needed = [os.sep.join(parts[:depth]) for depth in range(1, len(parts))]
    if member.is_dir:
        needed.append(member.relative)
    else:
        files.setdefault(member.relative, member.name)
    for folder in needed:
        folders.setdefault(folder, member.name)
    for path in [*needed, member.relative]:
        if path in files and path in folders:
            raise ValueError(
                f"{archive}: member {files[path]!r} is a file, but member "
                f"{folders[path]!r} needs a folder of that name; nothing was written. "
                "Repack the archive so that no file shares its name with a folder")


@contextlib.contextmanager
def _staging(dest: str) -> Iterator[str]:
    """A new folder beside `dest` (the same filesystem, so moving is a rename), removed
    with the folders made for it if the block fails."""
    parent, made = os.path.dirname(dest), []
    missing = parent
    while not os.path.exists(missing):
        made.append(missing)
        missing = os.path.dirname(missing)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(dest)}.unpacking-", dir=parent)
    try:
        yield staging
    except BaseException:
        _removal.remove_tree(staging, ignore_errors=True)
        for folder in made:  # the deepest first; only folders still empty
            _removal.remove_empty_dir(folder)
        raise
    _removal.remove_tree(staging, ignore_errors=True)  # empty once its contents moved


def _move_into_place(archives: list[_Archive], staging: str, dest: str) -> list[str]:
    """Moves the unpacked tree from `staging` into `dest`: the whole folder if `dest`
    does not exist, else file by file (replacing files, never removing any)."""
    written = sorted({os.path.join(dest, m.relative) for a in archives
                      for m in a.members if not m.is_dir})
    if not os.path.exists(dest):
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(staging, 0o777 & ~mask)  # mkdtemp's 0o700 would be the folder's mode
        os.rename(staging, dest)
        return written
    _check_fits(archives, staging, dest)
    for root, dirs, names in os.walk(staging):
        here = os.path.join(dest, os.path.relpath(root, staging))
        for name in dirs:
            os.makedirs(os.path.join(here, name), exist_ok=True)
        for name in names:
            os.replace(os.path.join(root, name), os.path.join(here, name))
    return written


def _check_fits(archives: list[_Archive], staging: str, dest: str) -> None:
    """Refuses, before moving anything, a file where `dest` has a folder or the reverse."""
    for archive in archives:
        for member in archive.members:
            there = os.path.join(dest, member.relative)
            if os.path.lexists(there) and os.path.isdir(there) != os.path.isdir(
                    os.path.join(staging, member.relative)):
                kind = "a folder" if os.path.isdir(there) else "a file"
                raise ValueError(f"{archive.path}: member {member.name!r} would replace "
                                 f"{kind} that dest_dir already has, {there!r}; nothing "
                                 "was unpacked. Move it away or unpack elsewhere")


def _damaged(archive: str, name: str | None, err: BaseException) -> DamagedArchiveError:
    which = f"member {name!r}" if name is not None else "a member"
    return DamagedArchiveError(
        f"{archive}: {which} is damaged ({type(err).__name__}: {err}); nothing was "
        "unpacked. Download or copy the archive again")


def _write(target: str, source: BinaryIO, archive: str, name: str) -> None:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "wb") as out:
        while True:
            try:  # the archive's errors, not the disk's (those stay OSErrors)
                chunk = source.read(_READ_CHUNK)
            except Exception as err:
                raise _damaged(archive, name, err) from err
            if not chunk:
                break
            out.write(chunk)


def _write_members(archive: str, members: list[_Member], open_member: Callable[[Any], Any],
                   root: str) -> None:
    for member in members:
        target = os.path.join(root, member.relative)
        if member.is_dir:
            os.makedirs(target, exist_ok=True)
            continue
        try:
            source = open_member(member.entry)
        except Exception as err:  # a local header that does not match: damaged too
            raise _damaged(archive, member.name, err) from err
        with source:
            _write(target, source, archive, member.name)


def _open(archive: str, dest: str, stack: contextlib.ExitStack) -> _Archive:
    lower = archive.lower()
    if lower.endswith(".zip"):
        opener = _open_zip
    elif lower.endswith(_TAR_ENDINGS):
        opener = _open_tar
    elif lower.endswith(".7z"):
        opener = _open_7z
    else:
        raise ValueError(f"fn={archive!r}: unknown archive type; give a .zip, "
                         ".tar(.gz/.bz2/.xz) or .7z file")
    try:
        return opener(archive, dest, stack)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        raise  # they name the file already
    except (ValueError, ImportError):
        raise  # ours (unsafe members, named), or py7zr missing
    except Exception as err:  # EOFError, zipfile/tarfile errors, zlib, lzma, bz2's OSError
        raise _unreadable(archive, None, err) from err


def _unreadable(archive: str, after: str | None, err: BaseException) -> DamagedArchiveError:
    """A damaged or cut archive whose member list could not be read, named, with the
    last member read before the damage (or none)."""
    where = (f"in or after member {after!r}" if after is not None
             else "before any member could be read")
    reason = f"{type(err).__name__}: {first_line(err)}"
    if "not a zip file" in str(err).lower():
        reason += " (its member list, at the end of a zip, is missing: cut short?)"
    return DamagedArchiveError(
        f"{archive}: the archive is cut short or damaged {where} ({reason}); nothing was "
        "unpacked from it or the other archives of the call. Download or copy it again")


def _open_zip(archive: str, dest: str, stack: contextlib.ExitStack) -> _Archive:
    import zipfile

    zf = stack.enter_context(zipfile.ZipFile(archive))
    members = []
    for info in zf.infolist():
        relative = _relative(dest, info.filename, archive)
        if (info.external_attr >> 16) & 0o170000 == 0o120000:  # a symlink's mode bits
            _refuse_link(archive, info.filename)
        # not info.is_dir(): an empty name is an IndexError there
        members.append(_Member(info, info.filename, relative, info.file_size,
                               info.filename.endswith("/")))
    return _Archive(archive, members,
                    lambda root: _write_members(archive, members, zf.open, root))


def _open_tar(archive: str, dest: str, stack: contextlib.ExitStack) -> _Archive:
    import tarfile

    tar = stack.enter_context(_open_tarfile(archive))
    infos: list[Any] = []
    try:  # headers are read one after another: the damage lies after the last read
        infos.extend(tar)
    except Exception as err:
        if isinstance(err, (ValueError, ImportError)) and not isinstance(
                err, tarfile.TarError):
            raise
        raise _unreadable(archive, infos[-1].name if infos else None, err) from err
    members = []
    for info in infos:
        relative = _relative(dest, info.name, archive)
        if not (info.isfile() or info.isdir()):
            _refuse_link(archive, info.name)
        members.append(_Member(info, info.name, relative,
                               info.size if info.isfile() else 0, info.isdir()))
    return _Archive(archive, members,
                    lambda root: _write_members(archive, members, tar.extractfile, root))


def _open_tarfile(archive: str) -> Any:
    """`tarfile.open` with the compression the name says: a cut ``.tar.bz2`` then fails
    as bzip2 data, not as "not a gzip file", the last of the formats ``r:*`` tried.
    A file whose start is not that compression is opened as whatever it is."""
    import tarfile

    lower = archive.lower()
    mode = next((m for endings, m in (((".tar.gz", ".tgz"), "r:gz"),
                                      ((".tar.bz2", ".tbz2"), "r:bz2"),
                                      ((".tar.xz", ".txz"), "r:xz"), ((".tar",), "r:"))
                 if lower.endswith(endings)), "r:*")
    try:
        return tarfile.open(archive, mode)
    except tarfile.ReadError as err:
        if isinstance(err.__cause__, EOFError):  # that compression, cut in its first block
            raise err.__cause__ from None
        if not str(err).startswith("not a"):  # 'not a bzip2 file': named wrongly
            raise
        return tarfile.open(archive, "r:*")


def _open_7z(archive: str, dest: str, stack: contextlib.ExitStack) -> _Archive:
    try:
        import py7zr
    except ImportError as err:
        raise ImportError(f"fn={archive!r} is a .7z archive: pip install py7zr") from err
    sz = stack.enter_context(py7zr.SevenZipFile(archive))
    members = []
    for info in sz.list():
        relative = _relative(dest, info.filename, archive)
        if getattr(info, "is_symlink", False):  # py7zr < 1.0 has no is_symlink
            _refuse_link(archive, info.filename)
        members.append(_Member(info, info.filename, relative, int(info.uncompressed or 0),
                               info.is_directory))

    def extract(root: str) -> None:
        # Every name was checked above; py7zr then writes exactly those members.
        try:
            sz.extract(path=root, targets=[m.name for m in members])
        except OSError:
            raise  # the disk's
        except Exception as err:  # py7zr's errors name no member
            raise _damaged(archive, None, err) from err

    return _Archive(archive, members, extract)
