"""Every script in benchmarks/ runs end to end at a smoke size, its child processes
included, so that moving a module breaks a test rather than the next measurement (a
renamed ``fenwicks.train.tf.trainer`` once crashed `train_throughput.py` at its first
trial, unnoticed until a speed claim needed it). The numbers are not checked here: at
these sizes they are noise; each script's own targets are for full-size runs.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess

import pytest

from tests import gcs_emulator as _gcs_emulator
from tests.conftest import run_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.slow

# script -> its smoke-size arguments. A new script must be added here (the first test).
SMOKE = {
    "checkpoint_blocking.py": ["--storage", "local", "--loops", "2", "--repeats", "1",
                               "--steps-per-loop", "1", "--batch-size", "2", "--width", "4"],
    "data_service.py": ["--examples", "64", "--batches", "4"],
    "input_pipeline.py": ["--examples", "64", "--shards", "2", "--batch-size", "16",
                          "--repeats", "1", "--json"],
    "jax_engine.py": ["--loops", "3", "--width", "2", "--save-width", "4"],
    "matmul.py": ["--sizes", "64", "--trials", "1", "--repeats", "1"],
    "resume_position.py": ["--examples", "64", "--batch-size", "16", "--epochs", "2",
                           "--repeats", "1", "--width", "2", "--run-steps", "3"],
    "train_throughput.py": ["--steps", "2", "--steps-per-loop", "1", "--trials", "1",
                            "--examples", "64", "--eval-examples", "100", "--eval-batch",
                            "32", "--batch", "8", "--replicas", "1", "--control"],
}
# script -> its smoke run's environment. jax_engine.py passes XLA_FLAGS on to its JAX
# children: with LLVM's optimisation off they compile the same programs faster.
SMOKE_ENV = {"jax_engine.py": {"XLA_FLAGS": "--xla_backend_optimization_level=0"}}
# Exit status 1 means "ran, and missed its target" for these (a tiny run may).
TARGET_EXIT = {"checkpoint_blocking.py", "resume_position.py"}
# Imported by tests and tutorials, not run: `test_bench_throughput.py` drives
# estimator_throughput's `train_throughput`, `test_docs.py` _results' `write`.
LIBRARIES = {"_results.py", "estimator_throughput.py"}


def run_script(name: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m benchmarks.<name> *args``: the script's own ``__main__``, in a process
    forked from the tests' fork server (`tests.conftest.run_process`), which imported
    Fenwicks already (~6 s of CPU saved per script). Its child processes are new
    interpreters, started by the script as in a full-size run."""
    return run_process(["-m", f"benchmarks.{name.removesuffix('.py')}", *args], env=env,
                       timeout=900, check=False)


def check_ran(name: str, done: subprocess.CompletedProcess) -> None:
    allowed = (0, 1) if name in TARGET_EXIT else (0,)
    assert done.returncode in allowed and "Traceback" not in done.stderr, (
        f"benchmarks/{name} failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n"
        f"{done.stderr[-4000:]}")


def test_every_script_in_benchmarks_has_a_smoke_run():
    scripts = {os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))}
    assert scripts - LIBRARIES == set(SMOKE), "add the new script's smoke arguments to SMOKE"


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_the_script_runs_end_to_end(name):
    done = run_script(name, *SMOKE[name], env=SMOKE_ENV.get(name))
    check_ran(name, done)
    if name == "train_throughput.py":  # the A/A controls made it into the report
        report = json.loads(done.stdout.strip().splitlines()[-1])
        for figures in report["results"]["1"].values():
            assert {"est", "hand", "hand2", "fit"} <= set(figures)
            assert {"exact", "drop", "drop2"} <= set(figures["eval"]["paired"]) | {"drop"}


def test_checkpoint_blocking_runs_on_gs():
    # Its gs:// run starts the tests' emulator itself, in a network namespace (root).
    try:
        _gcs_emulator.check_prerequisites()
    except _gcs_emulator.EmulatorUnavailable as err:
        _gcs_emulator.skip_or_fail(str(err))
    args = SMOKE["checkpoint_blocking.py"]
    done = run_script("checkpoint_blocking.py", *args[:1], "gs", *args[2:])
    check_ran("checkpoint_blocking.py", done)
