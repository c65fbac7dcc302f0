"""Checkpoints of the JAX engine in orbax-checkpoint's format.

One checkpoint is one pytree: ``{'model': [arrays], 'optimizer': [arrays], 'counters':
{'global_step', 'input_steps'}}``, the variables in the order of ``model.variables`` and
``optimizer.variables``, their paths in the checkpoint's metadata. It holds every model
variable (trainable or not: BatchNorm statistics, seed-generator states), every optimizer
variable (slots, ``iterations``, a loss scale) and the counters, so the next step depends
on nothing else.
Orbax writes each into a temporary directory and renames it when complete, so a process
killed mid-save leaves the previous checkpoint as the latest (and the partial directory
is removed by the next run). With ``async_checkpoints`` a save copies the arrays to host
memory and returns; a background thread writes them.

The checkpoints live in ``<work_dir>/orbax/<step>``; the TensorFlow engine's stay
``<work_dir>/ckpt-<step>.*``, so the two formats never mix.

`OrbaxCheckpointer` has the methods and meanings of the TensorFlow engine's
``Checkpointer`` (``save(step, *, force=False)``, ``restore(path=None)``, ``wait()``,
``latest``, ``last_save_secs``, ``close()``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from fenwicks.train.checkpoints import CheckpointWriteError

logger = logging.getLogger("fenwicks")

SUBDIR = "orbax"


def directory(work_dir: str) -> str:
    """Where a work_dir's JAX checkpoints live."""
    return f"{work_dir}/{SUBDIR}"


def step_of(path: str) -> int:
    return int(path.rstrip("/").rsplit("/", 1)[1])


def _abstract(tree: Any, sharding: Any) -> Any:
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding), tree)


class OrbaxCheckpointer:
    """Saves and restores one pytree of a run under ``<work_dir>/orbax``.

    Args:
        work_dir: the run's work_dir (local path).
        collect: ``() -> pytree`` of the arrays to save (called at each save).
        apply: ``(pytree) -> None``, puts restored arrays back.
        describe: ``() -> dict`` of JSON metadata saved with each checkpoint.
        keep: how many recent checkpoints to keep.
        asynchronous: write in a background thread (`wait` joins it).
        sharding: where restored arrays go (replicated over the mesh).

    Example:
        >>> checkpointer = OrbaxCheckpointer(work_dir, state.tree, state.set_tree,
        ...                                  state.paths, 3, True,
        ...                                  mesh.replicated())
        >>> checkpointer.save(100)
        >>> checkpointer.restore()   # '<work_dir>/orbax/100'
    """

    def __init__(self, work_dir: str, collect: Callable[[], Any],
                 apply: Callable[[Any], None], describe: Callable[[], dict], keep: int,
                 asynchronous: bool, sharding: Any) -> None:
        import orbax.checkpoint as ocp  # optional: the JAX engine's dependency

        self._ocp = ocp
        self.directory = directory(work_dir)
        self._collect, self._apply, self._sharding = collect, apply, sharding
        self._describe = describe
        self.asynchronous = asynchronous
        self._manager = ocp.CheckpointManager(
            os.path.abspath(self.directory), options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, enable_async_checkpointing=asynchronous, create=True,
                cleanup_tmp_directories=True))
        self.last_save_secs: float | None = None  # the last complete write, in seconds
        self.last_blocked_secs: float | None = None  # how long the last save() blocked
        self._pending: tuple[int, float] | None = None  # (step, start) being written

    @property
    def pending_step(self) -> int | None:
        return self._pending[0] if self._pending else None

    @property
    def latest(self) -> str | None:
        """The newest complete checkpoint; waits for a save in progress."""
        self.wait()
        self._manager.reload()
        step = self._manager.latest_step()
        return None if step is None else f"{self.directory}/{step}"

    def save(self, step: int, *, force: bool = False) -> None:
        """Checkpoints `step`, unless it is already saved (or being saved) and not `force`.

        Raises:
            CheckpointWriteError: this write, or the previous background one, failed.
        """
        if not force and (self.pending_step == step or step in self._manager.all_steps()):
            return
        self.wait()
        started = time.monotonic()
        try:
            if step in self._manager.all_steps():  # force: this step's weights changed
                self._manager.delete(step)
            self._manager.save(step, args=self._ocp.args.StandardSave(self._collect()),
                               force=True, custom_metadata=self._describe())
        except Exception as err:
            raise self._write_error(step, err) from err
        self._pending = (step, started)
        self.last_blocked_secs = time.monotonic() - started
        if not self.asynchronous:
            self.wait()

    def wait(self) -> None:
        """Waits for a checkpoint being written in the background, if any.

        Raises:
            CheckpointWriteError: that write failed; the checkpoint before it stays
                the latest.
        """
        if self._pending is None:
            return
        step, started = self._pending
        self._pending = None
        try:
            self._manager.wait_until_finished()
        except Exception as err:
            raise self._write_error(step, err) from err
        self.last_save_secs = time.monotonic() - started

    def _write_error(self, step: int, err: BaseException) -> CheckpointWriteError:
        steps = [s for s in self._manager.all_steps() if s != step]
        before = f"{self.directory}/{max(steps)}" if steps else "none"
        return CheckpointWriteError(
            f"could not write checkpoint {self.directory}/{step}: "
            f"{str(err).splitlines()[0][:200]}. The previous checkpoint ({before}) is "
            "intact: free space or fix the storage, then call train() again")

    def restore(self, path: str | None = None) -> str | None:
        """Restores `path` (a ``<work_dir>/orbax/<step>`` directory), or the latest.

        Returns:
            The checkpoint restored, or None if there is none.
        """
        self.wait()
        self._manager.reload()
        step = self._manager.latest_step() if path is None else step_of(path)
        if step is None:
            return None
        target = _abstract(self._collect(), self._sharding)
        try:
            restored = self._manager.restore(
                step, args=self._ocp.args.StandardRestore(target))
        except (ValueError, KeyError) as err:
            raise ValueError(
                f"checkpoint {self.directory}/{step} does not fit this model: "
                f"{str(err).splitlines()[0][:300]}. Use the model_func that wrote it, or "
                "another work_dir (warm_start_from= loads the variables that match)") from err
        self._apply(restored)
        return f"{self.directory}/{step}"

    def close(self) -> None:
        """Waits for a write in progress, then closes the manager's threads."""
        try:
            self.wait()
        finally:
            self._manager.close()
