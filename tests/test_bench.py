"""Tests for fw.bench as a whole: imported on first use, its public names, and the CLI
end to end under a simulated accelerator. Each module has its own file:
test_bench_peaks.py, test_bench_timing.py, test_bench_matmul.py, test_bench_report.py;
the estimator throughput helper (benchmarks/) is tested in test_bench_throughput.py."""

from __future__ import annotations

import ast
import json
import os
import re

import numpy as np
import pytest

from fenwicks import bench
from tests.conftest import ROOT, run_json, shared_snippet

# ------------------------------------------------------------ imported on first use

_LAZY_PROBE = """
import json, sys
import fenwicks as fw

out = {"after_import": "fenwicks.bench" in sys.modules, "in_dir": "bench" in dir(fw)}
out["flops"] = fw.bench.matmul_flop_count(3)  # the first use imports the package
out["after_use"] = "fenwicks.bench" in sys.modules
out["same_module"] = fw.bench is sys.modules["fenwicks.bench"]
from fenwicks import bench
out["from_import"] = bench is fw.bench
out["cores"] = fw.bench.cpu_info().cores
try:
    fw.no_such_name
except AttributeError as err:
    out["missing"] = str(err)
print(json.dumps(out))
"""


def test_import_fenwicks_leaves_bench_out_until_first_use():
    out = run_json(_LAZY_PROBE, fresh=True)  # a new interpreter: what `import` loads
    assert out["after_import"] is False and out["in_dir"] is True
    assert out["flops"] == 54  # 3 x 3 outputs x 3 multiply-adds x 2
    assert out["after_use"] is True and out["same_module"] is True
    assert out["from_import"] is True and out["cores"] >= 1
    assert out["missing"] == "module 'fenwicks' has no attribute 'no_such_name'"


def test_public_names_are_those_of_the_single_module():
    # The names fenwicks/bench.py exported before the split, less the two that moved to
    # benchmarks/estimator_throughput.py, plus its constants, now listed.
    before = {"CpuInfo", "MatmulResult", "Report", "Timing", "accelerator_peak_tflops",
              "cpu_info", "cpu_vs_numpy", "gpu_peak_tflops", "main", "matmul_chain",
              "matmul_flop_count", "matmul_flops", "measure", "numpy_matmul_flops", "run",
              "speed_ratio", "tpu_version"}
    constants = {"DEFAULT_N", "DEFAULT_REPEATS", "DEFAULT_TRIALS", "DEVICES", "DTYPES",
                 "GPU_PEAK_TFLOPS", "LEGEND", "TPU_PEAK_TFLOPS"}
    assert set(bench.__all__) == before | constants
    assert all(hasattr(bench, name) for name in bench.__all__)


@pytest.mark.parametrize("name", ["train_throughput", "ThroughputResult"])
def test_moved_names_say_where_they_went(name):
    with pytest.raises(AttributeError, match="benchmarks/estimator_throughput.py"):
        getattr(bench, name)


def _fenwicks_imports(path: str) -> set[str]:
    """Modules of fenwicks that the file at `path` imports, at top level or in a function."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fenwicks")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fenwicks"):
            found |= {f"{node.module}.{a.name}" if node.module == "fenwicks" else node.module
                      for a in node.names}
    return found


def test_bench_imports_nothing_of_training():
    folder = os.path.join(ROOT, "fenwicks", "bench")
    imported = set().union(*(_fenwicks_imports(os.path.join(folder, name))
                             for name in os.listdir(folder) if name.endswith(".py")))
    assert imported, "the scan found no import at all"
    outside = {m for m in imported if not m.startswith("fenwicks.bench")}
    # The devices, and on the tf engine the strategy made for them, which that engine
    # holds (fenwicks/train/tf/devices.py): the matmul bench runs on every replica's device.
    assert outside == {"fenwicks.accel", "fenwicks.train.tf"}, outside
    with open(os.path.join(folder, "matmul.py"), encoding="utf-8") as f:
        tf_names = re.findall(r"from fenwicks\.train\.tf import (.+)", f.read())
    assert tf_names == ["devices"], tf_names


# ------------------------------------------- one subprocess: the CLI, simulation


_SUBPROCESS = """
import contextlib, io, json
import fenwicks as fw
from fenwicks.__main__ import main

fw.bench.timing.INTERLEAVE_PAUSE = 0.01  # tiny matrices: no BLAS threads to wait out
out = {}
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    main(["bench", "--json", "--n", "96", "--repeats", "2", "--trials", "3"])
out["json_text"] = buf.getvalue()
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    main(["bench", "--n", "64", "--repeats", "1", "--trials", "1"])
out["table"] = buf.getvalue()
try:
    fw.bench.matmul_flops(device="tpu", n=8)
except ValueError as err:
    out["tpu_error"] = str(err)
print(json.dumps(out))
"""


_SIMULATED = shared_snippet("cpu:2", "bench", _SUBPROCESS)


@pytest.fixture(scope="module")
def simulated():
    return _SIMULATED()


def test_cli_json_parses_with_hand_counted_flops(simulated):
    report = json.loads(simulated["json_text"])
    rows = {(r["device"], r["dtype"]): r for r in report["results"]}
    assert set(rows) == {("cpu", "float32"), ("cpu", "bfloat16"), ("cpu x2 (sim)", "float32")}
    assert rows["cpu", "float32"]["flops"] == 2 * 96**3 * 2  # 3538944
    assert rows["cpu", "float32"]["flops"] == 3_538_944
    # two simulated replicas share the repeats: each runs one product
    assert rows["cpu x2 (sim)", "float32"]["flops"] == 2 * 96**3 * 1 * 2
    assert rows["cpu", "float32"]["speedup"] == pytest.approx(1.0)
    for row in report["results"] + [report["numpy"]]:
        assert len(row["seconds"]) == 3 and row["cold_seconds"] > 0
        assert row["tflops"] == pytest.approx(row["flops"] / np.median(row["seconds"]) / 1e12)
    numpy_row = report["numpy"]
    assert (numpy_row["n"], numpy_row["repeats"], numpy_row["dtype"]) == (96, 2, "float32")
    paired = [n / t for t, n in zip(rows["cpu", "float32"]["seconds"], numpy_row["seconds"],
                                    strict=True)]
    assert report["tf_over_numpy"] == pytest.approx(np.median(paired))
    assert report["simulated"] is True and "SIMULATION" in report["accelerator"]
    assert report["cpu"]["peak_tflops"] > 0


def test_cli_table_says_simulation(simulated):
    table = simulated["table"]
    assert "SIMULATION" in table and "cpu x2 (sim)" in table
    assert "TensorFlow CPU float32 / numpy" in table
    data_rows = [line for line in table.splitlines()
                 if line.split()[:1] in (["cpu"], ["numpy"])]
    assert len(data_rows) == 4  # cpu float32, cpu bfloat16, cpu x2 (sim), numpy


def test_matmul_flops_absent_device_error(simulated):
    assert "device='tpu'" in simulated["tpu_error"] and "'cpu'" in simulated["tpu_error"]
