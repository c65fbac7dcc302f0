"""The numbered tutorials: their shape (badge, install cell, one parameters cell, no outputs)
and that each runs top to bottom offline with ``SMOKE = True`` injected.

A notebook runs in a real Jupyter kernel (nbclient), in a temporary working directory with
``FENWICKS_ROOT`` pointing there, so nothing is written into the repository. Notebooks that
read tensorflow-datasets get ``tfds.testing.mock_data`` entered inside the kernel: the mock
patches the process it runs in, which is the kernel, not pytest.
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import importlib.util
import json
import os
import re
import sys
import time

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TUTORIALS = os.path.join(ROOT, "tutorials")
NOTEBOOKS = sorted(name for name in os.listdir(TUTORIALS) if name.endswith(".ipynb"))
EXPECTED_NUMBERS = [f"{i:02d}" for i in range(1, 9)]
KNOBS = ("SMOKE", "BATCH_SIZE", "EPOCHS", "LEARNING_RATE", "WEIGHT_DECAY")
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
COLAB_URL = "https://colab.research.google.com/github/fenwicks/fenwicks/blob/main/tutorials/"
MOCK_EXAMPLES = 64  # per split; enough for a few smoke batches
CELL_TIMEOUT = 240  # seconds; a smoke cell takes a few
WORKERS = 3  # notebooks executed at once
TUTORIAL_FILES = sorted(os.listdir(TUTORIALS))


def _read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(os.path.join(TUTORIALS, name), as_version=4)


def _parameters_cells(nb) -> list[int]:
    return [i for i, cell in enumerate(nb.cells)
            if "parameters" in cell.get("metadata", {}).get("tags", [])]


def _uses_tfds(nb) -> bool:
    code = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "code")
    return "tfds" in code or "tensorflow_datasets" in code


def test_tutorials_are_numbered_01_to_08_once_each():
    numbers = [name[:2] for name in NOTEBOOKS]
    assert numbers == EXPECTED_NUMBERS, NOTEBOOKS
    for name in NOTEBOOKS:
        assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", name), name


def test_notebooks_are_built_from_their_sources():
    spec = importlib.util.spec_from_file_location(
        "build_notebooks", os.path.join(TUTORIALS, "build_notebooks.py"))
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    assert [name + ".ipynb" for name in builder.names()] == NOTEBOOKS
    for name in builder.names():
        built = nbformat.writes(builder.build(name)) + "\n"
        with open(os.path.join(TUTORIALS, name + ".ipynb"), encoding="utf-8") as f:
            assert f.read() == built, f"{name}: run python tutorials/build_notebooks.py"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_shape(name):
    nb = _read(name)
    nbformat.validate(nb)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and COLAB_BADGE in first.source
    assert COLAB_URL + name in first.source, "the badge must open this very notebook"
    install = next(cell for cell in nb.cells if cell.cell_type == "code")
    assert "'google.colab' in sys.modules" in install.source
    assert "pip install" in install.source and "github.com/fenwicks/fenwicks" in install.source
    (index,) = _parameters_cells(nb)
    assigned = {target.id for node in ast.parse(nb.cells[index].source).body
                if isinstance(node, ast.Assign) for target in node.targets
                if isinstance(target, ast.Name)}
    assert set(KNOBS) <= assigned, f"parameters cell lacks {set(KNOBS) - assigned}"
    assert re.search(r"^SMOKE = False\b", nb.cells[index].source, re.M)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "committed outputs"
    prose = [cell for cell in nb.cells if cell.cell_type == "markdown"]
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert len(prose) * 2 >= len(code), "explain why at each step: too little prose"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"


def _kernel_dir(tmp_path) -> str:
    """A kernelspec running *this* interpreter, so the kernel sees the same packages."""
    kernels = tmp_path / "jupyter" / "kernels" / "python3"
    kernels.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3", "language": "python"}
    (kernels / "kernel.json").write_text(json.dumps(spec))
    return str(tmp_path / "jupyter")


def _smoke_cell(nb) -> nbformat.NotebookNode:
    lines = ["# Injected by tests/test_tutorials.py: tiny sizes, offline data.", "SMOKE = True"]
    if _uses_tfds(nb):
        lines += ["import tensorflow_datasets as _tfds",
                  f"_fw_tfds_mock = _tfds.testing.mock_data(num_examples={MOCK_EXAMPLES})",
                  "_fw_tfds_mock.__enter__()"]
    return nbformat.v4.new_code_cell("\n".join(lines))


@dataclasses.dataclass
class Run:
    """One executed notebook: the notebook with outputs, or the error; wall seconds."""

    nb: nbformat.NotebookNode
    error: BaseException | None
    seconds: float


def _execute(name: str, work, env: dict[str, str]) -> Run:
    nb = _read(name)
    (index,) = _parameters_cells(nb)
    nb.cells.insert(index + 1, _smoke_cell(nb))
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT,
                            resources={"metadata": {"path": str(work)}})
    start = time.perf_counter()
    try:
        client.execute(env=env)  # raises CellExecutionError, naming the cell
        error = None
    except Exception as err:  # noqa: BLE001 - reported by that notebook's own test
        error = err
    return Run(nb, error, time.perf_counter() - start)


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> dict[str, Run]:
    """Every notebook run once, WORKERS kernels at a time (kernel start-up and imports
    wait on disk as much as on the CPU, so two cores run more than two kernels well)."""
    root = tmp_path_factory.mktemp("tutorials")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_PATH", _kernel_dir(root))  # read here, by the kernel finder
        runs = {}
        with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
            for name in NOTEBOOKS:
                work = root / name[:2]
                work.mkdir()
                env = {**os.environ, "FENWICKS_ROOT": str(work), "PYTHONPATH": ROOT,
                       "TF_CPP_MIN_LOG_LEVEL": "2",
                       "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
                env.pop("FENWICKS_DEVICE", None)
                runs[name] = pool.submit(_execute, name, work, env)
        return {name: future.result() for name, future in runs.items()}


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_top_to_bottom_offline(name, executed):
    run = executed[name]
    print(f"{name}: {run.seconds:.1f} s")
    if run.error is not None:
        raise run.error
    outputs = [out for cell in run.nb.cells if cell.cell_type == "code"
               for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    figures = [out for out in outputs if "image/png" in out.get("data", {})]
    assert figures, "every tutorial shows at least one plot"
    assert sorted(os.listdir(TUTORIALS)) == TUTORIAL_FILES, "a notebook wrote into the repo"
