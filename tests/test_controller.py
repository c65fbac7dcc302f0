"""The estimator's small parts on their own: the loop length, the epoch log, the callback
checks and names (the integrated behaviour is in test_estimator.py / test_callbacks.py)."""

from __future__ import annotations

import keras
import pytest

from fenwicks.train import callbacks, controller, history


def test_epochs_to_counts_a_partial_last_epoch():
    assert controller.epochs_to(100, 10) == 10
    assert controller.epochs_to(101, 10) == 11
    assert controller.epochs_to(3, 10) == 1


def test_the_epoch_log_keeps_only_what_the_checkpoint_holds(tmp_path):
    work = str(tmp_path)
    assert history.read_epochs(work, 100) == []
    for epoch in range(4):
        history.append_epoch(work, epoch, 10 * (epoch + 1), {"val_loss": 1.0 / (epoch + 1)})
    assert [e["step"] for e in history.read_epochs(work, 25)] == [10, 20]
    # A run resumed from step 20 redoes epoch 2: the old entries past 20 are replaced.
    history.append_epoch(work, 2, 30, {"val_loss": 0.5})
    entries = history.read_epochs(work, 1000)
    assert [(e["epoch"], e["step"], e["logs"]["val_loss"]) for e in entries] == [
        (0, 10, 1.0), (1, 20, 0.5), (2, 30, 0.5)]


def test_evaluation_results_get_keras_names():
    assert callbacks.val_logs({"loss": 0.5, "accuracy": 0.75, "global_step": 10,
                               "num_examples": 100}) == {"val_loss": 0.5,
                                                         "val_accuracy": 0.75}


def test_callback_checks():
    assert callbacks.check_supported(None) == []
    one = keras.callbacks.History()
    assert callbacks.check_supported(one) == [one]
    with pytest.raises(ValueError, match="keras.callbacks.Callback objects; got 'x'"):
        callbacks.check_supported(["x"])

    class Mine(keras.callbacks.ReduceLROnPlateau):  # a subclass is refused too
        pass

    with pytest.raises(ValueError, match="ReduceLROnPlateau cannot be used"):
        callbacks.check_supported([Mine()])
