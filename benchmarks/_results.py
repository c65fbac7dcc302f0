"""A benchmark's figures as a file: ``benchmarks/results/<script>.json``.

Every script under ``benchmarks/`` takes ``--results``: it then writes its table (rows of
named figures), the machine it ran on, the date and the commit there, replacing the
previous file: one set of current results. The documentation's performance page renders
these files (``tools/mkdocs_hooks.py``); nobody copies a figure by hand.

    python benchmarks/matmul.py --sizes 1024 2048 --results
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(ROOT, "benchmarks", "results")


def add_option(parser: argparse.ArgumentParser) -> None:
    """Adds ``--results`` to a benchmark's parser."""
    parser.add_argument("--results", action="store_true",
                        help="also write the figures, the machine, the date and the commit "
                             "to benchmarks/results/<script>.json (replacing it)")


def machine() -> dict[str, Any]:
    """Where the figures were measured: OS, CPU model and count, Python, TensorFlow."""
    from fenwicks import accel  # here, not at import: scripts set TF_CPP_* first

    info: dict[str, Any] = {"platform": platform.platform(), "cpu": accel.cpu_name(),
                            "cpu_count": os.cpu_count(), "python": platform.python_version()}
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        info["tensorflow"] = tf.__version__
    return info


def commit() -> str | None:
    """The repository's commit (with ``+changes`` if the tree differs), or None."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+changes" if dirty else "")


def write(script: str, title: str, rows: list[dict[str, Any]], argv: list[str] | None = None,
          summary: str = "", directory: str = RESULTS_DIR) -> str:
    """Writes ``<directory>/<script name>.json`` and returns its path.

    Args:
        script: the benchmark's ``__file__``.
        title: one line: what the rows measure.
        rows: one dict per table row, the same keys in each (the table's columns).
        argv: the options it ran with. Defaults to ``sys.argv[1:]``.
        summary: one line under the table (the targets and whether they were met).
        directory: where to write. Defaults to ``benchmarks/results``.
    """
    name = os.path.splitext(os.path.basename(script))[0]
    options = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--results"]
    document = {"benchmark": name, "title": title, "rows": rows, "summary": summary,
                "command": " ".join(["python", f"benchmarks/{name}.py", *options]),
                "machine": machine(),
                "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
                "commit": commit()}
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(f"results written to {os.path.relpath(path, ROOT)}", file=sys.stderr)
    return path
