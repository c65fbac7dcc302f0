"""One training process per work_dir: a lock file that works on local disk and ``gs://``.

Two notebooks training into one work_dir would interleave their checkpoints: each
resumes from the other's files and overwrites them. `Estimator.train` holds
``<work_dir>/fenwicks.lock`` while it runs; a second process gets `WorkDirLockedError`
naming the holder (host, pid, since when). Evaluating and predicting only read, so they
take no lock.

A lock left by a run that was killed does not block for ever: on the same host it is
stale once its process is gone; from another host, once its heartbeat (refreshed while
training, at most every `HEARTBEAT_SECS`) is older than `STALE_SECS`. A lock this very
process left behind (its release failed during a storage outage, or the estimator that
held it was garbage-collected, as when a notebook cell makes a new one) is taken over
with a warning; one still held by a live object of this process is refused.

On local disk the lock is created atomically (``O_EXCL``). Through ``tf.io.gfile``,
``gs://`` has no create-if-absent, so the lock is written and read back after a pause;
two processes starting within the same fraction of a second could both see their own
token only if the bucket reordered their writes, which GCS's strong read-after-write
consistency rules out for the read that follows the second write.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
import weakref
from typing import Any

import tensorflow as tf

from fenwicks import _removal

logger = logging.getLogger("fenwicks")

LOCK_NAME = "fenwicks.lock"
HEARTBEAT_SECS = 60.0
STALE_SECS = 600.0
_REMOTE_SETTLE_SECS = 0.5
# token -> the lock of this process holding it; a token missing here was let go
_held_here: weakref.WeakValueDictionary[str, WorkDirLock] = weakref.WeakValueDictionary()


class WorkDirLockedError(RuntimeError):
    """Another process is training in this work_dir."""


class WorkDirLostError(FileNotFoundError):
    """The work_dir (its lock, at least) was deleted by someone else while training."""

    folder_gone = True  # False: only the lock file was deleted


class WorkDirNotWritableError(PermissionError):
    """Training needs to write in work_dir, and it is read-only (or not ours)."""


def lost_message(work_dir: str, lock_path: str, folder_gone: bool, *,
                 in_flight: int | None = None, landed: str | None = None) -> str:
    """The one sentence of `WorkDirLostError`. `in_flight`: the step being written in the
    background when the folder went, if any; `landed`: where that write still put it
    (None: it failed, nothing of it is there)."""
    gone = ", and so is the folder" if folder_gone else ""
    lost = "the checkpoints saved there, the epoch log epochs.jsonl and the TensorBoard logs"
    keep = "The model in memory is intact: keep it with export_saved_model(...) now"
    start = (f"work_dir={work_dir!r} was deleted while training (its lock {lock_path} is "
             f"gone{gone}): ")
    end = "; if a script cleans that folder, let it finish first"
    if landed is not None:
        return (f"{start}{lost} went with it, but step {in_flight}, being written in the "
                f"background as the folder went, was saved after it: {landed} is all the "
                f"work_dir holds now, and a new train or evaluate resumes from it. Training "
                f"stopped there. {keep}{end}")
    also = (f", and so did step {in_flight}, being written in the background as the "
            "folder went" if in_flight is not None else "")
    return (f"{start}{lost} went with it{also}. Training stopped instead of recreating the "
            f"folder. {keep} (a new train or evaluate on this work_dir starts afresh, as "
            f"it is empty){end}")


class WorkDirLock:
    """The lock of one work_dir; `acquire` before writing checkpoints, `release` after.

    Examples:
        >>> import os, tempfile
        >>> work_dir = tempfile.mkdtemp()
        >>> lock = WorkDirLock(work_dir)
        >>> lock.acquire()
        >>> WorkDirLock(work_dir).acquire()   # a second estimator on the same work_dir
        Traceback (most recent call last):
        ...
        fenwicks.train.lock.WorkDirLockedError: work_dir=... is in use by another
        estimator in this process, ...
        >>> lock.release()
        >>> os.path.exists(lock.path)
        False
    """

    def __init__(self, work_dir: str) -> None:
        self.path = f"{work_dir}/{LOCK_NAME}"
        self._work_dir = work_dir
        self._token = uuid.uuid4().hex
        self._held = False
        self._last_beat = 0.0

    @property
    def remote(self) -> bool:
        return "://" in self.path

    def acquire(self) -> None:
        """Takes the lock, or raises `WorkDirLockedError` naming the live holder."""
        if self._held:
            return
        try:
            tf.io.gfile.makedirs(self._work_dir)
        except (OSError, tf.errors.PermissionDeniedError) as err:
            raise WorkDirNotWritableError(_not_writable(self._work_dir, err)) from None
        holder = self._read()
        if holder is not None and holder.get("token") != self._token:
            self._take_over(holder)
        self._create()
        self._held = True
        _held_here[self._token] = self

    def _take_over(self, holder: dict[str, Any]) -> None:
        """Removes a lock nobody holds any more, or raises naming its live holder."""
        if _this_process(holder) and holder.get("token") not in _held_here:
            logger.warning("fenwicks: taking over the lock this process left in %s (an "
                           "earlier estimator here did not release it: its release failed "
                           "or it was garbage-collected)", self._work_dir)
        elif _is_stale(holder):
            logger.warning("fenwicks: taking over the stale lock of %s (pid %s on %s, last "
                           "seen %s)", self._work_dir, holder.get("pid"), holder.get("host"),
                           _ago(holder))
        else:
            raise WorkDirLockedError(_locked_message(self._work_dir, holder))
        self._remove()

    def heartbeat(self) -> None:
        """Refreshes the lock's timestamp (at most every `HEARTBEAT_SECS`).

        Raises:
            WorkDirLostError: the lock file is gone (checked on every call on local disk,
                at each beat on ``gs://``, where a check is a request).
        """
        beat = self._held and time.time() - self._last_beat >= HEARTBEAT_SECS
        if beat or not self.remote:
            self.check()
        if beat:
            self._write(self._record())

    def check(self) -> None:
        """Raises `WorkDirLostError` if this held lock's file was deleted meanwhile.

        Training never recreates a work_dir deleted under it: the next save would start
        a new folder, and the loss of the old one's checkpoints and history would go
        unnoticed.
        """
        if self._held and not tf.io.gfile.exists(self.path):
            folder_gone = not tf.io.gfile.exists(self._work_dir)
            error = WorkDirLostError(lost_message(self._work_dir, self.path, folder_gone))
            error.folder_gone = folder_gone
            raise error

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        _held_here.pop(self._token, None)
        holder = self._read()
        if holder is not None and holder.get("token") == self._token:
            self._remove()

    # ---------------------------------------------------------------- files

    def _record(self) -> dict[str, Any]:
        self._last_beat = time.time()
        return {"host": socket.gethostname(), "pid": os.getpid(), "token": self._token,
                "started": getattr(self, "_started", self._last_beat),
                "heartbeat": self._last_beat}

    def _create(self) -> None:
        record = self._record()
        self._started = record["started"]
        if not self.remote:
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                raise WorkDirLockedError(
                    _locked_message(self._work_dir, self._read() or {})) from None
            except OSError as err:  # read-only, another user's, full
                raise WorkDirNotWritableError(_not_writable(self._work_dir, err)) from None
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(record, f)
            except OSError as err:  # a full disk: O_CREAT worked, the write did not
                _removal.remove_file(self.path)  # an empty lock would block nobody, and mislead
                raise WorkDirNotWritableError(_write_failed(self.path, err)) from None
            return
        try:
            self._write(record)
        except tf.errors.PermissionDeniedError as err:
            raise WorkDirNotWritableError(_not_writable(self._work_dir, err)) from None
        time.sleep(_REMOTE_SETTLE_SECS)  # let a concurrent writer's object land first
        holder = self._read()
        if holder is None or holder.get("token") != self._token:
            raise WorkDirLockedError(_locked_message(self._work_dir, holder or {}))

    def _write(self, record: dict[str, Any]) -> None:
        if self.remote:
            with tf.io.gfile.GFile(self.path, "w") as f:
                f.write(json.dumps(record))
            return
        tmp = f"{self.path}.{self._token}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, self.path)  # atomic: a reader never sees half a lock

    def _read(self) -> dict[str, Any] | None:
        try:
            with tf.io.gfile.GFile(self.path) as f:
                return json.loads(f.read())
        except tf.errors.NotFoundError:
            return None
        except (ValueError, tf.errors.OpError):
            return {"host": "?", "pid": None, "heartbeat": 0.0}  # unreadable: stale

    def _remove(self) -> None:
        _removal.remove_file(self.path)


def _this_process(holder: dict[str, Any]) -> bool:
    return holder.get("host") == socket.gethostname() and holder.get("pid") == os.getpid()


def _is_stale(holder: dict[str, Any]) -> bool:
    pid = holder.get("pid")
    if holder.get("host") == socket.gethostname() and isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False  # alive, another user's
        return False
    return time.time() - float(holder.get("heartbeat") or 0.0) > STALE_SECS


def _ago(holder: dict[str, Any]) -> str:
    seconds = time.time() - float(holder.get("heartbeat") or 0.0)
    return f"{seconds:.0f} s ago"


def _locked_message(work_dir: str, holder: dict[str, Any]) -> str:
    if _this_process(holder):
        return (f"work_dir={work_dir!r} is in use by another estimator in this process, "
                "which is training there. Two runs would interleave their checkpoints. "
                "Use that estimator, or close() it (or delete it) before making a new one")
    return (f"work_dir={work_dir!r} is in use: pid {holder.get('pid')} on host "
            f"{holder.get('host')!r} is training there (lock heartbeat {_ago(holder)}). Two "
            "runs would interleave their checkpoints. Use another work_dir, or wait for it "
            f"to finish; if that run is gone, its lock goes stale after {STALE_SECS:.0f} s "
            f"(at once on the same host), or delete {work_dir}/{LOCK_NAME}")


def _write_failed(path: str, err: OSError) -> str:
    return (f"could not write the work_dir lock {path} ({err.strerror or err}), before "
            "training wrote anything. Free space on that disk (`df -h` shows it), or use "
            "a work_dir on a disk with room for the checkpoints; nothing saved there was "
            "changed")


def _not_writable(work_dir: str, err: BaseException) -> str:
    reason = getattr(err, "strerror", None) or getattr(err, "message", None) or str(err)
    return (f"work_dir={work_dir!r} is not writable ({reason.splitlines()[0]}), and "
            "training writes its checkpoints there. evaluate, predict and "
            "export_saved_model work on it as it is; to train on, copy it to a writable "
            "folder and train there, or start a new work_dir with warm_start_from=it")
