"""The engine contract: every public feature of the estimator runs on both engines, with
8 replicas each (``FENWICKS_DEVICE=cpu:8`` for TensorFlow, 8 JAX host devices), and gives
the same result, or the same one-sentence refusal. A feature missing here does not exist.

The model starts from the same NumPy-drawn weights on both engines (`tests._contract`), so
their numbers must agree to float rounding and the engines' kernels. The features:
train, evaluate and predict (exact on a partial last batch), resume in a new process
after asynchronous saves, export, Keras callbacks, TensorBoard scalars, the LR finder,
`check_input`, `profile_steps`, `check_tpu_ready` (a good model and a data-dependent
shape), bfloat16, ``gs://`` against the storage emulator, tf.data service input, and the
TPUEstimator front door with a TensorFlow 1 ``model_fn``.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

from tests import _contract
from tests.conftest import run_module_json
from tests.test_data_service import cluster, records  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("engine_contract")]

# TensorFlow is the engine Fenwicks chooses by itself here (no KERAS_BACKEND, not a TPU
# host): its processes then fork from tests._zygote, which imported Fenwicks so (~6 s of
# CPU saved per process; a FENWICKS_ENGINE=tf set here made each a new interpreter). Each
# process reports its engine, and the tests check it.
ENGINES = {
    "tf": {"KERAS_BACKEND": None, "FENWICKS_ENGINE": None, "FENWICKS_DEVICE": "cpu:8"},
    "jax": {"KERAS_BACKEND": "jax", "FENWICKS_ENGINE": None, "FENWICKS_DEVICE": None,
            "XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """``{engine: {'run': ..., 'resume': ...}}``: the two engines side by side, then each
    resumed in a new process."""
    root = str(tmp_path_factory.mktemp("contract"))

    def both(engine: str) -> dict:
        first = run_module_json("tests._contract", "run", root, env=ENGINES[engine])
        again = run_module_json("tests._contract", "resume", root, env=ENGINES[engine])
        return {"run": first, "resume": again}

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return dict(zip(ENGINES, pool.map(both, ENGINES), strict=True))


def _both(runs: dict, key: str) -> tuple:
    return runs["tf"]["run"][key], runs["jax"]["run"][key]


def test_each_engine_trains_on_eight_replicas_and_they_agree(runs):
    for engine, result in runs.items():
        assert result["run"]["engine"] == engine
        assert result["run"]["replicas"] == 8 and result["run"]["global_step"] == 6
    tf_losses, jax_losses = _both(runs, "losses")
    assert len(tf_losses) == len(jax_losses) == _contract.STEPS
    np.testing.assert_allclose(tf_losses, jax_losses, rtol=1e-4)
    assert jax_losses[-1] < jax_losses[0]  # it learns
    for tf_weight, jax_weight in zip(*_both(runs, "weights"), strict=True):
        np.testing.assert_allclose(tf_weight, jax_weight, atol=1e-5)


def test_evaluation_and_prediction_see_every_example_once_on_both(runs):
    num_test = len(_contract.digits()[1]) - _contract.NUM_TRAIN
    assert num_test % _contract.VAL_BS != 0  # the last batch is partial
    for result in runs.values():
        run = result["run"]
        assert run["evaluate"]["num_examples"] == num_test == run["predict_rows"]
        # accuracy over every example, from the predictions: the same number
        assert run["predict_accuracy"] == pytest.approx(run["evaluate"]["accuracy"])
        assert run["export_max_diff"] < 1e-5  # the SavedModel serves what predict gave
    tf_eval, jax_eval = _both(runs, "evaluate")
    assert tf_eval["accuracy"] == pytest.approx(jax_eval["accuracy"], abs=1 / num_test)
    assert tf_eval["loss"] == pytest.approx(jax_eval["loss"], rel=1e-4)


def test_a_new_process_resumes_the_asynchronously_saved_run_on_both(runs):
    for result in runs.values():
        run, resumed = result["run"], result["resume"]
        assert resumed["restored_step"] == _contract.STEPS
        assert resumed["evaluate"] == pytest.approx(run["evaluate"], rel=1e-6)
        assert resumed["global_step"] == _contract.STEPS + 2
    np.testing.assert_allclose(runs["tf"]["resume"]["losses"],
                               runs["jax"]["resume"]["losses"], rtol=1e-4)


def test_callbacks_tensorboard_and_profiles_are_the_same_on_both(runs):
    loops = _contract.STEPS // 2  # steps_per_loop=2: Keras's batch hooks run once a loop
    expected = ["train_begin", *["batch_end:loss"] * loops, "train_end"]
    assert _both(runs, "callbacks") == (expected, expected)
    for tags in _both(runs, "tensorboard_tags"):
        assert {"loss", "learning_rate", "examples_per_sec"} <= set(tags)
    assert _both(runs, "profiles") == (1, 1)  # profile_steps=(2, 4): one trace each


def test_the_lr_finder_sweeps_the_same_rates_and_losses_on_both(runs):
    want = np.geomspace(1e-7, 10.0, 6)
    tf_lrs, jax_lrs = _both(runs, "find_lr_lrs")
    np.testing.assert_allclose(tf_lrs, want, rtol=1e-12)
    np.testing.assert_allclose(jax_lrs, want, rtol=1e-12)
    np.testing.assert_allclose(*_both(runs, "find_lr_losses"), rtol=1e-4)


def test_check_input_gives_a_verdict_on_both(runs):
    for check in _both(runs, "check_input"):
        assert check["rate"] and "training consumed" in check["line"]


def test_check_tpu_ready_passes_a_good_model_and_names_a_data_dependent_shape(runs):
    for ready in _both(runs, "tpu_ready"):
        per_replica = {"train": _contract.BATCH // 8, "eval": _contract.VAL_BS // 8}
        assert ready["batch_sizes"] == per_replica and ready["precision"] == "bfloat16"
        assert ready["bad"].startswith("the training step has a tensor of data-dependent "
                                       "size")
    assert "(Where)" in runs["tf"]["run"]["tpu_ready"]["bad"]  # XLA's op
    # JAX cannot trace it at all: the user's line, and the mask's shape over the global
    # batch (the jitted step sees all 8 replicas' rows: 128 x 64 pixels)
    assert "_contract.py" in runs["jax"]["run"]["tpu_ready"]["bad"]
    assert f"got bool[{_contract.BATCH},64]" in runs["jax"]["run"]["tpu_ready"]["bad"]


def test_the_tpu_estimator_front_door_trains_on_tf_and_is_one_sentence_on_jax(runs):
    assert runs["tf"]["run"]["tpu_estimator"] == {"global_step": 2}
    refused = runs["jax"]["run"]["tpu_estimator"]
    assert refused["wrote"] == []  # refused before any work
    assert "cannot run inside JAX" in refused["refused"]
    assert "FENWICKS_ENGINE=tf" in refused["refused"] and refused["refused"].count(". ") == 0


def test_bfloat16_computes_in_bfloat16_on_both_and_agrees(runs):
    tf_bf16, jax_bf16 = _both(runs, "bfloat16")
    assert tf_bf16["compute_dtype"] == jax_bf16["compute_dtype"] == "bfloat16"
    np.testing.assert_allclose(tf_bf16["losses"], jax_bf16["losses"], rtol=2e-2)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_gcs_work_dir_trains_resumes_and_exports_on_both(gcs_emulator, engine):
    env = {name: value for name, value in ENGINES[engine].items() if value is not None}
    out = gcs_emulator.run_module_json("tests._contract", "gcs",
                                       gcs_emulator.unique_url("contract"), env=env,
                                       timeout=900)
    num_test = len(_contract.digits()[1]) - _contract.NUM_TRAIN
    assert out["engine"] == engine
    assert out["global_step"] == 4 and len(out["losses"]) == 2  # 2 resumed + 2
    assert out["num_examples"] == num_test and out["served_rows"] == 5
    assert out["export_manifest"] and out["export_is_version"]


@pytest.mark.parametrize("engine", ENGINES)
def test_training_input_through_the_tf_data_service_on_both(cluster, records,  # noqa: F811
                                                           tmp_path, engine):
    address, _ = cluster
    out = run_module_json("tests._contract", "service", str(tmp_path), records, address,
                          env=ENGINES[engine])
    assert out["engine"] == engine
    assert out["global_step"] == 2 and all(np.isfinite(out["losses"]))
