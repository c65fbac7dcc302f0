"""The JAX engine's saves of the run format take a snapshot of the state
(`checkpoints.snapshot`) and write it afterwards (`run_format.RunCheckpointer`), in the
background when asynchronous: what each checkpoint holds must be the state of its step,
although the training steps after it donate (free and reuse) the buffers saved. One
process on 8 host devices (`tests._jax_snapshot`) feeds every test.

Every element of the state moves by 1 a step, so what a checkpoint of step k must hold is
known by hand: ``w`` all k, ``b`` all 10 + k, row r of the split array ``s`` 100 r + k.
"""

from __future__ import annotations

import pytest

from tests.conftest import last_json, run_process

pytestmark = pytest.mark.slow

KEEP = 3
SAVED_STEPS = [2, 6, 10, 14, 18]  # a save after every 2 steps, then 2 more steps


def _expected(step: int) -> dict:
    return {"w": [float(step)], "b": [10 + step],
            "s": [100.0 * row + step for row in range(16)], "global_step": step}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("jax_snapshot")
    proc = run_process(["-m", "tests._jax_snapshot", str(root)],
                       {"KERAS_BACKEND": "jax", "FENWICKS_DEVICE": None,
                        "XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
                       timeout=600)
    return last_json(proc.stdout)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_each_checkpoint_holds_its_steps_values_though_later_steps_donate_them(run, mode):
    result = run[mode]
    assert run["devices"] == 8
    assert result["donated"] == [True] * len(SAVED_STEPS)  # the saved buffers were reused
    assert result["steps"] == SAVED_STEPS[-KEEP:]
    for step in SAVED_STEPS[-KEEP:]:
        assert result["saved"][str(step)] == _expected(step), step


def test_an_async_save_returns_before_the_write(run):
    """The write failing 0.2 s into the background thread: `save` returned before it,
    `wait` raised it, and the checkpoint before it is still the last good one."""
    error = run["write_error"]
    assert error["error"] == "CheckpointWriteError"
    assert "No space left on device" in error["message"]
    assert error["returned_secs"] < 0.2
    assert error["last_good"].endswith("/checkpoints/1")
    assert "(It was written in the background" in error["message"]


def test_restore_puts_the_values_back(run):
    """Where they go is the state's own `scatter` (the JAX engine's replicates every
    variable over the mesh); this test's keeps each array's sharding, so the split ``s``
    comes back split."""
    restored = run["restored"]
    assert restored["restored"].endswith("/checkpoints/14")
    assert restored["step"] == 14
    assert restored["w"] == [14.0]
    assert restored["s"] == [100.0 * row + 14 for row in range(16)]
    assert not restored["replicated"]


def test_a_checkpoint_written_before_snapshots_still_restores(run):
    """Orbax's own save of the device arrays (the engine's format until snapshots, in
    ``orbax/<step>``), read by that format's reader, every array back replicated."""
    old = run["old_format"]
    assert old["restored"].endswith("/orbax/3")
    assert (old["step"], old["w"]) == (3, [3.0])
    assert old["s"] == [100.0 * row + 3 for row in range(16)]
    assert old["replicated"]
