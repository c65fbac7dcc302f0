"""The estimator's small parts on their own: the loop length, the callback checks and
names (the epoch log: test_history.py; the integrated behaviour: test_estimator.py and
test_callbacks.py)."""

from __future__ import annotations

import keras
import pytest

from fenwicks.train import callbacks, controller


def test_epochs_to_counts_a_partial_last_epoch():
    assert controller.epochs_to(100, 10) == 10
    assert controller.epochs_to(101, 10) == 11
    assert controller.epochs_to(3, 10) == 1


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
