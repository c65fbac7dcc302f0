"""Builds tutorials/NN_name.ipynb from tutorials/src/NN_name.py (jupytext "percent" format).

Edit the sources, then run ``python tutorials/build_notebooks.py``; commit both. Review
happens on the plain-text sources; users open the notebooks. ``--check`` exits non-zero
if a notebook is out of date (the tutorial tests call `build` and compare).

Format of a source: cells start at ``# %%`` (code), ``# %% [markdown]`` (markdown, each
line behind ``# ``) or ``# %% tags=["parameters"]`` (the parameters cell); in code, a
commented magic (``# %%writefile x.py``, ``# !ls``) is uncommented. The builder
adds what every tutorial shares: the "Open in Colab" badge on top of the first markdown
cell (when ``repo_url`` in mkdocs.yml names a GitHub repository; none while it is unset)
and, after it, the cell that installs Fenwicks in Colab. Notebooks carry no outputs.
"""

from __future__ import annotations

import json
import os
import re
import sys

import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = os.path.join(HERE, "src")
# The repository's address is one setting, mkdocs.yml's repo_url (the site's link to it
# too). Colab opens notebooks from GitHub: a badge only for a github.com address.
MKDOCS_YML = os.path.join(os.path.dirname(HERE), "mkdocs.yml")
BADGE = ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
         "(https://colab.research.google.com/github/{repo}/blob/main/tutorials/{name})")
# The Colab half of README.md's "Install": the repository copied or cloned to this folder.
COLAB_SOURCE = "/content/fenwicks"
INSTALL = """\
# In Colab, install Fenwicks from your copy of the repository in {source} (upload and
# unzip it there, or git clone it there: see README.md, Install); elsewhere use the
# Fenwicks you installed with pip install -e '.[cpu]' (or '.[gpu]', or '.').
# Colab's GPU and CPU runtimes ship TensorFlow (kept as it is). Its TPU runtime ships JAX and
# no TensorFlow: there the `tpu` extra adds tensorflow-cpu for tf.data, and Keras runs on
# JAX (the jax engine). keep.txt holds every package the runtime has, at its version, so
# that installing Fenwicks changes none of them (README.md).
import importlib.util
import sys

if 'google.colab' in sys.modules:
    extra = '' if importlib.util.find_spec('tensorflow') else '[tpu]'
    !pip list --format=freeze > /tmp/keep.txt
    !pip install -q -e {source}{{extra}} -c /tmp/keep.txt"""
_MAGIC = re.compile(r"^# (%%?\w+|!)", re.M)
_MARKER = re.compile(r"^# %%(?P<kind> \[markdown\])?(?: tags=(?P<tags>\[.*\]))?\s*$")


def _cells(text: str) -> list[nbformat.NotebookNode]:
    """Splits a percent-format source into notebook cells."""
    cells, kind, tags, lines = [], None, [], []

    def flush() -> None:
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(re.sub(r"^# ?", "", line) for line in body.split("\n"))
            cells.append(nbformat.v4.new_markdown_cell(body))
        elif kind == "code" and body:
            # Magics are commented in the source (jupytext style) so it stays Python.
            cell = nbformat.v4.new_code_cell(_MAGIC.sub(r"\1", body))
            if tags:
                cell.metadata["tags"] = tags
            cells.append(cell)

    for line in text.split("\n"):
        match = _MARKER.match(line)
        if match:
            flush()
            kind = "markdown" if match.group("kind") else "code"
            tags, lines = json.loads(match.group("tags") or "[]"), []
        elif kind is not None:
            lines.append(line)
    flush()
    return cells


def repo_url() -> str:
    """mkdocs.yml's ``repo_url``, or "" while it is not set."""
    with open(MKDOCS_YML, encoding="utf-8") as f:
        match = re.search(r"^repo_url: *['\"]?([^'\"\s]*)", f.read(), re.M)
    return match[1] if match else ""


def badge(name: str, url: str) -> str:
    """The "Open in Colab" badge of notebook `name` for repository `url`; "" if `url` is
    not a GitHub repository (empty included): no link to a guessed address."""
    match = re.fullmatch(r"https://github\.com/([\w.-]+/[\w.-]+?)(?:\.git)?/?", url)
    return BADGE.format(repo=match[1], name=name + ".ipynb") + "\n\n" if match else ""


def build(name: str, url: str | None = None) -> nbformat.NotebookNode:
    """The notebook for source ``src/<name>.py``, badge (for repository `url`, by default
    `repo_url()`) and install cell added."""
    with open(os.path.join(SOURCES, name + ".py"), encoding="utf-8") as f:
        cells = _cells(f.read())
    if not cells or cells[0].cell_type != "markdown":
        raise ValueError(f"src/{name}.py must start with a markdown cell (the title)")
    url = repo_url() if url is None else url
    cells[0].source = badge(name, url) + cells[0].source
    cells.insert(1, nbformat.v4.new_code_cell(INSTALL.format(source=COLAB_SOURCE)))
    for i, cell in enumerate(cells):
        cell.id = f"{name[:2]}-{i:02d}"  # stable ids: rebuilding changes nothing
    nb = nbformat.v4.new_notebook(cells=cells)
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "colab": {"provenance": [], "toc_visible": True},
    }
    return nb


def names() -> list[str]:
    return sorted(f[:-3] for f in os.listdir(SOURCES) if re.fullmatch(r"\d\d_\w+\.py", f))


def main(argv: list[str]) -> int:
    stale = []
    for name in names():
        text = nbformat.writes(build(name)) + "\n"
        path = os.path.join(HERE, name + ".ipynb")
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if old != text:
            stale.append(name)
            if "--check" not in argv:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(text)
    print(("out of date: " if "--check" in argv else "wrote: ") + (", ".join(stale) or "-"))
    return 1 if stale and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
