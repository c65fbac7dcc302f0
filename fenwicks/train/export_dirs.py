"""Export folders: versioned, made visible only when complete, never replacing anything.

As TensorFlow Estimator and TF Serving do, an export goes to a new version folder
``<export_dir_base>/<version>/`` (the Unix time in seconds, or one more than the newest
version there) and its path is returned. Locally the SavedModel is written into a
hidden ``.tmp-*`` folder inside `export_dir_base` and renamed to its version as the last
step. On ``gs://``, which has no rename, it is written in place and its manifest
(``fenwicks_manifest.json``: every file, its size, its SHA-256) is written last: a
version without one is incomplete, and `latest_export` skips it. Nothing that exists is
replaced or deleted, so a user's file anywhere in `export_dir_base` is safe; only
`remove_old_versions` (BestExporter's keep-N) removes versions, those its manifest
proves unchanged. Engine-neutral: each engine's writer is a callable ``write(folder)``.

    version = export_dirs.write('/tmp/model', lambda d: tf.saved_model.save(module, d))
    # '/tmp/model/1764340000'
"""

from __future__ import annotations

import errno
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf  # tf.io.gfile: local and gs:// alike (storage, not training)

from fenwicks import _deadline, _removal
from fenwicks._text import first_line

logger = logging.getLogger("fenwicks")

MANIFEST = _removal.MANIFEST
LEGACY_MARKER = "fenwicks_export.json"  # exports before versions: the folder itself
_STAGING_PREFIX = ".tmp-"  # TF Serving loads only numeric folders; this one is skipped


class ExportError(OSError):
    """A SavedModel export failed (a full disk, storage errors); nothing partial is left."""


def write(export_dir_base: str, write_saved_model: Callable[[str], object],
          extra_files: Mapping[str, str] | None = None,
          manifest_extra: Mapping[str, Any] | None = None) -> str:
    """Writes a new version ``<export_dir_base>/<version>`` with `write_saved_model(folder)`
    and `extra_files` ({name: text}), whole or not at all; returns its path.

    Raises:
        ValueError: `export_dir_base` is a file or lies under one (before any work).
        ExportError: the writer or storage failed; nothing that existed was touched.
    """
    base = export_dir_base.rstrip("/") or "/"
    made = _deadline.run(_make_base, base, what="SavedModel export", path=base)
    remote = "://" in base
    folder = _deadline.run(_fresh_version, base, what="SavedModel export",
                           path=base) if remote else tempfile.mkdtemp(
        prefix=f"{_STAGING_PREFIX}{int(time.time())}-", dir=base)
    try:
        _deadline.run(write_saved_model, folder, what="SavedModel export", path=base)
        _deadline.run(_finish, folder, extra_files or {}, dict(manifest_extra or {}),
                      what="SavedModel export", path=base)
        return folder if remote else _deadline.run(_rename_into_place, folder, base,
                                                   what="SavedModel export", path=base)
    except _deadline.StorageTimeoutError:
        raise  # storage stopped answering: cleaning up would hang as well
    except (tf.errors.OpError, OSError) as err:
        _removal.remove_tree(folder, ignore_errors=True)  # made by this call, just now
        for created in made:  # the folders made for it, if still empty (deepest first)
            _removal.remove_empty_dir(created)
        raise ExportError(
            f"could not export the SavedModel to {base}: {first_line(err)}; the partial "
            "version was removed and earlier exports there are untouched. Free space "
            "there (or pick another export_dir) and call export_saved_model again; the "
            "checkpoints in work_dir are untouched") from err
    except BaseException:
        _removal.remove_tree(folder, ignore_errors=True)
        raise


def check_base(export_dir_base: str) -> None:
    """Raises, before any work, if no version folder can be made in `export_dir_base`.

    Raises:
        ValueError: it is a file, or a file stands where one of its folders would be.
    """
    _deadline.run(_check_base, export_dir_base.rstrip("/") or "/",
                  what="SavedModel export", path=export_dir_base)


def latest_export(export_dir_base: str) -> str:
    """The path of the newest complete export in `export_dir_base`.

    A version folder counts once its manifest is written (the last step of an export);
    a folder an export wrote before versions existed (a SavedModel directly in
    `export_dir_base`, marked by ``fenwicks_export.json``) is read as it is.

    Args:
        export_dir_base: the folder given to ``export_saved_model`` (local or gs://).

    Returns:
        ``<export_dir_base>/<version>``, or `export_dir_base` itself for an older export.

    Raises:
        FileNotFoundError: it holds no complete export.

    Examples:
        >>> import tempfile
        >>> from fenwicks.train.export_dirs import write
        >>> module = tf.Module()   # est.export_saved_model(base) writes a version so
        >>> module.double = tf.function(lambda x: 2 * x,
        ...                             input_signature=[tf.TensorSpec([None], tf.float32)])
        >>> base = tempfile.mkdtemp()
        >>> first = write(base, lambda folder: tf.saved_model.save(module, folder))
        >>> second = write(base, lambda folder: tf.saved_model.save(module, folder))
        >>> fw.train.latest_export(base) == second != first
        True
        >>> served = tf.saved_model.load(fw.train.latest_export(base))
        >>> served.double(tf.constant([1.0, 2.0])).numpy()
        array([2., 4.], dtype=float32)
    """
    base = str(export_dir_base).rstrip("/") or "/"
    found = _deadline.run(_latest, base, what="reading exports", path=base)
    if found is None:
        raise FileNotFoundError(
            f"export_dir_base={base!r} holds no complete export (a version folder with "
            f"{MANIFEST}, or a SavedModel); export there with est.export_saved_model"
            f"({base!r}) first, or pass the folder you exported to")
    return found


def versions(export_dir_base: str) -> list[str]:
    """The complete version folders in `export_dir_base`, oldest first."""
    base = export_dir_base.rstrip("/")
    return [f"{base}/{v}" for v in _numbers(base)
            if _removal.read_manifest(f"{base}/{v}") is not None]


def remove_old_versions(export_dir_base: str, keep: int, writer: str,
                        warned: set[str]) -> list[str]:
    """Removes the versions `writer` wrote (its name in their manifest) beyond the newest
    `keep`, each only if it holds exactly the files its manifest lists, unchanged; any
    other is left in place with one warning (once per folder, via `warned`).

    Returns:
        The version folders removed.
    """
    base = export_dir_base.rstrip("/")
    ours = [v for v in versions(base)
            if (_removal.read_manifest(v) or {}).get("writer") == writer]
    removed = []
    for version in ours[:max(0, len(ours) - keep)]:
        problems = _deadline.run(_removal.remove_by_manifest, version,
                                 what="removing an old export", path=version)
        if not problems:
            removed.append(version)
        elif version not in warned:
            warned.add(version)
            more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
            logger.warning(
                "fenwicks: %s left %s in place: it holds %s%s, and it removes only "
                "exports exactly as it wrote them; delete that folder yourself once it is "
                "not needed", writer, version, problems[0], more)
    return removed


def serving_outputs(predictions: Any) -> dict[str, tf.Tensor]:
    """Serving signatures return dicts; a single tensor becomes {'predictions': ...}."""
    if isinstance(predictions, dict):
        return dict(predictions)
    if isinstance(predictions, (tuple, list)):
        return {f"output_{i}": p for i, p in enumerate(predictions)}
    return {"predictions": predictions}


# --------------------------------------------------------------------------- helpers


def _check_base(base: str) -> None:
    if tf.io.gfile.exists(base):
        if not tf.io.gfile.isdir(base):
            raise ValueError(
                f"export_dir_base={base!r} is a file; exports go to version folders inside a "
                f"folder. Pass a folder, e.g. {_beside(base)}")
        return
    if "://" in base:
        return  # gs:// has no folders a file could block (a prefix is not a file)
    parent = os.path.dirname(os.path.abspath(base))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(
            f"export_dir_base={base!r} lies under {parent!r}, which is a file, so no folder "
            f"can be made there; pass a folder path elsewhere, e.g. {_beside(parent)}")


def _beside(path: str) -> str:
    return f"{path.rstrip('/')}_export" if path not in ("", ".", "/") else "'./export'"


def _make_base(base: str) -> list[str]:
    """Makes local folder `base`; the folders it made, deepest first."""
    _check_base(base)
    if os.path.islink(base) and "://" not in base:
        logger.info("fenwicks: export_dir_base=%r is a symlink to %r; the new version goes "
                    "into that folder", base, os.path.realpath(base))
    if "://" in base:
        return []  # object storage: a version's objects need no folder made first
    made, missing = [], os.path.abspath(base)
    while not os.path.exists(missing):
        made.append(missing)
        missing = os.path.dirname(missing)
    try:
        os.makedirs(base, exist_ok=True)
        return made
    except OSError as err:
        raise ValueError(f"export_dir_base={base!r} cannot be created ({first_line(err)}); "
                         "pass a folder you can write to") from err


def _numbers(base: str) -> list[int]:
    """The numeric entries of `base` (its versions, complete or not), ascending."""
    if not tf.io.gfile.isdir(base):
        return []
    names = (name.rstrip("/") for name in tf.io.gfile.listdir(base))
    return sorted(int(name) for name in names if name.isdigit())


def _fresh_version(base: str) -> str:
    """A version folder name that does not exist yet: now, or after the newest."""
    numbers = _numbers(base)
    version = max(int(time.time()), numbers[-1] + 1 if numbers else 0)
    while tf.io.gfile.exists(f"{base}/{version}"):
        version += 1
    return f"{base}/{version}"


def _finish(folder: str, extra_files: Mapping[str, str], manifest_extra: dict) -> None:
    for name, text in extra_files.items():
        with tf.io.gfile.GFile(f"{folder}/{name}", "w") as f:
            f.write(text)
    _removal.write_manifest(folder, {"format": "SavedModel", **manifest_extra})


def _rename_into_place(staging: str, base: str) -> str:
    """Renames the complete `staging` to a version that does not exist; never over one
    (a rename replaces an empty folder, so an existing name is skipped, not taken)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(staging, 0o777 & ~mask)  # mkdtemp's 0o700 would hide it from a server
    while True:
        target = _fresh_version(base)
        try:
            os.rename(staging, target)
            return target
        except OSError as err:  # another export took that version meanwhile
            if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise


def _latest(base: str) -> str | None:
    complete = versions(base)
    if complete:
        return complete[-1]
    for name in ("saved_model.pb", "saved_model.pbtxt"):
        if tf.io.gfile.exists(f"{base}/{name}"):
            return base  # an export written before versions (fenwicks_export.json)
    return None
