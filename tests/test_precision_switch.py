"""A run continues at another precision (issue 53): a Kaggle TPU run (JAX engine,
precision 'auto' = bfloat16, a plain optimizer) finished on a Colab T4 (TensorFlow
engine, 'auto' = float16, so `building.build_model` wraps the optimizer in Keras's
LossScaleOptimizer), the reverse, and a precision change on one engine (float32 then
float16). Each segment is its own process (`tests._precision_switch`), one replica each.

The checkpoint's optimizer variables are paired across the wrapper
(`run_format.optimizer_pairs`): the inner optimizer's ``iterations`` and momentum slots
are restored, the loss scale starts at Keras's initial 2**15 when the checkpoint has
none (the continuation line says so) and is dropped when the run has none.

What "close" means: after the switch the two segments compute at different precisions,
so the switched run is compared with the same run continued at its first precision on
its first engine; they differ by 16-bit rounding over 20 steps. Measured 2026-11-28
(digits, the tutorial-1 network, 20 + 20 steps, largest absolute difference over the
model's and the inner optimizer's variables): jax bfloat16 -> tf float16 TODO,
tf float16 -> jax bfloat16 TODO, tf float32 -> tf float16 TODO; the control (jax ->
tf with the momentum slots zeroed after the restore) TODO. `TOLERANCE` sits between.
"""

from __future__ import annotations

import concurrent.futures
import shutil

import numpy as np
import pytest

from fenwicks.train import run_format
from tests.conftest import last_json, run_process

pytestmark = pytest.mark.slow

ENGINES = {  # one replica each: the pairing does not depend on the replicas
    "tf": {"KERAS_BACKEND": None, "FENWICKS_ENGINE": None, "FENWICKS_DEVICE": None},
    "jax": {"KERAS_BACKEND": "jax", "FENWICKS_ENGINE": None, "FENWICKS_DEVICE": None,
            "XLA_FLAGS": None},
}
FIRST, LAST = 20, 40  # steps: 9 an epoch, so both segments end inside one
TOLERANCE = 1.0  # TODO set from the measured figures
INITIAL_SCALE = 2.0 ** 15  # keras.optimizers.LossScaleOptimizer's initial_scale


def _segment(work_dir, engine: str, max_steps: int, precision: str,
             control: str = "") -> dict:
    proc = run_process(["-m", "tests._precision_switch", str(work_dir), str(max_steps),
                        precision, *([control] if control else [])], ENGINES[engine],
                       timeout=900)
    out = last_json(proc.stdout)
    out["stderr"] = proc.stderr
    assert out["engine"] == engine and out["precision"] == precision, out
    return out


def _variables(out: dict) -> list[np.ndarray]:
    with np.load(out["variables"]) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def _distance(a: dict, b: dict) -> float:
    """Largest absolute difference over the model's and the inner optimizer's variables."""
    return max(float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64))))
               for x, y in zip(_variables(a), _variables(b), strict=True))


# name: (first engine, first precision, then engine, then precision)
SWITCHES = {"jax-bf16->tf-fp16": ("jax", "bfloat16", "tf", "float16"),
            "tf-fp16->jax-bf16": ("tf", "float16", "jax", "bfloat16"),
            "tf-fp32->tf-fp16": ("tf", "float32", "tf", "float16")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("precision_switch")
    out: dict = {"first": {}, "switched": {}, "same": {}}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        firsts = {name: pool.submit(_segment, root / name, engine, FIRST, precision)
                  for name, (engine, precision, _, _) in SWITCHES.items()}
        out["first"] = {name: job.result() for name, job in firsts.items()}
        for name in SWITCHES:
            shutil.copytree(root / name, root / f"{name}-same")
        shutil.copytree(root / "jax-bf16->tf-fp16", root / "zero-slots")
        switched = {name: pool.submit(_segment, root / name, then, LAST, precision)
                    for name, (_, _, then, precision) in SWITCHES.items()}
        same = {name: pool.submit(_segment, root / f"{name}-same", engine, LAST, precision)
                for name, (engine, precision, _, _) in SWITCHES.items()}
        control = pool.submit(_segment, root / "zero-slots", "tf", LAST, "float16",
                              "zero-slots")
        out["switched"] = {name: job.result() for name, job in switched.items()}
        out["same"] = {name: job.result() for name, job in same.items()}
        out["zero-slots"] = control.result()
    return out


@pytest.mark.parametrize("switch", SWITCHES)
def test_step_input_position_and_iterations_continue_exactly(runs, switch):
    out = runs["switched"][switch]
    wrapped = SWITCHES[switch][3] == "float16"
    assert out["optimizer"] == ("LossScaleOptimizer" if wrapped else "SGD")
    assert (out["start"], out["step"], out["input_position"], out["iterations"]) == (
        FIRST, LAST, LAST, LAST)
    assert out["latest"].endswith(f"/checkpoints/{LAST}")


def test_the_loss_scale_starts_afresh_where_the_checkpoint_held_none(runs):
    for switch in ("jax-bf16->tf-fp16", "tf-fp32->tf-fp16"):
        assert runs["switched"][switch]["loss_scale_at_start"] == INITIAL_SCALE
    # A float16 run continued at float16 keeps its own (the same run, not a restart:
    # its value after 20 steps, which Keras doubles every 2000 good steps or halves on
    # an overflow, is whatever it was at step 20).
    assert runs["same"]["tf-fp16->jax-bf16"]["loss_scale_at_start"] == \
        runs["first"]["tf-fp16->jax-bf16"]["loss_scale"]
    assert runs["switched"]["tf-fp16->jax-bf16"]["loss_scale"] is None


def test_one_line_says_what_was_not_carried(runs):
    def lines(out: dict) -> list[str]:
        return [line for line in out["stderr"].splitlines() if "fenwicks: " in line
                and ("continues from" in line or "loss scale" in line)]

    (line,) = lines(runs["switched"]["jax-bf16->tf-fp16"])
    assert line.endswith(
        f"{runs['switched']['jax-bf16->tf-fp16']['latest'].rsplit('/checkpoints', 1)[0]} "
        "was trained on the JAX engine; this run continues from its step 20 on the "
        "TensorFlow engine (optimizer slots, input position and learning-rate schedule "
        "restored; the loss scale starts afresh at 32768)"), line
    # The loss scale dropped is not news: the line is the plain switch line.
    (line,) = lines(runs["switched"]["tf-fp16->jax-bf16"])
    assert line.endswith("on the JAX engine (optimizer slots, input position and "
                         "learning-rate schedule restored)"), line
    # On one engine, a precision change that starts a loss scale says so.
    (line,) = lines(runs["switched"]["tf-fp32->tf-fp16"])
    assert line.endswith("continues from its step 20 at precision='float16' (optimizer "
                         "slots, input position and learning-rate schedule restored; the "
                         "loss scale starts afresh at 32768, as the step was written "
                         "without one)"), line
    assert lines(runs["same"]["tf-fp32->tf-fp16"]) == []
    for out in runs["switched"].values():
        assert "CheckpointMismatchError" not in out["stderr"]


@pytest.mark.parametrize("switch", SWITCHES)
def test_the_weights_and_slots_continue(runs, switch):
    distance = _distance(runs["switched"][switch], runs["same"][switch])
    spoiled = _distance(runs["zero-slots"], runs["same"]["jax-bf16->tf-fp16"])
    print(f"{switch}: {distance:.3g} from the run continued at its first precision; "
          f"zero-slots control {spoiled:.3g}")
    assert distance <= TOLERANCE, distance
    assert spoiled > 3 * TOLERANCE, spoiled


def test_variables_are_stored_in_float32_whatever_the_precision(runs):
    # Mixed policies keep variables in float32: the steps of a bfloat16 and a float16
    # run hold float32 arrays (and integer counters), so nothing needs a cast on restore.
    for switch in SWITCHES:
        assert runs["first"][switch]["variable_dtypes"] == ["float32"]
        record = run_format.read_record(runs["first"][switch]["latest"])
        dtypes = {dtype for group in run_format.GROUPS
                  for _, _, dtype in record["layout"][group]}
        assert dtypes <= {"float32", "int32", "int64"}, (switch, dtypes)
        assert "float32" in dtypes
