"""The JAX engine's orbax checkpoints of work_dirs written before the run format
(``<work_dir>/orbax/<step>``), read only; and the engine's snapshot of its arrays, which
the run format writes (`fenwicks.train.run_format`).

An old checkpoint is one pytree: ``{'model': [arrays], 'optimizer': [arrays], 'counters':
{'global_step', 'input_steps'}}``, the variables in the order of ``model.variables`` and
``optimizer.variables``, their paths in the checkpoint's metadata. `LegacyReader`
restores it (falling back past damaged steps) when the work_dir holds no run-format
step; the run's next checkpoint is in the run format. A ``gs://`` work_dir's steps were
staged: uploaded whole, then ``<step>/commit_success.txt`` last; only a step with that
marker counts, and it is downloaded to local scratch space to be read
(`run_format.StagedBucket`, which stages the run format's steps the same way).

A save of the run format first takes a snapshot (`snapshot`): copies of the state's
arrays that no later step can change, dispatched without waiting for them (a training
step donates the state's buffers, so the arrays themselves are gone once the next step
runs). A variable is replicated on every device; one copy is enough, and it goes to host
memory (the ``pinned_host`` memory of this process's first device: no accelerator
memory is taken). `to_host` then waits for the copies, in the run format's writer thread
for an asynchronous save. (Orbax's own asynchronous save blocked for ~70 ms on the
benchmark's 19 MB state over 8 CPU devices: it cuts each replicated array into a slice
per device, one dispatch each, and copies them to host before it returns.)
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from fenwicks import _removal
from fenwicks import io as fw_io
from fenwicks._text import first_line
from fenwicks.train import run_format
from fenwicks.train.checkpointing import step_of
from fenwicks.train.run_format import CheckpointDownloadError, DamagedStep, fingerprint

SUBDIR = "orbax"
COMMIT_FILE = run_format.COMMIT_FILE  # orbax's own completion marker on GCS
_TREE_METADATA = "_METADATA"  # orbax's record of the pytree: paths, shapes, dtypes


def directory(work_dir: str) -> str:
    """Where a work_dir's old JAX-engine checkpoints are.

    Examples:
        >>> directory('/kaggle/working/run')
        '/kaggle/working/run/orbax'
    """
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


def _abstract(tree: Any, sharding: Any) -> Any:
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding), tree)


class LegacyReader:
    """Restores a work_dir's old JAX-engine checkpoints (``<work_dir>/orbax/<step>``) into
    the live state, with orbax; writes none.

    A ``gs://`` work_dir's step is downloaded to local scratch space first (see the
    module doc).

    Args:
        work_dir: the run's work_dir (local path or ``gs://``).
        collect: ``() -> pytree`` of the live arrays (the shapes a restore expects).
        apply: ``(pytree) -> None``, puts restored arrays back.
        sharding: where restored arrays go (replicated over the mesh).

    Raises:
        ValueError: a ``gs://`` work_dir with several JAX processes.

    Examples:
        >>> from fenwicks.train.jax import mesh
        >>> from fenwicks.train.jax.state import JaxRunState
        >>> from fenwicks.train.options import EstimatorConfig
        >>> acc = fw.accel.current()   # the JAX engine's devices
        >>> config = EstimatorConfig(steps_per_epoch=1, work_dir='run', train_batch_size=4,
        ...                          eval_batch_size=4, predict_batch_size=4, steps_per_loop=1,
        ...                          precision='float32', num_replicas=acc.num_replicas)
        >>> model_func = fw.train.get_clf_model_func(
        ...     lambda: keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]),
        ...     fw.train.sgd_optimizer(0.1))
        >>> state = JaxRunState(model_func, config, acc)
        >>> state.build(tf.TensorSpec([None, 3], tf.float32), {})   # 'run' holds nothing yet

        Step 21 of a run, as the JAX engine wrote it before the run format: the state's
        tree (`JaxRunState.tree`) as host arrays, saved with orbax in ``run/orbax/21``.

        >>> import os, orbax.checkpoint as ocp
        >>> old = to_host(snapshot(state.tree()))
        >>> old['model'][0] = np.ones((3, 2), 'float32')   # the kernel that run trained
        >>> old['counters'] = {'global_step': np.int64(21), 'input_steps': np.int64(21)}
        >>> with ocp.CheckpointManager(os.path.abspath(directory('run'))) as manager:
        ...     manager.save(21, args=ocp.args.StandardSave(old))
        True
        >>> reader = LegacyReader('run', state.tree, state.set_tree, mesh.replicated())
        >>> reader.restore()   # the newest step, into the built state
        'run/orbax/21'
        >>> state.global_step, state.input_position
        (21, 21)
        >>> np.asarray(state.spec.model.layers[0].kernel)
        array([[1., 1.],
               [1., 1.],
               [1., 1.]], dtype=float32)
        >>> reader.close(); state.close()
    """

    def __init__(self, work_dir: str, collect: Callable[[], Any],
                 apply: Callable[[Any], None], sharding: Any) -> None:
        self._ocp = run_format.ocp()
        self.directory = directory(work_dir)
        # Nothing is uploaded, so nothing is pruned: the bucket's `keep` is never used.
        self._bucket = (run_format.StagedBucket(self.directory, 1, jax.process_count())
                        if fw_io.is_gcs(work_dir) else None)
        self._collect, self._apply, self._sharding = collect, apply, sharding
        local = self._bucket.scratch if self._bucket else os.path.abspath(self.directory)
        self._manager = self._ocp.CheckpointManager(
            local, options=self._ocp.CheckpointManagerOptions(
                create=False, cleanup_tmp_directories=True))  # a save cut short: removed
        self._good: tuple | None = None  # fingerprint of the checkpoint last read

    @property
    def last_good(self) -> str | None:
        """The checkpoint this object last restored, or None."""
        return self._good[0] if self._good else None

    def _path(self, step: int) -> str:
        return f"{self.directory}/{step}"

    def _local(self, step: int) -> str:
        return os.path.join(str(self._manager.directory), str(step))

    def change_on_disk(self) -> str | None:
        """None if the newest checkpoint on disk is the one this object last read;
        ``'removed'`` if there is none any more; else ``'replaced'``."""
        steps = self._steps_on_disk()
        if not steps:
            return "removed" if self._good else None
        return None if fingerprint(self._path(steps[-1])) == self._good else "replaced"

    def restore(self, path: str | None = None) -> str | None:
        """Restores `path` (a ``<work_dir>/orbax/<step>`` folder), or the latest.

        For the latest, a damaged step (a data file cut short, a garbled ``_METADATA``)
        is never loaded: the next older one is, with a warning naming it, and the
        damaged step is set aside as ``<step>.corrupt`` (kept, not deleted), as the
        run format does with its steps.

        Returns:
            The checkpoint restored, or None if there is none.

        Raises:
            ValueError: the checkpoint was written for another model.
            CheckpointCorruptError: steps are there but none can be read.
            CheckpointDownloadError: a ``gs://`` checkpoint could not be downloaded
                (a `CheckpointReadError`); nothing was restored or changed.
        """
        if path is not None:
            return self._restore_step(step_of(path))
        return run_format.restore_newest(
            self._steps_on_disk(), self._restore_step, self._path, self._set_aside,
            self.directory.rsplit("/", 1)[0], self.directory)

    def _steps_on_disk(self) -> list[int]:
        if self._bucket:
            return self._bucket.complete_steps()
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def _restore_step(self, step: int) -> str:
        """Restores `step`; `DamagedStep` if its files cannot be read."""
        good = fingerprint(self._path(step))
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
        ValueError; anything else that failed to read is damage (`DamagedStep`)."""
        # TensorStore's text goes on with a repr of its whole spec: the first words say it
        cause = first_line(err).split(" See full TensorStore details")[0][:300] or \
            type(err).__name__
        saved = self._saved_shapes(step)
        if saved is None:
            raise DamagedStep(f"its {_TREE_METADATA} is unreadable; {cause}") from err
        if saved != [np.shape(leaf) for leaf in jax.tree.leaves(target)]:
            raise ValueError(
                f"checkpoint {self._path(step)} does not fit this model: {cause}. Use the "
                "model_func that wrote it, or another work_dir (warm_start_from= loads "
                "the variables that match)") from err
        raise DamagedStep(f"its data files are cut short or damaged; {cause}") from err

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
        run_format.set_aside(damaged, used, self.directory, self._bucket)
        self._manager.reload()

    def close(self) -> None:
        """Closes the manager's threads (and removes a ``gs://`` run's scratch folder)."""
        try:
            self._manager.close()
        finally:
            if self._bucket:
                self._bucket.close()


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
    if source.rsplit("/", 1)[-1].isdigit():
        remote, step = source.rsplit("/", 1)[0], int(source.rsplit("/", 1)[-1])
        if not fw_io.exists(f"{source}/{COMMIT_FILE}"):
            raise ValueError(
                f"warm_start_from={source!r} is not a complete checkpoint (it has no "
                f"{COMMIT_FILE}: its upload was cut short); give the work_dir to use its "
                "latest complete checkpoint")
    else:
        remote = directory(source)
        steps = run_format.complete_steps(remote)
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
