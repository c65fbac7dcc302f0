"""One engine's work_dir on the other: both write the run format
(`fenwicks/train/run_format.py`), which either reads; `fenwicks/train/cross_engine.py`
matches variables by name for warm starts (and reads the formats before it:
tests/test_legacy_work_dirs.py). A run continuing on the other engine, exactly, is
tests/test_engine_switch.py.

Across real process boundaries, on the product's tutorial-1 network (narrow) and
scikit-learn's digits (`tests._cross_engine`), three processes in turn:

1. the TensorFlow engine trains ``tf/`` one epoch, evaluates and predicts;
2. the JAX engine (8 host devices) evaluates and predicts from ``tf/``, refuses a
   different model there, then warm-starts ``jax/`` from ``tf/``, trains it one epoch,
   evaluates and predicts, and last continues ``tf/``'s run by one step;
3. the TensorFlow engine does the same from ``jax/`` (warm-starting ``tf2/``), and
   follows ``jax/`` as its checkpoints are moved away and back.

Each reading process first builds a model of its own, so every name in the estimators'
models carries a ``_<n>`` suffix the writing process did not give it.

Tolerances: the reader runs the writer's float32 weights on the same examples; the two
engines differ only in their kernels (oneDNN's convolutions against XLA's), whose
summation order changes the last bits of each float32 result (relative 6e-8 per rounding,
some hundred roundings deep here), so probabilities agree to 1e-5 and the mean loss to a
relative 1e-5. An example whose top two classes are within that of each other could flip
its prediction, so accuracies may differ by one example in 450.
"""

from __future__ import annotations

import textwrap
import types

import numpy as np
import pytest

from fenwicks.train import cross_engine
from tests.conftest import last_json, run_process

NUM_TEST = 450  # the digits' test split: 25% of 1,797, stratified
STEPS = 21  # one epoch, as tests._cross_engine trains
# The default engine, TensorFlow (no KERAS_BACKEND): these processes then fork from
# tests._zygote, which imported Fenwicks so; the JAX one from conftest's JAX server.
_TF = {"KERAS_BACKEND": None, "FENWICKS_ENGINE": None, "FENWICKS_DEVICE": None}
_JAX = {"KERAS_BACKEND": "jax", "FENWICKS_DEVICE": None,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8 "
                     "--xla_backend_optimization_level=0"}


def _child(env: dict, *args) -> dict:
    return last_json(run_process(["-m", "tests._cross_engine", *map(str, args)], env,
                                 timeout=900).stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cross_engine")
    trained = _child(_TF, "train", root / "tf")
    on_jax = _child(_JAX, "read", root / "tf", root / "jax")
    on_tf = _child(_TF, "read", root / "jax", root / "tf2")
    return root, trained, on_jax, on_tf


def _labels() -> np.ndarray:
    from fenwicks import demo

    return demo.load_digits()[3]


def _numpy_metrics(probs: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Accuracy and mean cross-entropy of class probabilities, in float64."""
    probs = probs.astype(np.float64)
    loss = -np.mean(np.log(probs[np.arange(len(labels)), labels]))
    return float(np.mean(np.argmax(probs, 1) == labels)), float(loss)


def _check_same_model(read: dict, written: dict, probs_read: np.ndarray,
                      probs_written: np.ndarray) -> None:
    assert read["rows"] == NUM_TEST
    assert read["eval"]["num_examples"] == NUM_TEST
    assert read["eval"]["global_step"] == written["eval"]["global_step"] == STEPS
    np.testing.assert_allclose(probs_read, probs_written, atol=1e-5)
    assert read["eval"]["loss"] == pytest.approx(written["eval"]["loss"], rel=1e-5)
    assert abs(read["eval"]["accuracy"] - written["eval"]["accuracy"]) <= 1 / NUM_TEST
    # Each engine's evaluate against numpy's count from its own predictions: the
    # evaluation reads the loaded weights as predict does.
    accuracy, loss = _numpy_metrics(probs_read, _labels())
    assert read["eval"]["accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert read["eval"]["loss"] == pytest.approx(loss, rel=1e-4)


def test_the_jax_engine_evaluates_and_predicts_a_tensorflow_work_dir(runs):
    root, trained, on_jax, _ = runs
    _check_same_model(on_jax["read"], trained, np.load(root / "tf" / "probs-jax.npy"),
                      np.load(root / "tf" / "probs-tensorflow.npy"))


def test_the_tensorflow_engine_evaluates_and_predicts_a_jax_work_dir(runs):
    root, _, on_jax, on_tf = runs
    _check_same_model(on_tf["read"], on_jax["warm"],
                      np.load(root / "jax" / "probs-tensorflow.npy"),
                      np.load(root / "jax" / "probs-jax.npy"))


def test_names_that_keras_made_unique_still_match(runs):
    _, _, on_jax, on_tf = runs
    # The writer's first model was mnist_net/conv_bn/conv2d; the reader's is not.
    for out in (on_jax, on_tf):
        assert out["paths"][0] != "mnist_net/conv_bn/conv2d/kernel"
        assert out["paths"][0].startswith("mnist_net/conv_bn_")


@pytest.mark.parametrize("side", ["on_jax", "on_tf"])
def test_training_on_the_other_engines_work_dir_continues_its_run(runs, side):
    root, _, on_jax, on_tf = runs
    out = {"on_jax": on_jax, "on_tf": on_tf}[side]
    work_dir = root / ("tf" if side == "on_jax" else "jax")
    assert out["train_error"] is None  # no CrossEngineTrainingError any more
    assert out["continued"] == {"step": STEPS + 1, "input_position": STEPS + 1,
                                "latest": f"{work_dir}/checkpoints/{STEPS + 1}"}
    assert out["files_kept"]  # reading it (and a refused model) changed nothing


def test_a_work_dir_read_from_the_other_engine_is_followed(runs):
    # Its checkpoints moved away: a fresh model (step 0); back: read again (step 21).
    assert runs[3]["followed_steps"] == [0, STEPS]


def test_a_different_model_on_the_other_engines_work_dir_is_named(runs):
    root, _, on_jax, on_tf = runs
    for out, work_dir in ((on_jax, root / "tf"), (on_tf, root / "jax")):
        message = out["other_model"]
        assert message.startswith(
            f"CheckpointMismatchError: checkpoint {work_dir}/checkpoints/{STEPS} was written "
            "by a different model: its trainable variables are 10")
        # c=8's first convolution in the checkpoint: 3x3, 1 channel in, 8 out; the
        # model's (c=16) 16 out
        assert "/kernel [3, 3, 1, 8]" in message
        assert "/kernel [3, 3, 1, 16]" in message
        assert "Use the model_func that wrote it" in message


def test_warm_start_from_the_other_engine(runs):
    _, trained, on_jax, on_tf = runs
    for out, source in ((on_jax, trained["eval"]), (on_tf, on_jax["warm"]["eval"])):
        report = out["warm_report"]
        assert report["not_loaded"] == [] and len(report["loaded"]) == 16
        before = out["warm_before_training"]  # the source's weights, at step 0
        assert before["global_step"] == 0
        assert before["loss"] == pytest.approx(source["loss"], rel=1e-5)
        after = out["warm"]["eval"]
        assert after["global_step"] == STEPS and after["loss"] < before["loss"]
    # Each wrote the run format, and only it, in its own new work_dir.
    for out in (on_jax, on_tf):
        assert {f.split("/")[:2] == ["checkpoints", str(STEPS)]
                for f in out["warm_files"]} == {True}
        assert f"checkpoints/{STEPS}/record/metadata" in out["warm_files"]


# --------------------------------------------------------------------------- matching


def _variables(*specs) -> list:
    return [types.SimpleNamespace(path=p, shape=s) for p, s in specs]


def _saved(*specs, in_model_order=False) -> cross_engine.SavedWeights:
    return cross_engine.SavedWeights("ckpt", "tf", 7, [p for p, _ in specs],
                                     [np.zeros(s) for _, s in specs], in_model_order)


def test_match_pairs_suffixed_names_in_creation_order():
    ours = _variables(("net_1/dense_4/kernel", (2, 3)), ("net_1/dense_5/kernel", (3, 4)),
                      ("net_1/dense_5/bias", (4,)))
    # Saved in another order, by a process whose counters stood elsewhere.
    theirs = _saved(("net/dense_1/bias", (4,)), ("net/dense_1/kernel", (3, 4)),
                    ("net/dense/kernel", (2, 3)))
    assert cross_engine.match(ours, theirs) == {0: 2, 1: 1, 2: 0}


def test_match_by_position_only_in_model_order_with_equal_shapes():
    ours = _variables(("a/x", (2,)), ("a/y", (3,)))
    renamed = [("b/p", (2,)), ("b/q", (3,))]
    assert cross_engine.match(ours, _saved(*renamed)) == {}  # names and no order
    assert cross_engine.match(ours, _saved(*renamed, in_model_order=True)) == {0: 0, 1: 1}
    reshaped = [("b/p", (2,)), ("b/q", (5,))]
    assert cross_engine.match(ours, _saved(*reshaped, in_model_order=True)) == {}


def test_a_changed_head_is_left_out_of_a_partial_match():
    ours = _variables(("m/dense/kernel", (2, 3)), ("m/head/kernel", (3, 10)))
    theirs = _saved(("m/dense/kernel", (2, 3)), ("m/head/kernel", (3, 5)))  # new head
    assert cross_engine.match(ours, theirs) == {0: 0}


def test_each_engine_finds_the_others_checkpoint_only_without_its_own(tmp_path):
    (tmp_path / "orbax" / "40").mkdir(parents=True)
    (tmp_path / "orbax" / "60.orbax-checkpoint-tmp-123").mkdir()  # a save cut short
    assert cross_engine.other_engines_checkpoint(str(tmp_path), "tf") == \
        f"{tmp_path}/orbax/40"
    assert cross_engine.other_engines_checkpoint(str(tmp_path), "jax") is None
    (tmp_path / "ckpt-30.index").write_bytes(b"")
    assert cross_engine.other_engines_checkpoint(str(tmp_path), "tf") is None
    empty = tmp_path / "empty"
    assert cross_engine.other_engines_checkpoint(str(empty), "tf") is None
    assert cross_engine.other_engines_checkpoint(str(empty), "jax") is None


def test_on_gcs_the_jax_engines_step_counts_once_its_marker_is_written(gcs_emulator):
    """On GCS nothing renames: the JAX engine uploads a step and writes the marker last,
    so a newer step without it (an upload cut short) is not the other engine's latest."""
    work_dir = gcs_emulator.unique_url("cross-engine-marker")
    code = textwrap.dedent(f"""
        import json, tensorflow as tf
        from fenwicks.train import cross_engine
        work = {work_dir!r}
        for name in ("orbax/40/_CHECKPOINT_METADATA", "orbax/40/commit_success.txt",
                     "orbax/60/_CHECKPOINT_METADATA"):
            with tf.io.gfile.GFile(f"{{work}}/{{name}}", "w") as f:
                f.write("{{}}")
        found = [cross_engine.other_engines_checkpoint(work, "tf")]
        with tf.io.gfile.GFile(f"{{work}}/orbax/60/commit_success.txt", "w") as f:
            f.write("done")
        found.append(cross_engine.other_engines_checkpoint(work, "tf"))
        print(json.dumps(found))
    """)
    assert gcs_emulator.run_json(code) == [f"{work_dir}/orbax/40", f"{work_dir}/orbax/60"]
