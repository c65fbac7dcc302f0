"""Process helper of tests/test_cross_engine.py: one engine's work_dir read on the other.

    python -m tests._cross_engine train WORK_DIR          # trains, on either engine
    python -m tests._cross_engine read THEIRS NEW_DIR      # reads THEIRS, warm-starts NEW_DIR

``train`` trains the product's tutorial-1 network (`fw.models.mnist_net`, narrow) on
scikit-learn's digits for one epoch, then evaluates and predicts; ``read``, run on the
other engine, evaluates and predicts from that work_dir, tries a different model there
(refused), follows it as its checkpoints go and come back (on the TensorFlow engine),
warm-starts NEW_DIR from it, evaluates that before training (the same weights), trains
one epoch, evaluates and predicts again, and last continues THEIRS' run by one step.
Each prints one JSON line; predictions go to ``<dir>/probs-<engine>.npy``.
"""

from __future__ import annotations

import json
import os
import sys

import keras
import numpy as np

import fenwicks as fw
from fenwicks import demo

STEPS_PER_EPOCH = 21  # 1,347 training digits // 64
BATCH = 64
SEED = 5


def model_func(width: int = 8):
    lr_func = fw.train.exp_decay_lr(init_lr=3e-3, decay_steps=63, base_lr=2e-5)
    opt_func = fw.train.adam_optimizer(lr_func, wd=1e-4, exclude_from_wd="bn_and_bias")
    # Ghost BatchNorm (fixed groups of 16): the same statistics on 1 and 8 devices.
    return fw.train.get_clf_model_func(
        lambda: fw.models.mnist_net(c=width, input_shape=(8, 8, 1), bn=16), opt_func)


def estimator(work_dir: str, width: int = 8, **kwargs):
    return fw.train.get_tpu_estimator(STEPS_PER_EPOCH, model_func(width), work_dir,
                                      trn_bs=BATCH, val_bs=56, pred_bs=56, seed=SEED,
                                      verbose=False, **kwargs)


def inputs():
    x_train, y_train, x_test, y_test = demo.load_digits()

    def train_fn(p):
        return fw.data.numpy_ds(x_train, y_train, p["batch_size"], training=True, seed=SEED,
                                input_context=p["input_context"])

    def eval_fn(p):
        return fw.data.numpy_ds(x_test, y_test, p["batch_size"], training=False)

    def pred_fn(p):
        return fw.data.numpy_ds(x_test, None, p["batch_size"], training=False)

    return train_fn, eval_fn, pred_fn


def _checkpoint_files(work_dir: str) -> list[str]:
    """Every file of every checkpoint in `work_dir`, the run format's and those before."""
    found = []
    for root, _, files in os.walk(work_dir):
        if root == work_dir or "/orbax" in root or "/checkpoints" in root:
            found += [os.path.relpath(os.path.join(root, f), work_dir) for f in files
                      if f.startswith(("ckpt-", "checkpoint")) or root != work_dir]
    return sorted(found)


def _evaluate_and_predict(est, eval_fn, pred_fn, work_dir: str) -> dict:
    result = est.evaluate(eval_fn)
    probs = est.predict(pred_fn)
    np.save(f"{work_dir}/probs-{keras.backend.backend()}.npy", np.asarray(probs))
    return {"eval": result, "rows": len(probs)}


def train(work_dir: str) -> dict:
    train_fn, eval_fn, pred_fn = inputs()
    est = estimator(work_dir)
    est.train(train_fn, steps=STEPS_PER_EPOCH)
    out = _evaluate_and_predict(est, eval_fn, pred_fn, work_dir)
    est.close()
    return out


def _error(call) -> str | None:
    try:
        call()
    except ValueError as err:
        return f"{type(err).__name__}: {err}"
    return None


def _follow(est, work_dir: str, eval_fn) -> list[int]:
    """The global step `evaluate` reports as the other engine's checkpoints of
    `work_dir` go away (a cleaned work_dir) and come back (another run's)."""
    os.rename(f"{work_dir}/checkpoints", f"{work_dir}-checkpoints")
    steps = [est.evaluate(eval_fn)["global_step"]]
    os.rename(f"{work_dir}-checkpoints", f"{work_dir}/checkpoints")
    return [*steps, est.evaluate(eval_fn)["global_step"]]


def read(theirs: str, new_dir: str) -> dict:
    train_fn, eval_fn, pred_fn = inputs()
    # A model built first: every name of the estimators' models gets a _<n> suffix that
    # the process which trained `theirs` did not give it.
    fw.models.mnist_net(c=8, input_shape=(8, 8, 1), bn=16)
    files_before = _checkpoint_files(theirs)
    est = estimator(theirs)
    out = {"read": _evaluate_and_predict(est, eval_fn, pred_fn, theirs),
           "paths": [v.path for v in est.model.variables[:2]]}
    if keras.backend.backend() == "tensorflow":
        out["followed_steps"] = _follow(est, theirs, eval_fn)
    est.close()
    out["other_model"] = _error(lambda: estimator(theirs, width=16).evaluate(eval_fn))
    out["files_kept"] = _checkpoint_files(theirs) == files_before
    warm = estimator(new_dir, warm_start_from=theirs)
    out["warm_before_training"] = warm.evaluate(eval_fn)
    out["warm_report"] = warm.warm_start_report
    warm.train(train_fn, steps=STEPS_PER_EPOCH)
    out["warm"] = _evaluate_and_predict(warm, eval_fn, pred_fn, new_dir)
    out["warm_files"] = _checkpoint_files(new_dir)
    warm.close()
    # Last, the run itself continues here: one more step, on this engine.
    again = estimator(theirs)
    out["train_error"] = _error(lambda: again.train(train_fn, steps=1))
    out["continued"] = {"step": again.global_step,
                        "input_position": again.parts.state.input_position,
                        "latest": again.parts.state.latest_checkpoint}
    again.close()
    out["engine"] = keras.backend.backend()
    return out


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    if mode == "train":
        result = train(args[0])
    else:
        result = read(args[0], args[1])
    print(json.dumps(result))
