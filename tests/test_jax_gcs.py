"""The JAX engine on a ``gs://`` work_dir, against the GCS emulator (through the fault
proxy, which forwards everything until a test schedules faults).

Orbax writes each checkpoint to local scratch; the completed step is uploaded with gcsfs
and committed by ``<step>/commit_success.txt`` written last (see
`StagedBucket` in fenwicks/train/run_format.py for why staging). Two processes, as a user runs it:
`tests._jax_gcs` ``first`` (a local reference run, then gs:// to step 4 with sync saves)
and ``second`` (a new process resumes with async saves to step 8, evaluates, predicts,
survives a failed upload of step 10 and refused downloads, warm-starts, resumes again,
and meets no credentials). Each has 8 host devices; the model is the narrow mnist_net on
8x8 digits, 2 steps per loop and a save after each loop, keeping 2 checkpoints. Measured
under a load average of 20-28 on the 2 cores (other agents' tests): the module took
146-333 s; most of it is two JAX/TensorFlow imports and compiles under that load.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_storage_faults import FAST_TF_RETRIES

pytestmark = pytest.mark.slow

JAX_ENV = {"KERAS_BACKEND": "jax", "FENWICKS_DEVICE": "auto",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=8 "
                        "--xla_backend_optimization_level=0"}
NUM_EVAL = 1797 - 1024  # digits after the 1,024 training ones (tests/_flagship.py)


def _run(emulator, command, work_dir, local_root):
    # The second process compiles what the first did (the same model and steps): the
    # session's JAX compilation cache (tests/conftest.py) saves it the time.
    return emulator.run_module_json("tests._jax_gcs", command, work_dir, str(local_root),
                                    env={**JAX_ENV, **FAST_TF_RETRIES},
                                    timeout=600)


@pytest.fixture(scope="module")
def runs(gcs_fault_emulator, tmp_path_factory):
    local_root = tmp_path_factory.mktemp("jax_gcs")
    work_dir = gcs_fault_emulator.unique_url("jaxgcs") + "/work"
    first = _run(gcs_fault_emulator, "first", work_dir, local_root)
    second = _run(gcs_fault_emulator, "second", work_dir, local_root)
    print(f"\ntest_jax_gcs: first {first['seconds']} s, second {second['seconds']} s")
    return work_dir, local_root, first, second


def _load(path) -> list[np.ndarray]:
    with np.load(path) as arrays:
        return [arrays[f"arr_{i}"] for i in range(len(arrays.files))]


def _assert_same(got, want, atol=1e-6):
    assert len(got) == len(want) > 0
    for ours, theirs in zip(got, want, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=atol, rtol=0)


def test_sync_saves_on_the_bucket_committed_and_pruned(runs):
    _, _, first, _ = runs
    assert first["engine"] == "jax" and first["devices"] == 8
    assert first["step"] == 4
    # Saves at 2 and 4, keeping 2: both there, each committed by its marker.
    assert first["listing"]["steps"] == ["2", "4"]
    assert first["listing"]["committed"] == ["2", "4"]


def _eval_labels() -> np.ndarray:
    from sklearn.datasets import load_digits

    return load_digits(return_X_y=True)[1][1024:]


def test_a_new_process_resumes_exactly_with_async_saves_pruned_on_the_bucket(runs):
    _, local_root, _, second = runs
    resumed = second["resumed"]
    assert resumed["steps"] == [5, 6, 7, 8] and resumed["step"] == 8  # from step 4
    # Equal to the uninterrupted local run of 8 steps in the first process.
    _assert_same(_load(local_root / "resumed8.npz"), _load(local_root / "w8.npz"))
    # Asynchronous: save() returned once a copy of the state was dispatched (to pinned
    # host memory); orbax's write and the upload (about 20 objects) went on in the
    # background.
    assert resumed["blocked_secs"] is not None
    assert resumed["blocked_secs"] < resumed["save_secs"], resumed
    # keep_checkpoints=2 on the bucket: 2 and 4 (the first process's) pruned.
    assert resumed["listing"]["steps"] == ["6", "8"]
    assert resumed["listing"]["committed"] == ["6", "8"]
    assert "commit_success.txt" in resumed["listing"]["entries"]["8"]


def test_lock_and_summaries_on_the_bucket(runs):
    _, _, _, second = runs
    resumed = second["resumed"]
    assert resumed["lock_during"] and all(resumed["lock_during"])
    assert resumed["lock_after"] is False
    assert resumed["events"] == 2  # one train event file per process


def test_evaluate_and_predict_from_the_bucket(runs):
    _, local_root, first, second = runs
    result, reference = second["evaluate"], first["reference_eval"]
    assert result["global_step"] == 8 and result["num_examples"] == NUM_EVAL
    predictions = np.load(local_root / "gs_pred8.npy")
    assert predictions.shape == (NUM_EVAL, 10)
    np.testing.assert_allclose(predictions, np.load(local_root / "pred8.npy"), atol=1e-6)
    # The accuracy recounted from the predictions and the labels, by numpy.
    labels = _eval_labels()
    assert result["accuracy"] == pytest.approx(np.mean(predictions.argmax(1) == labels))
    assert result["accuracy"] == pytest.approx(reference["accuracy"])
    assert result["loss"] == pytest.approx(reference["loss"], abs=1e-5)


def test_warm_start_from_a_bucket_work_dir(runs):
    _, local_root, _, second = runs
    warm = second["warm_start"]
    assert warm["report"]["not_loaded"] == [] and warm["step"] == 0
    weights = _load(local_root / "warm.npz")
    assert len(warm["report"]["loaded"]) == len(weights)
    _assert_same(weights, _load(local_root / "w8.npz"), atol=0)


def test_a_failed_upload_leaves_the_previous_checkpoint_the_latest(runs):
    work_dir, local_root, _, second = runs
    failed = second["failed_upload"]
    error = failed["error"]
    assert error is not None and error["type"] == "CheckpointWriteError", failed
    assert f"could not write checkpoint {work_dir}/checkpoints/10" in error["message"]
    assert f"previous checkpoint ({work_dir}/checkpoints/8) is intact" in error["message"]
    assert failed["fired"][0] >= 6  # gcsfs retried before giving up
    listing = failed["listing"]
    # Step 10 was partly uploaded: there, but not committed; 6 and 8 untouched.
    assert listing["steps"] == ["10", "6", "8"] and listing["committed"] == ["6", "8"]
    assert "commit_success.txt" not in listing["entries"]["10"]
    refused = failed["warm_from_partial"]
    assert refused["type"] == "ValueError" and "upload was cut short" in refused["message"]
    # Downloads refused: a new estimator says it could not read step 8, changes nothing.
    refused = second["failed_download"]
    error = refused["error"]
    assert error["type"] == "CheckpointDownloadError", refused
    assert "CheckpointReadError" in error["mro"]
    assert f"could not read checkpoint {work_dir}/checkpoints/8" in error["message"]
    assert "not known to be damaged" in error["message"]
    assert refused["fired"][0] >= 6  # gcsfs retried first
    assert refused["listing"] == listing
    # A new estimator resumes from 8 (not the partial 10), trains 9 and 10 exactly.
    again = second["after_failure"]
    assert again["steps"] == [9, 10] and again["step"] == 10
    _assert_same(_load(local_root / "resumed10.npz"), _load(local_root / "w10.npz"))
    assert again["listing"]["committed"] == ["10", "8"]
    assert again["listing"]["steps"] == ["10", "8"]


def test_missing_bucket_and_no_credentials_say_what_to_do(runs):
    work_dir, _, first, second = runs
    error = first["missing_bucket"]
    assert error["type"] == "BucketNotFoundError" and "ValueError" in error["mro"]
    assert "bucket 'gs://no-such-bucket-fw-jax'" in error["message"]
    assert "gcloud storage buckets create gs://no-such-bucket-fw-jax" in error["message"]
    error = second["no_credentials"]["error"]
    assert error["type"] == "GCSCredentialsError"
    assert f"'{work_dir}-nocred' is on Google Cloud Storage" in error["message"]
    assert "gcloud auth application-default login" in error["message"]



def test_several_jax_processes_on_gs_are_refused_with_the_fix(runs):
    _, _, first, _ = runs
    error = first["two_processes"]
    assert error["type"] == "ValueError"
    assert "work_dir='gs://b/run'" in error["message"]
    assert "2 JAX processes" in error["message"]
    assert "a filesystem all hosts share" in error["message"]
