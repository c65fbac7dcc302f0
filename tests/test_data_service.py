"""The tf.data service: input built on other processes (`fenwicks.data.service`).

A dispatcher and two workers run as `python -m fenwicks data-service ...` processes on
loopback, as a user would start them on other machines; trainers are processes too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_digits

import fenwicks as fw
from fenwicks.data import service
from tests import _flagship as flagship
from tests.conftest import (
    last_json,
    python_env,
    run_module_json,
    run_process,
    skip_or_fail_without_namespaces,
    start_process,
)

STEPS = 96  # three epochs of the 1024 training digits at 32 per step


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _started(args: list[str]):
    """A `python -m fenwicks data-service ...` process, once it says it is serving."""
    proc = start_process(["-m", "fenwicks", "data-service", *args])
    line = proc.stdout.readline()
    if "fenwicks data-service:" not in line:
        proc.kill()
        raise AssertionError(f"data-service {args} did not start: {line}"
                             f"{proc.communicate()[1][-3000:]}")
    return proc


@pytest.fixture(scope="module")
def cluster():
    """``(address, [worker processes])``: a dispatcher and two workers on loopback."""
    port = _free_port()
    dispatcher = _started(["dispatcher", "--port", str(port)])
    workers = [_started(["worker", "--dispatcher", f"localhost:{port}", "--host",
                         "localhost"]) for _ in range(2)]
    yield f"grpc://localhost:{port}", workers
    for proc in [dispatcher, *workers]:
        proc.kill()
        proc.communicate()


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """The flagship's 1024 training digits as float32 TFRecords in 4 shards."""
    x, y = flagship.digits("mnist_net")
    fn = str(tmp_path_factory.mktemp("records") / "digits")
    fw.data.numpy_tfrecord(fn, x[:flagship.NUM_TRAIN], y[:flagship.NUM_TRAIN], num_shards=4)
    return fn + "*"


def _parser(record):
    return fw.data.tfexample_numpy_image_parser(record, 8, 8, 1, dtype="float32")


def test_training_through_the_service_learns_as_local_input_does(cluster, records, tmp_path):
    address, _ = cluster
    local = run_module_json("tests._data_service", str(tmp_path / "local"), records,
                            "local", str(STEPS))
    remote = run_module_json("tests._data_service", str(tmp_path / "remote"), records,
                             address, str(STEPS))
    assert remote["global_step"] == local["global_step"] == STEPS
    assert local["accuracy"] > 0.8, local  # the model learns: the comparison means something
    assert abs(remote["accuracy"] - local["accuracy"]) < 0.05, (local, remote)


def test_a_killed_worker_does_not_stop_training(cluster, records, tmp_path):
    address, workers = cluster
    pause = tmp_path / "pause"
    pause.mkdir()
    trainer = start_process(["-m", "tests._data_service", str(tmp_path / "run"), records,
                             address, str(STEPS), str(pause)])
    deadline = time.monotonic() + 300
    while not (pause / "trained").exists():
        assert trainer.poll() is None, trainer.communicate()
        assert time.monotonic() < deadline, "the trainer never finished its first third"
        time.sleep(0.2)
    workers[0].send_signal(signal.SIGKILL)
    workers[0].wait()
    (pause / "go").touch()
    out, err = trainer.communicate(timeout=300)
    assert trainer.returncode == 0, err[-3000:]
    result = __import__("json").loads(out.strip().splitlines()[-1])
    assert result["global_step"] == result["latest_step"] == STEPS
    assert result["accuracy"] > 0.8, result


def test_a_worker_without_a_dispatcher_is_one_line_and_status_2():
    port = _free_port()  # nothing listens there
    proc = run_process(["-m", "fenwicks", "data-service", "worker", "--dispatcher",
                        f"localhost:{port}"], check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    message = [line for line in proc.stderr.splitlines() if "fenwicks data-service" in line]
    assert len(message) == 1 and f"localhost:{port}" in message[0] and \
        "data-service dispatcher --port" in message[0], proc.stderr[-2000:]


def _listening(pid: int, port: int) -> list[str]:
    """The local addresses process `pid` listens on at `port`, as `ss` shows them."""
    out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True,
                         text=True, check=True).stdout
    return sorted(line.split()[3] for line in out.splitlines() if f"pid={pid}," in line)


def _outside_address() -> str | None:
    """This machine's address on its network (not loopback), or None if it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:  # no packet is sent: connecting a UDP socket only picks the route's source
            probe.connect(("192.0.2.254", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def _answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError:
        return False
    return True


EXPOSED = ["no authentication", "anyone who can reach this port can run dataset code",
           "private network", "firewall", "never on a public address"]


def test_servers_listen_on_localhost_unless_bind_says_otherwise():
    """The dispatcher and a worker started plainly listen on loopback only and say nothing
    of exposure; a dispatcher and a worker with ``--bind 0.0.0.0`` listen everywhere and
    each say once, on stderr, what that exposes and what to do."""
    ports = [_free_port() for _ in range(4)]
    outside = _outside_address()
    local = [_started(["dispatcher", "--port", str(ports[0])]),
             _started(["worker", "--dispatcher", f"localhost:{ports[0]}", "--port",
                       str(ports[1])])]
    wide = [_started(["dispatcher", "--port", str(ports[2]), "--bind", "0.0.0.0"]),
            _started(["worker", "--dispatcher", f"localhost:{ports[2]}", "--port",
                      str(ports[3]), "--bind", "0.0.0.0"])]
    try:
        for proc, port in zip(local, ports[:2], strict=True):
            assert _listening(proc.pid, port) == [f"[::ffff:127.0.0.1]:{port}"]
            assert _answers("127.0.0.1", port)
            if outside:
                assert not _answers(outside, port), (outside, port)
        for proc, port in zip(wide, ports[2:], strict=True):
            assert _listening(proc.pid, port) == [f"*:{port}"]
            if outside:
                assert _answers(outside, port), (outside, port)
    finally:
        errs = []
        for proc in [*local, *wide]:
            proc.kill()
            errs.append(proc.communicate()[1])
    for err in errs[:2]:
        assert "no authentication" not in err, err[-2000:]
    for err, port in zip(errs[2:], ports[2:], strict=True):
        said = [line for line in err.splitlines() if "no authentication" in line]
        assert len(said) == 1 and f"0.0.0.0:{port}" in said[0], err[-3000:]
        assert all(part in said[0] for part in EXPOSED), said[0]


def test_an_ipv6_dispatcher_is_reached_at_its_bracketed_address():
    """``--bind ::1`` and ``--dispatcher [::1]:PORT``: the dispatcher tells workers that
    address, the worker registers there, and a pipeline sent to ``grpc://[::1]:PORT``
    yields every element once (was: "Name or service not known")."""
    port = _free_port()
    dispatcher = start_process(["-m", "fenwicks", "data-service", "dispatcher", "--port",
                                str(port), "--bind", "::1"])
    try:
        said = dispatcher.stdout.readline()
        assert f"worker --dispatcher [::1]:{port}`" in said, said
        worker = _started(["worker", "--dispatcher", f"[::1]:{port}"])
        try:
            dataset = fw.data.via_data_service(tf.data.Dataset.range(10),
                                               f"grpc://[::1]:{port}")
            assert sorted(int(x) for x in dataset) == list(range(10))
        finally:
            worker.kill()
            worker.communicate()
    finally:
        dispatcher.kill()
        dispatcher.communicate()


def test_a_busy_port_is_one_line_naming_it_and_status_2():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_process(["-m", "fenwicks", "data-service", "dispatcher", "--port",
                            str(port)], check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    message = [line for line in proc.stderr.splitlines() if "fenwicks data-service" in line]
    assert len(message) == 1 and f"port {port} " in message[0] and "in use" in message[0] \
        and "--port" in message[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_a_worker_named_for_other_machines_but_listening_locally_is_refused():
    with pytest.raises(ValueError, match="host='10.1.2.3'.*listens on localhost only.*"
                                         "--bind 0.0.0.0"):
        service.start_worker("localhost:1", host="10.1.2.3")
    with pytest.raises(ValueError, match="bind='no-such-host.invalid' is not an address"):
        service.start_dispatcher(_free_port(), bind="no-such-host.invalid")


OUTSIDE = "10.203.0.1"  # the veth address of the test's namespace: not loopback


@pytest.fixture
def namespace():
    """A network namespace of this test: loopback up, a veth pair whose end ``fw0`` has
    `OUTSIDE`, no other process in it. Skips without root, fails under CI."""
    name = f"fw-listen-{os.getpid()}"
    steps = [["ip", "netns", "add", name], ["ip", "-n", name, "link", "set", "lo", "up"],
             ["ip", "-n", name, "link", "add", "fw0", "type", "veth", "peer", "name", "fw1"],
             ["ip", "-n", name, "addr", "add", f"{OUTSIDE}/24", "dev", "fw0"],
             ["ip", "-n", name, "link", "set", "fw0", "up"],
             ["ip", "-n", name, "link", "set", "fw1", "up"]]
    try:
        for step in steps:
            subprocess.run(step, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as err:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
        skip_or_fail_without_namespaces(
            f"cannot make a network namespace ({getattr(err, 'stderr', '') or err})")
    yield name
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)


def test_servers_started_from_many_threads_at_once_listen_on_localhost_only(namespace):
    """Six threads start a localhost dispatcher each at the same moment, five rounds:
    every one starts, answers on 127.0.0.1 and not on the namespace's other address
    (where a plain wildcard socket does answer). Without one lock around the bind
    narrowing this crashed the process or raised PermissionError (mprotect)."""
    threads, rounds = 6, 5
    proc = subprocess.run(
        ["ip", "netns", "exec", namespace, sys.executable, "-m", "tests._listen_threads",
         OUTSIDE, str(threads), str(rounds), "20001"],
        env=python_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = last_json(proc.stdout)
    assert report == {"control_answered": True, "started": threads * rounds,
                      "errors": [], "answered_outside": [], "local_refused": []}, report


# ------------------------------------------------------------------ in-process: bad input

def test_an_address_that_is_not_host_port_names_the_argument(records):
    for bad in ["localhost", "grpc://localhost:http", "host:0", ":5050", 5050]:
        with pytest.raises(ValueError, match="data_service=.*grpc://localhost:5050"):
            fw.data.tfrecord_ds(records, _parser, 32, data_service=bad)


def test_no_dispatcher_is_a_connection_error_not_a_hang(records):
    port = _free_port()
    start = time.perf_counter()
    with pytest.raises(ConnectionError, match=f"localhost:{port}.*dispatcher --port {port}"):
        fw.data.tfrecord_ds(records, _parser, 32, data_service=f"grpc://localhost:{port}")
    assert time.perf_counter() - start < service.CONNECT_TIMEOUT_S + 5


def test_processing_modes_are_checked(records):
    with pytest.raises(ValueError, match="processing_mode='one_epoch' must be one of"):
        fw.data.tfrecord_ds(records, _parser, 32, data_service="localhost:5050",
                            processing_mode="one_epoch")
    # every worker would produce the same seeded stream: training would see it twice
    with pytest.raises(ValueError, match="parallel_epochs.*seed=1.*distributed_epoch"):
        fw.data.tfrecord_ds(records, _parser, 32, seed=1, data_service="localhost:5050",
                            processing_mode="parallel_epochs")
    with pytest.raises(ValueError, match="processing_mode='parallel_epochs' applies to a"):
        fw.data.tfrecord_ds(records, _parser, 32, processing_mode="parallel_epochs")


def test_evaluation_input_stays_local(records):
    with pytest.raises(ValueError, match="for training input.*training=False"):
        fw.data.tfrecord_ds(records, _parser, 32, training=False,
                            data_service="localhost:5050")


def test_a_pipeline_that_calls_python_is_refused_before_it_is_sent(monkeypatch):
    x, y = load_digits(return_X_y=True)
    # numpy_ds gathers arrays over 64 MB with numpy (a Python callback); small ones in-graph
    monkeypatch.setattr(fw.data.arrays, "IN_GRAPH_BYTES", 0)
    with socket.socket() as listener:  # something answers, so only the pipeline is wrong
        listener.bind(("localhost", 0))
        listener.listen()
        address = f"localhost:{listener.getsockname()[1]}"
        with pytest.raises(ValueError, match="calls Python.*numpy_tfrecord.*tfrecord_ds"):
            fw.data.via_data_service(fw.data.numpy_ds(x, y, 32), address)
        plain = tf.data.Dataset.from_tensor_slices(np.arange(4))
        with pytest.raises(ValueError, match="calls Python"):
            fw.data.via_data_service(
                plain.map(lambda v: tf.py_function(lambda a: a, [v], tf.int64)), address)


def test_in_process_servers_divide_the_epochs_between_workers(records, caplog):
    """Each worker builds whole epochs: over the first four epochs' worth of batches every
    example arrives about four times, never more than one epoch of difference per
    worker (the epoch each worker is still building when the reading stops)."""
    dispatcher = service.start_dispatcher(_free_port())
    address = dispatcher.target[len("grpc://"):]
    workers = [service.start_worker(address, host="localhost") for _ in range(2)]
    try:
        ds = fw.data.tfrecord_ds(records, _parser, 32, seed=5, data_service=address)
        batches = 4 * flagship.NUM_TRAIN // 32
        pixels = np.concatenate([x.numpy().reshape(len(x), -1) for x, _ in ds.take(batches)])
    finally:
        for server in [*workers, dispatcher]:
            server.stop()
    x, _ = flagship.digits("mnist_net")
    index = {row.tobytes(): i for i, row in enumerate(x[:flagship.NUM_TRAIN].reshape(
        flagship.NUM_TRAIN, -1))}
    counts = np.bincount([index[row.tobytes()] for row in pixels], minlength=len(index))
    # what the service gives up is said when it is used, not discovered
    said = [r.getMessage() for r in caplog.records if "tf.data service at" in r.getMessage()]
    assert len(said) == 1 and "seed no longer makes the order repeat" in said[0] and \
        "epoch 0" in said[0], said
    assert counts.sum() == 4 * flagship.NUM_TRAIN
    assert 2 <= counts.min() and counts.max() <= 6, np.bincount(counts)
