"""Two workers on loopback (`MultiWorkerMirroredStrategy`): exact evaluation across
workers, predict refused clearly, only the chief writes, a killed worker makes the other
fail within a bounded time, and the restarted pair resumes."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import numpy as np
import pytest

from tests import _faults
from tests import _flagship as flagship
from tests.conftest import start_process

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_pair(work_dir, max_steps, **env):
    workers = [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]
    procs = []
    for index in range(2):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        procs.append(start_process(
            ["-m", "tests._multiworker", str(work_dir), str(max_steps)],
            {"FENWICKS_DEVICE": "auto", "TF_CONFIG": json.dumps(config), **env}))
    return procs


def _results(procs, timeout=600):
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, stderr[-4000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_two_workers_evaluate_every_example_once_and_only_the_chief_writes(tmp_path):
    work = tmp_path / "run"
    # The chief names each checkpoint late: the other worker's evaluate must not restore
    # the previous one on its own (its collectives would mix two models' numbers). 10
    # steps: step 5, then step 10 committed 3 s late, while the other worker evaluates.
    chief, other = _results(_start_pair(work, 10, MULTIWORKER_SLOW_CHIEF_STATE="3"))
    y = flagship.digits("mnist_net")[1][flagship.NUM_TRAIN:]
    for result in (chief, other):
        assert result["workers"] == 2 and result["replicas"] == 2 and result["step"] == 10
        # 773 digits in batches of 32 per worker: 13 batches for one worker, 12 for the
        # other, the last one partial; each digit counted exactly once over both.
        assert result["eval"]["num_examples"] == len(y)
        logits = np.asarray(result["logits"])
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        loss = float(np.mean(-np.log(probs[np.arange(len(y)), y])))
        assert result["eval"]["loss"] == pytest.approx(loss, abs=1e-5)
        assert result["eval"]["accuracy"] == pytest.approx(np.mean(probs.argmax(1) == y))
        assert "predict runs on one host" in result["predict_error"]
    np.testing.assert_allclose(chief["logits"], other["logits"], atol=1e-6)  # in sync
    assert _faults.latest_step(str(work)) == 10
    left = sorted(os.listdir(work))
    assert not [name for name in left if name.startswith(".worker")], left
    assert "fenwicks.lock" not in left


def test_a_killed_worker_makes_the_other_fail_in_bounded_time_and_the_pair_resumes(
        tmp_path):
    work = tmp_path / "run"
    procs = _start_pair(work, 10**6, MULTIWORKER_WARMUP="1")
    for proc in procs:  # both past their first step
        assert proc.stdout.readline().strip() == "READY" or proc.poll() is None
    _wait_for_checkpoint(work)
    procs[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    procs[0].wait(timeout=300)
    waited = time.monotonic() - killed
    assert procs[0].returncode != 0
    assert waited < 120, waited
    print(f"surviving worker failed {waited:.1f} s after its peer was killed")
    saved = _faults.latest_step(str(work))
    assert saved > 1
    chief, other = _results(_start_pair(work, saved + 5))
    assert chief["start"] == other["start"] == saved and chief["step"] == saved + 5


def _wait_for_checkpoint(work, timeout=300):
    deadline = time.monotonic() + timeout
    while _faults.latest_step(str(work)) < 5:
        assert time.monotonic() < deadline
        time.sleep(0.1)
