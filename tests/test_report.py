"""fw.info() and `python -m fenwicks info`."""

from __future__ import annotations

import keras
import tensorflow as tf

from fenwicks import report
from tests.conftest import run_process


def _info_table(device: str) -> dict[str, str]:
    env = {"FENWICKS_DEVICE": device, "PATH": "/usr/bin:/bin", "HOME": "/tmp",
           "FENWICKS_ROOT": "/tmp/fw-info-root"}
    out = run_process(["-m", "fenwicks", "info"], env, timeout=300, inherit=False).stdout
    table = {}
    for line in out.splitlines():
        field, _, value = line.partition("  ")
        table[field.strip()] = value.strip()
    return table


def test_info_under_cpu8_simulation():
    table = _info_table("cpu:8")
    assert table["tensorflow"] == tf.__version__
    assert table["keras"] == keras.__version__
    assert table["accelerator"] == "cpu (simulated)"
    assert table["strategy"] == "MirroredStrategy"
    assert table["replicas"] == "8"
    assert table["precision"] == "float32"
    assert [k for k in table if k.startswith("device ")] == [f"device {i}" for i in range(8)]
    assert "storage root" in table


def test_format_bytes():
    assert report.format_bytes(None) == "unknown"
    assert report.format_bytes(512) == "512 B"
    assert report.format_bytes(3 * 2**30 // 2) == "1.5 GiB"
