"""The docstring examples (the ``Examples:`` sections, ``>>>`` lines) run as written.

Each docstring's examples run as one doctest with only the names every example may take
for granted: ``fw`` (Fenwicks), ``np``, ``tf`` and ``keras``; anything else an example
defines itself. An example that needs what a test machine lacks (a TPU, a GPU, Colab, a
network, a running server) is listed in `NEEDS` with what it needs. `NOT_YET` lists the
examples that do not run as written yet (it is empty: every example runs): the list may
only shrink (one that runs is a failure until it is taken off). `FIGURES` are benchmarks
printing the machine's own figures. `SLOW` examples (they choose the accelerator, train
an estimator) run in a process of their own; `SLOW_JAX` ones (the JAX engine's parts) in
one on the JAX engine.
"""

from __future__ import annotations

import doctest
import importlib
import os
import pkgutil

import keras
import matplotlib
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw

matplotlib.use("Agg")  # headless: the fw.plt and fw.anim examples open no window

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

# Examples that need what the test machine lacks.
NEEDS = {
    "fenwicks._host.nvidia_device_evidence": "a GPU machine (Colab T4 runtime)",
    "fenwicks._host.tpu_host_evidence": "a TPU host",
    "fenwicks.colab_utils.setup_gcs": "Colab",
    "fenwicks.gcs.setup": "Colab or Kaggle sign-in",
    "fenwicks.gcs.check_credentials": "Google Cloud credentials",
    "fenwicks.io.check_bucket": "a Google Cloud Storage bucket",
    "fenwicks.io.upload_to_gcs": "a Google Cloud Storage bucket",
    "fenwicks.data.tfds_source.tfds_builder": "the network (tfds download) or a bucket",
    "fenwicks.data.tfds_source.tfds_ds": "the network (tfds download) or a bucket",
    "fenwicks.data.tfds_source.tfds_load": "the network (tfds download)",
    "fenwicks.data.service.start_dispatcher": "a second machine (a tf.data service)",
    "fenwicks.data.service.start_worker": "a second machine (a tf.data service)",
    "fenwicks.data.service.via_data_service": "a tf.data service dispatcher",
    "fenwicks.data.readers.tfrecord_ds": "a Google Cloud Storage bucket and credentials",
    "fenwicks.io.copy": "a Google Cloud Storage bucket and credentials",
    "fenwicks.io.download": "a Google Cloud Storage bucket and credentials",
    "fenwicks.io.exists": "a Google Cloud Storage bucket and credentials",
    "fenwicks.io.glob": "a Google Cloud Storage bucket and credentials",
    "fenwicks.io.listdir": "a Google Cloud Storage bucket and credentials",
    "fenwicks.io.get_project_dirs": "a Google Cloud Storage bucket and credentials",
    "fenwicks.io.create_clean_dir": "a Google Cloud Storage bucket and credentials",
    "fenwicks.io.upload": "a Google Cloud Storage bucket and credentials",
    "fenwicks.io.stage": "a Google Cloud Storage bucket and credentials",
    "fenwicks.io.read_bytes": "a Google Cloud Storage bucket and credentials",
    "fenwicks.io.write_text": "a Google Cloud Storage bucket and credentials",
    "fenwicks.keras_models.get_model": "the network (Keras downloads ImageNet weights)",
}
# Examples that print a benchmark's figures, the machine's own: shown, not compared.
FIGURES = {
    "fenwicks.bench.matmul.cpu_vs_numpy", "fenwicks.bench.matmul.speed_ratio",
    "fenwicks.bench.report.run", "fenwicks.bench.matmul.numpy_matmul_flops",
    "fenwicks.bench.matmul.matmul_flops",
}
SLOW = {
    # These choose the accelerator and train or build an estimator, or print the devices:
    # a process of their own (this one's devices may be set up already, or split for
    # other tests).
    "fenwicks.train.estimator.Estimator", "fenwicks.train.estimator.get_tpu_estimator",
    "fenwicks.train.model_func.get_clf_model_func", "fenwicks.report.info",
    "fenwicks.accel.current", "fenwicks.accel.distribution",
    # The estimator's methods, its callbacks and the tools that train (a Dense layer of
    # zero weights, 10 examples, 2 to 4 steps), the digits demo at one epoch of 2 steps:
    "fenwicks.demo.train_demo",
    "fenwicks.train.callbacks.BestExporter",
    "fenwicks.train.callbacks.EarlyStopping",
    "fenwicks.train.estimator.Estimator.check_input",
    "fenwicks.train.estimator.Estimator.evaluate",
    "fenwicks.train.estimator.Estimator.export_saved_model",
    "fenwicks.train.estimator.Estimator.parts",
    "fenwicks.train.estimator.Estimator.predict",
    "fenwicks.train.estimator.Estimator.train",
    "fenwicks.train.estimator.Estimator.train_and_evaluate",
    "fenwicks.train.estimator.train_and_evaluate",
    "fenwicks.train.lr_finder.find_lr",
    "fenwicks.train.preemption.Interrupted",
    "fenwicks.train.tpu_ready.check_tpu_ready",
    # TPUEstimator's: a linear model_fn, trained for 20-25 steps but in the class's.
    "fenwicks.train.tf.tpu_estimator", "fenwicks.train.tf.tpu_estimator.TPUEstimator",
    "fenwicks.train.tf.tpu_estimator.TPUEstimator.train",
    "fenwicks.train.tf.tpu_estimator.TPUEstimator.evaluate",
    "fenwicks.train.tf.tpu_estimator.TPUEstimator.predict",
    "fenwicks.train.tf.tpu_estimator.TPUEstimator.export_saved_model",
    "fenwicks.train.tf.tf1_gradients",  # one step of a model_fn's clipped gradients
    # The TF engine's parts under the strategy fw.accel.current() made.
    "fenwicks.train.tf.devices.strategy", "fenwicks.train.tf.trainer.Trainer",
    "fenwicks.train.tf.inputs.TFInputManager", "fenwicks.train.tf.evaluation.TFEvaluator",
    "fenwicks.train.tf.state.TFRunState", "fenwicks.train.run_state.RunState",
    # The run format: a work_dir an estimator trained for 2 steps, a built RunState's.
    "fenwicks.train.run_format", "fenwicks.train.run_format.RunCheckpointer",
    "fenwicks.train.run_format.read_values", "fenwicks.train.cross_engine.read_run_format",
    "fenwicks.train.save_policy.SavePolicy", "fenwicks.train.checkpointing.Checkpointer",
    "fenwicks.train.tf.input_fns",  # a TPUEstimator's input_fn (it asks fw.accel)
    "fenwicks.train.tf.model_fn_runner",
    # A previous format read into a built TFRunState (the JAX engine's orbax/<step>).
    "fenwicks.train.cross_engine.OtherEnginesReader",
}
# The JAX engine's parts: one process of their own on that engine (Keras's backend is
# fixed at import), forked from the JAX fork server.
SLOW_JAX = {
    "fenwicks.train.jax.state.JaxRunState", "fenwicks.train.jax.trainer.JaxTrainer",
    "fenwicks.train.jax.evaluation.JaxEvaluator", "fenwicks.train.jax.export.export_saved_model",
    "fenwicks.train.jax.checkpoints.LegacyReader",  # orbax/<step> into a built JaxRunState
}
# These set up the devices differently from the defaults the SLOW examples print: each
# runs in a process of its own.
ALONE = {"fenwicks.accel.configure"}
# Examples that do not run as written yet (each would use names it does not define: a
# trained estimator, arrays, a work_dir). None is left; an example added here must be
# fixed, then taken off.
NOT_YET: set[str] = set()  # every example runs now


def _modules() -> list[str]:
    names = ["fenwicks"]
    for info in pkgutil.walk_packages(fw.__path__, "fenwicks."):
        if info.name.endswith("__main__"):
            continue
        names.append(info.name)
    return names


def _examples() -> dict[str, doctest.DocTest]:
    """Every docstring with examples, by its dotted name (first module wins)."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    found: dict[str, doctest.DocTest] = {}
    for name in _modules():
        try:
            module = importlib.import_module(name)
        except ImportError:  # an optional engine's module (jax absent): not this machine's
            continue
        for test in finder.find(module, name, extraglobs={"fw": fw, "np": np, "tf": tf,
                                                          "keras": keras}):
            if test.examples and test.name not in found:
                found[test.name] = test
    return found


EXAMPLES = _examples()


def _run(test: doctest.DocTest, tmp_path, monkeypatch) -> str:
    """Runs one docstring's examples in `tmp_path` (files an example writes go there);
    returns the report of what failed ("" if nothing did)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FENWICKS_ROOT", str(tmp_path / "root"))
    lines: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test, out=lines.append, clear_globs=False)
    return "".join(lines)


FAST = sorted(name for name in EXAMPLES
              if name not in set(NEEDS) | FIGURES | SLOW | SLOW_JAX | ALONE | NOT_YET)


@pytest.mark.parametrize("name", FAST)
def test_the_example_runs_as_written(name, tmp_path, monkeypatch):
    report = _run(EXAMPLES[name], tmp_path, monkeypatch)
    assert report == "", report


SLOW_RUN = """
import json, os, tempfile
from tests import test_examples as t
failed = {}
for name in NAMES:
    os.chdir(tempfile.mkdtemp(dir=os.environ["TMPDIR"]))
    lines = []
    runner = t.doctest.DocTestRunner(optionflags=t.FLAGS)
    runner.run(t.EXAMPLES[name], out=lines.append, clear_globs=False)
    if runner.failures:
        failed[name] = "".join(lines)[-3000:]
print(json.dumps(failed))
"""


def _run_in_a_process(names: list[str], tmp_path,
                      env: dict[str, str | None] | None = None) -> dict[str, str]:
    from tests.conftest import run_python

    proc = run_python(f"NAMES = {names!r}\n" + SLOW_RUN,
                      env={"FENWICKS_ROOT": str(tmp_path / "root"), "TMPDIR": str(tmp_path),
                           "FENWICKS_DEVICE": None, **(env or {})}, timeout=600)
    return __import__("json").loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_slow_examples_run_as_written_in_a_process_of_their_own(tmp_path):
    failed = _run_in_a_process(sorted(SLOW), tmp_path)
    assert failed == {}, "\n".join(failed.values())


@pytest.mark.slow
def test_the_jax_engine_examples_run_as_written_on_the_jax_engine(tmp_path):
    pytest.importorskip("jax")
    failed = _run_in_a_process(sorted(SLOW_JAX), tmp_path,
                               env={"KERAS_BACKEND": "jax", "XLA_FLAGS": None})
    assert failed == {}, "\n".join(failed.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALONE))
def test_the_examples_that_set_up_the_devices_run_each_alone(name, tmp_path):
    failed = _run_in_a_process([name], tmp_path)
    assert failed == {}, "\n".join(failed.values())


@pytest.mark.slow
def test_the_examples_that_do_not_run_yet_are_listed_and_still_do_not(tmp_path_factory):
    """`NOT_YET` only shrinks: an example on it that now runs is taken off."""
    import contextlib

    now_run = []
    for name in sorted(NOT_YET & set(EXAMPLES)):
        with pytest.MonkeyPatch.context() as patch:
            with contextlib.suppress(Exception):
                if _run(EXAMPLES[name], tmp_path_factory.mktemp("ex"), patch) == "":
                    now_run.append(name)
    assert now_run == [], f"these examples run now; take them off NOT_YET: {now_run}"
    assert NOT_YET <= set(EXAMPLES), f"not examples (any more): {NOT_YET - set(EXAMPLES)}"
    assert set(NEEDS) <= set(EXAMPLES), f"not examples (any more): {set(NEEDS) - set(EXAMPLES)}"
