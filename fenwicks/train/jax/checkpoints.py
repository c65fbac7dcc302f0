"""Checkpoints of the JAX engine in orbax-checkpoint's format, on local disk or ``gs://``.

One checkpoint is one pytree: ``{'model': [arrays], 'optimizer': [arrays], 'counters':
{'global_step', 'input_steps'}}``, the variables in the order of ``model.variables`` and
``optimizer.variables``, their paths in the checkpoint's metadata. It holds every model
variable (trainable or not: BatchNorm statistics, seed-generator states), every optimizer
variable (slots, ``iterations``, a loss scale) and the counters, so the next step depends
on nothing else.
Orbax writes each into a temporary directory and renames it when complete, so a process
killed mid-save leaves the previous checkpoint as the latest (and the partial directory
is removed by the next run).

A save first takes a snapshot (`snapshot`): copies of the state's arrays that no later
step can change, dispatched without waiting for them (a training step donates the
state's buffers, so the arrays themselves are gone once the next step runs). A variable
is replicated on every device; one copy is enough, and it goes to host memory (the
``pinned_host`` memory of this process's first device: no accelerator memory is taken).
The arrays then reach orbax as NumPy arrays, which it writes once, from process 0, as
it writes a replicated array. With ``async_checkpoints`` `save` returns once the
snapshot is dispatched (a millisecond or two), and a background thread of this object
waits for the copies, has orbax write them and, for ``gs://``, uploads the step; without,
the same runs before `save` returns. (Orbax's own asynchronous save blocked for ~70 ms
on the benchmark's 19 MB state over 8 CPU devices: it cuts each replicated array into a
slice per device, one dispatch each, and copies them to host before it returns.)

The checkpoints live in ``<work_dir>/orbax/<step>``; the TensorFlow engine's stay
``<work_dir>/ckpt-<step>.*``, so the two formats never mix.

``gs://`` work_dirs: staged. Orbax writes each checkpoint to a local scratch directory
exactly as for a local work_dir; the completed step directory is then uploaded with
`fenwicks.io.upload` (gcsfs), and last of all ``<step>/commit_success.txt`` is written,
the marker orbax itself uses on GCS. Only a step directory holding that marker counts as
a checkpoint; restoring downloads it (`fenwicks.io.download`) into the scratch directory
and orbax reads it there. Why staging rather than orbax's own ``gs://`` support
(tensorstore's GCS driver, and etils' paths for its metadata):

* Atomicity. GCS has no atomic rename; orbax's own answer there is the same marker
  written last. Here the marker goes up only after every other object of the step is
  complete (GCS objects appear whole or not at all), so a step whose upload was cut
  short is never taken for the latest, and the previous checkpoint stays the one
  restored. Old checkpoints are pruned marker first, for the same reason.
* Async saves. Orbax's write to local disk is followed by the upload in the same
  background thread of this object; `save` still returns once the snapshot is
  dispatched, and `wait` (the next save, the end of ``train``) raises a failed upload.
* One storage client and one source of credentials. gcsfs (`fenwicks.io`) takes its
  credentials from ``google.auth`` (what ``fw.gcs.setup()`` sets up on Colab and Kaggle,
  and what `fenwicks.gcs.check_credentials` verifies), talks to an emulator through
  ``STORAGE_EMULATOR_HOST``, and has Fenwicks' bounded retries and its errors
  (`fenwicks.io.TransferError`). Tensorstore has its own credential lookup, retry
  settings and endpoint variable, and its OCDBT writes rely on conditional
  (``ifGenerationMatch``) requests that the offline test emulator does not implement;
  nothing about it could be tested here.
* The cost: one local copy of the newest checkpoint (in the temporary directory, removed
  by `close`), and an upload after each write rather than writing straight to the
  bucket. Only a single-process run stages; several JAX processes on ``gs://`` are
  refused with a clear error.

`OrbaxCheckpointer` is a `fenwicks.train.checkpointing.Checkpointer`, as the TensorFlow
engine's are, so the controller's `SavePolicy` saves through it unchanged; it also has
what `RunState` reads of theirs (``last_good``, ``pending_step``, ``change_on_disk``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from fenwicks import _deadline, _removal
from fenwicks import io as fw_io
from fenwicks._text import first_line
from fenwicks.train.checkpointing import (
    Checkpointer,
    CheckpointReadError,
    CheckpointWriteError,
    none_readable,
    step_of,
)

logger = logging.getLogger("fenwicks")

SUBDIR = "orbax"
COMMIT_FILE = "commit_success.txt"  # orbax's own completion marker on GCS
METADATA_FILE = "_CHECKPOINT_METADATA"  # orbax's; holds the commit time of that copy
_TREE_METADATA = "_METADATA"  # orbax's record of the pytree: paths, shapes, dtypes
CORRUPT_SUFFIX = ".corrupt"  # as the TensorFlow engine's damaged checkpoints


class _Damaged(Exception):
    """A step whose files cannot be read (the reason is its text); the next older is."""


class CheckpointDownloadError(CheckpointReadError):
    """A ``gs://`` checkpoint could not be downloaded after gcsfs's retries.

    Nothing was restored or changed: the checkpoint may be perfectly sound.
    """

    def __init__(self, path: str, cause: BaseException) -> None:
        self.path, self.cause = path, cause
        if isinstance(cause, fw_io.TransferError) and cause.__cause__ is not None:
            cause = cause.__cause__  # what storage answered, not the paths again
        OSError.__init__(
            self, f"could not read checkpoint {path}: the download failed after the "
            f"storage client's retries ({type(cause).__name__}: {first_line(cause)}). "
            "Nothing was restored or changed in the work_dir; the checkpoint is not known "
            "to be damaged. Check the network or the bucket's status, then create the "
            "estimator again")


def directory(work_dir: str) -> str:
    """Where a work_dir's JAX checkpoints live."""
    return f"{work_dir}/{SUBDIR}"


def snapshot(tree: Any) -> Any:
    """`tree` as it is now, in arrays that no later step changes; does not wait.

    A fully replicated array becomes a copy of this process's first shard in host
    memory (its device's ``pinned_host`` memory where there is one); any other array a
    copy with the same sharding (each process copies its own shards, and orbax writes
    them as it would the original's). Other leaves (the NumPy counters) stay as they are.
    The copies are dispatched asynchronously, ordered before any later step that
    donates the arrays' buffers.

    Examples:
        >>> import jax
        >>> tree = {'kernel': jax.numpy.ones(3), 'step': np.int64(7)}
        >>> frozen = snapshot(tree)   # returns at once; a step may now donate 'kernel'
        >>> to_host(frozen)           # waits for the copies: the values at the snapshot
        {'kernel': array([1., 1., 1.], dtype=float32), 'step': np.int64(7)}
    """
    leaves, treedef = jax.tree.flatten(tree)
    arrays = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]
    replicated = [i for i in arrays if leaves[i].is_fully_replicated]
    sharded = [i for i in arrays if not leaves[i].is_fully_replicated]
    shards = [leaves[i].addressable_data(0) for i in replicated]
    if not replicated + sharded:
        return tree
    copies = jax.device_put(
        shards + [leaves[i] for i in sharded],
        [_host_memory(shard.device) for shard in shards]
        + [leaves[i].sharding for i in sharded], may_alias=False)
    for i, copy in zip(replicated + sharded, copies, strict=True):
        leaves[i] = copy
    return jax.tree.unflatten(treedef, leaves)


def to_host(frozen: Any) -> Any:
    """A `snapshot` as orbax is given it: the replicated arrays' copies as NumPy arrays
    (this waits for them), the sharded ones as they are (orbax copies their shards)."""
    return jax.tree.map(lambda x: np.asarray(x) if isinstance(x, jax.Array)
                        and x.is_fully_replicated else x, frozen)


@functools.cache
def _host_memory(device: Any) -> Any:
    kinds = {memory.kind for memory in device.addressable_memories()}
    return jax.sharding.SingleDeviceSharding(
        device, memory_kind="pinned_host" if "pinned_host" in kinds else None)


class _Write:
    """One checkpoint write, in a background thread or at once in the caller's; `join`
    waits for it and raises its error in the caller."""

    def __init__(self, write: Callable[[], None], background: bool, name: str) -> None:
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, args=(write,), daemon=True,
                                            name=name)
            self._thread.start()
        else:
            self._run(write)

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except BaseException as err:  # noqa: BLE001 - raised by `join`, in the caller
            self._error = err

    def join(self) -> None:
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error


def _abstract(tree: Any, sharding: Any) -> Any:
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding), tree)


class OrbaxCheckpointer(Checkpointer):
    """`Checkpointer` of one pytree of a run under ``<work_dir>/orbax``, with orbax.

    A ``gs://`` work_dir is staged through a local scratch directory (see the module doc).

    Args:
        work_dir: the run's work_dir (local path or ``gs://``).
        collect: ``() -> pytree`` of the arrays to save (called at each save).
        apply: ``(pytree) -> None``, puts restored arrays back.
        describe: ``() -> dict`` of JSON metadata saved with each checkpoint.
        keep: how many recent checkpoints to keep.
        asynchronous: write (and upload) in a background thread (`wait` joins it).
        sharding: where restored arrays go (replicated over the mesh).

    Raises:
        ValueError: a ``gs://`` work_dir with several JAX processes.

    Examples:
        >>> checkpointer = OrbaxCheckpointer('gs://my-bucket/work/run', state.tree,
        ...                                  state.set_tree, state.paths, 3, True,
        ...                                  mesh.replicated())
        >>> checkpointer.save(100)
        >>> checkpointer.restore()   # 'gs://my-bucket/work/run/orbax/100'
    """

    def __init__(self, work_dir: str, collect: Callable[[], Any],
                 apply: Callable[[Any], None], describe: Callable[[], dict], keep: int,
                 asynchronous: bool, sharding: Any) -> None:
        import orbax.checkpoint as ocp  # optional: the JAX engine's dependency

        self._ocp = ocp
        self.directory = directory(work_dir)
        self._bucket = StagedBucket(self.directory, keep) if fw_io.is_gcs(work_dir) else None
        self._collect, self._apply, self._sharding = collect, apply, sharding
        self._describe = describe
        self.asynchronous = asynchronous
        local = self._bucket.scratch if self._bucket else os.path.abspath(self.directory)
        self._manager = ocp.CheckpointManager(
            local, options=ocp.CheckpointManagerOptions(
                # Staged: the bucket keeps `keep`; locally only the newest is needed.
                max_to_keep=1 if self._bucket else keep,
                # Orbax writes in the calling thread: this object's background thread
                # when asynchronous (the module doc says why).
                enable_async_checkpointing=False, create=True,
                cleanup_tmp_directories=True))
        self._last_save_secs: float | None = None
        self.last_blocked_secs: float | None = None  # how long the last save() blocked
        self._pending: tuple[int, float, _Write] | None = None  # (step, start, write)
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

    def _local(self, step: int) -> str:
        return os.path.join(str(self._manager.directory), str(step))

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
                _removal.remove_orbax_step(self._manager, step)
            write = functools.partial(self._write, step, snapshot(self._collect()),
                                      self._describe())
        except Exception as err:
            raise self._write_error(step, err) from err
        # Synchronous: written here, before `wait` (below) raises its error, if any.
        self._pending = (step, started, _Write(write, self.asynchronous,
                                               f"fenwicks-checkpoint-{step}"))
        self.last_blocked_secs = time.monotonic() - started
        if not self.asynchronous:
            self.wait()

    def _write(self, step: int, frozen: Any, metadata: dict) -> None:
        """Orbax's write of a `snapshot`, then (``gs://``) the step uploaded and committed."""
        self._manager.save(step, args=self._ocp.args.StandardSave(to_host(frozen)),
                           force=True, custom_metadata=metadata)
        if self._bucket:
            self._bucket.publish(step, self._local(step))

    def wait(self) -> None:
        """Waits for a checkpoint being written in the background, if any.

        Raises:
            CheckpointWriteError: that write failed (raised once); the checkpoint before
                it stays the latest.
        """
        if self._pending is None:
            return
        step, started, write = self._pending
        self._pending = None
        try:
            write.join()
        except Exception as err:
            raise self._write_error(step, err) from err
        self._last_save_secs = time.monotonic() - started
        # Staged: the bucket's copy holds the local files, byte for byte.
        self._good = _fingerprint(self._path(step), self._local(step) if self._bucket
                                  else None)

    def agree(self, due: bool) -> bool:
        """True on every process if a periodic save is due on any: each process reads
        its own clock (``save_every_secs``), and a save is a collective of them all."""
        from fenwicks.train.jax import processes

        return due if self._single else bool(processes.processes_where(due))

    def _write_error(self, step: int, err: BaseException) -> CheckpointWriteError:
        if isinstance(err, fw_io.TransferError) and err.__cause__ is not None:
            # Its own text names every path again; what storage answered is the news.
            cause = err.__cause__
            what = (f"the upload to the bucket failed after the storage client's retries "
                    f"({type(cause).__name__}: {first_line(cause)[:200]})")
        else:
            what = first_line(err)[:200] or type(err).__name__
        return CheckpointWriteError(
            f"could not write checkpoint {self._path(step)}: {what}. The previous "
            f"checkpoint ({self.last_good or 'none'}) is intact: free space or fix the "
            "storage, then call train() again")

    def _latest_on_disk(self) -> int | None:
        if self._bucket:
            return self._bucket.latest_step()
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

        For the latest, a damaged step (a data file cut short, a garbled ``_METADATA``)
        is never loaded: the next older one is, with a warning naming it, and the
        damaged step is set aside as ``<step>.corrupt`` (kept, not deleted), as the
        TensorFlow engine does with its checkpoints.

        Returns:
            The checkpoint restored, or None if there is none.

        Raises:
            ValueError: the checkpoint was written for another model.
            CheckpointCorruptError: steps are there but none can be read.
            CheckpointDownloadError: a ``gs://`` checkpoint could not be downloaded
                (a `CheckpointReadError`); nothing was restored or changed.
        """
        self.wait()
        if path is not None:
            return self._restore_step(step_of(path))
        steps = self._steps_on_disk()
        damaged: list[tuple[str, str]] = []
        for step in reversed(steps):
            try:
                restored = self._restore_step(step)
            except _Damaged as err:
                damaged.append((self._path(step), str(err)))
                continue
            if damaged:
                self._set_aside(damaged, restored)
            return restored
        if steps:
            raise none_readable(self.directory.rsplit("/", 1)[0], len(steps), damaged,
                                f"the step folders of {self.directory}")
        return None

    def _steps_on_disk(self) -> list[int]:
        if self._bucket:
            return complete_steps(self._bucket.remote)
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def _restore_step(self, step: int) -> str:
        """Restores `step`; `_Damaged` if its files cannot be read."""
        good = _fingerprint(self._path(step))
        if self._bucket:
            self._bucket.fetch(step, self._local(step), good)
            self._manager.reload()
        target = _abstract(self._collect(), self._sharding)
        try:
            restored = self._manager.restore(
                step, args=self._ocp.args.StandardRestore(target))
        except Exception as err:
            self._raise_mismatch_or_damage(step, target, err)
        self._apply(restored)
        self._good = good
        return self._path(step)

    def _raise_mismatch_or_damage(self, step: int, target: Any, err: Exception) -> None:
        """Another model's checkpoint (its recorded shapes differ from the model's) is a
        ValueError; anything else that failed to read is damage (`_Damaged`)."""
        # TensorStore's text goes on with a repr of its whole spec: the first words say it
        cause = first_line(err).split(" See full TensorStore details")[0][:300] or \
            type(err).__name__
        saved = self._saved_shapes(step)
        if saved is None:
            raise _Damaged(f"its {_TREE_METADATA} is unreadable; {cause}") from err
        if saved != [np.shape(leaf) for leaf in jax.tree.leaves(target)]:
            raise ValueError(
                f"checkpoint {self._path(step)} does not fit this model: {cause}. Use the "
                "model_func that wrote it, or another work_dir (warm_start_from= loads "
                "the variables that match)") from err
        raise _Damaged(f"its data files are cut short or damaged; {cause}") from err

    def _saved_shapes(self, step: int) -> list[tuple] | None:
        """The shapes the step's metadata records, in the pytree's order; None if its
        metadata cannot be read (then the step is damaged, not another model's)."""
        try:
            tree = self._ocp.StandardCheckpointer().metadata(
                os.path.join(self._local(step), "default")).item_metadata
            leaves = jax.tree.leaves(tree)
        except Exception:  # noqa: BLE001 - an unreadable metadata file: damaged
            return None
        return [tuple(leaf.shape) for leaf in leaves] if leaves else None

    def _set_aside(self, damaged: list[tuple[str, str]], used: str) -> None:
        """Warns once per damaged step, as the TensorFlow engine does, and renames it
        ``<step>.corrupt`` (on ``gs://`` its commit marker), so it is no longer a step."""
        for where, why in damaged:
            logger.warning("fenwicks: checkpoint %s is unreadable (%s); resumed from the "
                           "older %s instead. Its files are kept as %s%s", where, why, used,
                           where, CORRUPT_SUFFIX if not self._bucket else
                           f" (without {COMMIT_FILE}: renamed {COMMIT_FILE}{CORRUPT_SUFFIX})")
        try:
            for where, _ in damaged:
                if self._bucket:
                    self._bucket.set_aside(step_of(where))
                else:
                    os.rename(where, where + CORRUPT_SUFFIX)
        except Exception as err:  # noqa: BLE001 - a read-only work_dir: read around it
            logger.warning("fenwicks: could not set the damaged checkpoint(s) aside in %s "
                           "(%s); they stay in place and are skipped", self.directory,
                           first_line(err))
        self._manager.reload()

    def close(self) -> None:
        """Waits for a write in progress, then closes the manager's threads (and removes
        a ``gs://`` run's scratch directory)."""
        try:
            self.wait()
        finally:
            self._manager.close()
            if self._bucket:
                self._bucket.close()


def _fingerprint(path: str, copy: str | None = None) -> tuple:
    """``(path, digest)``: which checkpoint, and which copy of it. Orbax's metadata file
    holds the copy's commit time, so another run's checkpoint written under the same
    step has another digest; a copy downloaded from the bucket has the same. `copy`: a
    local directory known to hold the same files as `path` (read instead of it)."""
    source = copy or path
    try:
        data = _deadline.run(_read_bytes, f"{source}/{METADATA_FILE}",
                             what="checkpoint metadata", path=source)
    except FileNotFoundError:
        return (path,)
    except Exception as err:
        if type(err).__name__ != "NotFoundError":  # TensorFlow's: not an OSError
            raise
        return (path,)
    return (path, hashlib.sha256(data).hexdigest())


def _read_bytes(path: str) -> bytes:
    if not fw_io.is_gcs(path):
        with open(path, "rb") as f:
            return f.read()
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as f:
        return f.read()


# --------------------------------------------------------------------------- gs://


class StagedBucket:
    """The ``gs://`` side of a staged run: which steps are complete, upload, download,
    prune. Holds the local scratch directory orbax writes and reads."""

    def __init__(self, remote: str, keep: int) -> None:
        if jax.process_count() > 1:
            raise ValueError(
                f"work_dir={remote.rsplit('/', 1)[0]!r}: the JAX engine stages gs:// "
                "checkpoints through one process's local disk, and this run has "
                f"{jax.process_count()} JAX processes; give a work_dir on a filesystem "
                "all hosts share, or run on one host")
        fw_io.check_bucket(remote)
        self.remote, self.keep = remote, keep
        self.scratch = tempfile.mkdtemp(prefix="fenwicks-orbax-")
        # Removed by `close`, or when this object goes (an estimator never closed).
        self._cleanup = _removal.remove_tree_at_exit(self, self.scratch)
        # Steps whose local copy is known to equal the bucket's: {step: fingerprint}.
        self._copies: dict[int, tuple] = {}

    def latest_step(self) -> int | None:
        steps = complete_steps(self.remote)
        return steps[-1] if steps else None

    def publish(self, step: int, local: str) -> None:
        """Uploads the completed local step directory, commits it, prunes old steps."""
        target = f"{self.remote}/{step}"
        self._remove(target)  # a copy being replaced, or an upload cut short earlier
        for name in sorted(os.listdir(local)):
            if name != COMMIT_FILE:  # the marker goes last, once everything is there
                fw_io.upload(os.path.join(local, name), target, progress=False)
        _deadline.run(_write_text, f"{target}/{COMMIT_FILE}",
                      f"Checkpoint commit was successful to {target}",
                      what="checkpoint commit", path=target)
        self._copies[step] = _fingerprint(target, local)
        self._prune()

    def fetch(self, step: int, local: str, fingerprint: tuple) -> None:
        """Makes `local` a copy of the bucket's `step` (downloaded unless known equal).

        Raises:
            CheckpointDownloadError: the download failed; nothing was restored.
        """
        if self._copies.get(step) == fingerprint and len(fingerprint) > 1 \
                and os.path.isdir(local):
            return
        _removal.remove_tree(local, ignore_errors=True)
        source = f"{self.remote}/{step}"
        try:
            fw_io.download(source, self.scratch, progress=False)
        except Exception as err:
            _removal.remove_tree(local, ignore_errors=True)  # never restore a partial copy
            raise CheckpointDownloadError(source, err) from err
        self._copies = {step: fingerprint}

    def set_aside(self, step: int) -> None:
        """Renames the commit marker of a damaged `step`: no longer complete, kept."""
        import tensorflow as tf

        marker = f"{self.remote}/{step}/{COMMIT_FILE}"
        tf.io.gfile.rename(marker, marker + CORRUPT_SUFFIX, overwrite=True)

    def _prune(self) -> None:
        """Keeps the newest `keep` complete steps; removes older ones and the leftovers
        of uploads cut short (no marker), marker first."""
        complete = complete_steps(self.remote)
        if not complete:
            return
        kept = set(complete[-self.keep:])
        for name in fw_io.listdir(self.remote):
            step = _step_name(name)
            if step is not None and step not in kept and step <= complete[-1]:
                self._remove(f"{self.remote}/{name}")

    def _remove(self, path: str) -> None:
        if fw_io.exists(path):
            _deadline.run(_remove_step, path, what="removing an old checkpoint", path=path)

    def close(self) -> None:
        self._cleanup()


def complete_steps(remote: str) -> list[int]:
    """Steps of a ``gs://.../orbax`` directory whose upload was committed, oldest first.

    Examples:
        >>> complete_steps('gs://my-bucket/work/run/orbax')
        [300, 400]
    """
    found = fw_io.glob(f"{remote}/*/{COMMIT_FILE}")
    steps = {_step_name(path.rsplit("/", 2)[-2]) for path in found}
    return sorted(step for step in steps if step is not None)


def _step_name(name: str) -> int | None:
    name = name.rstrip("/")
    return int(name) if name.isdigit() else None


def _write_text(path: str, text: str) -> None:
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "w") as f:
        f.write(text)


def _remove_step(path: str) -> None:
    """Marker first: a step half removed is never taken for a checkpoint."""
    _removal.remove_file(f"{path}/{COMMIT_FILE}")
    _removal.remove_tree(path)


@contextlib.contextmanager
def local_copy(source: str) -> Iterator[str]:
    """`source` readable on local disk, for a warm start: unchanged if local; for
    ``gs://``, its latest complete checkpoint (or the ``<work_dir>/orbax/<step>`` it
    names) downloaded to a temporary directory, removed afterwards.

    Yields:
        A local ``.../<step>`` directory, or `source` itself if it is local or holds no
        complete JAX-engine checkpoint (the caller says so).

    Raises:
        ValueError: `source` names a step directory whose upload was not completed.

    Examples:
        >>> with local_copy('pretrain') as path:   # local: read where it is
        ...     path
        'pretrain'

        For ``gs://my-bucket/work/pretrain``, `path` is its newest complete step,
        downloaded to ``/tmp/fenwicks-warm-start-xxxx/400`` and removed after the
        ``with``.
    """
    if not fw_io.is_gcs(source):
        yield source
        return
    source = source.rstrip("/")
    if _step_name(source.rsplit("/", 1)[-1]) is not None:
        remote, step = source.rsplit("/", 1)[0], int(source.rsplit("/", 1)[-1])
        if not fw_io.exists(f"{source}/{COMMIT_FILE}"):
            raise ValueError(
                f"warm_start_from={source!r} is not a complete checkpoint (it has no "
                f"{COMMIT_FILE}: its upload was cut short); give the work_dir to use its "
                "latest complete checkpoint")
    else:
        remote = directory(source)
        steps = complete_steps(remote)
        if not steps:
            yield source
            return
        step = steps[-1]
    with _removal.temporary_dir(prefix="fenwicks-warm-start-") as scratch:
        try:
            fw_io.download(f"{remote}/{step}", scratch, progress=False)
        except Exception as err:
            raise CheckpointDownloadError(f"{remote}/{step}", err) from err
        yield os.path.join(scratch, str(step))
