"""Issue 52's loss 3: an export killed between two of its objects (preemption).

``python -m tests._export_kill first BASE WORK``: trains a narrow model, exports it to
BASE, puts a user's file in BASE, prints the served predictions and the version.
``... killed BASE WORK``: trains a wider model in WORK and exports it to BASE, SIGKILLed
once two of the new version's objects exist (never returns).
``... read BASE``: prints what `latest_export` finds, its predictions and the user's file.
Local or ``gs://`` alike (through the tests' emulator).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import keras
import numpy as np
import tensorflow as tf

import fenwicks as fw
from fenwicks.train import export_dirs

USER_FILE = "notes/train.csv"
USER_BYTES = b"id,label\n1,cat\n"


def _x() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)


def _estimator(work_dir: str, width: int):
    x = _x()
    y = (x[:, 0] > 0).astype(np.int32)

    def build():
        return keras.Sequential([keras.Input((4,)), keras.layers.Dense(width, "relu"),
                                 keras.layers.Dense(2)])

    model_func = fw.train.get_clf_model_func(build, fw.train.sgd_optimizer(0.1))
    est = fw.train.get_tpu_estimator(2, model_func, work_dir, trn_bs=32, val_bs=32,
                                     verbose=False)
    est.train(lambda params: fw.data.numpy_ds(x, y, params["batch_size"]), steps=2)
    return est


def _serve(path: str) -> list:
    loaded = tf.saved_model.load(path)  # kept: its variables outlive the call
    return loaded.serve(_x()[:5])["predictions"].numpy().round(6).tolist()


def _objects(folder: str) -> int:
    if not tf.io.gfile.isdir(folder):
        return 0
    return sum(len(files) for _, _, files in tf.io.gfile.walk(folder))


def _kill_after(folder: str, objects: int) -> None:
    def watch() -> None:
        while _objects(folder) < objects:
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGKILL)  # preempted between two objects
    threading.Thread(target=watch, daemon=True).start()


def main(phase: str, base: str, work_dir: str = "") -> None:
    if phase == "first":
        path = _estimator(work_dir, 8).export_saved_model(base)
        tf.io.gfile.makedirs(f"{base}/notes")
        with tf.io.gfile.GFile(f"{base}/{USER_FILE}", "wb") as f:
            f.write(USER_BYTES)
        print(json.dumps({"version": path, "served": _serve(path)}))
    elif phase == "killed":
        write = _estimator(work_dir, 24).saved_model_writer()

        def killed_midway(folder: str) -> None:
            _kill_after(folder, 2)
            write(folder)
            time.sleep(60)  # the watcher kills before the manifest could be written

        export_dirs.write(base, killed_midway)
    else:
        with tf.io.gfile.GFile(f"{base}/{USER_FILE}", "rb") as f:
            user = f.read().decode()
        latest = fw.train.latest_export(base)
        print(json.dumps({"latest": latest, "served": _serve(latest), "user_file": user,
                          "entries": sorted(n.rstrip("/") for n in tf.io.gfile.listdir(base))}))


if __name__ == "__main__":
    main(*sys.argv[1:])
