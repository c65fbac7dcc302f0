"""Argument checks shared across Fenwicks (the estimator's options, `find_lr`, `fw.data`):
each error names the argument, the value seen and what to give instead (STYLE.md, rule 6).
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from typing import Any

import numpy as np


def is_int(value: Any) -> bool:
    """True for a Python or NumPy integer, False for a bool (``True`` is not a count)."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer))


def positive_int(name: str, value: Any, example: Any = None, *, why: str | None = None,
                 allow_none: bool = False) -> int | None:
    """`value` as an int if it is an integer >= 1, else a ValueError naming `name`.

    Args:
        name: the argument's name, as the user wrote it.
        value: what was given.
        example: a good value, shown as ``name=example``. Defaults to None.
        why: what the number counts, shown in parentheses. Defaults to None.
        allow_none: None is accepted (and returned). Defaults to False.

    Examples:
        >>> positive_int("steps", 10)
        10
    """
    if allow_none and value is None:
        return None
    if not is_int(value) or value < 1:
        text = f"{name}={value!r} must be a positive integer"
        text += f" ({why})" if why else ""
        text += " or None" if allow_none else ""
        text += f", e.g. {name}={example}" if example is not None else ""
        raise ValueError(text)
    return int(value)


def seed(value: Any) -> int | None:
    """A random seed as an int (an integer >= 0), or None; else a ValueError.

    Examples:
        >>> seed(np.int64(3))
        3
    """
    if value is not None and (not is_int(value) or value < 0):
        raise ValueError(f"seed={value!r} must be an integer >= 0 or None")
    return None if value is None else int(value)


def steps(name: str, value: Any, minimum: int = 1) -> int:
    """`value` as an int if it is an integer number of steps >= `minimum`, else a
    ValueError naming `name` (schedules' spans, the lr finder's length).

    Examples:
        >>> steps("warmup_steps", 0, minimum=0)
        0
    """
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer number of steps >= {minimum}")
    return int(value)


def divisible_by_replicas(name: str, value: Any, replicas: int) -> int:
    """A positive int that splits evenly over `replicas`, else a ValueError with the
    nearest sizes that do.

    Examples:
        >>> divisible_by_replicas("trn_bs", 100, 8)
        Traceback (most recent call last):
        ValueError: trn_bs=100 must be divisible by the 8 replicas ...; try 96 or 104
    """
    value = positive_int(name, value)
    if value % replicas:
        low = max(replicas, value - value % replicas)
        raise ValueError(f"{name}={value} must be divisible by the {replicas} replicas "
                         f"(each gets {name} / {replicas}); try {low} or {low + replicas}")
    return value


def non_negative_number(name: str, value: Any, *, allow_none: bool = False) -> float | None:
    """`value` as a float if it is a real number >= 0 (or None when allowed).

    Examples:
        >>> non_negative_number("save_every_secs", 600)
        600.0
    """
    if allow_none and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer,
                                                         np.floating)) \
            or not np.isfinite(value) or value < 0:
        raise ValueError(f"{name}={value!r} must be a number >= 0"
                         + (" or None" if allow_none else ""))
    return float(value)


def number(name: str, value: Any, low: float = 0.0, high: float = math.inf, *,
           low_inclusive: bool = True, high_inclusive: bool = False) -> float:
    """`value` as a float if it is a finite real number within the bounds, else a
    ValueError naming `name`, the value and the interval.

    The one number validator of Fenwicks (schedules, optimizers, the lr finder): ``low``
    is included unless `low_inclusive` is False, ``high`` excluded unless
    `high_inclusive` is True.

    Args:
        name: the argument's name, as the user wrote it.
        value: what was given.
        low: the smallest allowed value. Defaults to `0.0`.
        high: the bound above. Defaults to infinity.
        low_inclusive: `low` itself is allowed. Defaults to True.
        high_inclusive: `high` itself is allowed. Defaults to False.

    Examples:
        >>> number("mom", 0.9, high=1.0)
        0.9
        >>> number("lr", 0, low_inclusive=False)
        Traceback (most recent call last):
        ValueError: lr=0 must be a finite number in (0.0, inf)
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) \
        and math.isfinite(value)
    ok = ok and (value >= low if low_inclusive else value > low)
    ok = ok and (value <= high if high_inclusive else value < high)
    if not ok:
        left, right = "[" if low_inclusive else "(", "]" if high_inclusive else ")"
        raise ValueError(f"{name}={value!r} must be a finite number in {left}{low}, "
                         f"{high}{right}")
    return float(value)


def one_of(name: str, value: Any, choices: Sequence[Any]) -> Any:
    """`value` if it is one of `choices`, else a ValueError listing them."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} must be one of {tuple(choices)}")
    return value


def boolean(name: str, value: Any) -> bool:
    """`value` as a bool if it is one (or a NumPy bool, or Keras's 0 / 1), else a
    ValueError."""
    if not isinstance(value, (bool, np.bool_)) and not (is_int(value) and value in (0, 1)):
        raise ValueError(f"{name}={value!r} must be True or False")
    return bool(value)


def path_arg(name: str, path: Any) -> str:
    """A local path or ``gs://`` URL given as a str or an `os.PathLike`, ``~`` expanded.

    Examples:
        >>> import pathlib
        >>> path_arg('work_dir', pathlib.Path('~/runs/mnist')).endswith('/runs/mnist')
        True
    """
    value = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name}={path!r} must be a local path (a str or pathlib.Path) "
                         "or a gs:// URL")
    return value if "://" in value else os.path.expanduser(value)
