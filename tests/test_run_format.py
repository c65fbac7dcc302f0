"""`fenwicks.train.run_format` in this process, where a test needs no training run: a
``gs://`` listing of steps that storage does not answer, and how a step's optimizer
variables pair with a run at another precision (a loss scale's wrapper; the runs are in
test_precision_switch.py). (Saves, restores, damage and
faults through the estimator are in test_async_checkpoints.py, test_faults.py,
test_storage_faults.py and test_engine_switch.py.)"""

from __future__ import annotations

import zlib

import keras
import numpy as np
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


class _OneVariable:
    """The run state of one Keras variable: what an engine gives the run format
    (`run_format.RunParts`), for writing steps without an engine."""

    def __init__(self, value: float) -> None:
        self.variable = keras.Variable(np.full(3, value, "float32"), name="w")
        self.groups = {"trainable": [self.variable], "non_trainable": [], "optimizer": []}

    def snapshot(self):
        return {group: [np.array(v.numpy()) for v in variables]
                for group, variables in self.groups.items()}

    def to_host(self, frozen):
        return frozen

    def scatter(self, tree):
        self.variable.assign(tree["trainable"][0])

    def layout(self):
        return run_format.layout_of(self.groups)

    def record(self):
        return run_format.make_record(engine="tf", step=0, input_steps=0,
                                      train_batch_size=1, layout=self.layout())

    def apply_record(self, record):
        pass


def test_read_values_reads_the_step_as_it_is_now(tmp_path, monkeypatch):
    """A step rewritten at its path (a forced save), or another work_dir's step at the
    same relative path, is read as it is now, not as it was first read."""
    state = _OneVariable(1.0)
    checkpointer = run_format.RunCheckpointer(str(tmp_path / "run"), state, keep=1,
                                              asynchronous=False)
    checkpointer.save(0)
    step = str(tmp_path / "run" / "checkpoints" / "0")
    np.testing.assert_array_equal(run_format.read_values(step)["w"], [1.0, 1.0, 1.0])
    state.variable.assign(np.full(3, 2.0, "float32"))
    checkpointer.save(0, force=True)  # e.g. restore_best_weights at the end of train
    checkpointer.close()
    np.testing.assert_array_equal(run_format.read_values(step)["w"], [2.0, 2.0, 2.0])
    for folder, value in (("a", 3.0), ("b", 4.0)):  # the same relative path, two folders
        (tmp_path / folder).mkdir()
        monkeypatch.chdir(tmp_path / folder)
        with run_format.RunCheckpointer("run", _OneVariable(value), keep=1,
                                        asynchronous=False) as other:
            other.save(0)
        np.testing.assert_array_equal(run_format.read_values("run/checkpoints/0")["w"],
                                      [value] * 3)


# A LossScaleOptimizer (float16) against a plain optimizer (bfloat16, float32): the paths
# Keras 3 gives them (`keras.optimizers.LossScaleOptimizer(SGD(momentum=0.9))` built on
# one Dense layer lists its own four variables, then the inner optimizer's).
_PLAIN = ["sgd/iteration", "sgd/dense_kernel_momentum", "sgd/dense_bias_momentum"]
_WRAPPED = ["loss_scale_optimizer/iteration", "loss_scale_optimizer/learning_rate",
            "loss_scale_optimizer/step_counter", "loss_scale_optimizer/dynamic_scale",
            "sgd_1/iteration", "sgd_1/dense_kernel_momentum", "sgd_1/dense_bias_momentum"]


def test_the_loss_scale_wrapper_is_found_by_its_own_variables():
    assert run_format.loss_scale_prefix(_WRAPPED) == "loss_scale_optimizer"
    assert run_format.loss_scale_prefix(_PLAIN) is None
    # A slot merely named like the scale, without the wrapper's step counter: no wrapper.
    assert run_format.loss_scale_prefix(["adam/iteration", "adam/dynamic_scale"]) is None


def test_optimizer_variables_pair_across_the_wrapper_both_ways():
    # Plain checkpoint, wrapped run: the inner variables in order, the wrapper's own kept.
    assert run_format.optimizer_pairs(_PLAIN, _WRAPPED) == [None, None, None, None, 0, 1, 2]
    # Wrapped checkpoint, plain run: the wrapper's own (indices 0-3) are dropped.
    assert run_format.optimizer_pairs(_WRAPPED, _PLAIN) == [4, 5, 6]
    # Both or neither wrapped, or inner variables that do not number the same: in order.
    assert run_format.optimizer_pairs(_PLAIN, _PLAIN) is None
    assert run_format.optimizer_pairs(_WRAPPED, _WRAPPED) is None
    assert run_format.optimizer_pairs(_PLAIN[:2], _WRAPPED) is None


def test_only_a_loss_scale_started_afresh_is_reported():
    pairs = run_format.optimizer_pairs(_PLAIN, _WRAPPED)
    layout = [[path, [], "float32"] for path in _WRAPPED]
    live = [np.array(0), np.array(0.0), np.array(0), np.array(32768.0), np.array(0),
            np.zeros((3, 2)), np.zeros(2)]
    theirs = [np.array(7), np.full((3, 2), 0.5), np.full(2, 0.25)]
    carried = run_format.carry(theirs, live, pairs)
    assert [int(carried[0]), float(carried[3]), int(carried[4])] == [0, 32768.0, 7]
    assert carried[5] is theirs[1] and carried[6] is theirs[2]
    assert run_format.not_carried(layout, live, pairs) == [
        "the loss scale starts afresh at 32768"]
    back = run_format.optimizer_pairs(_WRAPPED, _PLAIN)
    assert run_format.not_carried([[p, [], "float32"] for p in _PLAIN], theirs, back) == []


def test_checksums_cover_bfloat16_arrays_byte_for_byte():
    # NumPy's buffer protocol knows no bfloat16 (ml_dtypes): the checksum reads bytes.
    import ml_dtypes

    tree = {"trainable": [np.arange(6, dtype=ml_dtypes.bfloat16).reshape(2, 3)],
            "non_trainable": [np.float32(2.5) * np.ones(3, np.float32)],
            "optimizer": [np.array(7, np.int64)]}
    sums = run_format.checksums(tree)
    assert sums["trainable"] == [zlib.crc32(tree["trainable"][0].tobytes())]
    assert sums["non_trainable"] == [zlib.crc32(np.full(3, 2.5, np.float32).tobytes())]
    record = {"crc32": sums, "layout": {g: [[f"{g}/v", [], "x"]] for g in sums}}
    run_format.check_checksums(tree, record)  # the same arrays pass
    tree["trainable"][0][0, 1] = 3  # one bfloat16 changed
    with pytest.raises(run_format.DamagedStep, match=r"trainable/v \(trainable #0\)"):
        run_format.check_checksums(tree, record)
