"""The Engine interface: what the shared code (estimator, controller, actions, callbacks,
history, save policy, lock, preemption, the LR finder, `check_input`) asks of an engine,
and which engine runs.

Two engines implement it side by side, neither importing the other:
`fenwicks.train.tf` (``tf.distribute``, ``tf.function`` loops) and `fenwicks.train.jax`
(``jax.sharding``, ``jax.jit`` steps). Shared code asks the engine; it never branches on
its name. Both write one checkpoint format, `fenwicks.train.run_format` (Keras's state
tree as NumPy arrays plus the run record, through orbax): an engine's `RunState` only
gathers its variables to host arrays and scatters them back (``snapshot``, ``to_host``,
``scatter``, ``set_counters``), so a run continues on either engine.

=======================  ===================================  ===================================
role                     TensorFlow engine (`train/tf/`)      JAX engine (`train/jax/`)
=======================  ===================================  ===================================
gather, scatter          `state.TFRunState`                   `state.JaxRunState`
old checkpoints (read)   `checkpoints` (``ckpt-N``)           `checkpoints` (``orbax/N``)
input manager            `inputs.TFInputManager`              `inputs.JaxInputManager`
trainer                  `trainer.Trainer` (`loops`)          `trainer.JaxTrainer` (`steps`)
evaluator                `evaluation.TFEvaluator`             `evaluation.JaxEvaluator`
exporter                 `export` (tf.saved_model)            `export` (jax2tf)
devices, distribution    `devices` (the strategy it holds)    `devices` (a mesh, no strategy)
replicas, processes      the strategy's, the cluster's        ``jax.device_count``, processes
stop flag                a variable following the watcher     the watcher's host bool
XLA device rule          none on logical CPUs                 none
label check (outputs,    eager, under the strategy            ``jax.eval_shape``
  loss)
LR finder's batches      distributed iterator                 this process's NumPy batches
`check_input`'s reader   `TFInputManager.read_steps`          `JaxInputManager.read_steps`
`profile_steps`          TensorFlow's profiler                ``jax.profiler``
`check_tpu_ready`        `tpu_steps` (XLA, as TPUStrategy)    `tpu_steps` (lowered for 'tpu')
TPUEstimator `model_fn`  `_model_fn` (TF1 graph in Keras)     refused in one sentence
=======================  ===================================  ===================================

The engine is Keras's backend (Keras fixes it when first imported: ``KERAS_BACKEND``,
which `fw.accel`'s engine selection sets, `fenwicks._engine`). A third engine is one new
folder implementing `Engine` (with, for an engine of its own Keras backend, its device
detector and backend facts) and a checkpoint reader, plus its one entry in
`fenwicks._engine.REGISTRY`. The reference engine (`fenwicks.train.reference`: a linear
model trained by NumPy gradient steps, for the tests of the shared code) is such an
entry: it runs under whichever backend Keras has, so it is never chosen by the backend,
only by name (`use`).

Every count the shared code uses comes from the engine: `get_tpu_estimator` asks
`Engine.num_replicas`, `num_processes` and `precision` once and keeps the answers in the
`EstimatorConfig`, which the input params, exact evaluation, out-of-memory halving,
`check_input`, `check_tpu_ready` and the TPUEstimator read; `find_lr` asks the engine too.

Examples:
    >>> engine = fw.train.engines.current()
    >>> engine.name   # 'jax' under FENWICKS_ENGINE=jax
    'tf'
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import keras

from fenwicks import _engine, accel

if TYPE_CHECKING:
    from fenwicks.train.evaluation import Evaluator
    from fenwicks.train.inputs import InputManager
    from fenwicks.train.model_func import ModelSpec
    from fenwicks.train.options import EstimatorConfig
    from fenwicks.train.run_state import RunState
    from fenwicks.train.runner import Trainer

# Every engine, one entry each (`fenwicks._engine.EngineEntry`).
REGISTRY = _engine.REGISTRY
_chosen: list[str] = []  # engines chosen by name (`use`), innermost last


class Profiler(Protocol):
    """The engine's profiler, for `train(profile_steps=...)` (`profiling.ProfileWindow`)."""

    # What `start` and `stop` raise when the profiler cannot (training goes on).
    errors: tuple[type[BaseException], ...]

    def start(self, logdir: str) -> None: ...

    def stop(self) -> None: ...


class Engine(Protocol):
    """One engine's roles (the table above). Classes are the role's type; the rest are
    plain functions (static methods of the engine's class)."""

    name: str  # 'tf', 'jax' or 'reference': its `REGISTRY` entry, its checkpoints' format
    RunState: type[RunState]
    InputManager: type[InputManager]
    Evaluator: type[Evaluator]
    profiler: Profiler
    # The errors `loss` raises for labels that do not fit the model's outputs.
    label_errors: tuple[type[BaseException], ...]

    def num_replicas(self, acc: accel.Accelerator) -> int:
        """Replicas sharing each global batch on this engine, over every process."""

    def num_processes(self, acc: accel.Accelerator) -> int:
        """Processes (hosts) of the run, each feeding its own replicas."""

    def precision(self, acc: accel.Accelerator) -> str:
        """What ``precision='auto'`` means on this engine's device."""

    def jit_compile_refusal(self, acc: accel.Accelerator) -> str | None:
        """Why ``jit_compile=True`` cannot run on `acc` here ('on 8 logical CPU replicas
        (...)'), or None."""

    def trainer(self, config: EstimatorConfig, state: RunState, watcher: Any) -> Trainer:
        """The compiled inner loop over `state`, stopping when `watcher` asks
        (`preemption.PreemptionWatcher`: its host `flag`, or a variable it `follow`s)."""

    def build(self, model_func: Callable, params: dict, precision: str,
              features_spec: Any) -> tuple[ModelSpec, Any]:
        """A fresh model and optimizer where this engine's steps use them (`find_lr`)."""

    def model_outputs(self, spec: ModelSpec, features: Any) -> Any:
        """The model's outputs for a few examples (shapes at least), float32 where
        floating, without changing the model's state: the label check's first half."""

    def loss(self, spec: ModelSpec, labels: Any, outputs: Any) -> None:
        """The loss of `outputs` against `labels` as this engine's steps compute it;
        raises one of `label_errors` when the labels do not fit."""

    def export_saved_model(self, spec: ModelSpec, features_spec: Any,
                           export_dir: str) -> str:
        """Writes a SavedModel serving `spec`'s predictions into (empty) `export_dir`."""

    def sweep_batches(self, input_fn: Callable, params: Callable[[Any], dict],
                      num_steps: int) -> tuple[Any, Callable[[], None], Any]:
        """`find_lr`'s batches of `num_steps` steps: ``(what its trainer reads, a call
        that lets go of it, the per-replica element spec)``; ``params(input_context)``
        gives the input_fn's params."""

    def sweep_trainer(self, spec: ModelSpec, optimizer: Any, batch_size: int) -> Trainer:
        """`find_lr`'s trainer: the estimator's loop, one step per call, no work_dir."""

    def build_for_tpu_check(self, model_func: Callable, params: dict, precision: str,
                            features_spec: Any) -> tuple[ModelSpec, Any]:
        """A fresh model and optimizer for `check_tpu_ready` (work_dir untouched)."""

    def check_tpu_step(self, mode: str, spec: ModelSpec, optimizer: Any, batch: Any,
                       global_batch: int, replicas: int) -> None:
        """Lowers the engine's `mode` step for `batch` as a TPU of `replicas` replicas
        would compile it; raises `fw.train.NotTPUReadyError` naming what fails."""

    def tf1_model_fn_refusal(self) -> str | None:
        """Why a TensorFlow 1 ``model_fn`` cannot run here (one sentence), or None."""


def current() -> Engine:
    """The engine of Keras's backend, for estimators made now (or the one `use` chose).

    Raises:
        ValueError: Keras runs on a backend no engine implements.
    """
    if _chosen:
        return importlib.import_module(REGISTRY[_chosen[-1]].module).ENGINE
    backend = keras.backend.backend()
    entry = _engine.entry_for_backend(backend)
    if entry is None:
        raise ValueError(f"Keras runs on {backend!r}; Fenwicks' engines run on "
                         f"{sorted(_engine.KERAS_BACKEND.values())}: set KERAS_BACKEND (or "
                         "FENWICKS_ENGINE) before importing Keras")
    return importlib.import_module(entry.module).ENGINE


@contextlib.contextmanager
def use(name: str) -> Iterator[Engine]:
    """Estimators (and `find_lr`, `check_input`, ...) made inside run on engine `name`.

    For an engine that runs under any Keras backend, the reference engine
    (`fenwicks.train.reference`); the tf and jax engines are Keras's backend, which is
    fixed when Keras is imported, so only the running one can be used.

    Raises:
        ValueError: `name` is no engine, or an engine of another Keras backend.

    Examples:
        >>> import tempfile
        >>> from fenwicks.train.reference.model import linear_model_func
        >>> X = np.random.rand(32, 3).astype('float32')
        >>> y = X @ np.array([[1.0], [2.0], [3.0]], 'float32')
        >>> with fw.train.engines.use("reference") as engine:
        ...     est = fw.train.get_tpu_estimator(4, linear_model_func(3), tempfile.mkdtemp(),
        ...                                      trn_bs=8, verbose=False)
        ...     est.train(lambda params: fw.data.numpy_ds(X, y, params['batch_size']),
        ...               steps=4).global_step
        4
        >>> engine.name, fw.train.engines.current().name
        ('reference', 'tf')
    """
    if name not in REGISTRY:
        raise ValueError(f"engine={name!r} is not an engine Fenwicks has; the engines are "
                         f"{sorted(REGISTRY)}")
    backend = REGISTRY[name].keras_backend
    if backend is not None and backend != keras.backend.backend():
        raise ValueError(f"engine={name!r} runs Keras on {backend!r}, and this process's "
                         f"Keras runs on {keras.backend.backend()!r} (fixed when Keras was "
                         f"imported): start a new process with FENWICKS_ENGINE={name}")
    _chosen.append(name)
    try:
        yield importlib.import_module(REGISTRY[name].module).ENGINE
    finally:
        _chosen.pop()
