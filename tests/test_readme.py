"""The README's quick start runs as written and learns."""

from __future__ import annotations

import ast
import os
import re

from tests.conftest import ROOT, run_python


def _quick_start() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme.split("## Quick start", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_quick_start_runs_and_reaches_90_percent(tmp_path):
    code = _quick_start()
    proc = run_python(code, env={"FENWICKS_ROOT": str(tmp_path), "FENWICKS_DEVICE": "cpu"},
                      cwd=str(tmp_path))
    result = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert result["num_examples"] == 1797 - 1500
    assert result["global_step"] == 300
    assert result["accuracy"] >= 0.9, result
    assert os.path.exists(tmp_path / "work" / "digits" / "checkpoint")
