"""Process helper of tests/test_precision_switch.py: one run continued at another
precision, on either engine (issue 53: a Kaggle TPU run, JAX engine at bfloat16, finished
on a Colab T4, TensorFlow engine at float16 with a loss scale).

    python -m tests._precision_switch WORK_DIR MAX_STEPS PRECISION [zero-slots]

trains `tests._engine_switch`'s run (the tutorial-1 network on the digits, one-cycle
learning rate, momentum SGD) up to MAX_STEPS at PRECISION, resuming WORK_DIR's run
whichever engine and precision wrote it, and prints one JSON line: the engine, the
precision, the optimizer's class, the step it started from and reached, the input
position, ``iterations``, the loss scale (None without one) and the file holding the
model's variables and the inner optimizer's variables (``iterations`` and the momentum
slots) then. ``zero-slots`` zeroes the momentum slots after the restore, the control
that shows the test would see slots that were not carried.

    python -m tests._precision_switch legacy WORK_DIR PRECISION

restores a work_dir of the format before the run format (tests/data/legacy_work_dirs,
float32, AdamW) at PRECISION, prints how far the inner optimizer's restored variables
are from the checkpoint's (`cross_engine.read`), the loss scale, then trains 2 steps.
"""

from __future__ import annotations

import json
import sys

import keras
import numpy as np

import fenwicks as fw
from tests import _contract, _engine_switch

BATCH, NUM_TRAIN = _engine_switch.BATCH, _engine_switch.NUM_TRAIN


def inner(optimizer) -> keras.optimizers.Optimizer:
    """The optimizer that holds ``iterations`` and the slots (inside a loss scale's)."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def main(work_dir: str, max_steps: str, precision: str, control: str = "") -> dict:
    x, y = _contract.digits()
    est = fw.train.get_tpu_estimator(NUM_TRAIN // BATCH, _engine_switch.model_func(),
                                     work_dir, trn_bs=BATCH, val_bs=64, seed=_contract.SEED,
                                     steps_per_loop=5, verbose=False, precision=precision)
    train_fn = lambda params: fw.data.numpy_ds(  # noqa: E731
        x[:NUM_TRAIN], y[:NUM_TRAIN], params["batch_size"], seed=_contract.SEED,
        input_context=params["input_context"])
    eval_fn = lambda params: fw.data.numpy_ds(  # noqa: E731
        x[NUM_TRAIN:], y[NUM_TRAIN:], params["batch_size"], training=False)
    state = est.parts.state
    start = est.evaluate(eval_fn)["global_step"]  # builds the model, restoring work_dir
    optimizer = inner(state.optimizer)
    if control == "zero-slots":
        for variable in optimizer.variables:
            if "iteration" not in variable.path and "learning_rate" not in variable.path:
                variable.assign(np.zeros(variable.shape, variable.dtype))
    scale_at_start = _scale(state.optimizer)
    est.train(train_fn, max_steps=int(max_steps))
    path = f"{work_dir}/variables-{fw.accel.engine()}-{state.global_step}{control}.npz"
    np.savez(path, *[keras.ops.convert_to_numpy(v) for v in est.model.variables],
             *[keras.ops.convert_to_numpy(v) for v in optimizer.variables])
    return {"engine": fw.accel.engine(), "precision": fw.accel.current().precision
            if precision == "auto" else precision,
            "optimizer": type(state.optimizer).__name__, "start": start,
            "step": state.global_step, "input_position": state.input_position,
            "iterations": int(keras.ops.convert_to_numpy(optimizer.iterations)),
            "loss_scale_at_start": scale_at_start, "loss_scale": _scale(state.optimizer),
            "variable_dtypes": sorted({str(v.dtype) for v in est.model.variables}),
            "variables": path, "latest": state.latest_checkpoint}


def legacy(work_dir: str, precision: str) -> dict:
    from fenwicks.train import cross_engine
    from tests import _cross_engine

    train_fn, eval_fn, _ = _cross_engine.inputs()
    est = _cross_engine.estimator(work_dir, precision=precision)
    state = est.parts.state
    est.evaluate(eval_fn)  # builds the model, restoring work_dir
    saved = cross_engine.read(state.latest_checkpoint)
    restored = [keras.ops.convert_to_numpy(v) for v in inner(state.optimizer).variables]
    difference = max(float(np.max(np.abs(np.asarray(a, np.float64) - b)))
                     for a, b in zip(saved.optimizer, restored, strict=True))
    scale = _scale(state.optimizer)
    est.train(train_fn, steps=2)
    return {"engine": fw.accel.engine(), "optimizer": type(state.optimizer).__name__,
            "checkpoint": saved.checkpoint, "saved_engine": saved.engine,
            "slots": len(saved.optimizer) - 1, "restored_difference": difference,
            "loss_scale_at_start": scale, "step": state.global_step,
            "iterations": int(keras.ops.convert_to_numpy(
                inner(state.optimizer).iterations))}


def _scale(optimizer) -> float | None:
    scale = getattr(optimizer, "dynamic_scale", None)
    return None if scale is None else float(keras.ops.convert_to_numpy(scale))


if __name__ == "__main__":
    print(json.dumps(legacy(*sys.argv[2:]) if sys.argv[1] == "legacy"
                     else main(*sys.argv[1:])), flush=True)
