"""Process helper of tests/test_engine_switch.py: one run continued on either engine.

    python -m tests._engine_switch WORK_DIR MAX_STEPS [CONTROL]

trains `tests._contract`'s model (the tutorial-1 network, narrow, from NumPy-drawn
weights, ghost BatchNorm, 8 replicas) with a one-cycle learning rate and momentum SGD
on the digits up to MAX_STEPS, resuming WORK_DIR's run whichever engine wrote it, and
prints one JSON line: the engine, the step it started from and reached, the input
position, the optimizer's iterations and learning rate at the end, and the file holding
the model's and optimizer's variables then. CONTROL spoils the resume on purpose, to
show the test would see it: ``zero-slots`` zeroes the optimizer's slots after the
restore, ``position-zero`` restarts the input from its first batch.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import keras
import numpy as np

import fenwicks as fw
from tests import _contract

BATCH = 128  # 16 per replica on 8 replicas
NUM_TRAIN = 1152  # 9 steps an epoch: step 100 is inside an epoch
LR_STEPS, WARMUP, PEAK = 300, 30, 0.1


def model_func() -> Any:
    lr_func = fw.train.one_cycle_lr(PEAK, LR_STEPS, WARMUP, fw.train.linear_decay())
    return fw.train.get_clf_model_func(_contract.build_nn,
                                       fw.train.sgd_optimizer(lr_func, mom=0.9, wd=5e-4))


def main(work_dir: str, max_steps: str, control: str = "") -> dict:
    x, y = _contract.digits()
    est = fw.train.get_tpu_estimator(NUM_TRAIN // BATCH, model_func(), work_dir,
                                     trn_bs=BATCH, val_bs=64, seed=_contract.SEED,
                                     steps_per_loop=5, verbose=False)
    train_fn = lambda params: fw.data.numpy_ds(  # noqa: E731
        x[:NUM_TRAIN], y[:NUM_TRAIN], params["batch_size"], seed=_contract.SEED,
        input_context=params["input_context"])
    eval_fn = lambda params: fw.data.numpy_ds(  # noqa: E731
        x[NUM_TRAIN:], y[NUM_TRAIN:], params["batch_size"], training=False)
    state = est.parts.state
    start = est.evaluate(eval_fn)["global_step"]  # builds the model, restoring work_dir
    if control == "zero-slots":
        for variable in state.optimizer.variables:
            if "iteration" not in variable.path and "learning_rate" not in variable.path:
                variable.assign(np.zeros(variable.shape, variable.dtype))
    elif control == "position-zero":
        state.set_counters(state.global_step, 0)
    est.train(train_fn, max_steps=int(max_steps))
    optimizer = state.optimizer
    path = f"{work_dir}/variables-{fw.accel.engine()}-{state.global_step}{control}.npz"
    np.savez(path, *[keras.ops.convert_to_numpy(v) for v in est.model.variables],
             *[keras.ops.convert_to_numpy(v) for v in optimizer.variables])
    return {"engine": fw.accel.engine(), "replicas": fw.accel.current().num_replicas,
            "start": start, "step": state.global_step,
            "input_position": state.input_position,
            "iterations": int(keras.ops.convert_to_numpy(optimizer.iterations)),
            "learning_rate": float(keras.ops.convert_to_numpy(optimizer.learning_rate)),
            "variables": path, "latest": state.latest_checkpoint}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])), flush=True)
