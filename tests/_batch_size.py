"""A training run for `tests/test_input_record.py`, in a fresh process:

    python -m tests._batch_size WORK_DIR TRN_BS STEPS

trains STEPS more steps of the narrow flagship mnist_net with global batch TRN_BS in
WORK_DIR (resumed if it holds a checkpoint) and prints one JSON line: the global step
after the call and the error's text, if `train` refused.
"""

from __future__ import annotations

import json
import sys

from tests import _flagship


def main(work_dir: str, batch_size: str, steps: str) -> dict:
    x, y = _flagship.digits("mnist_net")
    est = _flagship.estimator("mnist_net", work_dir, trn_bs=int(batch_size))
    try:
        est.train(_flagship.train_input(x, y), steps=int(steps))
        error = None
    except ValueError as err:
        error = f"{type(err).__name__}: {err}"
    return {"step": est.global_step, "error": error}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
