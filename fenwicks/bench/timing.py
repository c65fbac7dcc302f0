"""The timing harness: a cold call, a warm-up, then interleaved timed rounds."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_TRIALS = 5


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds of one cold call and of the timed warm calls."""

    cold: float
    warm: tuple[float, ...]


def measure(calls: Sequence[Callable[[], Any]], trials: int = DEFAULT_TRIALS,
            clock: Callable[[], float] = time.perf_counter,
            pause: float | None = None) -> list[Timing]:
    """Times each call cold, warms it up once, then times `trials` rounds.

    Each call must block until its device has finished (fetch a result to the host).
    Rounds interleave the calls (a, b, a, b, ...), so load from other processes on a
    shared machine falls on every call alike instead of on whichever ran last.

    Args:
        calls: zero-argument callables, one per benchmark.
        trials: timed calls of each. Defaults to 5.
        clock: seconds as float. Defaults to `time.perf_counter`.
        pause: seconds to sleep before each timed call. Defaults to None: 0.25 s when
            interleaving several calls, since a BLAS library's idle worker threads keep
            spinning for ~0.1 s after a call (OpenBLAS) and would steal the cores of the
            next call, made by another library; 0 for a single call.

    Examples:
        >>> [t] = measure([lambda: sum(range(10**6))], trials=3)
        >>> len(t.warm)
        3
    """
    if pause is None:
        pause = INTERLEAVE_PAUSE if len(calls) > 1 else 0.0
    cold = [_timed(call, clock, pause) for call in calls]
    for call in calls:
        call()  # warm-up: caches, allocator and thread pools settle before the clock runs
    warm: list[list[float]] = [[] for _ in calls]
    for _ in range(trials):
        for seconds, call in zip(warm, calls, strict=True):
            seconds.append(_timed(call, clock, pause))
    return [Timing(c, tuple(w)) for c, w in zip(cold, warm, strict=True)]


INTERLEAVE_PAUSE = 0.25  # seconds; > OpenBLAS's ~0.1 s spin-wait (2**28 cycles)


def _timed(call: Callable[[], Any], clock: Callable[[], float], pause: float = 0.0) -> float:
    if pause:
        time.sleep(pause)
    start = clock()
    call()
    return clock() - start
