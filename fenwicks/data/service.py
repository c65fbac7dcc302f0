"""Input beyond one host: TensorFlow's tf.data service (a dispatcher and workers).

A TPU or GPU host whose CPU cannot decode and augment fast enough can move that work to
other machines: start a dispatcher and workers there (``python -m fenwicks data-service
dispatcher --port 5050`` and ``... worker --dispatcher HOST:5050``, which run
`tf.data.experimental.service` servers) and send a training pipeline through them with
``fw.data.tfrecord_ds(..., data_service='grpc://HOST:5050')`` or, for a pipeline of your
own, `via_data_service`. The training host then only receives finished batches.

Security: the tf.data service has no authentication, and a dataset graph can read and
write files and run programs on the worker. Servers therefore listen on localhost unless
``--bind`` (``bind=``) names a wider address, and then warn once (see `exposure_warning`).

Processing mode: ``'distributed_epoch'`` (the default) lets the dispatcher hand out
*splits* of the source. Fenwicks' training streams are a sequence of epochs, so a split
is one epoch: each worker builds whole epochs and every example is still seen once per
epoch, while the work is divided between the workers. ``'parallel_epochs'`` has every
worker produce the whole stream; with a seed all workers produce the same order, so the
trainer would see each batch once per worker. Fenwicks refuses that combination.

What the service gives up, by its nature: determinism (batches arrive in the order the
workers finish them) and Fenwicks' exact mid-epoch resume position (a resumed run starts
the stream again at the epoch it stopped in, not at the batch). Evaluation and
prediction stay local: exact evaluation needs one ordered pass.

A worker that dies is dropped by the dispatcher; training continues on the others (the
epoch it was building is cut short). If every worker is gone, the trainer waits for one
to come back: the tf.data service has no deadline of its own for that case.
"""

from __future__ import annotations

import errno
import getpass
import ipaddress
import logging
import os
import socket
from typing import Any

import tensorflow as tf

from fenwicks import _tf_internals
from fenwicks.data import _listen

logger = logging.getLogger("fenwicks")

PROCESSING_MODES = ("distributed_epoch", "parallel_epochs")
# A worker tells the dispatcher it is alive every second, and the dispatcher drops one
# silent for 5 s, so a dead worker's share of the work moves within seconds (TensorFlow's
# defaults are 30 s and 1 h, made for big clusters that restart workers).
HEARTBEAT_MS = 1000
WORKER_TIMEOUT_MS = 5000
CONNECT_TIMEOUT_S = 5.0
# Ops that call back into the Python of the process that built the dataset: a service
# worker is another process and cannot run them.
_PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})


def service_address(service: Any, name: str = "data_service") -> tuple[str, int]:
    """``(host, port)`` of a dispatcher given as ``'grpc://host:port'`` or ``'host:port'``.

    An IPv6 address is written in brackets, ``'[::1]:5050'``; `host` comes without them.

    Raises:
        ValueError: naming `name`, for anything else.

    Examples:
        >>> fw.data.service.service_address('grpc://[::1]:5050')
        ('::1', 5050)
    """
    text = service[len("grpc://"):] if isinstance(service, str) and \
        service.startswith("grpc://") else service
    host, _, port = text.rpartition(":") if isinstance(text, str) else ("", "", "")
    if host.startswith("[") and host.endswith("]"):  # socket wants ::1, gRPC [::1]
        host = host[1:-1]
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{name}={service!r} must be a dispatcher address such as "
                         "'grpc://localhost:5050' or 'host:5050' (start one with "
                         "`python -m fenwicks data-service dispatcher --port 5050`)")
    return host, int(port)


def check_reachable(service: str, name: str = "data_service") -> str:
    """The ``grpc://`` target of `service` once a TCP connection to it succeeds.

    Without this check a pipeline pointed at no dispatcher retries for ever.

    Raises:
        ConnectionError: naming the address and how to start a dispatcher there.
    """
    host, port = service_address(service, name)
    joined = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise ConnectionError(
            f"{name}={service!r}: no tf.data dispatcher answers at {joined} ({err}); "
            f"start one there with `python -m fenwicks data-service dispatcher --port "
            f"{port}` and workers with `... worker --dispatcher {joined}`") from err
    return f"grpc://{joined}"


def check_processing_mode(processing_mode: Any, seed: int | None = None) -> str:
    """Validates `processing_mode` (see the module docstring for the choice)."""
    if processing_mode not in PROCESSING_MODES:
        raise ValueError(f"processing_mode={processing_mode!r} must be one of "
                         f"{PROCESSING_MODES}; 'distributed_epoch' divides the epochs "
                         "between the workers")
    if processing_mode == "parallel_epochs" and seed is not None:
        raise ValueError(
            f"processing_mode='parallel_epochs' with seed={seed}: every worker would "
            "produce the same batches in the same order, so training would see each one "
            "once per worker. Use processing_mode='distributed_epoch' (the default)")
    return processing_mode


def check_no_python(dataset: tf.data.Dataset, name: str = "dataset") -> None:
    """Raises if `dataset` calls Python functions, which service workers cannot run."""
    graph = _tf_internals.dataset_graph(dataset)
    ops = {node.op for node in graph.node}
    ops |= {node.op for f in graph.library.function for node in f.node_def}
    found = sorted(ops & _PYTHON_OPS)
    if found:
        raise ValueError(
            f"{name} calls Python ({', '.join(found)}: tf.py_function or "
            "tf.numpy_function, as fw.data.numpy_ds does for arrays over 64 MB), which a "
            "tf.data service worker, another process, cannot run. Write the data to TFRecords "
            "(fw.data.numpy_tfrecord) and read them with fw.data.tfrecord_ds(..., "
            "data_service=...), or keep this pipeline local")


def via_data_service(dataset: tf.data.Dataset, service: str, *,
                     processing_mode: str = "distributed_epoch",
                     job_name: str | None = None) -> tf.data.Dataset:
    """Runs `dataset` on tf.data service workers; this process receives its elements.

    The whole pipeline (reading, decoding, augmenting, batching) moves to the workers,
    so it must be built from TensorFlow ops only: no ``tf.py_function`` (as in
    `fw.data.numpy_ds` for arrays over 64 MB), and files the workers can read
    (``gs://``, or a disk they share).

    Args:
        dataset: a training pipeline, e.g. from `fw.data.tfrecord_ds`.
        service: the dispatcher, ``'grpc://host:port'`` or ``'host:port'``.
        processing_mode: ``'distributed_epoch'`` (the dispatcher divides the source, for
            Fenwicks' streams epoch by epoch, between the workers) or
            ``'parallel_epochs'`` (every worker produces the whole stream; only for an
            unseeded, shuffled stream). Defaults to ``'distributed_epoch'``.
        job_name: consumers with the same job name share one job (several trainers
            reading one stream). Defaults to None: a job of its own.

    Returns:
        A `tf.data.Dataset` of the same elements, prefetched on this host.

    Raises:
        ValueError: for a bad address or mode, or a pipeline that calls Python.
        ConnectionError: if no dispatcher answers at `service` within 5 s.

    Examples:
        >>> ds = fw.data.via_data_service(my_pipeline(params), 'grpc://10.0.0.2:5050')
    """
    check_processing_mode(processing_mode)
    target = check_reachable(service, "service")
    check_no_python(dataset)
    distributed = dataset.apply(tf.data.experimental.service.distribute(
        processing_mode, target, job_name=job_name))
    return distributed.prefetch(tf.data.AUTOTUNE)


def start_dispatcher(port: int, work_dir: str | None = None,
                     bind: str = "localhost") -> Any:
    """Starts a tf.data service dispatcher on `bind`:`port`; returns the server.

    The tf.data service has no authentication: anyone who can reach the port can run
    dataset code on this machine as this user. So it listens on this machine only
    unless `bind` says otherwise; a wider `bind` logs that warning once.

    Args:
        port: the port trainers and workers connect to.
        work_dir: a directory (local or ``gs://``) where the dispatcher journals its
            state, so a restarted dispatcher continues the running jobs. Defaults to
            None: no journal.
        bind: the address to listen on: ``'localhost'``, one of this machine's
            addresses (a private network's), or ``'0.0.0.0'`` for every interface.
            Defaults to ``'localhost'``.

    Raises:
        OSError: naming the port, if it is in use or cannot be listened on.

    Examples:
        >>> fw.data.service.start_dispatcher(5050, bind='10.0.0.2').join()  # until killed
    """
    config = tf.data.experimental.service.DispatcherConfig(
        port=_check_port(port, "port"), work_dir=work_dir,
        fault_tolerant_mode=work_dir is not None, worker_timeout_ms=WORKER_TIMEOUT_MS)
    return _listening(lambda: tf.data.experimental.service.DispatchServer(config),
                      bind, port, "dispatcher")


def start_worker(dispatcher: str, port: int = 0, host: str | None = None,
                 bind: str = "localhost") -> Any:
    """Starts a tf.data service worker registered with `dispatcher`; returns the server.

    Like the dispatcher, a worker runs any dataset code a client sends, so it listens on
    this machine only unless `bind` says otherwise (see `start_dispatcher`).

    Args:
        dispatcher: ``'host:port'`` (or ``grpc://host:port``) of the dispatcher.
        port: this worker's port. Defaults to 0: any free port.
        host: the name trainers reach this worker by. Defaults to ``'localhost'`` when
            `bind` is loopback, the `bind` address when it is one, else (every
            interface) this machine's name.
        bind: the address to listen on (see `start_dispatcher`). Defaults to
            ``'localhost'``.

    Raises:
        ValueError: for a `host` other machines would use on a loopback-only worker.
        OSError: naming the port, if it is in use or cannot be listened on.

    Examples:
        >>> fw.data.service.start_worker('10.0.0.2:5050', bind='10.0.0.3').join()
    """
    port = _check_port(port, "port", 0)
    address = listen_address(bind)
    if host is None:  # the address trainers can reach: the one it listens on
        host = "localhost" if _is_loopback(address) else \
            socket.gethostname() if _is_wildcard(address) else address
    elif _is_loopback(address) and not _names_loopback(host):
        raise ValueError(
            f"host={host!r} tells trainers on other machines to reach this worker, but it "
            f"listens on {bind} only; add bind='0.0.0.0' (--bind 0.0.0.0) on a private "
            "network, or leave host out")
    target = check_reachable(dispatcher, "dispatcher")
    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=target[len("grpc://"):], port=port,
        worker_address=f"{host}:%port%", heartbeat_interval_ms=HEARTBEAT_MS)
    return _listening(lambda: tf.data.experimental.service.WorkerServer(config),
                      bind, port, "worker")


def listen_address(bind: Any) -> str:
    """The IP address `bind` names (``'0.0.0.0'`` or ``'::'`` for every interface).

    Raises:
        ValueError: naming `bind`, for a name that does not resolve.

    Examples:
        >>> fw.data.service.listen_address('localhost')
        '127.0.0.1'
    """
    if not isinstance(bind, str) or not bind:
        raise ValueError(f"bind={bind!r} must be an address such as 'localhost' (this "
                         "machine only, the default) or '0.0.0.0' (every interface)")
    if bind in ("*", "[::]"):
        return "::"
    if bind == "localhost":  # IPv4's loopback, whichever family the resolver puts first
        return "127.0.0.1"
    try:
        return _resolve(bind.strip("[]"))
    except OSError as err:
        raise ValueError(f"bind={bind!r} is not an address of this machine ({err}); use "
                         "'localhost', '0.0.0.0' or one of its IP addresses") from err


def exposure_warning(bind: str, port: int, role: str = "server") -> str | None:
    """The warning for a server listening beyond this machine; None for loopback.

    Examples:
        >>> print(fw.data.service.exposure_warning('0.0.0.0', 5050, 'dispatcher'))
        WARNING: the tf.data service dispatcher listens on 0.0.0.0:5050 (every network
        interface). The tf.data service has no authentication: anyone who can reach this
        port can run dataset code on this machine as user ... never on a public address.
        Without --bind it listens on localhost only.
        >>> fw.data.service.exposure_warning('localhost', 5050) is None
        True
    """
    address = listen_address(bind)
    if _is_loopback(address):
        return None
    where = "every network interface" if _is_wildcard(address) else address
    user = _user_name()
    return (f"WARNING: the tf.data service {role} listens on {bind}:{port} ({where}). "
            "The tf.data service has no authentication: anyone who can reach this port "
            f"can run dataset code on this machine as user {user!r} (read and write its "
            "files, run its programs). Use it only on a private network, or behind a "
            "firewall that lets in just your trainers and workers; never on a public "
            "address. Without --bind it listens on localhost only.")


def _listening(make: Any, bind: str, port: int, role: str) -> Any:
    """Starts a server with `make()` on `bind`:`port` and checks where it listens."""
    address = listen_address(bind)
    if port:
        _check_port_free(address, port, bind)
    with _listen.LOCK:  # one start at a time in this process (see `_listen`)
        server = _started(make, address, bind, port, role)
        if not _is_wildcard(address):
            _check_listeners(server, address, bind, role)
    warning = exposure_warning(bind, port or _bound_port(server), role)
    if warning:
        logger.warning(warning)
    return server


def _started(make: Any, address: str, bind: str, port: int, role: str) -> Any:
    try:
        if _is_wildcard(address):
            return make()
        with _listen.narrowed(address, os.path.dirname(tf.__file__)):
            return make()
    except RuntimeError as err:  # TensorFlow's whole message: "Could not start gRPC server"
        raise _port_error(f"the tf.data service {role} could not listen on {bind}:"
                          f"{port or '(any port)'} ({_one_line(err)}); is the port in use? "
                          "Choose another --port or stop what uses it") from err


def _check_port_free(address: str, port: int, bind: str) -> None:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family) as probe:
        # as gRPC does: a port whose old connections linger in TIME_WAIT is free
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as err:
            if err.errno != errno.EADDRINUSE:  # EADDRNOTAVAIL: another machine's address
                raise _port_error(f"cannot listen on {bind} ({err.strerror}): it is not "
                                  "an address of this machine; use 'localhost', '0.0.0.0' "
                                  "or one of its own addresses", err.errno) from err
            raise _port_error(f"port {port} on {bind} is already in use ({err.strerror}); "
                              "choose another --port, or stop the process that listens "
                              f"there (`ss -ltnp 'sport = :{port}'` names it)",
                              err.errno) from err


def _check_listeners(server: Any, address: str, bind: str, role: str) -> None:
    """Stops `server` if it listens anywhere but `address` (a narrowing that failed)."""
    port = _bound_port(server)
    allowed = {address, "::ffff:" + address}
    wide = [where for where in _listen.listeners(port)
            if where.rpartition(":")[0].strip("[]") not in allowed]
    if wide:
        server.stop()
        raise OSError(f"the tf.data service {role} was asked to listen on {bind}:{port} "
                      f"but listens on {', '.join(wide)}; it was stopped. Start it with "
                      "--bind 0.0.0.0 on a private network instead")


def _port_error(message: str, code: int | None = errno.EADDRINUSE) -> OSError:
    """An OSError whose text is `message` alone (the CLI prints it as one line)."""
    err = OSError(message)
    err.errno = code
    return err


def _bound_port(server: Any) -> int:
    """The port `server` listens on (chosen when it started, for ``port=0``)."""
    if isinstance(server, tf.data.experimental.service.DispatchServer):
        return int(server.target.rpartition(":")[2])  # grpc://localhost:PORT
    return int(_tf_internals.worker_address(server).rpartition(":")[2])


def _resolve(name: str) -> str:
    return socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)[0][4][0]


def _names_loopback(host: str) -> bool:
    try:
        return _is_loopback(_resolve(host))
    except OSError:  # a name this machine cannot resolve is not its loopback
        return False


def _is_wildcard(address: str) -> bool:
    return ipaddress.ip_address(address).is_unspecified


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def _user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return f"uid {os.getuid()}"


def _one_line(err: BaseException) -> str:
    return next((line.strip() for line in str(err).splitlines() if line.strip()),
                type(err).__name__)


def _check_port(port: Any, name: str, lowest: int = 1) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not lowest <= port < 65536:
        raise ValueError(f"{name}={port!r} must be an integer in [{lowest}, 65535]")
    return port
