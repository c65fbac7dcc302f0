"""Servers started from several threads at once (run by tests/test_data_service.py).

    python -m tests._listen_threads OUTSIDE THREADS ROUNDS FIRST_PORT

Run inside a network namespace of the test's own, where OUTSIDE is an address of a veth
interface (not loopback) and no other process holds a port. Each round starts THREADS
dispatchers with ``bind='localhost'`` at once (threads released by one barrier, so their
starts overlap), on ports FIRST_PORT, FIRST_PORT + 1, ...; then for each one that
started, tries a TCP connection to 127.0.0.1 and to OUTSIDE at its port. First, a control: a
plain socket listening on every interface at FIRST_PORT - 1 must answer at OUTSIDE.
Prints one JSON line: ``{"control_answered", "started", "errors": [..],
"answered_outside": [ports], "local_refused": [ports]}``.
"""

from __future__ import annotations

import json
import socket
import sys
import threading

from fenwicks.data import service


def _answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError:
        return False
    return True


def _round(ports: list[int], report: dict) -> list:
    barrier = threading.Barrier(len(ports))
    servers: dict[int, object] = {}
    lock = threading.Lock()

    def start(port: int) -> None:
        barrier.wait()
        try:
            server = service.start_dispatcher(port)
        except Exception as err:  # noqa: BLE001 - what the test asserts on
            with lock:
                report["errors"].append(f"{type(err).__name__}: {err}"[:300])
            return
        with lock:
            servers[port] = server

    threads = [threading.Thread(target=start, args=(port,)) for port in ports]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sorted(servers.items())


def main(outside: str, threads: int, rounds: int, first_port: int) -> dict:
    with socket.create_server(("", first_port - 1)) as control:
        control_answered = _answers(outside, control.getsockname()[1])
    report: dict = {"control_answered": control_answered, "started": 0, "errors": [],
                    "answered_outside": [], "local_refused": []}
    running = []  # stopped at the end: a stopped server's port may linger
    for r in range(rounds):
        ports = [first_port + r * threads + i for i in range(threads)]
        for port, server in _round(ports, report):
            report["started"] += 1
            running.append(server)
            if _answers(outside, port):
                report["answered_outside"].append(port)
            if not _answers("127.0.0.1", port):
                report["local_refused"].append(port)
    for server in running:
        server.stop()
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                          int(sys.argv[4]))), flush=True)
