"""Work_dirs written before the run format keep working (issue 53, item 3).

`tests/data/legacy_work_dirs` holds two work_dirs written by Fenwicks at main 5de401d
(before the run format), with `tests._cross_engine`'s model trained one epoch (21 steps):
``tf/`` (TensorFlow checkpoints, ``ckpt-21``) and ``jax/`` (the JAX engine's orbax
layout, ``orbax/21``), with their ``fenwicks_input.json``; ``written.json`` holds what
that code's own `evaluate` returned right after training. Each is evaluated, resumed and
warm-started on both engines, in fresh processes; a resumed run writes only the run
format (``checkpoints/<step>``) from then on.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from tests.conftest import run_module_json
from tests.test_jax_engine import _env

LEGACY = pathlib.Path(__file__).parent / "data" / "legacy_work_dirs"
WRITTEN = json.loads((LEGACY / "written.json").read_text())
ENGINES = {"tf": None, "jax": 1}  # the engine -> `_env`'s devices (None: TensorFlow)
# The two engines' kernels round differently (the engine contract's tolerance for a
# model evaluated on the other engine; tests/test_cross_engine.py measures the same).
CROSS = 1e-4


def _copy(tmp_path, which: str) -> str:
    work = tmp_path / which
    shutil.copytree(LEGACY / which, work)
    return str(work)


def _run(engine: str, *args: str) -> dict:
    return run_module_json("tests._legacy", *args, env=_env(ENGINES[engine]))


@pytest.mark.slow
@pytest.mark.parametrize("written", ["tf", "jax"])
@pytest.mark.parametrize("engine", ["tf", "jax"])
def test_an_old_work_dir_is_evaluated_on_either_engine(tmp_path, written, engine):
    work = _copy(tmp_path, written)
    got = _run(engine, "evaluate", work)["eval"]
    want = WRITTEN[written]
    assert got["global_step"] == 21 and got["num_examples"] == 450
    assert got["loss"] == pytest.approx(want["loss"], abs=CROSS if engine != written
                                        else 1e-6)
    assert got["accuracy"] == pytest.approx(want["accuracy"], abs=1 / 450 + 1e-9)
    assert sorted(p.name for p in (tmp_path / written).iterdir()) == sorted(
        [p.name for p in (LEGACY / written).iterdir()] + ["eval"])  # nothing else written


@pytest.mark.slow
@pytest.mark.parametrize("written", ["tf", "jax"])
def test_an_old_work_dir_resumes_on_its_engine_and_then_writes_only_the_run_format(
        tmp_path, written):
    work = _copy(tmp_path, written)
    got = _run(written, "train", work, "21")
    assert (got["step"], got["input_position"], got["iterations"]) == (42, 42, 42)
    assert got["latest"] == f"{work}/checkpoints/42"
    # the old checkpoint and record are as they were: nothing of the old format written
    for path in (LEGACY / written).rglob("*"):
        copy = tmp_path / written / path.relative_to(LEGACY / written)
        assert copy.exists(), copy
        if path.is_file():
            assert copy.read_bytes() == path.read_bytes(), copy
    assert not list((tmp_path / written).glob("ckpt-4*"))
    if written == "jax":
        assert [p.name for p in (tmp_path / written / "orbax").iterdir()] == ["21"]
    else:
        assert not (tmp_path / written / "orbax").exists()
    # the next process resumes from the run format, on the other engine too
    other = "jax" if written == "tf" else "tf"
    again = _run(other, "train", work, "1")
    assert (again["step"], again["input_position"], again["iterations"]) == (43, 43, 43)


@pytest.mark.slow
@pytest.mark.parametrize("written", ["tf", "jax"])
@pytest.mark.parametrize("engine", ["tf", "jax"])
def test_an_old_work_dir_warm_starts_a_new_one_on_either_engine(tmp_path, written,
                                                                  engine):
    work = _copy(tmp_path, written)
    got = _run(engine, "warm", work, str(tmp_path / "new"))
    assert got["report"]["loaded"] and not got["report"]["not_loaded"]
    assert got["eval"]["global_step"] == 0  # the weights, not the step
    assert got["eval"]["loss"] == pytest.approx(
        WRITTEN[written]["loss"], abs=CROSS if engine != written else 1e-6)
