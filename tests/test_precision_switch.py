"""A run continues at another precision (issue 53): a Kaggle TPU run (JAX engine,
precision 'auto' = bfloat16, a plain optimizer) finished on a Colab T4 (TensorFlow
engine, 'auto' = float16, so `building.build_model` wraps the optimizer in Keras's
LossScaleOptimizer), the reverse, and a precision change on one engine (float32 then
float16). Each segment is its own process (`tests._precision_switch`), one replica each.

The checkpoint's optimizer variables are paired across the wrapper
(`run_format.optimizer_pairs`): the inner optimizer's ``iterations`` and momentum slots
are restored, the loss scale starts at Keras's initial 2**15 when the checkpoint has
none (the continuation line says so) and is dropped when the run has none.

The slots are checked twice. Exactly: right after the restore, the inner optimizer's
variables equal the step's arrays read back from disk (``restored_difference`` 0). And by
their effect: after the switch the two segments compute at different precisions, so the
switched run is compared with the same run continued at its first precision on its first
engine, and a control (jax bfloat16 -> tf float16 with the momentum slots zeroed after
the restore) must end several times further from it. Measured 2026-11-28 (digits, the
tutorial-1 network, one replica, 20 + 20 steps at a learning rate warming up to 0.1,
largest absolute difference over the model's and the inner optimizer's variables):
jax bfloat16 -> tf float16 0.0561, tf float16 -> jax bfloat16 0.0630, tf float32 ->
tf float16 0.0531 (16-bit rounding over 20 steps of a BatchNorm net, not a lost state);
the zero-slots control 0.544, 8.6 times the largest. `TOLERANCE` and `CONTROL_RATIO`
sit between.

Checkpoints of the format before the run format (float32) continue at float16 too, on
the other engine (`cross_engine.OtherEnginesReader`) and on their own
(`cross_engine.AtAnotherPrecision`), with the same pairing; and a model with
bfloat16 variables (a layer's own dtype) is checkpointed and continued on the other
engine.
"""

from __future__ import annotations

import concurrent.futures
import pathlib
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
TOLERANCE = 0.15  # 16-bit rounding after the switch: measured 0.053-0.063 (docstring)
CONTROL_RATIO = 4  # the zero-slots control ends this many times further: measured 8.6
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
    # The inner optimizer's iterations and slots, as restored, equal the step's arrays.
    assert out["restored_difference"] == 0.0


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
    assert spoiled > CONTROL_RATIO * distance, spoiled


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


LEGACY = pathlib.Path(__file__).parent / "data" / "legacy_work_dirs"


@pytest.mark.parametrize("written, engine", [("jax", "tf"), ("tf", "jax"), ("tf", "tf"),
                                             ("jax", "jax")])
def test_the_previous_format_continues_at_float16(tmp_path, written, engine):
    """A float32 checkpoint of the format before the run format
    (tests/data/legacy_work_dirs: Adam, 21 steps) continues in a float16 run, whose
    optimizer is a LossScaleOptimizer: on the other engine (`cross_engine.
    OtherEnginesReader`) and on its own (`cross_engine.AtAnotherPrecision`, where the
    engine's own reader refused it). The inner ``iterations`` and slots are restored
    exactly, the loss scale starts at its initial value, training continues from 21."""
    work = tmp_path / written
    shutil.copytree(LEGACY / written, work)
    proc = run_process(["-m", "tests._precision_switch", "legacy", str(work), "float16"],
                       ENGINES[engine], timeout=900)
    out = last_json(proc.stdout)
    assert (out["engine"], out["saved_engine"], out["optimizer"]) == (
        engine, written, "LossScaleOptimizer")
    # Adam on the tutorial-1 network: iterations and 2 slots of each of 10 variables,
    # read back bit for bit.
    assert (out["slots"], out["restored_difference"]) == (20, 0.0)
    assert out["loss_scale_at_start"] == INITIAL_SCALE
    assert (out["step"], out["iterations"]) == (23, 23)
    (line,) = [line for line in proc.stderr.splitlines() if "continues from" in line]
    if written != engine:
        assert line.endswith(
            f"this run continues from its step 21 on the {run_format.title(engine)} "
            "(optimizer slots, input position and learning-rate schedule restored; not "
            "Keras's global seed generator, which checkpoints before the run format did "
            "not hold; the loss scale starts afresh at 32768)"), line
    else:
        assert line.endswith(
            f"{work} continues from its step 21 at precision='float16' (optimizer slots, "
            "input position and learning-rate schedule restored; the loss scale starts "
            "afresh at 32768, as the step was written without one)"), line

def test_a_model_with_bfloat16_variables_is_checkpointed_and_continues(tmp_path):
    """Mixed policies keep variables float32; a layer given ``dtype='bfloat16'`` has
    bfloat16 ones, which NumPy's buffer protocol does not know: the step's checksums
    once failed on them ("cannot include dtype 'E' in a buffer"), so such a model wrote
    no checkpoint. It is written on the JAX engine and continued on TensorFlow's."""
    work = tmp_path / "bf16-layer"
    first = last_json(run_process(["-m", "tests._precision_switch", "bfloat16-layer",
                                   str(work), "5", "bfloat16"], ENGINES["jax"],
                                  timeout=900).stdout)
    proc = run_process(["-m", "tests._precision_switch", "bfloat16-layer", str(work), "10",
                        "float16"], ENGINES["tf"], timeout=900)
    then = last_json(proc.stdout)
    assert (first["engine"], first["step"], then["engine"], then["step"]) == (
        "jax", 5, "tf", 10)
    for out in (first, then):
        assert out["variables"] == ["bfloat16", "float32"]
        assert {"bfloat16", "float32"} <= set(out["stored"])
    assert "continues from its step 5 on the TensorFlow engine" in proc.stderr
