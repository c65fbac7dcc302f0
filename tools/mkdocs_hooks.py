"""MkDocs hooks (``mkdocs.yml``, ``hooks:``): the benchmark results as tables, and the
tutorials' links to each other pointed at their pages.

A page line ``<!-- benchmark-results -->`` becomes one table per file in
``benchmarks/results/*.json`` (written by ``python benchmarks/<script>.py --results``),
each with the machine, the date and the commit it was measured on. The figures are never
typed into a page by hand.
"""

from __future__ import annotations

import glob
import html
import json
import os
import re
from typing import Any

MARKER = "<!-- benchmark-results -->"
RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "benchmarks", "results")


def _cell(value: Any) -> str:
    text = f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)
    return html.escape(text).replace("|", "\\|")


def render(document: dict[str, Any]) -> str:
    """One result file as Markdown: a heading, the table, what it ran on."""
    rows = document["rows"]
    columns = list(dict.fromkeys(key for row in rows for key in row))
    machine = document["machine"]
    lines = [f"### {document['benchmark']}", "", document["title"] + ":", "",
             "| " + " | ".join(_cell(c) for c in columns) + " |",
             "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |"
              for row in rows]
    lines += ["", *([document["summary"] + ".", ""] if document.get("summary") else []),
              f"`{document['command']}` on {machine['cpu']} ({machine['cpu_count']} CPUs, "
              f"{machine['platform']}), {document['date']}, commit "
              f"`{document.get('commit') or 'unknown'}`.", ""]
    return "\n".join(lines)


def results_markdown(directory: str = RESULTS) -> str:
    """Every result file in `directory`, by benchmark name; a line if there is none."""
    paths = sorted(glob.glob(os.path.join(directory, "*.json")))
    if not paths:
        return "No results yet: run a benchmark with `--results`.\n"
    parts = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            parts.append(render(json.load(f)))
    return "\n".join(parts)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs' hook: the marker replaced by the tables."""
    return markdown.replace(MARKER, results_markdown()) if MARKER in markdown else markdown


# A tutorial links the next one as the notebook beside it ("02_cifar10_resnet9.ipynb"),
# which is right in Jupyter and Colab; on the site that notebook is the page ../02_.../.
_TUTORIAL_LINK = re.compile(r'href="(\d\d_\w+)\.ipynb(#[^"]*)?"')


def tutorial_links(html_text: str) -> str:
    """A tutorial page's links to other tutorial notebooks, as links to their pages."""
    return _TUTORIAL_LINK.sub(lambda m: f'href="../{m[1]}/{m[2] or ""}"', html_text)


def on_post_page(output: str, page: Any, **kwargs: Any) -> str:
    """MkDocs' hook: on a tutorial's page, links to the other tutorials go to their pages."""
    src = getattr(page.file, "src_uri", "")
    tutorial = src.startswith("tutorials/") and src.endswith(".ipynb")
    return tutorial_links(output) if tutorial else output
