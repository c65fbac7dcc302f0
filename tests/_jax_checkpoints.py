"""Process helper of tests/test_jax_checkpoints.py: damaged orbax steps of a work_dir
the JAX engine wrote before the run format, read by its reader
(`fenwicks.train.jax.checkpoints.LegacyReader`). Prints one JSON line.

    python -m tests._jax_checkpoints WORK_DIR

Each case writes steps 1 and 2 of a state whose array ``w`` holds step-seeded random
numbers (incompressible, so the data file is the bulk of the step) as that engine wrote
them (`_write_old_step`), damages step 2 (or both), and restores with a new reader, as a
new estimator would.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from fenwicks.train.jax import checkpoints, mesh

SIZE = 50_000


def values(step: int, size: int = SIZE) -> np.ndarray:
    return np.random.default_rng(step).random(size).astype(np.float32)


class State:
    def __init__(self, size: int = SIZE) -> None:
        self.w = jax.device_put(np.zeros(size, np.float32), mesh.replicated())
        self.step = 0

    def tree(self) -> dict:
        return {"model": [self.w], "optimizer": [],
                "counters": {"global_step": np.int64(self.step),
                             "input_steps": np.int64(self.step)}}

    def set_tree(self, tree: dict) -> None:
        self.w, self.step = tree["model"][0], int(tree["counters"]["global_step"])


def _reader(work_dir: str, state: State) -> checkpoints.LegacyReader:
    return checkpoints.LegacyReader(work_dir, state.tree, state.set_tree, mesh.replicated())


def _write_old_step(work_dir: str, state: State) -> None:
    """Step ``state.step`` as the JAX engine wrote it before the run format (main
    5de401d's ``OrbaxCheckpointer.save``): orbax's standard save of the tree, replicated
    arrays as NumPy, the variables' paths as the step's custom metadata."""
    folder = os.path.abspath(checkpoints.directory(work_dir))
    with ocp.CheckpointManager(folder, options=ocp.CheckpointManagerOptions(
            max_to_keep=3, enable_async_checkpointing=False, create=True)) as manager:
        tree = checkpoints.to_host(checkpoints.snapshot(state.tree()))
        manager.save(state.step, args=ocp.args.StandardSave(tree), force=True,
                     custom_metadata={"model": ["w"], "optimizer": []})


def _saved(work_dir: str) -> None:
    state = State()
    for step in (1, 2):
        state.w = jax.device_put(values(step), mesh.replicated())
        state.step = step
        _write_old_step(work_dir, state)


def _truncate(step_dir: str) -> None:
    """Cuts the biggest data file of the step to half its length."""
    files = glob.glob(f"{step_dir}/default/**/d/*", recursive=True)
    biggest = max(files, key=os.path.getsize)
    with open(biggest, "r+b") as f:
        f.truncate(os.path.getsize(biggest) // 2)


def _garble(step_dir: str) -> None:
    with open(f"{step_dir}/default/_METADATA", "wb") as f:
        f.write(b'{"tree_metadata": garbled')


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _restore(work_dir: str, size: int = SIZE) -> dict:
    """A new reader's restore of the latest, twice (the second must be quiet)."""
    seen = _Warnings()
    logging.getLogger("fenwicks").addHandler(seen)
    try:
        out: dict = {}
        for attempt in ("first", "second"):
            state = State(size)
            reader = _reader(work_dir, state)
            try:
                out[attempt] = {"restored": reader.restore(), "step": state.step,
                                "w_is_step_1": bool(np.array_equal(np.asarray(state.w),
                                                                   values(1, size)))}
            except Exception as err:  # noqa: BLE001 - what the test asserts on
                out[attempt] = {"error": type(err).__name__, "message": str(err)}
            finally:
                reader.close()
        out["warnings"] = [m for m in seen.messages if m.startswith("fenwicks:")]
        out["listing"] = sorted(os.listdir(checkpoints.directory(work_dir)))
        return out
    finally:
        logging.getLogger("fenwicks").removeHandler(seen)


def main(root: str) -> dict:
    report = {}
    for case, damage in (("truncated", _truncate), ("garbled", _garble)):
        work_dir = os.path.join(root, case)
        _saved(work_dir)
        damage(f"{checkpoints.directory(work_dir)}/2")
        report[case] = _restore(work_dir)
    work_dir = os.path.join(root, "all")
    _saved(work_dir)
    for step in (1, 2):
        _truncate(f"{checkpoints.directory(work_dir)}/{step}")
    report["all"] = _restore(work_dir)
    work_dir = os.path.join(root, "other_model")
    _saved(work_dir)
    report["other_model"] = _restore(work_dir, size=SIZE + 1)
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
