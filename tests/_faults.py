"""Training processes for `tests/test_faults.py` to kill, preempt and starve of disk.

    python -m tests._faults train WORK_DIR MAX_STEPS [STEPS_PER_LOOP]
    python -m tests._faults damages ROOT

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
import logging
import os
import pathlib
import shutil
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


# --------------------------------------------------------------------------- damages
# What tests do to step 10 of a run-format work_dir (steps 5 and 10), on either engine.


def flip_bytes(path: pathlib.Path, count: int = 16) -> None:
    """Inverts `count` bytes a third of the way into the file."""
    raw = bytearray(path.read_bytes())
    for i in range(len(raw) // 3, len(raw) // 3 + count):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


def step_dir(work: pathlib.Path, step: int = 10) -> pathlib.Path:
    return work / "checkpoints" / str(step)


def data_file(work: pathlib.Path, step: int = 10) -> pathlib.Path:
    """The largest data file of a step: the arrays' bytes."""
    return max((step_dir(work, step) / "state").rglob("d/*"), key=lambda p: p.stat().st_size)


def record_file(work: pathlib.Path) -> pathlib.Path:
    return step_dir(work) / "record" / "metadata"


def truncate(path: pathlib.Path, count: int | None, keep: bool = False) -> None:
    """Cuts `count` bytes off the end (keep=True: keeps only `count`); None: empties."""
    raw = path.read_bytes()
    path.write_bytes(b"" if count is None else raw[:count] if keep else raw[:-count])


def empty_folder(path: pathlib.Path) -> None:
    shutil.rmtree(path)
    path.mkdir()


DAMAGES = {  # what is done to step 10, and what the warning must say about it
    "flipped data bytes": (lambda work: flip_bytes(data_file(work)), "does not match the checksum"),
    "data cut in half": (lambda work: truncate(data_file(work), data_file(work).stat().st_size // 2,
                                                keep=True), "arrays cannot be read"),
    "empty data file": (lambda work: truncate(data_file(work), None), "arrays cannot be read"),
    "missing data file": (lambda work: data_file(work).unlink(), "arrays cannot be read"),
    "garbled _METADATA": (lambda work: flip_bytes(step_dir(work) / "state" / "_METADATA"),
                          "arrays cannot be read"),
    "missing state folder": (lambda work: shutil.rmtree(step_dir(work) / "state"),
                             "arrays cannot be read"),
    "emptied state folder": (lambda work: empty_folder(step_dir(work) / "state"),
                             "arrays cannot be read"),
    "record cut short": (lambda work: truncate(record_file(work), 40, keep=True), "run record"),
    "empty record": (lambda work: truncate(record_file(work), None), "run record"),
    "null record": (lambda work: record_file(work).write_text("null"), "run record"),
    "missing record": (lambda work: record_file(work).unlink(), "run record"),
}


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


class _Warnings(logging.Handler):
    """Fenwicks' warnings, kept."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _error(err: BaseException) -> dict[str, str]:
    return {"error": type(err).__name__, "message": str(err)}


def _values(est: Any) -> list[np.ndarray]:
    return [np.asarray(v) for v in est.model.variables]


def damages(root: str) -> dict[str, Any]:
    """Every case of `DAMAGES`, and the run record's and the work_dir's faults, on this
    process's engine (the tests run it on the JAX engine; the TensorFlow engine's run in
    the test process). Trains steps 5 and 10 once; each case spoils a copy."""
    root_path = pathlib.Path(root)
    source = root_path / "trained"
    x, y = flagship.digits(MODEL)
    est = flagship.estimator(MODEL, str(source), save_every_loops=1, steps_per_loop=5)
    est.train(flagship.train_input(x, y), steps=5)
    at_five = _values(est)
    est.train(flagship.train_input(x, y), steps=5)
    est.close()
    seen = _Warnings()
    logging.getLogger("fenwicks").addHandler(seen)
    report: dict[str, Any] = {"engine": fw.train.engines.current().name}
    for number, (name, (spoil, _)) in enumerate(DAMAGES.items()):
        work = root_path / f"damage{number}"
        shutil.copytree(source, work)
        spoil(work)
        seen.messages.clear()
        case: dict[str, Any] = {"work_dir": str(work)}
        try:
            reopened = flagship.estimator(MODEL, str(work), save_every_loops=1,
                                          steps_per_loop=5)
            reopened.evaluate(flagship.eval_input(x, y))
            case.update(step=reopened.global_step, same_as_five=all(
                np.array_equal(a, b) for a, b in zip(_values(reopened), at_five,
                                                     strict=True)))
            reopened.close()
        except Exception as err:  # noqa: BLE001 - what the test asserts on
            case.update(_error(err))
        case["warnings"] = [m for m in seen.messages if m.startswith("fenwicks:")]
        case["listing"] = sorted(os.listdir(work / "checkpoints"))
        report[name] = case
    logging.getLogger("fenwicks").removeHandler(seen)
    report["other trn_bs"] = _other_trn_bs(root_path, source, (x, y))
    report["work_dir deleted"] = _deleted(root_path / "deleted", (x, y))
    report["read-only old record"] = _read_only_record(root_path / "read_only", (x, y))
    return report


def _read_only_record(work: pathlib.Path, data: tuple) -> dict[str, Any]:
    """A fresh run in a work_dir holding a read-only ``fenwicks_input.json`` (the record
    before the run format)."""
    work.mkdir()
    (work / "fenwicks_input.json").write_text('{"train_batch_size": 32}')
    (work / "fenwicks_input.json").chmod(0o444)
    est = flagship.estimator(MODEL, str(work), save_every_loops=1, steps_per_loop=5)
    try:
        est.train(flagship.train_input(*data), steps=5)
        out: dict[str, Any] = {}
    except Exception as err:  # noqa: BLE001 - what the test asserts on
        out = _error(err)
    return {**out, "latest": latest_step(str(work)),
            "old_record": (work / "fenwicks_input.json").read_text()}


def _other_trn_bs(root: pathlib.Path, source: pathlib.Path, data: tuple) -> dict[str, Any]:
    """The record of step 10 deleted, then a resume with twice the trn_bs."""
    work = root / "other_trn_bs"
    shutil.copytree(source, work)
    record_file(work).unlink()
    est = flagship.estimator(MODEL, str(work), save_every_loops=1, steps_per_loop=5,
                             trn_bs=2 * flagship.GLOBAL_BATCH)
    try:
        est.train(flagship.train_input(*data), steps=1)
        return {"step": est.global_step}
    except Exception as err:  # noqa: BLE001 - what the test asserts on
        return {**_error(err), "step": est.global_step}


def _deleted(work: pathlib.Path, data: tuple) -> dict[str, Any]:
    """The work_dir removed between two saves while `train` runs."""
    import keras

    deleted: list[int] = []

    class DeleteWorkDir(keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if batch >= 10 and work.exists() and not deleted:
                est.parts.state.wait()  # between saves (a write in flight would land anyway)
                deleted.append(batch)
                shutil.rmtree(work)

    est = flagship.estimator(MODEL, str(work), save_every_loops=1, steps_per_loop=5)
    try:
        est.train(flagship.train_input(*data), steps=40, callbacks=[DeleteWorkDir()])
        out: dict[str, Any] = {}
    except Exception as err:  # noqa: BLE001 - what the test asserts on
        out = _error(err)
    return {**out, "deleted": bool(deleted), "step": est.global_step,
            "recreated": work.exists()}


if __name__ == "__main__":
    print(json.dumps({"train": train, "damages": damages}[sys.argv[1]](*sys.argv[2:])), flush=True)
