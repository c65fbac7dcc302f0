"""fenwicks.train.history: the in-memory `History` for plots, and the epoch log
(``<work_dir>/epochs.jsonl``) that resumed runs replay; on local disk, in-process."""

from __future__ import annotations

import json
import os

import numpy as np

from fenwicks.train import history


def test_history_metric_gives_steps_and_values_of_each_evaluation():
    record = history.History()
    record.evals += [{"loss": 0.9, "accuracy": 0.5, "global_step": 100},
                     {"loss": 0.4, "accuracy": 0.75, "global_step": np.int64(200)}]
    assert record.metric("accuracy") == ([100, 200], [0.5, 0.75])
    assert record.metric("loss") == ([100, 200], [0.9, 0.4])
    steps, values = record.metric("accuracy")
    assert all(type(s) is int for s in steps) and all(type(v) is float for v in values)
    assert history.History().metric("accuracy") == ([], [])


def test_the_epoch_log_keeps_only_what_the_checkpoint_holds(tmp_path):
    work = str(tmp_path)
    assert history.read_epochs(work, 100) == []
    for epoch in range(4):
        history.append_epoch(work, epoch, 10 * (epoch + 1), {"val_loss": 1.0 / (epoch + 1)})
    assert [e["step"] for e in history.read_epochs(work, 25)] == [10, 20]
    # A run resumed from step 20 redoes epoch 2: the old entries past 20 are replaced.
    history.append_epoch(work, 2, 30, {"val_loss": 0.5})
    entries = history.read_epochs(work, 1000)
    assert [(e["epoch"], e["step"], e["logs"]["val_loss"]) for e in entries] == [
        (0, 10, 1.0), (1, 20, 0.5), (2, 30, 0.5)]


def test_the_epoch_log_is_one_json_object_per_line_with_plain_floats(tmp_path):
    work = str(tmp_path)
    history.append_epoch(work, 0, 10, {"loss": np.float32(0.5), "val_accuracy": 1})
    history.append_epoch(work, 1, 20, {"loss": np.float64(0.25)})
    path = tmp_path / history.EPOCH_LOG
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"epoch": 0, "step": 10, "logs": {"loss": 0.5, "val_accuracy": 1.0}},
        {"epoch": 1, "step": 20, "logs": {"loss": 0.25}}]
    assert os.listdir(tmp_path) == [history.EPOCH_LOG]  # the .tmp file was renamed


def test_a_missing_or_empty_epoch_log_has_no_entries(tmp_path):
    assert history.read_epochs(str(tmp_path / "never-created"), 10) == []
    (tmp_path / history.EPOCH_LOG).write_text("\n\n")
    assert history.read_epochs(str(tmp_path), 10) == []
