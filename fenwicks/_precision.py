"""Compute precision: the names Fenwicks accepts and what ``'auto'`` means on a device.

One rule for both engines (each engine's device detector reads its own library's GPUs,
`fw.accel` applies it): bfloat16 on a TPU (its native format, float32's range), float16
with loss scaling on GPUs of compute capability >= 7.0 (tensor cores), float32 elsewhere.
Variables stay float32 under every policy.

This module imports nothing of Fenwicks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

PRECISIONS = ("auto", "float32", "bfloat16", "float16")
# Volta: the first GPUs with float16 tensor cores. float16 on older GPUs (Pascal and
# before) runs slower than float32, so it is not worth the loss-scaling bookkeeping.
_FLOAT16_FROM = (7, 0)


def auto_precision(kind: str, capabilities: Iterable[Sequence[int] | None] = ()) -> str:
    """What ``precision='auto'`` means on `kind` devices: ``'bfloat16'`` on a TPU,
    ``'float16'`` on GPUs whose `capabilities` (compute capability per GPU, None where
    unknown) are all >= 7.0, else ``'float32'``.

    Examples:
        >>> auto_precision("gpu", [(7, 5)]), auto_precision("gpu", [(6, 0)])
        ('float16', 'float32')
    """
    if kind == "tpu":
        return "bfloat16"
    if kind == "gpu":
        found = [tuple(c or (0, 0)) for c in capabilities]
        if found and all(c >= _FLOAT16_FROM for c in found):
            return "float16"
    return "float32"


def keras_policy(precision: str) -> str:
    """The Keras dtype policy name for `precision` (``'mixed_bfloat16'``, ``'float32'``).

    Examples:
        >>> keras_policy("bfloat16")
        'mixed_bfloat16'
    """
    return "float32" if precision == "float32" else f"mixed_{precision}"
