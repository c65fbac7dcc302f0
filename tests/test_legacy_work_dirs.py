"""Work_dirs written before the run format keep working (issue 53, item 3).

`tests/data/legacy_work_dirs` holds two work_dirs written by Fenwicks at main 5de401d
(before the run format), with `tests._cross_engine`'s model trained one epoch (21 steps):
``tf/`` (TensorFlow checkpoints, ``ckpt-21``) and ``jax/`` (the JAX engine's orbax
layout, ``orbax/21``), with their ``fenwicks_input.json``; ``written.json`` holds what
that code's own `evaluate` returned right after training. Each is evaluated, resumed and
warm-started on both engines, in fresh processes; a resumed run writes only the run
format (``checkpoints/<step>``) from then on.

Continued on the other engine, an old work_dir resumes as a run-format one does: step,
input position, optimizer ``iterations`` and slots. The expectation is the same 21 steps
continued on the fixture's own engine (which reads its own format as it always did):
the two engines' kernels round differently, so the weights agree to the engine
contract's 1e-5 (tests/test_engine_contract.py), not bitwise. A control continues on the
other engine with the slots zeroed after the restore, and must end far from it.
"""

from __future__ import annotations

import concurrent.futures
import json
import pathlib
import shutil

import numpy as np
import pytest

from tests.conftest import last_json, run_process
from tests.test_jax_engine import _env

LEGACY = pathlib.Path(__file__).parent / "data" / "legacy_work_dirs"
WRITTEN = json.loads((LEGACY / "written.json").read_text())
ENGINES = {"tf": None, "jax": 1}  # the engine -> `_env`'s devices (None: TensorFlow)
OTHER = {"tf": "jax", "jax": "tf"}
TITLES = {"tf": "TensorFlow", "jax": "JAX"}
# The two engines' kernels round differently (the engine contract's tolerance for a
# model evaluated on the other engine; tests/test_cross_engine.py measures the same).
CROSS = 1e-4
CONTRACT = 1e-5  # the engine contract's tolerance on weights (test_engine_contract.py)
MARGIN = 100  # the control must end this many times further away than CONTRACT


def _copy(tmp_path, which: str, name: str | None = None) -> str:
    work = tmp_path / (name or which)
    shutil.copytree(LEGACY / which, work)
    return str(work)


def _process(engine: str, *args: str) -> dict:
    proc = run_process(["-m", "tests._legacy", *args], _env(ENGINES[engine]), timeout=900)
    out = last_json(proc.stdout)
    out["stderr"] = proc.stderr
    assert out["engine"] == engine, out
    return out


def _run(engine: str, *args: str) -> dict:
    return _process(engine, *args)


def _biggest_data_file(step: pathlib.Path, written: str) -> pathlib.Path:
    if written == "tf":
        return step.with_name(step.name + ".data-00000-of-00001")
    return max((step / "default" / "ocdbt.process_0" / "d").iterdir(),
               key=lambda p: p.stat().st_size)


def _cut_short(path: pathlib.Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _with_a_damaged_newer_step(tmp_path, written: str) -> str:
    """A copy whose newest step, 30, has its biggest data file cut short; 21 is intact."""
    work = pathlib.Path(_copy(tmp_path, written, f"{written}-newer"))
    if written == "tf":
        for suffix in (".index", ".data-00000-of-00001"):
            shutil.copy(work / f"ckpt-21{suffix}", work / f"ckpt-30{suffix}")
        (work / "checkpoint").write_text('model_checkpoint_path: "ckpt-30"\n'
                                         'all_model_checkpoint_paths: "ckpt-21"\n'
                                         'all_model_checkpoint_paths: "ckpt-30"\n')
        _cut_short(_biggest_data_file(work / "ckpt-30", written))
    else:
        shutil.copytree(work / "orbax" / "21", work / "orbax" / "30")
        _cut_short(_biggest_data_file(work / "orbax" / "30", written))
    return str(work)


def _with_its_only_step_damaged(tmp_path, written: str) -> str:
    work = pathlib.Path(_copy(tmp_path, written, f"{written}-damaged"))
    step = work / ("ckpt-21" if written == "tf" else "orbax/21")
    _cut_short(_biggest_data_file(step, written))
    return str(work)


@pytest.fixture(scope="module")
def continued(tmp_path_factory) -> dict:
    """Per fixture: 21 more steps on its own engine, on the other, and on the other with
    the slots zeroed; and the refusals' process on the other engine."""
    root = tmp_path_factory.mktemp("legacy")
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        for written in ("tf", "jax"):
            other = OTHER[written]
            base = root / written
            base.mkdir()
            refusals = (_copy(base, written, "refused"),
                        _with_a_damaged_newer_step(base, written),
                        _with_its_only_step_damaged(base, written))
            jobs[written] = {
                "own": pool.submit(_process, written, "train",
                                   _copy(base, written, "own"), "21"),
                "other": pool.submit(_process, other, "train",
                                     _copy(base, written, "other"), "21"),
                "zero-slots": pool.submit(_process, other, "train",
                                          _copy(base, written, "zero-slots"), "21",
                                          "zero-slots"),
                "refusals": pool.submit(_process, other, "refusals", *refusals),
                "dirs": refusals}
        return {written: {name: job if name == "dirs" else job.result()
                          for name, job in runs.items()}
                for written, runs in jobs.items()}


def _variables(out: dict) -> list[np.ndarray]:
    with np.load(out["variables"]) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def _distance(a: dict, b: dict) -> float:
    """Largest absolute difference over every model and optimizer variable."""
    return max(float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64))))
               for x, y in zip(_variables(a), _variables(b), strict=True))


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
        continued, written):
    got = continued[written]["own"]
    work = pathlib.Path(got["latest"]).parents[1]
    assert (got["step"], got["input_position"], got["iterations"]) == (42, 42, 42)
    assert got["latest"] == f"{work}/checkpoints/42"
    _only_the_run_format_written(work, written)
    # the next process resumes from the run format, on the other engine too
    again = _run(OTHER[written], "train", str(work), "1")
    assert (again["step"], again["input_position"], again["iterations"]) == (43, 43, 43)


def _only_the_run_format_written(work: pathlib.Path, written: str) -> None:
    """The old checkpoint and record are as they were: nothing of the old format written."""
    for path in (LEGACY / written).rglob("*"):
        copy = work / path.relative_to(LEGACY / written)
        assert copy.exists(), copy
        if path.is_file():
            assert copy.read_bytes() == path.read_bytes(), copy
    assert not list(work.glob("ckpt-4*"))
    if written == "jax":
        assert [p.name for p in (work / "orbax").iterdir()] == ["21"]
    else:
        assert not (work / "orbax").exists()
    assert sorted(p.name for p in (work / "checkpoints").iterdir()) == ["42"]


@pytest.mark.slow
@pytest.mark.parametrize("written", ["tf", "jax"])
def test_an_old_work_dir_continues_training_on_the_other_engine(continued, written):
    own, got = continued[written]["own"], continued[written]["other"]
    work = pathlib.Path(got["latest"]).parents[1]
    # 21 steps restored (the fixture's one epoch) and 21 trained: counted by hand.
    assert (got["step"], got["input_position"], got["iterations"]) == (42, 42, 42)
    assert got["latest"] == f"{work}/checkpoints/42"
    _only_the_run_format_written(work, written)
    # One line says where the run comes from, and what the old format could not carry.
    lines = [line for line in got["stderr"].splitlines() if "continues from" in line]
    assert lines == [
        f"WARNING:fenwicks:fenwicks: {work} was trained on the {TITLES[written]} engine; "
        f"this run continues from its step 21 on the {TITLES[OTHER[written]]} engine "
        "(optimizer slots, input position and learning-rate schedule restored; not "
        "Keras's global seed generator, which checkpoints before the run format did not "
        "hold)"]
    distance = _distance(got, own)
    print(f"{written} -> {OTHER[written]}: {distance:.3g} from the same 21 steps on the "
          f"{written} engine (model and optimizer variables, max abs)")
    assert distance <= CONTRACT, distance
    assert got["eval"]["loss"] == pytest.approx(own["eval"]["loss"], rel=CROSS)


@pytest.mark.slow
@pytest.mark.parametrize("written", ["tf", "jax"])
def test_a_continuation_that_lost_the_slots_is_seen(continued, written):
    """The control: the same continuation with the optimizer's slots zeroed after the
    restore ends far from the own engine's, so the continuation's closeness proves that
    the slots crossed."""
    spoiled = _distance(continued[written]["zero-slots"], continued[written]["own"])
    print(f"{written} -> {OTHER[written]}, slots zeroed: {spoiled:.3g}")
    assert spoiled > MARGIN * CONTRACT, spoiled


@pytest.mark.slow
@pytest.mark.parametrize("written", ["tf", "jax"])
def test_an_old_work_dir_that_cannot_continue_is_refused_in_one_sentence(continued,
                                                                          written):
    got = continued[written]["refusals"]
    work, newer, damaged = continued[written]["dirs"]
    checkpoint = f"{work}/ckpt-21" if written == "tf" else f"{work}/orbax/21"
    theirs, ours = TITLES[written], TITLES[OTHER[written]]
    # Another optimizer: its weights are read for evaluate, and train() is refused.
    assert got["other_optimizer"]["eval"]["loss"] == pytest.approx(
        WRITTEN[written]["loss"], abs=CROSS)
    assert got["other_optimizer"]["train_error"] == (
        f"CheckpointMismatchError: work_dir={work!r} holds the {theirs} engine's "
        f"checkpoint {checkpoint} (step 21), and its 21 optimizer variables are not this "
        "optimizer's 11 (the first that differs is #2: [3, 3, 1, 8] in the checkpoint, "
        f"[8] here), so train() on the {ours} engine cannot continue its run there: its "
        "weights were loaded for evaluate() and predict() only, and "
        f"get_tpu_estimator(..., work_dir=<new>, warm_start_from={work!r}) continues "
        "from them in a new work_dir (the step and the optimizer start afresh); nothing "
        "was written")
    # Another trn_bs: the input position is counted in the run's (fenwicks_input.json).
    assert got["other_batch_size"].startswith(
        "BatchSizeChangedError: trn_bs=32 differs from the trn_bs=64 this work_dir's run "
        "was trained with: its input position (21 steps) is counted in batches of 64")
    # Another model: named, nothing loaded.
    assert got["other_model"].startswith(
        f"CrossEngineMismatchError: work_dir={work!r} holds the {theirs} engine's "
        f"checkpoint {checkpoint} (step 21), read here on the {ours} engine")
    assert not (pathlib.Path(work) / "checkpoints").exists()
    # A damaged newest step: the older one is read, with a warning, and the run goes on.
    newest = f"{newer}/ckpt-30" if written == "tf" else f"{newer}/orbax/30"
    older = f"{newer}/ckpt-21" if written == "tf" else f"{newer}/orbax/21"
    assert got["newer"]["eval"]["global_step"] == 21
    assert (got["newer"]["step"], got["newer"]["latest"]) == (22, f"{newer}/checkpoints/22")
    warned = [line for line in got["stderr"].splitlines() if "is unreadable" in line]
    assert len(warned) == 1 and f"checkpoint {newest} is unreadable (" in warned[0]
    assert warned[0].endswith(f"resumed from the older {older} instead. Its files are "
                              f"left as they are (the {theirs} engine's)")
    # Its only step damaged: refused, for evaluate and train alike, nothing changed.
    only = f"{damaged}/ckpt-21" if written == "tf" else f"{damaged}/orbax/21"
    for error in got["damaged"].values():
        assert error.startswith(
            f"CheckpointCorruptError: work_dir={damaged!r} lists 1 checkpoint(s) and none "
            f"can be read ({only}: ")
        assert error.endswith(f"Nothing was changed. Move the {theirs} engine's "
                              "checkpoints away to start fresh, or restore them from a copy")
    assert not (pathlib.Path(damaged) / "checkpoints").exists()


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
