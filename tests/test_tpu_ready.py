"""fw.train.check_tpu_ready: what would fail on a TPU fails on the CPU, naming the op or
the shape; every model in fw.models passes."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw

NotReady = fw.train.NotTPUReadyError
RNG = np.random.default_rng(0)
X = RNG.random((40, 8, 8, 1), dtype=np.float32)
Y = RNG.integers(0, 3, 40).astype("int32")


def _estimator(tmp_path, build, trn_bs=16, val_bs=16):
    model_func = fw.train.get_clf_model_func(build, fw.train.adam_optimizer(lambda s: 1e-3))
    return fw.train.get_tpu_estimator(2, model_func, str(tmp_path / "work"), trn_bs=trn_bs,
                                      val_bs=val_bs, verbose=False)


def _train(params, x=X, y=Y):
    return fw.data.numpy_ds(x, y, params["batch_size"], seed=1)


def _eval(params, x=X, y=Y):
    return fw.data.numpy_ds(x, y, params["batch_size"], training=False)


def _pred(params, x=X):
    return fw.data.numpy_ds(x, None, params["batch_size"], training=False)


def _head(body):
    """A tiny classifier on 8x8x1 images with `body` (a Keras layer) in the middle."""
    def build():
        return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                                 keras.layers.Dense(4), body, keras.layers.Dense(3)])
    return build


class PyFunc(keras.layers.Layer):
    def call(self, x):
        y = tf.py_function(lambda a: a * 2.0, [x], x.dtype)
        return tf.ensure_shape(y, x.shape)


class StringOp(keras.layers.Layer):
    def call(self, x):
        text = tf.strings.as_string(x)               # numbers -> strings -> numbers
        return tf.cast(tf.strings.to_number(text), x.dtype)


class Unique(keras.layers.Layer):
    def call(self, x):
        distinct = tf.unique(tf.reshape(tf.cast(x > 0, tf.int32), [-1]))[0]
        return x + tf.cast(tf.size(distinct), x.dtype)


class BooleanMask(keras.layers.Layer):
    def call(self, x):
        return x + tf.reduce_sum(tf.boolean_mask(x, x > 0))


def test_a_py_function_in_the_model_is_named(tmp_path):
    est = _estimator(tmp_path, _head(PyFunc(name="doubler")))
    with pytest.raises(NotReady, match=r"the training step calls Python \(op '.*doubler.*"
                                       r"EagerPyFunc', EagerPyFunc: a tf.py_function"):
        fw.train.check_tpu_ready(est, _train)


def test_a_string_op_in_the_model_is_named(tmp_path):
    est = _estimator(tmp_path, _head(StringOp(name="via_text")))
    with pytest.raises(NotReady) as failure:
        fw.train.check_tpu_ready(est, _train)
    message = str(failure.value)
    assert message.startswith("the training step does not compile with XLA (as on a TPU): "
                              "op '")
    assert "via_text" in message and "(AsString)" in message
    assert "string ops cannot run on a TPU" in message


@pytest.mark.parametrize("layer,op_type", [(Unique(name="distinct"), "Unique"),
                                           (BooleanMask(name="masked"), "Where")])
def test_a_data_dependent_shape_in_the_model_is_named(tmp_path, layer, op_type):
    est = _estimator(tmp_path, _head(layer))
    with pytest.raises(NotReady) as failure:
        fw.train.check_tpu_ready(est, _train)
    message = str(failure.value)
    assert message.startswith("the training step has a tensor of data-dependent size: op '")
    assert layer.name in message and f"({op_type}) gives " in message and "[<=" in message


def test_a_partial_last_training_batch_is_named(tmp_path):
    est = _estimator(tmp_path, _head(keras.layers.ReLU()))
    def no_drop_remainder(params):
        return tf.data.Dataset.from_tensor_slices((X, Y)).batch(params["batch_size"])
    with pytest.raises(NotReady, match=r"training input: training input_fn yields batches "
                                       r"of dynamic size \(batch dimension None\).*"
                                       r"drop_remainder=True"):
        fw.train.check_tpu_ready(est, no_drop_remainder)


def test_a_dynamic_feature_dimension_and_string_features_are_named(tmp_path):
    est = _estimator(tmp_path, _head(keras.layers.ReLU()))
    def ragged_eval(params):  # a padded_batch without padded_shapes: length varies
        ds = tf.data.Dataset.range(40).map(lambda i: (tf.ones([8, 8, 1]), tf.zeros([i % 3])))
        return ds.padded_batch(params["batch_size"])
    with pytest.raises(NotReady, match=r"evaluation input: labels has shape \[None, None\], "
                                       r"dimension 1 is not static"):
        fw.train.check_tpu_ready(est, _train, eval_input_fn=ragged_eval)
    def strings(params):
        ds = tf.data.Dataset.from_tensor_slices((X, Y.astype(str)))
        return ds.batch(params["batch_size"], drop_remainder=True)
    with pytest.raises(NotReady, match="training input: labels is a string tensor"):
        fw.train.check_tpu_ready(est, strings)


def test_partial_eval_and_predict_batches_are_padded_to_static_shapes(tmp_path):
    # 40 examples, per-replica batch 16 on a 1-chip TPU: the estimator pads the last 8.
    est = _estimator(tmp_path, _head(keras.layers.ReLU()), trn_bs=16, val_bs=16)
    report = fw.train.check_tpu_ready(est, _train, _eval, _pred, replicas=1)
    assert report.batch_sizes == {"train": 16, "eval": 16, "predict": 16}
    assert report.shapes == {"train": [(16, 8, 8, 1), (16,)], "eval": [(16, 8, 8, 1), (16,)],
                             "predict": [(16, 8, 8, 1)]}
    assert report.precision == "bfloat16"
    assert not tf.io.gfile.exists(str(tmp_path / "work" / "checkpoints"))  # nothing written


def test_replicas_set_the_per_replica_batch_and_must_divide(tmp_path):
    est = _estimator(tmp_path, _head(keras.layers.ReLU()), trn_bs=16, val_bs=24)
    report = fw.train.check_tpu_ready(est, _train, _eval, replicas=8)  # a v5e-8
    assert report.batch_sizes == {"train": 2, "eval": 3}
    assert report.shapes["train"] == [(2, 8, 8, 1), (2,)]
    with pytest.raises(ValueError, match="trn_bs=16 must be divisible by the 3 replicas"):
        fw.train.check_tpu_ready(est, _train, replicas=3)
    with pytest.raises(ValueError, match="replicas=0"):
        fw.train.check_tpu_ready(est, _train, replicas=0)


# ------------------------------------------------------------------ fw.models all pass

def _images(shape):
    def fn(mode):
        def input_fn(params):
            x = RNG.random((24, *shape), dtype=np.float32)
            y = RNG.integers(0, 3, 24).astype("int32")
            if mode == "pred":
                return fw.data.numpy_ds(x, None, params["batch_size"], training=False)
            return fw.data.numpy_ds(x, y, params["batch_size"], training=mode == "train",
                                    seed=1 if mode == "train" else None)
        return input_fn
    return fn


@pytest.mark.parametrize("name,build,shape", [
    ("mnist_net", lambda: fw.models.mnist_net(n_classes=3, c=4, input_shape=(8, 8, 1)),
     (8, 8, 1)),
    # 8 s each on the shared 2-core machine: slow.
    pytest.param("resnet9", lambda: fw.models.resnet9(n_classes=3, c=4,
                                                      input_shape=(16, 16, 3)),
                 (16, 16, 3), marks=pytest.mark.slow),
    pytest.param("resnet", lambda: fw.models.resnet(blocks=(1, 1), n_classes=3, c=4,
                                                    input_shape=(16, 16, 3)),
                 (16, 16, 3), marks=pytest.mark.slow),
])
def test_every_image_model_is_tpu_ready(tmp_path, name, build, shape):
    est = _estimator(tmp_path, build, trn_bs=8, val_bs=8)
    fns = _images(shape)
    report = fw.train.check_tpu_ready(est, fns("train"), fns("eval"), fns("pred"), replicas=1)
    assert report.shapes["predict"] == [(8, *shape)]


@pytest.mark.slow  # 6 s
def test_the_rnn_forecaster_is_tpu_ready(tmp_path):
    model_func = fw.train.get_reg_model_func(
        lambda: fw.models.rnn_forecaster(input_shape=(6, 2), horizon=1, units=4),
        fw.train.adam_optimizer(lambda s: 1e-3))
    est = fw.train.get_tpu_estimator(2, model_func, str(tmp_path / "work"), trn_bs=8,
                                     verbose=False)
    x = RNG.random((24, 6, 2), dtype=np.float32)
    y = RNG.random((24, 1), dtype=np.float32)
    report = fw.train.check_tpu_ready(
        est, lambda p: fw.data.numpy_ds(x, y, p["batch_size"], seed=1),
        lambda p: fw.data.numpy_ds(x, y, p["batch_size"], training=False),
        lambda p: fw.data.numpy_ds(x, None, p["batch_size"], training=False))
    assert report.shapes["train"] == [(8, 6, 2), (8, 1)]


def test_an_empty_dataset_is_named_not_a_bare_stop_iteration(tmp_path):
    est = _estimator(tmp_path, _head(keras.layers.ReLU()))

    def empty_train(params):
        return _train(params).take(0)

    def empty_eval(params):
        return _eval(params).take(0)

    with pytest.raises(NotReady, match=r"training input: the input_fn's dataset is empty"):
        fw.train.check_tpu_ready(est, empty_train)
    with pytest.raises(NotReady, match=r"evaluation input: the input_fn's dataset is empty"):
        fw.train.check_tpu_ready(est, _train, eval_input_fn=empty_eval)
