"""A fault-injecting HTTP proxy between GCS clients and the GCS emulator, for tests.

It runs inside the emulator's network namespace (see `gcs_emulator.start(faults=True)`)
on the ports the clients use: 443 with TLS (TensorFlow's fixed ``www.googleapis.com``
endpoint) and 80 (gcsfs through ``STORAGE_EMULATOR_HOST``, and the ``http://`` upload
Locations the emulator hands out). Every request is read whole, matched against a
schedule of rules and then either forwarded to the emulator or broken on purpose:

* ``"503"``: answered ``503 Service Unavailable`` (a JSON error, as GCS sends), never
  forwarded;
* ``"reset"``: half the request body is read, then the connection is reset (RST) with
  no answer, never forwarded (a connection dropped during an upload);
* ``"truncate"``: forwarded, then the answer's headers and half its body are sent and the
  connection reset (a connection dropped while downloading; the request did happen);
* ``"delay"``: forwarded after ``seconds`` (a slow server);
* ``"down"``: the connection is reset at once, nothing read or forwarded (a server that
  died, or a network path that is gone);
* ``"hold"``: held without an answer until the rule's ``until``, then forwarded (a paused
  server: ``kill -STOP``, then ``kill -CONT``).

A rule is a dict: ``{"fault": "503", "method": "PUT", "path": "regex", "skip": 0,
"times": 2, "seconds": 0, "until": None}``. ``method`` and ``path`` (a regex searched in the request
line's path, e.g. ``"ckpt-6"``) select requests; the first ``skip`` matches pass, the
next ``times`` (None = all that follow) get the fault; ``until`` (a `time.time()`) ends
the rule then. The first rule that fires wins.

Code inside the namespace controls the proxy over HTTP on port 80 with `set_rules` and
`report`; each rule reports how many requests it ``matched`` and ``fired`` on, and the
log lists every request with what happened to it.

Run as a script, this file is the proxy: ``--upstream HOST:PORT --cert C --key K``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import socket
import ssl
import struct
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CONTROL_PATH = "/__faults__"
CONTROL_URL = "http://127.0.0.1:80" + CONTROL_PATH
READY = "fault-proxy-ready"
FAULTS = ("503", "reset", "truncate", "delay", "down", "hold")
# Hop-by-hop headers: the proxy re-frames every body with a Content-Length.
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "expect",
                "proxy-connection", "te", "trailer", "upgrade"}


# --------------------------------------------------------------------------- client side


def set_rules(rules: list[dict[str, Any]]) -> None:
    """Replaces the proxy's schedule with `rules` and clears its log (see module doc)."""
    for rule in rules:
        if rule.get("fault") not in FAULTS:
            raise ValueError(f"fault={rule.get('fault')!r} must be one of {FAULTS}")
    request = urllib.request.Request(CONTROL_URL, data=json.dumps(rules).encode(),
                                     method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        response.read()


def report() -> dict[str, Any]:
    """``{"rules": [... with matched, fired], "log": [{"method", "path", "outcome"}]}``."""
    with urllib.request.urlopen(CONTROL_URL, timeout=10) as response:
        return json.loads(response.read())


# --------------------------------------------------------------------------- proxy side


class Schedule:
    """The rules and the request log, shared by every connection (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rules: list[dict[str, Any]] = []
        self.log: list[dict[str, Any]] = []

    def replace(self, rules: list[dict[str, Any]]) -> None:
        with self._lock:
            self.rules = [{"skip": 0, "times": None, "seconds": 0.0, "until": None, **rule,
                           "matched": 0, "fired": 0} for rule in rules]
            self.log = []

    def take(self, method: str, path: str) -> dict[str, Any] | None:
        """The rule that fires on this request, counting matches; None to forward it."""
        with self._lock:
            for rule in self.rules:
                if rule.get("method") not in (None, method):
                    continue
                if rule.get("path") and not re.search(rule["path"], path):
                    continue
                rule["matched"] += 1
                if rule["matched"] <= rule["skip"]:
                    continue
                if rule["times"] is not None and rule["fired"] >= rule["times"]:
                    continue
                if rule["until"] is not None and time.time() >= rule["until"]:
                    continue
                rule["fired"] += 1
                return dict(rule)
            return None

    def record(self, method: str, path: str, outcome: str) -> None:
        with self._lock:
            self.log.append({"time": time.time(), "method": method, "path": path,
                             "outcome": outcome})

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"rules": [dict(rule) for rule in self.rules], "log": list(self.log)}


def _read_body(handler: BaseHTTPRequestHandler, limit: int | None = None) -> bytes:
    """The request body (chunked or sized); at most `limit` bytes of a sized one."""
    if "chunked" in (handler.headers.get("Transfer-Encoding") or "").lower():
        body = bytearray()
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(body)
            body += handler.rfile.read(size)
            handler.rfile.readline()
            if limit is not None and len(body) >= limit:
                return bytes(body)
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length if limit is None else min(length, limit))


def _reset(handler: BaseHTTPRequestHandler) -> None:
    """Closes the connection with a TCP reset, as a dropped network path looks."""
    handler.wfile.flush()
    handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                  struct.pack("ii", 1, 0))
    handler.close_connection = True
    handler.connection.close()


def handler_class(schedule: Schedule, upstream: tuple[str, int]):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection, like the emulator

        def parse_request(self) -> bool:
            ok = super().parse_request()
            # curl waits a second for this before sending an upload body.
            if ok and (self.headers.get("Expect") or "").lower() == "100-continue":
                self.send_response_only(100)
                self.end_headers()
            return ok

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # the schedule keeps the log

        def _control(self) -> None:
            if self.command == "POST":
                schedule.replace(json.loads(_read_body(self) or b"[]"))
                payload = b"{}"
            else:
                payload = json.dumps(schedule.snapshot()).encode()
            self._answer(200, [("Content-Type", "application/json")], payload)

        def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
            self.send_response_only(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def _handle(self) -> None:
            if self.path.startswith(CONTROL_PATH):
                return self._control()
            rule = schedule.take(self.command, self.path)
            fault = rule["fault"] if rule else None
            if fault == "down":
                schedule.record(self.command, self.path, "down")
                return _reset(self)
            if fault == "reset":
                _read_body(self, limit=max(1, int(self.headers.get("Content-Length")
                                                  or 2) // 2))
                schedule.record(self.command, self.path, "reset")
                return _reset(self)
            body = _read_body(self)
            if fault == "503":
                schedule.record(self.command, self.path, "503")
                error = {"error": {"code": 503, "message": "injected: backend unavailable"}}
                return self._answer(503, [("Content-Type", "application/json")],
                                    json.dumps(error).encode())
            if fault == "delay":
                time.sleep(float(rule["seconds"]))
            if fault == "hold":
                time.sleep(max(0.0, float(rule["until"]) - time.time()))
            status, headers, payload = self._forward(body)
            if fault == "truncate":
                schedule.record(self.command, self.path, f"truncate({status})")
                self.send_response_only(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload[: len(payload) // 2])
                return _reset(self)
            schedule.record(self.command, self.path,
                            f"delay({rule['seconds']}s) {status}" if fault else str(status))
            self._answer(status, headers, payload)

        def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
            connection = http.client.HTTPConnection(*upstream, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in _HOP_HEADERS}
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                payload = response.read()
                kept = [(k, v) for k, v in response.getheaders()
                        if k.lower() not in _HOP_HEADERS]
                return response.status, kept, payload
            finally:
                connection.close()

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

    return Handler


def serve(upstream: str, cert: str, key: str, http_port: int = 80,
          https_port: int = 443) -> None:
    """Serves the proxy on `http_port` and, with TLS, `https_port` until killed."""
    host, port = upstream.rsplit(":", 1)
    schedule = Schedule()
    handler = handler_class(schedule, (host, int(port)))
    plain = ThreadingHTTPServer(("127.0.0.1", http_port), handler)
    secure = ThreadingHTTPServer(("127.0.0.1", https_port), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    secure.socket = context.wrap_socket(secure.socket, server_side=True)
    for server in (plain, secure):
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print(READY, flush=True)
    threading.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="the emulator, HOST:PORT")
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args()
    serve(args.upstream, args.cert, args.key)


if __name__ == "__main__":
    main()
