"""Storage faults on gs://: 503s, dropped connections and slow answers, injected by a real
proxy (tests/_fault_proxy.py) between the clients and the GCS emulator.

Transient faults are retried and nothing is lost; an outage ends in an error that names
the path within a bounded time; a checkpoint that was not completely written is never
taken for one. The scenarios run in tests/_storage_faults.py inside the namespace.

Checkpoints are in the run format: ``<work_dir>/checkpoints/<step>/``, written by orbax
to local scratch space, uploaded with gcsfs, and complete once its ``commit_success.txt``
(written last, through TensorFlow's client) is there; the listing of steps and the
existence checks go through TensorFlow's client too.

TensorFlow's retries are scaled down here (0.1 s first wait instead of 1 s, 0.5 s cap
instead of 32 s, 5 retries instead of 10, 1 s idle timeout instead of 60 s) so an outage
costs seconds, not minutes; the defaults are documented in fw.io and checkpoints.py.
gcsfs's retries are fixed (6 attempts, 1+2+4+8+16 s of waiting, plus jitter): the upload
and checkpoint scenarios record each wait and sleep 1/20 of it, and check the waits a
user would see (31-36 s in an outage).

The deadline tests (a missing bucket, storage gone or paused mid-training, no
credentials) keep Fenwicks' own TensorFlow retry settings and scale only the
deadlines (DEADLINE_ENV): 2 s per request attempt instead of 20, 12 s per storage
operation instead of 90 (still far below the 47 s of TensorFlow's own retries, which
must not be what ends a call), 4 s per clean-up call after a failure instead of 10.
Processes with the same settings are forked from one server that imported Fenwicks
with them (`import_env`). They train the narrow mnist_net on 8x8 digits for 10 steps.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from tests._storage_faults import GCSFS_WAIT_SCALE
from tests.conftest import last_json, start_process

pytestmark = pytest.mark.slow

FAST_TF_RETRIES = {
    "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "100000",
    "GCS_RETRY_CONFIG_MAX_DELAY_TIME_US": "500000",
    "GCS_RETRY_CONFIG_MAX_RETRIES": "5",
    "GCS_REQUEST_IDLE_TIMEOUT_SECS": "1",  # the 3 s delay fault is then a stalled request
    "FENWICKS_GCS_STALL_TIMEOUT": "1",  # the same for gcsfs
}
# Worst case of one request under FAST_TF_RETRIES: 5 waits of at most 0.5 s plus 6
# attempts; several requests in a row fail during one save or restore.
OUTAGE_BOUND_SECS = 30


DEADLINE_ENV = {"FENWICKS_GCS_REQUEST_TIMEOUT": "2", "FENWICKS_GCS_DEADLINE": "12",
                "FENWICKS_GCS_CLEANUP_DEADLINE": "4"}
OPERATION_DEADLINE, CLEANUP_DEADLINE = 12, 4  # seconds (the defaults: 90 and 10)
PAUSE_SECS = 4  # longer than one request attempt (2 s), shorter than an operation (12 s)


def _run(emulator, *args):
    return emulator.run_module_json("tests._storage_faults", *args,
                                    import_env=FAST_TF_RETRIES, timeout=400)


@pytest.fixture(scope="module")
def save_and_restore(gcs_fault_emulator):
    work_dir = gcs_fault_emulator.unique_url("faults") + "/work"
    return work_dir, _run(gcs_fault_emulator, "save_and_restore", work_dir)


@pytest.fixture(scope="module")
def restore_outage(gcs_fault_emulator):
    work_dir = gcs_fault_emulator.unique_url("outage") + "/work"
    return work_dir, _run(gcs_fault_emulator, "restore_outage", work_dir)


def test_transient_faults_during_saves_are_retried(save_and_restore):
    work_dir, out = save_and_restore
    phase = out["transient_save"]
    assert phase["error"] is None, phase["error"]
    # 3 x 503 on reads and 1 on an upload, a reset upload POST and PUT, 2 upload answers
    # cut mid-body, 1 stalled read.
    assert phase["fired"] == [3, 1, 1, 1, 2, 1]
    assert phase["latest"] == work_dir + "/checkpoints/4"
    assert "4/commit_success.txt" in out["final_objects"]


def test_a_save_that_cannot_be_written_names_the_path_and_keeps_the_previous(
        save_and_restore):
    work_dir, out = save_and_restore
    phase = out["failed_save"]
    error = phase["error"]
    assert error is not None and error["type"] == "CheckpointWriteError", phase
    assert "OSError" in error["mro"]
    assert f"could not write checkpoint {work_dir}/checkpoints/6" in error["message"]
    assert "503" in error["message"]
    assert f"The previous checkpoint ({work_dir}/checkpoints/4) is intact" \
        in error["message"]
    assert phase["fired"][0] >= 6  # gcsfs retried (6 attempts) before giving up
    # gcsfs's waits (1+2+4+8+16 s plus jitter; slept 1/20 of here), nothing more.
    waits = phase["gcsfs_waits"]
    assert len(waits) == 5 and 31 <= sum(waits) <= 36, waits
    assert phase["seconds"] < OUTAGE_BOUND_SECS
    assert phase["latest"] == work_dir + "/checkpoints/4"
    assert not [name for name in phase["objects"] if name.startswith("6/")]
    assert "4/commit_success.txt" in phase["objects"]


def test_new_checkpoint_without_its_commit_marker_is_not_taken_as_latest(
        save_and_restore):
    work_dir, out = save_and_restore
    phase = out["failed_marker"]
    assert phase["error"] is not None, phase
    assert f"could not write checkpoint {work_dir}/checkpoints/6" in phase["error"]["message"]
    assert phase["fired"][0] >= 6  # the marker's upload was refused, every attempt
    # The step's files were uploaded; without its marker it is not a checkpoint.
    assert [name for name in phase["objects"] if name.startswith("6/")]
    assert "6/commit_success.txt" not in phase["objects"]
    assert phase["latest"] == work_dir + "/checkpoints/4"


def test_restart_reads_the_last_complete_checkpoint_through_faults(save_and_restore):
    _, out = save_and_restore
    phase = out["transient_restore"]
    assert phase["error"] is None, phase["error"]
    assert phase["fired"][0] == 3 and sum(phase["fired"]) >= 4
    assert phase["value"]["global_step"] == 4
    # Data lost: none. The restored weights are those trained to step 4, bit for bit.
    assert len(phase["weights"]) == len(out["saved_weights"]) > 0
    for restored, saved in zip(phase["weights"], out["saved_weights"], strict=True):
        np.testing.assert_array_equal(restored, saved)


def test_read_names_the_checkpoint_when_storage_is_down(restore_outage):
    work_dir, out = restore_outage
    phase = out["read_outage"]
    assert phase["error"]["type"] == "CheckpointDownloadError", phase
    assert "CheckpointReadError" in phase["error"]["mro"]
    assert f"could not read checkpoint {work_dir}/checkpoints/4" in phase["error"]["message"]
    assert "not known to be damaged" in phase["error"]["message"]
    assert phase["seconds"] < OUTAGE_BOUND_SECS
    assert not phase["left_locally"]  # no partial copy to restore from
    assert out["read_transient"]["error"] is None, out["read_transient"]
    assert out["read_transient"]["fired"] == [2]
    # What step 4 holds, every file byte for byte, as a download without faults gets it.
    assert out["read_clean"]["error"] is None
    assert "record/metadata" in out["read_clean"]["value"]
    assert out["read_transient"]["value"] == out["read_clean"]["value"]


def test_a_listing_of_the_steps_without_answer_is_one_sentence(restore_outage):
    """Was TensorFlow's raw AbortedError ("All 5 retry attempts failed ...")."""
    work_dir, out = restore_outage
    phase = out["listing_outage"]
    error = phase["error"]
    assert error is not None and error["type"] == "CheckpointDownloadError", phase
    assert "CheckpointReadError" in error["mro"] and "AbortedError" in error["cause"]
    assert error["message"].startswith(
        f"could not read the checkpoints in {work_dir}/checkpoints: listing them failed "
        "after the storage client's retries (AbortedError: All 5 retry attempts failed")
    assert error["message"].endswith(
        "Nothing was restored or changed in the work_dir; the checkpoints are not known "
        "to be damaged. Check the network or the bucket's status, then create the "
        "estimator again")
    assert "\n" not in error["message"]
    assert phase["fired"][0] == 6  # TensorFlow's client: the request and its 5 retries
    assert phase["seconds"] < OUTAGE_BOUND_SECS


def test_estimator_does_not_take_an_unreachable_checkpoint_for_a_damaged_one(
        restore_outage):
    work_dir, out = restore_outage
    assert out["latest"] == work_dir + "/checkpoints/4"
    error = out["outage"]["error"]
    assert error is not None and "CheckpointReadError" in error["mro"], out["outage"]
    assert f"could not read checkpoint {work_dir}/checkpoints/4" in error["message"]
    assert "not known to be damaged" in error["message"]
    assert out["latest_after"] == work_dir + "/checkpoints/4"
    assert "4/commit_success.txt" in out["objects_after"]  # not set aside
    assert "2/commit_success.txt" in out["objects_after"]


def test_upload_retries_transient_faults_then_names_the_path(gcs_fault_emulator, tmp_path):
    local = tmp_path / "dataset"
    (local / "sub").mkdir(parents=True)
    rng = np.random.default_rng(0)
    files = {"a.bin": 200_000, "b.bin": 5_000, "sub/c.bin": 70_000, "empty.bin": 0}
    md5 = {}
    for name, size in files.items():
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        (local / name).write_bytes(data)
        md5[name] = hashlib.md5(data, usedforsecurity=False).hexdigest()
    remote = gcs_fault_emulator.unique_url("upload")
    out = _run(gcs_fault_emulator, "upload", remote, str(local))

    transient = out["transient"]
    assert transient["error"] is None
    assert sorted(transient["value"]) == sorted(f"{remote}/dataset/{n}" for n in files)
    assert transient["fired"][:4] == [3, 2, 1, 1]
    assert out["downloaded_md5"] == md5  # every byte arrived, nothing duplicated

    outage = out["outage"]
    assert outage["error"]["type"] == "TransferError"
    message = outage["error"]["message"]
    assert f"{str(local)!r} to '{remote}/dataset'" in message
    assert f"{remote}/dataset/late.bin" in message
    assert outage["fired"] == [6]  # gcsfs's 6 attempts
    # What a user waits: 1+2+4+8+16 s plus up to 1 s of jitter each (slept 1/20 of here);
    # the rest of the outage is the attempts themselves, nothing of Fenwicks' own.
    waits = outage["gcsfs_waits"]
    assert len(waits) == 5 and 31 <= sum(waits) <= 36, waits
    assert outage["seconds"] < sum(waits) * GCSFS_WAIT_SCALE + 10
    assert out["after_outage"]["value"] == [f"{remote}/dataset/late.bin"]
    assert os.path.exists(local / "late.bin")


# --------------------------------------------------------------------------- deadlines


def _run_deadline(emulator, *args, env=None):
    return emulator.run_module_json("tests._storage_faults", *args, env=env,
                                    import_env=DEADLINE_ENV, timeout=300)


@pytest.fixture(scope="module")
def storage_gone(gcs_fault_emulator, tmp_path_factory):
    """Every connection reset from step 4 on; then storage is back and a new process
    resumes the run. Meanwhile (the outage mostly waits on deadlines) the uninterrupted
    reference trains in another process, on local disk: the same steps, so the same
    numbers, and outside the namespace, so the outage's faults cannot reach it."""
    reference = start_process(["-m", "tests._storage_faults", "train_to",
                               str(tmp_path_factory.mktemp("reference") / "work"), "10"])
    try:
        work_dir = gcs_fault_emulator.unique_url("gone") + "/work"
        # TensorFlow caches a gs:// file's metadata for GCS_STAT_CACHE_MAX_AGE seconds (5
        # by default): the lock check before step 4's save met the outage only when more
        # than 5 s had passed since the last one (a loaded machine), and the run then
        # stopped at step 4, on TensorFlow's retries. Kept cached here, so that this is
        # the background save's failure, deterministically (the check meeting the
        # outage: test_a_save_whose_work_dir_check_meets_the_outage_stops_in_bounded_time).
        out = _run_deadline(gcs_fault_emulator, "outage", work_dir, "down", "0",
                            env={"GCS_STAT_CACHE_MAX_AGE": "600"})
        resumed = _run_deadline(gcs_fault_emulator, "train_to", work_dir, "10")
    finally:
        stdout, stderr = reference.communicate(timeout=300)
    assert reference.returncode == 0, stderr[-3000:]
    return work_dir, out, resumed, last_json(stdout)


@pytest.fixture(scope="module")
def uninterrupted(storage_gone):
    """10 steps in one go: what every interrupted run must end with."""
    return storage_gone[3]


def _assert_same_variables(got, want):
    assert len(got) == len(want) > 0
    for ours, theirs in zip(got, want, strict=True):
        np.testing.assert_allclose(ours, theirs, atol=1e-6, rtol=0)


def test_a_missing_bucket_is_an_error_naming_it_within_seconds(gcs_fault_emulator):
    out = _run_deadline(gcs_fault_emulator, "missing_bucket", "gs://no-such-bucket-fw/run")
    for call in ("io", "train"):  # fw.io.get_project_dirs, est.train
        error = out[call]["error"]
        assert error is not None and error["type"] == "BucketNotFoundError", out[call]
        assert "ValueError" in error["mro"]
        assert "bucket 'gs://no-such-bucket-fw'" in error["message"]
        assert "gcloud storage buckets create gs://no-such-bucket-fw" in error["message"]
        assert out[call]["seconds"] < 5  # it used to ask again forever


def test_storage_gone_mid_training_ends_the_run_naming_the_last_checkpoint(storage_gone):
    work_dir, out, _, _ = storage_gone
    error = out["error"]
    assert error is not None and error["type"] == "StorageUnavailableError", out
    assert "OSError" in error["mro"]
    # Storage went away after step 4's loop, before its checkpoint: step 2 is the last.
    # Step 4 is written in the background while steps 5-6 train; its failure is raised
    # when the save of step 6 waits for it.
    assert out["step"] == 6, out
    assert out["last_checkpoint"] == f"{work_dir}/checkpoints/2"
    assert f"The last good checkpoint is {work_dir}/checkpoints/2" in error["message"]
    # The first storage call of step 4's upload (is a copy there to replace?) met it.
    assert (f"(checkpoint save of {work_dir}/checkpoints/4 got no answer from Google Cloud "
            f"Storage within {OPERATION_DEADLINE} s") in error["message"], error["message"]
    # Fenwicks' deadline (not TensorFlow's 47 s of retries) ended the save, then the
    # lock release had its clean-up deadline; nothing else waited on storage.
    assert OPERATION_DEADLINE <= out["seconds_after_outage"]
    assert out["seconds_after_outage"] < OPERATION_DEADLINE + CLEANUP_DEADLINE + 8


def test_a_save_whose_work_dir_check_meets_the_outage_stops_in_bounded_time(
        gcs_fault_emulator):
    # No metadata cache: the check that work_dir is still there, before step 4's save,
    # asks storage, in the training thread, and meets the outage first.
    work_dir = gcs_fault_emulator.unique_url("check") + "/work"
    out = _run_deadline(gcs_fault_emulator, "outage", work_dir, "down", "0",
                        env={"GCS_STAT_CACHE_MAX_AGE": "0"})
    error = out["error"]
    assert error is not None and error["type"] == "StorageUnavailableError", out
    assert out["step"] == 4, out
    assert out["last_checkpoint"] == f"{work_dir}/checkpoints/2"
    assert f"The last good checkpoint is {work_dir}/checkpoints/2" in error["message"]
    assert "work_dir check" in error["message"], error["message"]
    # Fenwicks' deadline ended it (TensorFlow's own retries of the stat took longer).
    assert OPERATION_DEADLINE <= out["seconds_after_outage"]
    assert out["seconds_after_outage"] < OPERATION_DEADLINE + CLEANUP_DEADLINE + 8


def test_resume_after_storage_returns_equals_an_uninterrupted_run(storage_gone,
                                                                  uninterrupted):
    work_dir, _, resumed, _ = storage_gone
    assert resumed["resumed_from"] == f"{work_dir}/checkpoints/2"
    assert resumed["step"] == uninterrupted["step"] == 10
    assert uninterrupted["resumed_from"] is None
    _assert_same_variables(resumed["variables"], uninterrupted["variables"])


def test_storage_paused_shorter_than_the_deadline_recovers_exactly(gcs_fault_emulator,
                                                                   uninterrupted):
    work_dir = gcs_fault_emulator.unique_url("paused") + "/work"
    out = _run_deadline(gcs_fault_emulator, "outage", work_dir, "hold", str(PAUSE_SECS))
    assert out["error"] is None, out["error"]
    assert out["fired"][0] >= 1  # requests were held ...
    assert out["seconds_after_outage"] >= PAUSE_SECS  # ... and training waited for them
    assert out["step"] == 10
    _assert_same_variables(out["variables"], uninterrupted["variables"])


def test_train_without_credentials_raises_gcs_credentials_error(gcs_fault_emulator,
                                                                tmp_path):
    work_dir = gcs_fault_emulator.unique_url("nocreds") + "/work"
    # No emulator host, no test token, an empty HOME: no credentials of any kind.
    out = _run_deadline(gcs_fault_emulator, "no_credentials", work_dir,
                        str(tmp_path))["train"]
    assert out["error"]["type"] == "GCSCredentialsError"
    assert f"{work_dir!r} is on Google Cloud Storage" in out["error"]["message"]
    assert "gcloud auth application-default login" in out["error"]["message"]
    assert out["seconds"] < 5 and out["requests"] == 0  # nothing reached storage
