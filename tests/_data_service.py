"""A trainer whose input may come from a tf.data service (run by tests/test_data_service.py).

    python -m tests._data_service WORK_DIR RECORDS SERVICE STEPS [PAUSE_DIR]

trains the narrow `mnist_net` of `tests._flagship` for STEPS on the TFRecords RECORDS
(``fn*``), read on this host when SERVICE is ``local``, else through the dispatcher at
SERVICE, evaluates on the held-out digits (always local) and prints one JSON line. With
PAUSE_DIR it trains a third of the steps, writes ``PAUSE_DIR/trained``, waits for
``PAUSE_DIR/go`` (the test kills a worker in between) and trains the rest.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import fenwicks as fw
from tests import _faults
from tests import _flagship as flagship

MODEL = "mnist_net"


def train_input(records: str, service: str) -> Any:
    def parser(record):
        return fw.data.tfexample_numpy_image_parser(record, 8, 8, 1, dtype="float32")
    remote = None if service == "local" else service
    return lambda params: fw.data.tfrecord_ds(records, parser, params["batch_size"],
                                              data_service=remote)


def wait_for(path: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"nobody wrote {path}")
        time.sleep(0.1)


def run(work_dir: str, records: str, service: str, steps: str,
        pause_dir: str | None = None) -> dict[str, Any]:
    x, y = flagship.digits(MODEL)
    est = flagship.estimator(MODEL, work_dir, val_bs=64, steps_per_loop=8)
    train_fn = train_input(records, service)
    steps = int(steps)
    start = time.perf_counter()
    if pause_dir:
        est.train(train_fn, steps=steps // 3)
        open(os.path.join(pause_dir, "trained"), "w").close()
        wait_for(os.path.join(pause_dir, "go"))
        est.train(train_fn, max_steps=steps)
    else:
        est.train(train_fn, steps=steps)
    seconds = time.perf_counter() - start
    result = est.evaluate(flagship.eval_input(x, y))
    return {"accuracy": float(result["accuracy"]), "global_step": int(result["global_step"]),
            "latest_step": _faults.latest_step(work_dir), "seconds": seconds}


if __name__ == "__main__":
    print(json.dumps(run(*sys.argv[1:])))
