"""The processes of a multi-host run agreeing: what one process decides on its own (an
input check failed, a signal arrived) every process must act on at the same point, since
each step, save and restore is a collective that waits for all of them.

Each function is itself a small collective over the processes (a ``process_allgather``
of one number): every process calls it at the same point of the run. With one process
each returns at once, without touching a device.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import numpy as np

from fenwicks.train.jax import mesh

logger = logging.getLogger("fenwicks")


def broadcast_from_first(tree: Any) -> Any:
    """Process 0's value of `tree` (arrays) on every process, as NumPy arrays."""
    if mesh.num_processes() == 1:
        return tree
    from jax.experimental import multihost_utils

    return jax.tree.map(np.asarray, multihost_utils.broadcast_one_to_all(tree))


def processes_where(flag: bool) -> list[int]:
    """The indices of the processes where `flag` is True, on every process."""
    if mesh.num_processes() == 1:
        return [0] if flag else []
    from jax.experimental import multihost_utils

    flags = np.asarray(multihost_utils.process_allgather(np.asarray([flag]))).reshape(-1)
    return [int(i) for i in np.flatnonzero(flags)]


class AgreedStop:
    """The trainer's stop flag (``numpy()``, read between compiled blocks), true on every
    process once it is true on any.

    One process gets SIGTERM (a preempted host) or Ctrl-C: left alone it would stop while
    the others went on into the next block, each waiting for the other in a different
    collective. Instead every process stops after the same block; the loop's
    `CheckPreemption` then agrees on why (`SavePolicy.agree`), and every process saves
    that step together and stops as the signalled one does (see docs/multihost.md).

    Reading it waits for the block in flight (the agreement is a collective on the
    devices), so with several processes the next block's input is read after it.

    Args:
        flag: the `PreemptionWatcher`'s `flag` (``numpy()`` -> bool).

    Examples:
        >>> flag = tf.Variable(False)   # as a PreemptionWatcher's flag
        >>> stop = AgreedStop(flag)      # JaxTrainer(..., stop=stop) reads it
        >>> stop.numpy()
        False
        >>> _ = flag.assign(True)   # SIGTERM here: with one process, stop at once
        >>> stop.numpy()
        True
    """

    def __init__(self, flag: Any) -> None:
        self._flag = flag

    def numpy(self) -> bool:
        mine = bool(self._flag.numpy())
        stopped = processes_where(mine)
        if stopped and not mine:
            logger.warning("fenwicks: process(es) %s stopped (SIGTERM or Ctrl-C); every "
                           "process stops after the same step", stopped)
        return bool(stopped)


def agreed_stop(flag: Any) -> Any:
    """`flag` itself with one process; an `AgreedStop` of it with several."""
    return flag if flag is None or mesh.num_processes() == 1 else AgreedStop(flag)
