"""Training runs for `tests/test_resume_position.py`, each in a fresh process.

    python -m tests._resume_position train WORK_ROOT DATA_DIR STEPS KIND[,KIND...]

trains STEPS more steps of a narrow `mnist_net` per input KIND (its work dir is
WORK_ROOT/KIND, resumed if it holds a checkpoint) and prints one JSON line: per kind the
global step, the weights, and how the estimator resumed the input (the fenwicks log).
DATA_DIR holds the TFRecords and the tfds data the test prepared. The replica count
comes from FENWICKS_DEVICE (e.g. ``cpu:2``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import fenwicks as fw

NUM_TRAIN = 200      # 12.5 global batches of 16: resumed runs start mid-epoch
GLOBAL_BATCH = 16
SEED = 5
KINDS = ("numpy", "tfrecord", "tfds", "user", "wrapped")


def digits() -> tuple[np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    x = (x[:NUM_TRAIN].reshape(-1, 8, 8, 1) / 16).astype(np.float32)
    return x, y[:NUM_TRAIN].astype(np.int32)


def write_records(data_dir: str) -> str:
    """The digits as 4 TFRecord shards; returns their file pattern."""
    x, y = digits()
    fn = os.path.join(data_dir, "digits.tfrec")
    fw.data.numpy_tfrecord(fn, x, y, num_shards=4)
    return fn + "*"


def _parser(record: tf.Tensor) -> Any:
    return fw.data.tfexample_numpy_image_parser(record, 8, 8, 1, dtype=tf.float32)


def _augment(x: tf.Tensor) -> tf.Tensor:
    return fw.transform.random_flip(fw.transform.random_pad_crop(x, 1))


def input_fn(kind: str, data_dir: str) -> Callable[[dict], tf.data.Dataset]:
    """The training input function of each kind, as a user would write it."""
    x, y = digits()

    def numpy(params: dict) -> tf.data.Dataset:
        return fw.data.numpy_ds(x, y, params["batch_size"], seed=SEED,
                                batch_transform=_augment,
                                input_context=params["input_context"])

    def tfrecord(params: dict) -> tf.data.Dataset:
        return fw.data.tfrecord_ds(os.path.join(data_dir, "digits.tfrec*"), _parser,
                                   params["batch_size"], shuffle_buf_sz=64, seed=SEED,
                                   transform=fw.transform.tfm_pad_crop(1),
                                   batch_transform=fw.transform.random_flip,
                                   input_context=params["input_context"])

    def tfds(params: dict) -> tf.data.Dataset:
        ds = fw.data.tfds_ds("tiny_shapes", "train", params["batch_size"], seed=SEED,
                             data_dir=data_dir, batch_transform=fw.transform.random_flip,
                             input_context=params["input_context"])
        # A per-batch map on top: the pipeline still starts where the run left off.
        return ds.map(lambda images, labels: (tf.cast(images, tf.float32) / 40, labels))

    def user(params: dict) -> tf.data.Dataset:  # no Fenwicks pipeline: the .skip fallback
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(NUM_TRAIN, seed=SEED)
        return ds.repeat().batch(params["batch_size"], drop_remainder=True)

    def wrapped(params: dict) -> tf.data.Dataset:  # re-batched: "batch n" changes meaning
        return numpy(params).unbatch().batch(params["batch_size"], drop_remainder=True)

    return {"numpy": numpy, "tfrecord": tfrecord, "tfds": tfds, "user": user,
            "wrapped": wrapped}[kind]


def estimator(kind: str, work_dir: str) -> fw.train.Estimator:
    shape = (4, 4, 1) if kind == "tfds" else (8, 8, 1)
    model_func = fw.train.get_clf_model_func(
        lambda: fw.models.mnist_net(c=4, input_shape=shape),
        fw.train.sgd_optimizer(0.01, mom=0.9, wd=5e-4))
    return fw.train.get_tpu_estimator(NUM_TRAIN // GLOBAL_BATCH, model_func, work_dir,
                                      trn_bs=GLOBAL_BATCH, seed=SEED, steps_per_loop=4,
                                      verbose=False)


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def train(work_root: str, data_dir: str, steps: int, kinds: list[str]) -> dict:
    out = {}
    logger = logging.getLogger("fenwicks")
    logger.setLevel(logging.INFO)
    for kind in kinds:
        messages = _Messages()
        logger.addHandler(messages)
        est = estimator(kind, os.path.join(work_root, kind))
        est.train(input_fn(kind, data_dir), steps=steps)
        logger.removeHandler(messages)
        out[kind] = {"step": est.global_step,
                     "weights": [w.tolist() for w in est.model.get_weights()],
                     "resume": [m for m in messages.messages if "training input" in m]}
    return out


def main(argv: list[str]) -> None:
    command, work_root, data_dir, steps, kinds = argv
    if command != "train":
        raise SystemExit(f"unknown command {command!r}")
    print(json.dumps(train(work_root, data_dir, int(steps), kinds.split(","))))


if __name__ == "__main__":
    main(sys.argv[1:])
