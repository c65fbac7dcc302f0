"""Tests for fenwicks.train.estimator: learning, exact evaluation, replica invariance,
resume, precision, export, warm start and bad input.

The pytest process has one CPU replica; 2- and 8-replica runs happen in subprocesses
(logical devices must be set before TensorFlow starts), each checking several things.
"""

import glob
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks.train import run_format
from tests import _estimator_helpers as h
from tests.conftest import run_module_json

VAL_BATCHES_1 = [1, 7, 64, 1000, 1001, 4096]
# On 8 replicas a global batch must divide by 8: 1 -> 8, 7 -> 56, 1001 -> 1008.
VAL_BATCHES_8 = h.VAL_BATCHES_8


def _numpy_metrics(probs, y):
    probs = np.asarray(probs, np.float64)
    return (float(np.mean(-np.log(probs[np.arange(len(y)), y]))),
            float(np.mean(probs.argmax(axis=1) == y)))


def _assert_exact(runs, y, weights, x):
    reference = h.numpy_forward(weights, x)
    for batch_size, run in runs.items():
        probs = np.asarray(run["probs"])
        assert probs.shape == (len(y), h.NUM_CLASSES), batch_size
        # predict: one row per example, in order, equal to an independent forward pass.
        np.testing.assert_allclose(probs, reference, atol=1e-5, err_msg=str(batch_size))
        loss, accuracy = _numpy_metrics(probs, y)
        result = run["result"]
        assert result["num_examples"] == len(y)
        assert abs(result["loss"] - loss) < 1e-6, (batch_size, result, loss)
        assert abs(result["accuracy"] - accuracy) < 1e-6, (batch_size, result, accuracy)


@pytest.fixture(scope="module")
def multi_replica(tmp_path_factory):
    """One cpu:8 and one cpu:2 subprocess, started together to share the wall time."""
    root = tmp_path_factory.mktemp("multi")
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        eight = pool.submit(run_module_json, "tests._estimator_helpers", "replicas",
                            str(root / "8"), str(root / "bad"), env={"FENWICKS_DEVICE": "cpu:8"})
        two = pool.submit(run_module_json, "tests._estimator_helpers", "replicas",
                          str(root / "2"), env={"FENWICKS_DEVICE": "cpu:2"})
        return {8: eight.result(), 2: two.result()}


# --------------------------------------------------------------------------- it learns


def test_small_cnn_learns_digits_with_xla(tmp_path):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images[..., None] / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[:1400], order[1400:]

    def build_nn():
        return keras.Sequential([
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(), keras.layers.Flatten(), keras.layers.Dense(10)])

    model_func = fw.train.get_clf_model_func(
        build_nn, lambda: keras.optimizers.SGD(0.05, momentum=0.9))
    est = fw.train.get_tpu_estimator(1400 // 50, model_func, str(tmp_path), trn_bs=50,
                                     val_bs=128, seed=0, jit_compile=True, verbose=False)
    assert est.config.jit_compile
    history = est.train_and_evaluate(h.train_input(x[train], y[train]),
                                     h.eval_input(x[test], y[test]), epochs=10,
                                     eval_every_epochs=5)
    result = history.evals[-1]
    assert result["num_examples"] == len(test)
    assert result["accuracy"] >= 0.95, result
    assert history.metric("accuracy")[0] == [5 * 28, 10 * 28]
    assert history.steps == list(range(1, 281))
    # The reported accuracy is the fraction predict() gets right.
    probs = est.predict(h.eval_input(x[test], y[test]))
    assert abs(np.mean(probs.argmax(1) == y[test]) - result["accuracy"]) < 1e-9


# --------------------------------------------------------------------------- exact evaluation


def test_exact_evaluation_and_predict_on_one_replica(tmp_path):
    x, y = h.make_data()
    out = h.exact_eval(str(tmp_path), VAL_BATCHES_1)
    _assert_exact({bs: out[bs] for bs in VAL_BATCHES_1}, y, out["weights"], x)


def test_exact_evaluation_and_predict_on_eight_replicas(multi_replica):
    x, y = h.make_data()
    out = multi_replica[8]["exact"]
    _assert_exact({bs: out[str(bs)] for bs in VAL_BATCHES_8}, y, out["weights"], x)


def test_a_closed_estimators_eight_replica_iterator_dies_off_the_callers_thread(
        multi_replica):
    # Its destructor sleeps until each replica's autotuning thread wakes (seconds to
    # minutes, see fenwicks.train.inputs.discard): close() hands its handles (one per
    # replica's iterator, and the multi-device iterator's) to discard threads.
    out = multi_replica[8]["closed_iterator_dies_on"]
    assert out == {"handles": 9, "died_on": ["fenwicks-discard"], "died": 9}


# --------------------------------------------------------------------------- replica invariance


def test_losses_do_not_depend_on_the_replica_count(tmp_path, multi_replica):
    one = h.invariance_losses(str(tmp_path))
    for replicas in (2, 8):
        other = multi_replica[replicas]["invariance"]
        for name in ("mean", "sum", "bn"):
            assert len(other[name]) == len(one[name]) == 30
            np.testing.assert_allclose(other[name], one[name], rtol=1e-4,
                                       err_msg=f"{name} on {replicas} replicas")
    # The two reductions with lr scaled by the batch are the same optimisation.
    np.testing.assert_allclose(one["sum"], one["mean"], rtol=1e-4)
    assert one["mean"][-1] < one["mean"][0]  # and it is learning


def test_batch_sizes_must_divide_by_the_replicas(multi_replica):
    errors = multi_replica[8]["errors"]
    assert "trn_bs=100 must be divisible by the 8 replicas" in errors[0]
    assert "try 96 or 104" in errors[0]
    assert "trn_bs=7" in errors[1] and "try 8 or 16" in errors[1]


# --------------------------------------------------------------------------- resume


def test_resume_in_a_new_process_equals_an_uninterrupted_run(tmp_path):
    x, y = h.make_data()
    kwargs = dict(trn_bs=32, seed=1, steps_per_loop=7, verbose=False)
    whole = fw.train.get_tpu_estimator(10, h.model_func(dropout=0.25), str(tmp_path / "a"),
                                       **kwargs)
    whole.train(h.train_input(x, y), steps=40)
    half = fw.train.get_tpu_estimator(10, h.model_func(dropout=0.25), str(tmp_path / "b"),
                                      **kwargs)
    half.train(h.train_input(x, y), steps=20)
    assert half.global_step == 20
    out = run_module_json("tests._estimator_helpers", "resume", str(tmp_path / "b"))
    assert out["step"] == 40
    assert out["files"] == out["files_after"]  # max_steps reached: no new checkpoint
    assert "checkpoints/40" in out["files"]
    for got, want in zip(out["weights"], whole.model.get_weights(), strict=True):
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-6)


# --------------------------------------------------------------------------- precision, export


def test_bfloat16_computes_in_bfloat16_with_float32_variables(tmp_path):
    x, y = h.make_data(128)
    est = fw.train.get_tpu_estimator(4, h.model_func(), str(tmp_path), trn_bs=32,
                                     precision="bfloat16", verbose=False)
    est.train(h.train_input(x, y), steps=4)
    dense = est.model.layers[0]
    assert dense.compute_dtype == "bfloat16"
    assert all(v.dtype == "float32" for v in est.model.variables)
    assert np.all(np.isfinite(est.history.losses))
    assert keras.config.dtype_policy().name == "float32"  # the global policy is restored


def test_float16_applies_a_loss_scale(tmp_path):
    x, y = h.make_data(128)
    est = fw.train.get_tpu_estimator(4, h.model_func(), str(tmp_path), trn_bs=32,
                                     precision="float16", verbose=False)
    est.train(h.train_input(x, y), steps=4)
    assert isinstance(est.optimizer, keras.optimizers.LossScaleOptimizer)
    assert float(est.optimizer.dynamic_scale) > 1.0
    assert est.model.layers[0].compute_dtype == "float16"
    assert all(v.dtype == "float32" for v in est.model.trainable_variables)
    assert np.all(np.isfinite(est.history.losses))


def test_export_saved_model_reloads_and_predicts_the_same(tmp_path):
    x, y = h.make_data(50)
    est = fw.train.get_tpu_estimator(4, h.model_func(), str(tmp_path / "work"), trn_bs=16,
                                     verbose=False)
    est.train(h.train_input(x, y), steps=4)
    probs = est.predict(h.eval_input(x, y))
    # evaluate(steps=2): only the first two global batches of 16.
    first_two = est.evaluate(h.eval_input(x, y), steps=2)
    assert first_two["num_examples"] == 32
    assert abs(first_two["accuracy"] - np.mean(probs[:32].argmax(1) == y[:32])) < 1e-9
    loaded = tf.saved_model.load(est.export_saved_model(str(tmp_path / "export")))
    served = loaded.signatures["serving_default"](x=tf.constant(x[:9]))["predictions"]
    np.testing.assert_allclose(served.numpy(), probs[:9], atol=1e-6)
    np.testing.assert_allclose(loaded.serve(x)["predictions"].numpy(), probs, atol=1e-6)


# --------------------------------------------------------------------------- warm start


def test_warm_start_loads_matching_variables_and_reports_the_rest(tmp_path):
    x, y = h.make_data(64)
    source = fw.train.get_tpu_estimator(4, h.model_func(), str(tmp_path / "src"), trn_bs=32,
                                        verbose=False)
    source.train(h.train_input(x, y), steps=2)

    def wider_head():  # same first layer, a different (wider) second layer
        return keras.Sequential([keras.Input((h.NUM_FEATURES,)), keras.layers.Dense(16),
                                 keras.layers.ReLU(), keras.layers.Dense(5)])

    model_func = fw.train.get_clf_model_func(wider_head, lambda: keras.optimizers.SGD(0.1))
    est = fw.train.get_tpu_estimator(4, model_func, str(tmp_path / "new"), trn_bs=32,
                                     warm_start_from=str(tmp_path / "src"), verbose=False)
    est.evaluate(h.eval_input(x, y % 5))
    report = est.warm_start_report
    assert len(report["loaded"]) == 2 and len(report["not_loaded"]) == 2
    assert all("kernel" in p or "bias" in p for p in report["loaded"] + report["not_loaded"])
    for got, want in zip(est.model.get_weights()[:2], source.model.get_weights()[:2],
                         strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="warm_start_from="):
        fw.train.get_tpu_estimator(4, model_func, str(tmp_path / "x"), trn_bs=32,
                                   warm_start_from=str(tmp_path / "nothing"),
                                   verbose=False).evaluate(h.eval_input(x, y % 5))


# --------------------------------------------------------------------------- bad input


def test_bad_training_input_is_reported_before_compiling(tmp_path):
    x, y = h.make_data(64)
    est = fw.train.get_tpu_estimator(4, h.model_func(), str(tmp_path), trn_bs=32,
                                     verbose=False)
    features_only = lambda p: tf.data.Dataset.from_tensor_slices(x).batch(p["batch_size"])  # noqa: E731
    with pytest.raises(ValueError, match=r"\(features, labels\) pairs"):
        est.train(features_only, steps=1)
    dynamic = lambda p: tf.data.Dataset.from_tensor_slices((x, y)).batch(p["batch_size"])  # noqa: E731
    with pytest.raises(ValueError, match="drop_remainder=True"):
        est.train(dynamic, steps=1)
    with pytest.raises(ValueError, match="must return a tf.data.Dataset"):
        est.train(lambda p: (x, y), steps=1)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\).*label is 7"):
        est.train(h.train_input(x, np.where(y == 0, 7, y).astype(np.int32)), steps=1)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\).*label is 7"):
        est.evaluate(h.eval_input(x, np.where(y == 0, 7, y).astype(np.int32)))
    with pytest.raises(ValueError, match="steps=N"):
        est.train(h.train_input(x, y))
    with pytest.raises(ValueError, match="steps=0 must be a positive integer"):
        est.train(h.train_input(x, y), steps=0)
    with pytest.raises(ValueError, match=r"\(features, labels\) pairs"):
        est.evaluate(features_only)
    with pytest.raises(ValueError, match="yielded no examples"):
        est.evaluate(lambda p: h.eval_input(x, y)(p).take(0))
    assert est.global_step == 0 and not glob.glob(str(tmp_path / "checkpoints" / "*"))


def test_nan_loss_names_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    x, y = h.make_data(64)
    est = fw.train.get_tpu_estimator(4, h.model_func(), str(tmp_path), trn_bs=32,
                                     steps_per_loop=4, verbose=False)
    est.train(h.train_input(x, y), steps=4)
    good = [w.copy() for w in est.model.get_weights()]
    # A label out of range past the first batch (which is checked eagerly) makes the
    # compiled loss NaN; the batches are unshuffled, so the 2nd step of the call has it.
    bad_y = y.copy()
    bad_y[40:] = 9

    def poisoned(params):
        ds = tf.data.Dataset.from_tensor_slices((x, bad_y)).repeat()
        return ds.batch(params["batch_size"], drop_remainder=True)

    with pytest.raises(fw.train.NonFiniteLossError, match="at step 6"):
        est.train(poisoned, steps=4)
    assert run_format.latest(str(tmp_path)) == f"{tmp_path}/checkpoints/4"
    saved = run_format.read_values(run_format.latest(str(tmp_path)))
    for variable, want in zip(est.model.weights, good, strict=True):  # get_weights' order
        np.testing.assert_array_equal(saved[variable.path], want)
    # The estimator goes back to the good checkpoint before it is used again.
    assert est.evaluate(h.eval_input(x, y))["global_step"] == 4
    for got, want in zip(est.model.get_weights(), good, strict=True):
        np.testing.assert_array_equal(got, want)


def test_work_dir_with_another_models_checkpoint_is_a_clear_error(tmp_path):
    x, y = h.make_data(64)
    fw.train.get_tpu_estimator(4, h.model_func(width=16), str(tmp_path), trn_bs=32,
                               verbose=False).train(h.train_input(x, y), steps=2)
    before = {p: os.path.getmtime(p) for p in glob.glob(str(tmp_path / "*"))}
    other = fw.train.get_tpu_estimator(4, h.model_func(width=24), str(tmp_path), trn_bs=32,
                                       verbose=False)
    with pytest.raises(fw.train.CheckpointMismatchError) as info:
        other.train(h.train_input(x, y), steps=2)
    message = str(info.value)
    assert "different model" in message and "[6, 16]" in message and "[6, 24]" in message
    assert "/kernel [6, 16]" in message  # the variables by their Keras paths
    assert {p: os.path.getmtime(p) for p in glob.glob(str(tmp_path / "*"))} == before


def test_constructor_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="steps_per_epoch=0"):
        fw.train.get_tpu_estimator(0, h.model_func(), str(tmp_path))
    with pytest.raises(ValueError, match="precision='float64'"):
        fw.train.get_tpu_estimator(1, h.model_func(), str(tmp_path), precision="float64")
    with pytest.raises(ValueError, match="model_func="):
        fw.train.get_tpu_estimator(1, None, str(tmp_path))
    est = fw.train.get_tpu_estimator(1, lambda params: "not a spec", str(tmp_path),
                                     verbose=False)
    x, y = h.make_data(64)
    with pytest.raises(ValueError, match="must return fw.train.ModelSpec"):
        est.evaluate(h.eval_input(x, y))


def test_a_work_dir_that_is_a_file_is_refused_at_construction(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    with pytest.raises(ValueError, match="notes.txt' is a file, not a directory"):
        fw.train.get_tpu_estimator(1, h.model_func(), str(path))
    assert path.read_text() == "mine"  # untouched


def test_a_model_built_for_other_images_than_the_data_is_refused(tmp_path):
    # A fully convolutional net declared for 28x28 digits would run on 8x8 ones.
    x = np.zeros((64, 8, 8, 1), np.float32)
    y = np.zeros(64, np.int32)
    model_func = fw.train.get_clf_model_func(
        lambda: fw.models.mnist_net(c=4, input_shape=(28, 28, 1)), fw.train.sgd_optimizer(0.1))
    est = fw.train.get_tpu_estimator(2, model_func, str(tmp_path / "w"), trn_bs=32,
                                     verbose=False)
    with pytest.raises(ValueError, match=r"expects inputs of shape \(None, 28, 28, 1\) but "
                                         r"the input_fn gives \(32, 8, 8, 1\).*input_shape="
                                         r"\(8, 8, 1\)"):
        est.train(lambda p: fw.data.numpy_ds(x, y, p["batch_size"]), steps=1)
    assert not os.path.exists(tmp_path / "w" / "checkpoints")


def test_gcs_work_dir_trains_resumes_and_evaluates(gcs_emulator):
    work_dir = gcs_emulator.unique_url("estimator") + "/work"
    code = f"""
        import json
        import fenwicks as fw
        from fenwicks.train import run_format
        from tests import _estimator_helpers as h
        x, y = h.make_data(200)
        est = fw.train.get_tpu_estimator(5, h.model_func(), {work_dir!r}, trn_bs=32, seed=2,
                                         verbose=False)
        est.train(h.train_input(x, y), steps=6)
        first = [w.tolist() for w in est.model.get_weights()]
        again = fw.train.get_tpu_estimator(5, h.model_func(), {work_dir!r}, trn_bs=32,
                                           verbose=False)
        result = again.evaluate(h.eval_input(x, y))
        probs = again.predict(h.eval_input(x, y))
        again.train(h.train_input(x, y), steps=2)
        print(json.dumps({{"result": result, "first": first, "probs": probs.tolist(),
                          "resumed": [w.tolist() for w in again.model.get_weights()],
                          "latest": run_format.latest({work_dir!r})}}))
    """
    out = gcs_emulator.run_json(code)
    x, y = h.make_data(200)
    probs = h.numpy_forward(out["first"], x)
    np.testing.assert_allclose(out["probs"], probs, atol=1e-5)
    loss, accuracy = _numpy_metrics(out["probs"], y)
    assert out["result"]["global_step"] == 6 and out["result"]["num_examples"] == 200
    assert abs(out["result"]["loss"] - loss) < 1e-6
    assert abs(out["result"]["accuracy"] - accuracy) < 1e-6
    assert out["latest"] == work_dir + "/checkpoints/8"
    assert not np.allclose(out["resumed"][0], out["first"][0])  # it trained on from step 6


def test_history_serialises_for_plots():
    history = fw.train.History(steps=[1, 2], losses=[0.5, 0.4],
                               evals=[{"global_step": 2, "accuracy": 0.9, "loss": 0.4}])
    assert history.metric("accuracy") == ([2], [0.9])
    json.dumps(history.__dict__)


def test_out_of_memory_retries_with_smaller_batches(tmp_path, caplog):
    est = fw.train.get_tpu_estimator(1, h.model_func(), str(tmp_path), verbose=False)
    tried = []

    def run(global_batch):  # stands in for a GPU that fits at most 40 examples
        tried.append(global_batch)
        if global_batch > 40:
            raise tf.errors.ResourceExhaustedError(None, None, "OOM")
        return global_batch

    with caplog.at_level("WARNING", logger="fenwicks"):
        assert est.parts.evaluator.with_smaller_batches(run, 128, "evaluation") == 32
    assert tried == [128, 64, 32]
    assert "out of memory at evaluation batch 128; retrying with 64" in caplog.text


def test_regression_model_func_reports_exact_mse_and_mae(tmp_path):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(203, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) + 0.3).astype(np.float32)[:, None]

    def build_nn():
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

    model_func = fw.train.get_reg_model_func(build_nn, lambda: keras.optimizers.SGD(0.05))
    est = fw.train.get_tpu_estimator(5, model_func, str(tmp_path), trn_bs=20, val_bs=40,
                                     verbose=False)
    est.train(h.train_input(x, y), steps=30)
    result = est.evaluate(h.eval_input(x, y))
    kernel, bias = est.model.get_weights()
    predicted = x.astype(np.float64) @ kernel + bias  # an independent forward pass
    np.testing.assert_allclose(est.predict(h.eval_input(x, y)), predicted, atol=1e-5)
    assert result["num_examples"] == 203
    assert abs(result["mse"] - np.mean((predicted - y) ** 2)) < 1e-6
    assert abs(result["mae"] - np.mean(np.abs(predicted - y))) < 1e-6
    assert result["loss"] == pytest.approx(result["mse"], rel=1e-6)
    assert result["mse"] < np.mean((y - y.mean()) ** 2) / 10  # it learned the line


# --------------------------------------------------------------------------- sample weights


def _weighted_input(x, y, w, training):
    def input_fn(params):
        ds = tf.data.Dataset.from_tensor_slices((x, y, w))
        if training:
            ds = ds.shuffle(len(x), seed=5).repeat()
        return ds.batch(params["batch_size"], drop_remainder=training)
    return input_fn


def test_sample_weights_scale_the_training_loss(tmp_path):
    x, y = h.make_data(256)
    runs = {}
    for name, weight, lr in (("zero", 0.0, 0.1), ("one", 1.0, 0.1), ("two", 2.0, 0.05)):
        est = fw.train.get_tpu_estimator(
            8, h.model_func(lr=lr, wd=0.0), str(tmp_path / name), trn_bs=32, seed=1,
            verbose=False)
        est.train(_weighted_input(x, y, np.full(len(x), weight, np.float32), True), steps=8)
        runs[name] = (est.model.get_weights(), est.history.losses)
    fresh = fw.train.get_tpu_estimator(8, h.model_func(), str(tmp_path / "fresh"), trn_bs=32,
                                       seed=1, verbose=False)
    fresh.evaluate(h.eval_input(x, y))  # builds the same initial weights
    for got, start in zip(runs["zero"][0], fresh.model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, start)  # weight 0: no gradient at all
    assert runs["zero"][1] == [0.0] * 8
    # Weights of 2 double the gradient: half the learning rate gives the same steps.
    for got, want in zip(runs["two"][0], runs["one"][0], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
    np.testing.assert_allclose(runs["two"][1], 2 * np.asarray(runs["one"][1]), rtol=1e-5)


def test_evaluation_with_sample_weights_is_the_weighted_mean(tmp_path):
    x, y = h.make_data(203)
    w = np.random.default_rng(3).uniform(0, 2, size=len(x)).astype(np.float32)
    est = fw.train.get_tpu_estimator(10, h.model_func(), str(tmp_path), trn_bs=32,
                                     val_bs=64, seed=1, verbose=False)
    est.train(h.train_input(x, y), steps=10)
    result = est.evaluate(_weighted_input(x, y, w, False))
    probs = np.asarray(est.predict(h.eval_input(x, y)), np.float64)
    per_example = -np.log(probs[np.arange(len(y)), y])
    assert result["num_examples"] == len(y)
    assert result["loss"] == pytest.approx(np.sum(w * per_example) / np.sum(w), abs=1e-5)
    correct = probs.argmax(axis=1) == y
    assert result["accuracy"] == pytest.approx(np.sum(w * correct) / np.sum(w), abs=1e-6)
    # predict takes the same (features, labels, weights) dataset and ignores the rest
    np.testing.assert_allclose(est.predict(_weighted_input(x, y, w, False)), probs, atol=1e-6)


def test_close_flushes_the_logs_and_lets_go_of_the_input(tmp_path):
    x, y = h.make_data(256)
    with fw.train.get_tpu_estimator(8, h.model_func(), str(tmp_path), trn_bs=32,
                                    steps_per_loop=4, verbose=False) as est:
        est.train(h.train_input(x, y), steps=12)
    assert est.parts.inputs.training_input is None
    losses = [v for path in glob.glob(str(tmp_path / "train" / "events*"))
              for event in tf.compat.v1.train.summary_iterator(path)
              for v in event.summary.value if v.tag == "loss"]
    assert len(losses) == 3  # one per loop of 4 steps, all on disk after close()


@pytest.mark.parametrize("steps_per_loop", [0, -1, 2.5])
def test_steps_per_loop_out_of_range_is_an_error_naming_it(tmp_path, steps_per_loop):
    # 0 once meant "one epoch" silently; None (the default) is one epoch
    with pytest.raises(ValueError,
                       match=rf"steps_per_loop={steps_per_loop!r} must be a positive integer"):
        fw.train.get_tpu_estimator(10, h.model_func(), str(tmp_path), trn_bs=32,
                                   steps_per_loop=steps_per_loop)
    assert not any(tmp_path.iterdir())  # refused before anything was written
