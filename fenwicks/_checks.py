"""Argument checks shared across Fenwicks: each error names the argument, the value seen
and what to give instead (STYLE.md, rule 6)."""

from __future__ import annotations

from typing import Any

import numpy as np


def positive_int(name: str, value: Any, example: Any = None) -> int:
    """`value` as an int if it is an integer >= 1, else a ValueError naming `name`.

    Example:
        >>> positive_int("steps", 10)
        10
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        hint = f", e.g. {name}={example}" if example is not None else ""
        raise ValueError(f"{name}={value!r} must be a positive integer{hint}")
    return int(value)


def divisible_by_replicas(name: str, value: Any, replicas: int) -> int:
    """A positive int that splits evenly over `replicas`, else a ValueError with the
    nearest sizes that do.

    Example:
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
