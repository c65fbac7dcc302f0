"""Issue 50, item 3: warm starts in a TPUEstimator program happen as TF1's did, or are
refused in one sentence before the first step.

TF1's rules: ``warm_start_from=<path>`` initialises every trainable variable from the
checkpoint tensor of its name; ``init_from_checkpoint`` raises for a map entry whose
shapes differ; a ``Scaffold(init_fn=...)`` ran in the session, which TensorFlow 2 has not
(refused). The numbers are the checkpoint's own, pushed through the layer in NumPy.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks.train.tf.assignment_map import WarmStartError
from fenwicks.train.tf.tf1_config import ModelFnError
from tests.conftest import run_json

v1 = tf.compat.v1
X = np.random.default_rng(3).normal(size=(8, 3)).astype(np.float32)


def _tf1_checkpoint(prefix: str, tensors: dict) -> str:
    """A checkpoint as TF1's Saver wrote one: tensors under their TF1 names."""
    names = sorted(tensors)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[tf.constant(tensors[n]) for n in names])
    return prefix


def _saved():
    rng = np.random.default_rng(7)
    return {"dense/kernel": rng.normal(size=(3, 2)).astype(np.float32),
            "dense/bias": rng.normal(size=(2,)).astype(np.float32),
            "global_step": np.int64(1000)}


def _model_fn(features, labels, mode, params):
    logits = keras.layers.Dense(2, name="dense")(features)
    if params.get("init_map"):
        v1.train.init_from_checkpoint(params["ckpt"], params["init_map"])
    scaffold_fn = None
    if params.get("scaffold_init_fn"):
        def scaffold_fn():
            return v1.train.Scaffold(init_fn=lambda scaffold, session: None)
    if mode == fw.train.ModeKeys.PREDICT:
        return fw.train.TPUEstimatorSpec(mode, predictions=logits, scaffold_fn=scaffold_fn)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return fw.train.TPUEstimatorSpec(mode, loss=loss, scaffold_fn=scaffold_fn,
                                     train_op=v1.train.GradientDescentOptimizer(0.1).minimize(
                                         loss, v1.train.get_or_create_global_step()))


def _predict(est):
    return np.array(list(est.predict(
        lambda params: tf.data.Dataset.from_tensor_slices(X).batch(params["batch_size"]))))


def warm_started_predictions(root: str) -> dict:
    """Predictions of a fresh model_dir warm-started from a TF1 checkpoint, both ways."""
    saved = _saved()
    ckpt = _tf1_checkpoint(os.path.join(root, "tf1", "model.ckpt"), saved)
    by_path = fw.train.TPUEstimator(_model_fn, model_dir=os.path.join(root, "a"),
                                    warm_start_from=ckpt, predict_batch_size=8, verbose=False)
    from_path = _predict(by_path)
    report = by_path.warm_start_report
    by_path.close()
    by_map = fw.train.TPUEstimator(_model_fn, model_dir=os.path.join(root, "b"),
                                   predict_batch_size=8, verbose=False,
                                   params={"ckpt": ckpt,
                                           "init_map": {"dense/": "dense/"}})
    from_map = _predict(by_map)
    by_map.close()
    return {"from_path": from_path.tolist(), "from_map": from_map.tolist(),
            "loaded": sorted(report["loaded"])}


def _expected():
    saved = _saved()
    return X @ saved["dense/kernel"] + saved["dense/bias"]


@pytest.mark.slow  # compiles a model_fn's steps (over ~1 s)
def test_a_tf1_checkpoint_warm_starts_by_tf1_name(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="fenwicks"):
        out = warm_started_predictions(str(tmp_path))
    # Warm-started both ways, so predict does not call the weights a random initialisation.
    assert "never trained" not in caplog.text
    assert out["loaded"] == ["dense/bias", "dense/kernel"]
    np.testing.assert_allclose(out["from_path"], _expected(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["from_map"], _expected(), rtol=1e-5, atol=1e-6)


def test_a_tf1_checkpoint_warm_starts_on_8_replicas(tmp_path):
    out = run_json(f"""
        import json
        import fenwicks as fw
        from tests import test_tpu_estimator_warm_start as t
        assert fw.accel.current().num_replicas == 8
        print(json.dumps(t.warm_started_predictions({str(tmp_path)!r})))
    """, env={"FENWICKS_DEVICE": "cpu:8"})
    np.testing.assert_allclose(out["from_path"], _expected(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["from_map"], _expected(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # compiles a model_fn's steps (over ~1 s)
def test_a_shape_mismatch_in_the_map_raises_as_tf1_did(tmp_path):
    ckpt = _tf1_checkpoint(str(tmp_path / "tf1" / "model.ckpt"),
                           {"old/kernel": np.ones((4, 2), np.float32)})
    est = fw.train.TPUEstimator(_model_fn, model_dir=str(tmp_path / "m"), verbose=False,
                                predict_batch_size=8,
                                params={"ckpt": ckpt, "init_map": {"old/kernel": "dense/kernel"}})
    with pytest.raises(WarmStartError) as err:
        _predict(est)
    message = str(err.value)
    assert "'old/kernel' (shape [4, 2] in the checkpoint) to 'dense/kernel' (shape [3, 2]" \
        in message and "TF1's init_from_checkpoint refused too" in message
    assert not os.path.exists(tmp_path / "m" / "checkpoints")  # before any step


@pytest.mark.slow  # compiles a model_fn's steps (over ~1 s)
def test_a_scaffold_init_fn_is_refused_in_one_sentence(tmp_path):
    est = fw.train.TPUEstimator(_model_fn, model_dir=str(tmp_path), verbose=False,
                                train_batch_size=8, params={"scaffold_init_fn": True})
    with pytest.raises(ModelFnError) as err:
        est.train(lambda params: tf.data.Dataset.from_tensor_slices(
            (X, np.zeros(8, np.int32))).batch(params["batch_size"], drop_remainder=True).repeat(),
            max_steps=1)
    assert str(err.value).startswith(
        "scaffold_fn returned tf.compat.v1.train.Scaffold(init_fn=...), which TF1 ran")
    assert "init_from_checkpoint(ckpt, assignment_map)" in str(err.value)


def test_a_warm_start_path_with_no_checkpoint_is_one_sentence_at_construction(tmp_path):
    missing = str(tmp_path / "no_such_dir")
    with pytest.raises(WarmStartError) as err:
        fw.train.TPUEstimator(_model_fn, model_dir=str(tmp_path / "m"), warm_start_from=missing)
    assert str(err.value).startswith(f"warm_start_from={missing!r} holds no checkpoint")
    with pytest.raises(WarmStartError, match="ckpt_to_initialize_from"):
        fw.train.TPUEstimator(_model_fn, model_dir=str(tmp_path / "m"),
                              warm_start_from=fw.train.WarmStartSettings(missing))


# ------------------------------------------- a Fenwicks run as a TF1 checkpoint, by TF1 name

Y = (X[:, 0] > 0).astype(np.int32)
# The scoped model's variables by TF1 name, in Keras's order (layers as made; kernel, bias).
SCOPED = [("enc/dense/kernel", [3, 4]), ("enc/dense/bias", [4]), ("head/kernel", [4, 2]),
          ("head/bias", [2])]


def _scoped_model_fn(features, labels, mode, params):
    with v1.variable_scope("enc"):
        hidden = keras.layers.Dense(4, name="dense")(features)
    logits = keras.layers.Dense(2, name="head")(hidden)
    if "list" in params:  # what a program sees of the checkpoint (BERT lists it so)
        params["listed"].extend(v1.train.list_variables(source) for source in params["list"])
    if "init_map" in params:
        v1.train.init_from_checkpoint(params["ckpt"], params["init_map"])
    if mode == fw.train.ModeKeys.PREDICT:
        return fw.train.TPUEstimatorSpec(mode, predictions=logits)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return fw.train.TPUEstimatorSpec(mode, loss=loss, train_op=v1.train.GradientDescentOptimizer(
        0.5).minimize(loss, v1.train.get_or_create_global_step()))


def _orbax_arrays(step_dir: str) -> dict:
    """A run-format step's arrays read with orbax alone (not Fenwicks' reader)."""
    import orbax.checkpoint as ocp

    restored = ocp.StandardCheckpointer().restore(os.path.join(os.path.abspath(step_dir),
                                                               "state"))
    return {group: [np.asarray(a) for a in arrays] for group, arrays in restored.items()}


@pytest.fixture(scope="module")
def scoped_run(tmp_path_factory) -> str:
    """The step a TPUEstimator run of _scoped_model_fn wrote after 2 steps."""
    model_dir = str(tmp_path_factory.mktemp("scoped") / "pretrain")
    est = fw.train.TPUEstimator(_scoped_model_fn, model_dir=model_dir, train_batch_size=8,
                                verbose=False)
    est.train(lambda params: tf.data.Dataset.from_tensor_slices((X, Y)).batch(
        params["batch_size"], drop_remainder=True).repeat(), max_steps=2)
    est.close()
    return os.path.join(model_dir, "checkpoints", "2")


@pytest.mark.slow  # compiles a model_fn's steps (over ~1 s)
def test_a_fenwicks_run_is_listed_and_warm_starts_by_tf1_name(tmp_path, scoped_run):
    step = scoped_run
    saved = dict(zip([name for name, _ in SCOPED], _orbax_arrays(step)["trainable"],
                     strict=True))
    assert [list(a.shape) for a in saved.values()] == [shape for _, shape in SCOPED]
    work_dir = os.path.dirname(os.path.dirname(step))
    listed: list = []
    # init_from_checkpoint(<work_dir>, {'enc/': 'enc/'}): the scope only, by TF1 name.
    est = fw.train.TPUEstimator(_scoped_model_fn, model_dir=str(tmp_path / "a"),
                                predict_batch_size=8, verbose=False, params={
                                    "list": [work_dir, work_dir + "/checkpoints", step],
                                    "listed": listed, "ckpt": work_dir,
                                    "init_map": {"enc/": "enc/"}})
    _predict(est)
    # tf.train.list_variables, as the model_fn saw it: TF1 names and shapes, sorted, for
    # the work_dir, its checkpoints folder and the step alike.
    assert listed and all(entry == sorted(SCOPED) for entry in listed)
    assert sorted(est.warm_start_report["loaded"]) == ["enc/dense/bias", "enc/dense/kernel"]
    values = {v.fenwicks_v1_name: v.numpy() for v in est.estimator.model.variables}
    for name in ("enc/dense/kernel", "enc/dense/bias"):
        np.testing.assert_array_equal(values[name], saved[name])
    assert not np.array_equal(values["head/kernel"], saved["head/kernel"])  # not mapped
    est.close()
    # warm_start_from=<work_dir>: every trainable variable by its TF1 name, as TF1's.
    warm = fw.train.TPUEstimator(_scoped_model_fn, model_dir=str(tmp_path / "b"),
                                 predict_batch_size=8, verbose=False, warm_start_from=work_dir)
    logits = _predict(warm)
    assert sorted(warm.warm_start_report["loaded"]) == sorted(n for n, _ in SCOPED)
    hidden = X @ saved["enc/dense/kernel"] + saved["enc/dense/bias"]
    np.testing.assert_allclose(logits, hidden @ saved["head/kernel"] + saved["head/bias"],
                               rtol=1e-5, atol=1e-6)
    warm.close()


def _without_tf1_names(step: str, work_dir: str) -> str:
    """A copy of `step` whose run record lacks tf1_names: a step as Fenwicks wrote it
    before it recorded them, and as a Keras model_func's run still is."""
    import json
    import shutil

    copy = os.path.join(work_dir, "checkpoints", os.path.basename(step))
    shutil.copytree(step, copy)
    path = os.path.join(copy, "record", "metadata")
    with open(path) as f:
        record = json.load(f)
    del record["tf1_names"]
    with open(path, "w") as f:
        json.dump(record, f)
    return copy


@pytest.mark.slow  # compiles a model_fn's steps (over ~1 s)
def test_a_step_without_tf1_names_is_listed_by_keras_path_and_says_what_to_pass(tmp_path,
                                                                              scoped_run):
    old = _without_tf1_names(scoped_run, str(tmp_path / "old"))
    listed: list = []
    est = fw.train.TPUEstimator(_scoped_model_fn, model_dir=str(tmp_path / "a"),
                                predict_batch_size=8, verbose=False, params={
                                    "list": [str(tmp_path / "old")], "listed": listed,
                                    "ckpt": str(tmp_path / "old"),
                                    "init_map": {"enc/dense/kernel": "enc/dense/kernel"}})
    with pytest.raises(WarmStartError) as err:
        _predict(est)
    # Still readable: its arrays by Keras path (the enc scope is not in a Keras path).
    assert listed[0] == sorted([("dense/bias", [4]), ("dense/kernel", [3, 4]),
                                ("head/bias", [2]), ("head/kernel", [4, 2])])
    message = str(err.value)
    assert message.startswith(f"the warm start from {str(tmp_path / 'old')!r} maps "
                              "'enc/dense/kernel' to 'enc/dense/kernel', but the checkpoint "
                              "holds no 'enc/dense/kernel'")
    assert "holds no TF1 names (a Keras model_func's, or one written before Fenwicks " \
        "recorded them), only Keras paths, so pass it as TPUEstimator(warm_start_from=...)" \
        in message
    assert message.count(". ") == 0  # one sentence
    est.close()
    # What the sentence says to pass: the engine's warm start, by Keras path and shape.
    warm = fw.train.TPUEstimator(_scoped_model_fn, model_dir=str(tmp_path / "b"),
                                 predict_batch_size=8, verbose=False, warm_start_from=old)
    _predict(warm)
    assert len(warm.estimator.warm_start_report["loaded"]) == 4
    warm.close()


@pytest.mark.slow  # compiles a model_fn's steps (over ~1 s)
def test_a_mapped_variable_missing_from_the_checkpoint_raises_as_tf1_did(tmp_path):
    """TF1's init_from_checkpoint raised ValueError("Tensor dense/bias is not found in
    <ckpt> checkpoint ..."); Fenwicks loaded the rest and warned."""
    ckpt = _tf1_checkpoint(str(tmp_path / "tf1" / "model.ckpt"),
                           {"dense/kernel": np.ones((3, 2), np.float32)})
    est = fw.train.TPUEstimator(_model_fn, model_dir=str(tmp_path / "m"), verbose=False,
                                predict_batch_size=8,
                                params={"ckpt": ckpt, "init_map": {"dense/": "dense/"}})
    with pytest.raises(ValueError) as err:  # WarmStartError, a ValueError as TF1's was
        _predict(est)
    assert isinstance(err.value, WarmStartError)
    assert str(err.value) == (
        f"the warm start from {ckpt!r} maps 'dense/bias' to 'dense/bias', but the "
        f"checkpoint holds no 'dense/bias', and TF1's "
        f"init_from_checkpoint refused that too (\"Tensor dense/bias is not found in "
        f"{ckpt} checkpoint\"): map 'dense/bias' to one of the checkpoint's names "
        "(tf.compat.v1.train.list_variables lists them), or leave it out of the "
        "assignment map")
    assert not os.path.exists(tmp_path / "m" / "checkpoints")  # before any step


@pytest.mark.slow  # two BERT runs (a compiled training each)
def test_bert_run_classifier_fine_tunes_from_a_checkpoint_fenwicks_wrote(tmp_path):
    """BERT's run_classifier as written (tests/_bert_*_port.py) with --init_checkpoint=
    <the output_dir of an earlier Fenwicks run of it>: get_assignment_map_from_checkpoint
    lists it (tf.train.list_variables) and maps every variable by its TF1 name, as it
    does a Google checkpoint; it failed with WarmStartError ("object-based")."""
    from tests import _bert_data as bert
    from tests import _bert_modeling_port as modeling
    from tests import _bert_run_classifier_port as run_classifier

    train_file = str(tmp_path / "train.tf_record")
    bert.write_records(train_file, 64, 0, seed=1)
    train_input_fn = run_classifier.file_based_input_fn_builder(
        input_file=train_file, seq_length=bert.SEQ, is_training=True, drop_remainder=True)

    def estimator(output_dir, init_checkpoint):  # main()'s, as written from here
        bert_config = modeling.BertConfig.from_dict(bert.BERT_CONFIG)
        is_per_host = fw.train.InputPipelineConfig.PER_HOST_V2
        run_config = fw.train.RunConfig(
            cluster=None, master=None, model_dir=output_dir, save_checkpoints_steps=5,
            tpu_config=fw.train.TPUConfig(iterations_per_loop=5, num_shards=8,
                                          per_host_input_for_training=is_per_host))
        model_fn = run_classifier.model_fn_builder(
            bert_config=bert_config, num_labels=3, init_checkpoint=init_checkpoint,
            learning_rate=1e-2, num_train_steps=5, num_warmup_steps=1, use_tpu=True,
            use_one_hot_embeddings=True)
        return fw.train.TPUEstimator(
            use_tpu=True, model_fn=model_fn, config=run_config, train_batch_size=16,
            eval_batch_size=8, predict_batch_size=8)

    # The "pretrained" model: 5 steps of the same model_fn from a random initialisation.
    pretrain_dir = str(tmp_path / "pretrain")
    first = estimator(pretrain_dir, None)
    first.train(input_fn=train_input_fn, max_steps=5)
    trained = [(v.fenwicks_v1_name, v.numpy()) for v in
               first.estimator.model.trainable_variables]
    first.close()
    names = [name for name, _ in trained]
    expected = {n for n in bert.checkpoint_shapes(bert.BERT_CONFIG) if n.startswith("bert/")}
    assert set(names) == expected | {"output_weights", "output_bias"}
    # The step read with orbax alone, paired with the variables by the run format's order
    # (model.trainable_variables'), not by the record's names.
    source = dict(zip(names, _orbax_arrays(os.path.join(pretrain_dir, "checkpoints",
                                                        "5"))["trainable"], strict=True))
    for name, value in trained:
        np.testing.assert_array_equal(source[name], value)

    class AtStart(keras.callbacks.Callback):  # the weights before the first step
        def on_train_begin(self, logs=None):
            self.values = {getattr(v, "fenwicks_v1_name", v.path): v.numpy()
                           for v in self.model.trainable_variables}

    output_dir = str(tmp_path / "output")
    second, at_start = estimator(output_dir, pretrain_dir), AtStart()
    second.train(input_fn=train_input_fn, max_steps=5, callbacks=[at_start])
    assert sorted(second.warm_start_report["loaded"]) == sorted(names)  # every variable
    for name in names:
        np.testing.assert_array_equal(at_start.values[name], source[name])
    # Training went on from there: 5 more steps, written, and the weights moved.
    finetuned = _orbax_arrays(os.path.join(output_dir, "checkpoints", "5"))["trainable"]
    moved = [np.abs(a - source[n]).max() for n, a in zip(names, finetuned, strict=True)]
    assert max(moved) > 1e-3 and all(np.isfinite(a).all() for a in finetuned)
    second.close()
