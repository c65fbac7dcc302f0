"""Issue 50, item 5: each input_fn's ``params['batch_size']`` follows
``per_host_input_for_training`` as TPUEstimator's did (tests/_tf1_batch_sizes.py), on 1
and 8 replicas (one host); training still steps on the whole global batch.

TPUEstimator's rule (``_TPUContext.batch_size_for_input_fn``), written out as a table:
the global batch when the input is broadcast (BROADCAST, SLICED evaluation) or it ran on
the CPU (``use_tpu=False``); per replica for PER_HOST_V2 and for PER_SHARD_V1 in training;
per host otherwise (PER_HOST_V1, the default, True).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests import _tf1_batch_sizes as sizes
from tests.conftest import run_module_json

# placement -> replicas -> (train, eval, predict); global batches 64, 16, 16, one host.
EXPECTED = {
    "true": {1: (64, 16, 16), 8: (64, 16, 16)},
    "per_host_v1": {1: (64, 16, 16), 8: (64, 16, 16)},
    "false": {1: (64, 16, 16), 8: (8, 16, 16)},
    "per_shard_v1": {1: (64, 16, 16), 8: (8, 16, 16)},
    "per_host_v2": {1: (64, 16, 16), 8: (8, 2, 2)},
    "broadcast": {1: (64, 16, 16), 8: None},  # refused: a whole copy per replica
    "v2_sliced_eval": {1: (64, 16, 16), 8: (8, 16, 16)},
    "v2_use_tpu_false": {1: (64, 16, 16), 8: (64, 16, 16)},
}


@pytest.fixture(scope="module", params=[1, 8], ids=["1_replica", "8_replicas"])
def ran(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"sizes{request.param}")
    out = run_module_json("tests._tf1_batch_sizes", str(root),
                          env={"FENWICKS_DEVICE": f"cpu:{request.param}"}, timeout=1200)
    assert out["replicas"] == request.param
    return out


@pytest.mark.parametrize("placement", list(sizes.PLACEMENTS))
def test_batch_sizes_follow_tpuestimators_rule(ran, placement):
    expected = EXPECTED[placement][ran["replicas"]]
    result = ran[placement]
    if expected is None:
        assert result["error"].startswith(
            "per_host_input_for_training=BROADCAST gives each of the 8 replicas a whole "
            "copy of every batch")
        assert "use InputPipelineConfig.PER_HOST_V2" in result["error"]
        return
    assert "error" not in result, result
    assert (result["seen"]["train"], result["seen"]["eval"], result["seen"]["predict"]) == \
        ([expected[0]], [expected[1]], [expected[2]])
    # One step of gradient descent on the global batch of 64, from weights of ones.
    x, y = sizes.data()
    w = np.ones((3, 1))
    w = w - 0.1 * 2 / 64 * x.T @ (x @ w - y)
    np.testing.assert_allclose(result["predictions"], (x[:32] @ w).ravel(), rtol=1e-5,
                               atol=1e-6)
    assert result["evaluated"] == 32


def test_a_placement_tpuestimator_did_not_have_is_refused():
    with pytest.raises(ValueError, match="per_host_input_for_training=7 must be True, False"):
        sizes.fw.train.TPUConfig(per_host_input_for_training=7)
    with pytest.raises(ValueError, match="eval_training_input_configuration=3 must be"):
        sizes.fw.train.TPUConfig(eval_training_input_configuration=3)
