"""`python -m fenwicks info|demo|bench` as a user runs it: real processes. A user error is
one line on stderr and exit status 2; a traceback only with ``--debug``."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from fenwicks import __main__ as cli
from fenwicks import _quiet
from tests.conftest import run_process


def _fenwicks(*args: str, tmp_path, device: str | None = None,
              fresh: bool = False) -> subprocess.CompletedProcess:
    """``python -m fenwicks *args``, forked from the test zygote (`run_process`): its
    stderr is what Fenwicks prints once imported. `fresh`: a new interpreter, whose
    stderr also holds what ``import fenwicks`` prints."""
    # A new interpreter's TensorFlow announces oneDNN through absl at import, whatever
    # TF_CPP_MIN_LOG_LEVEL says: the command line's filter drops it (fenwicks/_quiet.py).
    return run_process(["-m", "fenwicks", *args], cwd=tmp_path, timeout=300, check=False,
                       env={"FENWICKS_ROOT": str(tmp_path), "FENWICKS_DEVICE": device},
                       fresh=fresh)


def _has_gpu() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


CASES = [
    # (arguments, FENWICKS_DEVICE, what the one line must say)
    (["info"], "bogus", "fenwicks info: error: device='bogus' is not a device spec; use "),
    (["info"], "gpu", "fenwicks info: error: device='gpu' was requested but no GPU was found"),
    (["bench", "--n", "64"], "gpu",
     "fenwicks bench: error: device='gpu' was requested but no GPU was found"),
    (["bench", "--n", "-3"], None, "fenwicks bench: error: n=-3 must be a positive integer"),
    (["bench", "--trials", "many"], None,
     "fenwicks bench: error: argument --trials: invalid int value: 'many' (see python -m "
     "fenwicks bench --help)"),
    (["demo", "--epochs", "0"], None,
     "fenwicks demo: error: epochs=0 must be a positive integer, e.g. --epochs 12"),
    (["demo", "--batch-size", "5000"], None,
     "fenwicks demo: error: batch_size=5000 exceeds the 1347 training digits"),
    (["demo", "--epochs", "x"], None,
     "fenwicks demo: error: argument --epochs: invalid int value: 'x'"),
    (["demo", "--colour"], None, "fenwicks: error: unrecognized arguments: --colour"),
    (["train"], None, "fenwicks: error: argument command: invalid choice: 'train'"),
    ([], None, "fenwicks: error: the following arguments are required: command"),
]


# Options and values are checked by the same `main` that ``python -m fenwicks`` exits with
# (``sys.exit(main())``): in-process, fast. The cases that need a device chosen when
# TensorFlow starts run in real processes, which also prove the module's wiring.
IN_PROCESS = [case for case in CASES if case[1] is None]
IN_A_PROCESS = [case for case in CASES if case[1] is not None]


@pytest.mark.parametrize("args, device, message", IN_PROCESS,
                         ids=[" ".join(a) for a, _, _ in IN_PROCESS])
def test_a_user_error_is_one_line_and_status_2(args, device, message, tmp_path, capsys,
                                               monkeypatch):
    monkeypatch.setenv("FENWICKS_ROOT", str(tmp_path))
    try:
        status = cli.main(args)
    except SystemExit as exit_:  # argparse's errors exit from parse_args
        status = exit_.code
    out, err = capsys.readouterr()
    assert status == 2, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(message), lines[0]
    assert out == "" or "error" not in out
    assert os.listdir(tmp_path) == []  # a refused command writes nothing


@pytest.mark.slow
@pytest.mark.parametrize("args, device, message", IN_A_PROCESS,
                         ids=[" ".join([d, *a]) for a, d, _ in IN_A_PROCESS])
def test_a_device_error_is_one_line_and_status_2_in_a_real_process(args, device, message,
                                                                  tmp_path):
    if device == "gpu" and _has_gpu():
        pytest.skip("this machine has a GPU")
    proc = _fenwicks(*args, tmp_path=tmp_path, device=device)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(message), lines[0]
    assert proc.stdout == "" or "error" not in proc.stdout


@pytest.mark.slow
def test_a_work_dir_that_is_a_file_is_one_line_and_the_file_is_untouched(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("my notes")
    proc = _fenwicks("demo", "--epochs", "1", "--work-dir", str(path), tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"fenwicks demo: error: work_dir='{path}' is a file; give a directory for "
        "checkpoints and logs (created if missing) (--debug shows where)"]
    assert path.read_text() == "my notes"
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]  # nothing else written


@pytest.mark.slow
def test_debug_shows_the_traceback(tmp_path):
    for args in (["--debug", "info"], ["info", "--debug"]):
        proc = _fenwicks(*args, tmp_path=tmp_path, device="bogus")
        assert proc.returncode == 1, proc.stderr
        assert "Traceback (most recent call last)" in proc.stderr
        assert proc.stderr.strip().splitlines()[-1].startswith(
            "ValueError: device='bogus' is not a device spec")


@pytest.mark.slow
def test_info_says_why_this_accelerator(tmp_path):
    # A new interpreter, as a user starts it: nothing else on stderr, import included.
    proc = _fenwicks("info", tmp_path=tmp_path, device="cpu:2", fresh=True)
    assert proc.returncode == 0, proc.stderr
    rows = dict(line.split(None, 1) if not line.startswith("chosen by") else
                ("chosen by", line[len("chosen by"):].strip())
                for line in proc.stdout.splitlines())
    assert rows["chosen by"] == ("FENWICKS_DEVICE=cpu:2: the CPU split into 2 logical "
                                 "devices, to simulate 2 replicas as on a TPU (for testing: "
                                 "it is not faster)")
    assert rows["replicas"] == "2"
    assert proc.stderr == ""


# What TensorFlow's and absl's C++ logging print: "I0000 00:00:17... file.cc:227] ..." and
# absl's notice before its first line; oneDNN announces itself through the same logging.
_CPP_LOG = re.compile(r"^([IWEF]\d{4} |WARNING: All log messages before absl)|oneDNN|"
                      r"cpu_feature_guard|rebuild TensorFlow", re.M)


@pytest.mark.slow
@pytest.mark.parametrize("args", [["info"], ["demo", "--epochs", "1"]], ids=["info", "demo"])
def test_the_command_line_prints_no_start_up_logging_of_tensorflow(args, tmp_path):
    # A user's shell: none of the tests' quieting variables (run_process sets
    # TF_CPP_MIN_LOG_LEVEL=2 for the others), a new interpreter.
    env = {"TF_CPP_MIN_LOG_LEVEL": None, "TF_ENABLE_ONEDNN_OPTS": None,
           "FENWICKS_ROOT": str(tmp_path), "FENWICKS_DEVICE": None}
    proc = run_process(["-m", "fenwicks", *args], cwd=tmp_path, env=env, fresh=True)
    assert not _CPP_LOG.search(proc.stdout), proc.stdout
    assert not _CPP_LOG.search(proc.stderr), proc.stderr
    if args == ["info"]:
        assert proc.stdout.startswith("python ") and proc.stderr == "", proc.stderr
    else:  # the demo's progress bar, and nothing else
        assert re.sub(r"[^\r\n]*step/s[^\r\n]*", "", proc.stderr).strip() == "", proc.stderr
        assert "test accuracy" in proc.stdout
    # A program that imports Fenwicks keeps TensorFlow's logging as the user set it.
    # (TensorFlow's import sets TF_CPP_MIN_LOG_LEVEL=1 itself; the others are Fenwicks'.)
    if args == ["info"]:
        probe = run_process(["-c", "import os, fenwicks; print(*(os.environ.get(name) for "
                             f"name in {sorted(_quiet.QUIET_ENV)}))"], cwd=tmp_path,
                            env=env, fresh=True)
        assert probe.stdout.split() == ["None", "1", "None", "None"]


@pytest.mark.slow
def test_with_debug_the_start_up_lines_are_shown(tmp_path):
    # What the filter drops is there without it: on this TensorFlow (2.20, 2.21) the
    # absl notice comes at import whatever TF_CPP_MIN_LOG_LEVEL says; proc.stderr would
    # be empty on a TensorFlow that printed nothing (then the filter has nothing to do).
    env = {"TF_CPP_MIN_LOG_LEVEL": None, "FENWICKS_ROOT": str(tmp_path)}
    proc = run_process(["-m", "fenwicks", "--debug", "info"], cwd=tmp_path, env=env,
                       fresh=True)
    shown = [line for line in proc.stderr.splitlines()
             if _quiet.is_start_up_line(line.encode())]
    assert shown == proc.stderr.splitlines(), proc.stderr  # all of them known lines
    import tensorflow as tf

    if tf.__version__.startswith(("2.20.", "2.21.")):
        assert any("absl::InitializeLog" in line for line in shown), proc.stderr


# Each line TensorFlow 2.21 (tensorflow-cpu 2.21.0) and 2.20 printed at start-up, as printed.
START_UP = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795879641.610521   21720 port.cc:153] oneDNN custom operations are on. "
    "You may see slightly different numerical results due to floating-point round-off "
    "errors from different computation orders. To turn them off, set the environment "
    "variable `TF_ENABLE_ONEDNN_OPTS=0`.",
    "I0000 00:00:1795879697.829073   24380 cpu_feature_guard.cc:227] This TensorFlow binary "
    "is optimized to use available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 AVX_VNNI "
    "FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.",
    # tensorflow-cpu 2.20.0 writes them with TensorFlow's own prefix:
    "2026-11-28 16:13:04.049586: I tensorflow/core/util/port.cc:153] oneDNN custom "
    "operations are on. You may see slightly different numerical results.",
    "2026-11-28 16:13:04.242145: I tensorflow/core/platform/cpu_feature_guard.cc:210] This "
    "TensorFlow binary is optimized to use available CPU instructions in "
    "performance-critical operations.",
    "I0000 00:00:1795879697.829073   24380 model_dataset_op.cc:206] Memory patch applied: "
    "M_TRIM_THRESHOLD=128 kb was set.",
]
# Lines that look alike and are passed through: the user needs them.
KEPT = [
    "E0000 00:00:1795879697.829073   24380 port.cc:153] something else went wrong",
    "W0000 00:00:1795879697.829073   24380 cpu_feature_guard.cc",  # no "] " message
    "fenwicks info: error: device='gpu' was requested but no GPU was found",
    "Traceback (most recent call last):",
    "oneDNN custom operations are on.",  # not a log line
    "",
]


def test_the_filter_knows_exactly_the_start_up_lines():
    assert [line for line in START_UP if not _quiet.is_start_up_line(line.encode())] == []
    assert [line for line in KEPT if _quiet.is_start_up_line(line.encode())] == []


FILTERED = """
import os, subprocess, sys
sys.argv, sys.orig_argv = ["-m", "info"], ["python", "-m", "fenwicks", "info"]
from fenwicks import _quiet
_quiet.quiet_command_line()  # as `import fenwicks` does on the command line
lines = {lines!r}
os.write(2, ("\\n".join(lines) + "\\n").encode())
print("from python", file=sys.stderr)
subprocess.run(["sh", "-c", "echo from a child >&2"], check=True)
os.write(2, b"last, no newline")
"""


@pytest.mark.slow
def test_the_filter_passes_every_other_line_in_order(tmp_path):
    lines = [START_UP[0], KEPT[0], START_UP[1], KEPT[2], START_UP[2], START_UP[3], KEPT[3]]
    proc = run_process(["-c", FILTERED.format(lines=lines)], cwd=tmp_path, fresh=True)
    assert proc.stderr == "\n".join([KEPT[0], KEPT[2], KEPT[3], "from python",
                                     "from a child", "last, no newline"])


def test_only_the_command_line_is_quieted_and_not_with_debug():
    command = ["python", "-m", "fenwicks", "info"]
    assert _quiet.is_command_line(["-m"], command)
    assert _quiet.is_command_line(["/venv/bin/fenwicks", "demo"], ["/venv/bin/fenwicks"])
    assert not _quiet.is_command_line(["-m"], ["python", "-m", "pytest"])
    assert not _quiet.is_command_line(["train.py"], ["python", "train.py"])
    env = {"TPU_MIN_LOG_LEVEL": "0"}  # the user's own setting stays
    assert _quiet.quiet_command_line(env, ["-m"], command)
    assert env == {**_quiet.QUIET_ENV, "TPU_MIN_LOG_LEVEL": "0"}
    env = {}
    assert not _quiet.quiet_command_line(env, ["-m"], [*command, "--debug"])
    assert not _quiet.quiet_command_line(env, ["notebook.py"], ["python", "notebook.py"])
    assert env == {}
