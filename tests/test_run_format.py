"""`fenwicks.train.run_format` in this process, where a test needs no training run: a
``gs://`` listing of steps that storage does not answer. (Saves, restores, damage and
faults through the estimator are in test_async_checkpoints.py, test_faults.py,
test_storage_faults.py and test_engine_switch.py.)"""

from __future__ import annotations

import pytest
import tensorflow as tf

from fenwicks import _deadline
from fenwicks.train import checkpointing, run_format


@pytest.fixture
def listing_fails(monkeypatch):
    """The gs:// listing raises `error` (TensorFlow's client after its retries)."""
    def fail_with(error):
        def glob(pattern):
            raise error
        monkeypatch.setattr(run_format.fw_io, "glob", glob)

    yield fail_with
    _deadline.reset_for_tests()  # the outage it marked ends with the test


def test_a_gs_listing_without_answer_is_one_sentence_naming_the_folder(listing_fails):
    folder = "gs://bucket/work/run/checkpoints"
    cause = tf.errors.AbortedError(None, None, "All 10 retry attempts failed. The last "
                                               "failure: Unavailable: 503\nmore detail")
    listing_fails(cause)
    with pytest.raises(checkpointing.CheckpointReadError) as raised:
        run_format.complete_steps(folder)
    assert isinstance(raised.value, run_format.CheckpointDownloadError)
    assert raised.value.__cause__ is cause and raised.value.path == folder
    assert str(raised.value) == (
        f"could not read the checkpoints in {folder}: listing them failed after the "
        "storage client's retries (AbortedError: All 10 retry attempts failed. The last "
        "failure: Unavailable: 503). Nothing was restored or changed in the work_dir; the "
        "checkpoints are not known to be damaged. Check the network or the bucket's "
        "status, then create the estimator again")
    with pytest.raises(run_format.CheckpointDownloadError, match="listing them failed"):
        run_format.latest("gs://bucket/work/run")


def test_a_gs_listing_refused_for_another_reason_is_not_called_an_outage(listing_fails):
    denied = tf.errors.PermissionDeniedError(None, None, "403 Forbidden")
    listing_fails(denied)
    with pytest.raises(tf.errors.PermissionDeniedError) as raised:
        run_format.complete_steps("gs://bucket/work/run/checkpoints")
    assert raised.value is denied
