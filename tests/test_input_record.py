"""`fenwicks.train.input_record`: a run resumed with another trn_bs is refused, naming
both, because its input position counts batches of the first (issue 46: it resumed
silently and read other examples); a fresh run records its own batch size."""

from __future__ import annotations

import json

import pytest

from fenwicks.train import input_record
from tests.conftest import run_module_json
from tests.test_jax_engine import _env


def _record(batch_size: int) -> dict:
    return {"train_batch_size": batch_size, "step": 12, "input_steps": 12}


def test_a_resume_must_match_the_batch_size_of_the_restored_steps_record(tmp_path):
    input_record.check(str(tmp_path), batch_size=32, position=12, record=_record(32))
    with pytest.raises(input_record.BatchSizeChangedError,
                       match=r"trn_bs=64 differs from the trn_bs=32 .*\(12 steps\) is counted "
                             r"in batches of 32.*Pass trn_bs=32 to continue"):
        input_record.check(str(tmp_path), batch_size=64, position=12, record=_record(32))
    # position 0: the checkpoints were cleaned away, so the new run is a fresh one
    input_record.check(str(tmp_path), batch_size=64, position=0, record=None)
    assert list(tmp_path.iterdir()) == []  # the run format holds the record: no file


def test_a_work_dir_of_the_previous_format_is_checked_against_its_file(tmp_path):
    (tmp_path / input_record.FILE).write_text(json.dumps({"train_batch_size": 32}))
    input_record.check(str(tmp_path), batch_size=32, position=5)
    with pytest.raises(input_record.BatchSizeChangedError, match=r"trn_bs=16 differs"):
        input_record.check(str(tmp_path), batch_size=16, position=5)
    # the step's own record, when there is one, is what counts
    input_record.check(str(tmp_path), batch_size=16, position=5, record=_record(16))
    (tmp_path / input_record.FILE).write_text("{")  # unreadable: cannot be checked
    input_record.check(str(tmp_path), batch_size=16, position=5)
    assert (tmp_path / input_record.FILE).read_text() == "{"  # and never rewritten


@pytest.mark.slow
@pytest.mark.parametrize("devices", [None, 8], ids=["tf", "jax8"])
def test_a_changed_trn_bs_is_refused_across_processes_on_both_engines(tmp_path, devices):
    work = str(tmp_path / "run")

    def run(batch_size: int, steps: int) -> dict:
        return run_module_json("tests._batch_size", work, str(batch_size), str(steps),
                               env=_env(devices))

    assert run(32, 4) == {"step": 4, "error": None}
    refused = run(64, 4)
    assert refused["step"] == 4  # restored, not trained
    assert refused["error"].startswith("BatchSizeChangedError: trn_bs=64 differs from the "
                                       "trn_bs=32 this work_dir's run was trained with")
    assert run(32, 2) == {"step": 6, "error": None}  # the same batch size resumes
