"""`python -m fenwicks demo`: real digits, >= 95% test accuracy, under 2 minutes, and the
checkpoints and TensorBoard logs where it says they are."""

from __future__ import annotations

import os
import re
import subprocess

import numpy as np
import pytest

import fenwicks as fw
from fenwicks import demo
from tests.conftest import run_process

TIME_LIMIT = 120  # seconds: the README measures about 25 s on a 2-core machine


def _field(output: str, name: str) -> str:
    match = re.search(rf"^{name} +(.+)$", output, re.M)
    assert match, f"no '{name}' line in the demo output:\n{output}"
    return match.group(1).strip()


def _demo(tmp_path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``python -m fenwicks demo *args`` as a user runs it (one replica, storage root
    `tmp_path`); ``.seconds`` is its wall time."""
    return run_process(["-m", "fenwicks", "demo", *args], cwd=tmp_path, timeout=2 * TIME_LIMIT,
                       env={"FENWICKS_ROOT": str(tmp_path), "FENWICKS_DEVICE": None},
                       check=check)


@pytest.mark.slow
def test_demo_command_reaches_95_percent_in_time_and_says_where_its_files_are(tmp_path):
    proc = _demo(tmp_path)
    seconds = proc.seconds
    out = proc.stdout
    accuracy = re.match(r"([0-9.]+) \((\d+) of (\d+) ", _field(out, "test accuracy"))
    assert accuracy, out
    # The printed accuracy agrees with its own count: correct / 450 test digits (25%
    # of scikit-learn's 1,797, stratified).
    value, correct, total = float(accuracy[1]), int(accuracy[2]), int(accuracy[3])
    assert total == 450 and abs(value - correct / total) < 1e-4
    assert value >= 0.95, out
    assert seconds < TIME_LIMIT, f"the demo took {seconds:.0f} s"
    # The steady state: the 11 loops after the first (12 epochs of 21 steps, one loop an
    # epoch), and the rate agrees with its own steps and seconds.
    speed = re.fullmatch(r"([0-9,]+) examples/s \((\d+) steps x 64 examples in ([0-9.]+) s, "
                         r"after compiling\)", _field(out, "training speed"))
    assert speed, out
    rate, steps, steady = int(speed[1].replace(",", "")), int(speed[2]), float(speed[3])
    assert steps == 11 * 21
    # The printed roundings: the rate to 1 example/s, the seconds to 0.01 s.
    assert abs(rate * steady - steps * 64) <= 0.5 * steady + 0.005 * rate + 1e-6
    first = re.fullmatch(r"([0-9.]+) s \(21 steps, compilation included; and the final "
                         r"checkpoint\)", _field(out, "first loop"))
    assert first and float(first[1]) + steady < seconds, out
    # fw.data.numpy_ds gathers a batch in one op: far faster than the net trains.
    assert re.fullmatch(r"input delivers [0-9,]+ ex/s, training consumed [0-9,]+ ex/s "
                        r"\([0-9.]+x\): not input-bound", _field(out, "input check")), out
    work_dir = str(tmp_path / "work" / "demo")
    assert f"\nstarting fresh in {work_dir}\n" in out
    assert _field(out, "checkpoints") == work_dir
    assert _field(out, "TensorBoard") == f"tensorboard --logdir {work_dir}"
    files = [os.path.join(d, f) for d, _, names in os.walk(work_dir) for f in names]
    # The run format's last step (252 steps: 6 epochs of 42), its run record with it
    assert f"{work_dir}/checkpoints/252/record/metadata" in files, files
    assert any("tfevents" in f for f in files), files  # TensorBoard event files
    assert "%|" in proc.stderr  # the tqdm progress bar
    print(f"demo: accuracy {value:.4f} in {seconds:.1f} s")


@pytest.mark.slow
def test_a_second_run_resumes_the_first_and_says_so(tmp_path):
    work_dir = str(tmp_path / "run")
    run = _demo(tmp_path, "--epochs", "2", "--work-dir", work_dir)
    # tf.data warns ("To make it possible to preserve tf.data options across
    # serialization boundaries...") when a distributed dataset is iterated inside a
    # tf.function: Fenwicks must create its iterators eagerly. TensorFlow's own log
    # lines are the user's to silence (TF_CPP_MIN_LOG_LEVEL=2 here): nothing else remains.
    assert "preserve tf.data options" not in run.stderr, run.stderr[-3000:]
    assert "Warning" not in run.stderr, run.stderr[-3000:]
    first = run.stdout
    assert f"\nstarting fresh in {work_dir}\n" in first
    steps = 2 * (1347 // 64)  # 2 epochs of 21 steps
    assert re.match(rf"[0-9,]+ examples/s \({steps - 21} steps x 64 examples in ",
                    _field(first, "training speed"))
    # A second process: the model comes back from the checkpoint, every variable of it
    # (BatchNorm statistics included), so the test accuracy is the same to the digit.
    second = _demo(tmp_path, "--epochs", "2", "--work-dir", work_dir).stdout
    assert f"\nresuming {work_dir} at step {steps} (--fresh starts over)\n" in second
    assert _field(second, "training speed").startswith(f"- (already at step {steps}")
    assert _field(second, "input check").endswith("(no steps trained by this estimator "
                                                  "yet): no verdict; train, then "
                                                  "check_input again")
    assert _field(second, "test accuracy") == _field(first, "test accuracy")
    # --fresh deletes the run and says so; training starts again from step 0.
    third = _demo(tmp_path, "--epochs", "1", "--work-dir", work_dir, "--fresh").stdout
    assert f"starting fresh in {work_dir} (--fresh: the previous run there was deleted)" \
        in third
    # One loop: nothing ran after compiling, and the line says so.
    assert re.fullmatch(r"[0-9,]+ examples/s \(21 steps x 64 examples in [0-9.]+ s, "
                        r"compilation included\)", _field(third, "training speed"))


def test_load_digits_is_a_stratified_75_25_split_scaled_to_unit_range():
    X_train, y_train, X_test, y_test = demo.load_digits()
    assert X_train.shape == (1347, 8, 8, 1) and X_test.shape == (450, 8, 8, 1)
    assert X_train.dtype == np.float32 and y_train.dtype == np.int32
    assert X_train.min() == 0.0 and X_train.max() == 1.0  # raw pixels 0..16, divided by 16
    from sklearn.datasets import load_digits

    raw = load_digits()
    # Every digit keeps its share: the test part has 25% of each class, rounded.
    expected = np.bincount(raw.target) * 0.25
    assert np.all(np.abs(np.bincount(y_test, minlength=10) - expected) <= 1)
    # The images are scikit-learn's, untouched but for the scaling.
    flat = (X_test.reshape(len(X_test), 64).astype(np.float64) * 16).round()
    assert {row.tobytes() for row in flat} <= {row.tobytes() for row in raw.data}


@pytest.mark.parametrize("kwargs, message", [
    ({"epochs": 0}, "epochs=0"),
    ({"epochs": 2.5}, "epochs=2.5"),
    ({"batch_size": -8}, "batch_size=-8"),
    ({"batch_size": 5000}, "batch_size=5000 exceeds the 1347"),
])
def test_demo_rejects_bad_arguments_before_training(kwargs, message, tmp_path):
    with pytest.raises(ValueError, match=re.escape(message)):
        demo.train_demo(work_dir=str(tmp_path), **kwargs)
    assert os.listdir(tmp_path) == []  # nothing was written


def test_demo_command_line_reports_bad_arguments_without_a_traceback(capsys):
    # Checked before the accelerator is touched, so this is safe in the test process.
    assert demo.run(epochs=0) == 2
    assert demo.run(batch_size=2000) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "fenwicks demo: error: epochs=0 must be a positive integer, e.g. --epochs 12",
        "fenwicks demo: error: batch_size=2000 exceeds the 1347 training digits; use "
        "--batch-size 64"]


def test_demo_trains_the_tutorial_1_network():
    model = demo.build_nn()
    reference = fw.models.mnist_net(c=32, input_shape=(8, 8, 1))
    assert [type(layer).__name__ for layer in model.layers] == \
        [type(layer).__name__ for layer in reference.layers]
    assert model.count_params() == reference.count_params()
    assert tuple(model(np.zeros((2, 8, 8, 1), np.float32)).shape) == (2, 10)


def test_the_steady_state_leaves_out_the_first_loop_of_the_call():
    # Loops of 21, 21 and 10 steps at 500, 1344 and 1280 examples/s, batch 64.
    loops = [(21, 500.0), (42, 1344.0), (52, 1280.0)]
    assert demo.steady_state(loops, 0, 64) == (31, pytest.approx(21 * 64 / 1344 + 0.5))
    # A resumed call starts at its checkpoint's step; one loop is all there is to time.
    assert demo.steady_state([(63, 640.0)], 42, 64) == (21, pytest.approx(2.1))


def test_loss_7_demo_fresh_keeps_a_users_code_in_the_work_dir(tmp_path):
    """Loss 7: ``demo --fresh --work-dir D`` where D holds a checkpoint and the user's
    train.py: --fresh never forces, so the clean is refused, naming the file, and
    nothing in D is deleted (nor trained: it stops before any work)."""
    work = tmp_path / "D"
    work.mkdir()
    files = {"train.py": b"import fenwicks as fw\n", "checkpoint": b"model_checkpoint_path",
             "ckpt-21.index": b"index", "ckpt-21.data-00000-of-00001": b"data"}
    for name, data in files.items():
        (work / name).write_bytes(data)
    proc = _demo(tmp_path, "--epochs", "1", "--work-dir", str(work), "--fresh", check=False)
    assert proc.returncode != 0
    assert f"path='{work}' holds '{work}/train.py', which Fenwicks did not write; " \
           "create_clean_dir deletes only Fenwicks' own files" in proc.stderr, proc.stderr
    assert {p.name: p.read_bytes() for p in work.iterdir()} == files
