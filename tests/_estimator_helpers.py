"""Tiny data, models and input functions shared by the estimator tests and their
subprocesses (multi-replica runs must start a fresh interpreter, see conftest.py).

    python -m tests._estimator_helpers replicas WORK_ROOT [BAD_ROOT]  # under cpu:2 / cpu:8
    python -m tests._estimator_helpers resume WORK_DIR                # 40 steps, resumed
"""

from __future__ import annotations

import json
import os
import sys
import threading
import weakref
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import fenwicks as fw

NUM_FEATURES, NUM_CLASSES = 6, 3


def make_data(n: int = 1001, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Linearly separable-ish 3-class data, float32 features and int32 labels."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, NUM_FEATURES)).astype(np.float32)
    w = rng.normal(size=(NUM_FEATURES, NUM_CLASSES))
    y = np.argmax(x @ w + 0.5 * rng.normal(size=(n, NUM_CLASSES)), axis=1).astype(np.int32)
    return x, y


def train_input(x: np.ndarray, y: np.ndarray, shuffle_seed: int = 5):
    """Shuffle examples, then batch per replica.

    Why this gives every replica count the same global batches: with one pipeline
    feeding R replicas, step s hands replica r the pipeline's batch s*R + r. Batching
    per replica (B/R) after a shuffle of *examples* therefore makes step s cover
    examples [s*B, (s+1)*B) of the shuffled stream, exactly the single-replica batch.
    """
    def input_fn(params):
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = ds.shuffle(len(x), seed=shuffle_seed, reshuffle_each_iteration=True).repeat()
        return ds.batch(params["batch_size"], drop_remainder=True)
    return input_fn


def eval_input(x: np.ndarray, y: np.ndarray):
    def input_fn(params):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(params["batch_size"])
    return input_fn


def build_mlp(bn: int | None = None, width: int = 16, dropout: float = 0.0):
    layers = [keras.Input((NUM_FEATURES,)), keras.layers.Dense(width)]
    if bn is not None:
        layers.append(fw.layers.BatchNorm(mode=bn))
    layers.append(keras.layers.ReLU())
    if dropout:
        layers.append(keras.layers.Dropout(dropout, seed=11))
    layers.append(keras.layers.Dense(NUM_CLASSES))
    return keras.Sequential(layers)


def model_func(reduction: str = "mean", bn: int | None = None, width: int = 16,
               dropout: float = 0.0, lr: float = 0.1, wd: float = 5e-4):
    """fw.train's SGD (Nesterov, L2 decay added after the gradient all-reduce)."""
    # 'sum' adds up 32 examples where 'mean' averages them, so its gradient is 32 times
    # larger: lr / 32 and wd * 32 give the same updates.
    scale = 1 if reduction == "mean" else 32
    opt_func = fw.train.sgd_optimizer(lr / scale, mom=0.9, wd=wd * scale)
    return fw.train.get_clf_model_func(lambda: build_mlp(bn, width, dropout), opt_func,
                                       reduction=reduction)


def invariance_losses(work_root: str, steps: int = 30) -> dict[str, list[float]]:
    """Per-step losses of 30 steps at global batch 32, for each reduction and ghost BN."""
    x, y = make_data()
    out = {}
    for name, kwargs in {"mean": {}, "sum": {"reduction": "sum"},
                         "bn": {"bn": 4}}.items():
        est = fw.train.get_tpu_estimator(10, model_func(**kwargs), f"{work_root}/{name}",
                                         trn_bs=32, seed=3, verbose=False)
        est.train(train_input(x, y), steps=steps)
        out[name] = est.history.losses
    return out


def exact_eval(work_dir: str, batch_sizes: list[int]) -> dict:
    """Trains briefly, then evaluates and predicts with each val_bs on a new estimator."""
    x, y = make_data()
    est = fw.train.get_tpu_estimator(10, model_func(), work_dir, trn_bs=32, seed=1,
                                     verbose=False)
    est.train(train_input(x, y), steps=20)
    out = {}
    for batch_size in batch_sizes:
        est = fw.train.get_tpu_estimator(10, model_func(), work_dir, trn_bs=32,
                                         val_bs=batch_size, pred_bs=batch_size,
                                         verbose=False)
        result = est.evaluate(eval_input(x, y))
        probs = est.predict(eval_input(x, y))
        out[batch_size] = {"result": result, "probs": probs.tolist()}
    out["weights"] = [w.tolist() for w in est.model.get_weights()]
    return out


def numpy_forward(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """Softmax probabilities of build_mlp() (no BN) computed in float64."""
    w1, b1, w2, b2 = (np.asarray(w, np.float64) for w in weights)
    logits = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    logits -= logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    return exp / exp.sum(axis=1, keepdims=True)


# On 8 replicas a global batch divides by 8. test_flagship proves val_bs 8 and 1000 on 8
# replicas on the product's own models; this stand-in adds a partial last batch of 7 per
# replica (56) and a batch eight times the data (most replicas get nothing but padding).
VAL_BATCHES_8 = [56, 4096]


def handle_deaths(iterator: Any) -> tuple[int, list[str]]:
    """How many resource handles `iterator` holds, and the list that gets the name of
    the thread each of them is destroyed on (this keeps no reference to them)."""
    from fenwicks import _tf_internals

    died: list[str] = []
    handles = _tf_internals.iterator_resources([iterator])
    for handle in handles:
        weakref.finalize(handle, lambda: died.append(threading.current_thread().name))
    return len(handles), died


def join_discards(timeout: float = 300) -> None:
    """Joins `fenwicks.train.inputs.discard`'s threads, including those they start."""
    from fenwicks.train import inputs

    while running := [t for t in threading.enumerate() if t.name == inputs.DISCARD_THREAD]:
        for thread in running:
            thread.join(timeout)


def closed_iterator_dies_on(work_dir: str) -> dict[str, Any]:
    """The training iterator's resource handles after `close()`: how many, and the
    threads they were destroyed on (the discard threads joined)."""
    x, y = make_data()
    est = fw.train.get_tpu_estimator(10, model_func(), work_dir, trn_bs=32, verbose=False)
    input_fn = train_input(x, y)
    est.train(input_fn, steps=5)
    count, died = handle_deaths(est.parts.inputs.live_train_iterator(input_fn))
    est.close()
    join_discards()
    return {"handles": count, "died_on": sorted(set(died)), "died": len(died)}


def replicas(work_root: str, bad_root: str | None = None) -> dict:
    """Invariance losses; on 8 replicas also exact evaluation, batch-size errors and
    where a closed estimator's training iterator dies."""
    out: dict = {"invariance": invariance_losses(os.path.join(work_root, "inv"))}
    if bad_root is not None:
        out["exact"] = exact_eval(os.path.join(work_root, "exact"), VAL_BATCHES_8)
        out["closed_iterator_dies_on"] = closed_iterator_dies_on(
            os.path.join(work_root, "closed"))
        errors = []
        for batch_size in (100, 7):
            try:
                fw.train.get_tpu_estimator(10, model_func(), bad_root, trn_bs=batch_size)
            except ValueError as err:
                errors.append(str(err))
        out["errors"] = errors
    return out


def _files(work_dir: str) -> list[str]:
    """The work_dir's files and its checkpoint steps (``checkpoints/<step>``)."""
    steps = os.path.join(work_dir, "checkpoints")
    return sorted(os.listdir(work_dir)) + sorted(
        f"checkpoints/{name}" for name in os.listdir(steps) if os.path.isdir(steps))


def resume(work_dir: str) -> dict:
    """Resumes a run to step 40 (then asks for 40 again: nothing must happen)."""
    x, y = make_data()
    est = fw.train.get_tpu_estimator(10, model_func(dropout=0.25), work_dir, trn_bs=32,
                                     seed=1, steps_per_loop=7, verbose=False)
    est.train(train_input(x, y), max_steps=40)
    files = _files(work_dir)
    est.train(train_input(x, y), max_steps=40)  # already there: nothing happens
    return {"step": est.global_step, "files": files, "files_after": _files(work_dir),
            "weights": [w.tolist() for w in est.model.get_weights()]}


if __name__ == "__main__":
    commands = {"replicas": replicas, "resume": resume}
    print(json.dumps(commands[sys.argv[1]](*sys.argv[2:])))
