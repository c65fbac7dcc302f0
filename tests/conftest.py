"""Shared test helpers. Multi-replica tests run in a subprocess: logical CPU devices must
be configured before TensorFlow initialises, which the parent test process already did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

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


@pytest.fixture
def subprocess_json():
    return run_json
