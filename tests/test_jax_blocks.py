"""The JAX engine's multi-step blocks, the way TPUs and GPUs run them (a rolled
``lax.scan`` of several steps per compiled call), forced on the CPU, where the engine
otherwise runs one-step blocks: the same training, step for step, and the same stop at
a non-finite loss. Without this, no CPU test would run the rolled loop."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT, python_env


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    env = python_env({"KERAS_BACKEND": "jax", "FENWICKS_ENGINE": "jax",
                      "FENWICKS_DEVICE": "cpu:8"})
    done = subprocess.run([sys.executable, "-m", "tests._jax_blocks",
                           str(tmp_path_factory.mktemp("blocks"))],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_rolled_blocks_train_as_one_step_blocks_do(runs):
    one, rolled = runs["one_step"], runs["rolled"]
    assert one["error"] is None and rolled["error"] is None
    assert one["step"] == rolled["step"] == 13
    for a, b in zip(one["weights"], rolled["weights"], strict=True):
        # float32 rounding of the same 13 steps compiled two ways; a step skipped,
        # repeated or fed the wrong batch moves weights by ~1e-2
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


def test_rolled_blocks_stop_where_one_step_blocks_stop(runs):
    one, rolled = runs["one_step_diverging"], runs["rolled_diverging"]
    assert one["step"] < 13, "a learning rate of 1e38 must make the loss non-finite"
    assert (rolled["step"], rolled["error"]) == (one["step"], one["error"])
    for a, b in zip(one["weights"], rolled["weights"], strict=True):
        # the state the last finite step left (huge at this rate): equal to rounding
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-4)
