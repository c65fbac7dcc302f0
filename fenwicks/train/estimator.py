"""The estimator: train, evaluate, predict and export one model on the engine's devices.

    model_func = fw.train.get_clf_model_func(build_nn, opt_func)
    est = fw.train.get_tpu_estimator(steps_per_epoch, model_func, work_dir, trn_bs=512)
    est.train(train_input_func, max_steps=total_steps)   # resumes from work_dir
    est.evaluate(eval_input_func)                        # every example exactly once
    print(est.check_input(train_input_func))             # can the input keep up?

One `Estimator` owns one model, built lazily on first use (it needs the input's shapes)
where the engine's steps use it (the tf engine: in its strategy's scope) and under the
precision policy. All state that the next step
depends on lives in ``work_dir``'s checkpoints, so a new estimator there continues the run.

The estimator is a facade over small parts, as Orbit separates its controller from its
runners: `state.RunState` (model, optimizer, counters, checkpoints, lock),
`inputs.InputManager` (input functions to distributed iterators: probes, checks, resume
position), `controller.Controller` (the outer training loop and its actions),
`trainer.Trainer` (the compiled inner loop), `evaluation.Evaluator` (exact evaluation and
prediction). The estimator builds the model from the input's probe, between asking for
the probe and for the iterator, so the input side never builds anything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import keras
import numpy as np

from fenwicks import accel
from fenwicks._checks import boolean, one_of, path_arg, positive_int
from fenwicks.train import (
    building,
    engines,
    export_dirs,
    input_check,
    input_record,
    preemption,
    profiling,
)
from fenwicks.train import callbacks as callbacks_lib
from fenwicks.train.controller import Controller, Run, epochs_to
from fenwicks.train.evaluation import Evaluator
from fenwicks.train.history import History
from fenwicks.train.inputs import InputFn, InputManager
from fenwicks.train.model_func import ModelSpec
from fenwicks.train.options import EstimatorConfig
from fenwicks.train.predictions import class_probabilities
from fenwicks.train.run_state import NonFiniteLossError, RunState
from fenwicks.train.save_policy import Trigger

__all__ = ["Estimator", "EstimatorConfig", "History", "NonFiniteLossError",
           "get_tpu_estimator", "train_and_evaluate"]

logger = logging.getLogger("fenwicks")

ModelFunc = Callable[[dict], ModelSpec]
Callbacks = Sequence[keras.callbacks.Callback] | None


def get_tpu_estimator(steps_per_epoch: int | None = None, model_func: ModelFunc | None = None,
                      work_dir: str | None = None, ws_dir: str | None = None, ws_vars: Any = None,
                      trn_bs: int = 128, val_bs: int | None = None,
                      pred_bs: int | None = None, *, steps_per_loop: int | None = None,
                      precision: str = "auto", seed: int | None = None,
                      warm_start_from: str | None = None, jit_compile: bool | None = None,
                      save_every_secs: float | None = 600.0,
                      save_every_loops: int | None = None, keep_checkpoints: int = 3,
                      verbose: bool = True, async_checkpoints: bool = True) -> Estimator:
    """Creates an `Estimator` on the current accelerator (`fw.accel.current()`).

    Args:
        steps_per_epoch: training steps per pass over the data. None (an evaluate- or
            predict-only run, or training by ``steps=``): epochs are loops of
            `steps_per_loop` steps, or of 100 steps. Defaults to None.
        model_func: ``params -> ModelSpec``, e.g. from `get_clf_model_func`. Required.
        work_dir: checkpoints and TensorBoard logs: a local path (str or
            `pathlib.Path`, ``~`` expanded) or a ``gs://`` URL. An existing checkpoint
            there is resumed. The work_dir is the model: if its checkpoints are removed
            between calls, the next `train` starts from a fresh initialisation (and says
            so); if another run's replace them, those are restored.
        ws_dir: the original Fenwicks's positional warm-start directory: the same as
            ``warm_start_from``. Defaults to None.
        ws_vars: the original's list of variable patterns to warm-start; only None is
            accepted (``warm_start_from`` loads every variable whose name and shape
            match: see `Estimator.warm_start_report`). Defaults to None.
        trn_bs: global training batch size, divisible by the replica count.
            Defaults to 128.
        val_bs: global evaluation batch size. Defaults to `trn_bs`.
        pred_bs: global prediction batch size. Defaults to `val_bs`.
        steps_per_loop: steps run inside one compiled call. Defaults to
            `steps_per_epoch`.
        precision: ``'auto'`` (the accelerator's), ``'float32'``, ``'bfloat16'`` or
            ``'float16'`` (with loss scaling). Defaults to ``'auto'``.
        seed: seeds Python, NumPy, TensorFlow and Keras, and goes to input functions as
            ``params['seed']``. Defaults to None (not reproducible).
        warm_start_from: a checkpoint, or another run's work_dir, to initialise the model
            from when work_dir has no checkpoint. Variables are matched by checkpoint
            name and shape; `Estimator.warm_start_report` lists what loaded.
        jit_compile: XLA-compile each step. Defaults to None: True on TPU, else False.
        save_every_secs: also checkpoint during `train` this often. Defaults to 600.
        save_every_loops: also checkpoint every this many loops. Defaults to None.
        keep_checkpoints: how many recent checkpoints to keep. Defaults to 3.
        verbose: show a progress bar. Defaults to True.
        async_checkpoints: write checkpoints in a background thread while training
            goes on (`fenwicks.train.run_format.RunCheckpointer`); the next save, the end of
            `train`, a restore, SIGTERM, `close()` and interpreter exit wait for the
            write, and a failed write is raised there. False: each save blocks until
            its files are written (always so on several workers). Defaults to True.

    Returns:
        The `Estimator`.

    Raises:
        ValueError: for a batch size not divisible by the replicas, or a bad argument.

    Examples:
        >>> X, y = np.random.rand(64, 8, 8, 1).astype('float32'), np.arange(64) % 10
        >>> model_func = fw.train.get_clf_model_func(
        ...     lambda: fw.models.mnist_net(input_shape=(8, 8, 1), c=4),
        ...     fw.train.adam_optimizer(1e-3))
        >>> train_input_func = lambda params: fw.data.numpy_ds(X, y, params['batch_size'])
        >>> eval_input_func = lambda params: fw.data.numpy_ds(X, y, params['batch_size'],
        ...                                                   training=False)
        >>> est = fw.train.get_tpu_estimator(2, model_func, 'runs/demo', trn_bs=32,
        ...                                  val_bs=64, seed=1, verbose=False)
        >>> est.train(train_input_func, steps=2).global_step   # train returns the estimator
        2
        >>> fw.train.get_tpu_estimator(model_func=model_func, work_dir='runs/demo', val_bs=64,
        ...                            verbose=False).evaluate(eval_input_func)['global_step']
        2
    """
    warm_start_from = _warm_start_source(ws_dir, ws_vars, warm_start_from)
    if steps_per_epoch is None:  # no epochs asked for: they only mark logs and callbacks
        steps_per_epoch = 100 if steps_per_loop is None else steps_per_loop
    if work_dir is None:
        raise ValueError("work_dir is required: get_tpu_estimator(steps_per_epoch, "
                         "model_func, work_dir), or model_func=..., work_dir=...")
    if not callable(model_func):
        raise ValueError(f"model_func={model_func!r} must be callable params -> ModelSpec, "
                         "e.g. fw.train.get_clf_model_func(build_nn, opt_func)")
    work_dir = path_arg("work_dir", work_dir)
    if "://" not in work_dir and os.path.exists(work_dir) and not os.path.isdir(work_dir):
        raise ValueError(f"work_dir={work_dir!r} is a file, not a directory; give a "
                         "directory for checkpoints and logs (it is created if missing)")
    one_of("precision", precision, accel.PRECISIONS)
    acc, engine = accel.current(), engines.current()
    config = EstimatorConfig(
        steps_per_epoch=steps_per_epoch, work_dir=work_dir, train_batch_size=trn_bs,
        eval_batch_size=trn_bs if val_bs is None else val_bs,
        predict_batch_size=(trn_bs if val_bs is None else val_bs) if pred_bs is None
        else pred_bs,
        steps_per_loop=steps_per_epoch if steps_per_loop is None else steps_per_loop,
        precision=engine.precision(acc) if precision == "auto" else precision, seed=seed,
        warm_start_from=warm_start_from,
        jit_compile=_jit_compile(jit_compile, acc, engine.jit_compile_refusal(acc)),
        save_every_secs=save_every_secs, save_every_loops=save_every_loops,
        keep_checkpoints=keep_checkpoints, verbose=verbose,
        async_checkpoints=async_checkpoints, num_replicas=engine.num_replicas(acc),
        num_processes=engine.num_processes(acc))
    return Estimator(model_func, config, acc)


def _jit_compile(jit_compile: bool | None, acc: accel.Accelerator,
                 refusal: str | None) -> bool:
    """None means: on a TPU (which compiles everything anyway), else not; True where the
    engine cannot compile with XLA (`refusal`, `Engine.jit_compile_refusal`) is a warning
    and False."""
    if jit_compile is None:
        return acc.kind == "tpu"
    jit_compile = boolean("jit_compile", jit_compile)
    if jit_compile and refusal:
        logger.warning("fenwicks: jit_compile is ignored %s", refusal)
        return False
    return jit_compile


def _warm_start_source(ws_dir: Any, ws_vars: Any, warm_start_from: str | None) -> str | None:
    """The original's positional ``ws_dir, ws_vars`` as ``warm_start_from``."""
    if ws_dir is not None and not isinstance(ws_dir, (str, os.PathLike)):
        raise TypeError(f"ws_dir={ws_dir!r}: the 4th positional argument is the warm-start "
                        "directory; pass batch sizes by name, e.g. trn_bs=512")
    if ws_vars is not None:
        raise TypeError("ws_vars= is not supported: warm_start_from=<checkpoint or work_dir> "
                        "loads every variable whose name and shape match (listed in "
                        "est.warm_start_report); a pretrained Keras base from "
                        "fw.keras_models.get_model needs neither")
    if ws_dir is not None and warm_start_from is not None:
        raise TypeError(f"ws_dir={ws_dir!r} and warm_start_from={warm_start_from!r}: give "
                        "one (ws_dir is the original name of warm_start_from)")
    return os.fspath(ws_dir) if ws_dir is not None else warm_start_from


def _release(inputs: InputManager, state: RunState) -> None:
    """Releases what an estimator holds open; runs at `close()` or interpreter exit."""
    inputs.release()
    state.close()


class EstimatorParts(NamedTuple):
    """`Estimator.parts`: the engine's `RunState`, `InputManager` and `Evaluator`."""

    state: Any
    inputs: Any
    evaluator: Any


class Estimator:
    """Trains, evaluates, predicts and exports one model; see `get_tpu_estimator`.

    Use it as a context manager, or call `close()`, to flush and close the summary
    writers and let go of the live input iterator at once (background threads destroy
    it: TensorFlow's destructor can wait for seconds, see `fenwicks.train.inputs.discard`);
    otherwise that happens when the estimator is garbage-collected, or at interpreter
    exit (`weakref.finalize`), while the interpreter is still whole.

    Attributes:
        config: the validated `EstimatorConfig`.
        history: a `History` of this object's training and evaluations.
        warm_start_report: ``{'loaded': [...], 'not_loaded': [...]}`` after a warm start.

    Examples:
        >>> X, y = np.random.rand(64, 8, 8, 1).astype('float32'), np.arange(64) % 10
        >>> model_func = fw.train.get_clf_model_func(
        ...     lambda: fw.models.mnist_net(input_shape=(8, 8, 1), c=4),
        ...     fw.train.adam_optimizer(1e-3))
        >>> train_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'])
        >>> with fw.train.get_tpu_estimator(2, model_func, 'runs/demo', trn_bs=32,
        ...                                 verbose=False) as est:
        ...     est.train(train_fn, steps=2).global_step
        2
    """

    def __init__(self, model_func: ModelFunc, config: EstimatorConfig,
                 accelerator: accel.Accelerator) -> None:
        self.config = config
        self.history = History()
        self._model_func = model_func
        self._acc = accelerator
        # The engine's roles (`fenwicks.train.engines`); all else here is engine-neutral.
        self._engine = engines.current()
        self._state: RunState = self._engine.RunState(model_func, config, accelerator)
        self._inputs: InputManager = self._engine.InputManager(config, accelerator)
        # Evaluation input_fns whose labels were checked (weak: a new lambda may reuse an id).
        self._checked: weakref.WeakSet = weakref.WeakSet()
        self._evaluator: Evaluator = self._engine.Evaluator(config, accelerator, self._state,
                                                            self._inputs)
        self._controller: Controller | None = None
        self._last_train_loops = slice(0, 0)  # history.examples_per_sec of the last train
        # Not a method of self: the finalizer must not keep the estimator alive.
        self._finalizer = weakref.finalize(self, _release, self._inputs, self._state)

    def close(self) -> None:
        """Flushes and closes the summary writers and lets go of the input iterator
        (background threads destroy it, see `fenwicks.train.inputs.discard`)."""
        self._finalizer()

    def __enter__(self) -> Estimator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---------------------------------------------------------------- public state

    @property
    def model(self) -> keras.Model:
        """The Keras model (built on first use of the estimator)."""
        return self._state.spec.model

    @property
    def optimizer(self) -> Any:
        """The optimizer (a `LossScaleOptimizer` under float16)."""
        self._state.spec  # noqa: B018 - raises the "built on first use" error
        return self._state.optimizer

    @property
    def global_step(self) -> int:
        """Training steps taken so far, including those of runs resumed from work_dir."""
        return self._state.global_step

    @property
    def num_replicas(self) -> int:
        return self.config.num_replicas

    @property
    def model_func(self) -> ModelFunc:
        """The ``params -> ModelSpec`` function the estimator builds its model with."""
        return self._model_func

    @property
    def parts(self) -> EstimatorParts:
        """The run's parts, for tests and tools: state, inputs and evaluator.

        A documented test hook: the parts' own attributes are Fenwicks-internal and may
        change between releases; models, counters and results have public properties.

        Examples:
            >>> import tempfile
            >>> X, y = np.random.rand(10, 4).astype('float32'), np.arange(10) % 3
            >>> model_func = fw.train.get_clf_model_func(lambda: keras.Sequential(
            ...     [keras.Input((4,)), keras.layers.Dense(3, kernel_initializer='zeros')]),
            ...     fw.train.sgd_optimizer(0.1))
            >>> est = fw.train.get_tpu_estimator(2, model_func, tempfile.mkdtemp(), trn_bs=4,
            ...                                  val_bs=4, verbose=False)
            >>> type(est.parts.state).__name__, type(est.parts.evaluator).__name__
            ('TFRunState', 'TFEvaluator')
        """
        return EstimatorParts(self._state, self._inputs, self._evaluator)

    @property
    def warm_start_report(self) -> dict[str, list[str]] | None:
        return self._state.warm_start_report

    # ---------------------------------------------------------------- training

    @staticmethod
    def _check_steps(steps: int | None, max_steps: int | None) -> None:
        if steps is None and max_steps is None:
            raise ValueError("give train() steps=N (N more steps) or max_steps=M (stop at "
                             "global step M), e.g. steps=est.config.steps_per_epoch")
        if steps is not None and max_steps is not None:
            raise ValueError(f"give steps={steps} or max_steps={max_steps}, not both")
        positive_int("steps" if steps is not None else "max_steps",
                     steps if steps is not None else max_steps)

    def _reload_if_stale(self) -> None:
        if self._state.reload_if_stale():
            self._inputs.restart_training_input()

    def _follow_work_dir(self) -> None:
        """The work_dir is the model: pick up checkpoints that changed under us."""
        changed = self._state.catch_up()
        if changed == "reset":  # rebuilt on next use: nothing compiled for the old one
            self._controller = None
            self._evaluator.reset()
        if changed:
            self._inputs.restart_training_input()

    def _train_iterator(self, input_fn: InputFn) -> Any:
        """The training iterator of `input_fn` where the run's input stands; on a new one,
        its first batch is checked and the model built (restoring work_dir) first."""
        iterator = self._inputs.live_train_iterator(input_fn)
        if iterator is not None:
            return iterator
        probe = self._inputs.probe(input_fn, "train")
        self._state.build(probe.features_spec, probe.params)
        self._state.check_trainable()  # another engine's checkpoint read for evaluate only
        building.check_labels(self._engine, self._state.spec, probe.dataset)
        position = self._state.input_position
        input_record.check(self.config.work_dir, self.config.train_batch_size, position,
                           self._state.restored_record)
        return self._inputs.train_iterator(input_fn, position)

    def _build_for(self, input_fn: InputFn, mode: str) -> None:
        """Builds the model (on first use) from an evaluation or prediction input, and
        checks an evaluation input's labels once."""
        probe = self._inputs.probe(input_fn, mode)
        self._state.build(probe.features_spec,
                          self._inputs.params(mode, self.config.train_batch_size))
        building.check_same_features(self._state.features_spec, probe.features_spec, mode)
        if mode == "eval" and input_fn not in self._checked:
            building.check_labels(self._engine, self._state.spec, probe.dataset)
            with contextlib.suppress(TypeError):  # an object that cannot be weakly referenced
                self._checked.add(input_fn)

    def train(self, input_fn: InputFn, steps: int | None = None,
              max_steps: int | None = None, callbacks: Callbacks = None,
              profile_steps: tuple[int, int] | None = None) -> Estimator:
        """Trains until `steps` more steps, or until global step `max_steps`.

        `steps_per_loop` steps run in one compiled call; the last call is shortened so
        training stops exactly at the target (and loops end at epoch boundaries). A
        checkpoint is written at the end, every `save_every_secs` and every
        `save_every_loops` loops. Around each loop one ordered list of actions records
        `history`, TensorBoard scalars and the progress bar, calls the callbacks, stops
        on a non-finite loss, saves when due and ends epochs; the list is built, in
        order, by `fenwicks.train.controller.default_actions`.

        Args:
            input_fn: ``params -> tf.data.Dataset`` of (features, labels) batches of
                ``params['batch_size']`` (per replica) examples, static batch size,
                repeated. The input position belongs to the run: calling `train` again,
                with this function or a new one (a re-run notebook cell), continues
                where the data left off.
            steps: number of steps to run. Give this or `max_steps`.
            max_steps: global step to stop at; nothing happens if already reached.
            callbacks: `keras.callbacks.Callback` objects, called as `model.fit` calls
                them (see `fenwicks.train.callbacks`). Defaults to None.
            profile_steps: ``(a, b)``, global steps with ``0 <= a < b`` inside this call:
                the engine's profiler (TensorFlow's, or `jax.profiler` on the JAX
                engine) records the steps from global step a to b (loops
                are cut there) into ``<work_dir>/train/plugins/profile``, for
                TensorBoard's Profile tab and its input-pipeline analyzer (TensorBoard
                needs ``pip install tensorboard-plugin-profile`` to show it). Start after
                the first loop to leave compilation out. Defaults to None.

        Returns:
            self.

        Raises:
            ValueError: bad arguments, input or callbacks, before anything is compiled.
            NonFiniteLossError: the loss became NaN/inf; names the step. The last
                checkpoint is left as it was, and the estimator reloads it on next use.
            WorkDirLockedError: another process is training in work_dir.
            Preempted: SIGTERM arrived; the step in progress finished and was saved.
            Interrupted: Ctrl-C (a notebook's stop button) arrived; training stopped
                after the step in progress, which was saved if saving is quick (the
                message says). The estimator stays consistent: `train` again continues
                exactly. A second Ctrl-C stops at once, without saving.
            WorkDirNotWritableError: work_dir is read-only (one line naming it).
            CheckpointWriteError: a checkpoint could not be written (disk full, storage);
                the previous one is intact.

        Examples:
            >>> import tempfile
            >>> X, y = np.random.rand(10, 4).astype('float32'), np.arange(10) % 3
            >>> model_func = fw.train.get_clf_model_func(lambda: keras.Sequential(
            ...     [keras.Input((4,)), keras.layers.Dense(3, kernel_initializer='zeros')]),
            ...     fw.train.sgd_optimizer(0.1))
            >>> est = fw.train.get_tpu_estimator(2, model_func, tempfile.mkdtemp(), trn_bs=4,
            ...                                  val_bs=4, verbose=False)
            >>> est.train(lambda params: fw.data.numpy_ds(X, y, params['batch_size']),
            ...           max_steps=4,
            ...           callbacks=[keras.callbacks.CSVLogger('log.csv')]).global_step
            4
            >>> len(open('log.csv').read().splitlines())   # a header, then 2 epochs
            3

            ``est.train(train_fn, steps=300, profile_steps=(200, 220))`` also writes a
            profile of global steps 200 to 220 for TensorBoard.
        """
        with self._training(input_fn, steps, max_steps, callbacks, profile_steps) as run:
            if run is not None:
                run.train(run.target)
        return self

    @contextlib.contextmanager
    def _training(self, input_fn: InputFn, steps: int | None, max_steps: int | None,
                  callbacks: Callbacks,
                  profile_steps: tuple[int, int] | None = None) -> Iterator[Run | None]:
        """One `train` call, the work_dir locked: the controller's `Run` to the target,
        or None when the target is already reached."""
        self._check_steps(steps, max_steps)
        profile_steps = profiling.check_profile_steps(profile_steps)
        callbacks = callbacks_lib.check_supported(callbacks)
        self._reload_if_stale()
        with self._state.locked():
            self._follow_work_dir()  # another run trained here, or the dir was cleaned
            iterator = self._train_iterator(input_fn)  # builds, restoring the step
            step = self.global_step  # one read: each is an eager op
            target = step + steps if steps is not None else max_steps
            if step >= target:
                logger.info("fenwicks: already at step %d >= %d; not training", step, target)
                yield None
                return
            profiling.check_in_range(profile_steps, step, target)
            if self._controller is None:
                self._controller = Controller(self.config, self._state, self.history,
                                              self._engine)
            self._last_train_loops = slice(len(self.history.examples_per_sec), None)
            callbacks_lib.attach(callbacks, self, epochs_to(target, self.config.steps_per_epoch))
            with self._controller.run(iterator, target, callbacks, profile_steps) as run:
                yield run

    def check_input(self, input_fn: InputFn, num_batches: int = 100,
                    warmup_batches: int = 10) -> input_check.InputVerdict:
        """Can the input keep up? Times `input_fn` alone against the last `train` call.

        The input is read as training reads it (same ``params``, per-replica batch size
        and distributed dataset, on this host) for `num_batches` steps after
        `warmup_batches` untimed ones, and its examples/s are compared with those
        training consumed in the last `train` call (`History.examples_per_sec`, the
        median over its loops without the first, which includes compilation).
        Input-bound below 1.1x: when the input is the bottleneck, training runs at its
        speed. Nothing of the run changes (weights, step, input position).

        On a CPU the input measured alone has the cores to itself, which it shares with
        the training step during training: "close to input-bound" (below 1.5x) there may
        well be input-bound.

        Args:
            input_fn: the training input function, as given to `train`.
            num_batches: steps to time (one batch per replica each). Defaults to 100.
            warmup_batches: steps read first and not timed (at least one is: the timing
                loop compiles on it). Defaults to 10.

        Returns:
            An `fw.train.InputVerdict`; ``print`` it for the one line: input delivers X
            ex/s, training consumed Y ex/s, the verdict and the fixes that apply to this
            pipeline. Before any `train` call it gives the input's rate and no verdict.

        Raises:
            ValueError: bad arguments, or an input that fails `train`'s checks or runs out.

        Examples:
            >>> import tempfile
            >>> X, y = np.random.rand(10, 4).astype('float32'), np.arange(10) % 3
            >>> model_func = fw.train.get_clf_model_func(lambda: keras.Sequential(
            ...     [keras.Input((4,)), keras.layers.Dense(3, kernel_initializer='zeros')]),
            ...     fw.train.sgd_optimizer(0.1))
            >>> train_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'])
            >>> est = fw.train.get_tpu_estimator(2, model_func, tempfile.mkdtemp(), trn_bs=4,
            ...                                  val_bs=4, verbose=False)
            >>> est.train(train_fn, steps=4).global_step
            4
            >>> print(est.check_input(train_fn, num_batches=10))
            input delivers ... ex/s, training consumed ... ex/s (...x): ...
        """
        return input_check.check_input(
            input_fn, self.config, self._acc,
            self.history.examples_per_sec[self._last_train_loops], num_batches,
            warmup_batches)

    # ---------------------------------------------------------------- evaluate / predict

    @preemption.keeps_ctrl_c
    def evaluate(self, input_fn: InputFn, steps: int | None = None) -> dict[str, float]:
        """Loss and metrics over every example of `input_fn`, each counted exactly once.

        The last partial batch is padded to the static batch shape and masked out, for
        any `val_bs` and replica count. On a GPU out-of-memory error the batch is halved
        and the evaluation retried (with a warning).

        Args:
            input_fn: ``params -> tf.data.Dataset`` of (features, labels) batches of at
                most ``params['batch_size']`` examples; a final partial batch is fine.
                Not repeated.
            steps: evaluate only the first `steps` global batches. Defaults to all.

        Returns:
            ``{'loss', <each metric, e.g. 'accuracy'>, 'global_step', 'num_examples'}``.

        Raises:
            ValueError: the evaluation data has class labels out of range or NaN/inf
                features (counts named): its loss and metrics would be wrong.
            NonFiniteLossError: the loss is NaN/inf on valid data.

        A work_dir without a checkpoint gives a warning: the model was never trained. A
        read-only work_dir is fine (TensorBoard summaries are skipped with a warning).

        Examples:
            >>> import tempfile
            >>> X, y = np.random.rand(10, 4).astype('float32'), np.arange(10) % 3
            >>> model_func = fw.train.get_clf_model_func(lambda: keras.Sequential(
            ...     [keras.Input((4,)), keras.layers.Dense(3, kernel_initializer='zeros')]),
            ...     fw.train.sgd_optimizer(0.1))
            >>> est = fw.train.get_tpu_estimator(2, model_func, tempfile.mkdtemp(), trn_bs=4,
            ...                                  val_bs=4, verbose=False)
            >>> est.evaluate(lambda params: fw.data.numpy_ds(X, y, params['batch_size'],
            ...                                              training=False))
            {'loss': 1.0986..., 'accuracy': 0.4, 'global_step': 0, 'num_examples': 10}

            Untrained, the zero weights give each of the 3 classes 1/3: the loss is
            ln 3 = 1.0986 and the accuracy that of class 0 (4 of the 10 labels); the 10
            examples are counted once each, the last batch of 4 holding only 2.
        """
        if steps is not None:
            steps = positive_int("steps", steps)
        self._reload_if_stale()
        self._follow_work_dir()
        self._build_for(input_fn, "eval")
        result = self._evaluator.evaluate(input_fn, steps)
        self.history.evals.append(result)
        return result

    @preemption.keeps_ctrl_c
    def predict(self, input_fn: InputFn, as_dicts: bool = False) -> Any:
        """Per-example predictions: exactly one row per input example, in input order.

        Args:
            input_fn: ``params -> tf.data.Dataset`` of feature batches (or
                (features, labels) pairs, whose labels are ignored) of at most
                ``params['batch_size']`` examples.
            as_dicts: return one dict per example, ``{'y_pred': class id, 'y_prob':
                probabilities}``, as the original Fenwicks's (TPUEstimator's) predict
                yielded. Needs class probabilities ``[N, classes]``. Defaults to False.

        Returns:
            A NumPy array (or a dict of arrays, as `predict_fn` returns) with one row per
            example; class probabilities for `get_clf_model_func`, whose rows also answer
            ``row['y_pred']`` and ``row['y_prob']`` as the original's dicts did
            (`fenwicks.train.predictions`). With ``as_dicts``, a list of dicts.

        Raises:
            ValueError: on a multi-worker run (predict is single-host).

        A work_dir without a checkpoint gives a warning: the model was never trained.

        Examples:
            >>> import tempfile
            >>> X, y = np.random.rand(10, 4).astype('float32'), np.arange(10) % 3
            >>> model_func = fw.train.get_clf_model_func(lambda: keras.Sequential(
            ...     [keras.Input((4,)), keras.layers.Dense(3, kernel_initializer='zeros')]),
            ...     fw.train.sgd_optimizer(0.1))
            >>> est = fw.train.get_tpu_estimator(2, model_func, tempfile.mkdtemp(), trn_bs=4,
            ...                                  val_bs=4, verbose=False)
            >>> probs = est.predict(lambda params: fw.data.numpy_ds(X, None,
            ...                     params['batch_size'], training=False))
            >>> probs.shape, np.allclose(probs, 1 / 3)   # untrained: 1/3 each
            ((10, 3), True)
            >>> probs['y_pred'][:3]   # the class ids, as the original's dicts had them
            array([0, 0, 0])
        """
        self._reload_if_stale()
        self._follow_work_dir()
        self._evaluator.check_single_host()
        self._build_for(input_fn, "predict")
        predictions = self._evaluator.predict(input_fn)
        return _as_dicts(predictions) if as_dicts else class_probabilities(predictions)

    # ---------------------------------------------------------------- export, loops of loops

    def export_saved_model(self, export_dir_base: str) -> str:
        """Writes a SavedModel whose ``serving_default`` signature gives predictions.

        Each export is a new version folder ``<export_dir_base>/<version>`` (the Unix
        time, or one more than the newest version there), as TF Serving expects. It
        appears only when complete; nothing already in `export_dir_base` is replaced or
        deleted. `fw.train.latest_export` finds the newest.

        Args:
            export_dir_base: local directory (str or `pathlib.Path`) or gs:// URL.

        Returns:
            The new version folder; reload with ``tf.saved_model.load(path)`` and call
            ``.serve(features)`` or ``.signatures['serving_default'](x=features)``.

        Raises:
            ValueError: `export_dir_base` is a file or lies under one.
            fw.train.ExportError: the disk or storage failed.

        Examples:
            >>> import tempfile
            >>> X, y = np.random.rand(10, 4).astype('float32'), np.arange(10) % 3
            >>> model_func = fw.train.get_clf_model_func(lambda: keras.Sequential(
            ...     [keras.Input((4,)), keras.layers.Dense(3, kernel_initializer='zeros')]),
            ...     fw.train.sgd_optimizer(0.1))
            >>> train_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'])
            >>> est = fw.train.get_tpu_estimator(2, model_func, tempfile.mkdtemp(), trn_bs=4,
            ...                                  val_bs=4, verbose=False)
            >>> est.train(train_fn, steps=2).global_step
            2
            >>> export_dir_base = tempfile.mkdtemp()
            >>> path = est.export_saved_model(export_dir_base)
            >>> path == fw.train.latest_export(export_dir_base)   # <base>/<Unix time>
            True
            >>> served = tf.saved_model.load(path)   # keep it: its variables live with it
            >>> served.serve(X[:2])['predictions'].shape
            TensorShape([2, 3])
        """
        export_dir_base = path_arg("export_dir_base", export_dir_base)
        export_dirs.check_base(export_dir_base)  # a file in the way: before any work
        return export_dirs.write(export_dir_base, self.saved_model_writer())

    def saved_model_writer(self) -> Callable[[str], object]:
        """The engine's SavedModel writer for this model: ``write(folder)`` writes into
        an existing `folder` (`export_saved_model` and `BestExporter` version it)."""
        spec = self._state.spec
        self._reload_if_stale()
        return lambda folder: self._engine.export_saved_model(
            spec, self._state.features_spec, folder)

    def train_and_evaluate(self, train_input_fn: InputFn, eval_input_fn: InputFn,
                           epochs: int | None = None, max_steps: int | None = None,
                           eval_every_epochs: int = 1, callbacks: Callbacks = None) -> History:
        """Alternates training and exact evaluation; returns the history for plots.

        Args:
            train_input_fn: as for `train`.
            eval_input_fn: as for `evaluate`.
            epochs: train until ``epochs * steps_per_epoch`` global steps. Give this or
                `max_steps`.
            max_steps: train until this global step.
            eval_every_epochs: evaluate after every this many epochs (and at the end).
                Defaults to 1.
            callbacks: Keras callbacks; ``on_epoch_end`` gets the evaluation's metrics as
                ``val_loss``, ``val_accuracy``, ... Defaults to None.

        Returns:
            `History` with per-step losses and one entry per evaluation.

        Examples:
            >>> import tempfile
            >>> X, y = np.random.rand(10, 4).astype('float32'), np.arange(10) % 3
            >>> model_func = fw.train.get_clf_model_func(lambda: keras.Sequential(
            ...     [keras.Input((4,)), keras.layers.Dense(3, kernel_initializer='zeros')]),
            ...     fw.train.sgd_optimizer(0.1))
            >>> train_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'])
            >>> eval_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'],
            ...                                           training=False)
            >>> est = fw.train.get_tpu_estimator(2, model_func, tempfile.mkdtemp(), trn_bs=4,
            ...                                  val_bs=4, verbose=False)
            >>> history = est.train_and_evaluate(train_fn, eval_fn, epochs=2,
            ...                                  callbacks=[fw.train.EarlyStopping()])
            >>> history.metric('accuracy')   # plt.plot(*history.metric('accuracy'))
            ([2, 4], [...])
        """
        if (epochs is None) == (max_steps is None):
            raise ValueError(f"give epochs= or max_steps=, exactly one (got epochs={epochs}, "
                             f"max_steps={max_steps})")
        if epochs is not None:
            max_steps = positive_int("epochs", epochs) * self.config.steps_per_epoch
        max_steps = positive_int("max_steps", max_steps)
        every = positive_int("eval_every_epochs", eval_every_epochs) * self.config.steps_per_epoch
        # Orbit's shape: train to the next evaluation, evaluate, again; one `train` call
        # (one on_train_begin/end, one bar) around the whole alternation.
        with self._training(train_input_fn, None, max_steps, callbacks) as run:
            while run is not None and not run.stopped:
                boundary = min((run.step // every + 1) * every, max_steps)
                run.train(boundary, evaluation_follows=True)
                if run.step < boundary:
                    break  # a callback stopped training before the evaluation was due
                run.save(Trigger.EVALUATION)  # each evaluated step is a checkpoint
                result = self.evaluate(eval_input_fn)
                logger.info("fenwicks: step %d: %s", self.global_step, result)
                run.end_epoch(callbacks_lib.val_logs(result))
        return self.history


def _as_dicts(probs: Any) -> list[dict[str, Any]]:
    if not isinstance(probs, np.ndarray) or probs.ndim != 2:
        raise ValueError(f"as_dicts=True needs class probabilities [N, classes]; this model "
                         f"predicts {type(probs).__name__} of shape "
                         f"{getattr(probs, 'shape', None)}: use as_dicts=False")
    labels = np.argmax(probs, axis=1)
    return [{"y_pred": int(label), "y_prob": row} for label, row in zip(labels, probs,
                                                                        strict=True)]


def train_and_evaluate(estimator: Estimator, train_input_fn: InputFn,
                       eval_input_fn: InputFn, epochs: int | None = None,
                       max_steps: int | None = None, eval_every_epochs: int = 1,
                       callbacks: Callbacks = None) -> History:
    """Function form of `Estimator.train_and_evaluate`.

    Examples:
        >>> import tempfile
        >>> X, y = np.random.rand(10, 4).astype('float32'), np.arange(10) % 3
        >>> model_func = fw.train.get_clf_model_func(lambda: keras.Sequential(
        ...     [keras.Input((4,)), keras.layers.Dense(3, kernel_initializer='zeros')]),
        ...     fw.train.sgd_optimizer(0.1))
        >>> train_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'])
        >>> eval_fn = lambda params: fw.data.numpy_ds(X, y, params['batch_size'],
        ...                                           training=False)
        >>> est = fw.train.get_tpu_estimator(2, model_func, tempfile.mkdtemp(), trn_bs=4,
        ...                                  val_bs=4, verbose=False)
        >>> history = fw.train.train_and_evaluate(est, train_fn, eval_fn, epochs=1)
        >>> history.steps, [result['num_examples'] for result in history.evals]
        ([1, 2], [10])
    """
    return estimator.train_and_evaluate(train_input_fn, eval_input_fn, epochs=epochs,
                                        max_steps=max_steps,
                                        eval_every_epochs=eval_every_epochs,
                                        callbacks=callbacks)
