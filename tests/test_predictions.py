"""`fenwicks.train.predictions`: predict's array of class probabilities answers the
original Fenwicks's per-example keys."""

import numpy as np
import pytest

from fenwicks.train.predictions import ClassProbabilities, class_probabilities


def test_rows_answer_y_pred_and_y_prob_and_the_array_stays_an_array():
    probs = np.array([[0.1, 0.7, 0.2], [0.6, 0.3, 0.1]], np.float32)
    preds = class_probabilities(probs)
    assert isinstance(preds, ClassProbabilities)
    assert [row["y_pred"] for row in preds] == [1, 0]
    np.testing.assert_array_equal(preds[1]["y_prob"], probs[1])
    np.testing.assert_array_equal(preds["y_pred"], [1, 0])
    np.testing.assert_array_equal(preds[:, 1], probs[:, 1])  # numbers as before
    assert float(preds.sum()) == pytest.approx(2.0)
    with pytest.raises(KeyError, match="as_dicts=True"):
        preds[0]["class_ids"]  # noqa: B018


def test_other_predictions_are_left_as_they_are():
    ids = np.array([1, 2, 3])
    assert class_probabilities(ids) is ids
    outputs = {"box": np.zeros((2, 4))}
    assert class_probabilities(outputs) is outputs
