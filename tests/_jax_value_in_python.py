"""A layer that uses a tensor's value in Python, on the JAX engine: what `check_tpu_ready`
and `train` say (issue 52; Keras rebuilt JAX's error into ``AttributeError: 'str' object
has no attribute '_error_repr'``). Prints {kind: {"ready": ..., "train": ...}} as JSON.

    KERAS_BACKEND=jax python -m tests._jax_value_in_python WORK_DIR
"""

from __future__ import annotations

import json
import sys

import jax.numpy as jnp
import keras
import numpy as np
from keras import ops

import fenwicks as fw

KINDS = ("if", "numpy", "nonzero", "unique")


class ValueInPython(keras.layers.Layer):
    def __init__(self, kind: str, **kwargs):
        super().__init__(**kwargs)
        self.kind = kind

    def call(self, x):
        if self.kind == "if":
            if ops.mean(x) > 0:  # the line the message must point at
                return x * 2
            return x
        if self.kind == "numpy":
            return x + np.asarray(x).mean()
        if self.kind == "nonzero":
            return x + ops.cast(ops.nonzero(x > 0)[0][0], x.dtype)
        return x + jnp.unique(x)[0]


def _said(call) -> str:
    try:
        call()
    except Exception as err:  # noqa: BLE001  (the type is part of the answer)
        return f"{type(err).__name__}: {err}"
    return "no error"


def main(work_dir: str) -> dict:
    x = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)

    def input_fn(params):
        return fw.data.numpy_ds(x, y, params["batch_size"])

    out = {}
    for kind in KINDS:
        def build(kind=kind):
            return keras.Sequential([keras.Input((4,)), ValueInPython(kind),
                                     keras.layers.Dense(2)])

        est = fw.train.get_tpu_estimator(
            2, fw.train.get_clf_model_func(build, fw.train.sgd_optimizer(0.1)),
            f"{work_dir}/{kind}", trn_bs=32, verbose=False)
        out[kind] = {"ready": _said(lambda est=est: fw.train.check_tpu_ready(est, input_fn)),
                     "train": _said(lambda est=est: est.train(input_fn, steps=2))}
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
