"""Issue 50, item 6: BERT's run_classifier runs --do_train, then --do_eval alone, then
--do_predict alone, each in a process of its own, as written (tests/_bert_flows.py).

Before, --do_eval alone failed (the front door called the model_fn in TRAIN, where
``num_train_steps`` is None: "None values not supported") and --do_predict alone raised
CheckpointMismatchError (the AdamWeightDecayOptimizer's 82 slots had nowhere to go).
The evaluation is checked against the predictions of the third process, in NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import run_module_json


def test_bert_do_train_then_do_eval_alone_then_do_predict_alone(tmp_path):
    runs = {flag: run_module_json("tests._bert_flows", str(tmp_path), flag, timeout=900)
            for flag in ("do_train", "do_eval", "do_predict")}
    result = runs["do_eval"]["eval"]
    probs = np.array(runs["do_predict"]["probabilities"])
    labels = np.array(runs["do_predict"]["labels"])
    keep = np.array(runs["do_predict"]["real"]) == 1
    assert probs.shape == (24, 3) and keep.sum() == 21
    assert result["global_step"] == 40  # the trained checkpoint, restored alone
    accuracy = np.mean(probs[keep].argmax(1) == labels[keep])
    cross_entropy = -np.mean(np.log(probs[keep][np.arange(21), labels[keep]]))
    assert result["eval_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert result["eval_loss"] == pytest.approx(cross_entropy, rel=1e-4)
