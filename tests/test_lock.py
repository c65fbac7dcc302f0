"""The work_dir lock within one process: a lock this process left behind (a failed
release, a garbage-collected holder) is taken over; a live holder is refused."""

from __future__ import annotations

import gc
import logging
import os

import pytest

from fenwicks.train import lock


def _lock_file_exists(work_dir) -> bool:
    return (work_dir / lock.LOCK_NAME).exists()


def test_a_lock_whose_release_failed_is_taken_over_with_a_warning(tmp_path, caplog,
                                                                  monkeypatch):
    first = lock.WorkDirLock(str(tmp_path))
    first.acquire()
    # storage failed while releasing: the file stays, but nobody holds the lock any more
    with monkeypatch.context() as storage:
        # local paths are removed through fenwicks._removal with os.remove
        storage.setattr(os, "remove", lambda path: (_ for _ in ()).throw(OSError("gone")))
        with pytest.raises(OSError):
            first.release()
    assert _lock_file_exists(tmp_path)
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        second = lock.WorkDirLock(str(tmp_path))
        second.acquire()
    assert any("lock this process left" in r.getMessage() for r in caplog.records)
    second.release()
    assert not _lock_file_exists(tmp_path)


def test_a_garbage_collected_holders_lock_is_taken_over(tmp_path, caplog):
    first = lock.WorkDirLock(str(tmp_path))
    first.acquire()
    del first  # a notebook cell made a new estimator; the old one was never closed
    gc.collect()
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        second = lock.WorkDirLock(str(tmp_path))
        second.acquire()
    assert any("garbage-collected" in r.getMessage() for r in caplog.records)
    second.release()


def test_a_live_holder_in_this_process_is_refused_by_name(tmp_path):
    first = lock.WorkDirLock(str(tmp_path))
    first.acquire()
    try:
        with pytest.raises(lock.WorkDirLockedError,
                           match="another estimator in this process.*close"):
            lock.WorkDirLock(str(tmp_path)).acquire()
    finally:
        first.release()
    again = lock.WorkDirLock(str(tmp_path))
    again.acquire()  # released properly: free at once, no warning needed
    again.release()
