"""One worker of a two-process `MultiWorkerMirroredStrategy` run on loopback.

    TF_CONFIG=... python -m tests._multiworker WORK_DIR MAX_STEPS

trains the narrow `mnist_net` of `tests._flagship` to MAX_STEPS, evaluates it, tries to
predict (single-host only) and prints one JSON line. With ``MULTIWORKER_WARMUP=1`` it
trains one step and prints ``READY`` first, so a test can kill a worker mid-run. With
``MULTIWORKER_SLOW_CHIEF_STATE=S`` the chief takes S more seconds to name each new
checkpoint in work_dir's state file (after the first), so the other worker reaches
`evaluate` while work_dir still names the previous checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np

import fenwicks as fw
from tests import _faults
from tests import _flagship as flagship

MODEL = "mnist_net"


def run(work_dir: str, max_steps: str) -> dict[str, Any]:
    start = _faults.latest_step(work_dir)  # what this run resumes from
    acc = fw.accel.current()
    slow = os.environ.get("MULTIWORKER_SLOW_CHIEF_STATE")
    if slow and json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
        _faults.slow_commits(float(slow), work_dir.startswith("gs://"))
    x, y = flagship.digits(MODEL)
    est = flagship.estimator(MODEL, work_dir, val_bs=64, steps_per_loop=5,
                             save_every_loops=1, save_every_secs=None)
    train_fn = flagship.train_input(x, y)
    if os.environ.get("MULTIWORKER_WARMUP"):
        est.train(train_fn, steps=1)
        print("READY", flush=True)
    est.train(train_fn, max_steps=int(max_steps))
    result = est.evaluate(flagship.eval_input(x, y))
    try:
        est.predict(flagship.eval_input(x, y))
        predict_error = None
    except ValueError as err:
        predict_error = str(err)
    logits = np.asarray(est.model(x[flagship.NUM_TRAIN:], training=False), np.float64)
    return {"workers": acc.num_workers, "replicas": acc.num_replicas, "start": start,
            "step": est.global_step, "eval": result, "predict_error": predict_error,
            "logits": logits.tolist()}


if __name__ == "__main__":
    print(json.dumps(run(*sys.argv[1:])), flush=True)
