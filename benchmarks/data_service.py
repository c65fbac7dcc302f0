"""The tf.data service: how much input work leaves the training process?

On one machine the service cannot add CPUs; what it changes is WHERE the input work runs.
This script writes CIFAR-shaped TFRecords (random uint8 32x32x3 images, made locally),
then reads the same augmented training stream (`fw.data.tfrecord_ds` with pad-crop, flip
and cutout per example) two ways in this process, the trainer:

  local    the pipeline runs here
  service  `python -m fenwicks data-service dispatcher` and one `... worker` run as
           separate processes; this process only receives finished batches

and prints, for each, examples per second and the trainer's CPU seconds per 1000
examples (``time.process_time``: every thread of this process), then the ratios
service/local. On a real cluster the workers are other machines, so the CPU seconds the
trainer no longer spends are CPU it gets back; on this 2-core machine the workers share
the cores, so examples/s shows the cost of the extra hop, not a speed-up. Run:

    python benchmarks/data_service.py                  # 20,000 examples, 200 batches
    python benchmarks/data_service.py --examples 4000 --batches 50   # quick look
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout

import fenwicks as fw  # noqa: E402
from benchmarks import _results  # noqa: E402

BATCH = 128
CIFAR_MEAN, CIFAR_STD = (125.3, 123.0, 113.9), (63.0, 62.1, 66.7)


def augment(x):
    x = fw.transform.random_pad_crop(x, 4)
    x = fw.transform.random_flip(x)
    x = fw.transform.cutout(x, 8, 8)
    return fw.transform.standard_scaler(x, CIFAR_MEAN, CIFAR_STD)


def parser(record):
    return fw.data.tfexample_numpy_image_parser(record, 32, 32, 3)


def make_records(directory: str, examples: int) -> str:
    rng = np.random.default_rng(0)
    xs = rng.integers(0, 256, (examples, 32, 32, 3), dtype=np.uint8)
    fw.data.numpy_tfrecord(os.path.join(directory, "train"), xs, rng.integers(0, 10, examples),
                           num_shards=8)
    return os.path.join(directory, "train*")


def measure(pattern: str, batches: int, service: str | None) -> dict[str, float]:
    """Examples/s and this process's CPU seconds per 1000 examples over `batches`."""
    ds = fw.data.tfrecord_ds(pattern, parser, BATCH, transform=augment,
                             data_service=service)
    it = iter(ds)
    for _ in range(10):  # warm-up: pipelines started, buffers filled
        next(it)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(it)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    examples = batches * BATCH
    return {"examples_per_s": examples / wall, "cpu_s_per_1000": 1000 * cpu / examples}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _serve(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "fenwicks", "data-service", *args],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if "fenwicks data-service:" not in line:
        proc.kill()
        raise SystemExit(f"data-service {' '.join(args)} did not start")
    return proc


def main() -> None:
    parser_ = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser_.add_argument("--examples", type=int, default=20_000)
    parser_.add_argument("--batches", type=int, default=200)
    _results.add_option(parser_)
    args = parser_.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pattern = make_records(tmp, args.examples)
        local = measure(pattern, args.batches, None)
        port = _free_port()
        servers = [_serve("dispatcher", "--port", str(port))]
        try:
            servers.append(_serve("worker", "--dispatcher", f"localhost:{port}",
                                  "--host", "localhost"))
            remote = measure(pattern, args.batches, f"grpc://localhost:{port}")
        finally:
            for proc in servers:
                proc.kill()
                proc.wait()
    for name, row in (("local", local), ("service", remote)):
        print(f"{name:8s} {row['examples_per_s']:9.0f} examples/s   "
              f"{row['cpu_s_per_1000']:6.3f} trainer CPU s per 1000 examples")
    ratios = {"cpu_service_over_local": remote["cpu_s_per_1000"] / local["cpu_s_per_1000"],
              "speed_service_over_local": remote["examples_per_s"] / local["examples_per_s"]}
    print(f"trainer CPU service/local = {ratios['cpu_service_over_local']:.2f}   "
          f"examples/s service/local = {ratios['speed_service_over_local']:.2f}")
    print(json.dumps({"local": local, "service": remote, **ratios}))
    if args.results:
        _results.write(__file__, "augmented CIFAR-shaped input on the trainer vs through a "
                       "tf.data service worker on the same machine",
                       [{"input": name, **row} for name, row in
                        (("local", local), ("service", remote))],
                       summary=f"trainer CPU service/local "
                       f"{ratios['cpu_service_over_local']:.2f}, examples/s service/local "
                       f"{ratios['speed_service_over_local']:.2f}")


if __name__ == "__main__":
    main()
