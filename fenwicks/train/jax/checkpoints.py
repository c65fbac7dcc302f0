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

`OrbaxCheckpointer` is a `fenwicks.train.checkpointer.Checkpointer`, as the TensorFlow
engine's are, so the controller's `SavePolicy` saves through it unchanged; it also has
what `RunState` reads of theirs (``last_good``, ``pending_step``, ``change_on_disk``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from fenwicks.train.checkpointer import Checkpointer
from fenwicks.train.checkpoints import CheckpointWriteError, step_of

logger = logging.getLogger("fenwicks")

SUBDIR = "orbax"


def directory(work_dir: str) -> str:
    """Where a work_dir's JAX checkpoints live."""
    return f"{work_dir}/{SUBDIR}"


def _abstract(tree: Any, sharding: Any) -> Any:
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding), tree)


class OrbaxCheckpointer(Checkpointer):
    """`Checkpointer` of one pytree of a run under ``<work_dir>/orbax``, with orbax.

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
        ...                                  state.paths, 3, True, mesh.replicated())
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
        self._last_save_secs: float | None = None
        self.last_blocked_secs: float | None = None  # how long the last save() blocked
        self._pending: tuple[int, float] | None = None  # (step, start) being written
        self._good: tuple | None = None  # fingerprint of the last durable checkpoint
        # Several processes (a multi-host run): every one calls save and restore together;
        # orbax writes each array once and its metadata from process 0.
        self._single = jax.process_count() == 1

    @property
    def pending_step(self) -> int | None:
        return self._pending[0] if self._pending else None

    @property
    def last_good(self) -> str | None:
        """The newest checkpoint this object restored or saved durably (no waiting)."""
        return self._good[0] if self._good else None

    @property
    def latest(self) -> str | None:
        """The newest durable checkpoint restored or saved; waits for a save in progress."""
        self.wait()
        return self.last_good

    @property
    def last_save_secs(self) -> float | None:
        return self._last_save_secs

    def _path(self, step: int) -> str:
        return f"{self.directory}/{step}"

    def save(self, step: int, *, force: bool = False) -> None:
        """Checkpoints `step`, unless it is already saved (or being saved) and not `force`.

        Raises:
            CheckpointWriteError: this write, or the previous background one, failed.
        """
        if not force and (self.pending_step == step or self.last_good == self._path(step)):
            self.last_blocked_secs = None
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
            CheckpointWriteError: that write failed (raised once); the checkpoint before
                it stays the latest.
        """
        if self._pending is None:
            return
        step, started = self._pending
        self._pending = None
        try:
            self._manager.wait_until_finished()
        except Exception as err:
            raise self._write_error(step, err) from err
        self._last_save_secs = time.monotonic() - started
        self._good = _fingerprint(self._path(step))

    def agree(self, due: bool) -> bool:
        """True on every process if a periodic save is due on any: each process reads
        its own clock (``save_every_secs``), and a save is a collective of them all."""
        from fenwicks.train.jax import processes

        return due if self._single else bool(processes.processes_where(due))

    def _write_error(self, step: int, err: BaseException) -> CheckpointWriteError:
        return CheckpointWriteError(
            f"could not write checkpoint {self._path(step)}: "
            f"{str(err).splitlines()[0][:200]}. The previous checkpoint "
            f"({self.last_good or 'none'}) is intact: free space or fix the storage, then "
            "call train() again")

    def _latest_on_disk(self) -> int | None:
        self._manager.reload()
        return self._manager.latest_step()

    def change_on_disk(self) -> str | None:
        """None if the newest checkpoint on disk is the one this object last wrote or
        read; ``'removed'`` if there is none any more; else ``'replaced'``."""
        self.wait()
        step = self._latest_on_disk()
        if step is None:
            return "removed" if self._good else None
        return None if _fingerprint(self._path(step)) == self._good else "replaced"

    def restore(self, path: str | None = None) -> str | None:
        """Restores `path` (a ``<work_dir>/orbax/<step>`` directory), or the latest.

        Returns:
            The checkpoint restored, or None if there is none.
        """
        self.wait()
        step = self._latest_on_disk() if path is None else step_of(path)
        if step is None:
            return None
        target = _abstract(self._collect(), self._sharding)
        try:
            restored = self._manager.restore(
                step, args=self._ocp.args.StandardRestore(target))
        except (ValueError, KeyError) as err:
            raise ValueError(
                f"checkpoint {self._path(step)} does not fit this model: "
                f"{str(err).splitlines()[0][:300]}. Use the model_func that wrote it, or "
                "another work_dir (warm_start_from= loads the variables that match)") from err
        self._apply(restored)
        self._good = _fingerprint(self._path(step))
        return self._path(step)

    def close(self) -> None:
        """Waits for a write in progress, then closes the manager's threads."""
        try:
            self.wait()
        finally:
            self._manager.close()


def _fingerprint(path: str) -> tuple:
    """``(path, mtime)``: which checkpoint, and which copy of it (another run's written
    under the same step has another modification time)."""
    try:
        return (path, os.stat(path).st_mtime_ns)
    except OSError:
        return (path,)
