"""TPUEstimator programs port to `fw.train.TPUEstimator` as written.

Three public programs run from their own sources (Apache-2.0, copied into
tests/_*_port.py with attribution, every changed line marked): tensorflow/tpu
models/official/mnist/mnist_tpu.py; tensorflow/tpu models/official/squeezenet
(data_pipeline.py with its InputReader, squeezenet_model.py); google-research/bert
run_classifier.py with optimization.py and modeling.py. Each port counts its forced
edits (the lines Fenwicks makes a user change: none now) apart from TensorFlow 2's own
removals (``tf.estimator``, ``tf.contrib``, ``tf.layers``) and the offline stand-in data.

Every number checked is derived independently: from the predictions with NumPy, from
TF1's definitions (recall_at_k's tie rule), or from the update rule by hand.
"""

from __future__ import annotations

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from tests._bert_data import BERT_CONFIG, SEQ
from tests._bert_data import checkpoint_shapes as _bert_checkpoint_shapes
from tests._bert_data import write_name_based_checkpoint as _write_name_based_checkpoint
from tests._bert_data import write_records as _bert_records
from tests.conftest import run_json

v1 = tf.compat.v1  # the programs' `import tensorflow.compat.v1 as tf`


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    data = load_digits()
    images = (data.images * 16).astype(np.float32).reshape(-1, 8, 8, 1)  # 0..255 as MNIST
    return images[:480], data.target[:480].astype(np.int64)


def _softmax(logits):
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


# ----------------------------------------------------------------------------- mnist_tpu.py
# tensorflow/tpu models/official/mnist/mnist_tpu.py (Apache-2.0), commit 7dc921f8, as written:
# metric_fn, model_fn, dataset, the three input_fns and main()'s estimator calls.
# Forced edits (Fenwicks): 0.
# TensorFlow 2 removals (not counted): tf_estimator.tpu.{TPUEstimatorSpec, RunConfig,
#   TPUConfig, TPUEstimator} and tf_estimator.ModeKeys -> fw.train.* (same arguments);
#   tf.layers.* -> keras.layers.* (7 lines); the TPUClusterResolver line dropped
#   (fw.accel finds the device). FLAGS are a namespace of the flags' values.
# Stand-in data: scikit-learn's 8x8 digits, scaled to 24x24 and padded to MNIST's 28x28,
#   written as the program's TFRecords (image_raw, label).
# The port is tests/_mnist_tpu_port.py.

def _mnist_records(data_dir, images, labels):
    """The program's TFRecords: 8x8 digits scaled to 24x24, padded to 28x28."""
    big = np.pad(np.kron(images[..., 0], np.ones((3, 3))), ((0, 0), (2, 2), (2, 2)))
    big = np.minimum(big, 255)  # 16 x 16 = 256 would wrap around in uint8
    splits = {"train": slice(0, 384), "validation": slice(384, 474), "test": slice(384, 394)}
    for split, rows in splits.items():
        with tf.io.TFRecordWriter(os.path.join(data_dir, f"{split}.tfrecords")) as writer:
            for image, label in zip(big[rows], labels[rows], strict=True):
                feature = {"image_raw": tf.train.Feature(bytes_list=tf.train.BytesList(
                               value=[image.astype(np.uint8).tobytes()])),
                           "label": tf.train.Feature(int64_list=tf.train.Int64List(
                               value=[int(label)]))}
                writer.write(tf.train.Example(features=tf.train.Features(
                    feature=feature)).SerializeToString())
    return big.reshape(-1, 28, 28, 1).astype(np.float32)


@pytest.mark.slow  # among the fast subset's longest (several compiled runs)
def test_mnist_tpu_as_written_trains_evaluates_exactly_predicts_and_resumes(
        tmp_path, digits, monkeypatch):
    from tests._mnist_tpu_port import FLAGS, dataset, eval_input_fn, main, train_input_fn

    images = _mnist_records(str(tmp_path), *digits)
    monkeypatch.setattr(FLAGS, "data_dir", str(tmp_path))
    monkeypatch.setattr(FLAGS, "model_dir", str(tmp_path / "model"))
    estimator = main(None)
    # Beyond main(): every validation example (no steps), and their predictions.
    result = estimator.evaluate(input_fn=eval_input_fn)
    preds = list(estimator.predict(input_fn=lambda params: dataset(
        os.path.join(params["data_dir"], "validation.tfrecords")).batch(params["batch_size"])))
    assert len(preds) == 90 and set(preds[0]) == {"class_ids", "probabilities"}
    class_ids = np.array([p["class_ids"] for p in preds])
    probs = np.stack([p["probabilities"] for p in preds])
    y = digits[1][384:474]
    assert np.array_equal(class_ids, probs.argmax(1))
    # drop_remainder=True in eval_input_fn: 2 whole batches of 32, as TPUEstimator read.
    assert result["global_step"] == 40 and result["num_examples"] == 64
    assert result["accuracy"] == pytest.approx(np.mean(class_ids[:64] == y[:64]), abs=1e-6)
    cross_entropy = -np.mean(np.log(probs[np.arange(64), y[:64]]))
    assert result["loss"] == pytest.approx(cross_entropy, rel=1e-4)
    assert result["loss"] < np.log(10) - 0.3  # below a uniform guess's: it learned
    loaded = tf.saved_model.load(estimator.export_saved_model(str(tmp_path / "export")))
    served = loaded.serve(images[384:390])
    np.testing.assert_allclose(served["probabilities"], probs[:6], rtol=1e-5, atol=1e-5)
    estimator.close()

    # main() again on the model_dir: train(max_steps=40) has nothing left to do, and a
    # further train(steps=20) resumes at 40.
    again = main(None)
    assert again.evaluate(input_fn=eval_input_fn)["accuracy"] == pytest.approx(
        result["accuracy"])
    again.train(input_fn=train_input_fn, steps=20)
    assert again.evaluate(input_fn=eval_input_fn)["global_step"] == 60
    again.close()


# ------------------------------------------------------------ the TF1 optimizer conversion


def _linear_model_fn(optimizer_name):
    def model_fn(features, labels, mode, params):
        dense = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
        outputs = dense(features)
        if mode == fw.train.ModeKeys.PREDICT:
            return fw.train.TPUEstimatorSpec(mode, predictions=outputs)
        loss = v1.losses.mean_squared_error(labels, outputs)
        step = v1.train.get_global_step()
        if optimizer_name == "sgd":
            lr = v1.train.exponential_decay(0.1, step, decay_steps=1, decay_rate=0.5)
            optimizer = v1.train.GradientDescentOptimizer(lr)
        elif optimizer_name == "adam":  # TF1 Adam keeps its rate as _lr (issue 47, item 7)
            optimizer = v1.train.AdamOptimizer(0.1, beta1=0.8, epsilon=1e-3)
        else:
            optimizer = v1.train.MomentumOptimizer(0.1, momentum=0.9)
        return fw.train.TPUEstimatorSpec(mode, loss=loss,
                                         train_op=optimizer.minimize(loss, step))
    return model_fn


def _linear_weights_after_three_steps(model_dir, optimizer_name):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    y = rng.normal(size=(8, 1)).astype(np.float32)
    est = fw.train.TPUEstimator(_linear_model_fn(optimizer_name), model_dir=model_dir,
                                train_batch_size=8, verbose=False,
                                config=fw.train.RunConfig(tpu_config=fw.train.TPUConfig(1)))
    est.train(lambda params: tf.data.Dataset.from_tensor_slices((x, y)).batch(
        params["batch_size"], drop_remainder=True).repeat(), max_steps=3)
    est.close()
    # Predict only, in a new estimator: the model_dir's checkpoint holds the optimizer's
    # slots (momentum, Adam's m and v) though PREDICT never makes an optimizer (item 8).
    est = fw.train.TPUEstimator(_linear_model_fn(optimizer_name), model_dir=model_dir,
                                train_batch_size=8, verbose=False)
    weights = np.array(list(est.predict(
        lambda params: tf.data.Dataset.from_tensor_slices(np.eye(3, dtype=np.float32)).batch(
            params["batch_size"]))))
    est.close()
    return x, y, weights.reshape(3, 1)


def _update_rule(x, y, optimizer_name):
    w, velocity = np.zeros((3, 1)), np.zeros((3, 1))
    m, v = np.zeros((3, 1)), np.zeros((3, 1))
    for step in range(3):
        grad = 2 / 8 * x.T @ (x @ w - y)  # d/dw mean((xw - y)^2)
        if optimizer_name == "sgd":  # exponential_decay at the step's global step
            w = w - 0.1 * 0.5 ** step * grad
        elif optimizer_name == "adam":  # TF1's AdamOptimizer, its docstring's epsilon-hat form
            t = step + 1
            m = 0.8 * m + 0.2 * grad
            v = 0.999 * v + 0.001 * grad ** 2
            w = w - 0.1 * np.sqrt(1 - 0.999 ** t) / (1 - 0.8 ** t) * m / (np.sqrt(v) + 1e-3)
        else:  # TF1 momentum: accumulate, then step by lr * accumulator
            velocity = 0.9 * velocity + grad
            w = w - 0.1 * velocity
    return w


@pytest.mark.parametrize("optimizer_name", ["sgd", "momentum", "adam"])
def test_tf1_optimizers_make_the_updates_of_their_update_rules(tmp_path, optimizer_name):
    x, y, weights = _linear_weights_after_three_steps(str(tmp_path), optimizer_name)
    np.testing.assert_allclose(weights, _update_rule(x, y, optimizer_name), rtol=1e-5,
                               atol=1e-6)


def test_ports_on_two_replicas(tmp_path):
    """On 2 replicas: the rate computed in the model_fn is set on every replica (the
    batch of 8 split 4 + 4), so the update is the single-device one; the BERT and
    squeezenet ports pass their own checks (run in the same process, to start one)."""
    out = run_json(f"""
        import json, pathlib
        import fenwicks as fw
        assert fw.accel.current().num_replicas == 2
        from tests import test_tpu_estimator as t
        x, y, w = t._linear_weights_after_three_steps({str(tmp_path / "linear")!r}, "sgd")
        for name in ("bert", "squeezenet"):
            (pathlib.Path({str(tmp_path)!r}) / name).mkdir()
        t.test_bert_run_classifier_as_written_warm_starts_trains_and_evaluates_real_examples(
            pathlib.Path({str(tmp_path / "bert")!r}))
        t.test_squeezenet_port_params_schedules_and_recall_at_k(
            pathlib.Path({str(tmp_path / "squeezenet")!r}))
        print(json.dumps({{"w": w.tolist(), "x": x.tolist(), "y": y.tolist()}}))
    """, env={"FENWICKS_DEVICE": "cpu:2"})
    expected = _update_rule(np.array(out["x"]), np.array(out["y"]), "sgd")
    np.testing.assert_allclose(np.array(out["w"]), expected, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------ run_classifier.py
# google-research/bert run_classifier.py, optimization.py and modeling.py as written
# (tests/_bert_*_port.py), with main()'s estimator calls below.
# Forced edits (Fenwicks): 0. optimization.create_optimizer's AdamWeightDecayOptimizer
#   runs as written; modeling.get_assignment_map_from_checkpoint finds the checkpoint's
#   TF1 names (tf.trainable_variables() gives each variable its TF1 name).
# TensorFlow 2 removals (not counted): `import tensorflow.compat.v1 as tf` in the three
#   files; tf.layers.dense -> a Keras Dense of the same name (7 lines) and
#   tf.contrib.layers.layer_norm -> keras.layers.LayerNormalization (modeling.py);
#   tf.contrib.tpu.* / tf.estimator.ModeKeys -> fw.train.*; tf.contrib.data.map_and_batch ->
#   tf.data.experimental.map_and_batch; shape[-1].value -> shape[-1]; the
#   TPUClusterResolver line dropped (fw.accel finds the device).
# Stand-in data: random token ids written as TFRecords (PaddingInputExamples included),
#   and a "pretrained" checkpoint of random values under BERT's TF1 names.



@pytest.mark.slow  # among the fast subset's longest (several compiled runs)
def test_bert_run_classifier_as_written_warm_starts_trains_and_evaluates_real_examples(
        tmp_path):
    from tests import _bert_modeling_port as modeling
    from tests import _bert_run_classifier_port as run_classifier

    rng = np.random.default_rng(7)
    pretrained = {name: rng.normal(size=shape).astype(np.float32) * 0.1
                  + (1.0 if name.endswith("gamma") else 0.0)  # LayerNorm scales near 1
                  for name, shape in _bert_checkpoint_shapes(BERT_CONFIG).items()}
    init_checkpoint = _write_name_based_checkpoint(str(tmp_path / "bert_model.ckpt"),
                                                   pretrained)
    train_file, eval_file = str(tmp_path / "train.tf_record"), str(tmp_path / "eval.tf_record")
    _bert_records(train_file, 64, 0, seed=1)
    ids, labels, real = _bert_records(eval_file, 21, 3, seed=2)  # padded to 24 = 3 x 8
    output_dir = str(tmp_path / "output")
    train_batch_size, eval_batch_size, predict_batch_size = 16, 8, 8
    num_train_steps, num_warmup_steps = 40, 4

    def estimator():  # main()'s, as written from here
        bert_config = modeling.BertConfig.from_dict(BERT_CONFIG)
        is_per_host = fw.train.InputPipelineConfig.PER_HOST_V2
        run_config = fw.train.RunConfig(
            cluster=None, master=None, model_dir=output_dir, save_checkpoints_steps=10,
            tpu_config=fw.train.TPUConfig(iterations_per_loop=5, num_shards=8,
                                          per_host_input_for_training=is_per_host))
        model_fn = run_classifier.model_fn_builder(
            bert_config=bert_config, num_labels=3, init_checkpoint=init_checkpoint,
            learning_rate=1e-2, num_train_steps=num_train_steps,
            num_warmup_steps=num_warmup_steps, use_tpu=True, use_one_hot_embeddings=True)
        return fw.train.TPUEstimator(
            use_tpu=True, model_fn=model_fn, config=run_config,
            train_batch_size=train_batch_size, eval_batch_size=eval_batch_size,
            predict_batch_size=predict_batch_size)

    est = estimator()
    eval_input_fn = run_classifier.file_based_input_fn_builder(
        input_file=eval_file, seq_length=SEQ, is_training=False, drop_remainder=True)
    before = est.evaluate(input_fn=eval_input_fn, steps=24 // eval_batch_size)
    # get_assignment_map_from_checkpoint, as written, mapped every encoder variable.
    loaded = est.warm_start_report["loaded"]
    assert sorted(loaded) == sorted(k for k in pretrained if k.startswith("bert/"))
    variables = {getattr(v, "fenwicks_v1_name", v.path): v.numpy()
                 for v in est.estimator.model.variables}
    for name in ("bert/embeddings/word_embeddings",
                 "bert/encoder/layer_1/attention/self/query/kernel",
                 "bert/encoder/layer_0/output/LayerNorm/gamma"):
        np.testing.assert_array_equal(variables[name], pretrained[name])
    assert variables["output_weights"].shape == (3, 8)  # tf.get_variable's output head
    assert before["global_step"] == 0

    train_input_fn = run_classifier.file_based_input_fn_builder(
        input_file=train_file, seq_length=SEQ, is_training=True, drop_remainder=True)
    est.train(input_fn=train_input_fn, max_steps=num_train_steps)
    result = est.evaluate(input_fn=eval_input_fn, steps=24 // eval_batch_size)
    predict_input_fn = run_classifier.file_based_input_fn_builder(
        input_file=eval_file, seq_length=SEQ, is_training=False, drop_remainder=True)
    probs = np.stack([p["probabilities"] for p in est.predict(input_fn=predict_input_fn)])
    est.close()

    assert probs.shape == (24, 3)
    keep = real == 1
    accuracy = np.mean(probs[keep].argmax(1) == labels[keep])
    cross_entropy = -np.mean(np.log(probs[keep][np.arange(21), labels[keep]]))
    assert result["eval_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert result["eval_loss"] == pytest.approx(cross_entropy, rel=1e-4)
    assert result["global_step"] == num_train_steps
    assert before["eval_loss"] > 1.0  # about ln 3: three classes, not yet learned
    assert result["eval_loss"] < 0.5  # it learned (0.004-0.03 in 11 runs on 1 and 2 replicas)
    from fenwicks.train import run_format

    assert run_format.latest(output_dir) == os.path.join(output_dir, "checkpoints", "40")

    # Resumed from the output dir: the checkpoint is restored; the warm start is not
    # applied over it, and the report says so (it said "loaded 39" before).
    again = estimator()
    assert again.evaluate(input_fn=eval_input_fn, steps=3)["eval_accuracy"] == \
        pytest.approx(accuracy)
    assert again.warm_start_report["loaded"] == []
    assert again.warm_start_report["restored_instead"][0].startswith(output_dir)
    again.close()

    # Predicting only, in a new estimator: the checkpoint's AdamWeightDecayOptimizer
    # slots are matched, though predict never asks the model_fn for a train_op.
    fresh = estimator()
    fresh_probs = np.stack([p["probabilities"] for p in fresh.predict(predict_input_fn)])
    fresh.close()
    np.testing.assert_allclose(fresh_probs, probs, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- squeezenet_main.py
# Port of tensorflow/tpu models/official/squeezenet (squeezenet_main.py's estimator and
# input setup, squeezenet_model.py's model_fn and metric_fn), narrowed to 8x8 images.
# Forced edits (Fenwicks): 0.
# TensorFlow 2 removals (not counted): tf.layers.conv2d / max_pooling2d / dropout /
#   average_pooling2d / flatten and tf.variable_scope(..., [inputs]) -> Keras layers;
#   tf.contrib.layers.xavier_initializer_conv2d / l2_regularizer -> keras.initializers /
#   keras.regularizers (squeezenet's loss never added tf.losses.get_regularization_loss(),
#   so TF1 trained it without the L2 term, and so does Fenwicks); tf.contrib.tpu.* ->
#   fw.train.*.
# Stand-in data: random 8x8 images with 5 classes in place of the ImageNet InputReader.
# Kept as written: params={..., "num_shards": 8, ...} (params["num_shards"] is the replica
#   count Fenwicks runs on, so params["num_shards"] * params["batch_size"] stays the global
#   batch), params["num_classes"],
#   ["num_epochs"], ["lr"], ["min_lr"], ["optimizer"], ["momentum"], ["use_tpu"];
#   tf.train.polynomial_decay(global_step=tf.train.get_or_create_global_step());
#   lr_repeat tiled to params["batch_size"]; MomentumOptimizer(use_nesterov=True) with
#   CrossShardOptimizer; one spec with train_op, eval_metrics and predictions for all modes;
#   metric_fn with accuracy, recall_at_k(5), recall_at_k(1) and mean(learning_rate);
#   main's loop of train(steps=) then evaluate(steps=).

NUM_CLASSES = 5


def _conv2d(inputs, filters, kernel_size, strides=(1, 1), name=None):
    return keras.layers.Conv2D(
        filters, kernel_size, strides, kernel_initializer="glorot_uniform",
        bias_initializer="zeros", kernel_regularizer=keras.regularizers.l2(0.0002),
        activation="relu", name=name, padding="same")(inputs)


def _fire_module(inputs, squeeze_depth, expand_depth, name):
    squeezed = _conv2d(inputs, squeeze_depth, [1, 1], name=name + "_squeeze")
    e1x1 = _conv2d(squeezed, expand_depth, [1, 1], name=name + "_e1x1")
    e3x3 = _conv2d(squeezed, expand_depth, [3, 3], name=name + "_e3x3")
    return v1.concat([e1x1, e3x3], axis=3)


def _squeezenet(images, is_training=True, num_classes=1001):
    net = _conv2d(images, 8, [3, 3], strides=(2, 2), name="conv1")
    net = _fire_module(net, 4, 8, name="fire2")
    net = keras.layers.Dropout(0.5 if is_training else 0.0)(net, training=is_training)
    net = _conv2d(net, num_classes, [1, 1], strides=(1, 1), name="conv10")
    net = keras.layers.AveragePooling2D(pool_size=(4, 4), strides=(1, 1))(net)
    return keras.layers.Flatten()(net)


def _squeezenet_metric_fn(labels, logits, learning_rate):
    predictions = v1.cast(v1.argmax(logits, 1), v1.int32)
    labels = v1.cast(labels, v1.int64)
    return {
        "accuracy": v1.metrics.accuracy(labels, predictions),
        "recall_at_5": v1.metrics.recall_at_k(labels, logits, 5),
        "recall_at_1": v1.metrics.recall_at_k(labels, logits, 1),
        "learning_rate": v1.metrics.mean(learning_rate),
    }


def _squeezenet_model_fn(features, labels, mode, params):
    is_training = mode == fw.train.ModeKeys.TRAIN
    logits = _squeezenet(features, is_training=is_training,
                         num_classes=params["num_classes"])
    loss = v1.reduce_mean(
        v1.losses.sparse_softmax_cross_entropy(logits=logits, labels=labels))
    global_batch_size = params["num_shards"] * params["batch_size"]
    decay_steps = 640 * params["num_epochs"] // global_batch_size
    learning_rate = v1.train.polynomial_decay(
        params["lr"], global_step=v1.train.get_or_create_global_step(),
        end_learning_rate=params["min_lr"], decay_steps=decay_steps, power=1.0, cycle=False)
    lr_repeat = v1.reshape(
        v1.tile(v1.expand_dims(learning_rate, 0), [params["batch_size"], ]),
        [params["batch_size"], 1])
    if params["optimizer"] == "adam":
        optimizer = v1.train.AdamOptimizer(learning_rate=learning_rate)
    else:
        optimizer = v1.train.MomentumOptimizer(
            learning_rate=learning_rate, momentum=params["momentum"], use_nesterov=True)
    if params["use_tpu"]:
        optimizer = v1.tpu.CrossShardOptimizer(optimizer)
    train_op = optimizer.minimize(loss, v1.train.get_global_step())
    return fw.train.TPUEstimatorSpec(
        mode=mode, loss=loss, train_op=train_op,
        eval_metrics=(_squeezenet_metric_fn, [labels, logits, lr_repeat]),
        predictions={"classes": v1.argmax(input=logits, axis=1),
                     "probabilities": v1.nn.softmax(logits, name="softmax_tensor")})


@pytest.mark.slow  # among the fast subset's longest (several compiled runs)
def test_squeezenet_port_params_schedules_and_recall_at_k(tmp_path):
    rng = np.random.default_rng(3)
    images = rng.normal(size=(160, 8, 8, 3)).astype(np.float32)
    labels = rng.integers(0, NUM_CLASSES, 160).astype(np.int64)
    images += labels[:, None, None, None] * 0.5  # learnable

    def input_fn(is_training):
        def fn(params):
            rows = slice(0, 128) if is_training else slice(128, 160)
            ds = tf.data.Dataset.from_tensor_slices((images[rows], labels[rows]))
            if is_training:
                ds = ds.repeat().shuffle(128)
            return ds.batch(params["batch_size"], drop_remainder=True)
        return fn

    params = {"num_classes": NUM_CLASSES, "lr": 0.04, "min_lr": 0.004, "momentum": 0.9,
              "optimizer": "momentum", "num_eval_examples": 32, "num_shards": 8,
              "num_epochs": 2}
    run_config = fw.train.RunConfig(
        model_dir=str(tmp_path / "squeezenet"), save_checkpoints_secs=600,
        tpu_config=fw.train.TPUConfig(iterations_per_loop=4, num_shards=8))
    estimator = fw.train.TPUEstimator(
        model_fn=_squeezenet_model_fn, use_tpu=True, config=run_config,
        train_batch_size=32, eval_batch_size=16, params=dict(params, use_tpu=True),
        verbose=False)
    for _ in range(2):  # squeezenet_main's loop: train some steps, then evaluate
        estimator.train(input_fn=input_fn(True), steps=3)
        result = estimator.evaluate(input_fn=input_fn(False), steps=32 // 16)
    preds = list(estimator.predict(input_fn=input_fn(False)))
    probs = np.stack([p["probabilities"] for p in preds])
    y = labels[128:160]

    # In EVAL, params["batch_size"] is the evaluation's (16 on 1 replica), as in
    # TPUEstimator, so the model_fn's decay_steps there is 640 * 2 // 16, at global step 6.
    decay_steps = 640 * 2 // 16
    assert result["learning_rate"] == pytest.approx(
        (0.04 - 0.004) * (1 - 6 / decay_steps) + 0.004, rel=1e-5)
    top5 = np.argsort(-probs, axis=1)[:, :5]
    assert result["recall_at_5"] == pytest.approx(np.mean([y[i] in top5[i]
                                                           for i in range(32)]), abs=1e-6)
    assert result["recall_at_1"] == pytest.approx(np.mean(probs.argmax(1) == y), abs=1e-6)
    assert result["accuracy"] == pytest.approx(result["recall_at_1"], abs=1e-6)
    assert np.array_equal([p["classes"] for p in preds], probs.argmax(1))
    estimator.close()


# ------------------------------------------------------------------ options and failures


def _keras_metric_model_fn(features, labels, mode, params):
    logits = keras.layers.Dense(3, name="head")(features["x"])
    if mode == fw.train.ModeKeys.PREDICT:
        return fw.train.TPUEstimatorSpec(mode, predictions=logits)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)

    def metric_fn(labels, logits):
        accuracy = keras.metrics.SparseCategoricalAccuracy()
        accuracy.update_state(labels, logits)
        return {"keras_accuracy": accuracy}

    assert params["num_shards"] == params["num_replicas"] == 1 and params["answer"] == 42
    return fw.train.TPUEstimatorSpec(mode, loss=loss, eval_metrics=(metric_fn, [labels, logits]),
                                     optimizer=fw.train.sgd_optimizer(0.1))


@pytest.mark.slow  # among the fast subset's longest (several compiled runs)
def test_labels_key_keras_metrics_tensor_predictions_and_warm_start_settings(tmp_path):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(20, 4)).astype(np.float32)
    y = rng.integers(0, 3, 20).astype(np.int64)

    def input_fn(params):  # labels inside the features dict, as BERT's label_ids
        return tf.data.Dataset.from_tensor_slices({"x": x, "label": y}).batch(
            params["batch_size"], drop_remainder=True)

    est = fw.train.TPUEstimator(_keras_metric_model_fn, model_dir=str(tmp_path / "a"),
                                params={"answer": 42}, train_batch_size=4,
                                labels_key="label", verbose=False)
    est.train(lambda params: input_fn(params).repeat(), steps=5)
    result = est.evaluate(input_fn)
    logits = np.stack(list(est.predict(input_fn)))  # a tensor: one row per example
    assert logits.shape == (20, 3)
    assert result["keras_accuracy"] == pytest.approx(np.mean(logits.argmax(1) == y), abs=1e-6)
    est.close()

    # WarmStartSettings with a rename: a new model whose head is called "renamed".
    def renamed_model_fn(features, labels, mode, params):
        logits = keras.layers.Dense(3, name="renamed")(features["x"])
        return fw.train.TPUEstimatorSpec(mode, predictions=logits)

    # Checkpoint names as the run's record lists them (Keras paths, run_format's layout);
    # current names as est.get_variable_names() gives them.
    from fenwicks.train import run_format

    step = run_format.latest(str(tmp_path / "a"))
    record = run_format.read_record(step)
    arrays = run_format.read_arrays(step, record)
    trained, kernel = next((path, array) for (path, _, _), array in zip(
        record["layout"]["trainable"], arrays["trainable"], strict=True)
        if path.endswith("kernel"))
    settings = fw.train.WarmStartSettings(
        str(tmp_path / "a"), vars_to_warm_start="renamed/kernel",
        var_name_to_prev_var_name={"renamed/kernel": trained})
    warm = fw.train.TPUEstimator(renamed_model_fn, model_dir=str(tmp_path / "b"),
                                 warm_start_from=settings, train_batch_size=4, verbose=False)
    warm_logits = np.stack(list(warm.predict(input_fn)))
    assert warm.warm_start_report == {"loaded": ["renamed/kernel"], "not_loaded": []}
    assert sorted(warm.get_variable_names()) == ["renamed/bias", "renamed/kernel"]
    np.testing.assert_allclose(warm_logits, x @ kernel, atol=1e-5)  # bias: zeros, not loaded
    warm.close()


def _rmsprop_model_fn(features, labels, mode, params):
    logits = keras.layers.Dense(3)(features)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = v1.train.RMSPropOptimizer(0.1).minimize(loss, v1.train.get_global_step())
    return fw.train.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def _auc_model_fn(features, labels, mode, params):
    logits = keras.layers.Dense(2)(features)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    metrics = (lambda y, p: {"auc": v1.metrics.auc(y, p[:, 1])}, [labels, logits])
    return fw.train.TPUEstimatorSpec(mode, loss=loss, eval_metrics=metrics,
                                     optimizer=keras.optimizers.SGD(0.1))


@pytest.mark.parametrize("model_fn, call, words", [
    (_rmsprop_model_fn, "train", "optimizer=keras.optimizers.RMSprop"),
    (_auc_model_fn, "evaluate", "not a ratio of such sums"),
])
def test_model_fns_that_cannot_work_in_tensorflow_2_fail_saying_why(tmp_path, model_fn,
                                                                   call, words):
    x = np.zeros((8, 4), np.float32)
    y = np.zeros(8, np.int64)
    est = fw.train.TPUEstimator(model_fn, model_dir=str(tmp_path), train_batch_size=4,
                                verbose=False)
    data = lambda params: tf.data.Dataset.from_tensor_slices((x, y)).batch(  # noqa: E731
        4, drop_remainder=True)
    with pytest.raises(ValueError) as err:
        if call == "predict":
            list(est.predict(data))
        elif call == "train":
            est.train(lambda params: data(params).repeat(), steps=1)
        else:
            est.evaluate(data)
    assert words in str(err.value)
    est.close()


def test_run_config_and_tpu_config_check_their_arguments():
    with pytest.raises(ValueError, match="iterations_per_loop=0"):
        fw.train.TPUConfig(iterations_per_loop=0)
    with pytest.raises(ValueError, match="give one"):
        fw.train.RunConfig(save_checkpoints_steps=10, save_checkpoints_secs=60)
    with pytest.raises(ValueError, match="train_batch_size="):
        fw.train.TPUEstimator(_loss_forms_model_fn, model_dir="/tmp/x",
                              params={"batch_size": 8})
    assert fw.train.ModeKeys.PREDICT == "infer" and fw.train.EstimatorSpec is \
        fw.train.TPUEstimatorSpec


@pytest.mark.slow  # among the fast subset's longest (several compiled runs)
def test_get_tpu_estimator_evaluates_and_predicts_without_steps_per_epoch(tmp_path, digits):
    images, labels = digits[0][:256] / 255.0, digits[1][:256]
    model_func = fw.train.get_clf_model_func(
        lambda: keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(10)]),
        fw.train.sgd_optimizer(0.1))
    work_dir = str(tmp_path / "run")
    with fw.train.get_tpu_estimator(4, model_func, work_dir, trn_bs=32,
                                    verbose=False) as est:
        est.train(lambda params: fw.data.numpy_ds(images, labels, params["batch_size"]),
                  steps=8)
    eval_fn = lambda params: fw.data.numpy_ds(  # noqa: E731
        images, labels, params["batch_size"], training=False)
    with fw.train.get_tpu_estimator(model_func=model_func, work_dir=work_dir, val_bs=100,
                                    verbose=False) as est:  # no steps_per_epoch
        result = est.evaluate(eval_fn)
        preds = est.predict(eval_fn)
    assert result["global_step"] == 8 and result["num_examples"] == 256
    assert result["accuracy"] == pytest.approx(np.mean(preds.argmax(1) == labels), abs=1e-9)
    assert [row["y_pred"] for row in preds[:3]] == list(preds.argmax(1)[:3])
    with pytest.raises(ValueError, match="work_dir is required"):
        fw.train.get_tpu_estimator(model_func=model_func)


# ------------------------------------------------- issue 47: nothing silently wrong or ignored


def _scaled_model_fn(features, labels, mode, params):
    # The output is scaled by 2 in TRAIN only: the mode picks a layer argument, as
    # Dropout(0.9 if training else 0.0) does (item 1), but deterministically.
    scale = 2.0 if mode == fw.train.ModeKeys.TRAIN else 1.0
    dense = keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")
    outputs = keras.layers.Rescaling(scale)(dense(features))
    if mode == fw.train.ModeKeys.PREDICT:
        return fw.train.TPUEstimatorSpec(mode, predictions=outputs)
    loss = v1.losses.mean_squared_error(labels, outputs)
    train_op = v1.train.GradientDescentOptimizer(0.05).minimize(loss,
                                                                v1.train.get_global_step())
    return fw.train.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def test_layers_made_with_mode_dependent_arguments_get_them_per_mode(tmp_path):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    y = rng.normal(size=(8, 1)).astype(np.float32)
    est = fw.train.TPUEstimator(_scaled_model_fn, model_dir=str(tmp_path), train_batch_size=8,
                                verbose=False,
                                config=fw.train.RunConfig(tpu_config=fw.train.TPUConfig(1)))
    est.train(lambda params: tf.data.Dataset.from_tensor_slices((x, y)).batch(
        8, drop_remainder=True).repeat(), max_steps=2)
    weights = np.array(list(est.predict(lambda params: tf.data.Dataset.from_tensor_slices(
        np.eye(3, dtype=np.float32)).batch(3)))).reshape(3, 1)
    est.close()
    w = np.ones((3, 1))
    for _ in range(2):  # TRAIN's output is 2 x w: d/dw mean((2xw - y)^2)
        w = w - 0.05 * 2 / 8 * 2 * x.T @ (2 * x @ w - y)
    np.testing.assert_allclose(weights, w, rtol=1e-5)  # PREDICT's scale is 1: w itself


def _mode_dependent_dense_model_fn(features, labels, mode, params):
    units = 2 if mode == fw.train.ModeKeys.TRAIN else 3
    logits = keras.layers.Dense(units)(features)
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return fw.train.TPUEstimatorSpec(mode, loss=loss, predictions=logits,
                                     optimizer=keras.optimizers.SGD(0.1))


def test_a_layer_with_weights_and_mode_dependent_arguments_is_refused(tmp_path):
    est = fw.train.TPUEstimator(_mode_dependent_dense_model_fn, model_dir=str(tmp_path),
                                train_batch_size=4, verbose=False)
    data = lambda params: tf.data.Dataset.from_tensor_slices(  # noqa: E731
        (np.zeros((4, 4), np.float32), np.zeros(4, np.int64))).batch(
            4, drop_remainder=True).repeat()
    with pytest.raises(ValueError, match=r"Dense\(3\) in mode 'eval' and Dense\(2\) in mode "
                                         r"'train'.*same arguments in every mode"):
        est.train(data, steps=1)
    est.close()


def _tf1_recall_at_k(labels, logits, k):
    """TF1's recall_at_k: the label among tf.nn.top_k's indices, which order equal
    values by index (a stable sort of the negated logits)."""
    top = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return np.mean([labels[i] in top[i] for i in range(len(labels))])


def test_recall_at_k_breaks_ties_as_tf1(tmp_path):
    from fenwicks.train.tf import tf1_metrics

    rng = np.random.default_rng(4)
    logits = rng.integers(0, 3, size=(64, 10)).astype(np.float32)  # many ties
    logits[:16] = 0.0  # a collapsed model: all equal
    labels = rng.integers(0, 10, 64)
    for k in (1, 5):
        term = tf1_metrics.V1_METRICS["recall_at_k"](tf.constant(labels), tf.constant(logits), k)[0]
        value = np.sum(term.numerator) / np.sum(term.denominator)
        assert value == pytest.approx(_tf1_recall_at_k(labels, logits, k), abs=1e-7)
    # On the collapsed rows TF1 counts labels 0..k-1 only (in_top_k counted all 10).
    collapsed = tf1_metrics.V1_METRICS["recall_at_k"](tf.constant(labels[:16]),
                                             tf.constant(logits[:16]), 5)[0]
    assert np.mean(collapsed.numerator) == pytest.approx(np.mean(labels[:16] < 5))


def _loss_forms_model_fn(features, labels, mode, params):
    logits = keras.layers.Dense(3)(features)
    if mode == fw.train.ModeKeys.PREDICT:
        return fw.train.TPUEstimatorSpec(mode, predictions=logits)
    form = params["loss_form"]
    if form == "v1_losses":  # mnist_tpu
        loss = v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    elif form == "reduce_mean_of_v1_losses":  # squeezenet
        loss = v1.reduce_mean(v1.losses.sparse_softmax_cross_entropy(logits=logits,
                                                                      labels=labels))
    else:  # BERT: the per-example loss by hand, then its mean
        log_probs = v1.nn.log_softmax(logits, axis=-1)
        one_hot = v1.one_hot(labels, depth=3, dtype=v1.float32)
        loss = v1.reduce_mean(-v1.reduce_sum(one_hot * log_probs, axis=-1))
    return fw.train.TPUEstimatorSpec(mode, loss=loss, optimizer=keras.optimizers.SGD(0.5))


@pytest.mark.parametrize("form", ["v1_losses", "reduce_mean_of_v1_losses", "by_hand"])
def test_eval_loss_is_exact_with_a_padded_last_batch(tmp_path, form):
    rng = np.random.default_rng(6)
    x = rng.normal(size=(20, 4)).astype(np.float32)
    y = rng.integers(0, 3, 20).astype(np.int64)
    est = fw.train.TPUEstimator(_loss_forms_model_fn, model_dir=str(tmp_path),
                                params={"loss_form": form}, train_batch_size=8,
                                eval_batch_size=8, verbose=False)
    est.train(lambda params: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
        params["batch_size"], drop_remainder=True), steps=3)
    # 20 rows in batches of 8: the last holds 4 real rows and 4 of padding.
    result = est.evaluate(lambda params: tf.data.Dataset.from_tensor_slices((x, y)).batch(
        params["batch_size"]))
    logits = np.stack(list(est.predict(lambda params: tf.data.Dataset.from_tensor_slices(
        x).batch(params["batch_size"]))))
    est.close()
    probs = _softmax(logits.astype(np.float64))
    assert result["num_examples"] == 20
    assert result["loss"] == pytest.approx(-np.mean(np.log(probs[np.arange(20), y])),
                                           rel=1e-5)


def _ignored_arguments_model_fn(features, labels, mode, params):
    logits = keras.layers.Dense(3)(features["ids_as_float"] + v1.cast(
        v1.one_hot(features["ids"], depth=3)[:, :1], v1.float32))
    if mode == fw.train.ModeKeys.PREDICT:
        return fw.train.TPUEstimatorSpec(mode, predictions={"logits": logits},
                                         export_outputs={"x": None})
    loss = v1.losses.sparse_softmax_cross_entropy(labels, logits)
    return fw.train.TPUEstimatorSpec(mode, loss=loss, host_call=(lambda: {}, []),
                                     optimizer=keras.optimizers.SGD(0.1))


def test_ignored_arguments_warn_once_naming_themselves_and_int_features_export(
        tmp_path, caplog, monkeypatch):
    from fenwicks.train.tf import tf1_config

    tf1_config.reset_warnings()
    rng = np.random.default_rng(8)
    features = {"ids_as_float": rng.normal(size=(12, 1)).astype(np.float32),
                "ids": rng.integers(0, 3, 12).astype(np.int32)}  # integer, as BERT's ids
    labels = rng.integers(0, 3, 12).astype(np.int64)
    data = lambda params: tf.data.Dataset.from_tensor_slices(  # noqa: E731
        (features, labels)).batch(params["batch_size"])
    with caplog.at_level("WARNING", logger="fenwicks"):
        config = fw.train.RunConfig(model_dir=str(tmp_path / "m"), session_config=object(),
                                    master="grpc://10.0.0.1:8470")
        est = fw.train.TPUEstimator(_ignored_arguments_model_fn, config=config,
                                    use_tpu=True, train_batch_size=4, verbose=False)
        est.train(lambda params: tf.data.Dataset.from_tensor_slices(
            (features, labels)).repeat().batch(params["batch_size"], drop_remainder=True),
            steps=2)
        est.evaluate(data, name="validation")
        est.evaluate(data, name="validation")  # warned once
        path = est.export_saved_model(str(tmp_path / "export"),
                                      serving_input_receiver_fn=lambda: None, as_text=True)
        predictions = np.stack([p["logits"] for p in est.predict(data)])
    est.close()
    text = [r.getMessage() for r in caplog.records]
    for words in ("RunConfig(session_config=...) has no effect",
                  "RunConfig(master=...) has no effect", "use_tpu=True has no effect",
                  "evaluate(name='validation') has no effect", "host_call=...) has no effect",
                  "export_outputs=...) has no effect",
                  "serving_input_receiver_fn=...) has no effect",
                  "export_saved_model(as_text=...) has no effect"):
        assert sum(words in t for t in text) == 1, words
    # The export serves integer features (tf.one_hot of them inside the model_fn).
    loaded = tf.saved_model.load(path)  # kept: its variables go with it
    served = loaded.serve({k: v[:5] for k, v in features.items()})
    np.testing.assert_allclose(served["logits"], predictions[:5], rtol=1e-5, atol=1e-6)


def test_input_pipeline_config_values_are_tpuestimators():
    assert fw.train.InputPipelineConfig.PER_HOST_V2 == 3
    assert fw.train.TPUConfig.InputPipelineConfig.PER_HOST_V1 == 2
    config = fw.train.TPUConfig(
        iterations_per_loop=10,
        per_host_input_for_training=fw.train.InputPipelineConfig.PER_HOST_V2)
    assert config.per_host_input_for_training == 3


@pytest.mark.slow  # a process with 8 replicas
def test_eval_and_predict_input_fns_get_the_per_host_batch_on_8_replicas(tmp_path):
    """TPUEstimator gave evaluation and prediction input_fns the per-host batch: with
    drop_remainder=True, 100 rows in batches of 64 evaluate 64 (per-replica batches of 8
    would keep 96)."""
    out = run_json(f"""
        import json
        import numpy as np, tensorflow as tf
        import fenwicks as fw
        from tests import test_tpu_estimator as t
        assert fw.accel.current().num_replicas == 8
        rng = np.random.default_rng(2)
        x = rng.normal(size=(100, 4)).astype(np.float32)
        y = rng.integers(0, 3, 100).astype(np.int64)
        seen = []
        def input_fn(params):
            seen.append(params["batch_size"])
            return tf.data.Dataset.from_tensor_slices((x, y)).batch(
                params["batch_size"], drop_remainder=True)
        est = fw.train.TPUEstimator(t._loss_forms_model_fn, model_dir={str(tmp_path)!r},
                                    params={{"loss_form": "v1_losses"}},
                                    train_batch_size=64, eval_batch_size=64,
                                    predict_batch_size=32, verbose=False)
        est.train(lambda params: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
            params["batch_size"], drop_remainder=True), steps=1)
        result = est.evaluate(input_fn)
        logits = np.stack(list(est.predict(input_fn)))
        print(json.dumps({{"seen": seen, "rows": result["num_examples"],
                          "loss": result["loss"], "logits": logits.tolist()}}))
    """, env={"FENWICKS_DEVICE": "cpu:8"})
    assert set(out["seen"]) == {64, 32}  # evaluation 64, prediction 32: per host
    assert out["rows"] == 64
    logits = np.array(out["logits"])
    assert logits.shape == (96, 3)  # 3 whole batches of 32
    rng = np.random.default_rng(2)  # the subprocess's draws again
    rng.normal(size=(100, 4))
    y = rng.integers(0, 3, 100)
    probs = _softmax(logits[:64])
    assert out["loss"] == pytest.approx(-np.mean(np.log(probs[np.arange(64), y[:64]])),
                                        rel=1e-4)


# ------------------------------------------- squeezenet as written (tests/_squeezenet_port.py)
# squeezenet_main.py's main(), after the config and flags (which give the params below):
# TensorFlow 2 removals (not counted): contrib_tpu.RunConfig / TPUConfig / TPUEstimator ->
#   fw.train.*; the TPUClusterResolver line dropped (fw.accel finds the device).
# Forced edits (Fenwicks): 0. The data_pipeline InputReader, with its
#   make_one_shot_iterator().get_next(), runs as written (issue 47, item 11).
# Stand-in data: JPEG-encoded random images in ImageNet-style TFRecords.


def _imagenet_records(path, labels, seed):
    rng = np.random.default_rng(seed)
    with tf.io.TFRecordWriter(path) as writer:
        for label in labels:
            image = rng.integers(0, 256, (40, 48, 3)).astype(np.uint8)
            image[..., label % 3] //= 4  # something to learn
            encoded = tf.io.encode_jpeg(image).numpy()
            feature = {"image/encoded": tf.train.Feature(
                           bytes_list=tf.train.BytesList(value=[encoded])),
                       "image/class/label": tf.train.Feature(
                           int64_list=tf.train.Int64List(value=[int(label)]))}
            writer.write(tf.train.Example(features=tf.train.Features(
                feature=feature)).SerializeToString())


@pytest.mark.slow  # squeezenet at 224 x 224
def test_squeezenet_as_written_with_its_input_reader(tmp_path):
    from tests import _squeezenet_port as squeezenet

    data_dir = str(tmp_path / "data")
    os.makedirs(data_dir)
    rng = np.random.default_rng(9)
    _imagenet_records(f"{data_dir}/train-00000-of-00001", rng.integers(0, 10, 16), 1)
    eval_labels = rng.integers(0, 10, 16)
    _imagenet_records(f"{data_dir}/validation-00000-of-00001", eval_labels, 2)
    params = {"model_dir": str(tmp_path / "model"), "use_tpu": True, "num_classes": 10,
              "use_async_checkpointing": False,
              "train": {"iterations_per_loop": 2, "train_batch_size": 8, "num_epochs": 2,
                        "num_cores_per_replica": 1, "num_examples_per_epoch": 16,
                        "optimizer": {"type": "momentum", "momentum": 0.9},
                        "learning_rate": {"init_learning_rate": 0.03,
                                          "end_learning_rate": 0.005}},
              "eval": {"eval_batch_size": 8, "num_evals": 2, "num_eval_examples": 16}}
    total_steps = ((params["train"]["num_epochs"] * params["train"]["num_examples_per_epoch"])
                   // params["train"]["train_batch_size"])
    params["train"]["total_steps"] = total_steps
    params["eval"]["num_steps_per_eval"] = total_steps // params["eval"]["num_evals"]

    # -- main(), as written from here
    save_checkpoints_steps = max(5000, params["train"]["iterations_per_loop"])
    run_config = fw.train.RunConfig(
        model_dir=params["model_dir"], save_checkpoints_steps=save_checkpoints_steps,
        session_config=v1.ConfigProto(allow_soft_placement=True,
                                      log_device_placement=False),
        tpu_config=fw.train.TPUConfig(
            iterations_per_loop=params["train"]["iterations_per_loop"],
            num_shards=params["train"]["num_cores_per_replica"]))
    estimator = fw.train.TPUEstimator(
        model_fn=squeezenet.model_fn, use_tpu=params["use_tpu"], config=run_config,
        train_batch_size=params["train"]["train_batch_size"],
        eval_batch_size=params["eval"]["eval_batch_size"], params=params)
    results = []
    for eval_cycle in range(params["eval"]["num_evals"]):
        current_cycle_last_train_step = ((eval_cycle + 1) *
                                         params["eval"]["num_steps_per_eval"])
        estimator.train(input_fn=squeezenet.InputReader(data_dir, is_training=True),
                        steps=current_cycle_last_train_step)
        results.append(estimator.evaluate(
            input_fn=squeezenet.InputReader(data_dir, is_training=False),
            steps=(params["eval"]["num_eval_examples"] // params["eval"]["eval_batch_size"])))
    # -- end of main()

    preds = list(estimator.predict(squeezenet.InputReader(data_dir, is_training=False)))
    estimator.close()
    probs = np.stack([p["probabilities"] for p in preds])
    assert probs.shape == (16, 10)
    assert [r["global_step"] for r in results] == [2, 2 + 4]  # steps=, as written: 2 then 4
    # polynomial_decay at step 2 of decay_steps = 16 * 2 // (1 * 8) = 4, power 1
    assert results[0]["learning_rate"] == pytest.approx((0.03 - 0.005) * (1 - 2 / 4) + 0.005,
                                                        rel=1e-5)
    last = results[1]
    assert last["learning_rate"] == pytest.approx(0.005, rel=1e-5)  # past decay_steps
    assert last["accuracy"] == pytest.approx(np.mean(probs.argmax(1) == eval_labels), abs=1e-6)
    for k in (1, 5):
        assert last[f"recall_at_{k}"] == pytest.approx(
            _tf1_recall_at_k(eval_labels, probs, k), abs=1e-6)
    cross_entropy = -np.mean(np.log(probs[np.arange(16), eval_labels]))
    assert last["loss"] == pytest.approx(cross_entropy, rel=1e-4)


@pytest.mark.slow  # a process on the jax engine
def test_the_jax_engine_refuses_at_construction_naming_the_way_out(tmp_path):
    """Issue 44, item 5: a TF1 model_fn cannot run inside JAX; the refusal comes before
    any work and says what runs instead."""
    out = run_json(f"""
        import json
        import fenwicks as fw
        from tests import test_tpu_estimator as t
        assert fw.accel.engine() == "jax"
        try:
            fw.train.TPUEstimator(t._loss_forms_model_fn, model_dir={str(tmp_path)!r})
        except ValueError as err:
            print(json.dumps({{"error": str(err)}}))
    """, env={"KERAS_BACKEND": "jax", "FENWICKS_DEVICE": None, "FENWICKS_ENGINE": None,
              "XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    for words in ("cannot run inside JAX", "FENWICKS_ENGINE=tf", "host CPU",
                  "fw.train.get_clf_model_func", "runs on both engines", "PORTING.md"):
        assert words in out["error"], words
    assert not os.listdir(tmp_path)  # refused before any work


# The front door's TF1 modules (issue 54, item 5): none is imported on the jax engine.
TF1_MODULES = ("fenwicks.train.tf.tpu_estimator", "fenwicks.train.tf.model_fn_runner",
               "fenwicks.train.tf._model_fn", "fenwicks.train.tf.tf1_metrics",
               "fenwicks.train.tf.tf1_optimizers", "fenwicks.train.tf.tf1_variables",
               "fenwicks.train.tf.input_fns", "fenwicks.train.tf.assignment_map")


@pytest.mark.slow  # a process on the jax engine
def test_the_jax_refusal_comes_before_any_tf1_code_is_imported(tmp_path):
    """Issue 54, item 5: fw.train.TPUEstimator on the jax engine raises the engine's
    sentence, and no module of the TF1 front door is in sys.modules, before or after."""
    out = run_json(f"""
        import json, sys
        import fenwicks as fw

        def model_fn(features, labels, mode, params):
            raise AssertionError("never called")

        before = sorted(m for m in sys.modules if m in {TF1_MODULES!r})
        config = fw.train.RunConfig(tpu_config=fw.train.TPUConfig(iterations_per_loop=4))
        try:
            fw.train.TPUEstimator(model_fn, model_dir={str(tmp_path)!r}, config=config)
            error = None
        except ValueError as err:
            error = str(err)
        after = sorted(m for m in sys.modules if m in {TF1_MODULES!r})
        from fenwicks.train.jax import engine
        print(json.dumps({{"engine": fw.accel.engine(), "error": error, "before": before,
                          "after": after, "sentence": engine.ENGINE.tf1_model_fn_refusal()}}))
    """, env={"KERAS_BACKEND": "jax", "FENWICKS_DEVICE": None, "FENWICKS_ENGINE": None,
              "XLA_FLAGS": "--xla_force_host_platform_device_count=8"})
    assert out["engine"] == "jax"
    assert out["error"] == out["sentence"] and "cannot run inside JAX" in out["error"]
    assert out["before"] == [] and out["after"] == []
    assert not os.listdir(tmp_path)


# ------------------------------------- BERT's optimization.create_optimizer, as written


def _create_optimizer_model_fn(features, labels, mode, params):
    from tests import _bert_optimization_port as optimization

    dense = keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(0.5),
                               bias_initializer="ones", name="dense")
    outputs = dense(features)
    if mode == fw.train.ModeKeys.PREDICT:
        return fw.train.TPUEstimatorSpec(mode, predictions=outputs)
    loss = v1.losses.mean_squared_error(labels, outputs)
    train_op = optimization.create_optimizer(loss, 0.1, num_train_steps=10,
                                             num_warmup_steps=2, use_tpu=True)
    return fw.train.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def _bert_update_rule(x, y, steps):
    """optimization.py's schedule and AdamWeightDecayOptimizer, in NumPy."""
    w, b = np.full((3, 1), 0.5), np.ones(1)
    moments = {"w": [np.zeros((3, 1)), np.zeros((3, 1))], "b": [np.zeros(1), np.zeros(1)]}
    for step in range(steps):
        lr = 0.1 * (1 - step / 10)  # polynomial_decay to 0 over 10 steps, power 1
        if step < 2:
            lr = 0.1 * step / 2  # linear warmup over 2 steps
        error = x @ w + b - y
        grads = {"w": 2 / 8 * x.T @ error, "b": 2 / 8 * error.sum(0)}
        norm = np.sqrt(sum(np.sum(g ** 2) for g in grads.values()))
        grads = {k: g * 1.0 / max(norm, 1.0) for k, g in grads.items()}  # clip_norm=1.0
        params = {"w": w, "b": b}
        for key in ("w", "b"):
            m, v = moments[key]
            m = 0.9 * m + 0.1 * grads[key]
            v = 0.999 * v + 0.001 * grads[key] ** 2
            moments[key] = [m, v]
            update = m / (np.sqrt(v) + 1e-6)  # no bias correction
            if key == "w":  # "bias" is excluded from weight decay
                update = update + 0.01 * params[key]
            params[key] = params[key] - lr * update
        w, b = params["w"], params["b"]
    return w, b


def test_bert_create_optimizer_as_written_makes_its_updates(tmp_path):
    rng = np.random.default_rng(12)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    y = rng.normal(size=(8, 1)).astype(np.float32) * 3
    est = fw.train.TPUEstimator(_create_optimizer_model_fn, model_dir=str(tmp_path),
                                train_batch_size=8, verbose=False,
                                config=fw.train.RunConfig(tpu_config=fw.train.TPUConfig(1)))
    est.train(lambda params: tf.data.Dataset.from_tensor_slices((x, y)).batch(
        8, drop_remainder=True).repeat(), max_steps=4)
    rows = np.concatenate([np.eye(3), np.zeros((1, 3))]).astype(np.float32)
    out = np.array(list(est.predict(lambda params: tf.data.Dataset.from_tensor_slices(
        rows).batch(4)))).reshape(4)
    est.close()
    w, b = _bert_update_rule(x.astype(np.float64), y.astype(np.float64), 4)
    np.testing.assert_allclose(out[3], b[0], rtol=1e-5)
    np.testing.assert_allclose(out[:3] - out[3], w[:, 0], rtol=1e-5, atol=1e-6)


def test_a_tpu_host_on_the_tf_engine_warns_it_trains_on_the_cpu(tmp_path, caplog,
                                                                monkeypatch):
    from fenwicks.train.tf import tf1_config

    tf1_config.reset_warnings()
    # The Kaggle TPU image's marks, on a process whose TensorFlow found only the CPU.
    monkeypatch.setattr(fw.accel, "tpu_host_evidence",
                        lambda: ["ISTPUVM=1", "TPU_PROCESS_ADDRESSES=local"])
    with caplog.at_level("WARNING", logger="fenwicks"):
        fw.train.TPUEstimator(_loss_forms_model_fn, model_dir=str(tmp_path), use_tpu=False)
    (message,) = [r.getMessage() for r in caplog.records if "TPU host" in r.getMessage()]
    for words in ("ISTPUVM=1", "trains on the host CPU", "Keras model_func",
                  "imports fenwicks before TensorFlow", "jax engine"):
        assert words in message, words
