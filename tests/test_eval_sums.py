"""fenwicks.train.eval_sums: the one column layout of evaluation's per-step sums."""

from __future__ import annotations

import numpy as np
import pytest

from fenwicks.train import eval_sums


def test_a_row_is_loss_metrics_count_weight_then_checks():
    assert eval_sums.width(0) == 6 and eval_sums.width(2) == 8  # 3 + metrics + 3 checks
    assert eval_sums.row(["L", "m1", "m2"], "n", "w", ["c1", "c2", "c3"]) == [
        "L", "m1", "m2", "n", "w", "c1", "c2", "c3"]
    with pytest.raises(ValueError, match="2 check counts given; the layout has 3"):
        eval_sums.row(["L"], "n", "w", ["c1", "c2"])


def test_totals_add_the_rows_in_float64_and_name_each_column():
    # two steps of float32 sums: loss, accuracy, mae, count, weight, three checks
    rows = np.array([[3.0, 2.0, 0.5, 4.0, 4.0, 0.0, 1.0, 0.0],
                     [1.5, 1.0, 0.25, 2.0, 2.0, 1.0, 0.0, 2.0]], np.float32)
    totals = eval_sums.EvalTotals.of(rows, ["accuracy", "mae"])
    assert totals.loss == 4.5 and totals.metrics == {"accuracy": 3.0, "mae": 0.75}
    assert (totals.count, totals.weight) == (6, 6.0)
    assert totals.checks == {"non_finite_loss": 1, "non_finite_features": 1,
                             "labels_out_of_range": 2}
    assert totals.means() == {"loss": 0.75, "accuracy": 0.5, "mae": 0.125}
    # added in float64: 1e8 + 1 - 1e8 is 0 in float32 (its step at 1e8 is 8), 1 here
    steps = np.zeros((3, 6), np.float32)
    steps[:, 0] = [1e8, 1.0, -1e8]
    assert steps[:, 0].sum(dtype=np.float32) == 0.0
    assert eval_sums.EvalTotals.of(steps, []).loss == 1.0


def test_no_rows_give_zeros():
    totals = eval_sums.EvalTotals.of(np.zeros((0, 7), np.float32), ["accuracy"])
    assert (totals.loss, totals.count, totals.weight) == (0.0, 0, 0.0)
    assert totals.metrics == {"accuracy": 0.0} and set(totals.checks.values()) == {0}
