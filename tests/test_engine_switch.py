"""A run continues on the other engine (issue 53, item 2): tf -> jax, jax -> tf and
tf -> jax -> tf, 8 replicas each (``FENWICKS_DEVICE=cpu:8`` for TensorFlow, 8 JAX host
devices), each segment a new process (`tests._engine_switch`), beside the same run
uninterrupted on each engine.

Both engines write one run format (Keras's state tree plus the run record), so the
process that continues restores the step, the input position, the optimizer's slots and
``iterations`` (so the learning-rate schedule continues) exactly, whatever engine wrote
them. Switches fall inside an epoch (9 steps an epoch; steps 100 and 150).

What "equal" means: the engines run different kernels (oneDNN's convolutions against
XLA's), so the same steps on the two engines differ by float rounding; the engine
contract (tests/test_engine_contract.py) holds them to 1e-5 on every weight
(``CONTRACT``). A switched run must end within that of the uninterrupted run on the
engine that trained its first segment: after the switch only the kernels' rounding
separates them. (The two uninterrupted runs themselves end 0.197 apart, measured
2026-11-28, while each switched run ends within 1.3e-6 of its first engine's: that
difference arises before step 100, on both engines' own runs, not at a switch.) Two
controls show that the comparison sees a resume that lost something: the same tf -> jax
switch with the momentum slots zeroed after the restore, and with the input restarted
from its first batch; each ends more than ``MARGIN`` times the tolerance away.
"""

from __future__ import annotations

import concurrent.futures
import shutil

import numpy as np
import pytest

from tests import _engine_switch
from tests.conftest import last_json, run_process

pytestmark = pytest.mark.slow

# TensorFlow is the engine Fenwicks chooses by itself here (no KERAS_BACKEND, not a TPU
# host): its processes then fork from tests._zygote, which imported Fenwicks so (~6 s of
# CPU saved per process; a FENWICKS_ENGINE=tf set here made each a new interpreter). Each
# process reports its engine, and the tests check it.
ENGINES = {
    "tf": {"KERAS_BACKEND": None, "FENWICKS_ENGINE": None, "FENWICKS_DEVICE": "cpu:8"},
    "jax": {"KERAS_BACKEND": "jax", "FENWICKS_ENGINE": None, "FENWICKS_DEVICE": None,
            "XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
}
CONTRACT = 1e-5  # the engine contract's tolerance on weights (test_engine_contract.py)
MARGIN = 100  # a control must end this many times further away than CONTRACT


def _segment(work_dir, engine: str, max_steps: int, control: str = "") -> dict:
    proc = run_process(["-m", "tests._engine_switch", str(work_dir), str(max_steps),
                        *([control] if control else [])], ENGINES[engine], timeout=900)
    out = last_json(proc.stdout)
    out["stderr"] = proc.stderr
    assert out["engine"] == engine and out["replicas"] == 8, out
    return out


def _variables(out: dict) -> list[np.ndarray]:
    with np.load(out["variables"]) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def _distance(a: dict, b: dict) -> float:
    """Largest absolute difference over every model and optimizer variable."""
    return max(float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64))))
               for x, y in zip(_variables(a), _variables(b), strict=True))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("engine_switch")
    out: dict = {}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        whole = {engine: pool.submit(_segment, root / f"whole-{engine}", engine, 200)
                 for engine in ENGINES}
        firsts = {engine: pool.submit(_segment, root / f"from-{engine}", engine, 100)
                  for engine in ENGINES}
        out["first"] = {engine: job.result() for engine, job in firsts.items()}
        # Copies of the tf run at step 100, for the three-engine chain and the controls.
        for name in ("chain", "zero-slots", "position-zero"):
            shutil.copytree(root / "from-tf", root / name)
        jobs = {"tf->jax": pool.submit(_segment, root / "from-tf", "jax", 200),
                "jax->tf": pool.submit(_segment, root / "from-jax", "tf", 200),
                "chain-jax": pool.submit(_segment, root / "chain", "jax", 150)}
        out.update((name, job.result()) for name, job in jobs.items())
        controls = {name: pool.submit(_segment, root / name, "jax", 200, name)
                    for name in ("zero-slots", "position-zero")}
        out["tf->jax->tf"] = _segment(root / "chain", "tf", 200)
        out.update((name, job.result()) for name, job in controls.items())
        out["whole"] = {engine: job.result() for engine, job in whole.items()}
    return out


SWITCHES = {"tf->jax": ("TensorFlow", "JAX", 100), "jax->tf": ("JAX", "TensorFlow", 100),
            "tf->jax->tf": ("JAX", "TensorFlow", 150)}


@pytest.mark.parametrize("switch", SWITCHES)
def test_the_step_and_the_input_position_continue_exactly(runs, switch):
    out = runs[switch]
    theirs, ours, step = SWITCHES[switch]
    assert (out["start"], out["step"], out["input_position"], out["iterations"]) == (
        step, 200, 200, 200)
    assert out["latest"].endswith("/checkpoints/200")
    # One line says where the run comes from; no refusal any more.
    lines = [line for line in out["stderr"].splitlines() if "continues from" in line]
    assert len(lines) == 1, lines
    assert (f"was trained on the {theirs} engine; this run continues from its step "
            f"{step} on the {ours} engine") in lines[0]
    assert "CrossEngineTrainingError" not in out["stderr"]


@pytest.mark.parametrize("switch", SWITCHES)
def test_the_learning_rate_schedule_continues(runs, switch):
    # one_cycle_lr(0.1, 300, 30), linear decay to 0 over steps 30..300: at step 200
    # 0.1 * (1 - 170 / 270), counted from the restored `iterations`.
    want = _engine_switch.PEAK * (1 - (200 - _engine_switch.WARMUP)
                                  / (_engine_switch.LR_STEPS - _engine_switch.WARMUP))
    assert runs[switch]["learning_rate"] == pytest.approx(want, rel=1e-6)
    assert runs["first"]["tf"]["learning_rate"] == pytest.approx(
        _engine_switch.PEAK * (1 - 70 / 270), rel=1e-6)


FIRST = {"tf->jax": "tf", "jax->tf": "jax", "tf->jax->tf": "tf"}  # the first segment's


@pytest.mark.parametrize("switch", SWITCHES)
def test_the_final_weights_equal_an_uninterrupted_run_within_the_engines_rounding(
        runs, switch):
    first = FIRST[switch]
    distance = _distance(runs[switch], runs["whole"][first])
    drift = _distance(runs["whole"]["tf"], runs["whole"]["jax"])
    print(f"{switch}: {distance:.3g} from the uninterrupted {first} run (model and "
          f"optimizer variables, max abs); uninterrupted tf vs jax {drift:.3g}")
    assert distance <= CONTRACT, distance


@pytest.mark.parametrize("control", ["zero-slots", "position-zero"])
def test_a_resume_that_lost_the_slots_or_the_position_is_seen(runs, control):
    """The controls: the same tf -> jax switch with the momentum slots zeroed after the
    restore, or the input restarted at its first batch, ends far from the uninterrupted
    run; so the switched runs' closeness proves the slots and the position were
    restored."""
    spoiled = _distance(runs[control], runs["whole"]["tf"])
    print(f"{control}: {spoiled:.3g} from the uninterrupted tf run")
    assert spoiled > MARGIN * CONTRACT, spoiled
