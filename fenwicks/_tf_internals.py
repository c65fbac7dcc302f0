"""Every private TensorFlow, Keras and JAX name Fenwicks uses, in one place.

Each function here is one use of a name the installed library does not promise to keep,
with why no public API does the job. `tests/test_internals.py` checks each name on the
installed versions, so an upgrade that moves one fails there with the name and the
Fenwicks feature it breaks, not somewhere deep in a training run. Outside this module no
Fenwicks module imports ``tensorflow.python``, ``keras.src`` or ``jax._src``, or reads a
``_``-attribute of a library object (`tests/test_internals.py` greps for it).

TensorFlow and JAX are imported inside each function: `fenwicks.accel` uses the JAX ones
and imports no TensorFlow.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Iterator
from typing import Any

# ------------------------------------------------------------------ tf.data graphs


def dataset_graph(dataset: Any) -> Any:
    """The `GraphDef` of a `tf.data.Dataset`: what the tf.data service sends a worker.

    Why private: tf.data has no public "serialize this pipeline"; the service itself
    calls ``Dataset._as_serialized_graph`` (`data/experimental/ops/data_service_ops.py`).
    Used to find Python ops (service workers cannot run them) and to name the ops of a
    slow pipeline.

    Raises:
        tf.errors.OpError, ValueError, TypeError: the pipeline cannot be serialized.
    """
    import tensorflow as tf

    serialized = dataset._as_serialized_graph()  # noqa: SLF001 - see the docstring
    return tf.compat.v1.GraphDef.FromString(serialized.numpy())


# Dataset ops that map each batch to exactly one batch (`fenwicks.data.position`): a
# resumed pipeline behind them still starts at the requested batch. tf.data's public
# types are all `DatasetV2`; only the private subclass says which op made a dataset.
ONE_TO_ONE_DATASETS = frozenset({"_MapDataset", "_ParallelMapDataset", "_PrefetchDataset",
                                 "_OptionsDataset"})


def dataset_inputs(dataset: Any) -> list[Any]:
    """The datasets `dataset` reads from (none for a source).

    Why private: ``Dataset._inputs`` is tf.data's own graph walk (it serves
    ``Options``' propagation); no public API lists a dataset's inputs.
    """
    return list(dataset._inputs())  # noqa: SLF001 - see the docstring


def maps_batches_one_to_one(dataset: Any) -> bool:
    """Whether `dataset` is a map, prefetch or with_options over one input: its n-th
    element comes from its input's n-th. Why private: see `ONE_TO_ONE_DATASETS`."""
    return type(dataset).__name__ in ONE_TO_ONE_DATASETS


# ------------------------------------------------------------------ input iterators

# tf.data's and tf.distribute's input objects: where an iterator's resource handles are
# found. No public API hands out an iterator's handles or destroys it without blocking
# (`fenwicks.train.inputs.discard` says why it must not block).
INPUT_MODULES = ("tensorflow.python.data.", "tensorflow.python.distribute.input_lib",
                 "tensorflow.python.distribute.v1.input_lib")


def iterator_resources(roots: list[Any]) -> list[Any]:
    """The resource tensors reachable from `roots` through tf.data and tf.distribute
    input objects and plain containers: the iterators' handles (and their inputs')."""
    import tensorflow as tf

    found, seen, stack = [], set(), list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, tf.Tensor):
            if obj.dtype == tf.resource:
                found.append(obj)
        elif isinstance(obj, list | tuple | dict) or \
                type(obj).__module__.startswith(INPUT_MODULES):
            stack.extend(gc.get_referents(obj))
    return found


def never_destroy(handle: Any) -> None:
    """Keeps `handle` alive to the process's end: its destructor never runs.

    Why: at interpreter exit a resource destructor that runs while TensorFlow is torn
    down aborts the process, and no public API detaches a handle from its deleter. One
    extra reference leaks it (the process's memory goes with the process).
    """
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(handle))


# ------------------------------------------------------------------ checkpoints


def update_checkpoint_state(work_dir: str, latest: str, all_paths: list[str]) -> None:
    """Rewrites the ``checkpoint`` state file of `work_dir` with relative paths (after
    damaged TensorFlow checkpoints of an old work_dir were set aside).

    Why private: the public ``tf.compat.v1.train.update_checkpoint_state`` writes
    absolute paths (a work_dir copied elsewhere would point back at the old place);
    relative ones need ``update_checkpoint_state_internal`` (exported only as
    ``tf.__internal__.train.update_checkpoint_state``), what `tf.train.CheckpointManager`
    calls.
    """
    checkpoint_management_module().update_checkpoint_state_internal(
        work_dir, model_checkpoint_path=latest, all_model_checkpoint_paths=all_paths,
        save_relative_paths=True)


def checkpoint_management_module() -> Any:
    """TensorFlow's ``checkpoint_management`` module: `tf.train.CheckpointManager` names
    each checkpoint in the state file through its ``update_checkpoint_state_internal``."""
    from tensorflow.python.checkpoint import checkpoint_management

    return checkpoint_management


# ------------------------------------------------------------------ tf.data service


def worker_address(server: Any) -> str:
    """``host:port`` a `tf.data.experimental.service.WorkerServer` listens on.

    Why private: with ``port=0`` the port is chosen when the server starts, and only the
    private ``_address`` reports it (the `DispatchServer` has the public ``target``).
    """
    return server._address  # noqa: SLF001 - see the docstring


# ------------------------------------------------------------------ TF1 and Keras optimizers


def v1_optimizer_arg(optimizer: Any, name: str) -> Any:
    """A constructor argument of a `tf.compat.v1.train` optimizer: ``learning_rate``,
    ``momentum``, ``use_nesterov``, ``beta1``, ``beta2``, ``epsilon``; CrossShardOptimizer's
    ``reduction``.

    Why private: TF1 optimizers keep their arguments only as ``_<name>`` attributes (no
    ``get_config``); the TPUEstimator front door converts them to Keras optimizers.
    AdamOptimizer keeps its learning rate as ``_lr``, the others as ``_learning_rate``.
    """
    if name == "learning_rate" and not hasattr(optimizer, "_learning_rate"):
        return optimizer._lr  # noqa: SLF001 - see the docstring
    return getattr(optimizer, "_" + name)


def unwrap_cross_shard(optimizer: Any) -> Any:
    """The optimizer inside a ``tf.compat.v1.tpu.CrossShardOptimizer`` (or `optimizer`).

    Why private: the wrapper keeps it only as ``_opt``.
    """
    while "CrossShard" in type(optimizer).__name__ and hasattr(optimizer, "_opt"):
        optimizer = optimizer._opt  # noqa: SLF001 - see the docstring
    return optimizer


@contextlib.contextmanager
def fresh_variable_scope_counts() -> Iterator[None]:
    """``tf.compat.v1.variable_scope(None, default_name='bert')`` names its scope 'bert',
    then 'bert_1', ... per graph; a TPUEstimator model_fn built each mode in a new graph,
    so every call starts the count again here (the second trace of one tf.function would
    otherwise see 'bert_1').

    Why private: the counts live only in TensorFlow's private `_VariableScopeStore`.
    """
    from tensorflow.python.ops import variable_scope

    store = variable_scope.get_variable_scope_store()
    saved = dict(store.variable_scopes_count)
    store.variable_scopes_count.clear()
    try:
        yield
    finally:
        store.variable_scopes_count.clear()
        store.variable_scopes_count.update(saved)


@contextlib.contextmanager
def keras_losses_per_replica() -> Iterator[None]:
    """Keras loss objects give their own batch's mean, not divided by the replica count.

    Why private: Keras 3's ``Loss.__call__`` divides its value by ``num_replicas_in_sync``
    under ``tf.distribute`` (``keras.src.losses.loss.scale_loss_for_distribution``, for
    Keras's own trainer, which sums the replicas' losses) and has no switch. A TPUEstimator
    model_fn's loss is its replica's batch mean, as ``tf.compat.v1.losses``' is; the
    front door restores the division when the model_fn returns.
    """
    from keras.src.losses import loss as module

    original = module.scale_loss_for_distribution
    module.scale_loss_for_distribution = lambda value: value
    try:
        yield
    finally:
        module.scale_loss_for_distribution = original


def v1_api_modules() -> list[Any]:
    """Every module object a program may hold as ``tf.compat.v1`` (each once).

    Why private: ``import tensorflow.compat.v1 as tf`` (what every TF1 program writes)
    loads a second module object, ``tensorflow.compat.v1``, beside the one
    ``tf.compat.v1`` gave before, ``tensorflow._api.v2.compat.v1``, and rebinds the
    attribute: a program (or a test) that kept the first holds another object. They
    share their submodules (``train``, ``losses``, ...), not their own attributes
    (``trainable_variables``, ``get_variable``, ``gradients``, ``layers``), which the
    TPUEstimator front door replaces in a model_fn on each.
    """
    import sys

    import tensorflow as tf

    found = [tf.compat.v1] + [sys.modules.get(name) for name in (
        "tensorflow.compat.v1", "tensorflow._api.v2.compat.v1")]
    unique: dict[int, Any] = {}
    for module in found:
        if module is not None:
            unique.setdefault(id(module), module)
    return list(unique.values())


def keras_base_optimizer() -> type:
    """Keras 3's root optimizer class, where the TPUEstimator replay patches ``__new__``
    (as it does at `keras.layers.Layer` and `keras.metrics.Metric`).

    Why private: Keras exports only its backend's subclass, ``keras.optimizers.Optimizer``.
    """
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    return BaseOptimizer


# ------------------------------------------------------------------ JAX


def jax_backends_initialized() -> bool:
    """Whether JAX in this process has started its backends (devices are claimed).

    Why private: ``jax.extend.backend.backends()`` starts them; only ``xla_bridge`` can
    ask without doing so.
    """
    from jax._src import xla_bridge

    return bool(xla_bridge.backends_are_initialized())


def jax_initialized_platforms() -> set[str]:
    """The platforms ('cpu', 'tpu'...) JAX has started, or none if it has started none
    (never starts one). Why private: see `jax_backends_initialized`."""
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        return set()
    return set(xla_bridge.backends())


def jax_backend_errors() -> dict[str, str]:
    """JAX's own message per platform it tried and could not start ('tpu': ...).

    Why private: JAX logs these once and keeps them only in ``xla_bridge._backend_errors``;
    the public error names the last platform only.
    """
    from jax._src import xla_bridge

    return dict(getattr(xla_bridge, "_backend_errors", {}) or {})


def keras_global_seed_generator(create: bool = False) -> Any:
    """Keras's global ``SeedGenerator`` (the one ``keras.random`` calls without a seed
    draw from), or None if none was made and not `create`.

    Why private: Keras keeps it in ``global_state`` and makes it in
    ``seed_generator.global_seed_generator``; no public call returns it.
    """
    if create:
        from keras.src.random import seed_generator

        return seed_generator.global_seed_generator()
    from keras.src.backend.common import global_state

    return global_state.get_global_attribute("global_seed_generator")


def call_before_thread_pools_shut_down(fn: Any) -> None:
    """Calls `fn` at interpreter exit, before ``concurrent.futures`` refuses new work.

    Why private: orbax writes through thread pools, and ``concurrent.futures`` stops them
    from ``threading._register_atexit`` hooks, which run before non-daemon threads are
    joined and long before ``atexit``'s: a checkpoint write still running at exit then
    fails with "cannot schedule new futures after interpreter shutdown". Only a hook
    registered the same way (later, so it runs first) lets the write finish.
    """
    import threading

    threading._register_atexit(fn)
def keras_learning_rate_setting(optimizer: Any) -> Any:
    """A Keras optimizer's learning rate as given: a float variable or a schedule.

    Keras's public ``optimizer.learning_rate`` evaluates a schedule at the optimizer's own
    ``iterations``; an engine that keeps the step itself (the reference engine) needs the
    schedule, to evaluate it at the run's global step.
    """
    return optimizer._learning_rate


def keras_own_losses(layer: Any) -> list[Any]:
    """The losses a Keras layer (and its sublayers) added in their calls (``add_loss``,
    activity regularisers), without its weights' regularisers.

    Why private: Keras 3's public ``layer.losses`` mixes both, and the TPUEstimator front
    door hands the weights' regularisers to a model_fn separately, per variable (TF1's
    ``REGULARIZATION_LOSSES`` collection); ``_get_own_losses`` and ``_flatten_layers``
    (keras/src/layers/layer.py) are the two halves ``losses`` is made of.
    """
    found = []
    for sublayer in layer._flatten_layers(include_self=True):
        found += sublayer._get_own_losses()
    return found
