"""Process helper of tests/test_jax_gcs.py: the JAX engine on a ``gs://`` work_dir, run
inside the fault emulator's namespace with 8 host devices, printing one JSON document.

    python -m tests._jax_gcs first  gs://bucket/run/work LOCAL_ROOT
    python -m tests._jax_gcs second gs://bucket/run/work LOCAL_ROOT

``first`` trains a local reference run (steps 8 and 10 recorded), then the gs:// run to
step 4 with synchronous saves, and tries a bucket that does not exist. ``second`` is the
user's next session: a new process resumes the gs:// run with asynchronous saves to step
8, evaluates and predicts from it, saves step 10 while the storage refuses part of that
upload, meets refused downloads, warm-starts from the bucket, resumes again on a new
estimator, and finally runs with no credentials at all. The model is the product's
narrow mnist_net on 8x8 digits.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import tempfile
import time
from typing import Any

import keras
import numpy as np

import fenwicks as fw
from fenwicks.train import cross_engine, run_format
from tests import _fault_proxy as proxy
from tests import _flagship as flagship
from tests._storage_faults import _gcsfs_waits_recorded

STEPS_PER_LOOP = 2  # and a save after every loop: checkpoints at steps 2, 4, 6, ...
KEEP = 2


def _estimator(work_dir: str, asynchronous: bool, **kwargs: Any):
    return flagship.estimator("mnist_net", work_dir, steps_per_loop=STEPS_PER_LOOP,
                              save_every_loops=1, save_every_secs=None,
                              keep_checkpoints=KEEP, async_checkpoints=asynchronous,
                              **kwargs)


def _weights(est) -> list[np.ndarray]:
    return [np.asarray(v.value) for v in est.model.variables]


def _error(call) -> dict[str, Any] | None:
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the test reads what was raised
        return {"type": type(err).__name__, "message": str(err),
                "mro": [k.__name__ for k in type(err).__mro__]}
    return None


def _bucket_listing(work_dir: str) -> dict[str, Any]:
    """Step folders under <work_dir>/checkpoints, and which hold the commit marker."""
    import tensorflow as tf

    orbax = f"{work_dir}/checkpoints"
    names = sorted(n.rstrip("/") for n in tf.io.gfile.listdir(orbax))
    return {"steps": names,
            "committed": [n for n in names
                          if tf.io.gfile.exists(f"{orbax}/{n}/commit_success.txt")],
            "entries": {n: sorted(tf.io.gfile.listdir(f"{orbax}/{n}")) for n in names}}


def first(work_dir: str, local_root: str) -> dict[str, Any]:
    x, y = flagship.digits("mnist_net")
    train, evaluate = flagship.train_input(x, y), flagship.eval_input(x, y)
    reference = _estimator(os.path.join(local_root, "reference"), False)
    reference.train(train, max_steps=8)
    np.savez(os.path.join(local_root, "w8.npz"), *_weights(reference))
    result = reference.evaluate(evaluate)
    np.save(os.path.join(local_root, "pred8.npy"), reference.predict(
        lambda p: fw.data.numpy_ds(x[flagship.NUM_TRAIN:], None, p["batch_size"],
                                   training=False)))
    reference.train(train, max_steps=10)
    np.savez(os.path.join(local_root, "w10.npz"), *_weights(reference))
    reference.close()

    est = _estimator(work_dir, False)
    est.train(train, max_steps=4)
    est.close()
    missing = _estimator("gs://no-such-bucket-fw-jax/run", False)
    # as on a multi-host slice (`jax.distributed`): staging is one host's
    two_processes = _error(lambda: run_format.StagedBucket("gs://b/run/checkpoints", KEEP,
                                                           processes=2))
    return {"engine": keras.backend.backend(), "devices": est.num_replicas,
            "reference_eval": {k: float(v) for k, v in result.items()},
            "step": est.global_step, "listing": _bucket_listing(work_dir),
            "missing_bucket": _error(lambda: missing.train(train, steps=2)),
            "two_processes": two_processes}


class _LockSeen(keras.callbacks.Callback):
    """Records, during training, whether the work_dir's lock file is on the bucket."""

    def __init__(self, work_dir: str) -> None:
        super().__init__()
        self.path, self.seen = f"{work_dir}/fenwicks.lock", []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append(fw.io.exists(self.path))


def second(work_dir: str, local_root: str) -> dict[str, Any]:
    x, y = flagship.digits("mnist_net")
    train, evaluate = flagship.train_input(x, y), flagship.eval_input(x, y)
    out: dict[str, Any] = {}
    # The user's next session: a new process, asynchronous saves.
    est = _estimator(work_dir, True)
    lock = _LockSeen(work_dir)
    est.train(train, max_steps=8, callbacks=[lock])
    out["resumed"] = {"steps": est.history.steps, "step": est.global_step,
                      "lock_during": lock.seen,
                      "lock_after": fw.io.exists(f"{work_dir}/fenwicks.lock"),
                      "events": len(fw.io.glob(f"{work_dir}/train/events.out.tfevents.*")),
                      "blocked_secs": est.parts.state.checkpointer.last_blocked_secs,
                      "save_secs": est.parts.state.checkpointer.last_save_secs,
                      "listing": _bucket_listing(work_dir)}
    np.savez(os.path.join(local_root, "resumed8.npz"), *_weights(est))
    est.close()

    # A new estimator reads the bucket's step 8, then saves step 10 while storage
    # refuses part of that upload.
    reader = _estimator(work_dir, True)
    out["evaluate"] = {k: float(v) for k, v in reader.evaluate(evaluate).items()}
    np.save(os.path.join(local_root, "gs_pred8.npy"), reader.predict(
        lambda p: fw.data.numpy_ds(x[flagship.NUM_TRAIN:], None, p["batch_size"],
                                   training=False)))
    out["failed_upload"] = _failed_upload(reader, work_dir, train)
    reader.close()

    keras.backend.clear_session()  # as a new session would: layer names start afresh
    warm = _estimator(os.path.join(local_root, "warm"), False, warm_start_from=work_dir)
    warm.evaluate(evaluate)  # builds the model: warm-started, as no checkpoint is there
    out["warm_start"] = {"report": warm.parts.state.warm_start_report,
                         "step": warm.global_step}
    np.savez(os.path.join(local_root, "warm.npz"), *_weights(warm))
    warm.close()

    out["failed_download"] = _failed_download(work_dir, evaluate)
    again = _estimator(work_dir, True)  # starts again after the failures
    again.train(train, max_steps=10)
    out["after_failure"] = {"steps": again.history.steps, "step": again.global_step,
                            "listing": _bucket_listing(work_dir)}
    np.savez(os.path.join(local_root, "resumed10.npz"), *_weights(again))
    again.close()
    out["no_credentials"] = _no_credentials(work_dir + "-nocred", train)
    return out


def _failed_upload(est, work_dir: str, train) -> dict[str, Any]:
    """The upload of step 10 fails after its first object: step 8 stays the latest."""
    # Only step 10 is saved in this call. gcsfs sends each of its files in one multipart
    # POST (the object's name is in the body); the first goes through, the rest fail.
    proxy.set_rules([{"fault": "503", "method": "POST", "path": "uploadType=multipart",
                      "skip": 1}])
    with _gcsfs_waits_recorded():  # gcsfs's 31-36 s of retry waits, slept 1/20 of
        error = _error(lambda: est.train(train, max_steps=10))
    fired = [rule["fired"] for rule in proxy.report()["rules"]]
    proxy.set_rules([])
    partial = f"{work_dir}/checkpoints/10"  # named as a warm-start source: refused

    def read_partial():
        cross_engine.warm_start(est.model, partial, "jax")

    return {"error": error, "fired": fired, "step": est.global_step,
            "listing": _bucket_listing(work_dir), "warm_from_partial": _error(read_partial)}


def _failed_download(work_dir: str, evaluate) -> dict[str, Any]:
    """Every download of gcsfs refused: a new estimator cannot read step 8, says so, and
    changes nothing."""
    est = _estimator(work_dir, True)
    proxy.set_rules([{"fault": "503", "method": "GET", "path": "^/download/"}])
    with _gcsfs_waits_recorded():
        error = _error(lambda: est.evaluate(evaluate))
    fired = [rule["fired"] for rule in proxy.report()["rules"]]
    proxy.set_rules([])
    return {"error": error, "fired": fired, "listing": _bucket_listing(work_dir)}


def _no_credentials(work_dir: str, train) -> dict[str, Any]:
    """No emulator, no token, no key file, an empty HOME: no credentials of any kind."""
    for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_AUTH_TOKEN_FOR_TESTING",
                 "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG"):
        os.environ.pop(name, None)
    os.environ["HOME"] = tempfile.mkdtemp()
    fw.gcs.reset_for_tests()
    est = _estimator(work_dir, True)
    return {"error": _error(lambda: est.train(train, steps=2))}


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    # A run that hangs leaves every thread's stack in LOCAL_ROOT for the failure report.
    faulthandler.dump_traceback_later(
        240, file=open(os.path.join(arguments[1], f"{command}-stacks.txt"), "w"))
    began = time.monotonic()
    result = {"first": first, "second": second}[command](*arguments)
    result["seconds"] = round(time.monotonic() - began, 1)
    print(json.dumps(result), flush=True)
