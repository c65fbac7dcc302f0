"""Shared test helpers. Multi-replica tests run in a subprocess: logical CPU devices must
be configured before TensorFlow initialises, which the parent test process already did."""

from __future__ import annotations

import atexit
import functools
import gc
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

try:  # tests/ may or may not be a package; the helpers live beside this file
    from tests import _zygote as _fork_server
    from tests import gcs_emulator as _gcs_emulator
except ImportError:
    import _zygote as _fork_server
    import gcs_emulator as _gcs_emulator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# Python's own Ctrl-C handler in every test process. A process started in the background
# by a non-interactive shell (``pytest ... &``) inherits SIGINT ignored, and Python then
# installs no handler: Fenwicks rightly leaves an ignored SIGINT alone, and the Ctrl-C
# tests (test_interrupts) would wait in a compiled loop for an interrupt that never comes.
# They test what a terminal or a notebook gives; so does this. Subprocesses get Python's
# handler too (a handled signal is reset to the default at exec).
if (threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.SIG_IGN):
    signal.signal(signal.SIGINT, signal.default_int_handler)


# Thread pools of every test's TensorFlow (the pytest workers' and their processes'). Two
# xdist workers already fill the two cores; TensorFlow's default pools (one thread per
# core each) then oversubscribe them, and the 8-logical-device processes suffer most:
# csv_and_lambda on cpu:8 beside two busy cores took 31-33 s with the defaults and
# 18-24 s with these (tests/_callbacks.py, measured 2026-11-25). Tests that set their own
# values keep them.
TEST_THREADS = {name: os.environ.get(name, value) for name, value in (
    ("TF_NUM_INTEROP_THREADS", "2"), ("TF_NUM_INTRAOP_THREADS", "1"))}
os.environ.update(TEST_THREADS)  # before this process's TensorFlow makes its pools


# One temporary directory for the session, removed when it ends: every test process's
# temporary files go there (TMPDIR), among them the module AutoGraph writes for each
# function it converts, which only an exit hook removes: processes that tests kill leave
# theirs, ~150 a run, 11,500 in /tmp after a few days of runs. pytest's own tmp_path
# directories stay where they were (PYTEST_DEBUG_TEMPROOT), kept for a failed run.
if not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller; workers inherit both
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
    _SESSION_TMP = tempfile.mkdtemp(prefix="fw-tests-")
    os.environ["TMPDIR"], tempfile.tempdir = _SESSION_TMP, None
    atexit.register(shutil.rmtree, _SESSION_TMP, True)


# JAX's persistent compilation cache, shared by every process of one test session (the
# xdist controller and its workers), in the session's temporary directory and removed
# with it. Many JAX processes compile the same programs (the narrow mnist_net at
# the same shapes on 8 devices); with the cache a repeat costs a file read. Measured
# 2026-11-26 under a 2-worker suite's load: `tests._jax_engine` for 42 steps took 82 s
# (40 s training) cold and 15 s (4 s) warm. A fresh session starts cold, so CI measures
# the first compile of each program as a user meets it.
JAX_CACHE_DIR = os.path.join(tempfile.gettempdir(), "fw-jax-cache")
for _name, _value in (("JAX_COMPILATION_CACHE_DIR", JAX_CACHE_DIR),
                      ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0"),
                      ("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")):
    os.environ.setdefault(_name, _value)

# The fork servers' list of Fenwicks functions to convert with AutoGraph before forking
# (tests/_autograph_warmup.py), found by the session's first server, read by the rest;
# in the session's temporary directory, like the cache above.
AUTOGRAPH_LISTING = os.path.join(tempfile.gettempdir(), "fw-autograph.json")
os.environ.setdefault("FENWICKS_TEST_AUTOGRAPH_LISTING", AUTOGRAPH_LISTING)


def python_env(env: dict[str, str | None] | None = None,
               inherit: bool = True) -> dict[str, str]:
    """The environment of a test's Python subprocess: this worktree first on the path.

    ``os.environ`` (unless `inherit` is False: then only ``PATH`` and ``HOME``), with
    ``PYTHONPATH`` = the repository root, TensorFlow's start-up chatter silenced, and
    `env` on top; a value of None removes that variable (e.g. ``FENWICKS_DEVICE``).

    Example:
        >>> python_env({"FENWICKS_DEVICE": "cpu:8"})["PYTHONPATH"] == ROOT
        True
    """
    base = dict(os.environ) if inherit else {k: os.environ[k] for k in ("PATH", "HOME")
                                             if k in os.environ}
    full = {**base, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2", **TEST_THREADS}
    for name, value in (env or {}).items():
        if value is None:
            full.pop(name, None)
        else:
            full[name] = value
    return full


def run_process(args: list[str], env: dict[str, str | None] | None = None,
                cwd: str | os.PathLike | None = ROOT, timeout: float = 600,
                check: bool = True, inherit: bool = True,
                fresh: bool = False) -> subprocess.CompletedProcess:
    """THE runner: ``python *args`` in a new process with `python_env(env)`.

    Every test subprocess starts here, so the environment is set up in one place. With
    `check` (the default) a non-zero exit raises with the process's output. The result
    also carries ``.seconds``, the wall time of the process.

    ``-c``/``-m`` processes whose environment differs from this one's only in variables
    read after import are forked from `tests._zygote`, which imported Fenwicks once
    (~6 s saved per process); those with ``KERAS_BACKEND=jax`` and otherwise this
    environment, from a second server that imported Fenwicks on JAX (`_JaxServer`).
    `fresh` (or ``FENWICKS_TEST_FRESH=1``) forces a new interpreter, as a property about
    start-up or import order needs.

    Example:
        >>> run_process(["-m", "fenwicks", "info"], {"FENWICKS_DEVICE": "cpu:8"}).stdout
    """
    full_env = python_env(env, inherit)
    start = time.perf_counter()
    server = None if fresh or not inherit else fork_server_for(args, full_env)
    if server is not None:
        proc = server.run(args, full_env, str(cwd or os.getcwd()), timeout)
    else:
        proc = subprocess.run([sys.executable, *args], env=full_env, cwd=cwd,
                              capture_output=True, text=True, timeout=timeout)
    proc.seconds = time.perf_counter() - start
    if check and proc.returncode != 0:
        shown = " ".join(a if len(a) < 80 else a[:77] + "..." for a in args)
        raise AssertionError(f"python {shown} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


class _JaxServer(_fork_server.Client):
    """The fork server of JAX-engine processes: Fenwicks imported with
    ``KERAS_BACKEND=jax`` (Keras fixes its backend at import), JAX's backend not yet
    initialised (Fenwicks touches no device at import). A child may set ``XLA_FLAGS``
    (the host device count, the optimisation level): XLA reads it when the child first
    uses JAX, as a new interpreter would (tests/test_jax_zygote.py checks both), and the
    compilation cache hashes the child's. ``jax.distributed.initialize`` works there too.
    Not ``FENWICKS_DEVICE``: on JAX, `import fenwicks` applies it (``cpu:N`` becomes
    XLA_FLAGS), so a child that sets it starts fresh. Saves the ~6 s of CPU of
    ``import fenwicks`` per JAX process."""

    RUNTIME_ENV = (_fork_server.Client.RUNTIME_ENV - {"FENWICKS_DEVICE"}) | {"XLA_FLAGS"}


_zygote = _fork_server.Client(python_env, ROOT)
_jax_zygote = _JaxServer(lambda: python_env({"KERAS_BACKEND": "jax", "FENWICKS_DEVICE": None,
                                             "XLA_FLAGS": None}), ROOT)
atexit.register(_zygote.stop)
atexit.register(_jax_zygote.stop)


def fork_server_for(args: list[str], env: dict[str, str],
                    read_later: tuple[str, ...] = ()) -> _fork_server.Client | None:
    """The fork server that may run ``python *args`` with `env`, if one may (its
    ``start`` returns a `tests._zygote.ForkedProcess`); None: start a new interpreter.
    `read_later`: as for `tests._zygote.Client.may_run`."""
    return next((server for server in (_zygote, _jax_zygote)
                 if server.may_run(args, env, read_later)), None)


def start_process(args: list[str], env: dict[str, str | None] | None = None,
                  cwd: str | os.PathLike | None = ROOT,
                  fresh: bool = False) -> subprocess.Popen | _fork_server.ForkedProcess:
    """`run_process`'s environment for a process the test signals or waits on itself
    (text pipes for stdout and stderr), forked from `tests._zygote` on the same terms
    as `run_process` (a `ForkedProcess`, used as the `subprocess.Popen` it otherwise is).
    """
    full_env = python_env(env)
    server = None if fresh else fork_server_for(args, full_env)
    if server is not None:
        return server.start(args, full_env, str(cwd or os.getcwd()))
    return subprocess.Popen([sys.executable, *args], env=full_env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def last_json(stdout: str) -> object:
    """The JSON document on the last line of a process's stdout."""
    return json.loads(stdout.strip().splitlines()[-1])


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 600,
               cwd: str | None = None, fresh: bool = False) -> subprocess.CompletedProcess:
    """Runs `code` in a new process (see `run_process`); raises with its output if it
    fails."""
    return run_process(["-c", textwrap.dedent(code)], env=env, cwd=cwd, timeout=timeout,
                       fresh=fresh)


def run_json(code: str, env: dict[str, str] | None = None, timeout: float = 600,
             cwd: str | None = None, fresh: bool = False):
    """Runs `code`, which must print one JSON document as its last stdout line."""
    return last_json(run_python(code, env=env, timeout=timeout, cwd=cwd,
                                fresh=fresh).stdout)


def run_module_json(module: str, *args: str, env: dict[str, str] | None = None,
                    timeout: float = 900, fresh: bool = False) -> object:
    """Runs ``python -m module *args`` in a fresh interpreter; its last stdout line as JSON.

    Subprocess code lives in helper modules (`tests._flagship`, ...) that ruff checks,
    rather than in code strings.
    """
    return last_json(run_process(["-m", module, *args], env=env, timeout=timeout,
                                 fresh=fresh).stdout)


# ------------------------------------------------- one process for several tests' snippets

_SNIPPETS: dict[str, dict[str, str]] = {}  # FENWICKS_DEVICE -> name -> code
_SHARED: dict[str, dict[str, Any]] = {}  # FENWICKS_DEVICE -> name -> result
_SHARED_LOCK = threading.Lock()


def shared_snippet(device: str, name: str, code: str) -> Callable[[], Any]:
    """Registers `code` to run under ``FENWICKS_DEVICE=device`` in ONE process shared by
    every snippet registered for that device (TensorFlow starts once for all of them).

    `code` is what `run_json` takes: a program printing one JSON document last. Register
    at module level; call the returned function in the test: the first call runs the
    process (`tests._shared_process`), every call returns that snippet's JSON document,
    or raises with its traceback if it failed (only its own test fails).

    Example:
        >>> EIGHT = shared_snippet("cpu:8", "lr_finder", "print(1)")
        >>> def test_eight(): assert EIGHT() == 1
    """
    _SNIPPETS.setdefault(device, {})[name] = textwrap.dedent(code)
    return lambda: _shared_result(device, name)


def _shared_result(device: str, name: str) -> Any:
    with _SHARED_LOCK:
        if device not in _SHARED:
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(_SNIPPETS[device], f)
            try:
                _SHARED[device] = run_module_json("tests._shared_process", f.name,
                                                  env={"FENWICKS_DEVICE": device})
            finally:
                os.unlink(f.name)
    result = _SHARED[device][name]
    if "error" in result:
        raise AssertionError(f"snippet {name!r} failed in the shared FENWICKS_DEVICE="
                             f"{device} process:\n{result['error']}")
    return result["json"]


# CI (.ci/run) sets it: a test that needs root's namespaces (a network namespace, a mount
# namespace) fails there when it cannot make one, rather than skipping silently.
REQUIRE_NAMESPACES = "FENWICKS_REQUIRE_NAMESPACES"


def skip_or_fail_without_namespaces(reason: str) -> None:
    """Skips a test that could not make the namespace it needs, or fails it under CI."""
    if os.environ.get(REQUIRE_NAMESPACES) == "1":
        pytest.fail(f"{reason} ({REQUIRE_NAMESPACES}=1: a skip would hide it)")
    pytest.skip(reason)


@pytest.fixture
def subprocess_json():
    return run_json


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory):
    r"""A real GCS server (gcp-storage-emulator) in a private network namespace.

    Yields a `tests.gcs_emulator.GcsEmulator` with ``.bucket`` (an existing bucket),
    ``.url(*parts)`` / ``.unique_url(name)`` (``gs://`` paths; the bucket is shared by
    the session, so use a unique prefix per test) and ``.run_python(code, env=None,
    timeout=300)`` / ``.run_json(...)``, which mirror `run_python` / `run_json` above but
    run the snippet INSIDE the namespace with everything set: TensorFlow's own ``gs://``
    client (tf.io.gfile, TFRecord, checkpoints, tf.summary) and gcsfs / `fw.io` both
    reach the server; ``FENWICKS_BUCKET`` names the bucket. Only code run that way sees
    the server: the pytest process itself is outside the namespace.

    Needs root. Skips with the reason otherwise, except when
    ``FENWICKS_REQUIRE_GCS_EMULATOR=1`` (CI), where failing to start is a failure.

    Example:
        def test_roundtrip(gcs_emulator):
            path = gcs_emulator.unique_url("demo") + "/a.txt"
            code = ("import json, tensorflow as tf\n"
                    f"tf.io.gfile.GFile({path!r}, 'w').write('hi')\n"
                    f"print(json.dumps(tf.io.gfile.GFile({path!r}).read()))")
            out = gcs_emulator.run_json(code)
            assert out == "hi"
    """
    yield from _running_emulator(tmp_path_factory.mktemp("gcs_emulator"))


@pytest.fixture(scope="session")
def gcs_fault_emulator(tmp_path_factory):
    """Like `gcs_emulator`, but every request passes through `tests._fault_proxy`.

    Code run inside the namespace (``run_module`` / ``run_python``) schedules faults with
    ``tests._fault_proxy.set_rules([...])`` and reads what happened with ``report()``. A
    separate server and namespace, so faults never reach tests using `gcs_emulator`.
    """
    yield from _running_emulator(tmp_path_factory.mktemp("gcs_fault_emulator"), faults=True)


def _running_emulator(directory, faults: bool = False):
    """Starts the emulator (skipping, or failing under CI, if it cannot), yields, stops."""
    try:
        emulator = _gcs_emulator.start(directory, faults=faults)
    except _gcs_emulator.EmulatorUnavailable as err:
        _gcs_emulator.skip_or_fail(str(err))
    try:
        yield emulator
    finally:
        emulator.stop()


# ------------------------------------------------------------- the fast subset: in-process
# `pytest -m "not slow"` is the subset a developer runs while thinking, and a Python
# process costs seconds (TensorFlow's import) before it does anything. So a test that
# starts one (directly, through a helper of its module or a fixture) is marked slow here,
# where no test file can forget it; in-process tests over ~5 s carry the mark themselves.

_STARTS_A_PROCESS = re.compile(
    r"\b(run_process|start_process|run_python|run_json|run_module_json|subprocess_json"
    r"|gcs_emulator|gcs_fault_emulator|NotebookClient|_shared_result"
    r"|subprocess\.(run|Popen|call|check_call|check_output))\b")


def _starts_a_process(obj: object, seen: set[int],
                      pattern: re.Pattern = _STARTS_A_PROCESS) -> bool:
    """Whether `obj` (a test, fixture or helper in tests/) starts a process (its source
    matches `pattern`), following the functions and classes of tests/ modules it names."""
    if id(obj) in seen:
        return False
    seen.add(id(obj))
    source, helpers = _source_and_helpers(obj)
    return bool(pattern.search(source)) or any(
        _starts_a_process(helper, seen, pattern) for helper in helpers)


@functools.cache
def _source_and_helpers(obj: object) -> tuple[str, tuple[object, ...]]:
    """`obj`'s source ("" if it has none) and the functions and classes of tests/ that
    it names in its module. Read once per session: each test reaches the same helpers,
    and `inspect.getsource` for every test that does took 6-8 s of each collection."""
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):
        return "", ()
    module = sys.modules.get(getattr(obj, "__module__", ""), None)
    if module is None:
        return source, ()
    named = (getattr(module, name, None)
             for name in sorted(set(re.findall(r"\b[A-Za-z_]\w*\b", source))))
    return source, tuple(helper for helper in named
                         if (inspect.isfunction(helper) or inspect.isclass(helper))
                         and _in_tests(helper))


def _in_tests(obj: object) -> bool:
    return getattr(obj, "__module__", "").split(".")[0] in ("tests", "conftest")


# In-process tests over ~1 s (quiet machine) in files being edited by others as this was
# written: slow from here until their own file carries `@pytest.mark.slow` (then delete
# the name here). A name that no longer exists marks nothing.
_SLOW_ELSEWHERE = {f"tests/test_estimator.py::test_{name}" for name in (
    "small_cnn_learns_digits_with_xla", "exact_evaluation_and_predict_on_one_replica",
    "export_saved_model_reloads_and_predicts_the_same",
    "regression_model_func_reports_exact_mse_and_mae",
    "sample_weights_scale_the_training_loss",
    "warm_start_loads_matching_variables_and_reports_the_rest",
    "evaluation_with_sample_weights_is_the_weighted_mean", "float16_applies_a_loss_scale",
    "close_flushes_the_logs_and_lets_go_of_the_input",
    "bfloat16_computes_in_bfloat16_with_float32_variables",
    "nan_loss_names_the_step_and_keeps_the_last_good_checkpoint",
    "work_dir_with_another_models_checkpoint_is_a_clear_error",
    "bad_training_input_is_reported_before_compiling")} | {
    # Over ~1 s of a quiet machine (5.5 s and more in a fast-subset run 5.5 times slower
    # than quiet, 2026-11-28): real models compiled, checkpoints written and read.
    # The in-process JAX checkpoint tests: the first of them imports JAX and orbax
    # into the TensorFlow process (seconds), whichever it is.
    "tests/test_jax_checkpoints.py::test_a_truncated_data_file_falls_back_to_the_older_step",
    "tests/test_jax_checkpoints.py::test_a_garbled_metadata_file_falls_back_to_the_older_step",
    "tests/test_jax_checkpoints.py::test_no_readable_step_and_another_models_step_are_named",
    "tests/test_work_dir.py::test_a_checkpoint_state_file_pointing_outside_the_work_dir_"
    "is_refused",
    "tests/test_work_dir.py::test_work_dir_export_dir_and_warm_start_accept_paths_and_"
    "expand_home",
    "tests/test_work_dir.py::test_a_work_dir_deleted_while_training_stops_it_by_name_and_"
    "is_not_recreated",
    "tests/test_async_checkpoints.py::test_close_and_a_restore_wait_for_the_write",
    "tests/test_async_checkpoints.py::test_a_background_checkpoint_holds_exactly_what_a_"
    "synchronous_one_holds",
    "tests/test_async_checkpoints.py::test_a_failed_background_write_is_raised_at_the_next_"
    "save_naming_the_last_good",
    "tests/test_async_checkpoints.py::test_training_goes_on_while_the_checkpoint_is_written",
    "tests/test_async_checkpoints.py::test_synchronous_checkpoints_are_an_option",
    "tests/test_tpu_estimator.py::test_ignored_arguments_warn_once_naming_themselves_and_"
    "int_features_export",
    "tests/test_tpu_estimator.py::test_eval_loss_is_exact_with_a_padded_last_batch",
    "tests/test_tpu_estimator.py::test_tf1_optimizers_make_the_updates_of_their_update_rules",
    "tests/test_tpu_estimator.py::test_bert_create_optimizer_as_written_makes_its_updates",
    "tests/test_tpu_estimator.py::test_layers_made_with_mode_dependent_arguments_get_them_"
    "per_mode",
    "tests/test_data_service.py::test_in_process_servers_divide_the_epochs_between_workers",
    "tests/test_export_dirs.py::test_the_estimators_export_keeps_the_users_files",
    "tests/test_export_dirs.py::test_the_estimators_exports_keep_the_users_files_and_serve",
    # A second round (the first test of a module that compiles pays for the module):
    "tests/test_input_check.py::test_the_advice_fits_the_pipeline",
    "tests/test_input_check.py::test_profile_steps_outside_the_call_are_errors_naming_the_"
    "steps",
    "tests/test_input_check.py::test_check_input_rejects_inputs_that_train_would_reject",
    *(f"tests/test_evaluation.py::test_{name}" for name in (
        "evaluate_sees_every_example_once_and_matches_numpy",
        "evaluate_weights_each_example_by_its_sample_weight",
        "evaluate_steps_counts_global_batches",
        "predict_returns_one_row_per_example_in_input_order")),
    "tests/test_data.py::test_augmented_epochs_are_cached_and_cycled",
    "tests/test_data.py::test_parser_names_the_dtype_and_shape_numpy_tfrecord_stored",
    "tests/test_internals.py::test_private_names_only_in_tf_internals",
    "tests/test_transform.py::test_cutout_blanks_one_clipped_rectangle_of_the_right_area",
    "tests/test_tpu_ready.py::test_every_image_model_is_tpu_ready",
    "tests/test_internals.py::test_tests_read_no_private_name_of_fenwicks",
    "tests/test_keras_models.py::test_model_func_builds_a_frozen_or_trainable_base",
    "tests/test_lr_finder.py::test_bad_model_functions",
    "tests/test_evaluation.py::test_bad_evaluation_data_is_an_error_with_counts",
    # Its module fixture trains an mnist_net for every test of the file.
    *(f"tests/test_bad_inputs.py::test_{name}" for name in (
        "evaluation_data_with_a_label_out_of_range_is_an_error_with_the_count",
        "evaluation_data_with_nan_features_is_an_error_with_the_count",
        "one_hot_labels_for_a_sparse_classifier_name_both_fixes",
        "an_input_fn_without_params_is_named",
        "float_labels_that_are_not_class_ids_are_refused_by_a_classifier")),
}


_SHARES_A_PROCESS = re.compile(r"\b_shared_result\b")
# The first test to ask for a shared process's results waits for all of its snippets.
SHARED_PROCESS_TIMEOUT = 1800


def _uses(item: pytest.Function, pattern: re.Pattern) -> bool:
    """Whether a test, or a fixture of tests/ it uses, matches `pattern` (see above)."""
    seen: set[int] = set()
    return _starts_a_process(item.function, seen, pattern) or any(
        pattern.fullmatch(name) or any(
            _in_tests(d.func) and _starts_a_process(d.func, seen, pattern) for d in defs)
        for name, defs in item._fixtureinfo.name2fixturedefs.items())


# Under pytest-xdist (``-n 3 --dist loadgroup``, .ci/run) a module's tests
# stay on one worker, so its module-scoped fixtures (a trained estimator, a dispatcher
# and its workers, the flagship runs) are built once; the tests reading `shared_snippet`
# processes form one group, so each device's shared process starts once.
SHARED_PROCESS_GROUP = "shared-processes"


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        shares = _uses(item, _SHARES_A_PROCESS)
        if not item.get_closest_marker("timeout") and shares:
            item.add_marker(pytest.mark.timeout(SHARED_PROCESS_TIMEOUT))
        item.add_marker(pytest.mark.xdist_group(
            SHARED_PROCESS_GROUP if shares else item.nodeid.split("::")[0]))
        if not item.get_closest_marker("slow") and (
                item.nodeid.split("[")[0] in _SLOW_ELSEWHERE
                or _uses(item, _STARTS_A_PROCESS)):
            item.add_marker(pytest.mark.slow)
    # The longest modules first, so that the workers finish together (a stable sort:
    # each module keeps its own order, which its fixtures' parameters depend on).
    items.sort(key=lambda item: _LONGEST_FIRST.get(item.nodeid.split("::")[0], 0))


# The modules over ~20 s of one worker, longest first (measured with -n 2), so that the
# workers finish together. The JAX engine's and the TPUEstimator front door's joined in
# session 7 (left out, they started last and ran on alone); the benchmarks' smoke runs
# (one worker, their child processes one after the other) in session 8. storage_faults, which mostly
# waits on deadlines, runs beside test_flagship's two busy processes. The engine contract,
# the engine switch and the TPUEstimator's gradient and batch-size tables joined in
# session 9: left out, they started late (in CI's run of 2026-11-28, the switch after 58%
# of the tests, the contract, whose set-up alone took 85-125 s, after 81%, the tables after
# 90%), the suite's last minutes on one worker; so did the last seven, each a few fresh
# interpreters or a demo run (test_zygote, alphabetically last, ended CI's runs).
_LONGEST_FIRST = {f"tests/{name}.py": -rank for rank, name in enumerate(reversed([
    "test_jax_engine", "test_benchmark_scripts", "test_flagship", "test_engine_contract",
    "test_storage_faults", "test_jax_gcs", "test_engine_switch", "test_jax_multihost",
    "test_faults", "test_tutorials", "test_callbacks", "test_tpu_estimator_gradients",
    "test_estimator", "test_tpu_estimator", "test_tpu_estimator_batch_sizes",
    "test_blocks_jax", "test_resume_position", "test_state", "test_work_dir",
    "test_data_service", "test_cross_engine", "test_jax_blocks", "test_jax_snapshot",
    "test_readme", "test_interrupts", "test_multiworker", "test_security",
    "test_porting", "test_async_checkpoints", "test_input_check", "test_data",
    "test_cli", "test_zygote", "test_demo", "test_accel", "test_legacy_work_dirs",
    "test_tpu_estimator_losses", "test_tpu_estimator_warm_start"]), start=1)}


def pytest_collection_finish(session):
    # Every test module is imported by now, and with it TensorFlow: what exists lives as
    # long as the process, so Python's full collections need not walk it again (as in
    # the fork server, tests/_zygote.py). Each costs ~0.25 s of CPU over TensorFlow's
    # ~460k objects, and in-process tests trigger hundreds (Python's own; until
    # 2026-11-26 also one per `evaluate`/`predict`/input change, in
    # `fenwicks.train.inputs.discard`).
    gc.collect()
    gc.freeze()


def pytest_configure(config):
    # pytest-xdist would otherwise hand out groups by their number of tests, largest first
    # (--loadscope-reorder, its default), undoing the order above.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.fixture
def accel_state():
    """Sets what `fw.accel` has chosen (and was asked) for one test, through its test hook
    `state_for_tests`, and restores it when the test ends: ``accel_state(acc)``,
    ``accel_state(request=fw.accel.Request('cpu', 2))``, ``accel_state()`` (nothing yet)."""
    import contextlib

    from fenwicks import accel

    with contextlib.ExitStack() as stack:
        def use(current=None, request=None):
            stack.enter_context(accel.state_for_tests(current, request))
            return current
        yield use


@pytest.fixture(autouse=True)
def _signal_handlers_left_as_found():
    """Fails the test that leaves SIGINT's or SIGTERM's handler changed in this process
    (and puts it back). Handlers are per process: one left behind (a library's
    ``SIG_IGN``, a watcher not exited) breaks the Ctrl-C tests that a worker runs later,
    which then hang in a compiled loop no signal stops."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    after = {signum: signal.getsignal(signum) for signum in before}
    changed = {signum: handler for signum, handler in after.items()
               if handler != before[signum]}
    for signum in changed:
        signal.signal(signum, before[signum])
    if changed:
        pytest.fail("the test left signal handlers changed: " + ", ".join(
            f"{signal.Signals(signum).name} {handler!r} (was {before[signum]!r})"
            for signum, handler in changed.items()), pytrace=False)
