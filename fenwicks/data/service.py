"""Input beyond one host: TensorFlow's tf.data service (a dispatcher and workers).

A TPU or GPU host whose CPU cannot decode and augment fast enough can move that work to
other machines: start a dispatcher and workers there (``python -m fenwicks data-service
dispatcher --port 5050`` and ``... worker --dispatcher HOST:5050``, which run
`tf.data.experimental.service` servers) and send a training pipeline through them with
``fw.data.tfrecord_ds(..., data_service='grpc://HOST:5050')`` or, for a pipeline of your
own, `via_data_service`. The training host then only receives finished batches.

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

import logging
import socket
from typing import Any

import tensorflow as tf

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

    Raises:
        ValueError: naming `name`, for anything else.
    """
    text = service[len("grpc://"):] if isinstance(service, str) and \
        service.startswith("grpc://") else service
    host, _, port = text.rpartition(":") if isinstance(text, str) else ("", "", "")
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
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise ConnectionError(
            f"{name}={service!r}: no tf.data dispatcher answers at {host}:{port} ({err}); "
            f"start one there with `python -m fenwicks data-service dispatcher --port "
            f"{port}` and workers with `... worker --dispatcher {host}:{port}`") from err
    return f"grpc://{host}:{port}"


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
    graph = tf.compat.v1.GraphDef.FromString(
        dataset._as_serialized_graph().numpy())  # noqa: SLF001 - what the service sends
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

    Example:
        >>> ds = fw.data.via_data_service(my_pipeline(params), 'grpc://10.0.0.2:5050')
    """
    check_processing_mode(processing_mode)
    target = check_reachable(service, "service")
    check_no_python(dataset)
    distributed = dataset.apply(tf.data.experimental.service.distribute(
        processing_mode, target, job_name=job_name))
    return distributed.prefetch(tf.data.AUTOTUNE)


def start_dispatcher(port: int, work_dir: str | None = None) -> Any:
    """Starts a tf.data service dispatcher on `port` (all interfaces); returns the server.

    With `work_dir` (a directory, local or ``gs://``) the dispatcher journals its state
    there and a restarted dispatcher continues the running jobs.

    Example:
        >>> fw.data.service.start_dispatcher(5050).join()   # serve until killed
    """
    config = tf.data.experimental.service.DispatcherConfig(
        port=_check_port(port, "port"), work_dir=work_dir,
        fault_tolerant_mode=work_dir is not None, worker_timeout_ms=WORKER_TIMEOUT_MS)
    return tf.data.experimental.service.DispatchServer(config)


def start_worker(dispatcher: str, port: int = 0, host: str | None = None) -> Any:
    """Starts a tf.data service worker registered with `dispatcher`; returns the server.

    Args:
        dispatcher: ``'host:port'`` (or ``grpc://host:port``) of the dispatcher.
        port: this worker's port. Defaults to 0: any free port.
        host: the name trainers reach this worker by. Defaults to this machine's name.

    Example:
        >>> fw.data.service.start_worker('10.0.0.2:5050').join()
    """
    target = check_reachable(dispatcher, "dispatcher")
    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=target[len("grpc://"):], port=_check_port(port, "port", 0),
        worker_address=f"{host or socket.gethostname()}:%port%",
        heartbeat_interval_ms=HEARTBEAT_MS)
    return tf.data.experimental.service.WorkerServer(config)


def _check_port(port: Any, name: str, lowest: int = 1) -> int:
    if isinstance(port, bool) or not isinstance(port, int) or not lowest <= port < 65536:
        raise ValueError(f"{name}={port!r} must be an integer in [{lowest}, 65535]")
    return port
