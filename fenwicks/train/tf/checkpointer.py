"""The one owner of a run's checkpoints: a `Checkpointer` writes and reads them in one
directory, and nothing else in Fenwicks does.

    checkpointer = checkpointer_lib.create(root, work_dir, keep=3)
    checkpointer.restore()        # the newest readable checkpoint into the live state
    checkpointer.save(100)        # ckpt-100 (async: returns once the state is copied)
    checkpointer.wait()           # every started save durable, or its error raised once
    checkpointer.close()

The classes follow orbax-checkpoint's, where `AsyncCheckpointer` subclasses `Checkpointer`:

* `fenwicks.train.checkpointing.Checkpointer`: the interface, engine-neutral (the JAX
  engine implements it with orbax);
* `SyncCheckpointer`: each save is written in the calling thread;
* `AsyncCheckpointer`: overrides how a save writes: the variables are copied to host
  memory and a background thread writes them (`async_checkpoints.BackgroundWriter`);
* `WorkerCheckpointer`: what a non-chief worker of a multi-worker run holds. Every
  worker takes part in each save (reading a variable may take a collective), and the
  non-chief ones write to a scratch directory that is removed at once.

`create` picks one of them for a run. When to save is decided elsewhere, in one place:
`save_policy.SavePolicy` is the only caller of `Checkpointer.save` during training. What
a checkpoint holds, and how it is checked, restored safely and diagnosed when damaged,
is `checkpoints.py`.
"""

from __future__ import annotations

import logging
import time

import tensorflow as tf

from fenwicks import _removal
from fenwicks.train.checkpointing import Checkpointer
from fenwicks.train.tf import async_checkpoints, checkpoint_manager, checkpoints

logger = logging.getLogger("fenwicks")


class SyncCheckpointer(Checkpointer):
    """Writes each checkpoint in the calling thread: `save` returns when it is durable.

    Checkpoints are ``<directory>/ckpt-<step>``, written by `checkpoints.save` through a
    `checkpoint_manager.CheckpointManager` (a compiled write; the newest `keep` are
    kept). The state file names a new checkpoint only once its files are complete, so a
    process killed mid-save leaves the previous one as the latest.

    Args:
        root: what is saved and restored (`checkpoints.make_checkpoint`).
        directory: the work_dir, local or ``gs://``.
        keep: how many recent checkpoints to keep. Defaults to 3.
        probe_dir: scratch space for the model's probe copy before a restore
            (`checkpoints.expected_shapes`): a TPU reached over the network cannot write
            local files. Defaults to None: a local temp dir.

    Examples:
        >>> variable = tf.Variable([1.0, 2.0])
        >>> checkpointer = SyncCheckpointer(tf.train.Checkpoint(v=variable), '/tmp/run')
        >>> checkpointer.save(10)
        >>> checkpointer.latest
        '/tmp/run/ckpt-10'
    """

    def __init__(self, root: tf.train.Checkpoint, directory: str, keep: int = 3,
                 probe_dir: str | None = None) -> None:
        self.directory = directory.rstrip("/")
        self._root, self._keep, self._probe_dir = root, keep, probe_dir
        self._open_manager: checkpoint_manager.CheckpointManager | None = None
        self._last_good: str | None = None  # restored or saved, known complete
        self._fingerprint: tuple | None = None  # of the checkpoint last written or read
        self._last_save_secs: float | None = None
        self._last_blocked_secs: float | None = None
        self._closed = False

    # ---------------------------------------------------------------- the interface

    def save(self, step: int, *, force: bool = False) -> None:
        self._save(step, force, background=True)

    def save_and_wait(self, step: int, *, force: bool = False) -> None:
        self._save(step, force, background=False)
        self.wait()

    def restore(self, path: str | None = None) -> str | None:
        self._check_open("restore")
        self.wait()  # a restore from disk sees complete checkpoints only
        if path is None:
            restored = checkpoints.restore_latest(self._root, self.directory,
                                                  self._probe_dir)
        else:
            checkpoints.read(self._root, path, self.directory, self._probe_dir)
            restored = path
        if path is None or restored.rsplit("/", 1)[0] == self.directory:
            self._last_good = restored
            self._fingerprint = checkpoints.fingerprint(restored)
        # The directory may have changed under the manager (another run's checkpoints,
        # damaged ones set aside): the next save reads its list of checkpoints again.
        self._reopen()
        return restored

    def wait(self) -> None:
        return None  # every save was durable when it returned

    @property
    def latest(self) -> str | None:
        self.wait()
        return self._last_good

    @property
    def last_save_secs(self) -> float | None:
        return self._last_save_secs

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._release()

    # ---------------------------------------------------------------- beyond the interface

    @property
    def last_good(self) -> str | None:
        """The newest checkpoint known complete, without waiting (and so without raising)
        for a write in progress: what an error message can name."""
        return self._last_good

    @property
    def last_blocked_secs(self) -> float | None:
        """Seconds the last `save` call blocked its caller; None if it saved nothing."""
        return self._last_blocked_secs

    @property
    def pending_step(self) -> int | None:
        """The step being written in the background and not yet waited for, or None."""
        return None

    def change_on_disk(self) -> str | None:
        """Whether `directory` changed since this object last wrote or read it.

        Another run may have trained in the same work_dir, or a k-fold loop removed its
        checkpoints. The newest checkpoint's index is compared byte for byte (through
        `checkpoints.fingerprint`), so a copy put in place under the same name counts.

        Returns:
            None if the newest checkpoint is the one last written or read; ``'removed'``
            if there is no checkpoint left; ``'replaced'`` otherwise.
        """
        self.wait()  # our own write in progress is not a change made by someone else
        current = checkpoints.latest(self.directory)
        if checkpoints.fingerprint(current) == self._fingerprint:
            return None
        return "removed" if current is None else "replaced"

    # ---------------------------------------------------------------- for subclasses

    def _save(self, step: int, force: bool, background: bool) -> None:
        self._check_open("save")
        self._last_blocked_secs = None
        if not force and step in (
                self.pending_step,
                checkpoints.step_of(self._last_good) if self._last_good else None):
            return  # nothing new since the last save
        started = time.monotonic()
        self._write(step, background)
        self._last_blocked_secs = time.monotonic() - started

    def _write(self, step: int, background: bool = True) -> None:
        """Writes ``ckpt-<step>`` and records it as the last good checkpoint (in this
        thread: `background` is for subclasses that can write in another)."""
        started = time.monotonic()
        path = checkpoints.save(self._manager, step)
        self._written(path, checkpoints.fingerprint(path), time.monotonic() - started)

    def _written(self, path: str, fingerprint: tuple | None, seconds: float) -> None:
        self._last_good, self._fingerprint, self._last_save_secs = path, fingerprint, seconds

    @property
    def _manager(self) -> checkpoint_manager.CheckpointManager:
        if self._open_manager is None:
            self._open_manager = checkpoint_manager.CheckpointManager(
                self._root, self.directory, self._keep)
        return self._open_manager

    def _reopen(self) -> None:
        if self._open_manager is not None:
            self._open_manager.reload()  # its compiled write stays valid

    def _release(self) -> None:
        self._open_manager = None

    def _check_open(self, verb: str) -> None:
        if self._closed:
            raise ValueError(f"cannot {verb}: this {type(self).__name__} of "
                             f"{self.directory!r} was closed; create a new one")


class AsyncCheckpointer(SyncCheckpointer):
    """Writes checkpoints in a background thread while training goes on.

    `save` copies every variable to host memory (one on-device copy each) and returns;
    a background thread writes the copies (`save_and_wait` writes them in the calling
    thread), with the same keys and object graph as a synchronous save, so a checkpoint
    written either way restores either way. One write at a time: a save first waits for
    the previous write and raises its error. Whatever must see a complete checkpoint
    waits (`wait`, `latest`, `restore`, `close`), and so does interpreter exit for a
    write still running.

    Args:
        root, directory, keep, probe_dir: as for `SyncCheckpointer`.

    Raises:
        UnsupportedAsyncCheckpointError: an object under `root` saves state that is not
            a variable, which cannot be copied (`create` falls back to synchronous).

    Examples:
        >>> checkpointer = AsyncCheckpointer(root, '/tmp/run')
        >>> checkpointer.save(10)   # returns once the variables are copied
        >>> checkpointer.wait()     # ckpt-10 is complete (or its error is raised here)
    """

    def __init__(self, root: tf.train.Checkpoint, directory: str, keep: int = 3,
                 probe_dir: str | None = None) -> None:
        super().__init__(root, directory, keep, probe_dir)
        self._writer: async_checkpoints.BackgroundWriter | None = (
            async_checkpoints.BackgroundWriter(root, self.directory, keep))

    def _write(self, step: int, background: bool = True) -> None:
        self.wait()  # the copies are reused: the previous write must be done
        if background:
            self._writer.start(step)
        else:
            self._written(*self._writer.write_now(step))

    def wait(self) -> None:
        if self._writer is None:
            return
        done = self._writer.wait()  # raises a failed write's error, once
        if done is not None:
            self._written(*done)

    @property
    def pending_step(self) -> int | None:
        return self._writer.pending_step if self._writer is not None else None

    @property
    def _manager(self) -> checkpoint_manager.CheckpointManager:
        return self._writer.manager

    def _reopen(self) -> None:
        self._writer.reopen()

    def _release(self) -> None:
        self._writer = None  # the host copies: as much memory as the model's variables


class WorkerCheckpointer(SyncCheckpointer):
    """What a non-chief worker of a multi-worker run holds: it saves with the chief and
    keeps nothing.

    Every worker takes part in a save, in lockstep with the chief, since reading a
    variable may take a collective. This one writes to ``<directory>/.worker-<task_id>``
    and removes it at once; the chief writes the checkpoint itself. Restores read
    `directory`, like the chief's.

    Args:
        root, directory, keep, probe_dir: as for `SyncCheckpointer`.
        task_id: this worker's task id in the cluster.

    Examples:
        >>> checkpointer = WorkerCheckpointer(root, work_dir, task_id=1)
    """

    def __init__(self, root: tf.train.Checkpoint, directory: str, task_id: int,
                 keep: int = 3, probe_dir: str | None = None) -> None:
        super().__init__(root, directory, keep, probe_dir)
        self.scratch_dir = f"{self.directory}/.worker-{task_id}"

    def _write(self, step: int, background: bool = True) -> None:
        started = time.monotonic()
        tf.train.CheckpointManager(self._root, self.scratch_dir, 1).save(step)
        _removal.remove_tree(self.scratch_dir)
        # The chief wrote the same step meanwhile: that is the run's checkpoint.
        self._written(f"{self.directory}/ckpt-{step}", None, time.monotonic() - started)


def create(root: tf.train.Checkpoint, directory: str, *, keep: int = 3,
           asynchronous: bool = True, workers: int = 1, worker_id: int | None = None,
           probe_dir: str | None = None) -> SyncCheckpointer:
    """The checkpointer a run needs; the one place that chooses sync, async or worker.

    Args:
        root: what is saved and restored (`checkpoints.make_checkpoint`).
        directory: the work_dir, local or ``gs://``.
        keep: how many recent checkpoints to keep. Defaults to 3.
        asynchronous: write in a background thread (`AsyncCheckpointer`). Falls back to
            synchronous, with a warning, for a root that saves more than variables.
            Defaults to True.
        workers: hosts in the run. With more than one, saves are synchronous: all
            workers save together (reading a variable may take a collective), so one of
            them reading variables at other times could hang. Defaults to 1.
        worker_id: the task id of a non-chief worker (it gets a `WorkerCheckpointer`);
            None on the chief, or in a run of one process. Defaults to None.
        probe_dir: as for `SyncCheckpointer`. Defaults to None.

    Returns:
        A `WorkerCheckpointer`, `AsyncCheckpointer` or `SyncCheckpointer`.

    Examples:
        >>> checkpointer = create(root, work_dir, keep=3, asynchronous=True)
    """
    if worker_id is not None:
        return WorkerCheckpointer(root, directory, worker_id, keep, probe_dir)
    if asynchronous and workers == 1:
        try:
            return AsyncCheckpointer(root, directory, keep, probe_dir)
        except async_checkpoints.UnsupportedAsyncCheckpointError as err:
            logger.warning("fenwicks: checkpoints are saved synchronously: %s", err)
    return SyncCheckpointer(root, directory, keep, probe_dir)
