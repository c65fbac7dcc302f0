"""README.md and the user guide are a contract: their Python blocks run as written, top to
bottom, in a fresh process on local disk, and do what the prose says. The README's quick
start comes first; then the guide's pages, in the order of `CHAIN`, each of which defines
what its code uses (`SELF_CONTAINED`)."""

from __future__ import annotations

import ast
import glob
import json
import os
import re

import pytest

from tests.conftest import ROOT, run_python

# The pages whose blocks make one script, in order (checked after the estimator's and
# the last page: `CHECKS`).
CHAIN = ("README.md", "docs/storage.md", "docs/input.md", "docs/estimator.md",
         "docs/performance.md", "docs/models.md")


def _blocks(name: str) -> list[str]:
    """Every ```python block of `name`. A ```py block is shown but not run: it needs
    something no test machine has (a tf.data service dispatcher on another machine, a
    TPU pod)."""
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def _python_blocks() -> list[str]:
    return [block for name in CHAIN for block in _blocks(name)]


def _quick_start() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        section = f.read().split("## Quick start", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_every_page_with_python_blocks_is_in_the_chain():
    pages = ["README.md", *(os.path.relpath(p, ROOT) for p in sorted(
        glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)))]
    assert [p for p in pages if _blocks(p) and p not in CHAIN] == []
    assert all(_blocks(p) for p in CHAIN), "a page of the chain has no block left"


def _env(tmp_path) -> dict[str, str]:
    return {"FENWICKS_ROOT": str(tmp_path / "root"), "FENWICKS_DEVICE": "cpu",
            "TMPDIR": str(tmp_path)}


def test_the_quick_start_learns_and_a_second_process_resumes_it(tmp_path):
    code = _quick_start()
    assert code == _python_blocks()[0]
    first = run_python(code, env=_env(tmp_path), cwd=str(tmp_path))
    result = ast.literal_eval(first.stdout.strip().splitlines()[-1])
    assert result["num_examples"] == 1797 - 1500
    assert result["global_step"] == 300
    assert result["accuracy"] >= 0.9, result
    # The run format: one folder per checkpoint step, committed whole (step 300 = max_steps).
    assert os.path.isdir(tmp_path / "root" / "work" / "digits" / "checkpoints" / "300")
    # Run again, as the README says: the checkpoint is at step 300 already, nothing is
    # trained, and the restored model evaluates exactly as the first process's did.
    second = run_python(code, env=_env(tmp_path), cwd=str(tmp_path))
    again = ast.literal_eval(second.stdout.strip().splitlines()[-1])
    assert again["global_step"] == 300 and again["num_examples"] == 297
    assert again["accuracy"] == result["accuracy"]
    assert again["loss"] == pytest.approx(result["loss"], rel=1e-5)


# What the pages made, printed right after the estimator's page (the pages after it make
# estimators of their own) and at the end.
CHECKS = {"docs/estimator.md": """
import json as _json
import numpy as _np
_files = sorted(os.path.basename(p) for p in fw.io.glob(records + '/*'))
print(_json.dumps({
    "sent": len(sent), "again": again, "files": _files,
    "train_records": fw.data.count_records(records + '/train*'),
    "steps_per_epoch": steps_per_epoch, "global_step": est.global_step,
    "eval": est.evaluate(eval_input_func),
    "probs_shape": list(probs.shape), "probs_sum": float(_np.abs(probs.sum(1) - 1).max()),
    "served_argmax": _np.asarray(served).argmax(1).tolist(),
    "probs_argmax": probs[:5].argmax(1).tolist(),
    "export": sorted(os.listdir(export_dir)),
}))
""", "docs/models.md": """
print(_json.dumps({"lr_steps": len(result.lrs), "suggestion": result.suggestion,
                   "verdict_steps": est.global_step}))
"""}


def test_every_python_block_runs_in_order_as_written(tmp_path):
    assert len(_python_blocks()) >= 5, "quick start, storage, input pipelines, estimator"
    code = "\n".join(part for name in CHAIN for part in [*_blocks(name), CHECKS.get(name, "")])
    proc = run_python(code, env=_env(tmp_path), cwd=str(tmp_path), timeout=600)
    printed = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"')]
    out = {**printed[-2], **printed[-1]}  # the estimator's page, then the last page
    # numpy_tfrecord: 4 shards of training digits and one test file, uploaded once.
    assert out["files"] == ["test"] + [f"train-0000{i}-of-00004" for i in range(4)]
    assert out["sent"] == 5 and out["again"] == []
    assert out["train_records"] == 1500 and out["steps_per_epoch"] == 1500 // 64
    assert out["global_step"] == 4 * (1500 // 64)  # train_and_evaluate(epochs=4)
    assert out["eval"]["num_examples"] == 1797 - 1500
    assert out["eval"]["accuracy"] >= 0.8, out["eval"]
    assert out["probs_shape"] == [297, 10] and out["probs_sum"] < 1e-4
    assert out["served_argmax"] == out["probs_argmax"]  # the export predicts the same
    assert "saved_model.pb" in out["export"]
    assert 2 <= out["lr_steps"] <= 30 and out["suggestion"] is not None
    assert out["verdict_steps"] == 20  # the performance page's estimator, then check_input
    # find_lr showed its progress against the 30 steps it expected.
    assert re.search(rf"find_lr: .*\b{out['lr_steps']}/30\b", proc.stderr)


# The guide pages whose code runs as written on its own: every name it uses, it defines.
SELF_CONTAINED = ("docs/storage.md", "docs/input.md", "docs/estimator.md",
                  "docs/performance.md", "docs/models.md")


def _undefined_names(code: str) -> set[str]:
    """The names `code` reads that it neither assigns, imports nor finds in builtins."""
    import builtins
    import symtable

    top = symtable.symtable(code, "<page>", "exec")
    defined = {s.get_name() for s in top.get_symbols()
               if s.is_assigned() or s.is_imported() or s.is_namespace()}
    used = {s.get_name() for s in top.get_symbols() if s.is_referenced()}
    stack = list(top.get_children())
    while stack:  # functions and lambdas: the names they read from the page
        table = stack.pop()
        used |= {s.get_name() for s in table.get_symbols()
                 if s.is_referenced() and s.is_global()}
        stack += table.get_children()
    return used - defined - set(dir(builtins))


@pytest.mark.parametrize("name", SELF_CONTAINED)
def test_a_guide_page_defines_what_its_code_uses(name):
    assert _undefined_names("\n".join(_blocks(name))) == set()
    assert _undefined_names("x = y + 1\nf = lambda p: z(p)") == {"y", "z"}  # the checker
