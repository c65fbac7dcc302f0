"""A real GCS server for tests: `gcp-storage-emulator` inside a private network namespace.

TensorFlow's own ``gs://`` client has a fixed endpoint (``https://www.googleapis.com``), so
the emulator and the code under test run in a network namespace whose hosts file maps
``www.googleapis.com`` and ``storage.googleapis.com`` to 127.0.0.1. There the emulator
serves TLS on 443 (a self-signed certificate that ``CURL_CA_BUNDLE`` trusts) and plain
HTTP on 80 (resumable uploads are continued at the ``http://`` Location the emulator
returns; gcsfs talks to it through ``STORAGE_EMULATOR_HOST``). Both ports share one store.

Two parts:

* `start()` (used by the ``gcs_emulator`` fixture in conftest.py) builds the namespace,
  the certificate and the server, and returns a `GcsEmulator` whose ``run_python`` /
  ``run_json`` run a snippet inside the namespace with every variable it needs.
* Run as a script, this file is the server: it patches two gaps of the emulator (see
  `_patch_emulator`) and serves ports 80 and 443 until terminated.

With ``faults=True``, `start()` puts `tests._fault_proxy` in front of the server: the
emulator then serves plain HTTP on `UPSTREAM_PORT` only, and the proxy owns ports 80 and
443, forwarding to it or injecting the faults the code under test schedules.

Needs root (``ip netns``). `EmulatorUnavailable` says why it could not start.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from functools import partial
from pathlib import Path
from typing import NoReturn

try:  # run as a script (the server) or imported from tests/
    from tests import _zygote
except ImportError:
    import _zygote

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOSTNAMES = ("www.googleapis.com", "storage.googleapis.com")
READY = "gcs-emulator-ready"
UPSTREAM_PORT = 8080  # the emulator's own port when the fault proxy owns 80 and 443
REQUIRE_ENV = "FENWICKS_REQUIRE_GCS_EMULATOR"


class EmulatorUnavailable(RuntimeError):
    """The namespace or the server could not be set up here (the message says why)."""


# --------------------------------------------------------------------------- test side


class GcsEmulator:
    """A running emulator. Code that touches ``gs://`` runs through `run_python`.

    Attributes:
        bucket: a bucket that exists on the server (tests share it: use `unique_url`).
        namespace: the network namespace the server and the snippets run in.
        env: the variables every snippet gets (CA bundle, test token, emulator host...).
    """

    def __init__(self, namespace: str, bucket: str, workdir: Path, cert: Path,
                 process: subprocess.Popen, log_path: Path,
                 proxy: subprocess.Popen | None = None) -> None:
        self.namespace = namespace
        self.bucket = bucket
        self.workdir = workdir
        self.process = process
        self.proxy = proxy
        self.log_path = log_path
        self.env = {
            "PYTHONPATH": ROOT,
            "TF_CPP_MIN_LOG_LEVEL": "2",
            # TensorFlow's gs:// client: trust our certificate, skip OAuth and GCE probing.
            "CURL_CA_BUNDLE": str(cert),
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "fenwicks-emulator",
            "NO_GCE_CHECK": "true",
            # gcsfs (and so fw.io transfers): talk plain HTTP to the emulator, anonymously.
            "STORAGE_EMULATOR_HOST": "http://127.0.0.1:80",
            # Otherwise gcsfs waits 60 s per bucket on a gRPC bucket-type probe.
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
            "FENWICKS_BUCKET": bucket,
        }
        # Snippets are forked from a server in the namespace that imported Fenwicks once;
        # one server per set of `import_env` (see `run_module`).
        self._zygotes: dict[tuple, _zygote.Client] = {}

    def _zygote_for(self, import_env: dict[str, str] | None) -> _zygote.Client:
        key = tuple(sorted((import_env or {}).items()))
        if key not in self._zygotes:
            base = {**self.env, **dict(key)}
            self._zygotes[key] = _zygote.Client(
                lambda: {**os.environ, **base}, str(self.workdir),
                prefix=["ip", "netns", "exec", self.namespace])
        return self._zygotes[key]

    def _run(self, args: list[str], env: dict[str, str] | None, timeout: float,
             cwd: str, import_env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess:
        full_env = {**os.environ, **self.env, **(import_env or {}), **(env or {})}
        zygote = self._zygote_for(import_env)
        if zygote.may_run(args, full_env):
            return zygote.run(args, full_env, cwd, timeout)
        return subprocess.run(["ip", "netns", "exec", self.namespace, sys.executable, *args],
                              env=full_env, capture_output=True, text=True,
                              timeout=timeout, cwd=cwd)

    def url(self, *parts: str) -> str:
        """``gs://BUCKET/part/part``."""
        return "/".join([f"gs://{self.bucket}", *(p.strip("/") for p in parts)])

    def unique_url(self, name: str = "t") -> str:
        """A fresh ``gs://`` prefix, so tests sharing the bucket never collide."""
        return self.url(f"{name}-{secrets.token_hex(4)}")

    def run_python(self, code: str, env: dict[str, str] | None = None, timeout: float = 300,
                   cwd: str | None = None) -> subprocess.CompletedProcess:
        """Runs `code` in a new process inside the namespace; raises on failure.

        The working directory defaults to the emulator's private temp dir, so that stray
        modules in the caller's directory cannot shadow real ones.
        """
        proc = self._run(["-c", textwrap.dedent(code)], env, timeout,
                         cwd or str(self.workdir))
        if proc.returncode != 0:
            raise AssertionError(f"subprocess in {self.namespace} failed ({proc.returncode}):"
                                 f"\n{proc.stdout}\n{proc.stderr[-6000:]}"
                                 f"\n--- emulator log tail ---\n{self.log_tail()}")
        return proc

    def run_module(self, module: str, *args: str, env: dict[str, str] | None = None,
                   timeout: float = 300, check: bool = True,
                   import_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Runs ``python -m module *args`` inside the namespace (see `run_python`).

        With ``check=False`` a failing run is returned rather than raised, for tests of
        how code fails. `import_env`: variables read at ``import fenwicks`` (TensorFlow's
        GCS retry settings, ``FENWICKS_GCS_REQUEST_TIMEOUT``). Processes with the same
        `import_env` are forked from one server that imported Fenwicks with them (as a
        fresh process would: ~6 s saved per process); with `env` they would each start a
        new interpreter.
        """
        proc = self._run(["-m", module, *args], env, timeout, str(self.workdir), import_env)
        if check and proc.returncode != 0:
            raise AssertionError(f"python -m {module} in {self.namespace} failed "
                                 f"({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                                 f"{proc.stderr[-6000:]}"
                                 f"\n--- emulator log tail ---\n{self.log_tail()}")
        return proc

    def run_module_json(self, module: str, *args: str, env: dict[str, str] | None = None,
                        timeout: float = 300, import_env: dict[str, str] | None = None):
        """Like `run_module`; the module must print one JSON document as its last line."""
        proc = self.run_module(module, *args, env=env, timeout=timeout,
                               import_env=import_env)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def run_json(self, code: str, env: dict[str, str] | None = None, timeout: float = 300,
                 cwd: str | None = None):
        """Like `run_python`; `code` must print one JSON document as its last stdout line."""
        proc = self.run_python(code, env=env, timeout=timeout, cwd=cwd)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def start_module(self, module: str, *args: str,
                     env: dict[str, str] | None = None) -> subprocess.Popen:
        """Starts ``python -m module *args`` inside the namespace, for a test that signals
        or waits on it itself (text pipes for stdout and stderr): forked from the
        namespace's server when `run_module` would be (a `tests._zygote.ForkedProcess`,
        used as a `subprocess.Popen`), else a new interpreter (`ip netns exec` execs
        Python, so the process's pid is Python's)."""
        argv = ["-m", module, *args]
        full_env = {**os.environ, **self.env, **(env or {})}
        zygote = self._zygote_for(None)
        if zygote.may_run(argv, full_env):
            return zygote.start(argv, full_env, str(self.workdir))
        return subprocess.Popen(
            ["ip", "netns", "exec", self.namespace, sys.executable, *argv],
            env=full_env, cwd=str(self.workdir),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stops the server and the proxy (processes this object started) and removes
        the namespace."""
        for zygote in self._zygotes.values():
            zygote.stop()
        for process in (self.proxy, self.process):
            if process is not None:
                _stop_process(process)
        _remove_namespace(self.namespace)


def _stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def start(workdir: Path, bucket: str = "fenwicks-test", timeout: float = 30,
          faults: bool = False) -> GcsEmulator:
    """Creates a namespace, a certificate and a server in it; returns when it answers.

    With `faults`, the server listens on `UPSTREAM_PORT` behind `tests._fault_proxy`.

    Raises:
        EmulatorUnavailable: not root, no ``ip``/``openssl``, or the server did not start.
    """
    check_prerequisites()
    _remove_stale_namespaces()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cert, key = _make_certificate(workdir)
    namespace = f"fwgcs-{os.getpid()}-{secrets.token_hex(3)}"
    _create_namespace(namespace)
    log_path = workdir / "emulator.log"
    process = proxy = None
    try:
        ports = ["--http-port", str(UPSTREAM_PORT), "--https-port", "0"] if faults else []
        process = _launch(namespace, [os.path.abspath(__file__), "--cert", str(cert),
                                      "--key", str(key), "--bucket", bucket, *ports],
                          log_path, READY, timeout)
        if faults:
            proxy = _launch(namespace, [os.path.join(os.path.dirname(__file__),
                                                     "_fault_proxy.py"),
                                        "--upstream", f"127.0.0.1:{UPSTREAM_PORT}",
                                        "--cert", str(cert), "--key", str(key)],
                            workdir / "proxy.log", "fault-proxy-ready", timeout)
    except BaseException:
        for started in (proxy, process):
            if started is not None:
                _stop_process(started)
        _remove_namespace(namespace)
        raise
    return GcsEmulator(namespace, bucket, workdir, cert, process, log_path, proxy)


def skip_or_fail(reason: str) -> NoReturn:
    """Skips the test needing the emulator, or fails it when ``REQUIRE_ENV=1`` (CI)."""
    import pytest

    message = f"GCS emulator unavailable: {reason}"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{message} ({REQUIRE_ENV}=1: a skip would hide a missing capability)")
    pytest.skip(message)


def check_prerequisites() -> None:
    if os.geteuid() != 0:
        raise EmulatorUnavailable("needs root to create a network namespace (ip netns add)")
    for tool in ("ip", "openssl"):
        if shutil.which(tool) is None:
            raise EmulatorUnavailable(f"the {tool!r} command is not installed")
    try:
        import gcp_storage_emulator  # noqa: F401
    except ImportError as err:
        raise EmulatorUnavailable("pip install gcp-storage-emulator") from err


def _make_certificate(workdir: Path) -> tuple[Path, Path]:
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    names = ",".join(f"DNS:{name}" for name in HOSTNAMES) + ",IP:127.0.0.1"
    _run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
          "-subj", f"/CN={HOSTNAMES[0]}", "-addext", f"subjectAltName={names}",
          "-keyout", str(key), "-out", str(cert)])
    return cert, key


def _create_namespace(namespace: str) -> None:
    hosts_dir = Path("/etc/netns") / namespace
    hosts_dir.mkdir(parents=True, exist_ok=True)
    # `ip netns exec` bind-mounts this file over /etc/hosts for what it runs.
    (hosts_dir / "hosts").write_text("127.0.0.1 localhost " + " ".join(HOSTNAMES) + "\n"
                                     "::1 localhost\n")
    try:
        _run(["ip", "netns", "add", namespace])
        _run(["ip", "netns", "exec", namespace, "ip", "link", "set", "lo", "up"])
    except EmulatorUnavailable:
        _remove_namespace(namespace)
        raise


def _remove_stale_namespaces() -> None:
    """Removes namespaces left by killed sessions (named after a pytest pid now gone),
    with the emulator they still hold. Namespaces of live sessions are left alone."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                             check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if len(parts) != 3 or parts[0] != "fwgcs" or not parts[1].isdigit():
            continue
        if os.path.exists(f"/proc/{parts[1]}"):
            continue
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                              text=True, check=False).stdout.split()
        for pid in pids:  # only processes inside that abandoned namespace
            try:
                os.kill(int(pid), 15)
            except (ProcessLookupError, ValueError):
                pass
        _remove_namespace(name)


def _remove_namespace(namespace: str) -> None:
    subprocess.run(["ip", "netns", "delete", namespace], capture_output=True, check=False)
    shutil.rmtree(Path("/etc/netns") / namespace, ignore_errors=True)


def _launch(namespace: str, script: list[str], log_path: Path, ready: str,
            timeout: float) -> subprocess.Popen:
    """Starts ``python *script`` in the namespace; returns once it prints `ready`."""
    command = ["ip", "netns", "exec", namespace, sys.executable, *script]
    if os.environ.get("FENWICKS_GCS_EMULATOR_VERBOSE") == "1" and ready == READY:
        command.append("--verbose")  # the emulator's request log, for debugging
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready in log_path.read_text(errors="replace"):
            return process
        if process.poll() is not None:
            break
        time.sleep(0.1)
    if process.poll() is None:
        process.kill()
        process.wait(timeout=10)
    raise EmulatorUnavailable(f"{os.path.basename(script[0])} did not start within "
                              f"{timeout:.0f} s:\n"
                              + log_path.read_text(errors="replace")[-3000:])


def _run(command: list[str]) -> None:
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise EmulatorUnavailable(f"{' '.join(command[:4])} failed: {proc.stderr.strip()}")


# --------------------------------------------------------------------------- server side


def _read_chunked(rfile) -> bytes:
    """Decodes an HTTP/1.1 chunked body, trailers included."""
    body = bytearray()
    while True:
        size_line = rfile.readline()
        if not size_line:
            break
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            break
        body += rfile.read(size)
        rfile.readline()  # the CRLF after each chunk
    return bytes(body)


def _read_raw_data(handler) -> bytes | None:
    """The request body; a chunked body is decoded even when a Content-Length is present."""
    if "chunked" in (handler.headers.get("Transfer-Encoding") or "").lower():
        return _read_chunked(handler.rfile)
    length = handler.headers.get("Content-Length")
    return handler.rfile.read(int(length)) if length else None


def multipart_upload_fields(raw: bytes, content_type: str) -> dict | None:
    """Splits a multipart/related upload into metadata and exact content bytes.

    gcsfs separates parts with a bare LF; the emulator's email parser then eats a
    trailing CR of the content (a 10000-byte file arrived as 9999). The content ends at
    the LAST closing delimiter, so bytes that merely look like one stay content.
    Returns None for a body of another shape (the emulator's own parser handles it).
    """
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if not match:
        return None
    delimiter = b"--" + match.group(1).encode()
    newline = b"\r\n" if raw[len(delimiter):].startswith(b"\r\n") else b"\n"
    if not raw.startswith(delimiter + newline):
        return None
    meta_part, _, rest = raw[len(delimiter + newline):].partition(newline + delimiter + newline)
    end = rest.rfind(newline + delimiter + b"--")
    if not rest or end < 0:
        return None
    headers, _, content = rest[:end].partition(newline * 2)
    part_type = re.search(rb"(?im)^content-type:\s*([^\r\n;]+)", headers)
    return {"meta": json.loads(meta_part.partition(newline * 2)[2]), "content": content,
            "content-type": part_type.group(1).decode() if part_type else
            "application/octet-stream"}


def _read_data(emulator_read_data, handler, query):
    """The emulator's body decoding, with exact multipart/related uploads."""
    from gcp_storage_emulator import server

    content_type = handler.headers.get("Content-Type") or ""
    if not content_type.startswith("multipart/related"):
        return emulator_read_data(handler, query)
    raw = server._decode_raw_data(_read_raw_data(handler), handler) or b""
    fields = multipart_upload_fields(raw, content_type)
    return fields if fields is not None else _email_multipart(raw, content_type)


def _email_multipart(raw: bytes, content_type: str) -> dict:
    """What the emulator itself does with a multipart upload (for other body shapes)."""
    from email.parser import BytesParser

    message = BytesParser().parsebytes(f"Content-Type: {content_type}\r\n".encode() + raw)
    meta, media = message.get_payload()
    return {"meta": json.loads(meta.get_payload()), "content": media.get_payload(decode=True),
            "content-type": media.get_content_type()}


def _patch_emulator() -> None:
    """Bridges the gaps between gcp-storage-emulator and the GCS clients.

    1. TensorFlow's upload PUT carries both ``Transfer-Encoding: chunked`` and a
       ``Content-Length``; the emulator trusts the length and stores the chunk framing.
       HTTP (RFC 9112, section 6.3) says chunked wins.
    2. An empty media upload (TensorFlow's ``dir/`` marker objects) reaches the handler
       as None and crashes it on ``len(None)``; it is an empty object.
    3. gcsfs's multipart uploads lose a trailing CR (see `multipart_upload_fields`).
    4. A resumable-upload status query on a session holding no bytes is answered
       ``Range: bytes=0-0`` (one byte received); GCS sends no Range then. After a
       connection dropped mid-upload, TensorFlow resumed at byte 1 and got a 400.
    Requests are also serialised: the emulator's store is not written for threads.
    """
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    media_upload = objects._media_upload

    def media_upload_empty_ok(request, response, storage):
        if request.data is None:
            request._data = b""
        return media_upload(request, response, storage)

    resumable_incomplete = objects._resumable_incomplete

    def resumable_incomplete_exact(response, storage, upload_id, fallback_end=0):
        if storage.get_resumable_byte_count(upload_id) > 0:
            return resumable_incomplete(response, storage, upload_id, fallback_end)
        response.status = objects.GoogleHTTPStatus.RESUME_INCOMPLETE

    lock = threading.Lock()
    handle = server.Router.handle

    def handle_serialised(self, method):
        with lock:
            return handle(self, method)

    server._read_data = partial(_read_data, server._read_data)
    server._read_raw_data = _read_raw_data
    objects._media_upload = media_upload_empty_ok
    objects._resumable_incomplete = resumable_incomplete_exact
    server.Router.handle = handle_serialised


def _handler_class():
    from gcp_storage_emulator.server import RequestHandler

    class Handler(RequestHandler):
        def parse_request(self) -> bool:
            # curl (TensorFlow's client) sends `Expect: 100-continue` before an upload
            # body and waits 1 s for the go-ahead, which an HTTP/1.0 handler never
            # gives: that made every checkpoint file cost a second.
            ok = super().parse_request()
            if ok and (self.headers.get("Expect") or "").lower() == "100-continue":
                self.send_response_only(100)
                self.end_headers()
            return ok

    return Handler


def serve(cert: str, key: str, bucket: str, http_port: int = 80,
          https_port: int = 443) -> None:
    """Serves one in-memory store on `http_port` and, with TLS, on `https_port` (0: no
    TLS port, when the fault proxy terminates TLS in front of this server)."""
    import ssl
    from http.server import ThreadingHTTPServer

    from gcp_storage_emulator.handlers.buckets import create_bucket
    from gcp_storage_emulator.storage import Storage

    _patch_emulator()
    storage = Storage(use_memory_fs=True, data_dir=os.path.abspath("."))
    create_bucket(bucket, storage)
    handler = partial(_handler_class(), storage)
    servers = [ThreadingHTTPServer(("127.0.0.1", http_port), handler)]
    if https_port:
        secure = ThreadingHTTPServer(("127.0.0.1", https_port), handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        secure.socket = context.wrap_socket(secure.socket, server_side=True)
        servers.append(secure)
    for httpd in servers:
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
    print(READY, flush=True)
    threading.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--http-port", type=int, default=80)
    parser.add_argument("--https-port", type=int, default=443)
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args()
    if args.verbose:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    serve(args.cert, args.key, args.bucket, args.http_port, args.https_port)


if __name__ == "__main__":
    main()
