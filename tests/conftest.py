"""Shared test helpers. Multi-replica tests run in a subprocess: logical CPU devices must
be configured before TensorFlow initialises, which the parent test process already did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

try:  # tests/ may or may not be a package; the emulator helper lives beside this file
    from tests import gcs_emulator as _gcs_emulator
except ImportError:
    import gcs_emulator as _gcs_emulator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 600,
               cwd: str | None = None) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter; raises with its output if it fails."""
    full_env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2",
                **(env or {})}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n"
                             f"{proc.stderr[-6000:]}")
    return proc


def run_json(code: str, env: dict[str, str] | None = None, timeout: float = 600,
             cwd: str | None = None):
    """Runs `code`, which must print one JSON document as its last stdout line."""
    proc = run_python(code, env=env, timeout=timeout, cwd=cwd)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_module_json(module: str, *args: str, env: dict[str, str] | None = None,
                    timeout: float = 900) -> object:
    """Runs ``python -m module *args`` in a fresh interpreter; its last stdout line as JSON.

    Subprocess code lives in helper modules (`tests._flagship`, ...) that ruff checks,
    rather than in code strings.
    """
    full_env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", module, *args], env=full_env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"python -m {module} {' '.join(args)} failed "
                             f"({proc.returncode}):\n{proc.stdout[-2000:]}\n"
                             f"{proc.stderr[-6000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def subprocess_json():
    return run_json


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    r"""A real GCS server (gcp-storage-emulator) in a private network namespace.

    Yields a `tests.gcs_emulator.GcsEmulator` with ``.bucket`` (an existing bucket),
    ``.url(*parts)`` / ``.unique_url(name)`` (``gs://`` paths; the bucket is shared by
    the session, so use a unique prefix per test) and ``.run_python(code, env=None,
    timeout=300)`` / ``.run_json(...)``, which mirror `run_python` / `run_json` above but
    run the snippet INSIDE the namespace with everything set: TensorFlow's own ``gs://``
    client (tf.io.gfile, TFRecord, checkpoints, tf.summary) and gcsfs / `fw.io` both
    reach the server; ``FENWICKS_BUCKET`` names the bucket. Only code run that way sees
    the server: the pytest process itself is outside the namespace.

    Needs root. Skips with the reason otherwise, except when
    ``FENWICKS_REQUIRE_GCS_EMULATOR=1`` (CI), where failing to start is a failure.

    Example:
        def test_roundtrip(gcs_emulator):
            path = gcs_emulator.unique_url("demo") + "/a.txt"
            code = ("import json, tensorflow as tf\n"
                    f"tf.io.gfile.GFile({path!r}, 'w').write('hi')\n"
                    f"print(json.dumps(tf.io.gfile.GFile({path!r}).read()))")
            out = gcs_emulator.run_json(code)
            assert out == "hi"
    """
    yield from _running_emulator(tmp_path_factory.mktemp("gcs_emulator"))


@pytest.fixture(scope="session")
def gcs_fault_emulator(tmp_path_factory):
    """Like `gcs_emulator`, but every request passes through `tests._fault_proxy`.

    Code run inside the namespace (``run_module`` / ``run_python``) schedules faults with
    ``tests._fault_proxy.set_rules([...])`` and reads what happened with ``report()``. A
    separate server and namespace, so faults never reach tests using `gcs_emulator`.
    """
    yield from _running_emulator(tmp_path_factory.mktemp("gcs_fault_emulator"), faults=True)


def _running_emulator(directory, faults: bool = False):
    """Starts the emulator (skipping, or failing under CI, if it cannot), yields, stops."""
    try:
        emulator = _gcs_emulator.start(directory, faults=faults)
    except _gcs_emulator.EmulatorUnavailable as err:
        _gcs_emulator.skip_or_fail(str(err))
    try:
        yield emulator
    finally:
        emulator.stop()
