"""The JAX engine beyond one host: two processes on loopback (``jax.distributed``,
gloo collectives on the CPU), four host devices each, train the product's tutorial-1
network (`tests._jax_multihost`) to the same weights as one process with eight devices
and the same global batch; SIGTERM to one of them stops both after the same step, saved;
new processes resume exactly, and evaluate every example once across the processes;
and both fail, clearly, when one process's input_fn yields batches of the wrong size.
This is what the hosts of a TPU pod slice do.
"""

from __future__ import annotations

import concurrent.futures
import os
import socket

import numpy as np
import pytest

from tests.conftest import last_json, run_process

pytestmark = pytest.mark.slow

STEPS = 12  # loops of 3 steps; the two-process run is preempted at 6 and resumed
NUM_TEST = 450  # the digits' test split


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(devices: int) -> dict[str, str | None]:
    return {"KERAS_BACKEND": "jax", "FENWICKS_DEVICE": None,
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices} "
                         "--xla_backend_optimization_level=0"}


def _one_process(work_dir, steps):
    return last_json(run_process(["-m", "tests._jax_multihost", "0", "1", "0",
                                  str(work_dir), str(steps)], _env(8), timeout=600).stdout)


def _two_processes(work_dir, steps, *flags):
    port = str(_free_port())
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        jobs = [pool.submit(run_process, ["-m", "tests._jax_multihost", port, "2",
                                          str(index), str(work_dir), str(steps), *flags],
                            _env(4), timeout=600) for index in range(2)]
        return [last_json(job.result().stdout) for job in jobs]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("jax_multihost")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        single = pool.submit(_one_process, root / "one", STEPS)
        first = _two_processes(root / "two", STEPS, "--wrong-size-first",
                               f"--sigterm-last-at={STEPS // 2}")
        resumed = _two_processes(root / "two", STEPS)  # new processes: a resume
        return {"one": single.result(), "first": first, "resumed": resumed, "root": root}


def test_two_processes_train_to_one_process_weights_and_resume_exactly(runs):
    one, first, resumed = runs["one"], runs["first"], runs["resumed"]
    assert (one["processes"], one["devices"]) == (1, 8)
    for run in first + resumed:
        assert (run["processes"], run["devices"], run["local_devices"]) == (2, 8, 4)
    assert [r["process"] for r in resumed] == [0, 1]
    # SIGTERM reached process 1 alone: both stopped after the same step and saved it.
    assert [(r["preempted_at"], r["global_step"]) for r in first] == [(STEPS // 2,) * 2] * 2
    assert [(r["start_step"], r["global_step"]) for r in resumed] == [(STEPS // 2, STEPS)] * 2
    # Same global batches, same per-device programs: only the cross-device gradient sum
    # differs (XLA's in-process all-reduce against gloo's across processes, another
    # summation order), a float32 rounding of ~1e-7 relative per step. Over 12 SGD steps
    # (learning rate <= 0.05, momentum 0.9) on weights of magnitude ~1 that stays far
    # below 1e-5; one batch out of place (the wrong share, or a resume off by a step)
    # moves the weights by ~1e-2.
    two_losses = first[0]["losses"] + resumed[0]["losses"]
    np.testing.assert_allclose(two_losses, one["losses"], rtol=1e-5)
    np.testing.assert_array_equal(first[0]["losses"], first[1]["losses"])  # in lockstep
    theirs = np.load(runs["root"] / "one" / f"weights-{STEPS}.npz")
    ours = np.load(runs["root"] / "two" / f"weights-{STEPS}.npz")
    assert len(theirs.files) == len(ours.files) > 10
    worst = max(float(np.max(np.abs(theirs[k] - ours[k]))) for k in theirs.files)
    assert worst < 1e-5, worst
    # Loops of 3 steps, cut at the epoch's end (10): the last three checkpoints, in the
    # run format (written once, by process 0); nothing in the previous orbax/ layout.
    assert sorted(os.listdir(runs["root"] / "two" / "checkpoints"), key=int) == [
        "9", "10", "12"]
    assert "fenwicks.lock" not in os.listdir(runs["root"] / "two")
    assert "orbax" not in os.listdir(runs["root"] / "two")
    # Summaries from process 0 alone: one event file per run of it (two runs, one
    # evaluation); process 1 would add its own.
    work = runs["root"] / "two"
    assert [len(os.listdir(work / kind)) for kind in ("train", "eval")] == [2, 1], (
        os.listdir(work / "train"), os.listdir(work / "eval"))


def test_evaluation_counts_every_example_once_across_processes(runs):
    one, resumed = runs["one"], runs["resumed"]
    probs = np.asarray(one["probabilities"], np.float64)
    labels = np.asarray(one["labels"])
    assert probs.shape == (NUM_TEST, 10)
    # The single process's evaluation against numpy on its own predictions...
    assert one["eval"]["loss"] == pytest.approx(
        float(np.mean(-np.log(probs[np.arange(NUM_TEST), labels]))), abs=1e-5)
    assert one["eval"]["accuracy"] == pytest.approx(np.mean(probs.argmax(1) == labels))
    # ...and the two processes' (56 rows per global batch: 8 batches and a partial one,
    # 7 per process) against it.
    for run in resumed:
        assert run["eval"]["num_examples"] == NUM_TEST
        assert run["eval"]["loss"] == pytest.approx(one["eval"]["loss"], abs=1e-5)
        assert run["eval"]["accuracy"] == pytest.approx(one["eval"]["accuracy"])
        assert "predict runs on one host" in run["predict_error"]


def test_a_wrong_batch_size_on_one_process_stops_both_with_clear_errors(runs):
    first = runs["first"]
    assert "yields batches of [9] examples per replica" in first[1]["wrong_size_error"]
    assert "params['batch_size'] is 8" in first[1]["wrong_size_error"]
    assert "failed its checks on process(es) [1] of 2" in first[0]["wrong_size_error"]
    # ...before any step: the same estimators then trained from step 0.
    assert [r["start_step"] for r in first] == [0, 0]
