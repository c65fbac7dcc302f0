"""Process helper of tests/test_jax_blocks.py: the JAX engine's training blocks as a TPU
or GPU runs them (several steps in one rolled ``lax.scan``), forced on the CPU, against
the CPU's one-step blocks, on the product's own network. Prints one JSON line.

    python -m tests._jax_blocks WORK_DIR BAD_STEP

The model_func is tests/test_jax_engine.py's (`tests._jax_engine`). The runs that stop
at a non-finite loss train on the same programs as the others (read from the session's
compilation cache, not compiled again): what makes their loss non-finite is in the
data (labels outside the classes in step BAD_STEP's batch), not in the compiled code.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

import fenwicks as fw
from fenwicks import demo
from fenwicks.train.jax import steps, trainer
from tests import _jax_engine

STEPS = 13  # a loop of 10 (blocks of 5 when rolled) and a loop of 3 (one block of 3)
NUM_CLASSES = 10


def _input_fn(x: np.ndarray, y: np.ndarray, bad_step: int | None):
    """The training input; with `bad_step`, the examples that one replica's share of
    that step's global batch holds are labelled outside the classes (their loss is NaN)
    everywhere in `y`. An epoch (21 steps) holds each example once, so no other of the
    first 13 steps sees them."""
    def input_fn(params):
        labels = y
        if bad_step is not None:
            # The same pipeline over the example indices: which examples that step reads.
            order = fw.data.numpy_ds(x, np.arange(len(x)), params["batch_size"],
                                     training=True, seed=_jax_engine.SEED,
                                     input_context=params["input_context"])
            skip = (bad_step - 1) * params["num_replicas"]
            _, rows = next(iter(order.skip(skip).take(1)))
            labels = y.copy()
            labels[rows.numpy()] = NUM_CLASSES
        return fw.data.numpy_ds(x, labels, params["batch_size"], training=True,
                                seed=_jax_engine.SEED, input_context=params["input_context"])
    return input_fn


def _run(work_dir: str, rolled: bool, bad_step: int | None, x: np.ndarray,
         y: np.ndarray) -> dict:
    steps.UNROLL_ON_CPU = not rolled
    trainer.CPU_BLOCK_STEPS = 5 if rolled else 1
    est = fw.train.get_tpu_estimator(
        _jax_engine.STEPS_PER_EPOCH, _jax_engine.model_func(), work_dir,
        trn_bs=_jax_engine.BATCH, seed=_jax_engine.SEED, steps_per_loop=10, verbose=False)
    error = None
    try:
        est.train(_input_fn(x, y, bad_step), max_steps=STEPS)
    except Exception as err:  # a non-finite loss: each path must stop alike
        error = type(err).__name__
    out = {"step": est.global_step, "error": error, "losses": est.history.losses,
           "weights": [np.asarray(v.value).tolist() for v in est.model.variables]}
    est.close()
    return out


def main(work_dir: str, bad_step: int) -> dict:
    x, y, _, _ = demo.load_digits()
    return {name: _run(os.path.join(work_dir, name), rolled, bad_step, x, y)
            for name, rolled, bad_step in (
                ("one_step", False, None), ("rolled", True, None),
                ("one_step_diverging", False, bad_step),
                ("rolled_diverging", True, bad_step))}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))
