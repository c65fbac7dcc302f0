"""Export folders: what Fenwicks may replace, and replacing it whole.

An export goes to a folder of its own. Fenwicks marks each export it writes with
``fenwicks_export.json``; a later export replaces a folder only when it is empty or is
such an export holding nothing else, so a user's files are never deleted (TensorFlow's
own ``tf.saved_model.save`` likewise leaves unrelated files alone). The new export is
written into a hidden folder beside the target and swapped in only when complete, so a
failed export leaves the previous one loadable. Engine-neutral: each engine's writer is
a callable ``write(folder)``, and both serve the outputs `serving_outputs` names.

    export_dirs.write('/tmp/model', lambda folder: tf.saved_model.save(module, folder))
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf  # tf.io.gfile: local and gs:// alike (storage, not training)

from fenwicks import _deadline, _removal
from fenwicks._text import first_line

MARKER = "fenwicks_export.json"
# What an export of ours holds: a SavedModel, the marker, BestExporter's best.json.
_OWN_ENTRIES = frozenset({"saved_model.pb", "variables", "assets", "fingerprint.pb",
                          "keras_metadata.pb", MARKER, "best.json"})


class ExportError(OSError):
    """A SavedModel export failed (a full disk, storage errors); nothing partial is left."""


def write(export_dir: str, write_saved_model: Callable[[str], object],
          extra_files: Mapping[str, str] | None = None, *,
          existed: bool | None = None) -> str:
    """Writes an export to `export_dir` with `write_saved_model(folder)`, whole or not at
    all, after checking that `export_dir` is new, empty or an earlier export of ours.

    Args:
        existed: what `check(export_dir)` returned, if the caller checked already
            (before its own work); None checks here.

    Raises:
        ValueError: `export_dir` holds files Fenwicks did not write (before any work).
        ExportError: the writer or storage failed; the previous export is untouched.
    """
    if existed is None:
        existed = check(export_dir)
    staging = _staging_name(export_dir)
    try:
        _deadline.run(write_saved_model, staging, what="SavedModel export", path=export_dir)
        for name, text in {**(extra_files or {}), MARKER: _marker_text()}.items():
            with tf.io.gfile.GFile(f"{staging}/{name}", "w") as f:
                f.write(text)
    except _deadline.StorageTimeoutError:
        raise  # storage stopped answering: cleaning up would hang as well
    except (tf.errors.OpError, OSError) as err:
        _remove_quietly(staging)
        kept = (f"; the previous export in {export_dir} is untouched" if existed
                else "; the partial folder was removed")
        raise ExportError(
            f"could not export the SavedModel to {export_dir}: {first_line(err)}{kept}. "
            "Free space there (or pick another export_dir) and call export_saved_model "
            "again; the checkpoints in work_dir are untouched") from err
    except BaseException:
        _remove_quietly(staging)
        raise
    _swap_in(staging, export_dir)
    return export_dir


def check(export_dir: str) -> bool:
    """Whether `export_dir` exists; raises if it holds anything Fenwicks did not write.

    Raises:
        ValueError: `export_dir` is a file, or holds files of someone else's.
    """
    entries = _deadline.run(_entries, export_dir, what="SavedModel export", path=export_dir)
    if not entries:
        return entries is not None
    foreign = [name for name in entries if name not in _OWN_ENTRIES]
    if MARKER not in entries or foreign:
        shown = ", ".join((foreign or entries)[:5]) + (", ..." if len(foreign or entries) > 5
                                                       else "")
        whose = ("an earlier Fenwicks export that now also holds" if MARKER in entries
                 else "a folder Fenwicks did not write, holding")
        raise ValueError(
            f"export_dir={export_dir!r} is {whose} {shown}; export_saved_model replaces "
            "only its own exports and never deletes other files. Pass a new or empty "
            f"folder (e.g. {export_dir.rstrip('/')}/model) or move those files away")
    return True


def serving_outputs(predictions: Any) -> dict[str, tf.Tensor]:
    """Serving signatures return dicts; a single tensor becomes {'predictions': ...}."""
    if isinstance(predictions, dict):
        return dict(predictions)
    if isinstance(predictions, (tuple, list)):
        return {f"output_{i}": p for i, p in enumerate(predictions)}
    return {"predictions": predictions}


def _entries(export_dir: str) -> list[str] | None:
    """The names in folder `export_dir`, or None if it does not exist."""
    if not tf.io.gfile.exists(export_dir):
        return None
    if not tf.io.gfile.isdir(export_dir):
        raise ValueError(f"export_dir={export_dir!r} is a file; pass a folder for the "
                         "SavedModel, e.g. a new sub-folder of work_dir")
    return sorted(name.rstrip("/") for name in tf.io.gfile.listdir(export_dir))


def _staging_name(export_dir: str) -> str:
    """A new hidden folder beside `export_dir` (same disk: the swap is a rename)."""
    parent, name = os.path.split(export_dir.rstrip("/"))
    if "://" in export_dir:
        return f"{parent}/.{name}.fenwicks-new-{secrets.token_hex(4)}"
    os.makedirs(parent or ".", exist_ok=True)
    return tempfile.mkdtemp(prefix=f".{name}.fenwicks-new-", dir=parent or ".")


def _swap_in(staging: str, target: str) -> None:
    """Puts the complete export `staging` in place of `target` (absent, empty or ours).

    Locally by two renames; the old export is removed only after the new one is in
    place. On ``gs://``, which has no folder rename, object by object: every new object
    is copied over (the marker last), then objects of the old export that the new one
    lacks are deleted, then the staging copy.
    """
    if "://" not in target:
        old = None
        if os.path.exists(target):
            old = f"{staging}.old"
            os.rename(target, old)
        os.rename(staging, target)
        if old:
            _removal.remove_tree(old)
        return
    new = _relative_files(staging)
    for name in sorted(new, key=lambda n: n == MARKER):
        tf.io.gfile.makedirs(f"{target}/{name}".rsplit("/", 1)[0])
        tf.io.gfile.copy(f"{staging}/{name}", f"{target}/{name}", overwrite=True)
    for name in _relative_files(target) - new:
        _removal.remove_file(f"{target}/{name}")
    _removal.remove_tree(staging)


def _relative_files(directory: str) -> set[str]:
    if not tf.io.gfile.exists(directory):
        return set()
    found = set()
    for root, _, files in tf.io.gfile.walk(directory):
        prefix = root[len(directory):].strip("/")
        found.update(f"{prefix}/{f}" if prefix else f for f in files)
    return found


def _marker_text() -> str:
    return json.dumps({"written_by": "fenwicks", "format": "SavedModel"})


def _remove_quietly(folder: str) -> None:
    with contextlib.suppress(tf.errors.OpError, OSError):
        if tf.io.gfile.exists(folder):
            _removal.remove_tree(folder)
