"""A quiet command line: no start-up logging of TensorFlow, absl or libtpu, unless --debug.

``python -m fenwicks ...`` and the ``fenwicks`` script import the package before
`fenwicks.__main__` runs, and TensorFlow (and libtpu) read their log levels when they are
loaded, so ``fenwicks/__init__.py`` calls `quiet_command_line` before anything else. It
changes nothing for a program or notebook that imports Fenwicks, and nothing with
``--debug``. A variable the user set keeps its value.

TensorFlow 2.20 and 2.21 write a few start-up lines through absl before absl's logging is
initialised, straight to file descriptor 2, whatever ``TF_CPP_MIN_LOG_LEVEL`` says (absl's
"All log messages before absl::InitializeLog()" notice, oneDNN's announcement, the
cpu_feature_guard's). On the command line only, `filter_start_up_lines` drops exactly those
`START_UP_LINES` from file descriptor 2 and passes every other line through unchanged.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
from collections.abc import MutableMapping, Sequence

# TensorFlow's C++ logging (and absl's "All log messages before absl::InitializeLog()"
# line, which comes with it), libtpu's, and gRPC's, shown from errors up only: on the
# command line Fenwicks itself says what went wrong, in one line.
QUIET_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "TPU_MIN_LOG_LEVEL": "3",
    "TPU_STDERR_LOG_LEVEL": "3",
    "GRPC_VERBOSITY": "ERROR",
}

# A C++ log line's prefix: "I0000 00:00:1795879641.610521   21720 " (absl, TF 2.21) or
# "2026-01-02 03:04:05.678901: I " (TensorFlow's own, TF 2.20 and before) before the file.
_PREFIX = rb"(?:[IWE]\d{4} [\d:.]+ +\d+ |\d{4}-\d\d-\d\d [\d:.]+: [IWE] )(?:[\w/.-]+/)?"
# The lines TensorFlow writes at start-up that TF_CPP_MIN_LOG_LEVEL no longer silences
# (tensorflow-cpu 2.21.0), each whole; nothing else is dropped.
START_UP_LINES = re.compile(
    rb"WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
    rb"STDERR"
    rb"|" + _PREFIX + rb"port\.cc:\d+\] oneDNN custom operations are on\. .*"
    rb"|" + _PREFIX + rb"cpu_feature_guard\.cc:\d+\] .*"
    # the cpu_feature_guard line's second line
    rb"|To enable the following instructions: .*, in other operations, rebuild TensorFlow "
    rb"with the appropriate compiler flags\."
    rb"|(?:" + _PREFIX + rb"\S+\.cc:\d+\] )?Memory patch applied: M_TRIM_THRESHOLD=.*")


def is_start_up_line(line: bytes) -> bool:
    """Whether `line` (without its newline) is one of TensorFlow's `START_UP_LINES`.

    Examples:
        >>> is_start_up_line(b"I0000 00:00:1795879641.610521   21720 port.cc:153] oneDNN "
        ...                  b"custom operations are on. You may see slightly different")
        True
        >>> is_start_up_line(b"fenwicks info: error: device='gpu' was requested")
        False
    """
    return START_UP_LINES.fullmatch(line.rstrip(b"\r")) is not None


def _forward(read_fd: int, write_fd: int) -> None:
    """Copies lines from `read_fd` to `write_fd` until end of file, less the start-up
    lines; a last line without a newline is passed on as it is."""
    pending = b""
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        kept = b"".join(line + b"\n" for line in lines if not is_start_up_line(line))
        if kept:
            os.write(write_fd, kept)
    if pending and not is_start_up_line(pending):
        os.write(write_fd, pending)


def filter_start_up_lines(fd: int = 2) -> int:
    """Puts a filter process between file descriptor `fd` and where it wrote: every line
    but `START_UP_LINES` reaches it unchanged. Returns the filter's process id.

    A process rather than a thread: what a crashing TensorFlow writes just before it
    aborts still reaches the terminal. Called before TensorFlow is imported, when this
    process has no other thread to fork. At exit, `fd` is put back and the filter is given
    a moment to write its last lines.
    """
    original = os.dup(fd)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the filter: reads until every writer has closed the pipe
        try:
            os.close(write_fd)
            os.dup2(original, fd)
            _forward(read_fd, original)
        finally:
            os._exit(0)
    os.close(read_fd)
    os.dup2(write_fd, fd)
    pipe = os.fstat(write_fd)
    os.close(write_fd)

    def restore() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        # TensorFlow keeps a copy of file descriptor 2 of its own: every copy of the pipe
        # is pointed back where it wrote, so the filter sees its end and writes its last
        # lines before this process's exit status reaches the shell.
        for copy in _descriptors():
            try:
                same = os.path.samestat(os.fstat(copy), pipe)
            except OSError:
                continue
            if same:
                os.dup2(original, copy)
        _wait(pid, seconds=2.0)

    atexit.register(restore)
    return pid


def _descriptors() -> list[int]:
    """This process's open file descriptors (Linux lists them; elsewhere the first 1024)."""
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(1024))


def _wait(pid: int, seconds: float) -> None:
    """Waits up to `seconds` for process `pid` (a child that outlives its pipe's writers,
    say a server this command started, is left to finish on its own)."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return
        time.sleep(0.01)


def is_command_line(argv: Sequence[str], orig_argv: Sequence[str]) -> bool:
    """Whether this process is Fenwicks' command line: ``python -m fenwicks ...`` (while
    runpy imports the package, ``sys.argv[0]`` is ``'-m'``) or the ``fenwicks`` script.

    Examples:
        >>> is_command_line(["-m", "info"], ["python", "-m", "fenwicks", "info"])
        True
        >>> is_command_line(["train.py"], ["python", "train.py"])
        False
    """
    if not argv:
        return False
    if argv[0] == "-m":
        rest = list(orig_argv)
        return "-m" in rest and rest[rest.index("-m") + 1:][:1] == ["fenwicks"]
    return os.path.basename(argv[0]) == "fenwicks"


def quiet_command_line(env: MutableMapping[str, str] | None = None,
                       argv: Sequence[str] | None = None,
                       orig_argv: Sequence[str] | None = None) -> bool:
    """On the command line without ``--debug``, sets `QUIET_ENV` (where unset) and absl's
    Python verbosity to errors; returns whether it did."""
    env = os.environ if env is None else env
    argv = sys.argv if argv is None else argv
    orig_argv = getattr(sys, "orig_argv", argv) if orig_argv is None else orig_argv
    if not is_command_line(argv, orig_argv) or "--debug" in orig_argv:
        return False
    for name, value in QUIET_ENV.items():
        env.setdefault(name, value)
    if env is os.environ and hasattr(os, "fork"):
        filter_start_up_lines()
    try:
        from absl import logging as absl_logging
    except ImportError:  # absl comes with TensorFlow; without it there is nothing to quiet
        return True
    absl_logging.set_verbosity(absl_logging.ERROR)
    return True
