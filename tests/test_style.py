"""The code base stays ruff-clean (STYLE.md), so lint drift fails CI instead of piling up."""

import subprocess
import sys

from tests.conftest import ROOT


def test_ruff_is_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
