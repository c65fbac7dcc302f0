"""Private library names live in `fenwicks._tf_internals` alone, and still exist.

Two kinds of check:

- A scan of every Fenwicks module (ast, not regexes): outside ``_tf_internals.py`` no
  ``tensorflow.python``/``keras.src``/``jax._src`` name, no ``_``-attribute of another
  object, no import of another module's private name. A module's own private names
  (``self._x``, ``cls._x``) and the package's private modules (``fenwicks._deadline``) are
  allowed: the underscore there means "private to Fenwicks".
- One test per private name `_tf_internals` uses, on the installed TensorFlow/JAX, each
  failing with the name and the Fenwicks feature that breaks without it.
"""

from __future__ import annotations

import ast
import gc
import pathlib
import weakref

import numpy as np
import pytest
import tensorflow as tf

from fenwicks import _tf_internals
from tests.conftest import run_json

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "fenwicks"
INTERNALS = PACKAGE / "_tf_internals.py"
PRIVATE_MODULES = ("tensorflow.python", "keras.src", "jax._src")
# Underscored names that are public, documented API: os._exit, sys._getframe, and
# namedtuple's _replace, _asdict, _fields, _make.
PUBLIC_UNDERSCORED = {"_exit", "_replace", "_asdict", "_fields", "_make", "_getframe"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _fenwicks_module(dotted: str) -> bool:
    """Whether `dotted` (``fenwicks.data._listen``) names a module of the package."""
    parts = dotted.split(".")
    if parts[0] != "fenwicks":
        return False
    path = PACKAGE.joinpath(*parts[1:])
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _module_aliases(tree: ast.AST, module: str) -> set[str]:
    """Local names bound to a Fenwicks module (``from fenwicks import _deadline``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if _fenwicks_module(f"{node.module}.{alias.name}"):
                    names.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("fenwicks"):
                    names.add(alias.asname or alias.name.split(".")[0])
    return names


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def private_uses(path: pathlib.Path) -> list[str]:
    """``file:line: what`` for each private library name or cross-module private name."""
    source = path.read_text()
    tree = ast.parse(source)
    where = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE) else path.name
    found = []
    for number, line in enumerate(source.splitlines(), 1):
        for module in PRIVATE_MODULES:
            if module in line:
                found.append(f"{where}:{number}: names {module}")
    modules = _module_aliases(tree, path.stem)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                "fenwicks"):
            for alias in node.names:
                if _private(alias.name) and not _fenwicks_module(
                        f"{node.module}.{alias.name}"):
                    found.append(f"{where}:{node.lineno}: imports {node.module}.{alias.name}")
        elif isinstance(node, ast.Attribute) and _private(node.attr) \
                and node.attr not in PUBLIC_UNDERSCORED:
            owner = _dotted(node.value)
            if owner in ("self", "cls"):
                continue
            if owner is not None and (owner in modules or owner.startswith("fenwicks")) \
                    and _fenwicks_module(_resolve(owner, tree) + "." + node.attr):
                continue  # a private module of the package: fenwicks._deadline
            found.append(f"{where}:{node.lineno}: {owner or '(expr)'}.{node.attr}")
        elif isinstance(node, ast.Call) and _reflective(node.func) and len(node.args) > 1 \
                and _dotted(node.args[0]) not in ("self", "cls") \
                and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _private(node.args[1].value):
            found.append(f"{where}:{node.lineno}: {_dotted(node.func)}(..., "
                         f"{node.args[1].value!r})")
    return found


def _reflective(func: ast.AST) -> bool:
    """``getattr``/``setattr``/``hasattr``, or a ``setattr``/``delattr`` method: pytest's
    ``monkeypatch.setattr(module, '_name', ...)`` reaches a private name as surely."""
    if isinstance(func, ast.Name):
        return func.id in ("getattr", "setattr", "hasattr")
    return isinstance(func, ast.Attribute) and func.attr in ("setattr", "delattr")


def _resolve(owner: str, tree: ast.AST) -> str:
    """The dotted module path a local name stands for (``_deadline`` -> fenwicks._deadline)."""
    first, _, rest = owner.partition(".")
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if (alias.asname or alias.name) == first:
                    return ".".join(filter(None, [node.module, alias.name, rest]))
    return owner


def test_private_names_only_in_tf_internals():
    found = [use for path in sorted(PACKAGE.rglob("*.py")) if path != INTERNALS
             for use in private_uses(path)]
    assert found == [], ("private names outside fenwicks/_tf_internals.py (move a library "
                         "internal there with why no public API does it; give a Fenwicks "
                         "name a public spelling):\n" + "\n".join(found))


def test_the_scan_finds_each_kind(tmp_path):
    """The scan is not vacuous: it reports each kind of private use."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from tensorflow.python.util import nest\n"
        "from fenwicks.train.tf.export import _serving_outputs\n"
        "from fenwicks import _deadline\n"
        "def f(est, server):\n"
        "    _deadline.run_bounded\n"      # a private module's public name: allowed
        "    self._x, cls._y\n"             # an object's own privates: allowed
        "    server._stop()\n"
        "    monkeypatch.setattr(_deadline, '_running', [])\n"
        "    return est._state._model_func, getattr(server, '_address')\n")
    kinds = sorted(use.split(": ", 1)[1] for use in private_uses(probe))
    assert kinds == sorted(["names tensorflow.python",
                     "imports fenwicks.train.tf.export._serving_outputs",
                     "server._stop", "est._state", "est._state._model_func",
                     "getattr(..., '_address')",
                     "monkeypatch.setattr(..., '_running')"]), kinds


# What tests may still read privately, each with why: none of it is Fenwicks'. Tests reach
# Fenwicks' own state through public names or documented hooks (`Estimator.parts`,
# `reset_for_tests`), and TensorFlow's through `_tf_internals`' hooks.
TEST_EXCEPTIONS = {
    ("_zygote.py", "threading._shutdown"): "a forked test process ends as the interpreter "
                                           "would: joins non-daemon threads",
    ("_zygote.py", "atexit._run_exitfuncs"): "... and runs the atexit hooks",
    ("conftest.py", "item._fixtureinfo"): "pytest: which fixtures a test uses (slow marker)",
    ("gcs_emulator.py", "server._decode_raw_data"): "the GCS emulator package's internals, "
                                                   "patched to accept gcsfs' uploads",
    ("gcs_emulator.py", "server._read_data"): "(same)",
    ("gcs_emulator.py", "server._read_raw_data"): "(same)",
    ("gcs_emulator.py", "objects._media_upload"): "(same)",
    ("gcs_emulator.py", "objects._resumable_incomplete"): "(same)",
    ("gcs_emulator.py", "request._data"): "(same)",
    ("_faults.py", "path._final_path"): "orbax's atomic rename: the step folder a commit "
        "makes visible, so a fault pauses that step's commit (orbax has no commit hook)",
    ("test_work_dir.py", "monkeypatch.setattr(..., '_write')"): "the run format's write, "
        "held until the test deletes the work_dir: the race of a background write with a "
        "deletion, which no public hook can time",
    ("test_work_dir.py", "run_format.RunCheckpointer._write"): "(same: the original write)",
    ("test_faults.py", "monkeypatch.setattr(..., '_candidate_tempdir_list')"):
        "Python's tempfile: where gettempdir() looks; the test fills every candidate, which "
        "no public knob expresses (TMPDIR only adds one)",
    ("_autograph_warmup.py", "names tensorflow.python"): "TensorFlow's AutoGraph cache: "
        "the fork server converts Fenwicks' step functions once per test session, as "
        "tf.function would in every child (no public API fills that cache; if it fails, "
        "each child converts for itself, as before)",
    ("_autograph_warmup.py", "api._convert_actual"): "(same)",
    ("test_tutorials.py", "(expr)._async_launch_kernel"): "jupyter_client's kernel "
        "manager: the method its docstring says to override to launch kernels differently "
        "(the tutorials' kernels forked from the fork server; others launched by it)",
    ("test_keras_models.py", "names keras.src"): "Keras' applications fetch weights through "
                                                "their module's file_utils: the offline test "
                                                "replaces it there",
}


def test_tests_read_no_private_name_of_fenwicks():
    tests = pathlib.Path(__file__).resolve().parent
    found = sorted({(path.name, use.split(": ", 1)[1])
                    for path in tests.glob("*.py") if path.name != "test_internals.py"
                    for use in private_uses(path)})
    unexpected = [f"{name}: {what}" for name, what in found
                  if (name, what) not in TEST_EXCEPTIONS]
    assert unexpected == [], ("tests reading private names (use a public name, a "
                              "documented hook, or behaviour):\n" + "\n".join(unexpected))


# ------------------------------------------------------------------ each internal in use


def _needs(what: str, name: str, feature: str) -> str:
    return (f"the installed TensorFlow ({tf.__version__}) changed {name}, which "
            f"fenwicks._tf_internals.{what} uses: {feature} no longer works; update "
            "fenwicks/_tf_internals.py")


def test_dataset_graph_lists_the_pipeline_ops():
    dataset = tf.data.Dataset.range(4).map(lambda x: x * 2)
    assert hasattr(dataset, "_as_serialized_graph"), _needs(
        "dataset_graph", "Dataset._as_serialized_graph",
        "the tf.data service's Python check and the input check's op names")
    ops = {node.op for node in _tf_internals.dataset_graph(dataset).node}
    assert {"RangeDataset", "MapDataset"} <= ops, ops


def test_dataset_inputs_and_one_to_one_classes():
    source = tf.data.Dataset.range(8)
    chain = {"map": source.map(lambda x: x), "parallel map": source.map(
        lambda x: x, num_parallel_calls=2), "prefetch": source.prefetch(1),
        "with_options": source.with_options(tf.data.Options())}
    for what, dataset in chain.items():
        assert _tf_internals.maps_batches_one_to_one(dataset), _needs(
            "ONE_TO_ONE_DATASETS", f"the class of Dataset.{what} "
            f"({type(dataset).__name__})", "resuming Fenwicks pipelines without .skip")
        inputs = _tf_internals.dataset_inputs(dataset)
        assert len(inputs) == 1 and inputs[0] is source, _needs(
            "dataset_inputs", "Dataset._inputs", "resuming Fenwicks pipelines")
    for dataset in (source.skip(1), source.shuffle(2), source.filter(lambda x: x > 0)):
        assert not _tf_internals.maps_batches_one_to_one(dataset), type(dataset).__name__
    assert _tf_internals.dataset_inputs(source) == []


def test_iterator_resources_found_and_kept():
    iterator = iter(tf.data.Dataset.range(3))
    assert type(iterator).__module__.startswith(_tf_internals.INPUT_MODULES), _needs(
        "INPUT_MODULES", f"the module of tf.data's iterator ({type(iterator).__module__})",
        "non-blocking iterator disposal (fenwicks.train.inputs.discard)")
    handles = _tf_internals.iterator_resources([iterator])
    assert handles and all(h.dtype == tf.resource for h in handles), _needs(
        "iterator_resources", "the iterator's resource handle", "fw.train.inputs.discard")


def test_never_destroy_keeps_an_object_past_its_last_reference():
    class Box:
        pass

    box = Box()
    alive = weakref.ref(box)
    _tf_internals.never_destroy(box)
    del box
    gc.collect()
    assert alive() is not None


def test_update_checkpoint_state_writes_relative_paths(tmp_path):
    work = str(tmp_path)
    (tmp_path / "ckpt-3.index").write_bytes(b"")  # what latest_checkpoint looks for
    _tf_internals.update_checkpoint_state(work, f"{work}/ckpt-3",
                                          [f"{work}/ckpt-1", f"{work}/ckpt-3"])
    text = (tmp_path / "checkpoint").read_text()
    assert text.splitlines() == ['model_checkpoint_path: "ckpt-3"',
                                 'all_model_checkpoint_paths: "ckpt-1"',
                                 'all_model_checkpoint_paths: "ckpt-3"'], text
    assert tf.train.latest_checkpoint(work) == f"{work}/ckpt-3"


def test_worker_address_names_the_chosen_port():
    service = tf.data.experimental.service
    dispatcher = service.DispatchServer(service.DispatcherConfig(port=0))
    worker = service.WorkerServer(service.WorkerConfig(
        dispatcher_address=dispatcher.target.split("://")[1], port=0))
    try:
        assert hasattr(worker, "_address"), _needs(
            "worker_address", "WorkerServer._address", "fw.data service workers on port 0")
        host, _, port = _tf_internals.worker_address(worker).rpartition(":")
        assert host == "localhost" and int(port) > 0, host
    finally:
        worker.stop()
        dispatcher.stop()


def test_jax_backend_state():
    pytest.importorskip("jax")
    from jax._src import xla_bridge

    for name in ("backends_are_initialized", "backends", "_backend_errors"):
        assert hasattr(xla_bridge, name), (
            f"the installed JAX changed jax._src.xla_bridge.{name}, which "
            "fenwicks._tf_internals uses to tell whether JAX holds the TPU and why a "
            "platform failed; update fenwicks/_tf_internals.py")
    assert isinstance(_tf_internals.jax_backends_initialized(), bool)
    assert isinstance(_tf_internals.jax_backend_errors(), dict)
    platforms = _tf_internals.jax_initialized_platforms()
    assert platforms == set() or "cpu" in platforms


def test_v1_optimizer_arguments_and_cross_shard_unwrap():
    v1 = tf.compat.v1.train
    momentum = v1.MomentumOptimizer(0.1, 0.9, use_nesterov=True)
    adam = v1.AdamOptimizer(0.01, beta1=0.8, beta2=0.95, epsilon=1e-6)
    seen = {name: _tf_internals.v1_optimizer_arg(opt, name) for opt, names in [
        (momentum, ("learning_rate", "momentum", "use_nesterov")),
        (adam, ("beta1", "beta2", "epsilon"))] for name in names}
    assert seen == {"learning_rate": 0.1, "momentum": 0.9, "use_nesterov": True,
                    "beta1": 0.8, "beta2": 0.95, "epsilon": 1e-6}, _needs(
        "v1_optimizer_arg", "tf.compat.v1 optimizers' _<argument> attributes",
        "TPUEstimator's conversion of TF1 optimizers")
    wrapped = tf.compat.v1.tpu.CrossShardOptimizer(momentum)
    assert _tf_internals.unwrap_cross_shard(wrapped) is momentum, _needs(
        "unwrap_cross_shard", "CrossShardOptimizer._opt", "TPUEstimator's optimizers")
    assert _tf_internals.unwrap_cross_shard(adam) is adam


def test_keras_base_optimizer_is_the_root_of_every_keras_optimizer():
    import keras

    base = _tf_internals.keras_base_optimizer()
    for optimizer in (keras.optimizers.SGD(), keras.optimizers.Adam(),
                      keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())):
        assert isinstance(optimizer, base), _needs(
            "keras_base_optimizer", "keras.src.optimizers.base_optimizer.BaseOptimizer",
            "TPUEstimator's replay of optimizers")


def test_keras_global_seed_generator_is_found_and_made():
    import keras

    made = _tf_internals.keras_global_seed_generator(create=True)
    assert made is _tf_internals.keras_global_seed_generator()
    before = keras.ops.convert_to_numpy(made.state.value).copy()
    keras.random.uniform((2,))  # draws from it, advancing its state
    assert not np.array_equal(before, keras.ops.convert_to_numpy(made.state.value))


def test_a_hook_before_thread_pools_shut_down_runs_before_they_refuse_work():
    out = run_json("""
import concurrent.futures, json, sys
from fenwicks import _tf_internals
pool = concurrent.futures.ThreadPoolExecutor(1)

def at_exit():  # still allowed to use a thread pool (orbax's writes do)
    sys.stdout.write(json.dumps(pool.submit(lambda: 41 + 1).result()) + "\\n")

_tf_internals.call_before_thread_pools_shut_down(at_exit)
""", fresh=True)
    assert out == 42
def test_keras_losses_per_replica_switches_keras_division_off():
    import keras
    from keras.src.losses import loss as module

    loss = keras.losses.MeanSquaredError()
    y_true, y_pred = tf.constant([[1.0], [3.0]]), tf.constant([[0.0], [0.0]])
    original = module.scale_loss_for_distribution
    module.scale_loss_for_distribution = lambda value: value * 8.0  # as 1/8 would be seen
    try:
        scaled = float(loss(y_true, y_pred))
        with _tf_internals.keras_losses_per_replica():
            plain = float(loss(y_true, y_pred))
        assert module.scale_loss_for_distribution(1.0) == 8.0  # restored after
    finally:
        module.scale_loss_for_distribution = original
    assert scaled == pytest.approx(40.0), _needs(
        "keras_losses_per_replica", "keras.src.losses.loss.scale_loss_for_distribution",
        "Keras loss objects in a TPUEstimator model_fn on several replicas")
    assert plain == pytest.approx(5.0)


def test_cross_shard_reduction_is_read():
    wrapped = tf.compat.v1.tpu.CrossShardOptimizer(tf.compat.v1.train.GradientDescentOptimizer(
        0.1), reduction=tf.compat.v1.losses.Reduction.SUM)
    assert _tf_internals.v1_optimizer_arg(wrapped, "reduction") == "weighted_sum", _needs(
        "v1_optimizer_arg", "CrossShardOptimizer._reduction",
        "TPUEstimator's compute_gradients under CrossShardOptimizer")


def test_v1_api_modules_are_every_object_a_program_may_hold():
    import importlib
    import sys

    before = tf.compat.v1
    imported = importlib.import_module("tensorflow.compat.v1")  # may rebind tf.compat.v1
    modules = _tf_internals.v1_api_modules()
    assert any(m is before for m in modules) and any(m is imported for m in modules), _needs(
        "v1_api_modules", "sys.modules['tensorflow._api.v2.compat.v1']",
        "TF1 names replaced in a TPUEstimator model_fn (trainable_variables, get_variable)")
    assert len({id(m) for m in modules}) == len(modules)
    assert all(m.train is imported.train for m in modules)  # shared submodules
    assert sys.modules["tensorflow.compat.v1"] is imported


def test_keras_own_losses_are_the_activity_losses_without_the_weights_regularisers():
    import keras

    inner = keras.layers.Dense(2, kernel_regularizer=keras.regularizers.l2(1.0),
                               activity_regularizer=keras.regularizers.l1(1.0))
    outer = keras.Sequential([inner])
    x = np.array([[1.0, -2.0]], np.float32)
    y = keras.ops.convert_to_numpy(outer(x))
    own = [float(loss) for loss in _tf_internals.keras_own_losses(outer)]
    # l1 of the sublayer's output, added in its call; not l2 of its kernel.
    assert own == pytest.approx([np.abs(y).sum()], rel=1e-6), _needs(
        "keras_own_losses", "keras.src.layers.layer.Layer._get_own_losses / "
        "_flatten_layers", "layer regularisers in a TPUEstimator model_fn "
        "(tf.losses.get_regularization_loss)")
    assert len(outer.losses) == 2  # Keras's public list mixes in the kernel's l2
