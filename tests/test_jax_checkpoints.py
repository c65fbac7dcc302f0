"""A work_dir the JAX engine wrote before the run format (``orbax/<step>``), with a
damaged step, read by `fenwicks.train.jax.checkpoints.LegacyReader`: the newest intact
step is restored, with the run format's warning, once. One process
(`tests._jax_checkpoints`, on the JAX engine) runs every case. The run format's own
damaged steps are in test_faults.py."""

from __future__ import annotations

import functools

from tests.conftest import run_module_json


@functools.cache
def _cases(root: str) -> dict:
    return run_module_json("tests._jax_checkpoints", root,
                           env={"KERAS_BACKEND": "jax", "FENWICKS_DEVICE": None})


def _run(tmp_path_factory) -> dict:
    return _cases(str(tmp_path_factory.getbasetemp() / "jax_checkpoints"))


def _falls_back(case: dict, work_dir: str, why: str) -> None:
    older, newer = f"{work_dir}/orbax/1", f"{work_dir}/orbax/2"
    for attempt in ("first", "second"):
        assert case[attempt] == {"restored": older, "step": 1, "w_is_step_1": True}, case
    assert len(case["warnings"]) == 1, case["warnings"]  # said once: the step is set aside
    assert case["warnings"][0].startswith(f"fenwicks: checkpoint {newer} is unreadable "
                                          f"({why}")
    assert case["warnings"][0].endswith(f"); resumed from the older {older} instead. Its "
                                        f"files are kept as {newer}.corrupt")
    assert case["listing"] == ["1", "2.corrupt"]  # kept, not deleted


def test_a_truncated_data_file_falls_back_to_the_older_step(tmp_path_factory):
    """Was: a bare `Exception: Encountered error while reading array index`."""
    report = _run(tmp_path_factory)
    work_dir = str(tmp_path_factory.getbasetemp() / "jax_checkpoints" / "truncated")
    _falls_back(report["truncated"], work_dir, "its data files are cut short or damaged; "
                "Encountered error while reading array index")


def test_a_garbled_metadata_file_falls_back_to_the_older_step(tmp_path_factory):
    """Was: "does not fit this model ... use the model_func that wrote it"."""
    report = _run(tmp_path_factory)
    work_dir = str(tmp_path_factory.getbasetemp() / "jax_checkpoints" / "garbled")
    _falls_back(report["garbled"], work_dir, "its _METADATA is unreadable; Expecting value")


def test_no_readable_step_and_another_models_step_are_named(tmp_path_factory):
    report = _run(tmp_path_factory)
    work_dir = str(tmp_path_factory.getbasetemp() / "jax_checkpoints" / "all")
    every = report["all"]
    assert every["first"]["error"] == "CheckpointCorruptError"
    assert every["first"]["message"].startswith(
        f"work_dir={work_dir!r} lists 2 checkpoint(s) and none can be read "
        f"({work_dir}/orbax/2: its data files are cut short")
    assert "Nothing was changed" in every["first"]["message"]
    assert every["listing"] == ["1", "2"] and every["warnings"] == []  # nothing set aside
    other = report["other_model"]["first"]
    assert other["error"] == "ValueError" and "does not fit this model" in other["message"]
    assert report["other_model"]["listing"] == ["1", "2"]
