"""Process helper of tests/test_legacy_work_dirs.py: a work_dir written before the run
format (tests/data/legacy_work_dirs, by Fenwicks at main 5de401d) read on this engine.

    python -m tests._legacy evaluate WORK_DIR          # evaluate, and the step
    python -m tests._legacy train WORK_DIR STEPS [zero-slots]
                                                       # resume, train STEPS more
    python -m tests._legacy warm SOURCE NEW_DIR        # warm-start NEW_DIR from SOURCE

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
        if rest[1:] == ["zero-slots"]:
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
    raise ValueError(f"mode={mode!r}")


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])), flush=True)
