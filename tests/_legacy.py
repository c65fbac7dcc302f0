"""Process helper of tests/test_legacy_work_dirs.py: a work_dir written before the run
format (tests/data/legacy_work_dirs, by Fenwicks at main 5de401d) read on this engine.

    python -m tests._legacy evaluate WORK_DIR          # evaluate, and the step
    python -m tests._legacy train WORK_DIR STEPS       # resume, train STEPS more
    python -m tests._legacy warm SOURCE NEW_DIR        # warm-start NEW_DIR from SOURCE

Each prints one JSON line.
"""

from __future__ import annotations

import json
import sys

import keras

import fenwicks as fw
from tests import _cross_engine


def main(mode: str, path: str, *rest: str) -> dict:
    train_fn, eval_fn, _ = _cross_engine.inputs()
    if mode == "evaluate":
        return {"engine": fw.accel.engine(),
                "eval": _cross_engine.estimator(path).evaluate(eval_fn)}
    if mode == "train":
        est = _cross_engine.estimator(path)
        est.train(train_fn, steps=int(rest[0]))
        state = est.parts.state
        return {"engine": fw.accel.engine(), "step": state.global_step,
                "input_position": state.input_position,
                "latest": state.latest_checkpoint,
                "iterations": int(keras.ops.convert_to_numpy(state.optimizer.iterations)),
                "eval": est.evaluate(eval_fn)}
    if mode == "warm":
        est = _cross_engine.estimator(rest[0], warm_start_from=path)
        before = est.evaluate(eval_fn)
        return {"engine": fw.accel.engine(), "report": est.warm_start_report,
                "eval": before}
    raise ValueError(f"mode={mode!r}")


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])), flush=True)
