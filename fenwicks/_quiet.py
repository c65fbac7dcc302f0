"""A quiet command line: no start-up logging of TensorFlow, absl or libtpu, unless --debug.

``python -m fenwicks ...`` and the ``fenwicks`` script import the package before
`fenwicks.__main__` runs, and TensorFlow (and libtpu) read their log levels when they are
loaded, so ``fenwicks/__init__.py`` calls `quiet_command_line` before anything else. It
changes nothing for a program or notebook that imports Fenwicks, and nothing with
``--debug``. A variable the user set keeps its value.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping, Sequence

# TensorFlow's C++ logging (and absl's "All log messages before absl::InitializeLog()"
# line, which comes with it), libtpu's, and gRPC's, shown from errors up only: on the
# command line Fenwicks itself says what went wrong, in one line.
QUIET_ENV = {
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "TPU_MIN_LOG_LEVEL": "3",
    "TPU_STDERR_LOG_LEVEL": "3",
    "GRPC_VERBOSITY": "ERROR",
}


def is_command_line(argv: Sequence[str], orig_argv: Sequence[str]) -> bool:
    """Whether this process is Fenwicks' command line: ``python -m fenwicks ...`` (while
    runpy imports the package, ``sys.argv[0]`` is ``'-m'``) or the ``fenwicks`` script.

    Examples:
        >>> is_command_line(["-m", "info"], ["python", "-m", "fenwicks", "info"])
        True
        >>> is_command_line(["train.py"], ["python", "train.py"])
        False
    """
    if not argv:
        return False
    if argv[0] == "-m":
        rest = list(orig_argv)
        return "-m" in rest and rest[rest.index("-m") + 1:][:1] == ["fenwicks"]
    return os.path.basename(argv[0]) == "fenwicks"


def quiet_command_line(env: MutableMapping[str, str] | None = None,
                       argv: Sequence[str] | None = None,
                       orig_argv: Sequence[str] | None = None) -> bool:
    """On the command line without ``--debug``, sets `QUIET_ENV` (where unset) and absl's
    Python verbosity to errors; returns whether it did."""
    env = os.environ if env is None else env
    argv = sys.argv if argv is None else argv
    orig_argv = getattr(sys, "orig_argv", argv) if orig_argv is None else orig_argv
    if not is_command_line(argv, orig_argv) or "--debug" in orig_argv:
        return False
    for name, value in QUIET_ENV.items():
        env.setdefault(name, value)
    try:
        from absl import logging as absl_logging
    except ImportError:  # absl comes with TensorFlow; without it there is nothing to quiet
        return True
    absl_logging.set_verbosity(absl_logging.ERROR)
    return True
