"""The JAX engine's multi-step blocks, the way TPUs and GPUs run them (a rolled
``lax.scan`` of several steps per compiled call), forced on the CPU, where the engine
otherwise runs one-step blocks: the same training, step for step, and the same stop at
a non-finite loss. Without this, no CPU test would run the rolled loop."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import run_module_json

# LLVM optimisation off: XLA compiles the blocks ~2x faster (this module's process: 38 ->
# 28 s of CPU, measured 2026-11-26 under load); their speed does not matter here.
XLA_FLAGS = "--xla_backend_optimization_level=0"
BAD_STEP = 8  # its batch makes the loss NaN: mid-block when rolled (the block 6..10)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    # KERAS_BACKEND=jax picks the JAX engine, on the CPU's 8 host devices (XLA_FLAGS,
    # not FENWICKS_DEVICE=cpu:8): the process forks from conftest's JAX server.
    env = {"KERAS_BACKEND": "jax", "FENWICKS_DEVICE": None,
           "XLA_FLAGS": f"--xla_force_host_platform_device_count=8 {XLA_FLAGS}"}
    return run_module_json("tests._jax_blocks", str(tmp_path_factory.mktemp("blocks")),
                           str(BAD_STEP), env=env, timeout=600)


def test_rolled_blocks_train_as_one_step_blocks_do(runs):
    one, rolled = runs["one_step"], runs["rolled"]
    assert one["error"] is None and rolled["error"] is None
    assert one["step"] == rolled["step"] == 13
    for a, b in zip(one["weights"], rolled["weights"], strict=True):
        # float32 rounding of the same 13 steps compiled two ways; a step skipped,
        # repeated or fed the wrong batch moves weights by ~1e-2
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)


def test_rolled_blocks_stop_where_one_step_blocks_stop(runs):
    """Step 8's batch holds examples labelled outside the classes (a NaN loss, whose
    gradient still reaches the weights through the other examples): both paths count
    steps 1..8, report a NaN for step 8 alone and keep step 8's weights. Rolled, step 8
    is the third of the block 6..10: its steps 9 and 10 run but must not change the
    state, which they would by ~1e-2 (the last line)."""
    normal, one, rolled = runs["one_step"], runs["one_step_diverging"], runs["rolled_diverging"]
    assert (one["step"], one["error"]) == (BAD_STEP, "NonFiniteLossError")
    assert (rolled["step"], rolled["error"]) == (one["step"], one["error"])
    for run in (one, rolled):  # the same batches as the normal run until step 8
        np.testing.assert_allclose(run["losses"][:BAD_STEP - 1],
                                   normal["losses"][:BAD_STEP - 1], rtol=1e-5)
        assert len(run["losses"]) == BAD_STEP and np.isnan(run["losses"][-1])
    for a, b in zip(one["weights"], rolled["weights"], strict=True):
        assert np.all(np.isfinite(a)), "the weights must stay finite: the test needs it"
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5)
    assert max(np.max(np.abs(np.subtract(a, b)))
               for a, b in zip(one["weights"], normal["weights"], strict=True)) > 1e-3
