"""When something happens, kept apart from what happens (Orbit's `ConditionalAction`
pairs a condition with an action): "every N loops", "every T seconds", "at the epoch's
end". Each condition is a callable ``condition(output) -> bool`` asked once after each
compiled loop with its `LoopOutput` (the counting ones ignore it).

`actions.ConditionalAction` runs an action when its condition holds; the save policy
(`save_policy.SavePolicy`) asks `AnyOf(EveryNLoops(n), EverySeconds(t))` whether a
periodic checkpoint is due.

Examples:
    >>> every_3 = EveryNLoops(3)
    >>> [every_3(None) for _ in range(6)]
    [False, False, True, False, False, True]
"""

from __future__ import annotations

import time
from typing import Any


class EveryNLoops:
    """True on every `n`-th call (the n-th, 2n-th...); counts from the last `reset`.

    Args:
        n: a positive number of loops.
    """

    def __init__(self, n: int) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n={n!r} must be a positive int, e.g. EveryNLoops(10)")
        self.n, self._count = n, 0

    def __call__(self, output: Any = None) -> bool:
        self._count += 1
        if self._count >= self.n:
            self._count = 0
            return True
        return False

    def reset(self) -> None:
        self._count = 0


class EverySeconds:
    """True when `seconds` have passed (monotonic clock) since it was made, last true or
    reset.

    Args:
        seconds: a non-negative interval.
    """

    def __init__(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
            raise ValueError(f"seconds={seconds!r} must be a number >= 0, e.g. "
                             "EverySeconds(600)")
        self.seconds, self._last = float(seconds), time.monotonic()

    def __call__(self, output: Any = None) -> bool:
        now = time.monotonic()
        if now - self._last >= self.seconds:
            self._last = now
            return True
        return False

    def reset(self) -> None:
        self._last = time.monotonic()


class AnyOf:
    """True when any of `conditions` is; every one is asked each time (each counts its
    loops), and when one holds all restart, so "every N loops or T seconds" counts both
    from the last time either held.

    Examples:
        >>> due = AnyOf(EveryNLoops(100), EverySeconds(600.0))
    """

    def __init__(self, *conditions: Any) -> None:
        self.conditions = conditions

    def __call__(self, output: Any = None) -> bool:
        held = [condition(output) for condition in self.conditions]
        if any(held):
            self.reset()
            return True
        return False

    def reset(self) -> None:
        for condition in self.conditions:
            condition.reset()


class AtEpochEnd:
    """True after a loop that ends an epoch (its global step a multiple of
    `steps_per_epoch`), except at the step `held` names: there the epoch ends later, after
    an evaluation (the controller's `Run.end_epoch`), so its logs carry ``val_*``.

    Args:
        steps_per_epoch: the estimator's steps per epoch.
    """

    def __init__(self, steps_per_epoch: int) -> None:
        self.steps_per_epoch = steps_per_epoch
        self.held: int | None = None

    def __call__(self, output: Any) -> bool:
        return output.step % self.steps_per_epoch == 0 and output.step != self.held
