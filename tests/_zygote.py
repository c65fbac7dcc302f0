"""A fork server for test subprocesses: `import fenwicks` (and so TensorFlow) once.

    python -m tests._zygote SOCKET     # prints "zygote-ready", then serves until killed

A test process costs ~6 s of ``import tensorflow`` before it does anything, and the suite
starts hundreds. This server imports Fenwicks exactly as a fresh process would (which
imports TensorFlow and Keras, and initialises nothing: see tests/test_package.py), then
forks one child per request. A child is a new process with its own memory, pid and exit
status; it sets the requested environment, working directory and argv, runs ``-c CODE``
or ``-m MODULE`` as ``python`` would, and exits the way Python does (non-daemon threads
joined, atexit handlers run, an uncaught KeyboardInterrupt re-raised as SIGINT).

Before serving, it also does once what nearly every child did for itself, none of which
initialises TensorFlow's runtime or changes what a child computes: it imports the modules
children import on first use (`PREIMPORTED`), has AutoGraph convert Fenwicks' step
functions (`tests._autograph_warmup`), and freezes what it holds out of the garbage
collector's sight (`gc.freeze`). A forked child training and evaluating a small model
costs ~1.9 s of CPU rather than ~4.4 s.

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
import contextlib
import gc
import json
import os
import runpy
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from typing import TextIO

FRESH_ENV = "FENWICKS_TEST_FRESH"  # =1: every test process is a new interpreter


def serve(path: str) -> None:
    _die_with_parent()
    import fenwicks  # noqa: F401 - what every test process imports first

    _preimport()
    _warm_autograph(os.path.dirname(path))
    # What the import made lives as long as the process: out of the collector's sight
    # (Python's advice for a server that forks, `gc.freeze`). A full collection over
    # TensorFlow's ~460k objects costs ~0.25 s of CPU, and a child runs dozens: Python's
    # own (`fenwicks.train.inputs.discard` ran one per `evaluate`/`predict` until
    # 2026-11-26, when this was measured).
    # Measured 2026-11-26 under load, `tests._state_catalogue train` on 4 entries forked
    # from here: 19.1 -> 15.2 s of CPU.
    gc.collect()
    gc.freeze()
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


# Imported on first use by nearly every child, ~1 s of CPU each time it is: TensorFlow
# imports TensorBoard's summary ops (and with them boto3) at the first tf.summary.scalar,
# i.e. the first training loop (0.74 s), and the test helpers' digits come from
# scikit-learn (0.3 s). Neither initialises TensorFlow's runtime. Measured 2026-11-26
# under load, a forked child training mnist_net 3 steps and evaluating: 4.4 -> 3.8 s.
PREIMPORTED = ("tensorboard.summary.v2", "sklearn.datasets")


def _preimport() -> None:
    if "tensorflow" not in sys.modules:
        return
    for name in PREIMPORTED:
        with contextlib.suppress(ImportError):
            __import__(name)


def _warm_autograph(directory: str) -> None:
    """Fenwicks' step functions converted by AutoGraph here, once, rather than in each
    child (`tests._autograph_warmup`); the TensorFlow engine's servers only."""
    import keras

    if keras.backend.backend() != "tensorflow":
        return
    from tests import _autograph_warmup

    with contextlib.suppress(Exception):
        _autograph_warmup.warm(directory)


def _die_with_parent() -> None:
    """End this server when the test process that started it ends.

    Not PR_SET_PDEATHSIG: that fires when the parent *thread* ends, and a test that
    first asks for a process from a ThreadPoolExecutor's thread would lose the server
    as soon as the pool shut down (the next request met "Connection reset by peer").
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


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
    tempfile.tempdir = None  # found again from this environment's TMPDIR
    matplotlib = sys.modules.get("matplotlib")  # imported with Keras, in the server
    if matplotlib is not None and os.environ.get("MPLBACKEND"):
        matplotlib.rcParams["backend"] = os.environ["MPLBACKEND"]  # as its import reads it
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


# ------------------------------------------------------------------------------ client

class Client:
    """Starts a server on first use and runs ``python -c/-m`` requests through it.

    Args:
        base_env: the server's environment (a callable, read when it starts).
        cwd: the server's working directory.
        prefix: a command the server runs under, e.g. ``["ip", "netns", "exec", NS]``:
            its children inherit it (the namespace).
    """

    # Read when used, not at import: a child may set these differently from the server.
    # TMPDIR: `tempfile` caches its directory, so the child clears that cache.
    # MPLBACKEND: matplotlib reads it at import (which Keras's import does), so the child
    # sets the backend from it as that import would have.
    RUNTIME_ENV = frozenset({"FENWICKS_DEVICE", "FENWICKS_ROOT", "FENWICKS_BUCKET",
                             "TF_CONFIG", "TFDS_DATA_DIR", "MPLBACKEND", "TMPDIR"})
    # The test helpers' own switches (tests/_faults.py, tests/_multiworker.py), read when
    # their module runs.
    RUNTIME_PREFIXES = ("FAULTS_", "MULTIWORKER_")
    IGNORED_ENV = frozenset({"PYTEST_CURRENT_TEST"})

    def __init__(self, base_env: Callable[[], dict[str, str]], cwd: str,
                 prefix: list[str] | None = None) -> None:
        self._base_env, self._cwd, self._prefix = base_env, cwd, prefix or []
        self._lock = threading.Lock()
        self._server: subprocess.Popen | None = None
        self._env: dict[str, str] = {}
        self._path = ""

    def may_run(self, args: list[str], env: dict[str, str],
                read_later: tuple[str, ...] = ()) -> bool:
        """Whether ``python *args`` with `env` may be forked from this server.

        Args:
            args, env: the process's arguments (after ``python``) and environment.
            read_later: prefixes of more variables that only the child's own code reads
                (e.g. Jupyter's, read by the kernel it starts).
        """
        if os.environ.get(FRESH_ENV) == "1" or len(args) < 2 or args[0] not in ("-c", "-m"):
            return False
        reference = self._env or self._base_env()
        changed = {k for k in env.keys() | reference.keys()
                   if env.get(k) != reference.get(k)} - self.IGNORED_ENV
        return all(k in self.RUNTIME_ENV or k.startswith(self.RUNTIME_PREFIXES + read_later)
                   for k in changed)

    def start(self, args: list[str], env: dict[str, str], cwd: str) -> ForkedProcess:
        """``python *args`` as a child of the server, like ``subprocess.Popen(...,
        stdout=PIPE, stderr=PIPE, text=True)``: for a test that signals the process or
        reads its output as it comes."""
        self._start()
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self._path)
        request = json.dumps({"args": list(args), "env": env, "cwd": cwd}).encode()
        socket.send_fds(conn, [struct.pack("!I", len(request)) + request],
                        [stdin, out_w, err_w])
        for fd in (stdin, out_w, err_w):
            os.close(fd)
        return ForkedProcess(args, conn, out_r, err_r)

    def run(self, args: list[str], env: dict[str, str], cwd: str,
            timeout: float) -> subprocess.CompletedProcess:
        """``python *args`` as a child of the server, like ``subprocess.run(...,
        capture_output=True, text=True, timeout=timeout)``: the child is killed if it
        outlasts `timeout`."""
        proc = self.start(args, env, cwd)
        try:
            stdout, stderr = proc.communicate(timeout)
        except subprocess.TimeoutExpired as err:
            proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(10)
            raise subprocess.TimeoutExpired(proc.args, timeout, *proc.output) from err
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)

    def server_pid(self) -> int:
        """The server's pid, the parent of every child it forks (started if need be)."""
        self._start()
        return self._server.pid

    def stop(self) -> None:
        if self._server is not None and self._server.poll() is None:
            self._server.kill()
            self._server.wait()
            # its socket and the modules AutoGraph generated there (_autograph_warmup)
            shutil.rmtree(os.path.dirname(self._path), ignore_errors=True)

    def _start(self) -> None:
        with self._lock:
            if self._server is not None and self._server.poll() is None:
                return
            self._path = os.path.join(tempfile.mkdtemp(prefix="fw-zygote-"), "socket")
            self._env = self._base_env()
            self._server = subprocess.Popen(
                [*self._prefix, sys.executable, "-m", "tests._zygote", self._path],
                env=self._env, cwd=self._cwd, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, text=True)
            if self._server.stdout.readline().strip() != "zygote-ready":
                raise RuntimeError(f"tests._zygote did not start (status "
                                   f"{self._server.wait()})")


class ForkedProcess:
    """A child of the server, used as the `subprocess.Popen` of ``python ARGS`` with text
    pipes for stdout and stderr: ``pid``, ``stdout``, ``stderr``, ``returncode``,
    ``poll``, ``wait``, ``communicate``, ``send_signal``, ``terminate``, ``kill``.

    Its exit status comes from the server (which reaps it), in `subprocess`'s convention:
    negative when a signal ended it.
    """

    def __init__(self, args: list[str], conn: socket.socket, out_r: int, err_r: int) -> None:
        self.args = ["python", *args]
        self._conn, self._answer = conn, conn.makefile("r")
        self.pid = int(self._answer.readline())
        self.stdout = open(out_r, encoding="utf-8", errors="replace")  # noqa: SIM115
        self.stderr = open(err_r, encoding="utf-8", errors="replace")  # noqa: SIM115
        self.returncode: int | None = None
        self.output = ["", ""]  # stdout, stderr: what `communicate` read
        self._readers: list[threading.Thread] = []
        self._ended = threading.Event()
        threading.Thread(target=self._await_status, daemon=True).start()

    def _await_status(self) -> None:
        try:
            self.returncode = int(self._answer.readline())
        finally:
            self._conn.close()
            self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Reads stdout and stderr to their ends and waits for the exit status."""
        if not self._readers:  # one reader per stream, kept across calls
            self._readers = [threading.Thread(target=self._read, args=(i, stream),
                                              daemon=True)
                             for i, stream in enumerate((self.stdout, self.stderr))]
            for reader in self._readers:
                reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        left = lambda: None if deadline is None else max(0.0, deadline - time.monotonic())
        for reader in self._readers:
            reader.join(left())
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(left())
        return self.output[0], self.output[1]

    def _read(self, index: int, stream: TextIO) -> None:
        self.output[index] = stream.read()

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    serve(sys.argv[1])
