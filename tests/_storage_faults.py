"""Storage-fault scenarios run inside the fault emulator's namespace (tests/test_storage_faults.py).

Each scenario drives real Fenwicks code against ``gs://`` through `tests._fault_proxy`,
switching faults on and off between phases, and prints one JSON document: per phase the
seconds it took, what the proxy did (``fired`` per rule), the error raised (type and
message) and what storage holds afterwards.

    python -m tests._storage_faults save_and_restore gs://bucket/run/work
    python -m tests._storage_faults restore_outage gs://bucket/run/work
    python -m tests._storage_faults upload gs://bucket/run/data /tmp/local
    python -m tests._storage_faults missing_bucket gs://no-such-bucket/run
    python -m tests._storage_faults outage gs://bucket/run/work down|hold SECONDS
    python -m tests._storage_faults train_to gs://bucket/run/work MAX_STEPS
    python -m tests._storage_faults no_credentials gs://bucket/run/work EMPTY_HOME
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any

import numpy as np

from tests import _fault_proxy as proxy

# Requests for checkpoint objects: every request under <work_dir>/checkpoints/ (the step
# folders' files, their commit markers, the listing of steps), URL-encoded or not.
CHECKPOINT_OBJECTS = "checkpoints"
# Uploads of checkpoint objects: TensorFlow's name the object in the URL; gcsfs's (the step
# folders' files) name it in the body, and are the only gcsfs uploads while training.
CHECKPOINT_UPLOADS = "checkpoints|uploadType=multipart"
# The marker a gs:// step is uploaded with, last (orbax's items have their own inside).
COMMIT_MARKER = "commit_success"


def _step_objects(step: int) -> str:
    """The regex of the requests for the objects of one step folder."""
    return rf"checkpoints(/|%2F){step}(/|%2F)"


UPLOADS = ("POST", "PUT")
_last_error: list[BaseException] = []  # the exceptions `_phase` caught, newest last


def _phase(action, rules: list[dict[str, Any]] | None,
           scaled_waits: bool = False) -> dict[str, Any]:
    """Runs `action()` with `rules` in force (None: the action sets them); what happened,
    then clears the rules. `scaled_waits`: gcsfs's retry waits recorded (``gcsfs_waits``)
    and slept GCSFS_WAIT_SCALE of."""
    proxy.set_rules(rules or [])
    start = time.monotonic()
    outcome: dict[str, Any] = {"error": None}
    try:
        with _gcsfs_waits_recorded() if scaled_waits else contextlib.nullcontext([]) \
                as waits:
            try:
                outcome["value"] = action()
            finally:
                outcome["gcsfs_waits"] = list(waits)
    except Exception as err:  # noqa: BLE001 - the scenario reports every failure
        _last_error.append(err)
        outcome["error"] = {"type": type(err).__name__, "message": str(err),
                            "mro": [k.__name__ for k in type(err).__mro__],
                            "cause": repr(err.__cause__)[:300],
                            "code": getattr(err, "error_code", None)}
    outcome["seconds"] = round(time.monotonic() - start, 2)
    state = proxy.report()
    outcome["fired"] = [rule["fired"] for rule in state["rules"]]
    outcome["requests"] = len(state["log"])
    proxy.set_rules([])
    return outcome


def _objects(work_dir: str) -> list[str]:
    """Every object under `work_dir`/checkpoints, relative to it (``4/commit_success.txt``)."""
    import tensorflow as tf

    from fenwicks.train import run_format

    folder = run_format.directory(work_dir)
    return sorted(f"{root[len(folder):].strip('/')}/{name}".lstrip("/")
                  for root, _, files in tf.io.gfile.walk(folder) for name in files)


def _latest(work_dir: str) -> str | None:
    from fenwicks.train import run_format

    return run_format.latest(work_dir)


def _md5s(folder: str) -> dict[str, str]:
    """md5 of every file under a local `folder`, by relative path."""
    import hashlib

    digest = {}
    for root, _, files in os.walk(folder):
        for file in files:
            path = os.path.join(root, file)
            with open(path, "rb") as f:
                digest[os.path.relpath(path, folder)] = hashlib.md5(
                    f.read(), usedforsecurity=False).hexdigest()
    return digest


def _estimator(work_dir: str):
    import fenwicks as fw
    from tests import _estimator_helpers as helpers

    # Two steps per compiled loop and a save after each: checkpoints at steps 2, 4, ...
    return fw.train.get_tpu_estimator(10, helpers.model_func(), work_dir, trn_bs=32, seed=2,
                                      steps_per_loop=2, save_every_loops=1, verbose=False)


def _weights(est) -> list[list[float]]:
    return [np.asarray(w).ravel().tolist() for w in est.model.get_weights()]


def save_and_restore(work_dir: str) -> dict[str, Any]:
    """Transient faults while saving and restoring; a save that cannot succeed."""
    from tests import _estimator_helpers as helpers

    x, y = helpers.make_data(200)
    train, evaluate = helpers.train_input(x, y), helpers.eval_input(x, y)
    out: dict[str, Any] = {}
    est = _estimator(work_dir)
    # Every kind of fault, a few times each, on the requests that write checkpoints.
    # Reads (the listing of steps, existence checks) and writes get different faults: one
    # request meets at most 4 in a row, within both clients' retries (6 attempts each).
    transient = [
        {"fault": "503", "method": "GET", "path": CHECKPOINT_OBJECTS, "times": 3},
        {"fault": "503", "method": "POST", "path": CHECKPOINT_UPLOADS, "times": 1},
        {"fault": "reset", "method": "POST", "path": CHECKPOINT_UPLOADS, "times": 1},
        {"fault": "reset", "method": "PUT", "path": CHECKPOINT_OBJECTS, "times": 1},
        {"fault": "truncate", "method": "POST", "path": CHECKPOINT_UPLOADS, "times": 2},
        {"fault": "delay", "method": "GET", "path": CHECKPOINT_OBJECTS, "times": 1,
         "seconds": 3},
    ]
    out["transient_save"] = _phase(lambda: est.train(train, steps=4) and None, transient,
                                   scaled_waits=True)
    out["transient_save"]["latest"] = _latest(work_dir)
    out["saved_weights"] = _weights(est) if out["transient_save"]["error"] is None else []
    # Storage refuses every checkpoint upload: the save after steps 5-6 cannot succeed.
    refuse = [{"fault": "503", "method": method, "path": CHECKPOINT_UPLOADS}
              for method in UPLOADS]
    out["failed_save"] = _phase(lambda: est.train(train, steps=2) and None, refuse,
                                scaled_waits=True)
    out["failed_save"]["latest"] = _latest(work_dir)
    out["failed_save"]["objects"] = _objects(work_dir)
    # The step's files uploaded, then its commit marker cannot be: the new step must not
    # become the latest.
    marker = [{"fault": "503", "method": method, "path": _step_objects(6) + COMMIT_MARKER}
              for method in UPLOADS]
    again = _estimator(work_dir)
    out["failed_marker"] = _phase(lambda: again.train(train, steps=2) and None, marker,
                                  scaled_waits=True)
    out["failed_marker"]["latest"] = _latest(work_dir)
    out["failed_marker"]["objects"] = _objects(work_dir)
    # A new process-like start reads the newest complete checkpoint through faults.
    reads = [
        {"fault": "503", "method": "GET", "path": CHECKPOINT_OBJECTS, "times": 3},
        {"fault": "truncate", "method": "GET", "path": "alt=media", "times": 2},
        {"fault": "reset", "method": "GET", "path": CHECKPOINT_OBJECTS, "times": 1},
        {"fault": "delay", "method": "GET", "path": CHECKPOINT_OBJECTS, "times": 1,
         "seconds": 3},
    ]
    fresh = _estimator(work_dir)
    out["transient_restore"] = _phase(lambda: fresh.evaluate(evaluate), reads,
                                      scaled_waits=True)
    out["transient_restore"]["weights"] = (
        _weights(fresh) if out["transient_restore"]["error"] is None else [])
    out["final_objects"] = _objects(work_dir)
    return out


def restore_outage(work_dir: str) -> dict[str, Any]:
    """The newest checkpoint cannot be read (storage down for it): a clear error, and
    neither an older checkpoint nor a fresh start is silently taken instead."""
    from fenwicks.train import run_format
    from tests import _estimator_helpers as helpers

    x, y = helpers.make_data(200)
    est = _estimator(work_dir)
    est.train(helpers.train_input(x, y), steps=4)  # steps 2 and 4
    out: dict[str, Any] = {"latest": _latest(work_dir)}
    outage = [{"fault": "503", "method": "GET", "path": _step_objects(4)}]
    # The download the estimator restores a gs:// step through (StagedBucket.fetch), on
    # its own: an error naming the step, or, through transient faults, the bucket's
    # files byte for byte (compared with a download without faults).
    bucket = run_format.StagedBucket(run_format.directory(work_dir), keep=3)
    local = os.path.join(bucket.scratch, "4")

    def fetch() -> dict[str, str]:
        bucket.fetch(4, local, ("not known",))
        return _md5s(local)

    out["read_outage"] = _phase(fetch, outage, scaled_waits=True)
    out["read_outage"]["left_locally"] = os.path.exists(local)
    transient = [{"fault": "503", "method": "GET", "path": _step_objects(4), "times": 2}]
    out["read_transient"] = _phase(fetch, transient, scaled_waits=True)
    out["read_clean"] = _phase(fetch, [])
    bucket.close()
    # The listing of the steps (TensorFlow's client: every request a list of objects
    # with a prefix), its retries used up: one sentence naming the folder.
    listing = [{"fault": "503", "method": "GET", "path": r"[?&]prefix="}]
    out["listing_outage"] = _phase(
        lambda: run_format.complete_steps(run_format.directory(work_dir)), listing)
    # The estimator itself, starting on that work_dir during the outage.
    fresh = _estimator(work_dir)
    out["outage"] = _phase(lambda: fresh.evaluate(helpers.eval_input(x, y)), outage,
                           scaled_waits=True)
    out["objects_after"] = _objects(work_dir)
    out["latest_after"] = _latest(work_dir)
    return out


# gcsfs waits ``min(2 ** (retry - 1) + U(0, 1), 32)`` s before each of its retries. The
# upload scenario records each wait and sleeps GCSFS_WAIT_SCALE of it: the test checks
# the waits a user would sleep (31-36 s in an outage) without spending them.
GCSFS_WAIT_SCALE = 0.05


@contextlib.contextmanager
def _gcsfs_waits_recorded() -> Any:
    """Yields the list of gcsfs's retry waits (seconds asked for) while shortened."""
    import gcsfs.retry

    real, waits = gcsfs.retry.asyncio, []

    class _Asyncio:  # what gcsfs.retry calls `asyncio`, with a recorded, shorter sleep
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        @staticmethod
        async def sleep(seconds: float) -> None:
            waits.append(seconds)
            await real.sleep(seconds * GCSFS_WAIT_SCALE)

    gcsfs.retry.asyncio = _Asyncio()
    try:
        yield waits
    finally:
        gcsfs.retry.asyncio = real


def upload(remote_dir: str, local_dir: str) -> dict[str, Any]:
    """fw.io.upload of a directory through transient faults, then through an outage."""
    import hashlib

    import fenwicks as fw

    def send():
        with _gcsfs_waits_recorded() as waits:
            try:
                return fw.io.upload(local_dir, remote_dir, workers=4, progress=False)
            finally:
                gcsfs_waits.append(waits)

    gcsfs_waits: list[list[float]] = []  # per phase

    out: dict[str, Any] = {}
    transient = [
        {"fault": "503", "method": "POST", "times": 3},
        {"fault": "reset", "method": "POST", "times": 2},
        {"fault": "truncate", "method": "POST", "times": 1},
        {"fault": "delay", "method": "POST", "times": 1, "seconds": 3},
        {"fault": "503", "method": "GET", "times": 2},
    ]
    out["transient"] = _phase(send, transient)
    name = os.path.basename(os.path.normpath(local_dir))
    back = os.path.join(os.path.dirname(os.path.normpath(local_dir)), "downloaded")
    fw.io.download(f"{remote_dir}/{name}", back, progress=False)
    digest = {}
    for folder, _, files in os.walk(os.path.join(back, name)):
        for file in files:
            path = os.path.join(folder, file)
            with open(path, "rb") as f:
                digest[os.path.relpath(path, os.path.join(back, name))] = hashlib.md5(
                    f.read(), usedforsecurity=False).hexdigest()
    out["downloaded_md5"] = digest
    with open(os.path.join(local_dir, "late.bin"), "wb") as f:
        f.write(os.urandom(3000))
    out["outage"] = _phase(send, [{"fault": "503", "method": "POST"}])
    out["after_outage"] = _phase(send, [])
    for phase, waits in zip(("transient", "outage", "after_outage"), gcsfs_waits,
                            strict=True):
        out[phase]["gcsfs_waits"] = waits
    return out


# The deadline scenarios train the narrow mnist_net on 8x8 digits, 2 steps per compiled
# loop and a checkpoint after each: checkpoints/2, checkpoints/4, ... up to OUTAGE_TARGET.
OUTAGE_AT, OUTAGE_TARGET = 4, 10


def _digits_estimator(work_dir: str):
    from tests import _flagship as flagship

    x, y = flagship.digits("mnist_net")
    est = flagship.estimator("mnist_net", work_dir, steps_per_loop=2, save_every_loops=1,
                             save_every_secs=None)
    return est, flagship.train_input(x, y)


def _variables(est) -> list[list[float]]:
    return [np.asarray(v).ravel().tolist() for v in est.model.variables]


def missing_bucket(root: str) -> dict[str, Any]:
    """fw.io and the estimator on a bucket that does not exist: an error within seconds."""
    import fenwicks as fw

    out = {"io": _phase(lambda: fw.io.get_project_dirs(root, "p"), [])}
    est, train = _digits_estimator(root + "/work")
    out["train"] = _phase(lambda: est.train(train, steps=2) and None, [])
    return out


def outage(work_dir: str, fault: str, seconds: str) -> dict[str, Any]:
    """Storage goes away once step OUTAGE_AT is saved: ``down`` (every connection reset,
    for good) or ``hold`` (no answer for `seconds`, then normal service)."""
    import keras

    from fenwicks import _deadline

    est, train = _digits_estimator(work_dir)
    began: dict[str, float] = {}

    class StorageGoes(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if est.global_step >= OUTAGE_AT and not began:
                # Storage goes between saves: the checkpoint of step 2 is complete first
                # (with async checkpoints it may still be in flight after a fast loop).
                est.parts.state.wait()
                rule = {"fault": fault}
                if fault == "hold":
                    rule["until"] = time.time() + float(seconds)
                proxy.set_rules([rule])
                began["at"] = time.monotonic()

    outcome = _phase(lambda: est.train(train, max_steps=OUTAGE_TARGET,
                                       callbacks=[StorageGoes()]) and None, None)
    outcome["seconds_after_outage"] = round(time.monotonic() - began["at"], 2)
    outcome["step"] = est.global_step
    outcome["last_checkpoint"] = getattr(_error_of(outcome), "last_checkpoint", None)
    outcome["deadline"] = _deadline.deadline_secs()
    if fault == "hold":
        outcome["variables"] = _variables(est)
    return outcome


def _error_of(outcome: dict[str, Any]) -> BaseException | None:
    return _last_error[-1] if outcome["error"] and _last_error else None


def train_to(work_dir: str, max_steps: str) -> dict[str, Any]:
    """A new process on `work_dir` (resumed or fresh) trains to `max_steps`."""
    est, train = _digits_estimator(work_dir)
    latest = _latest(work_dir)
    est.train(train, max_steps=int(max_steps))
    return {"resumed_from": latest, "step": est.global_step, "variables": _variables(est)}


def no_credentials(work_dir: str, home: str) -> dict[str, Any]:
    """`est.train` on gs:// with no credentials at all (no emulator, no token, `home` an
    empty HOME: set by `main`)."""
    est, train = _digits_estimator(work_dir)
    return {"train": _phase(lambda: est.train(train, steps=2) and None, [])}


SCENARIOS = {"save_and_restore": save_and_restore, "restore_outage": restore_outage,
             "upload": upload, "missing_bucket": missing_bucket, "outage": outage,
             "train_to": train_to, "no_credentials": no_credentials}


def main() -> None:
    scenario, *args = sys.argv[1:]
    if scenario == "no_credentials":  # before google.auth or TensorFlow's auth read them
        for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_AUTH_TOKEN_FOR_TESTING",
                     "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG"):
            os.environ.pop(name, None)
        os.environ["HOME"] = args[1]  # here, not in the request: the process is forked
    print(json.dumps(SCENARIOS[scenario](*args)), flush=True)
    if scenario == "outage":
        # A call abandoned at its deadline may still be inside TensorFlow's client; if it
        # returns to Python while the interpreter shuts down, the process aborts
        # ("FATAL: exception not rethrown"). The report is out: leave at once.
        os._exit(0)


if __name__ == "__main__":
    main()
