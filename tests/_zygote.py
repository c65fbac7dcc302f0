"""A fork server for test subprocesses: `import fenwicks` (and so TensorFlow) once.

    python -m tests._zygote SOCKET     # prints "zygote-ready", then serves until killed

A test process costs ~6 s of ``import tensorflow`` before it does anything, and the suite
starts hundreds. This server imports Fenwicks exactly as a fresh process would (which
imports TensorFlow and Keras, and initialises nothing: see tests/test_package.py), then
forks one child per request. A child is a new process with its own memory, pid and exit
status; it sets the requested environment, working directory and argv, runs ``-c CODE``
or ``-m MODULE`` as ``python`` would, and exits the way Python does (non-daemon threads
joined, atexit handlers run, an uncaught KeyboardInterrupt re-raised as SIGINT).

`tests.conftest.run_process` decides which processes may come from here: only those whose
environment differs from the server's in variables read after import (so nothing a
fresh ``import tensorflow`` would have read differently); everything else starts fresh.

Protocol (one Unix-socket connection per child): the client sends a 4-byte length and a
JSON request ``{"args", "env", "cwd"}`` with three file descriptors (stdin, stdout,
stderr) attached; the server answers one line with the child's pid, then, when it ends,
one line with its exit status (negative: killed by that signal, as in `subprocess`).
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import socket
import struct
import sys
import threading
import traceback


def serve(path: str) -> None:
    _die_with_parent()
    import fenwicks  # noqa: F401 - what every test process imports first

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    print("zygote-ready", flush=True)
    while True:
        conn, _ = server.accept()
        # the descriptors travel with the first bytes: receive them in the first call
        message, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        size = struct.unpack("!I", message[:4])[0]
        message = message[4:] + _exactly(conn, size + 4 - len(message))
        pid = os.fork()
        if pid == 0:
            server.close()
            _child(conn, json.loads(message), fds)
        for fd in fds:
            os.close(fd)
        conn.sendall(f"{pid}\n".encode())
        threading.Thread(target=_report_exit, args=(pid, conn), daemon=True).start()


def _die_with_parent() -> None:
    """SIGKILL this server when the test process that started it ends (Linux)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("client went away")
        data += chunk
    return data


def _report_exit(pid: int, conn: socket.socket) -> None:
    _, status = os.waitpid(pid, 0)
    try:
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    finally:
        conn.close()


def _child(conn: socket.socket, request: dict, fds: list[int]) -> None:
    """Becomes the requested ``python ARGS`` process; never returns."""
    conn.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os._exit(_exit_status(_run, request["args"]))


def _run(args: list[str]) -> None:
    flag, target, *rest = args
    if flag == "-c":
        sys.argv = ["-c", *rest]
        sys.path[0] = ""
        main = {"__name__": "__main__", "__builtins__": __builtins__}
        exec(compile(target, "<string>", "exec"), main)  # noqa: S102 - python -c
    else:
        sys.argv = [target, *rest]
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)


def _exit_status(run, args: list[str]) -> int:
    """Runs and ends as the interpreter does: the exit status ``python`` would give."""
    interrupted = False
    try:
        run(args)
        status = 0
    except SystemExit as stop:
        status = _system_exit_status(stop.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        status, interrupted = 1, True
    except BaseException:  # noqa: BLE001 - printed, as the interpreter prints it
        traceback.print_exc()
        status = 1
    try:
        threading._shutdown()  # noqa: SLF001 - join non-daemon threads, as at exit
        atexit._run_exitfuncs()  # noqa: SLF001
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    if interrupted:  # Python ends an uncaught KeyboardInterrupt by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return status


def _system_exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    serve(sys.argv[1])
