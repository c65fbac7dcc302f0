"""The code base stays ruff-clean (STYLE.md), so lint drift fails CI instead of piling up."""

from tests.conftest import run_process


def test_ruff_is_clean():
    proc = run_process(["-m", "ruff", "check", "--no-cache", "."], timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
