"""`fw.train.EarlyStopping` and `fw.train.BestExporter` in one process of a run.

    python -m tests._callbacks_resume WORK_DIR EPOCHS

trains the narrow `mnist_net` with `train_and_evaluate(epochs=EPOCHS)` and both
callbacks, and prints the global step reached and the exporter's ``best.json``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import fenwicks as fw
from tests import _callbacks
from tests import _flagship as flagship


def run(work_dir: str, epochs: str) -> dict[str, Any]:
    x, y = flagship.digits(_callbacks.MODEL)
    best_dir = os.path.join(work_dir, "best")
    callbacks = [fw.train.EarlyStopping(monitor="val_loss", patience=1, min_delta=10),
                 fw.train.BestExporter(best_dir, monitor="val_accuracy")]
    est = _callbacks.make_estimator(work_dir)
    est.train_and_evaluate(flagship.train_input(x, y), flagship.eval_input(x, y),
                           epochs=int(epochs), callbacks=callbacks)
    try:
        best_file = os.path.join(fw.train.latest_export(best_dir), "best.json")
        best = json.load(open(best_file))
    except FileNotFoundError:  # no best exported yet
        best = None
    return {"step": est.global_step, "best": best}


if __name__ == "__main__":
    print(json.dumps(run(*sys.argv[1:])))
