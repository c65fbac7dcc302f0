"""The shared training code on the reference engine (`fenwicks.train.reference`), in-process.

The reference engine trains a linear model by NumPy SGD steps, so every number here is
checked against plain NumPy written in this file (`numpy_sgd`), and a test takes
milliseconds where a real engine compiles a model. What runs on it is the shared contract:
the save policy, resume and the input position, callbacks and actions, NaN handling,
preemption (SIGTERM, Ctrl-C), the work_dir lock, history, the progress bar and
TensorBoard scalars, exact evaluation's bookkeeping (padding, filler batches, masks) and
prediction, the registry and the cross-engine reader. The real engines run the same
features end to end in `test_engine_contract.py` and the flagship tests.
"""

from __future__ import annotations

import csv
import glob
import logging
import os
import re
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks import _engine
from fenwicks.train import cross_engine, engines, progress
from fenwicks.train.reference import engine as reference_engine
from fenwicks.train.reference import model as linear
from fenwicks.train.reference import state as reference_state
from fenwicks.train.reference import weights

FOLDER = os.path.dirname(reference_engine.__file__)
FEATURES, LR, BATCH = 3, 0.05, 8
TRUE_W, TRUE_B = np.array([[1.5], [-2.0], [0.5]], np.float32), np.float32(0.25)


def data(n: int = 48, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    return x, (x @ TRUE_W + TRUE_B).astype(np.float32)


def train_input(x: np.ndarray, y: np.ndarray, seen: list | None = None):
    def input_fn(params):
        if seen is not None:
            seen.append(dict(params))
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
            params["batch_size"], drop_remainder=True)
    return input_fn


def eval_input(x: np.ndarray, y: np.ndarray | None = None):
    def input_fn(params):
        items = (x,) if y is None else (x, y)
        return tf.data.Dataset.from_tensor_slices(items).batch(params["batch_size"])
    return input_fn


def numpy_sgd(x: np.ndarray, y: np.ndarray, steps: int, lr: float = LR, start: int = 0,
              w: np.ndarray | None = None, b: np.ndarray | None = None):
    """Plain NumPy: `steps` steps of SGD on the mean squared error of ``x @ w + b``,
    global batches of BATCH consecutive examples from batch `start` on (the input
    repeats); from zero weights unless given. Returns (w, b, losses)."""
    rate = lr if callable(lr) else (lambda step: lr)
    w = np.zeros((FEATURES, 1), np.float64) if w is None else w.astype(np.float64)
    b = np.zeros(1, np.float64) if b is None else b.astype(np.float64)
    per_pass = len(x) // BATCH
    losses = []
    for step in range(start, start + steps):
        i = step % per_pass
        xb, yb = x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]
        err = xb @ w + b - yb
        losses.append(float(np.mean(err ** 2)))
        w = w - rate(step) * 2 * xb.T @ err / BATCH
        b = b - rate(step) * 2 * err.sum(axis=0) / BATCH
    return w, b, losses


@pytest.fixture
def reference():
    with engines.use("reference") as engine:
        yield engine


@pytest.fixture(params=[1, 2], ids=["1-replica", "2-replicas"])
def replicas(request, monkeypatch):
    monkeypatch.setattr(reference_engine.ReferenceEngine, "REPLICAS", request.param)
    return request.param


def make(work_dir, steps_per_epoch: int = 4, lr=LR, **kwargs):
    kwargs.setdefault("verbose", False)
    return fw.train.get_tpu_estimator(
        steps_per_epoch, linear.linear_model_func(FEATURES, learning_rate=lr,
                                                  kernel_initializer="zeros"),
        str(work_dir), trn_bs=BATCH, **kwargs)


def saved_steps(work_dir) -> list[int]:
    return sorted(int(p.rsplit("-", 1)[1])
                  for p in glob.glob(os.path.join(str(work_dir), "reference", "ckpt-*")))


def assert_weights(est, w, b):
    kernel, bias = est.model.get_weights()
    np.testing.assert_allclose(kernel, w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bias, b, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- the engine


def test_the_reference_folder_imports_neither_tensorflow_nor_jax():
    sources = sorted(glob.glob(os.path.join(FOLDER, "*.py")))
    roles = {os.path.basename(p) for p in sources}
    assert {"engine.py", "state.py", "inputs.py", "trainer.py", "evaluation.py",
            "weights.py"} <= roles
    imports = [line.strip() for path in sources for line in open(path, encoding="utf-8")
               if re.match(r"\s*(import|from)\s+\w", line)]
    assert any(line == "import numpy as np" for line in imports)  # the grep sees imports
    banned = [line for line in imports
              if re.match(r"(import|from)\s+(tensorflow|jax|jaxlib|orbax)\b", line)]
    assert banned == []


def test_it_is_registered_like_the_real_engines_and_chosen_by_name():
    entry = engines.REGISTRY["reference"]
    assert (entry.module, entry.keras_backend, entry.reader) == (
        "fenwicks.train.reference.engine", None, "fenwicks.train.reference.weights")
    assert {"tf", "jax"} <= set(engines.REGISTRY)
    assert _engine.readers()["reference"] == entry.reader  # cross_engine's readers
    assert engines.current().name == "tf"
    with engines.use("reference") as engine:
        assert engine is engines.current() and engine.name == "reference"
    assert engines.current().name == "tf"
    with pytest.raises(ValueError, match=r"engine='torch' is not an engine Fenwicks has; "
                                         r"the engines are \['jax', 'reference', 'tf'\]"):
        with engines.use("torch"):
            pass
    with pytest.raises(ValueError, match="start a new process with FENWICKS_ENGINE=jax"):
        with engines.use("jax"):
            pass


def test_it_refuses_a_model_it_cannot_differentiate(tmp_path, reference):
    x, y = data()
    model_func = fw.train.get_reg_model_func(
        lambda: keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1, "relu")]),
        lambda: keras.optimizers.SGD(0.1))
    est = fw.train.get_tpu_estimator(4, model_func, str(tmp_path), trn_bs=BATCH,
                                     verbose=False)
    with pytest.raises(ValueError, match="one keras.layers.Dense without activation"):
        est.train(train_input(x, y), steps=1)
    model_func = fw.train.get_reg_model_func(
        lambda: keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)]),
        lambda: keras.optimizers.Adam(0.1))
    est = fw.train.get_tpu_estimator(4, model_func, str(tmp_path / "adam"), trn_bs=BATCH,
                                     verbose=False)
    with pytest.raises(ValueError, match="optimizer=Adam: the reference engine steps with "
                                         "plain SGD"):
        est.train(train_input(x, y), steps=1)


# --------------------------------------------------------------------------- training


def test_steps_are_sgd_on_the_global_batch_and_history_records_them(tmp_path, reference,
                                                                    replicas):
    x, y = data()
    seen: list = []
    est = make(tmp_path, steps_per_epoch=4, steps_per_loop=3)
    assert est.num_replicas == replicas
    est.train(train_input(x, y, seen), steps=10)
    w, b, losses = numpy_sgd(x, y, 10)
    assert est.global_step == 10
    assert_weights(est, w, b)
    # params: the per-replica batch; the global batch is R of them, in stream order.
    assert {p["batch_size"] for p in seen} == {BATCH // replicas}
    assert seen[-1]["input_context"].num_replicas_in_sync == replicas
    history = est.history
    assert history.steps == list(range(1, 11))
    np.testing.assert_allclose(history.losses, losses, rtol=1e-5)
    # Loops of 3 steps cut at each epoch's end (4 steps): 3, 1, 3, 1, 2.
    assert [step for step, _ in history.learning_rates] == [3, 4, 7, 8, 10]
    assert [rate for _, rate in history.learning_rates] == pytest.approx([LR] * 5)
    assert [step for step, _ in history.examples_per_sec] == [3, 4, 7, 8, 10]
    assert all(rate > 0 for _, rate in history.examples_per_sec)


def test_a_learning_rate_schedule_is_read_at_each_global_step_across_a_resume(tmp_path,
                                                                          reference):
    x, y = data()
    schedule = keras.optimizers.schedules.PiecewiseConstantDecay([2, 5], [0.1, 0.05, 0.01])
    rate = lambda step: 0.1 if step <= 2 else 0.05 if step <= 5 else 0.01  # noqa: E731
    make(tmp_path, lr=schedule, steps_per_loop=3).train(train_input(x, y), steps=4)
    est = make(tmp_path, lr=schedule, steps_per_loop=3)  # the step from the checkpoint
    est.train(train_input(x, y), steps=5)
    w, b, _ = numpy_sgd(x, y, 9, lr=rate)
    assert_weights(est, w, b)
    # The rate after each loop (3 steps, cut at the epoch's end, step 8): at the step
    # the next loop starts from.
    assert est.history.learning_rates == [(step, pytest.approx(0.01)) for step in (7, 8, 9)]
    assert int(np.asarray(est.optimizer.iterations)) == 9


def test_a_resumed_run_continues_the_input_where_it_stood(tmp_path, reference, replicas):
    x, y = data()
    first = make(tmp_path, steps_per_loop=4)
    first.train(train_input(x, y), steps=6)
    first.close()
    # A new estimator on the work_dir: step and input position come from the checkpoint.
    again = make(tmp_path, steps_per_loop=4)
    seen: list = []
    again.train(train_input(x, y, seen), steps=5)
    assert again.global_step == 11
    # ... and a new input_fn object on the same estimator continues the same stream.
    again.train(train_input(x, y), steps=2)
    w, b, losses = numpy_sgd(x, y, 13)
    assert again.global_step == 13
    assert_weights(again, w, b)
    np.testing.assert_allclose(again.history.losses, losses[6:], rtol=1e-5)


def test_saves_every_n_loops_keep_the_last_few_and_hold_their_steps(tmp_path, reference):
    x, y = data()
    est = make(tmp_path, steps_per_epoch=2, steps_per_loop=2, save_every_loops=2,
               save_every_secs=None, keep_checkpoints=2)
    est.train(train_input(x, y), steps=10)
    # Every 2 loops of 2 steps (4, 8) and the end (10); two kept.
    assert saved_steps(tmp_path) == [8, 10]
    for step in (8, 10):
        saved = weights.read(f"{tmp_path}/reference/ckpt-{step}")
        w, b, _ = numpy_sgd(x, y, step)
        assert saved.step == step and saved.engine == "reference"
        np.testing.assert_allclose(saved.arrays[0], w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(saved.arrays[1], b, rtol=1e-5, atol=1e-6)
        assert [p.rsplit("/", 1)[1] for p in saved.paths] == ["kernel", "bias"]
    assert est.parts.state.latest_checkpoint == f"{tmp_path}/reference/ckpt-10"


def test_running_out_of_training_input_keeps_and_saves_the_steps_done(tmp_path, reference):
    x, y = data(40)  # 5 batches, not repeated
    est = make(tmp_path, steps_per_loop=4)

    def finite(params):
        return tf.data.Dataset.from_tensor_slices((x, y)).batch(
            params["batch_size"], drop_remainder=True)

    with pytest.raises(ValueError, match="ran out of data at step 5"):
        est.train(finite, steps=8)
    assert est.global_step == 5 and saved_steps(tmp_path) == [5]


# --------------------------------------------------------------------------- callbacks


class Recorder(keras.callbacks.Callback):
    def __init__(self, stop_after_batch: int | None = None) -> None:
        super().__init__()
        self.calls: list = []
        self.stop_after_batch = stop_after_batch

    def on_train_begin(self, logs=None):
        self.calls.append(("train_begin", dict(self.params)))

    def on_epoch_begin(self, epoch, logs=None):
        self.calls.append(("epoch_begin", epoch))

    def on_train_batch_end(self, batch, logs=None):
        self.calls.append(("batch_end", batch, logs["loss"]))
        if batch == self.stop_after_batch:
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        self.calls.append(("epoch_end", epoch, dict(logs)))

    def on_train_end(self, logs=None):
        self.calls.append(("train_end",))


def test_callbacks_are_called_as_fit_calls_them_with_the_runs_numbers(tmp_path, reference):
    # Moved here from test_callbacks.py's one-replica mnist_net run (LambdaCallback and
    # CSVLogger over two epochs): the call order, params and logs are the shared code's.
    x, y = data()
    recorder = Recorder()
    log_path = tmp_path / "log.csv"
    est = make(tmp_path, steps_per_epoch=4, steps_per_loop=3)
    est.train_and_evaluate(train_input(x, y), eval_input(x, y), epochs=2,
                           callbacks=[recorder, keras.callbacks.CSVLogger(str(log_path))])
    _, _, losses = numpy_sgd(x, y, 8)
    calls = recorder.calls
    assert calls[0] == ("train_begin", {"epochs": 2, "steps": 4, "verbose": 0})
    assert calls[-1] == ("train_end",)
    assert [c[1] for c in calls if c[0] == "epoch_begin"] == [0, 1]
    batch_ends = [c for c in calls if c[0] == "batch_end"]
    assert [c[1] for c in batch_ends] == [3, 4, 7, 8]  # loops of 3, cut at epochs' ends
    for _, step, loss in batch_ends:
        assert loss == pytest.approx(losses[step - 1], rel=1e-5)  # the loop's last
    epoch_ends = [c for c in calls if c[0] == "epoch_end"]
    for epoch, (_, index, logs) in enumerate(epoch_ends):
        assert index == epoch
        assert logs["loss"] == pytest.approx(np.mean(losses[4 * epoch:4 * epoch + 4]),
                                             rel=1e-5)
        assert logs["val_loss"] == pytest.approx(est.history.evals[epoch]["loss"])
        assert logs["val_mse"] == pytest.approx(est.history.evals[epoch]["mse"])
    assert [e["global_step"] for e in est.history.evals] == [4, 8]
    # The epoch log in work_dir, one line per epoch.
    assert [e["epoch"] for e in fw.train.history.read_epochs(str(tmp_path), 8)] == [0, 1]
    # CSVLogger wrote one row per epoch with the same numbers.
    with open(log_path) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    for row, (_, _, logs) in zip(rows, epoch_ends, strict=True):
        assert {k: pytest.approx(float(row[k])) for k in logs} == logs


def test_stop_training_is_honoured_at_the_next_loop_boundary(tmp_path, reference):
    # Moved here from test_callbacks.py's one-replica mnist_net run.
    x, y = data()
    est = make(tmp_path, steps_per_epoch=100, steps_per_loop=5)
    est.train(train_input(x, y), steps=50, callbacks=[Recorder(stop_after_batch=10)])
    assert est.global_step == 10 and saved_steps(tmp_path) == [10]


def test_restore_best_weights_is_what_the_last_checkpoint_holds(tmp_path, reference):
    x, y = data()
    est = make(tmp_path, steps_per_epoch=2, steps_per_loop=2)
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=1e6,
                                         restore_best_weights=True)
    est.train_and_evaluate(train_input(x, y), eval_input(x, y), epochs=5, callbacks=[stop])
    # Epoch 0 is the best (nothing improves by 1e6); patience 1 stops after epoch 1.
    assert stop.stopped_epoch == 1 and est.global_step == 4
    w, b, _ = numpy_sgd(x, y, 2)
    assert_weights(est, w, b)  # epoch 0's weights put back
    saved = weights.read(f"{tmp_path}/reference/ckpt-4")
    np.testing.assert_allclose(saved.arrays[0], w, rtol=1e-5, atol=1e-6)  # and saved


def test_callbacks_that_cannot_apply_are_refused_before_training(tmp_path, reference):
    x, y = data()
    est = make(tmp_path)
    with pytest.raises(ValueError, match="already resumes from work_dir"):
        est.train(train_input(x, y), steps=5,
                  callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path / "b"))])
    assert est.global_step == 0 and saved_steps(tmp_path) == []


# --------------------------------------------------------------------------- NaN


def test_a_non_finite_loss_names_the_step_and_the_last_good_checkpoint_stays(tmp_path,
                                                                            reference):
    x, y = data()
    est = make(tmp_path, steps_per_loop=4)
    est.train(train_input(x, y), steps=4)
    bad = x.copy()
    bad[8 * 5 + 3] = np.inf  # in the 2nd batch of the next call: step 6

    with pytest.raises(fw.train.NonFiniteLossError, match="at step 6"):
        est.train(train_input(bad, y), steps=4)
    assert saved_steps(tmp_path) == [4]
    # The estimator goes back to the good checkpoint before it is used again.
    assert est.evaluate(eval_input(x, y))["global_step"] == 4
    w, b, _ = numpy_sgd(x, y, 4)
    assert_weights(est, w, b)


def test_terminate_on_nan_stops_quietly_and_saves_nothing_for_it(tmp_path, reference):
    x, y = data()
    est = make(tmp_path, steps_per_loop=4, lr=1e6)  # diverges to inf within a few steps
    est.train(train_input(x, y), steps=40, callbacks=[keras.callbacks.TerminateOnNaN()])
    losses = est.history.losses
    assert not np.isfinite(losses[-1]) and np.all(np.isfinite(losses[:-1]))
    assert saved_steps(tmp_path) == []  # the end-of-train save is skipped


# --------------------------------------------------------------------------- signals, lock


class Signal(keras.callbacks.Callback):
    def __init__(self, signum: int, at: int) -> None:
        super().__init__()
        self.signum, self.at = signum, at

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.at:
            os.kill(os.getpid(), self.signum)


def test_sigterm_saves_the_step_reached_and_stops(tmp_path, reference):
    x, y = data()
    est = make(tmp_path, steps_per_epoch=100, steps_per_loop=3)
    with pytest.raises(fw.train.Preempted) as raised:
        est.train(train_input(x, y), steps=30, callbacks=[Signal(signal.SIGTERM, 6)])
    assert (raised.value.step, raised.value.checkpoint) == (
        6, f"{tmp_path}/reference/ckpt-6")
    assert saved_steps(tmp_path) == [6]
    # A new call resumes exactly.
    est.train(train_input(x, y), steps=3)
    w, b, _ = numpy_sgd(x, y, 9)
    assert_weights(est, w, b)


def test_ctrl_c_stops_at_a_step_boundary_and_train_continues_exactly(tmp_path, reference):
    x, y = data()
    est = make(tmp_path, steps_per_epoch=100, steps_per_loop=3)
    with pytest.raises(fw.train.Interrupted) as raised:
        est.train(train_input(x, y), steps=30, callbacks=[Signal(signal.SIGINT, 3)])
    assert raised.value.step == 3 and raised.value.saved
    est.train(train_input(x, y), steps=4)
    w, b, _ = numpy_sgd(x, y, 7)
    assert_weights(est, w, b)


def test_a_second_estimator_cannot_train_in_a_locked_work_dir(tmp_path, reference):
    x, y = data()
    other = make(tmp_path)
    refused: list = []

    class TrainOther(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            with pytest.raises(fw.train.WorkDirLockedError) as raised:
                other.train(train_input(x, y), steps=1)
            refused.append(str(raised.value))

    make(tmp_path).train(train_input(x, y), steps=4, callbacks=[TrainOther()])
    assert refused and "is in use by another estimator in this process" in refused[0]
    other.train(train_input(x, y), steps=1)  # released at the end of the first
    assert other.global_step == 5


# --------------------------------------------------------------------------- progress


def test_the_bar_and_the_tensorboard_scalars_show_the_runs_numbers(tmp_path, reference,
                                                                 capsys):
    # With test_estimator.py's steps_per_loop test, moved here (an mnist-sized model
    # compiled to count steps): steps and max_steps stop exactly, a reached max_steps
    # trains nothing, the scalars are written.
    x, y = data()
    est = make(tmp_path, steps_per_loop=4, verbose=True)
    est.train(train_input(x, y), steps=8)
    assert "8/8" in capsys.readouterr().err
    est.train(train_input(x, y), max_steps=8)  # already there: nothing runs or is saved
    assert est.global_step == 8 and saved_steps(tmp_path) == [8]
    assert est.history.steps == list(range(1, 9))
    _, _, losses = numpy_sgd(x, y, 8)
    values: dict = {}
    for path in glob.glob(str(tmp_path / "train" / "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                values.setdefault(value.tag, []).append(
                    (event.step, float(tf.make_ndarray(value.tensor))))
    assert values["loss"] == [(4, pytest.approx(losses[3], rel=1e-5)),
                              (8, pytest.approx(losses[7], rel=1e-5))]
    assert values["learning_rate"] == [(4, pytest.approx(LR)), (8, pytest.approx(LR))]
    assert [step for step, _ in values["examples_per_sec"]] == [4, 8]


# --------------------------------------------------------------------------- evaluation


@pytest.mark.parametrize("replicas_, val_bs, n", [(1, 8, 37), (4, 8, 37), (4, 8, 5)])
def test_exact_evaluation_counts_each_example_once(tmp_path, reference, monkeypatch,
                                                   replicas_, val_bs, n):
    # 37 examples in batches of 2 per replica on 4 replicas: 19 batches, the last partial,
    # then one filler batch; 5 examples: fewer than one global batch.
    monkeypatch.setattr(reference_engine.ReferenceEngine, "REPLICAS", replicas_)
    x, y = data()
    est = make(tmp_path, val_bs=val_bs)
    est.train(train_input(x, y), steps=3)
    w, b, _ = numpy_sgd(x, y, 3)
    ex, ey = data(n, seed=1)
    outputs = ex.astype(np.float64) @ w + b
    result = est.evaluate(eval_input(ex, ey))
    assert result["num_examples"] == n and result["global_step"] == 3
    assert result["loss"] == pytest.approx(np.mean((outputs - ey) ** 2), rel=1e-5)
    assert result["mae"] == pytest.approx(np.mean(np.abs(outputs - ey)), rel=1e-5)
    # steps= counts global batches.
    assert est.evaluate(eval_input(ex, ey), steps=1)["num_examples"] == min(n, val_bs)
    predictions = est.predict(eval_input(ex))
    assert predictions.shape == (n, 1)
    np.testing.assert_allclose(predictions, outputs, rtol=1e-5, atol=1e-6)


def test_sample_weights_give_the_weighted_mean_and_bad_data_is_named(tmp_path, reference):
    x, y = data()
    est = make(tmp_path, val_bs=8)
    est.train(train_input(x, y), steps=2)
    w, b, _ = numpy_sgd(x, y, 2)
    ex, ey = data(13, seed=2)
    weight = np.arange(13, dtype=np.float32)
    errors = ((ex @ w + b - ey) ** 2)[:, 0]

    def weighted(params):
        return tf.data.Dataset.from_tensor_slices((ex, ey, weight)).batch(params["batch_size"])

    result = est.evaluate(weighted)
    assert result["loss"] == pytest.approx(np.sum(weight * errors) / weight.sum(), rel=1e-5)
    bad = ex.copy()
    bad[[2, 11]] = np.nan
    with pytest.raises(ValueError, match="2 example.s. with NaN or infinite features, of 13"):
        est.evaluate(eval_input(bad, ey))


def test_evaluating_or_predicting_an_untrained_model_warns_naming_the_work_dir(
        tmp_path, reference, caplog):
    # Moved from test_bad_inputs.py (an mnist_net estimator compiled to check a warning).
    x, y = data()
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        result = make(tmp_path / "empty").evaluate(eval_input(x, y))
        make(tmp_path / "empty").predict(eval_input(x))
    assert result["global_step"] == 0
    assert result["loss"] == pytest.approx(np.mean(y ** 2), rel=1e-5)  # zero weights
    assert caplog.text.count("a model that was never trained") == 2
    assert str(tmp_path / "empty") in caplog.text
    caplog.clear()
    trained = make(tmp_path / "run")
    trained.train(train_input(x, y), steps=1)
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        trained.evaluate(eval_input(x, y))
        make(tmp_path / "run").evaluate(eval_input(x, y))  # restored: trained too
    assert "never trained" not in caplog.text


def test_features_of_another_shape_than_the_models_are_refused(tmp_path, reference):
    # Moved from test_work_dir.py (mnist_net is fully convolutional: built for 8x8 digits
    # it also ran on 9x9 ones); the check is the estimator's, before any engine step.
    x, y = data()
    est = make(tmp_path)
    est.train(train_input(x, y), steps=2)
    wider = np.pad(x, ((0, 0), (0, 1)))
    with pytest.raises(ValueError, match=r"the predict input_fn gives features of shape "
                                         r"\(4,\) per example, but this estimator's "
                                         r"model was built for \(3,\)"):
        est.predict(eval_input(wider))
    with pytest.raises(ValueError, match=r"the eval input_fn gives features of shape "
                                         r"\(4,\)"):
        est.evaluate(eval_input(wider, y))
    assert est.predict(eval_input(x)).shape == (len(x), 1)


def test_a_malformed_line_in_the_epoch_log_names_the_file_and_line(tmp_path, reference):
    # Moved from test_work_dir.py (the flagship mnist_net trained for two epochs).
    x, y = data()
    est = make(tmp_path, steps_per_epoch=2)
    est.train_and_evaluate(train_input(x, y), eval_input(x, y), max_steps=4)
    log = tmp_path / "epochs.jsonl"
    lines = log.read_text().splitlines()
    assert len(lines) == 2  # one entry per evaluated epoch
    log.write_text(lines[0] + "\n" + lines[1][:-5] + "\n")  # the second line cut short
    with pytest.raises(ValueError, match=rf"{log}, line 2, is not an epoch entry "
                                         r"\(JSONDecodeError.*fix or delete that line"):
        fw.train.history.read_epochs(str(tmp_path), 10**6)


def test_the_last_checkpoint_is_written_while_the_call_closes_unless_callbacks_follow(
        tmp_path, reference, monkeypatch):
    """Moved from test_controller.py (an estimator compiled to watch the save order).
    Without callbacks, the end-of-train write starts before the summaries flush and
    `train` returns once it is complete; with one, on_train_end may change the weights
    (restore_best_weights), so the write waits until after it."""
    events = []
    checkpointer = reference_state.NumpyCheckpointer
    original = {name: getattr(checkpointer, name) for name in ("save", "save_and_wait")}

    def spy(name):
        def method(self, step, *, force=False):
            events.append((name, step))
            return original[name](self, step, force=force)
        return method

    for name in original:
        monkeypatch.setattr(checkpointer, name, spy(name))
    close = progress.TrainSummaries.close
    monkeypatch.setattr(progress.TrainSummaries, "close",
                        lambda self: (events.append(("close",)), close(self))[1])

    class Ended(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            events.append(("on_train_end",))

    x, y = data()
    est = make(tmp_path, save_every_secs=None)
    est.train(train_input(x, y), steps=6)
    # The base save_and_wait is save (already done: skipped inside), then wait.
    assert events == [("save", 6), ("close",), ("save_and_wait", 6), ("save", 6)]
    assert saved_steps(tmp_path) == [6]
    events.clear()
    est.train(train_input(x, y), steps=6, callbacks=[Ended()])
    assert events == [("close",), ("on_train_end",), ("save_and_wait", 12), ("save", 12)]
    assert saved_steps(tmp_path) == [6, 12]


# --------------------------------------------------------------------------- work_dir


def test_another_engine_refuses_to_train_in_its_work_dir(tmp_path):
    """Its checkpoints hold no optimizer variables, so the TensorFlow engine reads the
    weights and the step, and refuses to continue the run in one sentence."""
    x, y = data()
    with engines.use("reference"):
        make(tmp_path).train(train_input(x, y), steps=2)
    assert cross_engine.any_engines_latest(str(tmp_path)) == f"{tmp_path}/reference/ckpt-2"
    before = sorted(os.listdir(tmp_path))
    est = make(tmp_path)  # the TensorFlow engine
    with pytest.raises(fw.train.CheckpointMismatchError) as refused:
        est.train(train_input(x, y), steps=1)
    assert str(refused.value) == (
        f"work_dir={str(tmp_path)!r} holds the reference engine's checkpoint "
        f"{tmp_path}/reference/ckpt-2 (step 2), and it holds no optimizer variables "
        "(iterations, slots), so train() on the TensorFlow engine cannot continue its run "
        "there: its weights were loaded for evaluate() and predict() only, and "
        "get_tpu_estimator(..., work_dir=<new>, "
        f"warm_start_from={str(tmp_path)!r}) continues from them in a new work_dir (the "
        "step and the optimizer start afresh); nothing was written")
    assert est.global_step == 2
    assert sorted(os.listdir(tmp_path)) == before


def test_a_work_dir_whose_checkpoints_were_removed_starts_afresh(tmp_path, reference,
                                                                 caplog):
    x, y = data()
    est = make(tmp_path)
    est.train(train_input(x, y), steps=3)
    for path in glob.glob(str(tmp_path / "reference" / "ckpt-*")):
        os.remove(path)
    est.train(train_input(x, y), steps=2)
    assert est.global_step == 2 and "fresh initialisation" in caplog.text
    w, b, _ = numpy_sgd(x, y, 2)
    assert_weights(est, w, b)
