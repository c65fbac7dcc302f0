"""Training processes for `tests/test_faults.py` to kill, preempt and starve of disk.

    python -m tests._faults train WORK_DIR MAX_STEPS [STEPS_PER_LOOP]

trains a narrow `mnist_net` on the digits (as `tests._flagship` does) with a checkpoint
after every compiled loop, and prints one JSON line: the step it started from, the step
it reached and every model variable. Environment knobs for the tests:

* ``FAULTS_SLOW_STATE=<secs>``: from the second checkpoint on, sleep before TensorFlow
  names it in the ``checkpoint`` state file (its data and index files are written by
  then), printing ``STATE_UPDATE ckpt-<n>`` first: a window wide enough to kill the process
  mid-save on purpose.
* ``FAULTS_SLOW_MERGE=<secs>``: from the second checkpoint on, sleep after the shards
  are written to ``ckpt-<n>_temp/`` and before TensorFlow merges them into
  ``ckpt-<n>.*``, printing ``MERGE ckpt-<n>`` first: killing the process then leaves the
  ``_temp`` folder a save cut short leaves. The second checkpoint is the first compiled
  write, so the window is inside the compiled graph.
  Both also print ``IN_THREAD <name>``: the thread writing (with asynchronous
  checkpoints, a background writer; training goes on meanwhile).
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
import tensorflow as tf

from fenwicks._tf_internals import checkpoint_management_module
from tests import _flagship as flagship

checkpoint_management = checkpoint_management_module()  # where tests inject faults

MODEL = "mnist_net"


def slow_state_updates(seconds: float) -> None:
    """Widens the kill window between a checkpoint's files and its state-file entry."""
    original = checkpoint_management.update_checkpoint_state_internal
    first: list[str] = []

    def slow(*args: Any, **kwargs: Any) -> Any:
        path = kwargs["model_checkpoint_path"] if "model_checkpoint_path" in kwargs else args[1]
        named = os.path.basename(path)
        first[:] = first or [named]
        print(f"STATE_UPDATE {named}\nIN_THREAD {threading.current_thread().name}",
              flush=True)
        if named != first[0]:
            time.sleep(seconds)
        return original(*args, **kwargs)

    checkpoint_management.update_checkpoint_state_internal = slow


def _slow_merges(seconds: float) -> None:
    """Widens the kill window between a save's shards and their merge.

    A compiled write (`checkpoint_manager.CompiledWrite`, from a root's second save on)
    calls the merge op once, while it is traced: there the pause becomes a
    `tf.py_function` that runs, with the graph, after the shards and before the merge.
    TensorFlow runs it on a thread of its own, so the thread that called the write is
    recorded on the way in and printed.
    """
    from fenwicks._tf_internals import saver_io_ops
    from fenwicks.train.tf.checkpoint_manager import CompiledWrite

    io_ops = saver_io_ops()
    original = io_ops.merge_v2_checkpoints
    merges: list[str] = []
    writer = [threading.current_thread().name]  # the thread of the write in progress
    write = CompiledWrite.__call__

    def recorded(self: Any, prefix: str) -> str:
        writer[0] = threading.current_thread().name
        return write(self, prefix)

    def pause(destination: str) -> None:
        named = os.path.basename(destination)
        merges.append(named)
        print(f"MERGE {named}\nIN_THREAD {writer[0]}", flush=True)
        if len(merges) > 1:
            time.sleep(seconds)

    def slow(checkpoint_prefixes: Any, destination_prefix: Any, *args: Any,
             **kwargs: Any) -> Any:
        if tf.inside_function():  # traced: the shards' writes are control inputs here
            done = tf.py_function(lambda d: pause(d.numpy().decode()) or 0,
                                  [destination_prefix], tf.int32)
            with tf.control_dependencies([done]):
                destination_prefix = tf.identity(destination_prefix)
        else:
            pause(destination_prefix.numpy().decode())
        return original(checkpoint_prefixes, destination_prefix, *args, **kwargs)

    CompiledWrite.__call__ = recorded
    io_ops.merge_v2_checkpoints = slow


def latest_step(work_dir: str) -> int:
    latest = tf.train.latest_checkpoint(work_dir) if tf.io.gfile.isdir(work_dir) else None
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def train(work_dir: str, max_steps: str, steps_per_loop: str = "5") -> dict[str, Any]:
    if os.environ.get("FAULTS_SLOW_STATE"):
        slow_state_updates(float(os.environ["FAULTS_SLOW_STATE"]))
    if os.environ.get("FAULTS_SLOW_MERGE"):
        _slow_merges(float(os.environ["FAULTS_SLOW_MERGE"]))
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
