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
that shows the test would see slots that were not carried. ``restored_difference``:
how far the inner optimizer's variables are, right after the restore, from the
checkpoint's arrays read back from disk (None for a fresh run).

    python -m tests._precision_switch legacy WORK_DIR PRECISION

restores a work_dir of the format before the run format (tests/data/legacy_work_dirs,
float32, Adam) at PRECISION, prints how far the inner optimizer's restored variables
are from the checkpoint's (`cross_engine.read`), the loss scale, then trains 2 steps.

    python -m tests._precision_switch bfloat16-layer WORK_DIR MAX_STEPS PRECISION

trains (resuming) a small model whose first Dense layer has ``dtype='bfloat16'``, so its
variables are bfloat16 whatever the precision, and prints the dtypes its newest step's
record lists and those of the model's variables.
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
    restored = _restored_difference(state.latest_checkpoint, optimizer) if start else None
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
            "restored_difference": restored, "loss_scale_at_start": scale_at_start,
            "loss_scale": _scale(state.optimizer),
            "variable_dtypes": sorted({str(v.dtype) for v in est.model.variables}),
            "variables": path, "latest": state.latest_checkpoint}


def _restored_difference(step_dir: str, optimizer) -> float:
    """The largest difference between the inner optimizer's variables just restored and
    the step's arrays of the checkpoint's inner optimizer (its variables without a loss
    scale's own), read back from disk and paired in order."""
    from fenwicks.train import run_format

    paths = [path for path, _, _ in run_format.read_record(step_dir)["layout"]["optimizer"]]
    wrapper = run_format.loss_scale_prefix(paths)
    values = run_format.read_values(step_dir)
    stored = [values[path] for path in paths if path.rpartition("/")[0] != wrapper]
    live = [keras.ops.convert_to_numpy(v) for v in optimizer.variables]
    return max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
               for a, b in zip(stored, live, strict=True))


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


def bfloat16_layer(work_dir: str, max_steps: str, precision: str) -> dict:
    from fenwicks.train import run_format

    def build() -> keras.Model:
        inputs = keras.Input((8, 8, 1))
        hidden = keras.layers.Dense(16, dtype="bfloat16")(keras.layers.Flatten()(inputs))
        return keras.Model(inputs, keras.layers.Dense(10)(hidden))

    x, y = _contract.digits()
    model_func = fw.train.get_clf_model_func(build, fw.train.sgd_optimizer(0.05, mom=0.9))
    est = fw.train.get_tpu_estimator(8, model_func, work_dir, trn_bs=BATCH, val_bs=64,
                                     seed=_contract.SEED, verbose=False,
                                     precision=precision)
    est.train(lambda params: fw.data.numpy_ds(
        x[:1024], y[:1024], params["batch_size"], seed=_contract.SEED,
        input_context=params["input_context"]), max_steps=int(max_steps))
    state = est.parts.state
    record = run_format.read_record(state.latest_checkpoint)
    return {"engine": fw.accel.engine(), "step": state.global_step,
            "stored": sorted({dtype for group in run_format.GROUPS
                              for _, _, dtype in record["layout"][group]}),
            "variables": sorted({str(v.dtype) for v in est.model.variables})}


def _scale(optimizer) -> float | None:
    scale = getattr(optimizer, "dynamic_scale", None)
    return None if scale is None else float(keras.ops.convert_to_numpy(scale))


if __name__ == "__main__":
    modes = {"legacy": legacy, "bfloat16-layer": bfloat16_layer}
    print(json.dumps(modes[sys.argv[1]](*sys.argv[2:]) if sys.argv[1] in modes
                     else main(*sys.argv[1:])), flush=True)
