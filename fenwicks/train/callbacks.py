"""Callbacks: standard `keras.callbacks.Callback` objects, and two Keras lacks.

`Estimator.train` and `train_and_evaluate` call Keras callbacks as `model.fit` would, at
the boundaries Fenwicks has: ``on_train_begin/end``; ``on_epoch_begin/end`` at every
``steps_per_epoch`` steps, with the epoch's mean training ``loss`` and, after an
evaluation, ``val_loss``, ``val_accuracy``, ...; ``on_train_batch_begin/end`` around each
compiled loop of ``steps_per_loop`` steps (``batch`` is the global step, ``logs['loss']``
the loop's last loss). ``self.model.stop_training = True`` stops at the next loop
boundary; ``self.params`` holds ``epochs``, ``steps`` (per epoch) and ``verbose``.

Keras callbacks that cannot apply raise a `ValueError` saying why: ReduceLROnPlateau and
LearningRateScheduler set ``model.optimizer.learning_rate``, but Fenwicks' rate comes
from the schedule in ``opt_func``; BackupAndRestore duplicates what work_dir does;
SwapEMAWeights needs an optimizer with ``use_ema``, which Fenwicks' optimizers lack.

State across a resume: a Keras callback's state (EarlyStopping's ``wait`` and ``best``)
lives in the Python object, as with `model.fit`, so a new process starts it afresh.
`EarlyStopping` and `BestExporter` here replay the epoch log in work_dir
(`fenwicks.train.history`) when training begins, so their decisions are exact across
resumes.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np

from fenwicks.train import export_dirs, history

logger = logging.getLogger("fenwicks")

_UNSUPPORTED = {
    "ReduceLROnPlateau": "it sets model.optimizer.learning_rate, but Fenwicks' learning "
                         "rate comes from the schedule in opt_func; use a schedule such as "
                         "fw.train.exp_decay_lr or one_cycle_lr",
    "LearningRateScheduler": "it sets model.optimizer.learning_rate, but Fenwicks' learning "
                             "rate comes from opt_func; pass the schedule there instead "
                             "(fw.train.FunctionSchedule wraps a Python function)",
    "BackupAndRestore": "Fenwicks already resumes from work_dir (weights, optimizer, step, "
                        "input position); drop the callback",
    "SwapEMAWeights": "it needs an optimizer built with use_ema=True, which Fenwicks' "
                      "optimizers do not offer",
}


def check_supported(callbacks: Sequence[Any]) -> list[keras.callbacks.Callback]:
    """The callbacks as a list, or a ValueError naming one that cannot apply and why."""
    if callbacks is None:
        return []
    if isinstance(callbacks, keras.callbacks.Callback):
        callbacks = [callbacks]
    out = []
    for callback in callbacks:
        if not isinstance(callback, keras.callbacks.Callback):
            raise ValueError(f"callbacks must be keras.callbacks.Callback objects; got "
                             f"{callback!r}")
        for cls in type(callback).__mro__:
            if cls.__module__.startswith("keras") and cls.__name__ in _UNSUPPORTED:
                raise ValueError(f"callbacks: keras.callbacks.{cls.__name__} cannot be used "
                                 f"with Fenwicks: {_UNSUPPORTED[cls.__name__]}")
        out.append(callback)
    return out


def attach(callbacks: list[keras.callbacks.Callback], estimator: Any,
           epochs: int) -> list[keras.callbacks.Callback]:
    """Sets each callback's model and ``params`` (``epochs``, ``steps`` per epoch,
    ``verbose``) as ``model.fit`` does, and the estimator of those that take one."""
    params = {"epochs": epochs, "steps": estimator.config.steps_per_epoch, "verbose": 0}
    for callback in callbacks:
        if hasattr(callback, "set_estimator"):  # EarlyStopping, BestExporter
            callback.set_estimator(estimator)
        callback.set_model(estimator.model)
        callback.set_params(params)
    return callbacks


def val_logs(result: dict[str, float]) -> dict[str, float]:
    """Evaluation results under Keras's names: loss -> val_loss, accuracy -> val_accuracy."""
    return {f"val_{k}": float(v) for k, v in result.items()
            if k not in ("global_step", "num_examples")}


class EpochLog(keras.callbacks.Callback):
    """Appends each evaluated epoch's logs to the epoch log in work_dir
    (`fenwicks.train.history`), which resumable callbacks replay. Every `train` call's
    action list has it just before the user's callbacks (`controller.default_actions`).
    Only the chief writes it (the other workers of a multi-worker run write no files).

    Examples:
        >>> import tempfile
        >>> work_dir = tempfile.mkdtemp()
        >>> EpochLog(work_dir, lambda: 100).on_epoch_end(0, {'val_loss': 0.5})
        >>> EpochLog(work_dir, lambda: 200).on_epoch_end(1, {'loss': 0.4})  # not evaluated
        >>> print(open(work_dir + '/epochs.jsonl').read())
        {"epoch": 0, "step": 100, "logs": {"val_loss": 0.5}}
    """

    def __init__(self, work_dir: str, global_step: Callable[[], int],
                 writes: bool = True) -> None:
        super().__init__()
        self.work_dir, self.global_step, self.writes = work_dir, global_step, writes

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        logs = logs or {}
        if self.writes and any(k.startswith("val_") for k in logs):
            # Only evaluated epochs: what EarlyStopping and BestExporter replay.
            history.append_epoch(self.work_dir, epoch, self.global_step(), logs)


class _Replaying(keras.callbacks.Callback):
    """Replays the epochs of work_dir's epoch log before training goes on."""

    estimator: Any = None

    def set_estimator(self, estimator: Any) -> None:
        self.estimator = estimator

    def _replay(self) -> None:
        work_dir = self.estimator.config.work_dir
        for entry in history.read_epochs(work_dir, self.estimator.global_step):
            self._on_past_epoch(entry["epoch"], entry["logs"])

    def _on_past_epoch(self, epoch: int, logs: dict[str, float]) -> None:
        raise NotImplementedError


class EarlyStopping(_Replaying, keras.callbacks.EarlyStopping):
    """Keras's EarlyStopping, exact across resumes.

    Takes Keras's arguments (``monitor='val_loss'``, ``patience``, ``min_delta``,
    ``mode``, ``baseline``, ``start_from_epoch``). When training begins it replays the
    epochs work_dir has logged, so a resumed run stops at the same epoch as an
    uninterrupted one. ``restore_best_weights`` restores the best weights this process
    has seen (earlier processes' weights are gone); to keep the best model across
    resumes, add `BestExporter`.

    Examples:
        >>> import tempfile
        >>> X, y = np.random.rand(10, 4).astype('float32'), np.arange(10) % 3
        >>> model_func = fw.train.get_clf_model_func(lambda: keras.Sequential(
        ...     [keras.Input((4,)), keras.layers.Dense(3, kernel_initializer='zeros')]),
        ...     fw.train.sgd_optimizer(0.1))
        >>> train_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'])
        >>> eval_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'],
        ...                                           training=False)
        >>> est = fw.train.get_tpu_estimator(2, model_func, tempfile.mkdtemp(), trn_bs=4,
        ...                                  val_bs=4, verbose=False)
        >>> stop = fw.train.EarlyStopping(patience=1, min_delta=10)  # no epoch gains 10
        >>> _ = est.train_and_evaluate(train_fn, eval_fn, epochs=50, callbacks=[stop])
        >>> est.global_step   # stopped after 2 epochs of 2 steps
        4
    """

    def on_train_begin(self, logs: dict | None = None) -> None:
        super().on_train_begin(logs)
        self._replay()  # may already stop: the run had run out of patience

    def _on_past_epoch(self, epoch: int, logs: dict[str, float]) -> None:
        # Keras's own bookkeeping, minus copying weights this process never had.
        restore, self.restore_best_weights = self.restore_best_weights, False
        try:
            keras.callbacks.EarlyStopping.on_epoch_end(self, epoch, logs)
        finally:
            self.restore_best_weights = restore


class BestExporter(_Replaying):
    """Exports a SavedModel whenever an evaluation metric reaches a new best.

    Each best is a new version folder ``<export_dir>/<version>`` (as
    `Estimator.export_saved_model` writes), with ``best.json`` in it naming the step and
    the value; `fw.train.latest_export(export_dir)` is the best model. Of the versions
    it wrote, the newest `exports_to_keep` stay; an older one is removed only if it
    holds exactly the files its manifest lists, unchanged (any other is left in place
    with one warning). Nothing else in `export_dir` is touched. Past epochs in work_dir's
    epoch log count, so a resumed run exports only what beats the whole run's best.

    Args:
        export_dir: the folder of the best exports' versions (local or gs://).
        monitor: a key of the epoch logs, e.g. ``'val_accuracy'``. Defaults to
            ``'val_loss'``.
        mode: ``'min'``, ``'max'`` or ``'auto'`` (max for accuracy-like names).
            Defaults to ``'auto'``.
        exports_to_keep: how many of its newest versions to keep (as TensorFlow's
            BestExporter); None keeps all. Defaults to 5.

    Examples:
        >>> import tempfile
        >>> X, y = np.random.rand(10, 4).astype('float32'), np.arange(10) % 3
        >>> model_func = fw.train.get_clf_model_func(lambda: keras.Sequential(
        ...     [keras.Input((4,)), keras.layers.Dense(3, kernel_initializer='zeros')]),
        ...     fw.train.sgd_optimizer(0.1))
        >>> train_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'])
        >>> eval_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'],
        ...                                           training=False)
        >>> work_dir = tempfile.mkdtemp()
        >>> est = fw.train.get_tpu_estimator(2, model_func, work_dir, trn_bs=4, val_bs=4,
        ...                                  verbose=False)
        >>> best = fw.train.BestExporter(work_dir + '/best', monitor='val_accuracy')
        >>> _ = est.train_and_evaluate(train_fn, eval_fn, epochs=1, callbacks=[best])
        >>> print(open(fw.train.latest_export(work_dir + '/best') + '/best.json').read())
        {"step": 2, "epoch": 0, "monitor": "val_accuracy", "value": ...}
        >>> served = tf.saved_model.load(fw.train.latest_export(work_dir + '/best'))
    """

    def __init__(self, export_dir: str, monitor: str = "val_loss", mode: str = "auto",
                 exports_to_keep: int | None = 5) -> None:
        super().__init__()
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"mode={mode!r} must be 'auto', 'min' or 'max'")
        if exports_to_keep is not None and (isinstance(exports_to_keep, bool) or
                                            not isinstance(exports_to_keep, int)
                                            or exports_to_keep < 1):
            raise ValueError(f"exports_to_keep={exports_to_keep!r} must be a positive int "
                             "(the newest versions kept) or None to keep every one")
        if mode == "auto":
            mode = "max" if any(s in monitor for s in ("acc", "auc", "precision",
                                                       "recall")) else "min"
        self.export_dir, self.monitor, self.mode = export_dir.rstrip("/"), monitor, mode
        self.exports_to_keep = exports_to_keep
        self.best = math.inf if mode == "min" else -math.inf
        self.exports = 0
        self.last_export: str | None = None
        self._warned: set[str] = set()

    def _better(self, value: float) -> bool:
        return value < self.best if self.mode == "min" else value > self.best

    def on_train_begin(self, logs: dict | None = None) -> None:
        export_dirs.check_base(self.export_dir)  # a file in the way: before training
        self.best = math.inf if self.mode == "min" else -math.inf
        self._replay()

    def _on_past_epoch(self, epoch: int, logs: dict[str, float]) -> None:
        value = logs.get(self.monitor)
        if value is not None and self._better(value):
            self.best = value

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        value = (logs or {}).get(self.monitor)
        if value is None or not np.isfinite(value) or not self._better(value):
            return
        self.best = float(value)
        # A new version, visible only when whole (best.json with it): a failure
        # (storage, disk, a kill) leaves the previous best as it was.
        best = {"step": self.estimator.global_step, "epoch": epoch,
                "monitor": self.monitor, "value": self.best}
        self.last_export = export_dirs.write(
            self.export_dir, self.estimator.saved_model_writer(),
            extra_files={"best.json": json.dumps(best)},
            manifest_extra={"writer": "BestExporter", "best": best})
        self.exports += 1
        if self.exports_to_keep is not None:
            export_dirs.remove_old_versions(self.export_dir, self.exports_to_keep,
                                            "BestExporter", self._warned)
        logger.info("fenwicks: %s=%.6g is the best so far; exported to %s", self.monitor,
                    self.best, self.last_export)
