"""The docstring examples (the ``Examples:`` sections, ``>>>`` lines) run as written.

Each docstring's examples run as one doctest with only the names every example may take
for granted: ``fw`` (Fenwicks), ``np``, ``tf`` and ``keras``; anything else an example
defines itself. An example that needs what a test machine lacks (a TPU, a GPU, Colab, a
network, a running server) is listed in `NEEDS` with what it needs. `NOT_YET` lists the
examples that do not run as written yet (most use a trained estimator, arrays or a
work_dir they do not define): the list may only shrink (one that runs is a failure until
it is taken off). `FIGURES` are benchmarks printing the machine's own figures. `SLOW`
examples (they choose the accelerator, train an estimator) run in a process of their own.
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
}
# These set up the devices differently from the defaults the SLOW examples print: each
# runs in a process of its own.
ALONE = {"fenwicks.accel.configure"}
# Examples that do not run as written yet: each uses names it does not define (a trained
# estimator, arrays, a work_dir) or prints a machine's own figures. Fix one, then take it
# off this list.
NOT_YET = {
    # Added by the checkpoint format's work while this list was made: not self-contained.
    "fenwicks.train.cross_engine.read_run_format", "fenwicks.train.input_record.check",
    "fenwicks.train.run_format", "fenwicks.train.run_format.RunCheckpointer",
    "fenwicks.train.run_format.complete_steps", "fenwicks.train.run_format.latest",
    "fenwicks.train.run_format.variable_groups", "fenwicks.train.run_format.read_values",
    "fenwicks.train.tf.tf1_gradients",
    "fenwicks.train.checkpointing.Checkpointer",
    "fenwicks.train.cross_engine",
    "fenwicks.train.cross_engine.OtherEnginesReader",
    "fenwicks.train.cross_engine.cannot_continue",
    "fenwicks.train.cross_engine.match",
    "fenwicks.train.cross_engine.other_engines_checkpoint",
    "fenwicks.train.cross_engine.read",
    "fenwicks.train.cross_engine.restore_for_reading",
    "fenwicks.train.cross_engine.warm_start",
    "fenwicks.train.jax.checkpoints.LegacyReader",
    "fenwicks.train.jax.checkpoints.local_copy",
    "fenwicks.train.jax.checkpoints.snapshot",
    "fenwicks.train.jax.evaluation.JaxEvaluator",
    "fenwicks.train.jax.export.export_saved_model",
    "fenwicks.train.jax.inputs.TrainBatches",
    "fenwicks.train.jax.processes.AgreedStop",
    "fenwicks.train.jax.state.JaxRunState",
    "fenwicks.train.jax.trainer.JaxTrainer",
    "fenwicks.train.jax.warm_start.warm_start",
    "fenwicks.train.run_state.RunState",
    "fenwicks.train.save_policy.SavePolicy",
    "fenwicks.train.tf._model_fn",
    "fenwicks.train.tf.checkpoints.check_coverage",
    "fenwicks.train.tf.checkpoints.diagnose",
    "fenwicks.train.tf.checkpoints.read",
    "fenwicks.train.tf.checkpoints.warm_start",
    "fenwicks.train.tf.devices.strategy",
    "fenwicks.train.tf.legacy_reader.LegacyReader",
    "fenwicks.train.tf.evaluation.TFEvaluator",
    "fenwicks.train.tf.export.export_saved_model",
    "fenwicks.train.tf.input_fns",
    "fenwicks.train.tf.inputs.TFInputManager",
    "fenwicks.train.tf.loops.eval_step_fn",
    "fenwicks.train.tf.loops.predict_step_fn",
    "fenwicks.train.tf.loops.train_step_fn",
    "fenwicks.train.tf.model_fn_runner",
    "fenwicks.train.tf.state.TFRunState",
    "fenwicks.train.tf.tf1_config.RunConfig",
    "fenwicks.train.tf.tf1_config.TPUConfig",
    "fenwicks.train.tf.tf1_config.TPUEstimatorSpec",
    "fenwicks.train.tf.tf1_config.WarmStartSettings",
    "fenwicks.train.tf.tf1_variables",
    "fenwicks.train.tf.tpu_estimator",
    "fenwicks.train.tf.tpu_estimator.TPUEstimator",
    "fenwicks.train.tf.tpu_estimator.TPUEstimator.evaluate",
    "fenwicks.train.tf.tpu_estimator.TPUEstimator.export_saved_model",
    "fenwicks.train.tf.tpu_estimator.TPUEstimator.predict",
    "fenwicks.train.tf.tpu_estimator.TPUEstimator.train",
    "fenwicks.train.tf.trainer.Trainer",
}


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
              if name not in set(NEEDS) | FIGURES | SLOW | ALONE | NOT_YET)


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


def _run_in_a_process(names: list[str], tmp_path) -> dict[str, str]:
    from tests.conftest import run_python

    proc = run_python(f"NAMES = {names!r}\n" + SLOW_RUN,
                      env={"FENWICKS_ROOT": str(tmp_path / "root"), "TMPDIR": str(tmp_path),
                           "FENWICKS_DEVICE": None}, timeout=600)
    return __import__("json").loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_slow_examples_run_as_written_in_a_process_of_their_own(tmp_path):
    failed = _run_in_a_process(sorted(SLOW), tmp_path)
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
