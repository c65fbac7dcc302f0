"""Tests for fenwicks.bench.timing: cold call, warm-up and interleaved timed rounds."""

from __future__ import annotations

from fenwicks.bench import timing


class _FakeClock:
    """Advances by the next preset duration each time a call finishes."""

    def __init__(self, durations: list[float]) -> None:
        self.now, self.durations, self.log = 0.0, list(durations), []

    def __call__(self) -> float:
        return self.now

    def call(self, name: str):
        def run() -> None:
            self.log.append(name)
            self.now += self.durations.pop(0)
        return run


def test_measure_cold_warmup_and_interleaved_trials():
    # a cold, b cold, a warm-up, b warm-up, then rounds a, b, a, b, a, b
    clock = _FakeClock([10.0, 20.0, 99.0, 99.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    timing_a, timing_b = timing.measure([clock.call("a"), clock.call("b")], trials=3,
                                        clock=clock, pause=0.0)
    assert clock.log == ["a", "b", "a", "b", "a", "b", "a", "b", "a", "b"]
    assert timing_a == timing.Timing(10.0, (1.0, 3.0, 5.0))
    assert timing_b == timing.Timing(20.0, (2.0, 4.0, 6.0))
