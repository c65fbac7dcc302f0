"""The JAX engine (fenwicks/train/jax) under the same estimator, in real processes with
``KERAS_BACKEND=jax`` on 8 (and 1) simulated host devices
(``--xla_force_host_platform_device_count``), on the product's own tutorial-1 network at
narrow width and scikit-learn's digits (`tests._jax_engine`).

One set of runs, started together, feeds every test of the module:

- ``jax8``: 126 steps on 8 devices, then exact evaluation at ``val_bs`` 8, 56 and 1000,
  and an export;
- ``jax1``: 42 steps on 1 device, evaluated at ``val_bs`` 7;
- ``precisions``: 3 steps in each 16-bit precision on 1 device, LLVM optimisation off
  (XLA compiles faster; no number there is compared across processes);
- ``tf``: the same code on the TensorFlow engine (1 replica), 126 steps;
- ``killed`` then ``resumed``: ``jax8``'s run SIGKILLed while its second (asynchronous)
  checkpoint is being written, then resumed by a new process to step 126.
"""

from __future__ import annotations

import concurrent.futures
import os
import time

import numpy as np
import pytest

from tests.conftest import last_json, run_process

pytestmark = pytest.mark.slow

STEPS = 126  # 6 epochs of 21 steps
NUM_TEST = 450  # the digits' test split: 25% of 1,797, stratified


def _env(devices: int | None) -> dict[str, str | None]:
    if devices is None:  # the TensorFlow engine, the default: forked from tests._zygote
        return {"KERAS_BACKEND": None, "FENWICKS_ENGINE": None, "FENWICKS_DEVICE": None}
    return {"KERAS_BACKEND": "jax", "FENWICKS_DEVICE": None,
            # LLVM's optimisation on, unlike other JAX test processes: the 8-device
            # programs it compiles round differently (1 vs 8 devices: 3e-7 apart over
            # 42 steps with it, 3e-3 without; measured 2026-11-26).
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}


def _run(work_dir, steps, val_sizes=(), devices=8, *flags, check=True):
    args = ["-m", "tests._jax_engine", str(work_dir), str(steps), *map(str, val_sizes)]
    return run_process(args + list(flags), _env(devices), timeout=900, check=check)


def _kill_then_resume(work_dir, reference) -> tuple[object, dict]:
    # The same programs as jax8's (`reference`'s): started once jax8 began its first save
    # (its training step compiled, so in the session's cache), this run reads them.
    orbax = work_dir.parent / "jax8" / "checkpoints"
    while not reference.done() and not (orbax.is_dir() and any(orbax.iterdir())):
        time.sleep(0.5)
    killed = _run(work_dir, STEPS, (), 8, "--kill-during-save", check=False)
    listing = sorted(os.listdir(work_dir / "checkpoints"))
    resumed = last_json(_run(work_dir, STEPS).stdout)
    return killed, listing, resumed


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("jax_engine")
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        jobs = {"jax8": pool.submit(_run, root / "jax8", STEPS, (8, 56, 1000), 8,
                                    "--export"),
                "jax1": pool.submit(_run, root / "jax1", 42, (7,), 1),
                "precisions": pool.submit(
                    run_process, ["-m", "tests._jax_engine", str(root / "precision"),
                                  "--precisions"],
                    {**_env(1), "XLA_FLAGS": "--xla_force_host_platform_device_count=1 "
                                             "--xla_backend_optimization_level=0"},
                    timeout=900),
                "tf": pool.submit(_run, root / "tf", STEPS, (56,), None)}
        jobs["kill"] = pool.submit(_kill_then_resume, root / "killed", jobs["jax8"])
        results = {name: job.result() for name, job in jobs.items()}
    out = {name: last_json(results[name].stdout)
           for name in ("jax8", "jax1", "tf", "precisions")}
    out["killed"], out["listing"], out["resumed"] = results["kill"]
    out["root"] = root
    print("\njax engine runs:", {  # shown with pytest -s: the figures of the closing note
        "loss 1 vs 8 devices, max |diff| over 42 steps": float(np.max(np.abs(
            np.subtract(out["jax1"]["losses"], out["jax8"]["losses"][:42])))),
        "accuracy jax8 / tf": (out["jax8"]["evals"]["56"]["accuracy"],
                               out["tf"]["evals"]["56"]["accuracy"]),
        "epoch losses jax8": np.array(out["jax8"]["losses"]).reshape(6, 21).mean(1).round(4)
        .tolist(),
        "epoch losses tf": np.array(out["tf"]["losses"]).reshape(6, 21).mean(1).round(4)
        .tolist(),
        "train seconds jax8 / jax1 / tf": (out["jax8"]["train_seconds"],
                                           out["jax1"]["train_seconds"],
                                           out["tf"]["train_seconds"]),
        "resumed from": out["resumed"]["start_step"], "killed during": out["killed"].stdout
        .strip().splitlines()[-1]})
    return out


def _weights(path) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def test_runs_on_the_jax_engine_over_eight_devices(runs):
    assert (runs["jax8"]["engine"], runs["jax8"]["replicas"]) == ("jax", 8)
    assert (runs["jax1"]["engine"], runs["jax1"]["replicas"]) == ("jax", 1)
    assert runs["jax8"]["steps"] == list(range(1, STEPS + 1))


def test_replica_count_invariance(runs):
    """The same global batches on 1 and 8 devices give the same losses, to float
    rounding (the reductions over 8 shards add in another order)."""
    one, eight = np.array(runs["jax1"]["losses"]), np.array(runs["jax8"]["losses"][:42])
    assert len(one) == 42
    np.testing.assert_allclose(eight, one, rtol=2e-3)
    assert np.max(np.abs(eight[:10] - one[:10])) < 1e-4  # before rounding compounds


def test_exact_evaluation_over_odd_batch_sizes(runs):
    """Every test digit counted once at val_bs 8, 56 and 1000 on 8 devices (450 = 56 *
    8 + 2: a partial last batch; 1000 > 450: one padded batch) and 7 on one device; the
    accuracy equals a NumPy recount of `predict`'s argmax, which has one row each."""
    evals = {**runs["jax8"]["evals"], **runs["jax1"]["evals"]}
    assert sorted(evals, key=int) == ["7", "8", "56", "1000"]
    for val_bs, result in evals.items():
        assert result["num_examples"] == NUM_TEST, val_bs
        assert result["predicted_rows"] == NUM_TEST, val_bs
        assert result["accuracy"] == pytest.approx(result["recount"], abs=1e-12), val_bs
    losses = [runs["jax8"]["evals"][b]["loss"] for b in ("8", "56", "1000")]
    assert max(losses) - min(losses) < 1e-5  # the same sum in another grouping


def test_kill_during_an_async_save_then_resume_equals_the_uninterrupted_run(runs):
    """SIGKILL while orbax writes the second checkpoint: the partial folder is never
    taken for a checkpoint, the new process resumes from the last complete one (weights,
    optimizer, step, input position) and ends with the uninterrupted run's weights."""
    killed, resumed, whole = runs["killed"], runs["resumed"], runs["jax8"]
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert "killed_during" in killed.stdout
    assert any("tmp" in name for name in runs["listing"]), runs["listing"]
    assert resumed["start_step"] in (21, 42)  # the write cut short was step 42's
    assert resumed["global_step"] == STEPS
    start = resumed["start_step"]
    np.testing.assert_allclose(resumed["losses"], whole["losses"][start:], rtol=1e-6)
    for a, b in zip(_weights(runs["root"] / "killed" / f"weights-{STEPS}.npz"),
                    _weights(runs["root"] / "jax8" / f"weights-{STEPS}.npz"), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_cross_engine_agreement(runs):
    """The same model_func, input_fn and seed on both engines: test accuracies within one
    point, and loss curves close. Not bitwise: each engine draws the initial weights
    with its own random generator (Keras's seeded initialisers use the backend's RNG),
    and their kernels (oneDNN in TensorFlow, XLA's in JAX) round differently."""
    tf_run, jax_run = runs["tf"], runs["jax8"]
    assert tf_run["engine"] == "tensorflow" and tf_run["global_step"] == STEPS
    assert tf_run["evals"]["56"]["num_examples"] == NUM_TEST
    accuracy_tf = tf_run["evals"]["56"]["accuracy"]
    accuracy_jax = jax_run["evals"]["56"]["accuracy"]
    assert accuracy_jax > 0.95 and accuracy_tf > 0.95
    assert abs(accuracy_tf - accuracy_jax) <= 0.01
    # Epoch-mean losses: both start at ln(10) = 2.30 +- init and fall together.
    epochs_tf = np.array(tf_run["losses"]).reshape(6, 21).mean(axis=1)
    epochs_jax = np.array(jax_run["losses"]).reshape(6, 21).mean(axis=1)
    assert np.all(np.diff(epochs_jax) < 0) and np.all(np.diff(epochs_tf) < 0)
    np.testing.assert_allclose(epochs_jax, epochs_tf, rtol=0.35, atol=0.03)


def test_export_saved_model_serves_the_predictions(runs):
    """The SavedModel (keras.export through jax2tf) serves what `predict` returned."""
    assert runs["jax8"]["export_max_diff"] < 1e-5


def test_sixteen_bit_precisions(runs):
    """bfloat16 (a TPU's 'auto') and float16 (a GPU's, with a LossScaleOptimizer) compute
    in 16 bits with float32 variables, and train to finite, falling losses."""
    for precision, optimizer in (("bfloat16", "AdamW"), ("float16", "LossScaleOptimizer")):
        got = runs["precisions"]["precisions"][precision]
        assert (got["compute_dtype"], got["variable_dtype"]) == (precision, "float32")
        assert got["optimizer"] == optimizer
        assert len(got["losses"]) == 3 and np.all(np.isfinite(got["losses"]))
        assert abs(got["losses"][0] - np.log(10)) < 0.5  # 10 classes, near uniform at first


def test_demo_on_the_jax_engine_with_eight_devices(tmp_path):
    """The issue's Done-when: ``python -m fenwicks demo`` on the JAX engine over 8 host
    devices reaches the TensorFlow engine's demo accuracy (>= 0.99 of the 450 digits);
    a second run resumes the first from its checkpoint and says so."""
    env = _env(8)  # 8 host devices by XLA_FLAGS: forked from conftest's JAX server
    work_dir = str(tmp_path / "demo")
    out = run_process(["-m", "fenwicks", "demo", "--work-dir", work_dir], env,
                      timeout=900).stdout
    assert "accelerator      cpu x8," in out, out
    line = next(line for line in out.splitlines() if line.startswith("test accuracy"))
    correct, total = (int(n) for n in line.split("(")[1].split(" test")[0].split(" of "))
    assert total == NUM_TEST and correct / total >= 0.99, line
    again = run_process(["-m", "fenwicks", "demo", "--work-dir", work_dir], env,
                        timeout=900).stdout
    assert f"resuming {work_dir} at step 252" in again, again


def test_a_layer_using_a_tensors_value_in_python_is_one_sentence_naming_its_line(tmp_path):
    """Issue 52: ``if ops.mean(x) > 0``, np.asarray, ops.nonzero, jnp.unique in a layer
    gave ``AttributeError: 'str' object has no attribute '_error_repr'`` (Keras rebuilding
    JAX's error) from both check_tpu_ready and train."""
    said = last_json(run_process(["-m", "tests._jax_value_in_python", str(tmp_path)],
                                 _env(1)).stdout)
    source = open(os.path.join(os.path.dirname(__file__), "_jax_value_in_python.py")).read()

    def at(code: str) -> str:  # the user's line, found independently in the source
        number = next(i for i, line in enumerate(source.splitlines(), 1) if code in line)
        return f"at _jax_value_in_python.py:{number} (`{code}"

    use = {"if": "a tensor's value in a Python condition (if, while, and, or) "
                 + at("if ops.mean(x) > 0:"),
           "numpy": "a tensor as a NumPy array (np.asarray, .numpy()) "
                    + at("return x + np.asarray(x).mean()"),
           "nonzero": "a tensor of data-dependent size " + at("return x + ops.cast(ops.nonzero"),
           "unique": "a tensor of data-dependent size " + at("return x + jnp.unique(x)[0]")}
    fix = {"if": "use keras.ops.where (or keras.ops.cond) instead of if",
           "numpy": "use keras.ops instead of NumPy inside the layer",
           "nonzero": "keep shapes fixed: a mask", "unique": "keep shapes fixed: a mask"}
    for kind, calls in said.items():
        for call, error in (("ready", "NotTPUReadyError"), ("train", "ValueError")):
            message = calls[call]
            assert message.startswith(f"{error}: the model uses {use[kind]}"), (kind, message)
            assert "compiles each step for fixed shapes, without the data: " + fix[kind] \
                in message and "_error_repr" not in message and "\n" not in message
    assert not any((tmp_path / kind / "orbax").exists() for kind in said)  # nothing trained
