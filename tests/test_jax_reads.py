"""The JAX engine's training input read several steps at a time (`TrainBatches`): the
same global batches, in the same order, as one step a read; a finite input's last read
keeps its whole steps only; reads of several steps only for batches of static shape."""

from __future__ import annotations

import pytest

from tests.conftest import run_module_json

REPLICAS, BATCH = 4, 3  # as tests/_jax_reads.py
SIZES = [1, 3, 2, 5, 4, 1]


@pytest.fixture(scope="module")
def seen():
    env = {"KERAS_BACKEND": "jax", "FENWICKS_DEVICE": None,
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    return run_module_json("tests._jax_reads", env=env, timeout=300)


def _expected(num_batches: int | None) -> list[list[list[int]]]:
    """Global batch s holds examples s*12 .. s*12+11 (4 per-replica batches of 3); a
    finite input of `num_batches` per-replica batches has num_batches // 4 steps."""
    per_step = REPLICAS * BATCH
    steps = num_batches // REPLICAS if num_batches else 10**9
    out, step = [], 0
    for size in SIZES:
        taken = range(step, min(step + size, steps))
        out.append([list(range(s * per_step, (s + 1) * per_step)) for s in taken])
        step += len(taken)
    return out


@pytest.mark.parametrize("steps_per_read", [1, 4])
def test_reads_of_several_steps_give_the_same_global_batches(seen, steps_per_read):
    assert seen[f"endless_{steps_per_read}"] == _expected(None)
    # 23 per-replica batches: steps 0..4, the 3 batches over are no step's
    assert seen[f"finite_{steps_per_read}"] == _expected(23)
    assert seen[f"finite_{steps_per_read}_features_shape"] == [REPLICAS * BATCH, 2]


def test_steps_per_read_by_size_and_shape(seen):
    step_bytes = REPLICAS * BATCH * (2 * 4 + 4)  # float32 pairs and int32 labels: 144
    assert seen["steps_per_read"]["static"] == 10  # capped by the loop
    assert seen["steps_per_read"]["one_fits"] == seen["read_bytes"] // step_bytes
    assert seen["steps_per_read"]["dynamic"] == 1
