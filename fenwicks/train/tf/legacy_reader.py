"""Reading a work_dir's TensorFlow checkpoints (``<work_dir>/ckpt-<step>``), written by
the TensorFlow engine before the run format: restored, never written. The run's next
checkpoint is in the run format (`fenwicks.train.run_format`), which hands a work_dir
holding none of its own steps to this reader.

What such a checkpoint holds, how it is matched with the model, and how a damaged one is
diagnosed and set aside is `checkpoints.py`.
"""

from __future__ import annotations

import tensorflow as tf

from fenwicks.train.tf import checkpoints


class LegacyReader:
    """Restores a work_dir's TensorFlow checkpoints into the live state; writes none.

    The newest readable checkpoint is restored: a damaged one is set aside
    (``*.corrupt``) with a warning and the one before it restored
    (`checkpoints.restore_latest`).

    Args:
        root: what is restored (`checkpoints.make_checkpoint`).
        directory: the work_dir, local or ``gs://``.
        probe_dir: scratch space for the model's probe copy before a restore
            (`checkpoints.expected_shapes`): a TPU reached over the network cannot write
            local files. Defaults to None: a local temp dir.

    Examples:
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        >>> optimizer = keras.optimizers.SGD(0.1)
        >>> optimizer.build(model.trainable_variables)
        >>> step, position = tf.Variable(21, dtype=tf.int64), tf.Variable(21, dtype=tf.int64)
        >>> root = checkpoints.make_checkpoint(model, optimizer, step, position)
        >>> root.write('old_run/ckpt-21')   # as the TF engine wrote before the run format
        'old_run/ckpt-21'
        >>> _ = step.assign(0)
        >>> reader = LegacyReader(root, 'old_run')
        >>> reader.restore(), int(step)
        ('old_run/ckpt-21', 21)
    """

    def __init__(self, root: tf.train.Checkpoint, directory: str,
                 probe_dir: str | None = None) -> None:
        self.directory = directory.rstrip("/")
        self._root, self._probe_dir = root, probe_dir
        self._last_good: str | None = None  # the checkpoint restored
        self._fingerprint: tuple | None = None  # of the checkpoint last read

    def restore(self, path: str | None = None) -> str | None:
        """Restores checkpoint `path` (a ``.../ckpt-<step>`` prefix), or the newest
        readable one of `directory`.

        Returns:
            The checkpoint restored; None if `directory` holds none.

        Raises:
            CheckpointMismatchError: the checkpoint belongs to another model.
            CheckpointCorruptError: checkpoints are listed but none can be read.
            CheckpointReadError: the storage did not answer (nothing is set aside).
        """
        if path is None:
            restored = checkpoints.restore_latest(self._root, self.directory,
                                                  self._probe_dir)
        else:
            checkpoints.read(self._root, path, self.directory, self._probe_dir)
            restored = path
        if path is None or restored.rsplit("/", 1)[0] == self.directory:
            self._last_good = restored
            self._fingerprint = checkpoints.fingerprint(restored)
        return restored

    @property
    def last_good(self) -> str | None:
        """The checkpoint of `directory` last restored, or None."""
        return self._last_good

    def change_on_disk(self) -> str | None:
        """Whether `directory`'s newest checkpoint changed since this object read it.

        The newest checkpoint's index is compared byte for byte (through
        `checkpoints.fingerprint`), so a copy put in place under the same name counts.

        Returns:
            None if the newest checkpoint is the one last read; ``'removed'`` if there
            is no checkpoint left; ``'replaced'`` otherwise.
        """
        current = checkpoints.latest(self.directory)
        if checkpoints.fingerprint(current) == self._fingerprint:
            return None
        return "removed" if current is None else "replaced"

    def close(self) -> None:
        """Nothing to release (no file is open between calls); for the run format's
        `close`."""
