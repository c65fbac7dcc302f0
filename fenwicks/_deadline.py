"""Deadlines for ``gs://`` calls: storage that stops answering ends in an error, not a hang.

Two layers, both set here and nowhere else:

1. TensorFlow's own GCS client (``tf.io.gfile``, checkpoints, summaries, TFRecords) gets
   a per-request bound through its environment variables: `REQUEST_TIMEOUT_SECS` to
   connect and without progress, `RETRIES` retries waiting 1, 2, 4, 8, 16, 16 s. TensorFlow
   reads them once, when ``import tensorflow`` registers its ``gs`` filesystem, so
   `configure_tensorflow` runs at ``import fenwicks`` before TensorFlow is imported;
   values the user set win. (Measured on TensorFlow 2.21: set after ``import
   tensorflow`` they change nothing, so a notebook that imported TensorFlow first keeps
   TensorFlow's defaults, 10 retries over ~3.2 min per request; layer 2 still holds.)
2. Every ``gs://`` call Fenwicks makes runs through `run`: in a worker thread, waited for
   at most `deadline_secs()` (`DEADLINE_SECS`, or ``FENWICKS_GCS_DEADLINE``). Past it,
   `StorageTimeoutError`. Python cannot stop a thread blocked in TensorFlow's C++ client:
   the abandoned call goes on in the background until TensorFlow's own retries end it
   (or the server answers; a checkpoint it then completes is whole, as each save is);
   the next `run` first waits for it, so two writes never overlap.

After a storage failure, clean-up calls (``best_effort=True``: removing partial files,
flushing summaries) are skipped until a call succeeds again, and releasing the work_dir
lock gets `cleanup_secs()` (`CLEANUP_SECS`, or ``FENWICKS_GCS_CLEANUP_DEADLINE``), so the
error reaches the user within about `deadline_secs() + cleanup_secs()` of the failure
(100 s by default).

At interpreter exit, calls still abandoned get `EXIT_WAIT_SECS` to finish; then the
process says what it gave up on and exits with status `EXIT_STATUS` (75, EX_TEMPFAIL:
"try again later") rather than hanging in TensorFlow's client. Checkpoints already
saved are complete (each save is), so the next run resumes from the last of them.

Of Fenwicks this module imports only `fenwicks._text`, a leaf (fw.io and fw.train both
use it).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from fenwicks._text import first_line

logger = logging.getLogger("fenwicks")
T = TypeVar("T")

REQUEST_TIMEOUT_SECS = 20  # TensorFlow: to connect, and without a byte of progress
RETRIES = 6  # TensorFlow: retries per request, waiting 1, 2, 4, 8, 16, 16 s (47 s)
DEADLINE_SECS = 90  # one Fenwicks storage operation, every request and retry in it
CLEANUP_SECS = 10  # a clean-up call after a failure (best effort)
EXIT_WAIT_SECS = 10  # at interpreter exit, for calls abandoned at their deadline
EXIT_STATUS = 75  # EX_TEMPFAIL: exited with storage calls unfinished; try again later
DEADLINE_ENV = "FENWICKS_GCS_DEADLINE"
CLEANUP_ENV = "FENWICKS_GCS_CLEANUP_DEADLINE"  # tests shorten the clean-up bound with it
REQUEST_TIMEOUT_ENV = "FENWICKS_GCS_REQUEST_TIMEOUT"
OUTAGE_ERRORS = frozenset({"UnavailableError", "AbortedError", "DeadlineExceededError",
                           "StorageTimeoutError"})

_lock = threading.Lock()
_outage_since: float | None = None  # monotonic time of the last failure, None once healed
_running: list[threading.Thread] = []  # abandoned calls that may still be writing
_tensorflow_came_first = False  # and kept its GCS defaults: warned at the first gs:// call


class StorageTimeoutError(TimeoutError):
    """A ``gs://`` operation did not finish within its deadline (storage unreachable)."""


def deadline_secs() -> float:
    """Seconds one storage operation may take (``FENWICKS_GCS_DEADLINE``, default 90).

    Examples:
        >>> deadline_secs()
        90.0
    """
    return _positive_env(DEADLINE_ENV, DEADLINE_SECS)


def cleanup_secs() -> float:
    """Seconds a clean-up call after a failure may take (``FENWICKS_GCS_CLEANUP_DEADLINE``,
    default `CLEANUP_SECS`): a test hook, so an outage test need not wait 10 s for it.

    Examples:
        >>> cleanup_secs()
        10.0
    """
    return _positive_env(CLEANUP_ENV, CLEANUP_SECS)


def _positive_env(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    try:
        value = float(text) if text else float(default)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise ValueError(f"{name}={text!r} must be a positive number of seconds, e.g. "
                         f"{default}")
    return value


def tensorflow_settings() -> dict[str, str]:
    """The TensorFlow GCS variables Fenwicks sets by default (see the module doc).

    Examples:
        >>> tensorflow_settings()['GCS_RETRY_CONFIG_MAX_RETRIES']
        '6'
    """
    timeout = str(int(_positive_env(REQUEST_TIMEOUT_ENV, REQUEST_TIMEOUT_SECS)))
    return {
        "GCS_REQUEST_CONNECTION_TIMEOUT_SECS": timeout,  # TensorFlow's default: 120
        "GCS_REQUEST_IDLE_TIMEOUT_SECS": timeout,  # 60; a slow but moving upload is fine
        "GCS_METADATA_REQUEST_TIMEOUT_SECS": timeout,  # 3600 for a stat or a listing
        "GCS_RETRY_CONFIG_MAX_RETRIES": str(RETRIES),  # 10
        "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "1000000",  # 1 s
        "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "16000000",  # 32 s
    }


def configure_tensorflow() -> bool:
    """Sets `tensorflow_settings` as defaults; False if TensorFlow was imported already.

    Then TensorFlow keeps the defaults it read (unless the user had set them): the first
    ``gs://`` call says so, once (`warn_if_tensorflow_came_first`).

    Examples:
        >>> import os
        >>> configure_tensorflow()   # True at `import fenwicks` before TensorFlow
        False
        >>> os.environ['GCS_RETRY_CONFIG_MAX_RETRIES']   # unless the user had set it
        '6'
    """
    global _tensorflow_came_first
    settings = tensorflow_settings()
    imported = "tensorflow" in sys.modules
    _tensorflow_came_first = imported and any(name not in os.environ for name in settings)
    for name, value in settings.items():
        os.environ.setdefault(name, value)
    return not imported


def warn_if_tensorflow_came_first() -> None:
    """Warns, once per process, that TensorFlow's own GCS client kept its slow defaults."""
    global _tensorflow_came_first
    if not _tensorflow_came_first:
        return
    _tensorflow_came_first = False
    logger.warning(
        "fenwicks: TensorFlow was imported before Fenwicks, so TensorFlow's own gs:// "
        "client keeps its defaults (10 retries, about 3 minutes per request) instead of "
        "Fenwicks' (%d retries, %d s per request): a storage outage takes longer to end "
        "(each Fenwicks storage call still ends within %g s, %s). To fix: restart the "
        "runtime and import fenwicks before tensorflow", RETRIES, REQUEST_TIMEOUT_SECS,
        deadline_secs(), DEADLINE_ENV)


def is_outage(err: BaseException) -> bool:
    """True for an error that says storage could not be reached (after retries)."""
    return type(err).__name__ in OUTAGE_ERRORS


def in_outage() -> bool:
    """True between a storage failure and the next call that succeeds."""
    return _outage_since is not None


def abandoned_calls() -> list[threading.Thread]:
    """Storage calls given up at their deadline whose threads may still be running."""
    with _lock:
        return list(_running)


def reset_for_tests(join_secs: float = 5.0) -> None:
    """Test hook: waits up to `join_secs` for each abandoned call, forgets them all and
    ends any outage, so the next test starts as a fresh process would."""
    for thread in abandoned_calls():
        thread.join(join_secs)
    with _lock:
        _running.clear()
    _mark_healthy()


def run(fn: Callable[..., T], *args: Any, what: str, path: str | None,
        best_effort: bool = False, attempt_in_outage: bool = False,
        **kwargs: Any) -> T | None:
    """``fn(*args, **kwargs)``, bounded in time when `path` is on ``gs://``.

    Args:
        fn: the storage call (a ``tf.io.gfile`` function, a checkpoint save...).
        what: what it does, for the error ("checkpoint save").
        path: the path it touches; local paths (and None) run directly, unbounded.
        best_effort: a clean-up call: skipped during an outage, given `cleanup_secs()`
            otherwise, and its failure logged rather than raised (returns None).
        attempt_in_outage: try a `best_effort` call even during an outage (releasing
            the work_dir lock: worth `cleanup_secs()`).

    Raises:
        StorageTimeoutError: not finished within `deadline_secs()`.

    Examples:
        >>> run(tf.io.gfile.exists, 'no-such-file', what='exists', path='no-such-file')
        False

        A local path runs directly; a ``gs://`` one in a thread given `deadline_secs()`.
    """
    if best_effort and in_outage() and not attempt_in_outage:
        logger.warning("fenwicks: skipped %s of %s: storage is not answering", what, path)
        return None
    if not (path or "").startswith("gs://"):
        return _direct(fn, args, kwargs, what, path, best_effort)
    warn_if_tensorflow_came_first()
    seconds = cleanup_secs() if best_effort else deadline_secs()
    bound = "the bound for a clean-up call" if best_effort else DEADLINE_ENV
    if not best_effort:
        _wait_for_abandoned(what, path, seconds)
    try:
        value = _in_thread(fn, args, kwargs, what, path, seconds, bound)
    except BaseException as err:
        if is_outage(err):
            _mark_outage()
        if best_effort and isinstance(err, Exception):
            logger.warning("fenwicks: %s of %s failed: %s", what, path, first_line(err))
            return None
        raise
    _mark_healthy()
    return value


def _direct(fn, args, kwargs, what, path, best_effort):
    if not best_effort:
        return fn(*args, **kwargs)
    try:
        return fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - clean-up: a failure is reported, not raised
        logger.warning("fenwicks: %s of %s failed: %s", what, path, first_line(err))
        return None


def _in_thread(fn, args, kwargs, what: str, path: str, seconds: float, bound: str):
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = err

    thread = threading.Thread(target=target, name=f"fenwicks gs:// {what}", daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(seconds)  # interruptible: Ctrl-C still reaches the main thread
    if thread.is_alive():
        with _lock:
            _running.append(thread)
        raise StorageTimeoutError(
            f"{what} of {path} got no answer from Google Cloud Storage within "
            f"{seconds:g} s ({bound}); the call goes on in the background until "
            "TensorFlow's own retries end. Check the network and the bucket")
    if "error" in box:
        raise box["error"]
    logger.debug("fenwicks: %s of %s took %.2f s", what, path, time.monotonic() - start)
    return box.get("value")


def _wait_for_abandoned(what: str, path: str, seconds: float) -> None:
    """Waits for calls abandoned at an earlier deadline, so writes never overlap."""
    end = time.monotonic() + seconds
    with _lock:
        threads = list(_running)
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    with _lock:
        _running[:] = [t for t in _running if t.is_alive()]
        stuck = [t.name for t in _running]
    if stuck:
        raise StorageTimeoutError(
            f"{what} of {path} was not started: an earlier call ({stuck[0]}) has not "
            f"finished after another {seconds:.0f} s: Google Cloud Storage is still not "
            "answering. Try again later, or restart the Python process")


def mark_outage() -> None:
    """Records a storage failure seen elsewhere (clean-up calls are then skipped)."""
    _mark_outage()


def _mark_outage() -> None:
    global _outage_since
    if _outage_since is None:
        _outage_since = time.monotonic()


def _mark_healthy() -> None:
    global _outage_since
    _outage_since = None


def _exit_without_hanging() -> None:
    """At interpreter exit: waits for abandoned storage calls, else exits with 75."""
    end = time.monotonic() + EXIT_WAIT_SECS
    with _lock:
        threads = list(_running)
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    stuck = [t.name.removeprefix("fenwicks gs:// ") for t in threads if t.is_alive()]
    if not stuck:
        return
    sys.stdout.flush()
    print(f"fenwicks: exiting with status {EXIT_STATUS}: {len(stuck)} Google Cloud Storage "
          f"call(s) ({', '.join(stuck)}) still had no answer {EXIT_WAIT_SECS} s after the "
          "program ended, and waiting for TensorFlow's own retries could take minutes. "
          "Checkpoints saved before are complete; run again when storage answers",
          file=sys.stderr, flush=True)
    os._exit(EXIT_STATUS)


atexit.register(_exit_without_hanging)
