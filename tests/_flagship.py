"""The flagship models, narrow, on scikit-learn's digits: the exactness properties' subjects.

`tests/test_flagship.py` runs these in fresh processes (replica counts are fixed when
TensorFlow starts, and resume must cross a real process boundary):

    python -m tests._flagship losses WORK_ROOT [MODES [MODELS]]  # per-step losses,
                                                          # each BN mode (and model)
    python -m tests._flagship resume WORK_ROOT STEPS      # STEPS more steps on each model
                                                          # (per-replica BN: losses' too)
    python -m tests._flagship exact WORK_ROOT 8,56,1000   # evaluate/predict per val_bs
                                                          # (of losses' replica-BN model)

Several commands share one process (TensorFlow starts once), joined by ``+``; the
output is then the list of their results, in order, e.g.

    python -m tests._flagship losses ROOT replica + exact ROOT 8,56,1000
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
from sklearn.datasets import load_digits

import fenwicks as fw
from fenwicks.train import run_format

MODELS = ("mnist_net", "resnet9")
NUM_TRAIN = 1024        # the other 773 digits are the evaluation set (773 is prime)
GLOBAL_BATCH = 32       # 4 per replica on 8 replicas
GHOST = 4               # ghost group = the per-replica batch on 8 replicas
SEED = 3
# A small learning rate and 10 steps on purpose: these narrow nets (c=4) with BatchNorm
# over 4-example groups are chaotic at lr 0.05 (a 1e-7 difference in the order of a
# gradient sum grew 35x per step), and the replica test is about the arithmetic being the
# same, not about how fast chaos amplifies rounding (at lr 0.01, resnet9 with ghost BN
# drifts by 3e-5 at step 9 and 1e-3 at step 12).
LEARNING_RATE = 0.01


def build(name: str, bn: str | int = "replica") -> Any:
    if name == "mnist_net":
        return fw.models.mnist_net(c=4, input_shape=(8, 8, 1), bn=bn)
    return fw.models.resnet9(c=4, input_shape=(8, 8, 3), bn=bn)


def digits(name: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    x = (x.reshape(-1, 8, 8, 1) / 16).astype(np.float32)
    if name == "resnet9":  # colour images: the digit in all three channels
        x = np.repeat(x, 3, axis=-1)
    return x, y.astype(np.int32)


def estimator(name: str, work_dir: str, bn: str | int = "replica", **kwargs: Any) -> Any:
    opt_func = fw.train.sgd_optimizer(LEARNING_RATE, mom=0.9, wd=5e-4)
    model_func = fw.train.get_clf_model_func(lambda: build(name, bn), opt_func)
    kwargs = {"trn_bs": GLOBAL_BATCH, "seed": SEED, "steps_per_loop": 7, "verbose": False,
              **kwargs}
    return fw.train.get_tpu_estimator(NUM_TRAIN // GLOBAL_BATCH, model_func, work_dir,
                                      **kwargs)


def train_input(x: np.ndarray, y: np.ndarray) -> Any:
    return lambda params: fw.data.numpy_ds(x[:NUM_TRAIN], y[:NUM_TRAIN],
                                           params["batch_size"], seed=SEED)


def eval_input(x: np.ndarray, y: np.ndarray) -> Any:
    return lambda params: fw.data.numpy_ds(x[NUM_TRAIN:], y[NUM_TRAIN:],
                                           params["batch_size"], training=False)


def losses(work_root: str, modes: str = "replica,sync,4",
           models: str = ",".join(MODELS)) -> dict[str, list[float]]:
    """10 steps' losses for each model and BatchNorm mode (both comma-separated)."""
    out = {}
    for name in models.split(","):
        x, y = digits(name)
        for bn in (int(m) if m.isdigit() else m for m in modes.split(",")):
            est = estimator(name, os.path.join(work_root, f"{name}-{bn}"), bn=bn)
            est.train(train_input(x, y), steps=10)
            out[f"{name}/{bn}"] = est.history.losses
    return out


def resume(work_root: str, steps: str) -> dict[str, Any]:
    """`steps` more steps on each model's per-replica-BN work_dir under `work_root`: the
    one `losses` trained there (10 steps) is resumed, or a new one started."""
    out = {}
    for name in MODELS:
        x, y = digits(name)
        est = estimator(name, os.path.join(work_root, f"{name}-replica"))
        est.train(train_input(x, y), steps=int(steps))
        out[name] = {"step": est.global_step, "eval": est.evaluate(eval_input(x, y)),
                     "variables": [np.asarray(v).tolist() for v in est.model.variables]}
    return out


def exact(work_root: str, batch_sizes: str) -> dict[str, Any]:
    """Per val_bs, a new estimator evaluates and predicts with the 10-step per-replica-BN
    model of each flagship: the one `losses` trained under `work_root` (``losses ROOT
    replica + exact ROOT ...`` builds each model once), trained here if absent.

    The reference is the restored Keras model called eagerly on all evaluation digits
    at once: no Fenwicks loop, no padding, no masking, no distribution.
    """
    out = {}
    for name in MODELS:
        x, y = digits(name)
        work_dir = os.path.join(work_root, f"{name}-replica")
        if run_format.latest(work_dir) is None:
            estimator(name, work_dir).train(train_input(x, y), steps=10)
        runs = {}
        for batch_size in (int(b) for b in batch_sizes.split(",")):
            est = estimator(name, work_dir, val_bs=batch_size, pred_bs=batch_size)
            runs[batch_size] = {"eval": est.evaluate(eval_input(x, y)),
                                "probs": est.predict(eval_input(x, y)).tolist()}
        assert est.global_step == 10, (work_dir, est.global_step)
        logits = np.asarray(est.model(x[NUM_TRAIN:], training=False), np.float64)
        out[name] = {"runs": runs, "logits": logits.tolist()}
    return out


COMMANDS = {"losses": losses, "resume": resume, "exact": exact}


def main(argv: list[str]) -> Any:
    """One command's result, or the list of results of commands joined by ``+``."""
    if "+" not in argv:
        return COMMANDS[argv[0]](*argv[1:])
    out, command = [], []
    for arg in [*argv, "+"]:
        if arg != "+":
            command.append(arg)
            continue
        out.append(COMMANDS[command[0]](*command[1:]))
        command = []
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
