"""``train(..., profile_steps=(a, b))``: a profile of global steps a to b.

The engine's own profiler writes the trace, as
``<work_dir>/train/plugins/profile/<time>/<host>.xplane.pb``: TensorFlow's
(`tf.profiler.experimental`) on the TensorFlow engine, JAX's (`jax.profiler`, the same
XPlane format) on the JAX engine, where the steps run as JAX computations that
TensorFlow's profiler does not see. TensorBoard shows it (``tensorboard --logdir
<work_dir>``, Profile tab: trace viewer, and on TensorFlow the input-pipeline analyzer)
once the ``tensorboard-plugin-profile`` package is installed where TensorBoard runs.
Fenwicks does not need that package to write the profile.

Steps run in compiled loops of ``steps_per_loop`` steps and the profiler starts and
stops between loops, so the controller cuts its loops at a and b: the profile holds
exactly the steps that take the run from global step a to global step b.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

logger = logging.getLogger("fenwicks")


def check_profile_steps(profile_steps: Any) -> tuple[int, int] | None:
    """``(a, b)`` as ints with ``0 <= a < b``, or None; else a ValueError naming it.

    Examples:
        >>> check_profile_steps((10, 20))
        (10, 20)
    """
    if profile_steps is None:
        return None
    ok = (isinstance(profile_steps, (tuple, list)) and len(profile_steps) == 2
          and all(isinstance(s, (int, np.integer)) and not isinstance(s, bool)
                  for s in profile_steps))
    if not ok or not 0 <= profile_steps[0] < profile_steps[1]:
        raise ValueError(f"profile_steps={profile_steps!r} must be two global steps (a, b) "
                         "with 0 <= a < b, e.g. profile_steps=(20, 30) to profile the 10 "
                         "steps from global step 20 to 30")
    return int(profile_steps[0]), int(profile_steps[1])


def check_in_range(profile_steps: tuple[int, int] | None, start: int, target: int) -> None:
    """The window must lie within this `train` call's steps, ``start`` to ``target``."""
    if profile_steps is None:
        return
    a, b = profile_steps
    if a < start or b > target:
        length = min(b - a, target - start)
        raise ValueError(
            f"profile_steps={profile_steps!r} are global steps, but this train call runs "
            f"from global step {start} to {target}; e.g. profile_steps=({start}, "
            f"{start + length}) (start after the first loop to leave compilation out)")


class ProfileWindow:
    """Starts the engine's profiler at global step `a` and stops it at `b`.

    Args:
        profile_steps: ``(a, b)``, validated by `check_profile_steps`, or None (nothing).
        logdir: where the profile goes (``<work_dir>/train``: TensorBoard shows it
            with that run's scalars).
        profiler: the engine's (`fenwicks.train.engines.Profiler`).

    Examples:
        >>> class PrintingProfiler:   # an engine's is fw.train.engines.current().profiler
        ...     errors = (RuntimeError,)
        ...     def start(self, logdir): print('start', logdir)
        ...     def stop(self): print('stop')
        >>> with ProfileWindow((20, 30), 'run/train', PrintingProfiler()) as window:
        ...     for step in range(0, 40, 10):   # loops of 10 steps
        ...         _ = window.update(step)     # before and after each loop
        start run/train
        stop
        >>> window.steps_to_boundary(15)   # a loop from step 15 stops at 20
        5
    """

    def __init__(self, profile_steps: tuple[int, int] | None, logdir: str,
                 profiler: Any) -> None:
        self.profile_steps = profile_steps
        self.logdir = logdir
        self._profiler = profiler
        self.running = False

    def steps_to_boundary(self, step: int) -> int | None:
        """Steps from `step` to the next of a and b ahead, or None."""
        ahead = [s - step for s in self.profile_steps or () if s > step]
        return min(ahead) if ahead else None

    def update(self, step: int) -> bool:
        """Called between loops at global step `step`: starts or stops the profiler.

        Returns:
            True if it started or stopped it (time that is not training).
        """
        if self.profile_steps is None:
            return False
        a, b = self.profile_steps
        if not self.running and a <= step < b:
            try:
                self._profiler.start(self.logdir)
            except self._profiler.errors as err:
                # A profile is a diagnostic: training goes on without it.
                logger.warning("fenwicks: could not start the profiler (%s); training "
                               "goes on without profile_steps=%s", err, self.profile_steps)
                self.profile_steps = None
                return False
            self.running = True
            return True
        if self.running and step >= b:
            self.close()
            logger.info("fenwicks: profile of steps %d-%d written to %s/plugins/profile",
                        a, b, self.logdir)
            return True
        return False

    def close(self) -> None:
        """Stops the profiler if it runs, writing what it recorded."""
        if self.running:
            self.running = False
            try:
                self._profiler.stop()
            except self._profiler.errors as err:
                # Also runs while another error unwinds training: never hide that one.
                logger.warning("fenwicks: could not write the profile to %s (%s)",
                               self.logdir, err)

    def __enter__(self) -> ProfileWindow:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
