"""The tutorials as pages of the site: each notebook run once at its SMOKE size, offline,
its outputs kept, written to ``docs/tutorials/`` (mkdocs-jupyter shows them as they are).

    python tools/tutorial_pages.py            # every tutorial; or name some: 01 05
    python tools/tutorial_pages.py --text     # only the prose: markdown cells copied over

Each notebook of ``tutorials/`` runs in a Jupyter kernel of this interpreter with
``SMOKE = True`` injected after its parameters cell, ``FENWICKS_ROOT`` in a temporary
folder and ``TFDS_DATA_DIR`` at small stand-ins for MNIST and CIFAR-10 built by tfds's own
builders (tests/test_tutorials.py's: no download; MNIST's stand-in digits are
scikit-learn's 8x8 digits, scaled up). Every page says so above its first cell. The wall
time of each run is written to ``tutorials/smoke_seconds.json``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time

import nbformat
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TUTORIALS = os.path.join(ROOT, "tutorials")
PAGES = os.path.join(ROOT, "docs", "tutorials")
CELL_TIMEOUT = 900  # seconds


def _stand_in_datasets(root: str) -> None:
    """MNIST (scikit-learn's digits, 8x8 scaled to 28x28) and CIFAR-10 (the tests')."""
    sys.path.insert(0, ROOT)
    from sklearn.datasets import load_digits

    from tests import test_tutorials

    digits = load_digits()
    images = (np.kron(digits.images, np.ones((3, 3))) * 255 / 16).astype(np.uint8)
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))[..., None]  # 24x24 -> 28x28

    class DigitsAsMnist(test_tutorials.LocalMnist, skip_registration=True):
        name = "mnist"

        def _generate_local(self, n):
            offset = 0 if n == test_tutorials.TFDS_EXAMPLES["train"] else 1000
            for i in range(n):
                j = offset + i
                yield i, {"image": images[j], "label": int(digits.target[j])}

    DigitsAsMnist(data_dir=root).download_and_prepare()
    test_tutorials.LocalCifar10(data_dir=root).download_and_prepare()


def _note(cpu: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(
        "**What this page shows.** The outputs below are from a run at the `SMOKE` size "
        "(`SMOKE = True`, the cell after the parameters), offline on a CPU "
        f"({cpu}), with small stand-in data: generated, or scikit-learn's digits and random "
        "images in place of MNIST and CIFAR-10. Its temporary folders are shown as the "
        f"default ones, `{USER_ROOT}` and `{USER_TFDS}`. "
        "Run the notebook yourself for the real data and sizes.")


# What the run's temporary folders are shown as on the page: the folders a user of a Linux
# machine gets by default (Fenwicks' root ~/fenwicks, tensorflow-datasets' ~/tensorflow_datasets).
USER_ROOT = "/home/you/fenwicks"
USER_TFDS = "/home/you/tensorflow_datasets"


def user_paths(nb: nbformat.NotebookNode, folders: dict[str, str]) -> None:
    """Replaces each temporary folder (key) in the outputs by the user-like one (value)."""
    pairs = sorted(((os.path.realpath(old), new) for old, new in folders.items()),
                   key=lambda pair: -len(pair[0]))
    pairs += [(old, new) for old, new in folders.items() if os.path.realpath(old) != old]

    def fix(text):
        if isinstance(text, list):
            return [fix(part) for part in text]
        for old, new in pairs:
            text = text.replace(old, new)
        return text

    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                out["text"] = fix(out["text"])
            for mime, value in out.get("data", {}).items():
                if mime.startswith("text/"):
                    out["data"][mime] = fix(value)


def run(name: str, data_dir: str, cpu: str) -> float:
    """Runs tutorials/<name> at its SMOKE size; writes the page; returns wall seconds."""
    from nbclient import NotebookClient

    nb = nbformat.read(os.path.join(TUTORIALS, name), as_version=4)
    (index,) = [i for i, cell in enumerate(nb.cells)
                if "parameters" in cell.get("metadata", {}).get("tags", [])]
    nb.cells.insert(index + 1, nbformat.v4.new_code_cell(
        "SMOKE = True  # the size of this page's run", id=f"{name[:2]}-smoke"))
    with tempfile.TemporaryDirectory() as work:
        env = {**os.environ, "FENWICKS_ROOT": work, "TFDS_DATA_DIR": data_dir,
               "MPLBACKEND": "module://matplotlib_inline.backend_inline",
               "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": ROOT}
        client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT,
                                resources={"metadata": {"path": work}})
        start = time.perf_counter()
        client.execute(env=env)
        seconds = time.perf_counter() - start
        user_paths(nb, {work: USER_ROOT, data_dir: USER_TFDS})
    for cell in nb.cells:  # no absl start-up lines on the page
        for out in cell.get("outputs", []):
            if out.get("name") == "stderr":
                out["text"] = "".join(line for line in out["text"].splitlines(True)
                                      if not line.startswith(("WARNING: All log", "I0000")))
        cell.get("outputs", [])[:] = [o for o in cell.get("outputs", [])
                                      if o.get("output_type") != "stream" or o["text"]]
    nb.cells.insert(1, _note(cpu))
    nb.cells[1].id = f"{name[:2]}-note"
    os.makedirs(PAGES, exist_ok=True)
    nbformat.write(nb, os.path.join(PAGES, name))
    return seconds


def copy_text(name: str) -> None:
    """The page's markdown cells replaced by the notebook's (prose changes no output)."""
    nb = nbformat.read(os.path.join(TUTORIALS, name), as_version=4)
    path = os.path.join(PAGES, name)
    page = nbformat.read(path, as_version=4)
    by_id = {cell.id: cell for cell in nb.cells}
    with open(os.path.join(TUTORIALS, "smoke_seconds.json"), encoding="utf-8") as f:
        cpu = json.load(f)[name]["cpu"]
    for cell in page.cells:
        if cell.cell_type == "markdown" and cell.id in by_id:
            cell.source = by_id[cell.id].source
        elif cell.id == f"{name[:2]}-note":
            cell.source = _note(cpu).source
    nbformat.write(page, path)


def main(argv: list[str]) -> int:
    if "--text" in argv:
        for name in sorted(n for n in os.listdir(PAGES) if n.endswith(".ipynb")):
            copy_text(name)
        return 0
    sys.path.insert(0, ROOT)
    from fenwicks.accel import cpu_name

    names = sorted(n for n in os.listdir(TUTORIALS) if n.endswith(".ipynb")
                   and (not argv or n[:2] in argv))
    cpu = f"{cpu_name()}, {os.cpu_count()} cores, {platform.system()}"
    times_path = os.path.join(TUTORIALS, "smoke_seconds.json")
    times = json.load(open(times_path, encoding="utf-8")) if os.path.exists(times_path) else {}
    with tempfile.TemporaryDirectory() as data_dir:
        _stand_in_datasets(data_dir)
        for name in names:
            seconds = run(name, data_dir, cpu)
            times[name] = {"seconds": round(seconds, 1), "cpu": cpu}
            print(f"{name}: {seconds:.1f} s", flush=True)
            with open(times_path, "w", encoding="utf-8") as f:
                json.dump(times, f, indent=1, sort_keys=True)
                f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
