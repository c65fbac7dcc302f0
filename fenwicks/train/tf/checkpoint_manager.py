"""Writing checkpoints quickly: a compiled write, and the keep-N bookkeeping around it.

`tf.train.CheckpointManager.save` walks the checkpoint's object graph in Python on every
call, reads each variable with eager ops and builds a new saver each time. Measured on a
narrow `mnist_net` (18 variables, two CPU cores under load): 15-17 ms a save, of which
the files take 2-3 ms. That was most of what a short `train` call cost beyond its
compiled loops, since `train` waits for its last checkpoint. `CompiledWrite` traces
``tf.train.Checkpoint.write`` once with the file prefix as a tensor argument; later
writes run that graph: 2-4 ms.

`CheckpointManager` keeps the books `tf.train.CheckpointManager` keeps: it numbers
checkpoints ``<directory>/ckpt-<step>``, names a new one in the ``checkpoint`` state file
only once its files are complete (so `tf.train.latest_checkpoint` and a process killed
mid-save see the previous one), then removes all but the newest `max_to_keep`.
TensorFlow's manager cannot be handed a compiled write: it calls the checkpoint's
private ``_write``.

    manager = CheckpointManager(root, '/content/work', max_to_keep=3)
    manager.save(checkpoint_number=100)    # '/content/work/ckpt-100'
"""

from __future__ import annotations

import collections
import glob
import os
import re
import time
from typing import Any

import tensorflow as tf

from fenwicks import _removal, _tf_internals


class ObjectGraph:
    """What a checkpoint of `root` would record: every object reachable from it, with
    the name of each edge, walked breadth first as TensorFlow's saver walks it.

    Two graphs are equal when they hold the same objects under the same names: a
    write traced for one is valid for the other. The objects are kept alive, so an
    ``id`` seen here is never reused by a new object while the graph is compared.

    Examples:
        >>> ObjectGraph(root) == ObjectGraph(root)
        True
    """

    def __init__(self, root: Any) -> None:
        self.nodes, index, edges = [root], {id(root): 0}, []
        for parent in self.nodes:  # grows while it is read: breadth first
            children = tf.train.TrackableView(parent).children(parent)
            for name, child in children.items():
                if id(child) not in index:
                    index[id(child)] = len(self.nodes)
                    self.nodes.append(child)
                edges.append((index[id(parent)], name, index[id(child)]))
        # Each object by identity, each edge as (parent index, name, child index).
        self.key = (tuple(map(id, self.nodes)), tuple(edges))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectGraph) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)


class CompiledWrite:
    """``root.write(prefix)``, compiled once the same object graph is written twice.

    The first write of an object graph runs eagerly; the second traces
    ``tf.train.Checkpoint.write`` into a function of the prefix, and every later write
    of that graph only runs it. A variable added under `root` (an optimizer's slots
    built after the first save) changes the graph, so it is written eagerly once and
    traced again: nothing is ever left out of a checkpoint. Tracing and the first run
    take 0.3-0.6 s for `mnist_net` on a loaded CPU (some 20 eager writes), which a run
    that saves once never pays.

    Args:
        root: what is written (a `tf.train.Checkpoint`).
        follow_graph: walk `root`'s object graph at each write (0.5-1 ms for a small
            model) to notice a variable added under it. False when the caller makes a
            new `CompiledWrite` when the graph changes. Defaults to True.

    Examples:
        >>> write = CompiledWrite(tf.train.Checkpoint(v=tf.Variable(1.0)))
        >>> write('/tmp/run/ckpt-1'); write('/tmp/run/ckpt-2')   # eager, then traced
        '/tmp/run/ckpt-2'
    """

    def __init__(self, root: tf.train.Checkpoint, follow_graph: bool = True) -> None:
        self.root, self._follow_graph = root, follow_graph
        self._last_graph: object = None  # of the previous write
        self._traced: tuple[object, Any] | None = None  # (graph, concrete function)

    @property
    def traced(self) -> bool:
        """Whether the last write ran the compiled function."""
        return self._traced is not None and self._traced[0] is self._last_graph

    def __call__(self, prefix: str) -> str:
        # Made on first use, as `tf.train.CheckpointManager.save` makes it: checkpoints
        # keep their object graph, and a root that has one restores them.
        counter = self.root.save_counter
        graph = ObjectGraph(self.root) if self._follow_graph else _FIXED_GRAPH
        if self._traced is None or self._traced[0] != graph:
            if graph != self._last_graph:  # a new graph: written eagerly this once
                self._last_graph = graph
                counter.assign_add(1)
                return self.root.write(prefix)
            self._traced = (graph, self._trace())
        self._last_graph = self._traced[0]
        try:
            self._traced[1](tf.constant(prefix))
        except tf.errors.OpError as err:
            raise type(err)(err.node_def, err.op, own_message(err.message)) from None
        return prefix

    def _trace(self) -> Any:
        root, host = self.root, _host_cpu()

        def write(prefix: tf.Tensor) -> tf.Tensor:
            root.save_counter.assign_add(1)  # saves made, as `tf.train.Checkpoint.save`
            # An eager write puts the object graph's tensor on this process's CPU with
            # its full name; inside a function it would get a bare "/device:CPU:0", and
            # the saver, grouping tensors by device name, would write two data files.
            with tf.device(host):
                return root.write(prefix)

        # No autograph: the body has no Python control flow, and converting it took
        # 140 ms.
        function = tf.function(write, input_signature=[tf.TensorSpec([], tf.string)],
                               autograph=False)
        return function.get_concrete_function()


_FIXED_GRAPH = object()  # what a write with follow_graph=False compares: always equal


def _host_cpu() -> str:
    """The full name of this process's CPU (``/job:localhost/replica:0/task:0/device:
    CPU:0`` in a run of one process), where an eager write puts the object graph."""
    with tf.init_scope(), tf.device("CPU:0"):
        return tf.constant(0).device


# The trace a compiled function's error carries: "Graph execution error:", then per node
# "Detected at node X defined at (most recent call last):" and the Python frames.
_FRAME = re.compile(r'^ {2}File ".*", line \d+')
_NODE_TAG = re.compile(r"^\s*\[\[\{\{node .*\}\}\]\]")


def own_message(message: str) -> str:
    """TensorFlow's message of an error raised inside a compiled function, without the
    trace of where the function's nodes were defined (the user's lines would say
    nothing of why the write failed, and the first line would be "Graph execution
    error:").

    Examples:
        >>> own_message('Graph execution error:\\n\\nDetected at node SaveV2 defined at'
        ...             ' (most recent call last):\\n  File "a.py", line 3, in f\\n\\n'
        ...             'disk full\\n\\t [[{{node SaveV2}}]]')
        'disk full'
    """
    if not message.startswith("Graph execution error:"):
        return message
    lines = message.splitlines()
    last_frame = max((i for i, line in enumerate(lines) if _FRAME.match(line)), default=0)
    own = [line for line in lines[last_frame + 1:]
           if line.strip() and not line.startswith("    ")  # a frame's source line
           and not line.startswith("Detected at node") and not _NODE_TAG.match(line)]
    return "\n".join(own) or message


class CheckpointManager:
    """Numbers, writes and prunes the checkpoints of `root` in `directory`, as
    `tf.train.CheckpointManager` does, through a `CompiledWrite`.

    The directory's ``checkpoint`` state file is read on first use, not when the manager
    is made (a request on gs://, and a restore before the first save may change the
    directory). Every checkpoint it lists counts towards `max_to_keep`, oldest first.

    Args:
        root: what is saved (a `tf.train.Checkpoint`).
        directory: where, local or ``gs://``.
        max_to_keep: how many of the newest checkpoints are kept.
        checkpoint_name: the checkpoints' prefix. Defaults to ``'ckpt'``.

    Attributes:
        directory: as given.

    Examples:
        >>> manager = CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)),
        ...                             '/tmp/run', max_to_keep=2)
        >>> manager.save(checkpoint_number=7)
        '/tmp/run/ckpt-7'
        >>> tf.train.latest_checkpoint('/tmp/run')
        '/tmp/run/ckpt-7'
    """

    def __init__(self, root: tf.train.Checkpoint, directory: str, max_to_keep: int,
                 checkpoint_name: str = "ckpt") -> None:
        if not isinstance(max_to_keep, int) or max_to_keep < 1:
            raise ValueError(f"max_to_keep={max_to_keep!r} must be a positive int, e.g. 3")
        self.directory, self.write = directory, CompiledWrite(root)
        self._prefix, self._max_to_keep = f"{directory}/{checkpoint_name}", max_to_keep
        self._latest: str | None = None
        self._kept: collections.OrderedDict[str, float] | None = None  # path: written at
        self._last_preserved = 0.0

    @property
    def latest_checkpoint(self) -> str | None:
        """The newest checkpoint the state file names; None if it names none."""
        if self._kept is None:
            self._read_state()
        return self._latest

    @property
    def checkpoints(self) -> list[str]:
        """The checkpoints kept, oldest first."""
        if self._kept is None:
            self._read_state()
        return list(self._kept)

    def reload(self) -> None:
        """Reads the state file again on next use: the directory changed under this
        manager (another run's checkpoints restored, damaged ones set aside)."""
        self._kept = self._latest = None

    def save(self, checkpoint_number: int) -> str:
        """Writes ``<directory>/ckpt-<checkpoint_number>``, names it in the state file,
        then removes all but the newest `max_to_keep`.

        Returns:
            The new checkpoint's prefix.

        Raises:
            tf.errors.OpError: the write or the state file failed; the state file and
                `latest_checkpoint` still name the previous checkpoint.
        """
        if self._kept is None:
            self._read_state()
        path = f"{self._prefix}-{checkpoint_number}"
        self.write(path)
        kept = collections.OrderedDict((p, t) for p, t in self._kept.items() if p != path)
        kept[path] = time.time()  # an overwritten checkpoint moves to the newest end
        self._record(path, kept)
        self._kept, self._latest = kept, path
        # Named before anything is removed: a process killed while removing still finds
        # the new checkpoint, and the next save removes what is left.
        removed = [kept.popitem(last=False)[0] for _ in range(len(kept) - self._max_to_keep)]
        for old in removed:
            _remove_checkpoint_files(old)
        if removed:
            self._record(path, kept)
        return path

    def _read_state(self) -> None:
        state = tf.train.get_checkpoint_state(self.directory)  # None: none, or unreadable
        self._kept = collections.OrderedDict()
        # As TensorFlow's manager: a state file without times gets this one minus a second.
        self._last_preserved = time.time() - 1.0
        if state is None:
            return
        self._latest = state.model_checkpoint_path or None
        self._last_preserved = state.last_preserved_timestamp or self._last_preserved
        times = list(state.all_model_checkpoint_timestamps)
        for i, path in enumerate(state.all_model_checkpoint_paths):
            self._kept[path] = times[i] if i < len(times) else self._last_preserved

    def _record(self, latest: str, kept: collections.OrderedDict[str, float]) -> None:
        _tf_internals.update_checkpoint_state(
            self.directory, latest, list(kept), timestamps=list(kept.values()),
            last_preserved=self._last_preserved)


def _remove_checkpoint_files(prefix: str) -> None:
    """Removes checkpoint `prefix`'s index and data files (those that exist)."""
    for pattern in (prefix + ".index", prefix + ".data-?????-of-?????"):
        for path in _matching(pattern):
            _removal.remove_file(path)  # removed meanwhile: the aim all the same


def _matching(pattern: str) -> list[str]:
    # On local disk Python's glob: TensorFlow's hands the matching to a thread pool,
    # which took tens of ms on a loaded machine.
    if "://" in pattern:
        return tf.io.gfile.glob(pattern)
    directory, name = os.path.split(pattern)
    return glob.glob(os.path.join(glob.escape(directory), name))
