"""Process helper of tests/test_jax_snapshot.py: the run format's checkpointer
(`fenwicks.train.run_format.RunCheckpointer`) over the JAX engine's snapshot of its
arrays (`fenwicks.train.jax.checkpoints.snapshot`, `to_host`), on a plain JAX state over
the 8 host devices, while a donating jitted step keeps changing it. Also a step of the
engine's format before the run format, read by its `LegacyReader`. Prints one JSON line.

    python -m tests._jax_snapshot WORK_DIR

The state: ``w`` (replicated, 256 x 256), ``b`` (replicated, a vector) and ``s``
(split over the devices on its first axis: the case of an array that is not
replicated), and the counters. Each step adds 1 to every element. After step k every
element of ``w`` is ``k``, of ``b`` ``10 + k``, row r of ``s`` ``100 * r + k``: the
test computes what each checkpoint must hold from that, by hand.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from fenwicks.train import run_format
from fenwicks.train.jax import checkpoints, mesh

NAMES = ("w", "b", "s")


class State:
    def __init__(self) -> None:
        self.step = 0
        self.arrays = {
            "w": jax.device_put(np.zeros((256, 256), np.float32), mesh.replicated()),
            "b": jax.device_put(np.full((7,), 10, np.int32), mesh.replicated()),
            "s": jax.device_put(100 * np.arange(16, dtype=np.float32)[:, None]
                                * np.ones((1, 5), np.float32), mesh.batch_sharded())}

    def tree(self) -> dict:
        return {"model": [self.arrays["w"], self.arrays["b"], self.arrays["s"]],
                "optimizer": [],
                "counters": {"global_step": np.int64(self.step),
                             "input_steps": np.int64(self.step)}}

    def set_tree(self, tree: dict) -> None:
        self.arrays = dict(zip(NAMES, tree["model"], strict=True))
        self.step = int(tree["counters"]["global_step"])

    # The run format's `RunParts`, as the JAX engine's state implements them.

    def snapshot(self) -> dict:
        return checkpoints.snapshot({"trainable": [self.arrays[n] for n in NAMES],
                                     "non_trainable": [], "optimizer": []})

    def to_host(self, frozen: dict) -> dict:
        host = checkpoints.to_host(frozen)
        return {group: [np.asarray(a) for a in arrays] for group, arrays in host.items()}

    def scatter(self, tree: dict) -> None:
        self.arrays = {name: jax.device_put(array, self.arrays[name].sharding)
                       for name, array in zip(NAMES, tree["trainable"], strict=True)}

    def layout(self) -> dict:
        return {"trainable": [[n, list(self.arrays[n].shape), str(self.arrays[n].dtype)]
                              for n in NAMES], "non_trainable": [], "optimizer": []}

    def record(self) -> dict:
        return run_format.make_record(engine="jax", step=self.step, input_steps=self.step,
                                      train_batch_size=8, layout=self.layout())

    def apply_record(self, record: dict) -> None:
        self.step = record["step"]


@functools.partial(jax.jit, donate_argnums=0)
def _step(arrays: dict) -> dict:
    # Enough work on `w` that the step is still running when the next save begins.
    w = arrays["w"]
    for _ in range(8):
        w = w + 0.0 * jnp.tanh(w @ w)
    return {"w": w + 1, "b": arrays["b"] + 1, "s": arrays["s"] + 1}


def _checkpointer(work_dir: str, state: State, asynchronous: bool):
    return run_format.RunCheckpointer(work_dir, state, keep=3, asynchronous=asynchronous)


def _read(work_dir: str, step: int) -> dict:
    """The step as written, read with the run format's reader alone into host arrays."""
    folder = f"{run_format.directory(work_dir)}/{step}"
    record = run_format.read_record(folder)
    w, b, s = run_format.read_arrays(folder, record)["trainable"]
    return {"w": np.unique(w).tolist(), "b": np.unique(b).tolist(),
            "s": np.asarray(s)[:, 0].tolist(), "global_step": record["step"]}


def _train_and_save(work_dir: str, asynchronous: bool) -> dict:
    """Saves after steps 2, 6, 10, 14 and 18, each followed at once by two donating
    steps (the next save waits for the write before it)."""
    state = State()
    saver = _checkpointer(work_dir, state, asynchronous)
    blocked, donated = [], []
    for _ in range(5):
        for _ in range(2):
            state.arrays = _step(state.arrays)
            state.step += 1
        saved = state.arrays
        saver.save(state.step)
        blocked.append(saver.last_blocked_secs)
        state.arrays = _step(state.arrays)  # donates the arrays just saved
        state.step += 1
        donated.append(saved["w"].is_deleted())  # (the donation is real)
        state.arrays = _step(state.arrays)
        state.step += 1
    saver.close()
    steps = sorted(int(n) for n in os.listdir(run_format.directory(work_dir)) if n.isdigit())
    return {"steps": steps, "saved": {step: _read(work_dir, step) for step in steps},
            "blocked": blocked, "donated": donated}


def _restored(restored: str | None, state: State) -> dict:
    return {"restored": restored, "step": state.step,
            "w": np.unique(np.asarray(state.arrays["w"])).tolist(),
            "s": np.asarray(state.arrays["s"])[:, 0].tolist(),
            "replicated": all(a.sharding.is_equivalent_to(mesh.replicated(), a.ndim)
                              for a in state.arrays.values())}


def _restore(work_dir: str, step: int) -> dict:
    state = State()
    return _restored(_checkpointer(work_dir, state, True).restore(
        f"{run_format.directory(work_dir)}/{step}"), state)


def _old_format(work_dir: str) -> dict:
    """A checkpoint as the engine wrote it before snapshots (orbax's own save of the
    device arrays, in ``orbax/<step>``), restored by the reader of that format, which
    puts every array back replicated over the mesh."""
    state = State()
    state.arrays = _step(_step(_step(state.arrays)))
    state.step = 3
    directory = os.path.abspath(checkpoints.directory(work_dir))
    with ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
            create=True)) as manager:
        manager.save(3, args=ocp.args.StandardSave(state.tree()),
                     custom_metadata={"model": list(NAMES)})
    state = State()
    reader = checkpoints.LegacyReader(work_dir, state.tree, state.set_tree,
                                      mesh.replicated())
    try:
        return _restored(reader.restore(f"{checkpoints.directory(work_dir)}/3"), state)
    finally:
        reader.close()


def _write_error(work_dir: str) -> dict:
    """A background write that fails (a stand-in for a full disk) is raised by `wait`;
    the checkpoint before it stays the latest."""
    state = State()
    saver = _checkpointer(work_dir, state, True)
    saver.save(1)
    saver.wait()

    def full_disk(*args, **kwargs):
        time.sleep(0.2)  # in the background thread: `save` has returned by then
        raise OSError(28, "No space left on device")

    # The fault injected where orbax writes (its public class: every manager of this
    # process; the save above is complete).
    ocp.CheckpointManager.save = full_disk
    began = time.perf_counter()
    saver.save(2)
    returned = time.perf_counter() - began
    try:
        saver.wait()
    except Exception as err:  # noqa: BLE001 - reported to the test
        return {"error": type(err).__name__, "message": str(err),
                "returned_secs": returned, "last_good": saver.last_good}
    return {"error": None}


def main(root: str) -> dict:
    return {"async": _train_and_save(f"{root}/async", True),
            "sync": _train_and_save(f"{root}/sync", False),
            "restored": _restore(f"{root}/async", 14),
            "old_format": _old_format(f"{root}/old"),
            "write_error": _write_error(f"{root}/broken"),
            "devices": jax.device_count()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
