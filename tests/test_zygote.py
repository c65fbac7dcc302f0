"""The fork server behind `run_process` behaves as ``python -c/-m`` does in a new process."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests import _zygote
from tests.conftest import ROOT, python_env, run_process, start_process
from tests.conftest import _zygote as local_server


def _both(args, env=None, cwd=ROOT):
    """The same command forked from the server and in a new interpreter."""
    forked = run_process(args, env=env, cwd=cwd, check=False)
    fresh = run_process(args, env=env, cwd=cwd, check=False, fresh=True)
    return forked, fresh


def test_a_forked_process_sees_its_own_environment_cwd_argv_and_path(tmp_path):
    run_process(["-c", "pass"])  # the server started (its one import is not this child's)
    code = ("import json, os, sys, tempfile; import fenwicks as fw\n"
            "print(json.dumps([os.getcwd(), sys.argv, os.environ.get('FENWICKS_DEVICE'),"
            " sys.path[0], fw.accel.current().num_replicas, tempfile.gettempdir()]))")
    forked, fresh = _both(["-c", code, "x"], env={"FENWICKS_DEVICE": "cpu:2",
                                                  "TMPDIR": str(tmp_path)}, cwd=tmp_path)
    assert forked.returncode == fresh.returncode == 0, (forked.stderr, fresh.stderr)
    assert forked.stdout == fresh.stdout
    assert f'["{tmp_path}", ["-c", "x"], "cpu:2", "", 2, "{tmp_path}"]' == \
        forked.stdout.strip()
    assert forked.seconds < fresh.seconds  # it did not import TensorFlow again


@pytest.mark.parametrize("code, status", [
    ("import sys; sys.exit(3)", 3), ("raise SystemExit('bye')", 1),
    ("raise ValueError('boom')", 1), ("raise KeyboardInterrupt", -2),
    ("import atexit; atexit.register(lambda: print('at exit'))", 0),
    ("import threading, time\n"
     "threading.Thread(target=lambda: (time.sleep(0.5), print('joined'))).start()", 0),
])
def test_exit_status_and_output_match_a_new_interpreter(code, status):
    forked, fresh = _both(["-c", code])
    assert forked.returncode == fresh.returncode == status
    assert forked.stdout == fresh.stdout
    assert forked.stderr.strip().splitlines()[-1:] == fresh.stderr.strip().splitlines()[-1:]


def test_a_forked_process_uses_its_own_matplotlib_backend():
    # matplotlib reads MPLBACKEND when it is imported, which Keras's import does in the
    # server; a Jupyter kernel sets the inline backend this way.
    code = "import fenwicks, matplotlib; print(matplotlib.get_backend())"
    forked, fresh = _both(["-c", code], env={"MPLBACKEND": "svg"})
    assert forked.returncode == fresh.returncode == 0, forked.stderr
    assert forked.stdout.strip() == fresh.stdout.strip() == "svg"


def test_a_module_runs_as_main():
    forked, fresh = _both(["-m", "fenwicks", "info"], env={"FENWICKS_DEVICE": "cpu:2"})
    assert forked.returncode == fresh.returncode == 0
    assert "replicas             2" in forked.stdout and forked.stdout == fresh.stdout


def test_a_timeout_kills_the_child():
    with pytest.raises(subprocess.TimeoutExpired):
        run_process(["-c", "import time; print('started', flush=True); time.sleep(60)"],
                    timeout=3)


def test_only_variables_read_after_import_may_differ():
    base = python_env()
    assert local_server.may_run(["-c", "1"], {**base, "FENWICKS_DEVICE": "cpu:8"})
    assert local_server.may_run(["-m", "x"], {k: v for k, v in base.items()
                                              if k != "FENWICKS_ROOT"})
    # read when TensorFlow or Python starts: only a new interpreter sees them
    for name in ("TF_ENABLE_ONEDNN_OPTS", "PYTHONPATH", "FENWICKS_GCS_REQUEST_TIMEOUT"):
        assert not local_server.may_run(["-c", "1"], {**base, name: "0"}), name
    assert not local_server.may_run(["-X", "importtime", "-c", "1"], base)
    # what only the child's own code reads, named by the caller (a kernel's JPY_*)
    assert not local_server.may_run(["-m", "k"], {**base, "JPY_SESSION_NAME": "a"})
    assert local_server.may_run(["-m", "k"], {**base, "JPY_SESSION_NAME": "a"},
                                read_later=("JPY_",))
    # the test helpers' own switches, read when their module runs
    assert local_server.may_run(["-m", "tests._faults"], {**base, "FAULTS_SYNC": "1"})
    os.environ[_zygote.FRESH_ENV] = "1"
    try:
        assert not local_server.may_run(["-c", "1"], base)
    finally:
        del os.environ[_zygote.FRESH_ENV]


_STREAMS = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
            "print('ready', flush=True); print('to stderr', file=sys.stderr, flush=True)\n"
            "time.sleep(60)")


@pytest.mark.parametrize("signum, status", [(signal.SIGKILL, -9), (signal.SIGTERM, 143)])
def test_a_started_child_streams_its_output_and_reports_how_a_signal_ended_it(signum,
                                                                              status):
    forked = start_process(["-c", _STREAMS])
    fresh = start_process(["-c", _STREAMS], fresh=True)
    assert type(forked) is not subprocess.Popen and type(fresh) is subprocess.Popen
    for proc in (forked, fresh):
        assert proc.stdout.readline() == "ready\n"  # as it comes, not at the end
        assert proc.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == status and proc.returncode == status
        assert proc.stderr.read() == "to stderr\n"
        assert os.path.exists(f"/proc/{proc.pid}") is False  # reaped, by its own parent


def test_communicate_returns_both_streams_and_the_status():
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(4)"
    forked = start_process(["-c", code])
    assert forked.communicate(timeout=60) == ("out\n", "err\n")
    assert forked.returncode == 4
    endless = start_process(["-c", "import time; time.sleep(60)"])
    with pytest.raises(subprocess.TimeoutExpired):
        endless.communicate(timeout=0.5)
    endless.kill()
    assert endless.wait(timeout=30) == -9
