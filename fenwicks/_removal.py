"""The one module of Fenwicks that deletes files: only what it can prove it wrote.

Every removal in the package goes through here (a test greps for ``rmtree``, ``remove``,
``unlink``, ``rmdir`` elsewhere), so what Fenwicks may delete is decided in one place:

- `remove_file`, `remove_tree`, `remove_empty_dir`, `temporary_dir`,
  `remove_tree_at_exit`: a path the caller itself just wrote (a staging folder, a scratch
  copy, a temporary shard, its lock, a checkpoint its manager rotates out). Local or
  ``gs://``; a local symlink is removed as a link, never followed.
- `write_manifest` / `manifest_mismatches` / `remove_by_manifest`: a folder Fenwicks
  wrote and listed (every file, its size, its SHA-256) in ``fenwicks_manifest.json``;
  it is removed only if it holds exactly those files, unchanged.
- `classify_work_dir` / `remove_own_work_files`: what Fenwicks writes in a work_dir
  (`WORK_DIR_PATTERNS`: checkpoints, run records, event files, the lock, folders listed
  by a manifest such as exports); anything else is foreign and never removed here.

Examples:
    >>> import os, tempfile
    >>> work_dir = tempfile.mkdtemp()
    >>> for name in ('fenwicks.lock', 'ckpt-1.index', 'notes.txt'):
    ...     open(os.path.join(work_dir, name), 'w').close()
    >>> classify_work_dir(work_dir)   # (own, foreign)
    (['ckpt-1.index', 'fenwicks.lock'], ['notes.txt'])
    >>> remove_own_work_files(work_dir)   # what is left
    ['notes.txt']
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

MANIFEST = "fenwicks_manifest.json"
RUN_RECORD = "fenwicks_*.json"  # what every run writes in its work_dir (input record...)
_CHUNK = 1 << 20  # bytes read at a time for a checksum

# What Fenwicks writes in a work_dir, as paths relative to it: '/'-separated, each part
# an fnmatch pattern of one name, and a last part '**' for anything below. Each line
# names its writer; a new writer adds its names here.
WORK_DIR_PATTERNS = (
    # Before the run format (read by tf/legacy_reader.py and jax/checkpoints.py, which
    # still set damaged ones aside): the TensorFlow engine's state file, its checkpoints
    # (.index, .data-*, .corrupt, *.tempstate*), a non-chief worker's scratch checkpoint,
    # and the JAX engine's orbax step folders with their tmp and .corrupt.
    "checkpoint", "checkpoint.tmp*",
    "ckpt-*",
    ".worker-*/**",
    "orbax/[0-9]*/**",
    "checkpoints/[0-9]*/**",  # train/run_format.py: the run format's steps, tmp, .corrupt
    "fenwicks_*.json", "fenwicks_*.json.*",  # run records (input, optimizer, run format)
    "fenwicks.lock", "fenwicks.lock.*.tmp",  # train/lock.py
    "epochs.jsonl", "epochs.jsonl.tmp",  # train/history.py
    "events.out.tfevents.*",  # TensorBoard, and Keras's TensorBoard callback
    "train/events.out.tfevents.*", "eval/events.out.tfevents.*",  # run_state summaries
    "train/plugins/profile/**",  # train(profile_steps=...): both engines' profilers
    MANIFEST,
)


def is_gcs(path: str) -> bool:
    return str(path).startswith("gs://")


def _gfile():
    import tensorflow as tf  # tf.io.gfile: gs:// (storage, not training)

    return tf.io.gfile


# --------------------------------------------------------------------------- primitives


def remove_file(path: str, *, missing_ok: bool = True) -> bool:
    """Removes file (or symlink) `path`, which the caller wrote; whether it existed.

    Examples:
        >>> import os, tempfile
        >>> lock = os.path.join(tempfile.mkdtemp(), 'fenwicks.lock')
        >>> open(lock, 'w').close()
        >>> remove_file(lock)
        True
        >>> remove_file(lock)   # gone already (the same on gs://)
        False
    """
    if is_gcs(path):
        gfile = _gfile()
        import tensorflow as tf

        try:
            gfile.remove(path)
        except tf.errors.NotFoundError:
            if not missing_ok:
                raise FileNotFoundError(f"{path} does not exist") from None
            return False
        return True
    try:
        os.remove(path)
    except FileNotFoundError:
        if not missing_ok:
            raise
        return False
    return True


def remove_tree(path: str, *, missing_ok: bool = True, ignore_errors: bool = False) -> bool:
    """Removes folder `path` and everything in it: a folder the caller made (staging,
    scratch). A local symlink is removed as a link; links inside are never followed.

    Returns:
        Whether `path` existed.

    Examples:
        >>> import os, tempfile
        >>> staging = tempfile.mkdtemp(prefix='.model.fenwicks-new-')
        >>> os.makedirs(os.path.join(staging, 'variables'))
        >>> remove_tree(staging), os.path.exists(staging)
        (True, False)
        >>> remove_tree(staging)   # gone already (the same on gs://)
        False
    """
    try:
        if is_gcs(path):
            gfile = _gfile()
            if not gfile.exists(path):
                if missing_ok:
                    return False
                raise FileNotFoundError(f"{path} does not exist")
            gfile.rmtree(path)
            return True
        if os.path.islink(path):
            os.unlink(path)
            return True
        if not os.path.lexists(path):
            if missing_ok:
                return False
            raise FileNotFoundError(f"{path} does not exist")
        shutil.rmtree(path)
        return True
    except Exception:
        if ignore_errors:
            return False
        raise


def remove_empty_dir(path: str) -> bool:
    """Removes local folder `path` if it is empty; whether it did."""
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def temporary_dir(prefix: str = "fenwicks-", dir: str | None = None) -> Iterator[str]:  # noqa: A002
    """A new local folder, removed with what is in it when the block ends.

    Examples:
        >>> import os
        >>> with temporary_dir("fenwicks-warm-start-") as scratch:
        ...     open(os.path.join(scratch, 'ckpt-1.index'), 'w').close()
        ...     os.listdir(scratch)
        ['ckpt-1.index']
        >>> os.path.exists(scratch)
        False
    """
    with tempfile.TemporaryDirectory(prefix=prefix, dir=dir) as folder:
        yield folder


def remove_orbax_step(manager: Any, step: int) -> None:
    """Removes checkpoint `step` of orbax `manager` (one of Fenwicks' own work_dir steps,
    ``orbax/<step>`` or ``checkpoints/<step>``), by orbax's own deletion, which knows its
    layout."""
    manager.delete(step)


def remove_tree_at_exit(owner: Any, path: str) -> weakref.finalize:
    """Removes folder `path` (the caller's scratch) when `owner` is collected or at exit."""
    return weakref.finalize(owner, shutil.rmtree, path, True)


# --------------------------------------------------------------------------- manifests


def _join(folder: str, relative: str) -> str:
    return f"{folder.rstrip('/')}/{relative}" if is_gcs(folder) else os.path.join(
        folder, *relative.split("/"))


def _files(folder: str) -> list[str]:
    """Every file (and symlink) below `folder`, relative with '/', sorted; empty if none."""
    found = []
    if is_gcs(folder):
        gfile = _gfile()
        if not gfile.isdir(folder):
            return []
        for root, _, files in gfile.walk(folder):
            prefix = root[len(folder.rstrip("/")):].strip("/")
            found += [f"{prefix}/{f}".lstrip("/") for f in files]
        return sorted(found)
    for root, dirs, files in os.walk(folder):
        prefix = os.path.relpath(root, folder).replace(os.sep, "/")
        prefix = "" if prefix == "." else prefix + "/"
        links = [d for d in dirs if os.path.islink(os.path.join(root, d))]
        dirs[:] = [d for d in dirs if d not in links]  # a linked folder is one entry
        found += [prefix + name for name in (*files, *links)]
    return sorted(found)


def _size(path: str) -> int:
    if is_gcs(path):
        return _gfile().stat(path).length
    return os.lstat(path).st_size


def checksum(path: str) -> str:
    """The SHA-256 of file `path` (local or ``gs://``), as hex."""
    digest = hashlib.sha256()
    if is_gcs(path):
        with _gfile().GFile(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    else:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def manifest_text(folder: str, extra: Mapping[str, Any] | None = None) -> str:
    """The manifest of every file now in `folder`: ``{"files": {relative: {"size",
    "sha256"}}, ...extra}``, as JSON. The manifest file itself is not listed."""
    files = {}
    for relative in _files(folder):
        if relative == MANIFEST:
            continue
        path = _join(folder, relative)
        files[relative] = {"size": _size(path), "sha256": checksum(path)}
    return json.dumps({"written_by": "fenwicks", **(extra or {}), "files": files},
                      indent=1, sort_keys=True)


def write_manifest(folder: str, extra: Mapping[str, Any] | None = None) -> str:
    """Writes ``fenwicks_manifest.json`` into `folder` listing every file in it; its path.

    Examples:
        >>> import json, os, tempfile
        >>> export = tempfile.mkdtemp()
        >>> with open(os.path.join(export, 'saved_model.pb'), 'w') as f:
        ...     _ = f.write('model')
        >>> path = write_manifest(export)
        >>> os.path.basename(path)
        'fenwicks_manifest.json'
        >>> json.load(open(path))['files']['saved_model.pb']['size']
        5
    """
    text = manifest_text(folder, extra)
    path = _join(folder, MANIFEST)
    if is_gcs(folder):
        with _gfile().GFile(path, "w") as f:
            f.write(text)
    else:
        with open(path, "w") as f:
            f.write(text)
    return path


def read_manifest(folder: str) -> dict[str, Any] | None:
    """The manifest in `folder`, or None if it has none or one that is not a manifest."""
    path = _join(folder, MANIFEST)
    try:
        if is_gcs(folder):
            with _gfile().GFile(path, "r") as f:
                record = json.loads(f.read())
        else:
            with open(path) as f:
                record = json.load(f)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    except Exception as err:  # tf.errors.NotFoundError and its kin, on gs://
        if type(err).__module__.startswith("tensorflow"):
            return None
        raise
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("size"), int)
            and isinstance(v.get("sha256"), str) for v in files.values()):
        return None
    return record


def manifest_mismatches(folder: str, manifest: Mapping[str, Any] | None = None) -> list[str]:
    """What in `folder` its manifest does not prove: files it does not list, listed files
    missing or changed (size, then SHA-256). Empty: the folder is exactly as written.

    Examples:
        >>> import os, tempfile
        >>> export = tempfile.mkdtemp()
        >>> open(os.path.join(export, 'saved_model.pb'), 'w').close()
        >>> _ = write_manifest(export)
        >>> manifest_mismatches(export)
        []
        >>> open(os.path.join(export, 'vocab.txt'), 'w').close()   # a user's file
        >>> manifest_mismatches(export)
        ['vocab.txt (not written by Fenwicks)']
    """
    manifest = manifest if manifest is not None else read_manifest(folder)
    present = [f for f in _files(folder) if f != MANIFEST]
    if manifest is None:
        return [f"{f} (no {MANIFEST})" for f in present] or [f"no {MANIFEST}"]
    listed = manifest["files"]
    problems = [f"{f} (not written by Fenwicks)" for f in present if f not in listed]
    for relative, entry in sorted(listed.items()):
        path = _join(folder, relative)
        if relative not in present:
            problems.append(f"{relative} (missing)")
        elif _is_link(path) or _size(path) != entry["size"]:
            problems.append(f"{relative} (changed since it was written)")
        elif checksum(path) != entry["sha256"]:
            problems.append(f"{relative} (changed since it was written)")
    return problems


def _is_link(path: str) -> bool:
    return not is_gcs(path) and os.path.islink(path)


def remove_by_manifest(folder: str) -> list[str]:
    """Removes `folder` if it holds exactly the files its manifest lists, unchanged.

    Returns:
        What stopped it (see `manifest_mismatches`); empty if the folder was removed.

    Examples:
        >>> import os, tempfile
        >>> export = tempfile.mkdtemp()
        >>> open(os.path.join(export, 'saved_model.pb'), 'w').close()
        >>> _ = write_manifest(export)
        >>> remove_by_manifest(export), os.path.exists(export)
        ([], False)
    """
    problems = manifest_mismatches(folder)
    if not problems:
        remove_tree(folder)
    return problems


# --------------------------------------------------------------------------- work_dirs


def is_own_work_file(relative: str) -> bool:
    """Whether `relative` (a path inside a work_dir, '/'-separated) is a name Fenwicks
    writes there (`WORK_DIR_PATTERNS`)."""
    return any(_matches(relative.split("/"), pattern.split("/"))
               for pattern in WORK_DIR_PATTERNS)


def _matches(parts: list[str], pattern: list[str]) -> bool:
    if pattern[-1] == "**":
        head = pattern[:-1]
        return len(parts) > len(head) and _matches(parts[:len(head)], head)
    return len(parts) == len(pattern) and all(
        fnmatch.fnmatchcase(part, want) for part, want in zip(parts, pattern, strict=True))


def classify_work_dir(work_dir: str) -> tuple[list[str], list[str]]:
    """Splits the files below `work_dir` into Fenwicks' own and foreign ones (relative
    paths, sorted). Own: a `WORK_DIR_PATTERNS` name relative to `work_dir` or to a
    folder below it that holds a run record (``fenwicks_*.json``: a nested work_dir), or
    a file that a manifest in its folder or a folder above lists with its size and
    checksum."""
    files = _files(work_dir)
    proven: set[str] = set()
    for manifest_file in [f for f in files if f.rsplit("/", 1)[-1] == MANIFEST]:
        base = manifest_file[: -len(MANIFEST)]
        folder = _join(work_dir, base.rstrip("/")) if base else work_dir
        manifest = read_manifest(folder)
        if manifest is None:
            continue
        proven.add(manifest_file)
        bad = {p.split(" (", 1)[0] for p in manifest_mismatches(folder, manifest)}
        proven.update(base + relative for relative in manifest["files"] if relative not in bad)
    # A folder below holding a run record is a work_dir too (an estimator's work_dir
    # inside another one, as tutorials nest them): the patterns apply inside it.
    roots = [""] + sorted({f.rsplit("/", 1)[0] + "/" for f in files if "/" in f
                           and fnmatch.fnmatchcase(f.rsplit("/", 1)[1], RUN_RECORD)})
    own, foreign = [], []
    for relative in files:
        mine = relative in proven or any(
            relative.startswith(root) and is_own_work_file(relative[len(root):])
            for root in roots)
        (own if mine else foreign).append(relative)
    return own, foreign


def remove_own_work_files(work_dir: str, files: Iterable[str] | None = None) -> list[str]:
    """Removes Fenwicks' own files below `work_dir` (or those of `files`, relative paths
    from `classify_work_dir`), then the folders left empty; returns what is left.

    Examples:
        >>> import os, tempfile
        >>> work_dir = tempfile.mkdtemp()
        >>> os.makedirs(os.path.join(work_dir, 'train'))
        >>> for name in ('ckpt-1.index', 'train/events.out.tfevents.1', 'notes.txt'):
        ...     open(os.path.join(work_dir, name), 'w').close()
        >>> remove_own_work_files(work_dir)   # what is left (train/ was emptied, removed)
        ['notes.txt']
    """
    own = classify_work_dir(work_dir)[0] if files is None else list(files)
    emptied = set()
    for relative in own:
        path = _join(work_dir, relative)
        if not is_gcs(path) and os.path.isdir(path) and not os.path.islink(path):
            continue  # a folder appears as a file only when it is a link
        remove_file(path)
        parts = relative.split("/")[:-1]
        emptied.update("/".join(parts[:depth]) for depth in range(1, len(parts) + 1))
    if not is_gcs(work_dir):  # the folders that held them, deepest first, if now empty
        for relative in sorted(emptied, key=lambda r: -r.count("/")):
            remove_empty_dir(_join(work_dir, relative))
    return _files(work_dir)
