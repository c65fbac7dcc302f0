"""Storage: local and ``gs://`` paths behave alike.

Directory operations go through ``tf.io.gfile``, which speaks both; bulk transfers go
through gcsfs (parallel, with a progress bar, skipping files already there). A TPU node
reached over the network can only read and write ``gs://``, so `get_project_dirs` and
`stage` pick a bucket for it and local disk for everything else.

    import fenwicks as fw
    data_dir, work_dir = fw.io.get_project_dirs(None, 'cifar10')
    fw.io.upload('/content/cifar10.tfrec', data_dir)

Every ``gs://`` operation first checks that credentials exist (`fw.gcs.check_credentials`)
so that a machine without them gets a clear error at once instead of minutes of retries.
With ``STORAGE_EMULATOR_HOST`` set, gcsfs talks to that emulator anonymously.

Every ``gs://`` call first checks, once per bucket, that the bucket exists: a missing
one is a `BucketNotFoundError` within seconds (TensorFlow's ``makedirs`` would otherwise
ask again forever).

Storage faults. Both GCS clients retry what is transient (HTTP 408, 429, 5xx, a dropped
or timed-out connection), then fail:

* gcsfs (`upload`, `download`): 6 attempts per request, waiting 1, 2, 4, 8, 16 s (plus
  up to 1 s of jitter each), so about 35 s of waiting. Fenwicks bounds each attempt: 30 s
  to connect and `GCS_STALL_TIMEOUT` s (60, or ``FENWICKS_GCS_STALL_TIMEOUT``) without a
  byte from the server, so a stalled server fails within ~7 minutes, not gcsfs's default
  5 minutes per attempt. Then `TransferError` names the source and destination; a
  repeated call sends only what is missing (objects appear whole or not at all).
* TensorFlow's client (``tf.io.gfile``, checkpoints, TFRecords, summaries): Fenwicks
  sets its defaults at ``import fenwicks`` (TensorFlow reads them when it is imported):
  6 retries waiting 1, 2, 4, 8, 16, 16 s, and 20 s to connect or without progress per
  attempt (``FENWICKS_GCS_REQUEST_TIMEOUT``). ``GCS_*`` variables the user set win.
* Every ``gs://`` call of Fenwicks' own (these functions, checkpoints, the work_dir
  lock, summaries) ends within 90 s (``FENWICKS_GCS_DEADLINE``) with
  `StorageTimeoutError`, even if TensorFlow was imported first with its slower defaults.
"""

from __future__ import annotations

import base64
import hashlib
import os
import posixpath
import re
import sys
import tempfile
from typing import Any

from fenwicks import _deadline, _removal, gcs
from fenwicks._deadline import StorageTimeoutError
from fenwicks._text import first_line
from fenwicks.archives import unzip

GCS_PREFIX = "gs://"
ROOT_ENV = "FENWICKS_ROOT"
BUCKET_ENV = "FENWICKS_BUCKET"

__all__ = ["BucketNotFoundError", "StorageTimeoutError", "TransferError", "check_bucket",
           "copy", "create_clean_dir", "default_root", "download", "exists",
           "get_project_dirs", "glob", "is_gcs", "join", "listdir", "makedirs", "stage",
           "unzip", "upload", "upload_to_gcs"]
GCS_CONNECT_TIMEOUT = 30  # seconds to open a connection to GCS, per attempt
GCS_STALL_TIMEOUT = 60  # seconds without a byte from GCS before an attempt is retried
STALL_TIMEOUT_ENV = "FENWICKS_GCS_STALL_TIMEOUT"
_GLOB_CHARS = frozenset("*?[")
_HASH_BLOCK = 1 << 20  # bytes read at a time when hashing local files




_buckets_seen: set[str] = set()  # buckets known to exist (a bucket is not deleted lightly)


class BucketNotFoundError(ValueError):
    """A ``gs://`` path names a bucket that does not exist (or is not visible)."""


class TransferError(OSError):
    """An `upload` or `download` failed after the storage client's retries.

    Files already transferred are complete (GCS objects appear whole or not at all), and
    calling again sends only what is missing.
    """


# --------------------------------------------------------------------------- roots


def default_root() -> str:
    """The storage root `get_project_dirs(None, ...)` uses.

    ``FENWICKS_ROOT`` if set. Otherwise ``gs://$FENWICKS_BUCKET`` on a TPU node reached
    over the network (it cannot read local disk), else a local directory:
    ``/content/fenwicks`` on Colab, ``/kaggle/working/fenwicks`` on Kaggle, else
    ``~/fenwicks``. Detects the accelerator if nothing has yet.

    Raises:
        ValueError: on a remote TPU with no bucket configured, or a local FENWICKS_ROOT;
            a FENWICKS_ROOT of ``/`` or the home folder.

    Examples:
        >>> import os
        >>> os.environ['FENWICKS_ROOT'] = '/data/fenwicks'
        >>> fw.io.default_root()
        '/data/fenwicks'
    """
    remote = _accelerator_is_remote(detect=True)
    root = os.environ.get(ROOT_ENV)
    if root:
        return _reachable(_check_root_env(root), remote, ROOT_ENV)
    if remote:
        return _bucket_root()
    return _local_default_root()


def _check_root_env(root: str) -> str:
    """Refuses a ``FENWICKS_ROOT`` of ``/`` or the home folder: projects' data and work
    folders go under the root, so it must be a folder of Fenwicks' own."""
    if is_gcs(root):
        return root
    real = os.path.realpath(os.path.expanduser(root))
    for name, whole in (("the root of the file system", os.path.sep),
                        ("the home folder", os.path.realpath(os.path.expanduser("~")))):
        if real == whole:
            raise ValueError(
                f"{ROOT_ENV}={root!r} is {name}; Fenwicks keeps every project's data and "
                "work folders (checkpoints it may later clean) under that root, so it "
                f"must be a folder of its own. Set {ROOT_ENV} to e.g. "
                f"{os.path.join(os.path.expanduser('~'), 'fenwicks')!r}, or unset it")
    return root


def _local_default_root() -> str:
    """The default root on a machine whose accelerator reads local disk."""
    if gcs.environment() == "colab":
        return "/content/fenwicks"
    if gcs.environment() == "kaggle":
        return "/kaggle/working/fenwicks"
    return os.path.expanduser("~/fenwicks")


def get_project_dirs(root_dir: str | None, project: str) -> tuple[str, str]:
    """Returns ``(data_dir, work_dir)`` for `project`, creating both if missing.

    ``data_dir = root_dir/data/project`` holds datasets; ``work_dir =
    root_dir/work/project`` holds checkpoints and logs, so a run resumes when given the
    same `work_dir`.

    Args:
        root_dir: ``'gs://bucket[/prefix]'``, a local directory, or None to pick by the
            accelerator (see `default_root`).
        project: a name such as ``'cifar10'``; may contain ``/`` but not ``..``.

    Returns:
        The data and work directories, as strings.

    Raises:
        ValueError: bad `project` or `root_dir`, a local `root_dir` for a TPU reached
            over the network, or no bucket configured for one.
        fw.gcs.GCSCredentialsError: a ``gs://`` root without credentials.

    Examples:
        >>> data_dir, work_dir = fw.io.get_project_dirs('gs://my-bucket', 'cifar10')
        >>> data_dir, work_dir
        ('gs://my-bucket/data/cifar10', 'gs://my-bucket/work/cifar10')
    """
    _check_project(project)
    if root_dir is None:
        root = default_root()
    else:
        root = _reachable(_check_path(root_dir, "root_dir"), _accelerator_is_remote(False),
                          "root_dir")
    root = _normalise(root)
    data_dir, work_dir = join(root, "data", project), join(root, "work", project)
    makedirs(data_dir)
    makedirs(work_dir)
    return data_dir, work_dir


def _accelerator_is_remote(detect: bool) -> bool:
    """Whether the accelerator is a TPU node that only reads ``gs://``.

    fw.accel sits above fw.io in the layers but imports only the leaf `fenwicks._text`,
    so this lazy import cannot cycle. Without `detect`, an accelerator nobody has initialised
    counts as local: detection fixes TensorFlow's devices, and merely naming a local
    directory should not do that before `fw.accel.configure()`.
    """
    from fenwicks import accel

    if not detect and not accel.is_initialized():
        return False
    return bool(accel.current().is_remote)


def _bucket_root() -> str:
    bucket = os.environ.get(BUCKET_ENV, "").strip()
    if not bucket:
        raise ValueError(
            f"the accelerator is a TPU reached over the network, which can only read and "
            f"write gs:// paths, and {BUCKET_ENV} is not set; set "
            f"os.environ['{BUCKET_ENV}'] = 'my-bucket' or pass root_dir='gs://my-bucket'")
    return _check_path(GCS_PREFIX + bucket.removeprefix(GCS_PREFIX).rstrip("/"), BUCKET_ENV)


def _reachable(root: str, remote: bool, name: str) -> str:
    if remote and not is_gcs(root):
        raise ValueError(
            f"{name}={root!r} is local, but the accelerator is a TPU reached over the "
            f"network and can only read and write gs:// paths; use 'gs://my-bucket' or "
            f"set {BUCKET_ENV} and pass None")
    return root


# --------------------------------------------------------------------------- paths


def is_gcs(path: str | os.PathLike) -> bool:
    """True for a ``gs://`` path.

    Examples:
        >>> fw.io.is_gcs('gs://bucket/x'), fw.io.is_gcs('/tmp/x')
        (True, False)
    """
    return os.fspath(path).startswith(GCS_PREFIX)


def join(path: str, *parts: str) -> str:
    """Joins path parts with ``/`` for ``gs://`` and the OS separator otherwise.

    Examples:
        >>> fw.io.join('gs://bucket', 'data', 'mnist')
        'gs://bucket/data/mnist'
    """
    path = os.fspath(path)
    if is_gcs(path):
        return posixpath.join(path, *parts)
    return os.path.join(path, *parts)


def _check_path(path: Any, name: str) -> str:
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path).strip():
        raise ValueError(f"{name}={path!r} must be a non-empty path such as "
                         "'gs://my-bucket/data' or '/tmp/data'")
    path = os.fspath(path)
    if is_gcs(path):
        bucket = path[len(GCS_PREFIX):].split("/", 1)[0]
        if not bucket or not bucket[0].isalnum():
            raise ValueError(f"{name}={path!r} names no bucket; use 'gs://BUCKET/path'")
        return path
    return os.path.expanduser(path)  # '~/runs' is the home's, never a folder named '~'


def _check_project(project: Any) -> None:
    parts = project.split("/") if isinstance(project, str) else []
    if (not parts or not project.strip() or project.startswith("/") or "://" in project
            or ".." in parts or "" in parts or _GLOB_CHARS & set(project)):
        raise ValueError(f"project={project!r} must be a relative name such as 'cifar10' "
                         "(letters, digits, '-', '_' or nested 'a/b'; no '..' or globs)")


def _normalise(path: str) -> str:
    if is_gcs(path):
        return path.rstrip("/") if path.rstrip("/") != "gs:" else path
    return os.path.abspath(os.path.expanduser(path))


def _gfile(path: str):
    """``tf.io.gfile``, after checking credentials and the bucket when `path` is on GCS."""
    if is_gcs(path):
        check_bucket(path)
    import tensorflow as tf

    return tf.io.gfile


def _call(path: str, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args)``, within the storage deadline when `path` is on GCS."""
    return _deadline.run(fn, *args, what=what, path=path, **kwargs)


def check_bucket(path: str) -> str:
    """Checks credentials and that the bucket of ``gs://`` `path` exists; returns `path`.

    Done once per bucket and process, before anything else touches it: TensorFlow's
    ``makedirs`` on a missing bucket asks again forever, and a save would fail only
    after its retries. Local paths pass unchecked.

    Raises:
        fw.gcs.GCSCredentialsError: no credentials.
        BucketNotFoundError: the bucket does not exist; names it and the fix.
        StorageTimeoutError: storage did not answer within the deadline.

    Examples:
        >>> fw.io.check_bucket('gs://my-bucket/work/cifar10')
        'gs://my-bucket/work/cifar10'
    """
    path = _check_path(path, "path")
    if not is_gcs(path):
        return path
    gcs.check_credentials(path)
    bucket = GCS_PREFIX + path[len(GCS_PREFIX):].split("/", 1)[0]
    if bucket in _buckets_seen:
        return path
    import tensorflow as tf

    if not _call(bucket, "bucket check", tf.io.gfile.exists, bucket):
        raise BucketNotFoundError(
            f"bucket {bucket!r} (of {path!r}) does not exist, or these credentials cannot "
            f"see it. Create it (`gcloud storage buckets create {bucket}`) or fix the name; "
            "on a TPU, use a bucket in the TPU's region")
    _buckets_seen.add(bucket)
    return path


# --------------------------------------------------------------------------- gfile ops


def exists(path: str) -> bool:
    """True if `path` (a local or ``gs://`` file or directory) exists.

    Examples:
        >>> fw.io.exists('gs://my-bucket/data/cifar10/train.tfrec')
        True
    """
    path = _check_path(path, "path")
    return bool(_call(path, "exists", _gfile(path).exists, path))


def makedirs(path: str) -> str:
    """Creates directory `path` and its parents if missing; returns `path`.

    Examples:
        >>> fw.io.makedirs('/tmp/fenwicks/work')
        '/tmp/fenwicks/work'
    """
    path = _check_path(path, "path")
    _call(path, "makedirs", _gfile(path).makedirs, path)
    return path


def glob(pattern: str) -> list[str]:
    """Paths matching `pattern` (``*``, ``?``, ``[...]``), sorted.

    Examples:
        >>> fw.io.glob('gs://my-bucket/data/cifar10/*.tfrec')
        ['gs://my-bucket/data/cifar10/train-0.tfrec', 'gs://my-bucket/data/cifar10/train-1.tfrec']
    """
    pattern = _check_path(pattern, "pattern")
    # On GCS, TensorFlow also returns folder marker objects ('run/' for 'run*/*').
    found = _call(pattern, "glob", _gfile(pattern).glob, pattern)
    return sorted({path for path in found if not path.endswith("/")})


def listdir(path: str) -> list[str]:
    """Names of the entries of directory `path`, sorted, without a trailing ``/``.

    Raises:
        FileNotFoundError: if `path` is not a directory.

    Examples:
        >>> fw.io.listdir('gs://my-bucket/data')
        ['cifar10', 'mnist']
    """
    path = _check_path(path, "path")
    gfile = _gfile(path)
    if not _call(path, "isdir", gfile.isdir, path):
        raise FileNotFoundError(f"path={path!r} is not a directory")
    return sorted({name.rstrip("/") for name in _call(path, "listdir", gfile.listdir, path)})


def read_bytes(path: str) -> bytes:
    """The contents of file `path` (local or ``gs://``).

    Raises:
        FileNotFoundError: `path` does not exist (TensorFlow's NotFoundError for gs://).

    Examples:
        >>> fw.io.read_bytes('gs://my-bucket/work/run/checkpoints/100/record/metadata')[:1]
        b'{'
    """
    path = _check_path(path, "path")
    if not is_gcs(path):
        with open(path, "rb") as f:
            return f.read()

    def read() -> bytes:
        with _gfile(path).GFile(path, "rb") as f:
            return f.read()

    return _call(path, "read", read)


def write_text(path: str, text: str) -> None:
    """Writes `text` to file `path` (local or ``gs://``), replacing it.

    Examples:
        >>> fw.io.write_text('gs://my-bucket/work/run/checkpoints/100/commit_success.txt', 'ok')
    """
    path = _check_path(path, "path")

    def write() -> None:
        with _gfile(path).GFile(path, "w") as f:
            f.write(text)

    _call(path, "write", write)


def rename(src: str, dst: str) -> None:
    """Renames `src` to `dst` (on ``gs://``: a copy, then the source removed), replacing
    `dst`.

    Examples:
        >>> fw.io.makedirs('run/checkpoints/100')
        'run/checkpoints/100'
        >>> fw.io.rename('run/checkpoints/100', 'run/checkpoints/100.corrupt')
        >>> fw.io.listdir('run/checkpoints')
        ['100.corrupt']
    """
    src, dst = _check_path(src, "src"), _check_path(dst, "dst")
    _call(src, "rename", _gfile(src).rename, src, dst, overwrite=True)


def copy(src: str, dst: str, overwrite: bool = False) -> list[str]:
    """Copies file or directory `src` to `dst` (either may be ``gs://``).

    A directory is copied recursively: ``dst`` becomes its copy. Every target is
    checked before anything is written, so a refused copy changes nothing.

    Args:
        src: the file or directory to copy.
        dst: the path of the copy (not the directory to put it in).
        overwrite: replace files already at the targets. Defaults to False.

    Returns:
        The files written, sorted.

    Raises:
        FileNotFoundError: if `src` does not exist.
        FileExistsError: if a target exists and `overwrite` is False.

    Examples:
        >>> fw.io.copy('/content/model.keras', 'gs://my-bucket/work/model.keras')
        ['gs://my-bucket/work/model.keras']
    """
    src, dst = _check_path(src, "src"), _check_path(dst, "dst")
    gfile, _ = _gfile(src), _gfile(dst)  # credentials and buckets checked for both
    remote = src if is_gcs(src) else dst  # which side the deadline is about
    if not _call(src, "exists", gfile.exists, src):
        raise FileNotFoundError(f"src={src!r} does not exist")
    pairs = _call(remote, "listing", _copy_pairs, gfile, src, dst)
    clashes = [target for _, target in pairs if _call(remote, "exists", gfile.exists, target)]
    if clashes and not overwrite:
        raise FileExistsError(f"dst={dst!r}: {len(clashes)} target(s) exist, e.g. "
                              f"{clashes[0]!r}; pass overwrite=True to replace them")
    for source, target in pairs:
        # No overall deadline on a transfer (a large file may take long); TensorFlow's
        # per-attempt progress timeout and retries still end a stalled one.
        _copy_one(gfile, source, target, overwrite)
    return sorted(target for _, target in pairs)


def _copy_one(gfile: Any, source: str, target: str, overwrite: bool) -> None:
    gfile.makedirs(_dirname(target))
    gfile.copy(source, target, overwrite=overwrite)


def _copy_pairs(gfile: Any, src: str, dst: str) -> list[tuple[str, str]]:
    if not gfile.isdir(src):
        return [(src, dst)]
    pairs = []
    for folder, _, files in gfile.walk(src):
        relative = folder[len(src):].strip("/")
        for name in files:
            target = join(dst, relative, name) if relative else join(dst, name)
            pairs.append((join(folder, name), target))
    return pairs


def _dirname(path: str) -> str:
    return posixpath.dirname(path) if is_gcs(path) else os.path.dirname(path)


# --------------------------------------------------------------------------- clean dirs


def create_clean_dir(path: str, *, force: bool = False) -> str:
    """Makes `path` an empty directory, deleting only what Fenwicks wrote there.

    The path is resolved first (``..``, trailing slashes, symlinks in the folders above
    it); a `path` that is itself a symlink is refused rather than followed. Without
    `force`, only Fenwicks' own files are deleted: what it writes in a work_dir
    (checkpoints, run records, TensorBoard event files, the epoch log, the lock) and the
    files a Fenwicks manifest lists unchanged (its exports). A folder holding anything
    else is refused, naming the first such file, and nothing is deleted. `force=True`
    deletes everything inside `path`. Never cleaned, even with `force`: ``/``, a bucket
    root, system folders (``/tmp``, ``/usr``, ``/etc``, ``/var/tmp``, Python's
    installation, ...), a mount point of any kind (from the mount table: a bind mount
    too) or a folder holding one, and the home or current directory or any folder
    holding them. A ``gs://`` sibling sharing the prefix (``run`` vs ``run2``) survives.

    Args:
        path: a local or ``gs://`` directory.
        force: also delete files Fenwicks did not write. Defaults to False.

    Returns:
        `path`.

    Raises:
        ValueError: for a refused path, a folder holding files Fenwicks did not write
            (without `force`), or a path that is a file; nothing is deleted.

    Examples:
        >>> data_dir, work_dir = fw.io.get_project_dirs('gs://my-bucket', 'cifar10')
        >>> fw.io.create_clean_dir(work_dir)  # its checkpoints, logs and exports go
        'gs://my-bucket/work/cifar10'
        >>> fw.io.create_clean_dir('/tmp/scratch', force=True)  # everything in it goes
        '/tmp/scratch'
    """
    path = _check_path(path, "path")
    if is_gcs(path):
        _check_cleanable_gcs(path)
        target = path.rstrip("/")
    else:
        target = _check_cleanable_local(path)
    _gfile(path)
    _call(path, "create_clean_dir", _clean, path, target, force)
    return path


def _clean(path: str, target: str, force: bool) -> None:
    import tensorflow as tf

    gfile = tf.io.gfile
    if gfile.exists(target):
        if not gfile.isdir(target):
            raise ValueError(f"path={path!r} is a file, not a directory; delete it "
                             "yourself or choose another path")
        if force:
            _removal.remove_tree(target)  # links inside are removed, never followed
        else:
            own, foreign = _removal.classify_work_dir(target)
            if foreign:
                raise ValueError(_foreign_message(path, target, foreign))
            _removal.remove_own_work_files(target, own)
    gfile.makedirs(target)


def _foreign_message(path: str, target: str, foreign: list[str]) -> str:
    first = f"{target.rstrip('/')}/{foreign[0]}"
    more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
    return (f"path={path!r} holds {first!r}{more}, which Fenwicks did not write; "
            "create_clean_dir deletes only Fenwicks' own files (checkpoints, run records, "
            "event files, exports, the lock), so nothing was deleted. Move that file "
            f"away, or call fw.io.create_clean_dir({path!r}, force=True) to delete "
            "everything in the folder")


def _check_cleanable_gcs(path: str) -> None:
    key = path[len(GCS_PREFIX):].split("/", 1)[1:]
    if not key or not key[0].strip("/"):
        raise ValueError(f"path={path!r} is a whole bucket; create_clean_dir would empty "
                         "it. Pass a folder inside it, e.g. 'gs://bucket/work/run1'")
    if ".." in key[0].split("/") or _GLOB_CHARS & set(key[0]):
        raise ValueError(f"path={path!r} contains '..' or a glob character; pass the exact "
                         "folder to clean")


def _check_cleanable_local(path: str) -> str:
    """The real path of local folder `path` (symlinks, ``..``, trailing slashes
    resolved), after refusing a symlink and a protected folder."""
    given = path.rstrip(os.sep) or os.sep
    while given.endswith(os.sep + ".") and len(given) > 2:  # 'run/.', 'run/./'
        given = given[:-2].rstrip(os.sep) or os.sep
    if os.path.islink(given):
        raise ValueError(
            f"path={path!r} is a symlink to {os.path.realpath(given)!r}; create_clean_dir "
            "never empties a folder through a link. Pass the real folder if that is the "
            "one to clean")
    real = os.path.realpath(given)
    why = _protected_reason(real)
    if why:
        raise ValueError(f"path={path!r} is {why}; refusing to delete it (even with "
                         "force=True). Pass a dedicated sub-directory such as a work_dir "
                         "of fw.io.get_project_dirs")
    return real


def _protected_reason(real: str) -> str | None:
    """Why local directory `real` (resolved) must never be emptied, or None."""
    if real == os.path.sep:
        return "the root of the file system"
    for name, protected in (("the home directory", os.path.expanduser("~")),
                            ("the current directory", os.getcwd())):
        protected = os.path.realpath(protected)
        if os.path.commonpath([real, protected]) == real:
            return f"{name} ({protected!r}) or holds it"
    if real in _system_dirs() or os.path.dirname(real) == os.path.sep:
        return "a system folder"
    for tree in _system_trees():
        if os.path.commonpath([real, tree]) == tree:
            return f"inside the system folder {tree!r}"
    return _mount_reason(real)


def _mount_reason(real: str) -> str | None:
    """Why `real` is a mount point or holds one, from the mount table (a bind mount on
    the same filesystem is one too, though `os.path.ismount` says False), or None."""
    mounts = _mount_table()
    if real in mounts or os.path.ismount(real):
        what = mounts.get(real, "a mount point")
        return f"a mount point ({what})"
    inside = sorted(m for m in mounts if m.startswith(real.rstrip(os.sep) + os.sep))
    if inside:
        return (f"a folder holding the mount point {inside[0]!r} ({mounts[inside[0]]}), "
                "whose files a clean would delete")
    return None


def _mount_table() -> dict[str, str]:
    """{mount point: 'a <type> mount of <source>'} from ``/proc/self/mountinfo``;
    empty where there is none (macOS: `os.path.ismount` alone)."""
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    table = {}
    for line in lines:
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        point, root = _unescape_mount(fields[4]), _unescape_mount(fields[3])
        kind, source = fields[dash + 1], _unescape_mount(fields[dash + 2])
        bind = f", folder {root!r} of it" if root != "/" else ""
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        table[point] = f"{article} {kind} mount of {source}{bind}"
    return table


def _unescape_mount(text: str) -> str:
    """The kernel writes space, tab, newline and backslash in mountinfo as octal."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def _system_dirs() -> set[str]:
    """Folders never emptied whole; sub-folders of the shared ones (``/tmp/run``) are
    fine. Every top-level folder counts as well (``/tmp``, ``/data``, ``/content``)."""
    shared = ("/var/tmp", "/usr/tmp", "/private/tmp", "/private/var", "/var",
              "/kaggle/working", "/kaggle/input", "/content/drive",
              "/content/drive/MyDrive", tempfile.gettempdir())
    return {os.path.realpath(d) for d in shared}


def _system_trees() -> set[str]:
    """Folders nothing inside of which is emptied: the OS's and Python's own."""
    trees = {os.path.realpath(d) for d in ("/bin", "/boot", "/dev", "/etc", "/lib",
                                          "/lib32", "/lib64", "/libx32", "/proc", "/run",
                                          "/sbin", "/sys", "/usr", "/System", "/Library")}
    trees |= {os.path.realpath(d) for d in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    var = os.path.realpath("/var")
    if os.path.isdir(var):  # /var's trees (lib, log, cache...), not its temp folder
        trees |= {os.path.join(var, d) for d in os.listdir(var) if d != "tmp"}
    return trees


# --------------------------------------------------------------------------- transfers


def upload(local_path: str, remote_dir: str, *, workers: int = 16,
           progress: bool = True) -> list[str]:
    """Copies a local file or directory into `remote_dir`, skipping what is already there.

    ``upload('/data/cifar', 'gs://b/data')`` writes ``gs://b/data/cifar/...``. A file
    already at its target with the same size and checksum (GCS's md5, or crc32c) is
    skipped, so a repeated call transfers nothing. Files go up in parallel through gcsfs.

    Args:
        local_path: a local file or directory.
        remote_dir: the ``gs://`` (or local) directory to put it in.
        workers: files transferred at once. Defaults to 16.
        progress: show a tqdm progress bar. Defaults to True.

    Returns:
        The destination paths written, sorted (empty if everything was there).

    Raises:
        ValueError: `local_path` is a ``gs://`` path, or `workers` < 1.
        FileNotFoundError: `local_path` does not exist.

    Examples:
        >>> fw.io.upload('/content/cifar10', 'gs://my-bucket/data')
        ['gs://my-bucket/data/cifar10/test.tfrec', 'gs://my-bucket/data/cifar10/train.tfrec']
        >>> fw.io.upload('/content/cifar10', 'gs://my-bucket/data')
        []
    """
    local_path = _check_path(local_path, "local_path")
    if is_gcs(local_path):
        raise ValueError(f"local_path={local_path!r} is on GCS; upload() sends local files "
                         "up. Use fw.io.copy() between buckets")
    return _transfer(local_path, _check_path(remote_dir, "remote_dir"), workers, progress,
                     "upload")


def download(remote_path: str, local_dir: str, *, workers: int = 16,
             progress: bool = True) -> list[str]:
    """Copies a ``gs://`` (or local) file or directory into local directory `local_dir`.

    The mirror of `upload`: ``download('gs://b/data/cifar', '/tmp')`` writes
    ``/tmp/cifar/...``, skipping local files with the same size and checksum.

    Args:
        remote_path: the ``gs://`` file or directory to fetch.
        local_dir: the local directory to put it in (created if missing).
        workers: files transferred at once. Defaults to 16.
        progress: show a tqdm progress bar. Defaults to True.

    Returns:
        The local paths written, sorted (empty if everything was there).

    Raises:
        ValueError: `local_dir` is a ``gs://`` path, or `workers` < 1.
        FileNotFoundError: `remote_path` does not exist.

    Examples:
        >>> fw.io.download('gs://my-bucket/work/cifar10/export', '/content')
        ['/content/export/saved_model.pb', ...]
    """
    local_dir = _check_path(local_dir, "local_dir")
    if is_gcs(local_dir):
        raise ValueError(f"local_dir={local_dir!r} is on GCS; download() fetches to local "
                         "disk. Use fw.io.copy() between buckets")
    return _transfer(_check_path(remote_path, "remote_path"), local_dir, workers, progress,
                     "download")


def stage(local_path: str, project: str, root_dir: str | None = None) -> str:
    """Returns where the accelerator should read `local_path`, uploading it if needed.

    A TPU reached over the network cannot read local disk: there the file or directory
    is uploaded (idempotently) to the project's ``data_dir`` on the bucket and that
    path returned. Anywhere else, and for a path already on ``gs://``, `local_path` is
    returned unchanged.

    Args:
        local_path: a local file or directory (or a ``gs://`` path).
        project: the project whose ``data_dir`` receives it (see `get_project_dirs`).
        root_dir: the storage root. Defaults to None (`default_root`).

    Returns:
        The path to hand to the input pipeline.

    Examples:
        >>> fw.io.stage('/content/digits.tfrec', 'digits')   # on a Colab TPU node
        'gs://my-bucket/data/digits/digits.tfrec'
    """
    local_path = _check_path(local_path, "local_path")
    if is_gcs(local_path):
        return local_path
    if not os.path.exists(local_path):
        raise FileNotFoundError(f"local_path={local_path!r} does not exist")
    if not _accelerator_is_remote(detect=True):
        return local_path
    data_dir, _ = get_project_dirs(root_dir, project)
    upload(local_path, data_dir)
    return join(data_dir, os.path.basename(os.path.normpath(local_path)))


def _transfer(source: str, dest_dir: str, workers: int, progress: bool,
              verb: str) -> list[str]:
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers={workers!r} must be a positive integer, e.g. 16")
    src = _Side(source)
    if not src.fs.exists(src.path):
        raise FileNotFoundError(f"{verb}: {source!r} does not exist")
    name = posixpath.basename(src.path.rstrip("/"))
    dst = _Side(join(dest_dir, name))
    wanted = src.listing()
    present = dst.listing()
    todo = [rel for rel in sorted(wanted)
            if rel not in present or not _same(src, wanted[rel], dst, present[rel])]
    pairs = [(src.child(rel), dst.child(rel)) for rel in todo]
    if pairs:
        try:
            _copy_files(src, dst, pairs, workers, progress, f"{verb} {name}")
        except Exception as err:  # gcsfs's HttpError, aiohttp's errors, OSError...
            raise TransferError(
                f"{verb} of {source!r} to {dst.url(dst.path)!r} failed after the storage "
                f"client's retries ({len(pairs)} file(s) to send, e.g. "
                f"{dst.url(pairs[0][1])!r}): {type(err).__name__}: {first_line(err)}. "
                f"Files already sent are complete; call {verb}() again to send the rest"
            ) from err
    return [dst.url(target) for _, target in pairs]


class _Side:
    """One end of a transfer: an fsspec filesystem (gcsfs or local) and a root path."""

    def __init__(self, path: str) -> None:
        self.is_gcs = is_gcs(path)
        self.fs = _filesystem(path)
        self.path = path[len(GCS_PREFIX):].rstrip("/") if self.is_gcs else _normalise(path)

    def child(self, relative: str) -> str:
        return self.path if not relative else posixpath.join(self.path, relative)

    def url(self, path: str) -> str:
        return GCS_PREFIX + path if self.is_gcs else path

    def listing(self) -> dict[str, dict[str, Any]]:
        """Files under the root, by path relative to it ('' when the root is a file)."""
        if self.is_gcs:
            self.fs.invalidate_cache(self.path)  # the listing cache outlives our writes
        if not self.fs.exists(self.path):
            return {}
        if not self.fs.isdir(self.path):
            return {"": self.fs.info(self.path)}
        found = self.fs.find(self.path, detail=True)
        prefix = self.path + "/"
        return {key[len(prefix):]: info for key, info in found.items()
                if key.startswith(prefix) and info.get("type") != "directory"
                and not key.endswith("/")}


def _filesystem(path: str):
    if is_gcs(path):
        gcs.check_credentials(path)
        import gcsfs

        # An emulator takes no credentials; real GCS uses google.auth's defaults only,
        # never gcsfs's silent fall-back to anonymous access.
        token = "anon" if os.environ.get(gcs.EMULATOR_ENV) else "google_default"
        return gcsfs.GCSFileSystem(token=token, requests_timeout=_request_timeout())
    from fsspec.implementations.local import LocalFileSystem

    return LocalFileSystem(auto_mkdir=True)


def _request_timeout() -> Any:
    """Per-attempt bounds for gcsfs: aiohttp's default is 5 minutes for a whole request.

    No bound on the total: a large file may take long; only a silent server is cut off.
    """
    import aiohttp

    stall = float(os.environ.get(STALL_TIMEOUT_ENV) or GCS_STALL_TIMEOUT)
    return aiohttp.ClientTimeout(total=None, sock_connect=GCS_CONNECT_TIMEOUT,
                                 sock_read=stall)


def _same(src: _Side, src_info: dict, dst: _Side, dst_info: dict) -> bool:
    """Same size and same checksum; GCS reports md5 (or only crc32c for composites)."""
    if int(src_info["size"]) != int(dst_info["size"]):
        return False
    for kind in ("md5Hash", "crc32c"):
        ours, theirs = _checksum(src, src_info, kind), _checksum(dst, dst_info, kind)
        if ours is not None and theirs is not None:
            return ours == theirs
    return False


def _checksum(side: _Side, info: dict, kind: str) -> str | None:
    if side.is_gcs:
        return info.get(kind)
    return local_checksum(info["name"], kind)


def local_checksum(path: str, kind: str) -> str | None:
    """Base64 digest of a local file, as GCS spells it (md5Hash / big-endian crc32c)."""
    if kind == "md5Hash":
        digest: Any = hashlib.md5(usedforsecurity=False)
    else:
        try:
            import google_crc32c
        except ImportError:
            return None
        digest = google_crc32c.Checksum()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_HASH_BLOCK), b""):
            digest.update(block)
    return base64.b64encode(digest.digest()).decode("ascii")


def _copy_files(src: _Side, dst: _Side, pairs: list[tuple[str, str]], workers: int,
                progress: bool, label: str) -> None:
    callback = _progress_callback(progress, label)
    sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
    if src.is_gcs:
        for target in targets:
            os.makedirs(os.path.dirname(target), exist_ok=True)
        src.fs.get(sources, targets, callback=callback, batch_size=workers)
    else:
        dst.fs.put(sources, targets, callback=callback, batch_size=workers)
    if dst.is_gcs:
        dst.fs.invalidate_cache(dst.path)


def _progress_callback(progress: bool, label: str) -> Any:
    from fsspec.callbacks import NoOpCallback, TqdmCallback

    if not progress:
        return NoOpCallback()
    return TqdmCallback(tqdm_kwargs={"desc": label, "unit": "file"})


# --------------------------------------------------------- original-Fenwicks compatibility
# `upload_to_gcs` and `unzip` (from fenwicks.archives, which checks every member before it
# writes) keep the original Fenwicks names and arguments.


def upload_to_gcs(local_path: str, gcs_path: str) -> list[str]:
    """The original Fenwicks call: copies a local file to the full path ``gcs_path``,
    skipping it if that exists. New code: ``fw.io.upload(local_path, remote_dir)``.

    Args:
        local_path: the local file to copy.
        gcs_path: the full destination path, ``gs://bucket/.../name`` (a local path
            works too).

    Returns:
        The paths written (empty if ``gcs_path`` already existed).

    Examples:
        >>> fw.io.upload_to_gcs('./data/train.tfrec', 'gs://bucket/data/train.tfrec')
    """
    if exists(gcs_path):
        return []
    if os.path.basename(local_path.rstrip("/")) == posixpath.basename(gcs_path.rstrip("/")):
        return upload(local_path, _dirname(gcs_path.rstrip("/")), progress=False)
    return copy(local_path, gcs_path)
