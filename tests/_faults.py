"""Training processes for `tests/test_faults.py` to kill, preempt and starve of disk.

    python -m tests._faults train WORK_DIR MAX_STEPS [STEPS_PER_LOOP]

trains a narrow `mnist_net` on the digits (as `tests._flagship` does) with a checkpoint
after every compiled loop, and prints one JSON line: the step it started from, the step
it reached and every model variable. Environment knobs for the tests:

* ``FAULTS_SLOW_COMMIT=<secs>``: from the second checkpoint on, sleep once a step's files
  are written and before it is committed (orbax's rename of
  ``<step>.orbax-checkpoint-tmp-*`` to ``<step>``; on ``gs://`` the commit marker
  uploaded last), printing ``COMMIT <step>`` first: a window wide enough to kill the
  process mid-save on purpose. Every save also prints ``WRITE <step> IN_THREAD <name>``:
  the thread writing (with asynchronous checkpoints, a background writer; training goes
  on meanwhile).
* ``FAULTS_SYNC=1``: ``async_checkpoints=False`` (each save blocks until written).
* ``FAULTS_WARMUP=1``: train one step and print ``READY`` before the long run, so a
  test can signal the process while it is inside a compiled loop.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

import numpy as np

import fenwicks as fw
from fenwicks.train import run_format
from tests import _flagship as flagship

MODEL = "mnist_net"


def slow_commits(seconds: float, on_gcs: bool) -> None:
    """Widens the kill window between a step's files and its commit."""
    import orbax.checkpoint as ocp
    from orbax.checkpoint._src.path import atomicity

    first: list[str] = []

    def pause(step: str) -> None:
        first[:] = first or [step]
        print(f"COMMIT {step}", flush=True)
        if step != first[0]:
            time.sleep(seconds)

    save = ocp.CheckpointManager.save

    def recorded(manager: Any, step: int, *args: Any, **kwargs: Any) -> Any:
        print(f"WRITE {step} IN_THREAD {threading.current_thread().name}", flush=True)
        return save(manager, step, *args, **kwargs)

    finalize = atomicity.AtomicRenameTemporaryPath.finalize

    async def slow_finalize(path: Any, *args: Any, **kwargs: Any) -> Any:
        final = os.path.basename(str(path._final_path))  # noqa: SLF001 - orbax's
        if final.isdigit() and not on_gcs:
            pause(final)
        return await finalize(path, *args, **kwargs)

    write_text = fw.io.write_text

    def slow_marker(path: str, text: str) -> None:  # gs://: the marker is the commit
        if path.endswith("/" + run_format.COMMIT_FILE):
            pause(path.rsplit("/", 2)[-2])
        return write_text(path, text)

    ocp.CheckpointManager.save = recorded
    atomicity.AtomicRenameTemporaryPath.finalize = slow_finalize
    fw.io.write_text = slow_marker


def latest_step(work_dir: str) -> int:
    """The newest complete step of `work_dir` (local or ``gs://``), 0 if none."""
    steps = run_format.complete_steps(run_format.directory(str(work_dir)))
    return steps[-1] if steps else 0


def train(work_dir: str, max_steps: str, steps_per_loop: str = "5") -> dict[str, Any]:
    if os.environ.get("FAULTS_SLOW_COMMIT"):
        slow_commits(float(os.environ["FAULTS_SLOW_COMMIT"]), work_dir.startswith("gs://"))
    start = latest_step(work_dir)
    x, y = flagship.digits(MODEL)
    est = flagship.estimator(MODEL, work_dir, steps_per_loop=int(steps_per_loop),
                             save_every_loops=1, save_every_secs=None,
                             async_checkpoints=not os.environ.get("FAULTS_SYNC"))
    train_fn = flagship.train_input(x, y)
    if os.environ.get("FAULTS_WARMUP"):
        est.train(train_fn, steps=1)
        print("READY", flush=True)
    est.train(train_fn, max_steps=int(max_steps))
    return {"start": start, "step": est.global_step,
            "variables": [np.asarray(v).tolist() for v in est.model.variables]}


if __name__ == "__main__":
    print(json.dumps({"train": train}[sys.argv[1]](*sys.argv[2:])), flush=True)
