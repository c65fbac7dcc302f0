"""Processes that save together decide together (`Checkpointer.agree`, the JAX engine's
several hosts): a periodic save one process finds due, and a signal one process got, are
acted on by every process. Here one process's view, with a stand-in checkpointer whose
`agree` answers for the others; tests/test_jax_multihost.py runs the real thing."""

from __future__ import annotations

import types

import numpy as np
import pytest

from fenwicks.train import actions, preemption
from fenwicks.train.save_policy import SavePolicy, Trigger
from fenwicks.train.tf.trainer import LoopOutput


class _Checkpointer:
    """Records saves; `agree` is True when `peers_say` is, whatever this process says."""

    def __init__(self, peers_say: bool) -> None:
        self.peers_say, self.asked, self.saves = peers_say, [], []
        self.latest, self.last_save_secs = None, None

    def agree(self, flag: bool) -> bool:
        self.asked.append(flag)
        return flag or self.peers_say

    def save(self, step, *, force=False):
        self.saves.append(step)
        self.latest = f"ckpt-{step}"


def _output(step: int) -> LoopOutput:
    return LoopOutput(step - 1, step, np.ones([1], np.float32), None, 1.0, 8.0)


def test_a_save_due_on_another_process_is_made_here_and_restarts_the_count():
    peers = _Checkpointer(peers_say=True)
    saves = SavePolicy(peers, every_loops=3)
    assert saves.save(Trigger.LOOP, 1) is None  # due elsewhere (their clock): saved
    assert peers.saves == [1] and peers.asked == [False]
    peers.peers_say = False
    # The count restarted at the agreed save: due again after 3 loops, not at the 3rd.
    assert [saves.save(Trigger.LOOP, step) for step in (2, 3, 4)] == [
        "not due", "not due", None]
    assert peers.saves == [1, 4]


def test_without_a_peer_due_the_saves_come_every_n_loops_as_before():
    alone = _Checkpointer(peers_say=False)
    saves = SavePolicy(alone, every_loops=2)
    assert [saves.save(Trigger.LOOP, step) for step in (1, 2, 3, 4)] == [
        "not due", None, "not due", None]
    assert alone.saves == [2, 4]


def test_sigterm_on_another_process_preempts_this_one_at_the_same_step():
    peers = _Checkpointer(peers_say=True)
    saves = SavePolicy(peers)
    state = types.SimpleNamespace(global_step=6, latest_checkpoint="ckpt-6")
    watcher = types.SimpleNamespace(requested=False, interrupted=False)
    with pytest.raises(preemption.Preempted, match="step 6 saved"):
        actions.CheckPreemption(watcher, state, saves)(_output(6))
    assert peers.saves == [6] and peers.asked == [False]


def test_no_signal_anywhere_trains_on():
    quiet = _Checkpointer(peers_say=False)
    state = types.SimpleNamespace(global_step=6, latest_checkpoint=None)
    watcher = types.SimpleNamespace(requested=False, interrupted=False)
    actions.CheckPreemption(watcher, state, SavePolicy(quiet))(_output(6))
    assert quiet.saves == [] and quiet.asked == [False, False]  # SIGTERM, then Ctrl-C
