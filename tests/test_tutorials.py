"""The numbered tutorials: their shape (badge, install cell, one parameters cell, no outputs)
and that each runs top to bottom offline with ``SMOKE = True`` injected.

A notebook runs in a real Jupyter kernel (nbclient), in a temporary working directory with
``FENWICKS_ROOT`` pointing there, so nothing is written into the repository. Tutorial 1's
kernel and the JAX runs' are new interpreters; the others are forked from the test fork
server, which imported Fenwicks already (`ForkedKernelManager`). The
tensorflow-datasets they read (MNIST, CIFAR-10) are real tfds datasets, small, built here
by tfds's own machinery: builders that inherit tfds's MNIST and CIFAR-10 (same name,
version and features) and only generate their examples instead of downloading them.
``TFDS_DATA_DIR`` points the kernel at them; no mock. One test installs Fenwicks as the
README says into a fresh venv and runs tutorial 1's data loading there.

Tutorials 1 and 3 also run on the JAX engine (``FENWICKS_ENGINE=jax``, 8 host devices),
unchanged: the same notebooks, in the same pool of kernels. Tutorial 1's JAX kernel then
runs one more cell, what surrounds training on that engine: `find_lr` on a linear
regression whose curve is known by hand, `check_input` and ``profile_steps``.
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time

import nbformat
import numpy as np
import pytest
import tensorflow_datasets as tfds
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

# Imported first for what its import sets in this process's environment (GCS_* defaults,
# fenwicks._deadline), which the fork server's has: the kernels' environments then match it.
import fenwicks  # noqa: F401
from tests.conftest import fork_server_for, python_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TUTORIALS = os.path.join(ROOT, "tutorials")
NOTEBOOKS = sorted(name for name in os.listdir(TUTORIALS) if name.endswith(".ipynb"))
EXPECTED_NUMBERS = [f"{i:02d}" for i in range(1, 9)]
KNOBS = ("SMOKE", "BATCH_SIZE", "EPOCHS", "LEARNING_RATE", "WEIGHT_DECAY")
COLAB_BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
COLAB = "https://colab.research.google.com/github/"
TFDS_EXAMPLES = {"train": 300, "test": 150}  # above every SMOKE limit (256 / 128)
CELL_TIMEOUT = 240  # seconds; a smoke cell takes a few
WORKERS = 3  # notebooks executed at once
TUTORIAL_FILES = sorted(os.listdir(TUTORIALS))
# The notebooks that also run on the JAX engine ("same code everywhere"), as `RUNS` names
# them. 8 host devices as a TPU has. LLVM optimisation off (tutorial 3's training
# processes keep it: FENWICKS_DEVICE=cpu:N replaces only the device count): XLA compiles
# their small programs several times faster, and the smoke runs' few steps cost little
# more. Measured 2026-11-26 under load, each notebook's kernel and its processes: tutorial
# 3 on JAX 53 -> 34 s of CPU (its cpu:2 process 20 -> 15 s), tutorial 1 32 -> 22 s.
JAX = "@jax"
ON_JAX = ("01_mnist.ipynb", "03_same_code_everywhere.ipynb")
JAX_ENV = {"FENWICKS_ENGINE": "jax", "FENWICKS_DEVICE": "cpu:8", "KERAS_BACKEND": None,
           "XLA_FLAGS": "--xla_force_host_platform_device_count=8 "
                        "--xla_backend_optimization_level=0"}
# Longest first, so that the pool's kernels finish together: the JAX runs cost most.
RUNS = [name + JAX for name in reversed(ON_JAX)] + NOTEBOOKS


def _read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(os.path.join(TUTORIALS, name), as_version=4)


def _parameters_cells(nb) -> list[int]:
    return [i for i, cell in enumerate(nb.cells)
            if "parameters" in cell.get("metadata", {}).get("tags", [])]


def test_tutorials_are_numbered_01_to_08_once_each():
    numbers = [name[:2] for name in NOTEBOOKS]
    assert numbers == EXPECTED_NUMBERS, NOTEBOOKS
    for name in NOTEBOOKS:
        assert re.fullmatch(r"\d\d_[a-z0-9_]+\.ipynb", name), name


def _builder():
    spec = importlib.util.spec_from_file_location(
        "build_notebooks", os.path.join(TUTORIALS, "build_notebooks.py"))
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    return builder


def test_the_colab_badge_comes_from_the_one_repository_setting():
    builder = _builder()
    first = builder.build("05_learning_rate", url="https://github.com/someone/fenwicks")
    assert first.cells[0].source.startswith(
        f"[![Open In Colab]({COLAB_BADGE})]({COLAB}someone/fenwicks/blob/main/tutorials/"
        "05_learning_rate.ipynb)\n\n# Tutorial 5")
    for url in ("", "https://gitlab.com/someone/fenwicks"):  # unset; not on GitHub
        assert builder.build("05_learning_rate", url=url).cells[0].source.startswith("# ")


def test_notebooks_are_built_from_their_sources():
    builder = _builder()
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
    assert first.cell_type == "markdown" and first.source.lstrip().startswith(
        "[![Open In Colab]" if _builder().repo_url() else "# Tutorial ")
    # The badge opens this very notebook of the repository mkdocs.yml's repo_url names,
    # and there is none while that is unset: no link to a guessed address.
    url = _builder().repo_url()
    if url:
        assert f"{COLAB}{url.split('github.com/')[1]}/blob/main/tutorials/{name}" in \
            first.source
    else:
        assert COLAB not in json.dumps(nb) and COLAB_BADGE not in json.dumps(nb)
    install = next(cell for cell in nb.cells if cell.cell_type == "code")
    assert "'google.colab' in sys.modules" in install.source
    # The Colab install of README.md's "Install": the repository in /content/fenwicks.
    command = "pip install -q -e /content/fenwicks"
    assert "!" + command in install.source
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert command in f.read()
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


# Kernels forked from the test fork server (tests/_zygote.py, which imported Fenwicks once)
# instead of new interpreters. A forked kernel is still ipykernel in a process of its own,
# started, driven over ZMQ, interrupted and shut down by jupyter_client as Jupyter does;
# what it skips is the import of TensorFlow and Fenwicks, done in the server under the same
# environment (`fork_server_for` forks only when no variable read at import differs).
# Tutorial 1's kernel stays a new interpreter, so one notebook imports Fenwicks as a
# user's does; the JAX runs set variables read at import, so theirs are new ones too
# (and tests/test_interrupts.py's stop button has a real kernel of its own).
FRESH_KERNELS = ("01_mnist.ipynb",)
# What Jupyter adds to a kernel's environment, read by the kernel when it starts (after
# the fork): the name of its session, and the process to outlive (JPY_PARENT_PID).
JUPYTER_ENV = ("JPY_", "JUPYTER_")


class _ForkedKernel:
    """A forked kernel as `LocalProvisioner` handles its process (``poll``, ``wait``,
    ``send_signal``, ``kill``, ``terminate``). Its output is read to the end in a thread,
    as nothing else reads it; so no stream is left for the provisioner to close."""

    stdin = stdout = stderr = None

    def __init__(self, process) -> None:
        self.process, self.pid = process, process.pid
        threading.Thread(target=process.communicate, daemon=True).start()

    def __getattr__(self, name: str):
        return getattr(self.process, name)


class ForkedKernelManager(AsyncKernelManager):
    """jupyter_client's kernel manager, its kernel forked from the test fork server when
    the kernel's command and environment allow (else started as Jupyter starts it).

    `_async_launch_kernel` is the method jupyter_client documents for launching kernels
    differently; the provisioner keeps the process and sends it the signals (to the
    kernel alone: it leads no process group of its own)."""

    forked_in: set[str] = set()  # the working directories of the kernels forked

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw) -> None:
        env = kw["env"]
        args = kernel_cmd[1:] if kernel_cmd[0] == sys.executable else []
        server = fork_server_for(args, env, read_later=JUPYTER_ENV) if args else None
        if server is None:
            await super()._async_launch_kernel(kernel_cmd, **kw)
            return
        env = {**env, "JPY_PARENT_PID": str(server.server_pid())}  # ends with the server
        process = server.start(args, env, str(kw.get("cwd") or os.getcwd()))
        provisioner = self.provisioner
        provisioner.process, provisioner.pid = _ForkedKernel(process), process.pid
        provisioner.pgid, provisioner.cwd = None, kw.get("cwd")
        self._reconcile_connection_info(provisioner.connection_info)
        self.forked_in.add(str(kw.get("cwd")))


def _smoke_cell(nb) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(
        "# Injected by tests/test_tutorials.py: tiny sizes.\nSMOKE = True")


class LocalMnist(tfds.image_classification.MNIST, skip_registration=True):
    """tfds's MNIST (name, version, features), its examples generated: digit i is an
    image filled with 20 * (i % 10) + 1, labelled i % 10."""

    name = "mnist"

    def _split_generators(self, dl_manager):
        return {split: self._generate_local(n) for split, n in TFDS_EXAMPLES.items()}

    def _generate_local(self, n):
        for i in range(n):
            image = np.full((28, 28, 1), 20 * (i % 10) + 1, np.uint8)
            yield i, {"image": image, "label": i % 10}


class LocalCifar10(tfds.image_classification.Cifar10, skip_registration=True):
    """tfds's CIFAR-10, its examples generated: random images, label i % 10."""

    name = "cifar10"

    def _split_generators(self, dl_manager):
        return {split: self._generate_local(split, n) for split, n in TFDS_EXAMPLES.items()}

    def _generate_local(self, split, n):
        rng = np.random.default_rng(len(split))
        for i in range(n):
            yield f"{split}_{i}", {"id": f"{split}_{i:05d}", "label": i % 10,
                                   "image": rng.integers(0, 256, (32, 32, 3), np.uint8)}


@pytest.fixture(scope="module")
def tfds_data_dir(tmp_path_factory) -> str:
    """A TFDS_DATA_DIR holding small real MNIST and CIFAR-10 datasets."""
    root = str(tmp_path_factory.mktemp("tensorflow_datasets"))
    for builder in (LocalMnist, LocalCifar10):
        builder(data_dir=root).download_and_prepare()
    return root


@dataclasses.dataclass
class Run:
    """One executed notebook: the notebook with outputs, or the error; wall seconds."""

    nb: nbformat.NotebookNode
    error: BaseException | None
    seconds: float
    forked: bool  # its kernel came from the fork server


def _around_the_run_cell() -> nbformat.NotebookNode:
    """A cell for tutorial 1's kernel, after its last: `find_lr` on the linear regression
    of tests/test_lr_finder.py (its data inlined), `check_input`, and two more steps of
    `est` with ``profile_steps``; prints one JSON line."""
    from tests import test_lr_finder as lin

    return nbformat.v4.new_code_cell(textwrap.dedent(f"""\
        # Injected by tests/test_tutorials.py: around the run, on this kernel's engine.
        import glob, json
        import keras
        import tensorflow as tf

        X_lin = np.array({lin.X.tolist()!r}, np.float32)
        Y_lin = np.array({lin.Y.tolist()!r}, np.float32)
        W_lin = np.array({lin.W_INIT.tolist()!r}, np.float32)

        def lin_model():
            model = keras.Sequential([keras.Input(({lin.D},)),
                                      keras.layers.Dense(1, use_bias=False)])
            model.layers[0].kernel.assign(W_lin)
            return model

        lin_input = lambda params: tf.data.Dataset.from_tensor_slices((X_lin, Y_lin)).batch(
            params['batch_size'], drop_remainder=True).repeat()
        found = fw.train.find_lr(
            fw.train.get_reg_model_func(lin_model, fw.train.sgd_optimizer(0.1, mom=0.0)),
            lin_input, start_lr={lin.START}, end_lr={lin.END}, num_steps={lin.STEPS},
            batch_size={lin.N}, smoothing=0.5, verbose=False)
        verdict = est.check_input(train_input_func, num_batches=20, warmup_batches=2)
        step = est.global_step
        est.train(train_input_func, steps=2, profile_steps=(step + 1, step + 2))
        profiles = glob.glob(f"{{work_dir}}/train/plugins/profile/*/*.xplane.pb")
        print(json.dumps({{
            "engine": fw.accel.current().engine, "replicas": est.num_replicas,
            "find_lr": [found.lrs, found.losses, found.diverged, found.suggestion],
            "check_input": [verdict.input_examples_per_sec, verdict.seconds,
                            verdict.num_batches, BATCH_SIZE],
            "steps": [step, est.global_step],
            "profiles": [open(path, 'rb').read().count(b'jit(') for path in profiles]}}))
        """))


def _execute(name: str, work, env: dict[str, str]) -> Run:
    nb = _read(name.removesuffix(JAX))
    (index,) = _parameters_cells(nb)
    nb.cells.insert(index + 1, _smoke_cell(nb))
    if name == "01_mnist.ipynb" + JAX:
        nb.cells.append(_around_the_run_cell())
    forked = {} if name in FRESH_KERNELS else {"kernel_manager_class": ForkedKernelManager}
    client = NotebookClient(nb, kernel_name="python3", timeout=CELL_TIMEOUT,
                            resources={"metadata": {"path": str(work)}}, **forked)
    start = time.perf_counter()
    try:
        client.execute(env=env)  # raises CellExecutionError, naming the cell
        error = None
    except Exception as err:  # noqa: BLE001 - reported by that notebook's own test
        error = err
    return Run(nb, error, time.perf_counter() - start,
               str(work) in ForkedKernelManager.forked_in)


@pytest.fixture(scope="module")
def executed(tmp_path_factory, tfds_data_dir) -> dict[str, Run]:
    """Every notebook run once (`ON_JAX` ones twice), WORKERS kernels at a time (kernel
    start-up and imports wait on disk as much as on the CPU, so two cores run more than
    two kernels well)."""
    root = tmp_path_factory.mktemp("tutorials")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUPYTER_PATH", _kernel_dir(root))  # read here, by the kernel finder
        runs = {}
        with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
            for name in RUNS:
                work = root / (name[:2] + ("-jax" if name.endswith(JAX) else ""))
                work.mkdir()
                engine = JAX_ENV if name.endswith(JAX) else {}
                env = python_env({"FENWICKS_ROOT": str(work), "FENWICKS_DEVICE": None,
                                  "TFDS_DATA_DIR": tfds_data_dir, **engine,
                                  "MPLBACKEND": "module://matplotlib_inline.backend_inline"})
                runs[name] = pool.submit(_execute, name, work, env)
        return {name: future.result() for name, future in runs.items()}


@pytest.mark.parametrize("name", RUNS)
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


def test_the_tensorflow_kernels_but_tutorial_1_were_forked(executed):
    # A forked kernel skips the ~5 s import of TensorFlow and Fenwicks; a change to
    # the notebooks' environment that silently made them new interpreters would cost it.
    forked = sorted(name for name, run in executed.items() if run.forked)
    assert forked == [name for name in NOTEBOOKS if name not in FRESH_KERNELS], forked


def _printed(run: Run, stream: str | None = None) -> str:
    """Everything the notebook's cells printed (to `stream` only, if given: "stdout")."""
    return "".join(out.get("text", "") for cell in run.nb.cells if cell.cell_type == "code"
                   for out in cell.outputs if out.output_type == "stream"
                   and stream in (None, out.get("name")))


@pytest.mark.parametrize("name", ON_JAX)
def test_the_jax_runs_ran_on_the_jax_engine_and_the_others_on_tensorflow(name, executed):
    for run, engine in ((executed[name], "tf"), (executed[name + JAX], "jax")):
        if run.error is not None:
            raise run.error
        printed = _printed(run)
        if name.startswith("01"):  # fw.info()'s line, then the steps of the smoke run
            assert re.search(rf"^engine +{engine} ", printed, re.M), printed[:2000]
            # SMOKE: 256 examples, batch 64, one epoch: 4 steps, wherever it runs.
            assert "after 4 steps" in printed
        else:  # every process tutorial 3 started says what it trained on
            lines = re.findall(r"^ *cpu:\d: (\w+) engine, cpu x(\d)", printed, re.M)
            assert lines == [(engine, "1"), (engine, "2")], printed


@pytest.mark.parametrize("name", ["03_same_code_everywhere.ipynb",
                                  "03_same_code_everywhere.ipynb" + JAX])
def test_tutorial_3_trains_the_same_losses_on_1_and_2_replicas(name, executed):
    # Ghost BatchNorm and the loss over the global batch: the same function on 1 and 2
    # replicas, on either engine, so the curves agree to float32 rounding (a loss near
    # 2.3 is rounded at ~2.4e-7 per step).
    if executed[name].error is not None:
        raise executed[name].error
    diffs = re.findall(r"cpu:2: max \|loss - cpu:1 loss\| = (\S+)", _printed(executed[name]))
    assert len(diffs) == 1 and float(diffs[0]) < 1e-5, diffs


def test_around_the_run_on_the_jax_engine(executed):
    from tests import test_lr_finder as lin

    run = executed["01_mnist.ipynb" + JAX]
    if run.error is not None:
        raise run.error
    # stdout only: the progress bar (stderr) may end without a newline before it.
    out = json.loads(_printed(run, "stdout").strip().splitlines()[-1])
    assert out["engine"] == "jax" and out["replicas"] == 8
    # find_lr: the curve of full-batch gradient descent, replayed in numpy, on 8 devices.
    lin.check_result(*out["find_lr"])
    # check_input counted global batches: 20 steps of BATCH_SIZE examples over the time.
    rate, seconds, batches, batch_size = out["check_input"]
    assert batches == 20 and rate * seconds == pytest.approx(20 * batch_size, rel=1e-6)
    # profile_steps: one profile, JAX's own (TensorFlow's profiler sees no jit(...)).
    assert out["steps"][1] == out["steps"][0] + 2
    assert len(out["profiles"]) == 1 and out["profiles"][0] > 0, out["profiles"]


# ------------------------------------------------- a fresh install, as the README says


def _tutorial_code(name: str, last: str) -> str:
    """The code cells of tutorials/src/<name>.py up to the one containing ``last``, with
    ``SMOKE = True`` after the parameters cell; the Colab install cell left out."""
    spec = importlib.util.spec_from_file_location(
        "build_notebooks", os.path.join(TUTORIALS, "build_notebooks.py"))
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    code = []
    for cell in builder.build(name).cells[2:]:  # after the title and the install cell
        if cell.cell_type != "code":
            continue
        code.append(cell.source)
        if "parameters" in cell.metadata.get("tags", []):
            code.append("SMOKE = True")
        if last in cell.source:
            return "\n\n".join(code)
    raise AssertionError(f"no cell of {name} contains {last!r}")


def _clean_env(**extra: str) -> dict[str, str]:
    """A user's shell: no PYTHONPATH, no virtualenv of ours, pip's cache where it is.
    (Not `tests.conftest.python_env`, whose whole point is PYTHONPATH = this clone.)"""
    keep = ("PATH", "HOME", "LANG", "TMPDIR", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL",
            "PIP_FIND_LINKS", "PIP_CONFIG_FILE", "PIP_CACHE_DIR", "HTTPS_PROXY",
            "https_proxy", "SSL_CERT_FILE")
    return {**{k: os.environ[k] for k in keep if k in os.environ}, **extra}


@pytest.mark.slow
def test_a_fresh_venv_from_the_readme_install_loads_tutorial_1_data(tmp_path, tfds_data_dir):
    # An isolated venv (no --system-site-packages): only what setup.py declares is there,
    # which is what a new user gets. pip reuses its wheel cache, so this takes about a
    # minute; a cold cache downloads TensorFlow once. The README's install, plus
    # --no-compile: the same files without pip byte-compiling all of them first (10 of
    # 49 s here); Python compiles what is imported.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-compile", "-e",
                              ".[cpu]"],
                             cwd=ROOT, env=_clean_env(), capture_output=True, text=True,
                             timeout=540)
    assert install.returncode == 0, install.stderr[-3000:]
    check = subprocess.run([python, "-m", "pip", "check"], env=_clean_env(),
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    checks = textwrap.dedent("""
        import json
        print(json.dumps({"fenwicks": fw.__file__, "tfds": tfds_module.__file__,
                          "train": [list(X_train.shape), str(X_train.dtype)],
                          "test": [list(X_test.shape), str(X_test.dtype)],
                          "pixels_match_labels": bool(
                              (X_train[:, 0, 0, 0] == 20 * y_train + 1).all()
                              and (X_test[:, 0, 0, 0] == 20 * y_test + 1).all())}))
    """)
    code = (_tutorial_code("01_mnist", "X_test, y_test = load_split")
            + "\nimport tensorflow_datasets as tfds_module\n" + checks)
    proc = subprocess.run([python, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300,
                          env=_clean_env(FENWICKS_ROOT=str(tmp_path / "root"),
                                         TFDS_DATA_DIR=tfds_data_dir,
                                         TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["fenwicks"].startswith(ROOT)  # the clone, installed editable
    assert out["tfds"].startswith(str(venv))  # the venv's own tensorflow-datasets
    assert out["train"] == [[256, 28, 28, 1], "uint8"]  # SMOKE: N_TRAIN = 256 of 300
    assert out["test"] == [[128, 28, 28, 1], "uint8"]  # N_TEST = 128 of 150
    assert out["pixels_match_labels"]


# ------------------------------------------------- the tutorials as pages of the site

PAGES = os.path.join(ROOT, "docs", "tutorials")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_site_page_is_this_notebook_run_at_its_smoke_size(name):
    """docs/tutorials/<name> (tools/tutorial_pages.py) holds the notebook's cells as they
    are, plus the note and the ``SMOKE = True`` cell, with the outputs of that run."""
    nb, page = _read(name), nbformat.read(os.path.join(PAGES, name), as_version=4)
    (index,) = _parameters_cells(nb)
    expected = [cell.source for cell in nb.cells]
    expected[index + 1:index + 1] = ["SMOKE = True  # the size of this page's run"]
    expected.insert(1, page.cells[1].source)
    assert [cell.source for cell in page.cells] == expected, "run tools/tutorial_pages.py"
    assert page.cells[1].source.startswith("**What this page shows.** ")
    outputs = [out for cell in page.cells if cell.cell_type == "code" for out in cell.outputs]
    assert outputs and not [out for out in outputs if out.output_type == "error"]
    # The run's temporary folders are shown as a user's (tools/tutorial_pages.user_paths).
    texts = [str(out.get("text", "")) + str(out.get("data", {}).get("text/plain", ""))
             for out in outputs]
    assert not [text for text in texts if "/tmp/" in text], "a temporary path on the page"
    assert any("image/png" in out.get("data", {}) for out in outputs), "its plots"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_each_tutorial_states_its_run_time_at_its_top(name):
    top = _read(name).cells[0].source
    assert re.search(r"^- Default size, on a 2-core CPU: (up to )?about ", top, re.M), top[:600]
    assert re.search(r"^- On a GPU or a TPU: ", top, re.M)
    assert re.search(r"^- The `SMOKE` size .*set `SMOKE = True` in the Parameters cell:\s+"
                     r"\d+ s on a\s+2-core CPU", top, re.M | re.S), top[:600]
