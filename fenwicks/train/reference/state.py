"""The reference engine's run state: the model's kernel and bias, the step counters, and
their checkpoints, all dicts of host NumPy arrays.

The Keras model's variables hold the weights between loops, as on the JAX engine, so
that callbacks, ``model.get_weights()`` and a callback's ``set_weights`` (EarlyStopping's
``restore_best_weights``) see and change the live model: a loop reads them into a dict
(`tree`), steps on the dict, and puts the result back (`set_tree`). Those two are all a
checkpoint needs of the engine: ``tree()`` gathers the state to host arrays, ``set_tree``
scatters them back.

Checkpoints (`NumpyCheckpointer`) are ``<work_dir>/reference/ckpt-<step>``, one ``.npz``
archive each (what another engine reads of them: `weights`), written to a temporary name
and renamed (a killed write leaves no checkpoint), on a local work_dir. Everything else
(the lock, summary writers, the reload after a NaN, following a work_dir that changed) is
the shared `RunState`'s.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from fenwicks import _removal
from fenwicks.train import building, cross_engine
from fenwicks.train.checkpointing import (
    Checkpointer,
    CheckpointMismatchError,
    CheckpointWriteError,
    step_of,
)
from fenwicks.train.reference import model as linear
from fenwicks.train.reference import weights
from fenwicks.train.run_state import HostCountedRunState

logger = logging.getLogger("fenwicks")

Tree = dict[str, dict[str, np.ndarray]]  # {'params': {...}, 'counters': {...}}


def _flatten(tree: Tree) -> dict[str, np.ndarray]:
    return {f"{group}/{name}": np.asarray(value)
            for group, values in tree.items() for name, value in values.items()}


def _unflatten(flat: Any) -> Tree:
    tree: Tree = {}
    for key in flat.files:
        group, name = key.split("/", 1)
        tree.setdefault(group, {})[name] = flat[key]
    return tree


class NumpyCheckpointer(Checkpointer):
    """`Checkpointer` of a tree of NumPy arrays, one synchronous ``.npz`` file a step.

    Args:
        work_dir: the run's local work_dir.
        collect: ``() -> tree`` of the live state (host arrays).
        apply: puts a restored tree into the live state.
        keep: checkpoints kept (the oldest are removed).

    Examples:
        >>> import os, tempfile
        >>> tree = {'params': {'bias': np.zeros(1)}, 'counters': {'global_step': 10}}
        >>> checkpointer = NumpyCheckpointer(tempfile.mkdtemp(), lambda: tree,
        ...                                  lambda restored: print(restored), 3)
        >>> checkpointer.save(10)
        >>> os.path.basename(checkpointer.restore())   # applies what it read, then says where
        {'params': {'bias': array([0.])}, 'counters': {'global_step': array(10)}}
        'ckpt-10'
    """

    def __init__(self, work_dir: str, collect: Callable[[], Tree],
                 apply: Callable[[Tree], None], keep: int) -> None:
        if "://" in work_dir:
            raise ValueError(f"work_dir={work_dir!r}: the reference engine writes its "
                             "checkpoints to a local folder only; give a local path")
        self.directory = os.path.join(work_dir, "reference")
        self._collect, self._apply, self._keep = collect, apply, keep
        self._good: tuple | None = None  # (path, size, mtime) of the last durable one
        self._last_save_secs: float | None = None

    def _path(self, step: int) -> str:
        return f"{self.directory}/ckpt-{step}"

    def _steps_on_disk(self) -> list[int]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(step_of(name) for name in names
                      if name.startswith("ckpt-") and step_of(name) >= 0)

    @staticmethod
    def _fingerprint(path: str) -> tuple:
        info = os.stat(path)
        return path, info.st_size, info.st_mtime_ns

    @property
    def last_good(self) -> str | None:
        return self._good[0] if self._good else None

    @property
    def latest(self) -> str | None:
        return self.last_good

    @property
    def last_save_secs(self) -> float | None:
        return self._last_save_secs

    def save(self, step: int, *, force: bool = False) -> None:
        path = self._path(step)
        if not force and self.last_good == path:
            return
        started = time.monotonic()
        temporary = f"{path}.tmp"
        try:
            os.makedirs(self.directory, exist_ok=True)
            with open(temporary, "wb") as file:
                np.savez(file, **_flatten(self._collect()))
            os.replace(temporary, path)
        except OSError as err:
            if os.path.exists(temporary):
                _removal.remove_file(temporary)
            raise CheckpointWriteError(
                f"could not write checkpoint {path}: {err}. The previous checkpoint "
                f"({self.last_good or 'none'}) is intact: free space or fix the folder's "
                "permissions, then train again") from err
        self._good = self._fingerprint(path)
        self._last_save_secs = time.monotonic() - started
        for old in self._steps_on_disk()[:-self._keep]:
            _removal.remove_file(self._path(old))

    def restore(self, path: str | None = None) -> str | None:
        if path is None:
            steps = self._steps_on_disk()
            if not steps:
                return None
            path = self._path(steps[-1])
        with np.load(path, allow_pickle=False) as flat:
            self._apply(_unflatten(flat))
        self._good = self._fingerprint(path)
        return path

    def wait(self) -> None:
        """Nothing to wait for: every save is written before it returns."""

    def change_on_disk(self) -> str | None:
        """None if the newest checkpoint on disk is the one this object last wrote or
        read; ``'removed'`` if there is none any more; else ``'replaced'``."""
        steps = self._steps_on_disk()
        if not steps:
            return "removed" if self._good else None
        return None if self._fingerprint(self._path(steps[-1])) == self._good else "replaced"


class ReferenceRunState(HostCountedRunState):
    """`RunState` of a linear model whose state is dicts of NumPy arrays (module doc).

    Examples:
        >>> import tempfile
        >>> from fenwicks.train.options import EstimatorConfig
        >>> config = EstimatorConfig(steps_per_epoch=4, work_dir=tempfile.mkdtemp(),
        ...                          train_batch_size=8, eval_batch_size=4,
        ...                          predict_batch_size=4, steps_per_loop=2,
        ...                          precision='float32', num_replicas=1, verbose=False)
        >>> X = np.ones((16, 3), 'float32')
        >>> y = X.sum(1, keepdims=True)   # 3: a zero model's squared error is 9
        >>> from fenwicks.train.reference.inputs import ReferenceInputManager
        >>> from fenwicks.train.reference.model import linear_model_func
        >>> state = ReferenceRunState(linear_model_func(3, kernel_initializer='zeros'),
        ...                           config, fw.accel.current())
        >>> train_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'])
        >>> probe = ReferenceInputManager(config, fw.accel.current()).probe(train_fn, 'train')
        >>> state.build(probe.features_spec, probe.params)   # restores work_dir's latest
        >>> state.tree()['counters']['global_step'], state.tree()['params']['bias']
        (np.int64(0), array([0.], dtype=float32))
    """

    engine = "reference"

    @property
    def is_chief(self) -> bool:
        return True  # one process

    def tree(self) -> Tree:
        """The state as host arrays: what a checkpoint holds."""
        return {"params": linear.params_of(self._model),
                "counters": {"global_step": np.int64(self.step),
                             "input_steps": np.int64(self.input_steps_taken)},
                # The Keras paths, for another engine reading it (`weights.read`).
                "paths": {name: np.str_(variable.path) for name, variable in
                          zip(weights.PARAMS, self._model.weights, strict=True)}}

    def set_tree(self, tree: Tree) -> None:
        """Puts host arrays (a checkpoint's, or a loop's result) into the live state."""
        params = tree["params"]
        for name, value in linear.params_of(self._model).items():
            if params[name].shape != value.shape:
                raise CheckpointMismatchError(
                    f"the checkpoint's {name} has shape {params[name].shape} and the "
                    f"model's {value.shape}: it was written for another model; give a new "
                    "work_dir")
        linear.set_params(self._model, params)
        self.step = int(tree["counters"]["global_step"])
        self.input_steps_taken = int(tree["counters"]["input_steps"])

    def build(self, features_spec: Any, params: dict) -> None:
        """Builds the Keras model (its initial weights), then restores work_dir's
        newest checkpoint, or reads the other engines' for evaluate and predict."""
        if self.built:
            return
        if self.config.seed is not None:
            keras.utils.set_random_seed(self.config.seed)
        spec, self.optimizer = building.build_model(self._model_func, params,
                                                    self.config.precision, features_spec)
        linear.check_spec(spec, self.optimizer)
        self.features_spec = features_spec
        self._model = spec.model
        self.step = self.input_steps_taken = 0
        checkpointer = NumpyCheckpointer(self.config.work_dir, self.tree, self.set_tree,
                                         self.config.keep_checkpoints)
        restored = checkpointer.restore()
        if restored is None:  # another engine's checkpoint, for evaluate and predict
            saved = cross_engine.restore_for_reading(spec.model, self.config.work_dir,
                                                     self.engine)
            if saved is not None:
                self.step, self.other_engines_checkpoint = saved.step, saved.checkpoint
                self.training_refusal = cross_engine.cannot_continue(
                    self.config.work_dir, saved, self.engine, "the reference engine "
                    "continues no other engine's run (it keeps checkpoints of its own)")
        self._spec, self._checkpointer = spec, checkpointer

    def reset(self) -> None:
        super().reset()
        self.step = self.input_steps_taken = 0
