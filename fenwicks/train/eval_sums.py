"""The columns of exact evaluation's per-step sums, written in one place.

The compiled evaluation loop (`loops.make_eval_loop`) returns one float32 row per step;
the host adds the rows up (`evaluation.Evaluator.evaluate`). Both sides use this layout:

    loss sum | one sum per metric (in ``ModelSpec.metric_fns`` order) | example count |
    weight sum | one count per check (`CHECKS`)

Loss and metric sums are weighted by the sample weights; the weight sum is the example
count when there are none. The checks count examples: a non-finite loss, non-finite
features, a class label out of range. Rows are added in float64, so rounding does not
grow with the number of steps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

CHECKS = ("non_finite_loss", "non_finite_features", "labels_out_of_range")


def width(num_metrics: int) -> int:
    """Columns of one step's row: loss, the metrics, count, weight, then the checks.

    Examples:
        >>> width(1)   # loss, accuracy, count, weight and three checks
        7
    """
    return 3 + num_metrics + len(CHECKS)


def row(loss_and_metrics: Sequence[Any], count: Any, weight: Any,
        checks: Sequence[Any]) -> list[Any]:
    """One step's columns in layout order (tensors inside the compiled loop).

    Examples:
        >>> row([2.0, 1.0], 4.0, 4.0, [0.0, 0.0, 0.0])
        [2.0, 1.0, 4.0, 4.0, 0.0, 0.0, 0.0]
    """
    if len(checks) != len(CHECKS):
        raise ValueError(f"{len(checks)} check counts given; the layout has {len(CHECKS)}: "
                         f"{CHECKS}")
    return [*loss_and_metrics, count, weight, *checks]


@dataclasses.dataclass(frozen=True)
class EvalTotals:
    """The per-step rows of one evaluation, added up.

    Attributes:
        loss: the weighted loss sum.
        metrics: metric name -> weighted sum, in the model's metric order.
        count: examples evaluated (padding excluded).
        weight: the sum of the sample weights (``count`` without weights).
        checks: check name (`CHECKS`) -> examples that failed it.

    Examples:
        >>> totals = EvalTotals.of(np.array([[2., 1., 4., 4., 0., 0., 0.]]), ['accuracy'])
        >>> totals.means()
        {'loss': 0.5, 'accuracy': 0.25}
    """

    loss: float
    metrics: dict[str, float]
    count: int
    weight: float
    checks: dict[str, int]

    @classmethod
    def of(cls, per_step: Any, metric_names: Sequence[str]) -> EvalTotals:
        """Adds up ``[steps, width]`` rows (any steps, none included) in float64."""
        names = list(metric_names)
        rows = np.asarray(per_step, np.float64).reshape(-1, width(len(names)))
        sums = rows.sum(axis=0)  # no rows (an empty input) give zeros
        checks = sums[len(sums) - len(CHECKS):]
        return cls(loss=float(sums[0]),
                   metrics={name: float(sums[1 + i]) for i, name in enumerate(names)},
                   count=int(sums[1 + len(names)]), weight=float(sums[2 + len(names)]),
                   checks={name: int(n) for name, n in zip(CHECKS, checks, strict=True)})

    def means(self) -> dict[str, float]:
        """Weighted means, as Keras's ``evaluate(sample_weight=...)``: sum(w*v) / sum(w)."""
        return {"loss": self.loss / self.weight,
                **{name: value / self.weight for name, value in self.metrics.items()}}
