"""Process helper of tests/test_engine_contract.py: every public feature of the estimator,
run on whichever engine the environment selects, printing what each gave as one JSON line.

    python -m tests._contract run WORK_ROOT      # train ... export, in one process
    python -m tests._contract resume WORK_ROOT   # a new process on run's work_dir
    python -m tests._contract gcs GS_ROOT        # train, resume, export on gs://
    python -m tests._contract service WORK_ROOT RECORDS ADDRESS   # tf.data service input

The same code runs on both engines (8 replicas each: ``FENWICKS_DEVICE=cpu:8`` for
TensorFlow, 8 JAX host devices); the test compares the two JSON documents. The model
starts from the same weights on both (drawn with NumPy, not the backend's generator), so
their numbers agree to float rounding and the engines' kernels.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import fenwicks as fw

BATCH = 128              # 16 per replica on 8 replicas
GHOST = 16               # BatchNorm over fixed groups of 16: the same on both engines
NUM_TRAIN = 1280
VAL_BS = 64              # 517 test digits: the last batch is partial (517 = 8 x 64 + 5)
STEPS = 6
SEED = 5


def digits() -> tuple[np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    return (x.reshape(-1, 8, 8, 1) / 16).astype(np.float32), y.astype(np.int32)


def build_nn() -> keras.Model:
    """The tutorial-1 network, narrow, with weights drawn by NumPy (not the backend)."""
    model = fw.models.mnist_net(c=4, input_shape=(8, 8, 1), bn=GHOST)
    rng = np.random.default_rng(0)
    weights = []
    for variable in model.weights:
        name, shape = variable.path, tuple(variable.shape)
        if "moving_variance" in name or "gamma" in name:
            weights.append(np.ones(shape, np.float32))
        elif len(shape) < 2:
            weights.append(np.zeros(shape, np.float32))
        else:
            fan_in = int(np.prod(shape[:-1]))
            weights.append(rng.normal(0, fan_in ** -0.5, shape).astype(np.float32))
    model.set_weights(weights)
    return model


def model_func() -> Any:
    opt_func = fw.train.sgd_optimizer(0.05, mom=0.9, wd=5e-4)
    return fw.train.get_clf_model_func(build_nn, opt_func)


def estimator(work_dir: str, **kwargs: Any) -> Any:
    return fw.train.get_tpu_estimator(NUM_TRAIN // BATCH, model_func(), work_dir,
                                      trn_bs=BATCH, val_bs=VAL_BS, pred_bs=VAL_BS,
                                      seed=SEED, steps_per_loop=2, verbose=False, **kwargs)


def train_input(x: np.ndarray, y: np.ndarray) -> Any:
    return lambda params: fw.data.numpy_ds(x[:NUM_TRAIN], y[:NUM_TRAIN],
                                           params["batch_size"], seed=SEED,
                                           input_context=params["input_context"])


def eval_input(x: np.ndarray, y: np.ndarray) -> Any:
    return lambda params: fw.data.numpy_ds(x[NUM_TRAIN:], y[NUM_TRAIN:],
                                           params["batch_size"], training=False)


class Recorder(keras.callbacks.Callback):
    """Which Keras hooks ran, with which logs keys."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.calls.append("train_begin")

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.calls.append("batch_end:" + ",".join(sorted(logs or {})))

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        self.calls.append("epoch_end:" + ",".join(sorted(logs or {})))

    def on_train_end(self, logs: dict | None = None) -> None:
        self.calls.append("train_end")


def _new_dir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path


def _scalar_tags(log_dir: str) -> list[str]:
    tags = set()
    for path in glob.glob(f"{log_dir}/events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(path):
            tags.update(value.tag for value in event.summary.value)
    return sorted(tags)


def _tpu_ready(est: Any, x: np.ndarray, y: np.ndarray) -> dict:
    good = fw.train.check_tpu_ready(est, train_input(x, y), eval_input(x, y), replicas=8)

    def bad_nn() -> keras.Model:  # a data-dependent shape: the positive values only
        inputs = keras.Input((8, 8, 1))
        flat = keras.layers.Flatten()(inputs)
        positive = keras.layers.Lambda(
            lambda t: keras.ops.expand_dims(keras.ops.sum(t[t > 0.5]), 0)
            * keras.ops.ones_like(t[:, :1]), output_shape=(1,))(flat)
        return keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Concatenate()(
            [flat, positive])))

    bad = fw.train.get_tpu_estimator(
        1, fw.train.get_clf_model_func(bad_nn, fw.train.sgd_optimizer(0.1)),
        est.config.work_dir + "_bad", trn_bs=BATCH, verbose=False)
    try:
        fw.train.check_tpu_ready(bad, train_input(x, y), replicas=8)
        refused = None
    except fw.train.NotTPUReadyError as err:
        refused = str(err)
    return {"batch_sizes": good.batch_sizes, "precision": good.precision,
            "bad": refused}


def _tf1_model_fn(features: Any, labels: Any, mode: str, params: dict) -> Any:
    """A TPUEstimator program's model_fn: TF1 losses and a TPUEstimatorSpec."""
    logits = keras.layers.Dense(10)(keras.layers.Flatten()(features))
    if mode == fw.train.ModeKeys.PREDICT:
        return fw.train.TPUEstimatorSpec(mode, predictions=logits)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    return fw.train.TPUEstimatorSpec(mode, loss=loss, optimizer=keras.optimizers.SGD(0.1))


def _tpu_estimator(model_dir: str, x: np.ndarray, y: np.ndarray) -> dict:
    """The TPUEstimator front door: trains here, or its one-sentence refusal."""
    try:
        est = fw.train.TPUEstimator(_tf1_model_fn, model_dir=model_dir,
                                    train_batch_size=BATCH, verbose=False)
    except ValueError as err:
        return {"refused": str(err), "wrote": os.listdir(model_dir)}
    est.train(lambda params: tf.data.Dataset.from_tensor_slices(
        (x[:NUM_TRAIN], y[:NUM_TRAIN])).repeat().batch(params["batch_size"],
                                                       drop_remainder=True), steps=2)
    return {"global_step": est.estimator.global_step}


def run(root: str) -> dict:
    x, y = digits()
    work_dir = f"{root}/{fw.train.engines.current().name}"
    est = estimator(work_dir)
    recorder = Recorder()
    est.train(train_input(x, y), steps=STEPS, callbacks=[recorder],
              profile_steps=(2, 4))
    result = est.evaluate(eval_input(x, y))
    probs = est.predict(eval_input(x, y))
    loaded = tf.saved_model.load(est.export_saved_model(f"{work_dir}_export/model"))
    served = loaded.serve(x[NUM_TRAIN:NUM_TRAIN + 37])["predictions"].numpy()
    finder = fw.train.find_lr(model_func(), train_input(x, y), num_steps=6,
                              batch_size=BATCH, seed=SEED, verbose=False)
    verdict = est.check_input(train_input(x, y), num_batches=4, warmup_batches=1)
    bf16 = estimator(f"{work_dir}_bf16", precision="bfloat16")
    bf16.train(train_input(x, y), steps=2)
    return {
        "engine": fw.train.engines.current().name,
        "replicas": est.num_replicas,
        "losses": [float(v) for v in est.history.losses],
        "global_step": est.global_step,
        "evaluate": {k: float(v) for k, v in result.items()},
        "predict_rows": int(len(probs)),
        "predict_accuracy": float(np.mean(np.argmax(probs, 1) == y[NUM_TRAIN:])),
        "export_max_diff": float(np.max(np.abs(served - probs[:37]))),
        "callbacks": recorder.calls,
        "tensorboard_tags": _scalar_tags(f"{work_dir}/train"),
        "profiles": len(glob.glob(f"{work_dir}/train/plugins/profile/*/*.xplane.pb")),
        "find_lr_lrs": finder.lrs,
        "find_lr_losses": finder.losses,
        "check_input": {"rate": verdict.input_examples_per_sec > 0,
                        "line": str(verdict)},
        "tpu_ready": _tpu_ready(est, x, y),
        "tpu_estimator": _tpu_estimator(_new_dir(f"{work_dir}_tf1"), x, y),
        "bfloat16": {"compute_dtype": bf16.model.layers[0].compute_dtype,
                     "losses": [float(v) for v in bf16.history.losses]},
        "weights": [w.tolist() for w in est.model.get_weights()[:2]],
    }


def resume(root: str) -> dict:
    """A new process on `run`'s work_dir: restores, evaluates the same, trains on."""
    x, y = digits()
    est = estimator(f"{root}/{fw.train.engines.current().name}")
    result = est.evaluate(eval_input(x, y))
    step = est.global_step
    est.train(train_input(x, y), steps=2)
    return {"restored_step": step, "evaluate": {k: float(v) for k, v in result.items()},
            "global_step": est.global_step,
            "losses": [float(v) for v in est.history.losses]}


def gcs(root: str) -> dict:
    """Train, a second estimator resuming, evaluate and export, all on ``gs://``."""
    x, y = digits()
    work_dir = f"{root}/{fw.train.engines.current().name}"
    estimator(work_dir).train(train_input(x, y), steps=2)
    est = estimator(work_dir)
    est.train(train_input(x, y), steps=2)
    result = est.evaluate(eval_input(x, y))
    exported = est.export_saved_model(f"{work_dir}_export")
    loaded = tf.saved_model.load(exported)  # kept: its variables outlive the call
    served = loaded.serve(x[NUM_TRAIN:NUM_TRAIN + 5])
    return {"engine": fw.train.engines.current().name,
            "global_step": est.global_step, "losses": est.history.losses,
            "num_examples": result["num_examples"],
            "served_rows": int(served["predictions"].shape[0]),
            "export_manifest": fw.io.exists(f"{exported}/fenwicks_manifest.json"),
            "export_is_version": exported.rsplit("/", 1)[1].isdigit()}


def service(root: str, records: str, address: str) -> dict:
    """Two steps whose training input comes through the tf.data service at `address`."""
    def parser(record: Any) -> Any:
        return fw.data.tfexample_numpy_image_parser(record, 8, 8, 1, dtype="float32")

    est = estimator(f"{root}/{fw.train.engines.current().name}_service")
    est.train(lambda params: fw.data.tfrecord_ds(
        records, parser, params["batch_size"], seed=SEED, data_service=address,
        input_context=params["input_context"]), steps=2)
    return {"engine": fw.train.engines.current().name, "global_step": est.global_step,
            "losses": est.history.losses}


if __name__ == "__main__":
    command, work_root, *rest = sys.argv[1:]
    if "://" not in work_root:
        os.makedirs(work_root, exist_ok=True)
    commands = {"run": run, "resume": resume, "gcs": gcs, "service": service}
    print(json.dumps(commands[command](work_root, *rest)))
