"""Process helper of tests/test_legacy_work_dirs.py: a work_dir written before the run
format (tests/data/legacy_work_dirs, by Fenwicks at main 5de401d) read on this engine.

    python -m tests._legacy evaluate WORK_DIR          # evaluate, and the step
    python -m tests._legacy train WORK_DIR STEPS [zero-slots]
                                                       # resume, train STEPS more
    python -m tests._legacy warm SOURCE NEW_DIR        # warm-start NEW_DIR from SOURCE
    python -m tests._legacy refusals WORK_DIR NEWER DAMAGED
                          # another optimizer, batch size or model, a damaged newest step
                          # (NEWER: fall back to the older) and a damaged only step

Each prints one JSON line. ``train`` also saves the model's and the optimizer's variables
at the end to ``WORK_DIR/variables-<engine>.npz``; ``zero-slots`` zeroes the optimizer's
slots after the restore (a control: a resume that lost them).
"""

from __future__ import annotations

import json
import sys

import keras
import numpy as np

import fenwicks as fw
from tests import _cross_engine


def main(mode: str, path: str, *rest: str) -> dict:
    train_fn, eval_fn, _ = _cross_engine.inputs()
    if mode == "evaluate":
        return {"engine": fw.accel.engine(),
                "eval": _cross_engine.estimator(path).evaluate(eval_fn)}
    if mode == "train":
        est = _cross_engine.estimator(path)
        state = est.parts.state
        if rest[1:] == ("zero-slots",):
            est.evaluate(eval_fn)  # builds the model, restoring work_dir
            for variable in state.optimizer.variables:
                if "iteration" not in variable.path:
                    variable.assign(np.zeros(variable.shape, variable.dtype))
        est.train(train_fn, steps=int(rest[0]))
        variables = f"{path}/variables-{fw.accel.engine()}.npz"
        np.savez(variables, *[keras.ops.convert_to_numpy(v) for v in
                              [*est.model.variables, *state.optimizer.variables]])
        return {"engine": fw.accel.engine(), "step": state.global_step,
                "input_position": state.input_position,
                "latest": state.latest_checkpoint,
                "iterations": int(keras.ops.convert_to_numpy(state.optimizer.iterations)),
                "variables": variables, "eval": est.evaluate(eval_fn)}
    if mode == "warm":
        est = _cross_engine.estimator(rest[0], warm_start_from=path)
        before = est.evaluate(eval_fn)
        return {"engine": fw.accel.engine(), "report": est.warm_start_report,
                "eval": before}
    if mode == "refusals":
        return refusals(path, *rest, train_fn=train_fn, eval_fn=eval_fn)
    raise ValueError(f"mode={mode!r}")


def _error(call) -> str | None:
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the test reads which, and its text
        return f"{type(err).__name__}: {err}"
    return None


def refusals(work_dir: str, newer: str, damaged: str, *, train_fn, eval_fn) -> dict:
    """What a work_dir of the previous format gives when it cannot be continued as is."""
    sgd = fw.train.get_clf_model_func(
        lambda: fw.models.mnist_net(c=8, input_shape=(8, 8, 1), bn=16),
        # AdamW wrote it: other optimizer variables (a schedule: no learning-rate variable)
        fw.train.sgd_optimizer(fw.train.exp_decay_lr(init_lr=3e-3, decay_steps=63),
                               mom=0.9))
    other = fw.train.get_tpu_estimator(_cross_engine.STEPS_PER_EPOCH, sgd, work_dir,
                                       trn_bs=_cross_engine.BATCH, val_bs=56,
                                       seed=_cross_engine.SEED, verbose=False)
    out = {"engine": fw.accel.engine(),
           "other_optimizer": {"eval": other.evaluate(eval_fn),
                               "train_error": _error(lambda: other.train(train_fn,
                                                                        steps=1))}}
    other.close()
    halved = fw.train.get_tpu_estimator(_cross_engine.STEPS_PER_EPOCH,
                                        _cross_engine.model_func(), work_dir,
                                        trn_bs=_cross_engine.BATCH // 2, val_bs=56,
                                        seed=_cross_engine.SEED, verbose=False)
    out["other_batch_size"] = _error(lambda: halved.train(train_fn, steps=1))
    halved.close()
    out["other_model"] = _error(
        lambda: _cross_engine.estimator(work_dir, width=16).train(train_fn, steps=1))
    fell_back = _cross_engine.estimator(newer)
    out["newer"] = {"eval": fell_back.evaluate(eval_fn)}
    fell_back.train(train_fn, steps=1)
    out["newer"]["step"] = fell_back.global_step
    out["newer"]["latest"] = fell_back.parts.state.latest_checkpoint
    fell_back.close()
    out["damaged"] = {
        "evaluate": _error(lambda: _cross_engine.estimator(damaged).evaluate(eval_fn)),
        "train": _error(lambda: _cross_engine.estimator(damaged).train(train_fn, steps=1))}
    return out


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])), flush=True)
