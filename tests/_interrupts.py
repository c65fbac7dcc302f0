"""Ctrl-C during `train`, for `tests/test_interrupts.py`, in a real process.

    python -m tests._interrupts interrupt WORK_ROOT   # interrupt twice, continue, compare
    python -m tests._interrupts resume WORK_DIR STEP  # a new process continues to STEP

The estimator runs with the default settings a notebook has: one compiled loop per epoch,
and an epoch of a million steps, so only a check inside the compiled loop can stop it in
time. A thread sends SIGINT to this process (what Ctrl-C and a notebook's stop button
do) once training is well inside the loop. Each command prints one JSON line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any

import numpy as np

import fenwicks as fw
from fenwicks.train import run_format
from tests import _flagship as flagship

MODEL = "mnist_net"
LONG_EPOCH = 10**6  # steps_per_epoch, and so steps per compiled call (the default)


_KEPT: list[Any] = []  # estimators this process never releases (see _print_and_exit)


def estimator(work_dir: str) -> Any:
    """The flagship mnist_net at width 4, default steps_per_loop (= the long epoch)."""
    opt_func = fw.train.sgd_optimizer(flagship.LEARNING_RATE, mom=0.9, wd=5e-4)
    model_func = fw.train.get_clf_model_func(lambda: flagship.build(MODEL), opt_func)
    return fw.train.get_tpu_estimator(LONG_EPOCH, model_func, work_dir,
                                      trn_bs=flagship.GLOBAL_BATCH, seed=flagship.SEED,
                                      verbose=False)


def new_input_fn() -> Any:
    """A new but identical lambda each call, as a notebook cell that is run again."""
    x, y = flagship.digits(MODEL)
    return lambda params: fw.data.numpy_ds(x[:flagship.NUM_TRAIN], y[:flagship.NUM_TRAIN],
                                           params["batch_size"], seed=flagship.SEED)


def variables(est: Any) -> list[list]:
    return [np.asarray(v).tolist() for v in est.model.variables]


def _interrupt_when_past(est: Any, step: int, sent: list[float]) -> threading.Thread:
    """SIGINT to this process once the run is `step` steps into its compiled loop."""
    def watch() -> None:
        while est.global_step < step:  # reads the step variable the loop updates
            time.sleep(0.02)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def train_until_interrupted(est: Any, input_fn: Any, past: int) -> dict[str, Any]:
    sent: list[float] = []
    thread = _interrupt_when_past(est, past, sent)
    handler_before = signal.getsignal(signal.SIGINT)
    try:
        est.train(input_fn, max_steps=LONG_EPOCH)
    except fw.train.Interrupted as stop:
        caught = time.monotonic()
        thread.join()
        record = run_format.read_record(stop.checkpoint)  # the step's own run record
        return {"step": stop.step, "global_step": est.global_step, "saved": stop.saved,
                "message": str(stop), "latency": caught - sent[0],
                "input_steps": int(est.parts.state.input_steps.numpy()),
                "saved_step": record["step"], "saved_input_steps": record["input_steps"],
                "handler_restored": signal.getsignal(signal.SIGINT) is handler_before}
    raise AssertionError("train() ran to its end: the interrupt did not stop it")


def interrupt(work_root: str) -> dict[str, Any]:
    """Interrupted twice (same input_fn, then a new identical one), continued to the end.

    The work_dir after the first interrupt is copied aside for a new process to resume.
    """
    run, copy = os.path.join(work_root, "run"), os.path.join(work_root, "copy")
    est, same_fn = estimator(run), new_input_fn()
    first = train_until_interrupted(est, same_fn, past=15)
    shutil.copytree(run, copy)
    second = train_until_interrupted(est, same_fn, past=first["step"] + 15)
    target = second["step"] + 12
    est.train(new_input_fn(), max_steps=target)  # a re-run cell: a new, identical lambda
    reference = estimator(os.path.join(work_root, "reference"))
    reference.train(new_input_fn(), max_steps=target)
    _KEPT.extend([est, reference])  # see _print_and_exit
    return {"first": first, "second": second, "target": target, "step": est.global_step,
            "replicas": est.num_replicas, "variables": variables(est),
            "reference": variables(reference), "reference_step": reference.global_step}


def resume(work_dir: str, step: str) -> dict[str, Any]:
    est = estimator(work_dir)
    est.train(new_input_fn(), max_steps=int(step))
    _KEPT.append(est)
    return {"step": est.global_step, "variables": variables(est)}


def _print_and_exit(result: dict[str, Any]) -> None:
    """Prints the result and ends the process without releasing the estimators.

    Releasing an estimator destroys its distributed training iterator, and on 8 logical
    CPUs (TF 2.21) that destructor waits for tf.data's autotuning threads: 0-227 s per
    estimator before `fenwicks.train.inputs.discard`, which moves the wait to threads the
    interpreter still joins at exit (up to a minute). The Ctrl-C property this module
    checks does not depend on it, so the estimators stay referenced and the process
    ends once the result is out.
    """
    print(json.dumps(result), flush=True)
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    commands = {"interrupt": interrupt, "resume": resume}
    _print_and_exit(commands[sys.argv[1]](*sys.argv[2:]))
