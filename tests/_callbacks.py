"""Keras's own callbacks driven by the estimator, the same code on 1 and on 8 replicas.

    python -m tests._callbacks WORK_ROOT      # (under FENWICKS_DEVICE=cpu:8) prints JSON

`tests/test_callbacks.py` runs it in a `cpu:8` subprocess and checks the scenarios against
what Keras documents; `scenarios` also runs them in-process.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import fenwicks as fw
from fenwicks.train import run_format
from tests import _flagship as flagship

MODEL = "mnist_net"
STEPS_PER_EPOCH = flagship.NUM_TRAIN // flagship.GLOBAL_BATCH  # 32


def make_data() -> tuple[np.ndarray, np.ndarray]:
    return flagship.digits(MODEL)


def make_estimator(work_dir: str, **kwargs: Any) -> Any:
    return flagship.estimator(MODEL, work_dir, steps_per_loop=10, **kwargs)


def early_stopping(work_dir: str) -> dict[str, Any]:
    """Keras's EarlyStopping: no epoch after the first improves by 10, patience 1."""
    x, y = make_data()
    est = make_estimator(work_dir)
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=10,
                                         restore_best_weights=True)
    est.train_and_evaluate(flagship.train_input(x, y), flagship.eval_input(x, y), epochs=6,
                           callbacks=[stop])
    evals = [e["loss"] for e in est.history.evals]
    after = est.evaluate(flagship.eval_input(x, y))
    return {"step": est.global_step, "evals": evals,
            "stopped_epoch": stop.stopped_epoch, "after": after["loss"],
            "saved": checkpoint_holds(est, work_dir)}


def checkpoint_holds(est: Any, work_dir: str) -> bool:
    """Whether work_dir's newest checkpoint holds each model variable's value, bit for
    bit, as read from the file (not through an estimator: a new 8-replica one costs
    ~10 s to build and compile)."""
    saved = run_format.read_values(run_format.latest(work_dir))
    variables = est.model.variables
    return len(variables) > 0 and all(
        variable.path in saved and np.array_equal(saved[variable.path], np.asarray(variable))
        for variable in variables)


def terminate_on_nan(work_dir: str) -> dict[str, Any]:
    """Features turn NaN from the 26th batch on: TerminateOnNaN stops without raising."""
    x, y = make_data()
    est = make_estimator(work_dir, save_every_loops=1)

    def poisoned(params: dict) -> tf.data.Dataset:
        ds = flagship.train_input(x, y)(params).enumerate()
        per_step = fw.accel.current().num_replicas
        return ds.map(lambda i, b: (tf.where(i >= 25 * per_step, np.nan, b[0]), b[1]))

    est.train(poisoned, steps=60, callbacks=[keras.callbacks.TerminateOnNaN()])
    before = est.global_step
    est.evaluate(flagship.eval_input(x, y))  # reloads the last good checkpoint
    return {"stopped_at": before, "reloaded": est.global_step}


def model_checkpoint(work_dir: str) -> dict[str, Any]:
    """ModelCheckpoint writes a .keras file each epoch; the last equals the model."""
    x, y = make_data()
    path = os.path.join(work_dir, "model.keras")
    est = make_estimator(work_dir)
    est.train_and_evaluate(flagship.train_input(x, y), flagship.eval_input(x, y), epochs=2,
                           callbacks=[keras.callbacks.ModelCheckpoint(path)])
    saved = keras.saving.load_model(path)
    logits = np.asarray(saved(x[flagship.NUM_TRAIN:], training=False), np.float64)
    probs = est.predict(flagship.eval_input(x, y)) if fw.accel.current().num_workers == 1 \
        else None
    return {"logits": logits.tolist(), "probs": None if probs is None else probs.tolist()}


SCENARIOS = {"early_stopping": early_stopping, "terminate_on_nan": terminate_on_nan,
             "model_checkpoint": model_checkpoint}
# What the replica count can change: weights set back into mirrored variables (Keras's
# restore_best_weights), a NaN seen in the all-reduced loss, a Keras file written from
# mirrored variables. The call order, logs, CSVLogger and stop_training are the shared
# code's, the same Python on any engine and strategy: test_reference_engine.py.
EIGHT_REPLICA_SCENARIOS = ("early_stopping", "terminate_on_nan", "model_checkpoint")


def scenarios(work_root: str, names: tuple[str, ...] = tuple(SCENARIOS)) -> dict[str, Any]:
    return {name: SCENARIOS[name](os.path.join(work_root, name)) for name in names}


if __name__ == "__main__":
    print(json.dumps(scenarios(sys.argv[1], tuple(sys.argv[2:]) or tuple(SCENARIOS)),
                     default=float))
