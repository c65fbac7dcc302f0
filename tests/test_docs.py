"""The documentation site (mkdocs.yml, docs/): it builds with no warning, every page is in
its navigation, the API reference lists every public name, the reliability table names
tests that exist, and no page carries a dated measurement. The pages' Python blocks run
in tests/test_readme.py, after the README's quick start."""

from __future__ import annotations

import glob
import importlib
import itertools
import json
import os
import re
import zlib

import pytest
import yaml

from benchmarks import _results
from tests.conftest import ROOT, run_process
from tools import mkdocs_hooks

DOCS = os.path.join(ROOT, "docs")
# The modules whose every public name (`__all__`) the API reference must list.
REFERENCED = ("io", "gcs", "data", "transform", "train", "layers", "models", "accel", "plt")
DATE = re.compile(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> str:
    """``mkdocs build --strict`` into a temporary folder, as a user runs it."""
    site_dir = str(tmp_path_factory.mktemp("site"))
    proc = run_process(["-m", "mkdocs", "build", "--strict", "--site-dir", site_dir],
                       cwd=ROOT, env={"NO_MKDOCS_2_WARNING": "1"}, timeout=300, check=False,
                       fresh=True)
    assert proc.returncode == 0, proc.stderr[-5000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-5000:]
    return site_dir


def _inventory(site_dir: str) -> set[str]:
    """Every object the site documents, by the path it is shown under: the anchors of
    mkdocstrings' Sphinx inventory (``objects.inv``: 4 header lines, then zlib)."""
    with open(os.path.join(site_dir, "objects.inv"), "rb") as f:
        header = [f.readline() for _ in range(4)]
        assert header[0].startswith(b"# Sphinx inventory version 2"), header
        lines = zlib.decompress(f.read()).decode().splitlines()
    names = set()
    for line in lines:
        name, _domain, _priority, uri = line.split(" ", 4)[:4]
        names.add(name)
        if "#" in uri:
            names.add(uri.split("#", 1)[1].replace("$", name))
    return names


def test_the_site_builds_with_no_warning_and_lists_every_public_name(site):
    documented = _inventory(site)
    missing = []
    for module_name in REFERENCED:
        module = importlib.import_module(f"fenwicks.{module_name}")
        assert hasattr(module, "__all__"), f"fenwicks.{module_name} names no public API"
        missing += [f"fenwicks.{module_name}.{name}" for name in module.__all__
                    if f"fenwicks.{module_name}.{name}" not in documented]
    assert missing == [], f"the API reference lacks {missing}"
    # The benchmark results are a table on the performance page, from benchmarks/results.
    with open(os.path.join(site, "performance", "index.html"), encoding="utf-8") as f:
        page = f.read()
    for path in glob.glob(os.path.join(ROOT, "benchmarks", "results", "*.json")):
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
        assert f'id="{document["benchmark"]}"' in page and document["date"] in page, path


def _nav_pages(nav) -> list[str]:
    pages = []
    for entry in nav:
        for value in (entry.values() if isinstance(entry, dict) else [entry]):
            pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_of_docs_is_in_the_navigation_and_every_entry_exists():
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    nav = _nav_pages(config["nav"])
    pages = sorted(os.path.relpath(p, DOCS) for ext in ("md", "ipynb")
                   for p in glob.glob(os.path.join(DOCS, "**", f"*.{ext}"), recursive=True))
    assert sorted(nav) == pages
    for module_name in REFERENCED:  # one reference page per module, by its public name
        with open(os.path.join(DOCS, "api", f"{module_name}.md"), encoding="utf-8") as f:
            assert f"::: fenwicks.{module_name}\n" in f.read()
    # The build needs no network: no plugin that fetches (social cards, privacy).
    assert [p if isinstance(p, str) else next(iter(p)) for p in config["plugins"]] == \
        ["search", "mkdocs-jupyter", "mkdocstrings"]


def test_no_dated_measurement_outside_the_generated_tables():
    files = ["README.md", "pyproject.toml", "setup.py",
             *(os.path.relpath(p, ROOT)
               for p in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))]
    dated = []
    for name in files:
        with open(os.path.join(ROOT, name), encoding="utf-8") as f:
            dated += [f"{name}:{n}: {line}" for n, line in enumerate(f, 1)
                      if DATE.search(line)]
    assert dated == []


def test_every_test_the_reliability_table_names_exists():
    """The table is kept true: each row names a test (``file.py::name``) that exists."""
    with open(os.path.join(DOCS, "reliability.md"), encoding="utf-8") as f:
        rows = [line for line in f.read().splitlines()
                if line.startswith("| ") and not line.startswith("| Fault")]
    test_name = r"`(test_\w+\.py)::(test_\w+)`"
    unnamed = [row for row in rows if not re.search(test_name, row)]
    assert len(rows) >= 19 and len(unnamed) == 1, unnamed  # one row says "same test"
    named = re.findall(test_name, "\n".join(rows))
    for filename, test in named:
        with open(os.path.join(ROOT, "tests", filename), encoding="utf-8") as f:
            assert re.search(rf"^def {test}\(", f.read(), re.M), f"{filename}::{test}"


def test_a_benchmark_writes_its_results_and_the_site_renders_them(tmp_path):
    rows = [{"N": 1024, "TF/numpy": 1.1}, {"N": 2048, "TF/numpy": 0.95}]
    path = _results.write(os.path.join(ROOT, "benchmarks", "matmul.py"), "a title", rows,
                          ["--sizes", "1024", "2048", "--results"], summary="a summary",
                          directory=str(tmp_path))
    assert os.path.basename(path) == "matmul.json"
    with open(path, encoding="utf-8") as f:
        document = json.load(f)
    assert document["rows"] == rows and DATE.fullmatch(document["date"])
    assert document["command"] == "python benchmarks/matmul.py --sizes 1024 2048"
    assert document["machine"]["cpu_count"] == os.cpu_count()
    assert re.fullmatch(r"[0-9a-f]{12}(\+changes)?", document["commit"])
    page = mkdocs_hooks.on_page_markdown(f"before\n{mkdocs_hooks.MARKER}\nafter",
                                         page=None, config=None, files=None)
    assert page.startswith("before\n") and page.endswith("\nafter")
    table = mkdocs_hooks.render(document)
    assert "| N | TF/numpy |\n|---|---|\n| 1,024 | 1.1 |\n| 2,048 | 0.95 |" in table
    assert document["date"] in table and document["commit"] in table


def _readme() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_the_readme_commands_match_ci_and_the_extras():
    readme = _readme()
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    # CI runs the README's whole-suite command (plus --durations), installing the same.
    suite = re.search(r"^pip install -q -e '(\.\[[a-z,]+\])' && python -m pytest -q -n 3 "
                      r"--dist loadgroup$", readme, re.M)
    assert suite, "the README's whole-suite command"
    assert f"python -m pip install -q -e '{suite[1]}' && python -m pytest -q -n 3 " \
           "--dist loadgroup --durations=30" in ci
    assert "docs" in suite[1][2:-1].split(",")  # test_docs builds the site
    # The tutorials, opened locally: the notebooks extra brings Jupyter.
    assert "\npip install -e '.[cpu,notebooks]' && jupyter lab tutorials/\n" in readme
    with open(os.path.join(ROOT, "setup.py"), encoding="utf-8") as f:
        setup_py = f.read()
    assert re.search(r'"notebooks": \[[^\]]*"jupyterlab[^\]]*"ipywidgets', setup_py)
    assert re.search(r'"docs": \[[^\]]*"mkdocs-material[^\]]*"mkdocstrings\[python\]'
                     r'[^\]]*"mkdocs-jupyter', setup_py)
    assert len(readme.splitlines()) <= 250


HEADING = re.compile(r'<h[1-6] id="(fenwicks\.[\w.]+)" class="doc doc-heading"')
PROMPT = '<span class="gp">&gt;&gt;&gt; </span>'  # a >>> prompt, highlighted as pycon


def _api_pages(site_dir: str) -> dict[str, str]:
    pages = {}
    for path in sorted(glob.glob(os.path.join(site_dir, "api", "**", "*.html"),
                                 recursive=True)):
        with open(path, encoding="utf-8") as f:
            pages[os.path.relpath(path, site_dir)] = f.read()
    return pages


def _documented_sections(page: str) -> dict[str, str]:
    """Each object's part of an API page: from its heading to the next object's."""
    starts = [(m.start(), m[1]) for m in HEADING.finditer(page)] + [(len(page), "")]
    return {name: page[start:end] for (start, name), (end, _) in itertools.pairwise(starts)}


def _has_examples(name: str) -> bool:
    """Whether the object shown as `name` has a docstring ``Examples:`` section (an alias,
    ``EstimatorSpec = TPUEstimatorSpec``, is shown as an assignment, its docstring under
    its own name)."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):  # the longest importable module, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
        if getattr(obj, "__name__", parts[-1]) != parts[-1]:
            return False
        doc = getattr(obj, "__doc__", None) if obj is not None else None
        return bool(doc) and re.search(r"^\s*Examples:\s*$", doc, re.M) is not None
    return False


def test_every_docstring_example_is_a_highlighted_code_block(site):
    """The ``>>>`` lines of a docstring are a highlighted Python block on the API pages,
    not text that Markdown reads as blockquotes nested three deep (an ``Example:``
    section, singular, is an admonition griffe leaves to Markdown)."""
    pages = _api_pages(site)
    nested = {path: page.count("<blockquote>") for path, page in pages.items()
              if re.search(r"<blockquote>\s*<blockquote>", page)}
    assert nested == {}, f"docstring prompts read as nested blockquotes on {nested}"
    shown, missing = 0, []
    for path, page in pages.items():
        for name, section in _documented_sections(page).items():
            if _has_examples(name):
                shown += 1
                if PROMPT not in section or '<div class="highlight">' not in section:
                    missing.append(f"{path}: {name}")
    assert missing == [], f"examples not rendered as code: {missing}"
    assert shown >= 100, shown  # the examples were found at all (142 when written)


def test_fw_train_is_split_by_what_users_call_first(site):
    """The estimator's page opens with get_tpu_estimator, Estimator and its config; every
    public name of fw.train is on exactly one of its pages; no API page lists files."""
    with open(os.path.join(site, "api", "train", "estimator", "index.html"),
              encoding="utf-8") as f:
        first = [m[1] for m in HEADING.finditer(f.read())
                 if m[1].count(".") == 2][:3]  # fenwicks.train.X, not its members
    assert first == ["fenwicks.train.get_tpu_estimator", "fenwicks.train.Estimator",
                     "fenwicks.train.EstimatorConfig"]
    import fenwicks.train

    shown = []
    for page in ("estimator", "optimizers", "callbacks", "tpu_estimator", "errors"):
        with open(os.path.join(DOCS, "api", "train", f"{page}.md"), encoding="utf-8") as f:
            shown += re.findall(r"^::: fenwicks\.train\.(\w+)$", f.read(), re.M)
    assert sorted(shown) == sorted(fenwicks.train.__all__)
    files = {path: re.findall(r"<code>[\w/]+\.py</code>", page)
             for path, page in _api_pages(site).items()}
    assert {path: names for path, names in files.items() if names} == {}


def _nav_section(title: str) -> list[str]:
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        nav = yaml.safe_load(f)["nav"]
    return next(_nav_pages(entry[title]) for entry in nav
                if isinstance(entry, dict) and title in entry)


def test_the_user_guide_cites_no_test_and_development_is_under_contributing():
    """How a behaviour is tested, and maintainer notes, are on the Contributing pages;
    the user guide says what to do (the home page's table links to the proofs page)."""
    guide = _nav_section("User guide")
    assert "development.md" not in guide and "reliability.md" not in guide
    assert {"development.md", "proofs.md", "reliability.md"} <= set(_nav_section("Contributing"))
    cited = []
    for page in guide:
        with open(os.path.join(DOCS, page), encoding="utf-8") as f:
            cited += [f"{page}:{n}: {line.strip()}" for n, line in enumerate(f, 1)
                      if re.search(r"\btests/|\btest_\w+\.py\b|tools/tf_matrix", line)]
    assert cited == []


# Each tutorial and the guide page of its topic, which links to it.
TUTORIAL_TOPICS = {"01": "estimator.md", "02": "models.md", "03": "platforms.md",
                   "04": "input.md", "05": "models.md", "06": "estimator.md",
                   "07": "input.md", "08": "performance.md"}


def test_each_tutorial_is_linked_from_the_home_page_and_its_guide_page():
    names = sorted(n for n in os.listdir(os.path.join(ROOT, "tutorials")) if n.endswith(".ipynb"))
    assert sorted(TUTORIAL_TOPICS) == [n[:2] for n in names]
    assert sorted(p for p in _nav_section("Tutorials")) == [f"tutorials/{n}" for n in names]
    for name in names:
        for page in ("index.md", TUTORIAL_TOPICS[name[:2]]):
            with open(os.path.join(DOCS, page), encoding="utf-8") as f:
                assert f"(tutorials/{name})" in f.read(), f"{page} does not link {name}"


def test_the_tutorials_are_pages_of_the_site_with_their_outputs(site):
    names = sorted(n[:-6] for n in os.listdir(os.path.join(ROOT, "tutorials"))
                   if n.endswith(".ipynb"))
    with open(os.path.join(site, "index.html"), encoding="utf-8") as f:
        home = f.read()
    for name in names:
        with open(os.path.join(site, "tutorials", name, "index.html"), encoding="utf-8") as f:
            page = f.read()
        assert "data:image/png" in page, f"{name}: no plot of its SMOKE run"
        assert "Run time" in page and "What this page shows" in page, name
        assert f'href="tutorials/{name}/"' in home, f"the home page does not link {name}"
    with open(os.path.join(site, "search", "search_index.json"), encoding="utf-8") as f:
        assert "your own images" in f.read().lower()  # tutorial 7 is found by search
    # The "Why Fenwicks" table: each row links to what shows it.
    why = home.split('id="why-fenwicks"', 1)[1].split("</table>", 1)[0]
    assert why.count('href="proofs/#') == why.count("<tr>") - 1 == 7
    assert 'href="proofs/#a-run-continues-on-the-other-engine"' in why  # the engine switch
    with open(os.path.join(site, "proofs", "index.html"), encoding="utf-8") as f:
        proofs = f.read()
    for anchor in re.findall(r'href="proofs/#([^"]+)"', why):
        assert f'id="{anchor}"' in proofs, anchor


def test_no_link_on_the_site_leads_nowhere(site):
    """Every relative link of every page reaches a file of the site, and its #anchor an id
    on that page: the tutorials' links to each other included, which point at notebooks
    in Jupyter and at pages on the site (tools/mkdocs_hooks.tutorial_links). The 404 page
    is left out: its links are absolute, from the site's root."""
    from urllib.parse import unquote, urlparse

    pages = {}
    for path in glob.glob(os.path.join(site, "**", "*.html"), recursive=True):
        with open(path, encoding="utf-8") as f:
            pages[path] = f.read()
    ids = {path: set(re.findall(r'\sid="([^"]+)"', page)) for path, page in pages.items()}
    dead = []
    for path, page in pages.items():
        if os.path.basename(path) == "404.html":
            continue
        for href in re.findall(r'\shref="([^"]+)"', page):
            link = urlparse(href.replace("&amp;", "&"))
            if link.scheme or link.netloc:
                continue  # another site, a mailto: or a data: URL
            target = (os.path.normpath(os.path.join(os.path.dirname(path), unquote(link.path)))
                      if link.path else path)
            if os.path.isdir(target):
                target = os.path.join(target, "index.html")
            if not os.path.exists(target) or (
                    link.fragment and target in ids and link.fragment not in ids[target]):
                dead.append(f"{os.path.relpath(path, site)}: {href}")
    assert dead == []
    assert mkdocs_hooks.tutorial_links('<a href="02_cifar10_resnet9.ipynb#data">') == \
        '<a href="../02_cifar10_resnet9/#data">'
