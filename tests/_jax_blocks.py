"""Process helper of tests/test_jax_blocks.py: the JAX engine's training blocks as a TPU
or GPU runs them (several steps in one rolled ``lax.scan``), forced on the CPU, against
the CPU's one-step blocks, on the product's own network. Prints one JSON line.

    python -m tests._jax_blocks WORK_DIR
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import fenwicks as fw
from fenwicks import demo
from fenwicks.train.jax import steps, trainer

STEPS = 13  # a loop of 10 (blocks of 5 when rolled) and a loop of 3 (one block of 3)


def _run(work_dir: str, rolled: bool, lr: float, x: np.ndarray, y: np.ndarray) -> dict:
    steps.UNROLL_ON_CPU = not rolled
    trainer.CPU_BLOCK_STEPS = 5 if rolled else 1
    opt_func = fw.train.sgd_optimizer(lambda step: lr, mom=0.9)
    model_func = fw.train.get_clf_model_func(
        lambda: fw.models.mnist_net(c=8, input_shape=(8, 8, 1), bn=16), opt_func)
    est = fw.train.get_tpu_estimator(10, model_func, work_dir, trn_bs=64, seed=3,
                                     steps_per_loop=10, verbose=False)
    error = None
    try:
        est.train(lambda p: fw.data.numpy_ds(x, y, p["batch_size"], training=True, seed=3,
                                             input_context=p["input_context"]),
                  max_steps=STEPS)
    except Exception as err:  # a non-finite loss: each path must stop alike
        error = type(err).__name__
    out = {"step": est.global_step, "error": error,
           "weights": [np.asarray(v.value).tolist() for v in est.model.variables]}
    est.close()
    return out


def main(work_dir: str) -> dict:
    x, y, _, _ = demo.load_digits()
    return {name: _run(os.path.join(work_dir, name), rolled, lr, x, y)
            for name, rolled, lr in (("one_step", False, 0.05), ("rolled", True, 0.05),
                                     ("one_step_diverging", False, 1e38),
                                     ("rolled_diverging", True, 1e38))}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
