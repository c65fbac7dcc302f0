"""`fenwicks.train.save_policy` on its own: which trigger saves, with a stand-in
checkpointer that records each save; and the one call site of `Checkpointer.save`."""

from __future__ import annotations

import ast
import pathlib

import pytest

from fenwicks.train import conditions
from fenwicks.train.save_policy import SavePolicy, Trigger

ROOT = pathlib.Path(__file__).resolve().parents[1]


class _Checkpointer:
    """Records ``(step, force)`` per save; `latest` and `last_save_secs` as set."""

    def __init__(self, latest=None, last_save_secs=None, interrupt=False):
        self.saves, self.latest, self.last_save_secs = [], latest, last_save_secs
        self.interrupt = interrupt

    def save(self, step, *, force=False):
        if self.interrupt:
            raise KeyboardInterrupt
        self.saves.append((step, force))

    def save_and_wait(self, step, *, force=False):  # the end of train: a save waited for
        self.save(step, force=force)

    def agree(self, due):  # one process: its own flag
        return due


def test_periodic_saves_every_n_loops_and_every_t_seconds(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(conditions.time, "monotonic", lambda: clock[0])
    checkpointer = _Checkpointer()
    loops = SavePolicy(checkpointer, every_loops=3, every_secs=None)
    said = [loops.save(Trigger.LOOP, step) for step in range(1, 8)]
    assert said == ["not due", "not due", None, "not due", "not due", None, "not due"]
    assert checkpointer.saves == [(3, False), (6, False)]  # loops 3 and 6
    timed = SavePolicy(_Checkpointer(), every_loops=None, every_secs=10.0)
    due = []
    for now in (4.0, 9.9, 10.0, 15.0, 20.5):
        clock[0] = now
        due.append(timed.due())
    assert due == [False, False, True, False, True]  # 10 s after 0, then after 10.0
    never = SavePolicy(_Checkpointer(), every_loops=None, every_secs=None)
    assert not any(never.due() for _ in range(100))


def test_every_other_trigger_saves_the_step_it_is_given():
    checkpointer = _Checkpointer()
    saves = SavePolicy(checkpointer, every_loops=None, every_secs=None)
    for step, trigger in enumerate((Trigger.EVALUATION, Trigger.PREEMPTION,
                                    Trigger.INTERRUPT, Trigger.INPUT_EXHAUSTED), start=1):
        assert saves.save(trigger, step) is None
    assert saves.save(Trigger.END, 5, force=True) is None
    assert checkpointer.saves == [(1, False), (2, False), (3, False), (4, False), (5, True)]


def test_ctrl_c_saves_only_when_quick_and_never_after_a_second_press():
    slow = _Checkpointer(latest="/run/ckpt-3", last_save_secs=60.0)
    saves = SavePolicy(slow, quick_secs=10.0)
    # Step 10 with ckpt-3 the latest: steps 4..10, seven of them, are only in memory.
    assert saves.save(Trigger.INTERRUPT, 10) == ("the last checkpoint took 60 s to write; "
                                                 "7 step(s) are only in memory")
    assert saves.save(Trigger.PREEMPTION, 10) is None  # SIGTERM saves, however slow
    assert slow.saves == [(10, False)]
    quick = _Checkpointer(latest="/run/ckpt-3", last_save_secs=9.5)
    assert SavePolicy(quick, quick_secs=10.0).save(Trigger.INTERRUPT, 10) is None
    assert SavePolicy(quick).save(Trigger.INTERRUPTED_TWICE, 11) == "interrupted twice"
    assert quick.saves == [(10, False)]


def test_a_ctrl_c_during_the_save_of_a_ctrl_c_is_reported_other_saves_raise_it():
    saves = SavePolicy(_Checkpointer(interrupt=True))
    assert saves.save(Trigger.INTERRUPT, 4) == "interrupted again while saving"
    with pytest.raises(KeyboardInterrupt):
        saves.save(Trigger.END, 4)


def _save_calls(path: pathlib.Path) -> list[int]:
    """Lines of ``<something named *checkpointer*>.save(...)`` calls in a module."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "save"):
            owner = ast.unparse(node.func.value)
            if "checkpointer" in owner.rsplit(".", 1)[-1]:
                lines.append(node.lineno)
    return lines


def test_the_tensorflow_engine_saves_from_one_place():
    calls = {path.name: _save_calls(path)
             for path in sorted((ROOT / "fenwicks" / "train").glob("*.py"))}
    assert {name: lines for name, lines in calls.items() if lines} == {
        "save_policy.py": _save_calls(ROOT / "fenwicks" / "train" / "save_policy.py")}
    assert len(calls["save_policy.py"]) == 1
