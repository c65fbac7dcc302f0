"""Process helper of tests/test_jax_engine.py: one training run of the product's own
tutorial-1 network (`fw.models.mnist_net`, narrow) on scikit-learn's digits, on whichever
engine the environment selects (``KERAS_BACKEND=jax`` or not), printing what it measured
as one JSON line.

    python -m tests._jax_engine WORK_DIR MAX_STEPS [VAL_BS ...] [--kill-during-save]
        [--export]
    python -m tests._jax_engine WORK_DIR --precisions   # only the 16-bit runs

The same code trains on both engines: the cross-engine test runs it twice.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import keras
import numpy as np

import fenwicks as fw
from fenwicks import demo

STEPS_PER_EPOCH = 21  # 1,347 training digits // 64
BATCH = 64
SEED = 3
BN_MODE = 16  # ghost BatchNorm: fixed groups of 16 examples


def model_func():
    lr_func = fw.train.exp_decay_lr(init_lr=3e-3, decay_steps=63, base_lr=2e-5)
    opt_func = fw.train.adam_optimizer(lr_func, wd=1e-4, exclude_from_wd="bn_and_bias")
    # BN_MODE: the same statistics on 1 and 8 devices and on both engines (per-replica
    # statistics differ by nature between replica counts).
    return fw.train.get_clf_model_func(
        lambda: fw.models.mnist_net(c=8, input_shape=(8, 8, 1), bn=BN_MODE), opt_func)


def _kill_during_next_write(orbax_dir: str, after: int) -> None:
    """SIGKILLs this process as soon as orbax's temporary directory of the `after`-th
    save appears: the write is then in progress (orbax renames it when complete)."""
    def watch() -> None:
        seen: set[str] = set()
        while True:
            names = os.listdir(orbax_dir) if os.path.isdir(orbax_dir) else []
            seen.update(n for n in names if "tmp" in n)
            if len(seen) >= after:
                print(json.dumps({"killed_during": sorted(seen)[-1]}), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.0005)
    threading.Thread(target=watch, daemon=True).start()


def _export_difference(est, x_test: np.ndarray, probs: np.ndarray) -> float:
    """The exported SavedModel's predictions against `predict`'s: largest difference."""
    import tensorflow as tf

    loaded = tf.saved_model.load(est.export_saved_model(f"{est.config.work_dir}/export"))
    served = loaded.serve(x_test[:37])["predictions"].numpy()
    return float(np.max(np.abs(served - probs[:37])))


def _precisions(work_dir: str, x_train: np.ndarray, y_train: np.ndarray) -> dict:
    """Three steps under each 16-bit policy: the compute dtype, the optimizer, the losses."""
    out = {}
    for precision in ("bfloat16", "float16"):
        est = fw.train.get_tpu_estimator(
            STEPS_PER_EPOCH, model_func(), f"{work_dir}/{precision}", trn_bs=BATCH,
            seed=SEED, verbose=False, precision=precision)
        est.train(lambda p: fw.data.numpy_ds(x_train, y_train, p["batch_size"], seed=SEED),
                  steps=3)
        conv = est.model.layers[0]
        out[precision] = {"optimizer": type(est.optimizer).__name__,
                          "compute_dtype": conv.compute_dtype,
                          "variable_dtype": conv.variable_dtype,
                          "losses": est.history.losses}
        est.close()
    return out


def main(work_dir: str, max_steps: int, val_sizes: list[int], kill: bool) -> dict:
    x_train, y_train, x_test, y_test = demo.load_digits()
    est = fw.train.get_tpu_estimator(
        STEPS_PER_EPOCH, model_func(), work_dir, trn_bs=BATCH, seed=SEED, verbose=False,
        save_every_loops=1, keep_checkpoints=2)
    if kill:
        _kill_during_next_write(f"{work_dir}/checkpoints", after=2)
    began = time.perf_counter()
    est.train(lambda p: fw.data.numpy_ds(x_train, y_train, p["batch_size"], training=True,
                                         seed=SEED, input_context=p["input_context"]),
              max_steps=max_steps)
    seconds = time.perf_counter() - began
    evals, out, probs = {}, {}, None
    for val_bs in val_sizes:
        est_eval = fw.train.get_tpu_estimator(STEPS_PER_EPOCH, model_func(), work_dir,
                                              trn_bs=BATCH, val_bs=val_bs, verbose=False)
        evals[val_bs] = est_eval.evaluate(lambda p: fw.data.numpy_ds(
            x_test, y_test, p["batch_size"], training=False))
        probs = est_eval.predict(lambda p: fw.data.numpy_ds(
            x_test, None, p["batch_size"], training=False))
        evals[val_bs]["predicted_rows"] = int(len(probs))
        evals[val_bs]["recount"] = float(np.mean(np.argmax(probs, 1) == y_test))
        est_eval.close()
    if "--export" in sys.argv:
        out["export_max_diff"] = _export_difference(est, x_test, probs)
    weights = [np.asarray(v.value if hasattr(v, "value") else v) for v in est.model.variables]
    np.savez(f"{work_dir}/weights-{est.global_step}.npz", *weights)
    est.close()
    return {**out, "engine": keras.backend.backend(), "replicas": est.num_replicas,
            "start_step": est.history.steps[0] - 1, "global_step": est.global_step,
            "losses": est.history.losses, "steps": est.history.steps,
            "evals": evals, "train_seconds": seconds, "num_test": len(y_test)}


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if "--precisions" in sys.argv:
        x_train, y_train, _, _ = demo.load_digits()
        result = {"precisions": _precisions(args[0], x_train, y_train)}
    else:
        result = main(args[0], int(args[1]), [int(a) for a in args[2:]],
                      "--kill-during-save" in sys.argv)
    print(json.dumps(result))
