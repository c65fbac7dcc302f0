"""Runs every user flow with a planted fake credential and logging at its most verbose
(tests/test_security.py); prints one JSON document of what it did and the exception
messages it provoked. The test then looks for the credential everywhere.

    python -m tests._secrets_run local WORK_DIR EXPORT_DIR DEMO_DIR
    python -m tests._secrets_run gcs GS_WORK_DIR GS_EXPORT_DIR LOCAL_DIR   (in the namespace)
"""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any


def _verbose_logging() -> None:
    import tensorflow as tf

    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, force=True)
    tf.get_logger().setLevel(logging.DEBUG)
    tf.autograph.set_verbosity(10, alsologtostdout=True)


def _message(action) -> str | None:
    """The text a user would see of the exception `action` raises, cause chain included."""
    try:
        action()
    except Exception as err:  # noqa: BLE001 - every exception's text is checked
        parts, seen = [], err
        while seen is not None:
            parts.append(f"{type(seen).__name__}: {seen}")
            seen = seen.__cause__ or seen.__context__
        return "\n".join(parts)
    return None


def _flows(work_dir: str, export_dir: str) -> dict[str, Any]:
    """train, evaluate, predict, export, and resume, on `work_dir`."""
    import fenwicks as fw
    from tests import _estimator_helpers as helpers

    x, y = helpers.make_data(96)
    est = fw.train.get_tpu_estimator(3, helpers.model_func(), work_dir, trn_bs=32, seed=1)
    est.train(helpers.train_input(x, y), steps=3)
    result = est.evaluate(helpers.eval_input(x, y))
    est.predict(helpers.eval_input(x, y))
    est.export_saved_model(export_dir)
    again = fw.train.get_tpu_estimator(3, helpers.model_func(), work_dir, trn_bs=32)
    again.train(helpers.train_input(x, y), steps=1)
    return {"global_step": again.global_step, "accuracy": result["accuracy"]}


def local(work_dir: str, export_dir: str, demo_dir: str) -> dict[str, Any]:
    import fenwicks as fw
    from fenwicks import __main__ as cli

    _verbose_logging()
    out: dict[str, Any] = {"setup": fw.gcs.setup()}  # reads the planted ADC file
    fw.info()
    out["flows"] = _flows(work_dir, export_dir)
    # The command line's own `main` (what ``python -m fenwicks`` exits with), here rather
    # than in processes of its own: what it prints lands on the streams the test searches,
    # and this process's start-up output is searched already. Its exit statuses:
    out["cli"] = {"info": cli.main(["info"]),
                  "demo": cli.main(["demo", "--epochs", "1", "--work-dir", demo_dir])}
    out["errors"] = {
        "bad_batch": _message(lambda: fw.train.get_tpu_estimator(
            3, None, work_dir, trn_bs=-1)),
        "gcs_path": _message(lambda: fw.io.get_project_dirs("gs://", "x")),
        "upload_missing": _message(lambda: fw.io.upload(work_dir + "/nope", export_dir)),
    }
    # An ADC file that google.auth cannot use: its contents (the secrets) must not show.
    os.environ["GOOGLE_APPLICATION_CREDENTIALS"] = os.environ["FENWICKS_BROKEN_ADC"]
    fw.gcs.reset_for_tests()
    out["errors"]["broken_adc"] = _message(lambda: fw.gcs.check_credentials("gs://b/x"))
    return out


def gcs(work_dir: str, export_dir: str, local_dir: str) -> dict[str, Any]:
    import tensorflow as tf

    import fenwicks as fw
    from tests import _fault_proxy as proxy

    _verbose_logging()
    out: dict[str, Any] = {"setup": fw.gcs.setup()}
    out["flows"] = _flows(work_dir, export_dir)
    remote = work_dir.rsplit("/", 1)[0] + "/data"
    out["uploaded"] = fw.io.upload(local_dir, remote, progress=False)
    # A save that fails (storage refuses uploads): its error text is checked too.
    proxy.set_rules([{"fault": "503", "method": method, "path": "checkpoints|uploadType=multipart"}
                     for method in ("POST", "PUT")])
    est = fw.train.get_tpu_estimator(3, _model_func(), work_dir, trn_bs=32)
    out["errors"] = {"failed_save": _message(lambda: _train_more(est))}
    proxy.set_rules([])
    # Every object Fenwicks wrote on the bucket, as bytes, searched here (the test
    # process cannot reach the bucket).
    token = os.environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"].encode()
    objects = [os.path.join(folder, name)
               for top in (work_dir, export_dir, remote)
               for folder, _, names in tf.io.gfile.walk(top) for name in names]
    out["objects"] = len(objects)
    out["objects_with_token"] = [path for path in objects
                                 if token in tf.io.gfile.GFile(path, "rb").read()]
    return out


def _model_func():
    from tests import _estimator_helpers as helpers

    return helpers.model_func()


def _train_more(est) -> None:
    from tests import _estimator_helpers as helpers

    x, y = helpers.make_data(96)
    est.train(helpers.train_input(x, y), steps=1)


def main() -> None:
    mode, *args = sys.argv[1:]
    print(json.dumps({"local": local, "gcs": gcs}[mode](*args)))


if __name__ == "__main__":
    main()
