"""The estimator: train, evaluate, predict and export one model on `fw.accel`'s strategy.

    model_func = fw.train.get_clf_model_func(build_nn, opt_func)
    est = fw.train.get_tpu_estimator(steps_per_epoch, model_func, work_dir, trn_bs=512)
    est.train(train_input_func, max_steps=total_steps)   # resumes from work_dir
    est.evaluate(eval_input_func)                        # every example exactly once

One `Estimator` owns one model, built lazily on first use (it needs the input's shapes)
inside the strategy's scope and under the precision policy. All state that the next step
depends on lives in ``work_dir``'s checkpoints, so a new estimator there continues the run.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from fenwicks import accel
from fenwicks.train import checkpoints, export, inputs, lock, loops, preemption
from fenwicks.train.model_func import ModelSpec
from fenwicks.train.progress import Progress, write_eval_summary

logger = logging.getLogger("fenwicks")

ModelFunc = Callable[[dict], ModelSpec]
InputFn = inputs.InputFn


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN or infinite; no checkpoint was written for it."""


@dataclasses.dataclass(frozen=True)
class EstimatorConfig:
    """Validated options of `get_tpu_estimator` (see there)."""

    steps_per_epoch: int
    work_dir: str
    train_batch_size: int
    eval_batch_size: int
    predict_batch_size: int
    steps_per_loop: int
    precision: str
    seed: int | None = None
    warm_start_from: str | None = None
    jit_compile: bool = False
    save_every_secs: float | None = 600.0
    save_every_loops: int | None = None
    keep_checkpoints: int = 3
    verbose: bool = True


@dataclasses.dataclass
class History:
    """What a run recorded, ready for plots: one entry per step, one per evaluation.

    Example:
        >>> plt.plot(history.steps, history.losses)
        >>> plt.plot(*history.metric('accuracy'))
    """

    steps: list[int] = dataclasses.field(default_factory=list)
    losses: list[float] = dataclasses.field(default_factory=list)
    learning_rates: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    examples_per_sec: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    evals: list[dict[str, float]] = dataclasses.field(default_factory=list)

    def metric(self, name: str) -> tuple[list[int], list[float]]:
        """(global steps, values) of evaluation metric `name`, e.g. ``'accuracy'``."""
        return ([int(e["global_step"]) for e in self.evals],
                [float(e[name]) for e in self.evals])


# --------------------------------------------------------------------------- construction


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return int(value)


def _check_divisible(name: str, value: Any, replicas: int) -> int:
    value = _positive_int(name, value)
    if value % replicas:
        low = max(replicas, value - value % replicas)
        raise ValueError(f"{name}={value} must be divisible by the {replicas} replicas "
                         f"(each gets {name} / {replicas}); try {low} or {low + replicas}")
    return value


def get_tpu_estimator(steps_per_epoch: int, model_func: ModelFunc, work_dir: str,
                      trn_bs: int = 128, val_bs: int | None = None,
                      pred_bs: int | None = None, steps_per_loop: int | None = None,
                      precision: str = "auto", seed: int | None = None,
                      warm_start_from: str | None = None, jit_compile: bool | None = None,
                      save_every_secs: float | None = 600.0,
                      save_every_loops: int | None = None, keep_checkpoints: int = 3,
                      verbose: bool = True) -> Estimator:
    """Creates an `Estimator` on the current accelerator (`fw.accel.current()`).

    Args:
        steps_per_epoch: training steps per pass over the data.
        model_func: ``params -> ModelSpec``, e.g. from `get_clf_model_func`.
        work_dir: checkpoints and TensorBoard logs (local or ``gs://``). An existing
            checkpoint there is resumed.
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

    Returns:
        The `Estimator`.

    Raises:
        ValueError: for a batch size not divisible by the replicas, or a bad argument.

    Example:
        >>> est = fw.train.get_tpu_estimator(100, model_func, work_dir, trn_bs=512,
        ...                                  val_bs=10000, seed=1)
    """
    acc = accel.current()
    replicas = acc.num_replicas
    trn_bs = _check_divisible("trn_bs", trn_bs, replicas)
    val_bs = _check_divisible("val_bs", trn_bs if val_bs is None else val_bs, replicas)
    pred_bs = _check_divisible("pred_bs", val_bs if pred_bs is None else pred_bs, replicas)
    steps_per_epoch = _positive_int("steps_per_epoch", steps_per_epoch)
    if not callable(model_func):
        raise ValueError(f"model_func={model_func!r} must be callable params -> ModelSpec, "
                         "e.g. fw.train.get_clf_model_func(build_nn, opt_func)")
    if not isinstance(work_dir, str) or not work_dir:
        raise ValueError(f"work_dir={work_dir!r} must be a local path or a gs:// URL")
    if "://" not in work_dir and os.path.exists(work_dir) and not os.path.isdir(work_dir):
        raise ValueError(f"work_dir={work_dir!r} is a file, not a directory; give a "
                         "directory for checkpoints and logs (it is created if missing)")
    if precision not in accel.PRECISIONS:
        raise ValueError(f"precision={precision!r} must be one of {accel.PRECISIONS}")
    jit_compile = acc.kind == "tpu" if jit_compile is None else bool(jit_compile)
    if jit_compile and acc.kind == "cpu" and replicas > 1:
        # XLA cannot reach variables on the other logical CPU devices ("Trying to access
        # resource ... located in device CPU:1 from device CPU:0"); 1 replica is fine.
        logger.warning("fenwicks: jit_compile is ignored on %d logical CPU replicas (XLA "
                       "does not support variables spread over logical CPU devices)",
                       replicas)
        jit_compile = False
    config = EstimatorConfig(
        steps_per_epoch, work_dir.rstrip("/"), trn_bs, val_bs, pred_bs,
        _positive_int("steps_per_loop", steps_per_loop or steps_per_epoch),
        acc.precision if precision == "auto" else precision, seed, warm_start_from,
        jit_compile, save_every_secs,
        save_every_loops, _positive_int("keep_checkpoints", keep_checkpoints), verbose)
    return Estimator(model_func, config, acc)


@contextlib.contextmanager
def _precision_policy(precision: str) -> Iterator[None]:
    """Builds layers under the mixed policy, then restores the user's global policy."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32" if precision == "float32"
                                  else f"mixed_{precision}")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _zeros_like_spec(spec: Any) -> Any:
    return tf.nest.map_structure(lambda s: tf.zeros([1] + s.shape.as_list()[1:], s.dtype),
                                 spec)


def build_model(model_func: ModelFunc, params: dict, precision: str,
                features_spec: Any) -> tuple[ModelSpec, Any]:
    """Calls `model_func`; builds the model and the optimizer's slots.

    Shared by the estimator and `find_lr`, which call it inside the strategy's scope and
    under the precision policy. Returns the spec and the optimizer to step with (wrapped
    in a `LossScaleOptimizer` under float16).
    """
    spec = model_func(params)
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"model_func returned {type(spec).__name__}; it must return "
                         "fw.train.ModelSpec (e.g. from fw.train.get_clf_model_func)")
    _check_input_shape(spec.model, features_spec)
    if not spec.model.built:
        spec.model(_zeros_like_spec(features_spec), training=False)
    optimizer = spec.optimizer
    if precision == "float16" and not isinstance(
            optimizer, keras.optimizers.LossScaleOptimizer):
        # float16 gradients underflow without a loss scale; bfloat16 has float32's range.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(spec.model.trainable_variables)
    return spec, optimizer


@contextlib.contextmanager
def _training_randomness_kept(model: keras.Model) -> Iterator[None]:
    """Evaluation and prediction leave the training random state as it was.

    Keras's recurrent layers advance their seed generator on every call, inference
    included, so an evaluation between two training steps would change the next dropout
    masks: a run that evaluates would no longer equal one that resumed from a checkpoint.
    """
    states = [v for v in model.variables if v.path.endswith("seed_generator_state")]
    saved = [v.numpy() for v in states]
    try:
        yield
    finally:
        for variable, value in zip(states, saved, strict=True):
            variable.assign(value)


def _check_input_shape(model: keras.Model, features_spec: Any) -> None:
    """The data's feature shape against the shape the model declares, before compiling.

    A fully convolutional net declared for 28x28 images also runs on 8x8 ones, silently
    training something other than what the user built.
    """
    try:
        declared = model.input_shape
    except (AttributeError, ValueError):
        return  # a subclassed model declares nothing until it is called
    if not isinstance(features_spec, tf.TensorSpec) or not isinstance(declared, tuple) \
            or any(isinstance(d, (tuple, list)) for d in declared):
        return  # several inputs: Keras checks their structure itself
    got = tuple(features_spec.shape.as_list())
    if len(got) != len(declared) or any(
            want is not None and have is not None and want != have
            for want, have in zip(declared[1:], got[1:], strict=True)):
        raise ValueError(
            f"the model expects inputs of shape {declared} but the input_fn gives "
            f"{got}; build the model for the data (e.g. input_shape={tuple(got[1:])}) "
            "or fix the input_fn. Nothing was compiled or written")


def _head(elem: Any, rows: int) -> Any:
    return tf.nest.map_structure(lambda t: t[:rows], elem)


# --------------------------------------------------------------------------- the estimator

_live_estimators: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _release_input_iterators() -> None:
    """Drops every estimator's live input iterator while the interpreter is still whole.

    A distributed tf.data iterator left to interpreter shutdown sometimes blocks forever
    in its destructor, waiting on its own prefetch threads (seen with TF 2.21 under load,
    mostly with pipelines that call back into Python such as `fw.data.numpy_ds`);
    releasing it from an atexit hook, before modules are torn down, avoids that.
    """
    for estimator in list(_live_estimators):
        estimator._train_input = None
    gc.collect()



class Estimator:
    """Trains, evaluates, predicts and exports one model; see `get_tpu_estimator`.

    Attributes:
        config: the validated `EstimatorConfig`.
        history: a `History` of this object's training and evaluations.
        warm_start_report: ``{'loaded': [...], 'not_loaded': [...]}`` after a warm start.
    """

    def __init__(self, model_func: ModelFunc, config: EstimatorConfig,
                 accelerator: accel.Accelerator) -> None:
        self.config = config
        self.history = History()
        self.warm_start_report: dict[str, list[str]] | None = None
        self._model_func = model_func
        self._acc = accelerator
        self._strategy = accelerator.strategy
        self._spec: ModelSpec | None = None
        self._train_input: tuple[InputFn, Any] | None = None
        self._loops: dict[Any, Any] = {}
        self._stale = False  # True after a NaN: the in-memory weights are not trusted
        self._writers: dict[str, Any] = {}
        self._preemption: preemption.PreemptionWatcher | None = None
        self._lock: lock.WorkDirLock | None = None
        # Eval input_fns whose labels were checked (weak: a new lambda may reuse an id).
        self._checked_inputs: weakref.WeakSet = weakref.WeakSet()
        _live_estimators.add(self)

    # ---------------------------------------------------------------- public state

    @property
    def model(self) -> keras.Model:
        """The Keras model (built on first use of the estimator)."""
        return self._require_spec().model

    @property
    def optimizer(self) -> Any:
        """The optimizer (a `LossScaleOptimizer` under float16)."""
        self._require_spec()
        return self._optimizer

    @property
    def global_step(self) -> int:
        """Training steps taken so far, including those of runs resumed from work_dir."""
        return int(self._global_step.numpy()) if self._spec is not None else 0

    @property
    def num_replicas(self) -> int:
        return self._acc.num_replicas

    def _require_spec(self) -> ModelSpec:
        if self._spec is None:
            raise ValueError("the model is built on first use; call train, evaluate or "
                             "predict first (it needs the input's shapes)")
        return self._spec

    # ---------------------------------------------------------------- building

    def _params(self, mode: str, global_batch: int, context: Any = None) -> dict:
        return {"batch_size": global_batch // self.num_replicas,
                "global_batch_size": global_batch, "num_replicas": self.num_replicas,
                "seed": self.config.seed, "mode": mode, "precision": self.config.precision,
                "steps_per_epoch": self.config.steps_per_epoch, "input_context": context}

    def _build(self, features_spec: Any, mode: str) -> None:
        """Creates model, optimizer and step counters; restores or warm-starts them."""
        if self._spec is not None:
            return
        if self.config.seed is not None:
            keras.utils.set_random_seed(self.config.seed)
        with self._strategy.scope(), _precision_policy(self.config.precision):
            spec, optimizer = self._create_model(features_spec, mode)
            self._global_step = tf.Variable(0, dtype=tf.int64, name="global_step")
            self._input_steps = tf.Variable(0, dtype=tf.int64, name="input_steps")
        self._optimizer = optimizer
        self._features_spec = features_spec
        self._root = checkpoints.make_checkpoint(spec.model, optimizer, self._global_step,
                                                 self._input_steps)
        self._restore_or_warm_start(spec.model)
        self._manager = self._make_manager()
        self._spec = spec

    def _create_model(self, features_spec: Any, mode: str) -> tuple[ModelSpec, Any]:
        return build_model(self._model_func,
                           self._params(mode, self.config.train_batch_size),
                           self.config.precision, features_spec)

    def _scratch_dir(self) -> str | None:
        return self.config.work_dir + "/.probe" if self._acc.is_remote else None

    def _restore_or_warm_start(self, model: keras.Model) -> None:
        restored = checkpoints.restore_latest(self._root, self.config.work_dir,
                                              self._scratch_dir())
        if restored is None and self.config.warm_start_from:
            self.warm_start_report = checkpoints.warm_start(model, self.config.warm_start_from)

    def _reload_if_stale(self) -> None:
        """After a NaN, go back to the last good checkpoint before doing anything else."""
        if not self._stale:
            return
        restored = checkpoints.restore_latest(self._root, self.config.work_dir,
                                              self._scratch_dir())
        if restored is None:
            raise NonFiniteLossError("the weights became NaN before any checkpoint was "
                                     "saved; create a new estimator (lower the learning rate)")
        self._train_input, self._stale = None, False

    def _summary_writer(self, kind: str) -> Any:
        """One writer per estimator and kind: creating one opens a new event file."""
        if kind not in self._writers:
            self._writers[kind] = (tf.summary.create_file_writer(
                f"{self.config.work_dir}/{kind}") if self._is_chief
                else tf.summary.create_noop_writer())
        return self._writers[kind]

    def _loop(self, kind: str, make: Callable[[], Any]) -> Any:
        if kind not in self._loops:
            self._loops[kind] = make()
        return self._loops[kind]

    # ---------------------------------------------------------------- training

    def _check_first_batch(self, input_fn: InputFn, batch_size: int) -> None:
        """Structure, static batch and label checks on one batch, before any compile."""
        context = tf.distribute.InputContext(1, 0, self.num_replicas)
        dataset = inputs.call_input_fn(
            input_fn, self._params("train", self.config.train_batch_size, context), "training")
        inputs.check_train_spec(dataset.element_spec, batch_size)
        self._build(dataset.element_spec[0], "train")
        self._check_labels(dataset)

    def _check_labels(self, dataset: tf.data.Dataset) -> None:
        """Runs the loss eagerly on a few examples: the built-in losses then raise a
        ValueError for out-of-range labels (compiled, they can only return NaN)."""
        for features, labels in dataset.take(1):
            features, labels = _head((features, labels), 64)
            with self._strategy.scope(), _training_randomness_kept(self._spec.model):
                self._spec.loss_fn(labels, loops._float32(
                    self._spec.model(features, training=False)))

    def _train_iterator(self, input_fn: InputFn) -> Any:
        """The live iterator for `input_fn`; a fresh estimator resumes the input position."""
        if self._train_input is not None and self._train_input[0] is input_fn:
            return self._train_input[1]
        batch_size = self.config.train_batch_size // self.num_replicas
        self._check_first_batch(input_fn, batch_size)
        resuming = self._train_input is None
        if not resuming:  # another input function: it starts from its beginning
            self._input_steps.assign(0)
        skip_steps = int(self._input_steps.numpy())

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            params = self._params("train", self.config.train_batch_size, context)
            # Each step takes one batch per replica this pipeline feeds.
            per_step = self.num_replicas // context.num_input_pipelines
            dataset = inputs.resumed_train_dataset(input_fn, params, skip_steps * per_step)
            inputs.check_train_spec(dataset.element_spec, batch_size)
            return dataset

        iterator = iter(self._strategy.distribute_datasets_from_function(dataset_fn))
        if skip_steps:
            logger.info("fenwicks: resuming the training input after %d steps", skip_steps)
        self._train_input = (input_fn, iterator)
        return iterator

    @staticmethod
    def _check_steps(steps: int | None, max_steps: int | None) -> None:
        if steps is None and max_steps is None:
            raise ValueError("give train() steps=N (N more steps) or max_steps=M (stop at "
                             "global step M), e.g. steps=est.config.steps_per_epoch")
        if steps is not None and max_steps is not None:
            raise ValueError(f"give steps={steps} or max_steps={max_steps}, not both")
        _positive_int("steps" if steps is not None else "max_steps",
                      steps if steps is not None else max_steps)

    def _target_step(self, steps: int | None, max_steps: int | None) -> int:
        """Only valid once the model is built: a resumed run's step is known then."""
        return self.global_step + steps if steps is not None else max_steps

    @property
    def _is_chief(self) -> bool:
        """False on the non-chief workers of a multi-worker run: they write no files."""
        return bool(self._strategy.extended.should_checkpoint)

    def _save(self) -> None:
        if self._manager.latest_checkpoint and self._manager.latest_checkpoint.endswith(
                f"-{self.global_step}"):
            return  # nothing new since the last save
        if self._is_chief:
            checkpoints.save(self._manager, self.global_step)
            return
        # Every worker takes part in a save (a variable may need a collective to be read);
        # the others write to a scratch directory that is removed at once.
        scratch = f"{self.config.work_dir}/.worker-{self._strategy.cluster_resolver.task_id}"
        tf.train.CheckpointManager(self._root, scratch, 1).save(self.global_step)
        tf.io.gfile.rmtree(scratch)

    def train(self, input_fn: InputFn, steps: int | None = None,
              max_steps: int | None = None) -> Estimator:
        """Trains until `steps` more steps, or until global step `max_steps`.

        `steps_per_loop` steps run in one compiled call; the last call is shortened so
        training stops exactly at the target. A checkpoint is written at the end, every
        `save_every_secs` and every `save_every_loops` loops.

        Args:
            input_fn: ``params -> tf.data.Dataset`` of (features, labels) batches of
                ``params['batch_size']`` (per replica) examples, static batch size,
                repeated. Calling `train` again with the same function continues where
                the data left off.
            steps: number of steps to run. Give this or `max_steps`.
            max_steps: global step to stop at; nothing happens if already reached.

        Returns:
            self.

        Raises:
            ValueError: bad arguments or input, before anything is compiled.
            NonFiniteLossError: the loss became NaN/inf; names the step. The last
                checkpoint is left as it was, and the estimator reloads it on next use.
            WorkDirLockedError: another process is training in work_dir.
            Preempted: SIGTERM arrived; the step in progress finished and was saved.
            CheckpointWriteError: a checkpoint could not be written (disk full, storage);
                the previous one is intact.

        Example:
            >>> est.train(lambda params: fw.data.numpy_ds(X, y, params['batch_size']),
            ...           max_steps=1000)
        """
        self._check_steps(steps, max_steps)
        self._reload_if_stale()
        with self._work_dir_lock():
            self._catch_up_with_work_dir()
            iterator = self._train_iterator(input_fn)  # builds, restoring work_dir's step
            target = self._target_step(steps, max_steps)
            if self.global_step >= target:
                logger.info("fenwicks: already at step %d >= %d; not training",
                            self.global_step, target)
                return self
            self._train_until(iterator, target)
        return self

    @contextlib.contextmanager
    def _work_dir_lock(self) -> Iterator[None]:
        """Held while training: one writer of checkpoints per work_dir (see `lock.py`)."""
        if not self._strategy.extended.should_checkpoint:
            yield  # a non-chief worker writes no checkpoint
            return
        if self._lock is None:
            self._lock = lock.WorkDirLock(self.config.work_dir)
        self._lock.acquire()
        try:
            yield
        finally:
            self._lock.release()

    def _catch_up_with_work_dir(self) -> None:
        """Another process may have trained here since this estimator last looked."""
        if self._spec is None:
            return
        if checkpoints.latest(self.config.work_dir) == self._manager.latest_checkpoint:
            return
        restored = checkpoints.restore_latest(self._root, self.config.work_dir,
                                              self._scratch_dir())
        logger.warning("fenwicks: %s changed since this estimator read it; continuing from "
                       "%s", self.config.work_dir, restored)
        self._manager = self._make_manager()
        self._train_input = None  # the input position was restored too

    def _make_manager(self) -> tf.train.CheckpointManager:
        return tf.train.CheckpointManager(
            self._root, self.config.work_dir, self.config.keep_checkpoints,
            step_counter=self._global_step, checkpoint_name="ckpt")

    def _train_until(self, iterator: Any, target: int) -> None:
        if self._preemption is None:
            self._preemption = preemption.PreemptionWatcher()
        loop = self._loop("train", lambda: loops.make_train_loop(
            self._strategy, self._spec, self._optimizer, self._global_step,
            self.config.train_batch_size, self.config.jit_compile, self._preemption.flag))
        with self._preemption, Progress(self._summary_writer("train"), self.global_step,
                                        target, self.config.train_batch_size,
                                        self.config.verbose) as progress:
            self._run_loops(loop, iterator, target, progress)
        self._save()

    def _run_loops(self, loop: Any, iterator: Any, target: int, progress: Progress) -> None:
        last_save, loops_since_save = time.monotonic(), 0
        while self.global_step < target:
            start = self.global_step
            num_steps = min(self.config.steps_per_loop, target - start)
            try:
                losses = loop(iterator, tf.constant(num_steps, tf.int64)).numpy()
            except tf.errors.OutOfRangeError as err:
                # The steps that did run are complete and valid: keep them.
                self._input_steps.assign_add(self.global_step - start)
                self._save()
                raise ValueError(
                    f"the training input ran out of data at step {self.global_step}; end "
                    "the input_fn's dataset with .repeat() so it can feed any number of "
                    "steps") from err
            self._input_steps.assign_add(len(losses))
            self._record(start, losses, progress)
            if len(losses) and not np.isfinite(losses[-1]):
                self._stop_at_non_finite(losses[-1])
            if self._preemption.requested:
                self._save()
                raise preemption.Preempted(self.global_step, self._manager.latest_checkpoint)
            loops_since_save += 1
            if self._lock is not None:
                self._lock.heartbeat()
            every = self.config.save_every_loops
            secs = self.config.save_every_secs
            if (every and loops_since_save >= every) or (
                    secs is not None and time.monotonic() - last_save >= secs):
                self._save()
                last_save, loops_since_save = time.monotonic(), 0
                progress.restart_clock()

    def _stop_at_non_finite(self, loss: float) -> None:
        self._stale = True  # the weights in memory are now NaN; reload before next use
        raise NonFiniteLossError(
            f"the training loss is {loss} at step {self.global_step}; training stopped "
            "and no checkpoint was written for it (the last good one is "
            f"{self._manager.latest_checkpoint}). Lower the learning rate, or check the "
            "inputs for NaN and the labels' range")

    def _learning_rate(self) -> float | None:
        try:
            return float(np.asarray(self._optimizer.learning_rate))
        except (TypeError, ValueError, AttributeError):
            return None

    def _record(self, start: int, losses: np.ndarray, progress: Progress) -> None:
        steps = list(range(start + 1, start + 1 + len(losses)))
        self.history.steps += steps
        self.history.losses += [float(x) for x in losses]
        learning_rate = self._learning_rate()
        rate = progress.update(self.global_step, losses, learning_rate)
        self.history.examples_per_sec.append((self.global_step, rate))
        if learning_rate is not None:
            self.history.learning_rates.append((self.global_step, learning_rate))

    # ---------------------------------------------------------------- evaluate / predict

    def _padded_dataset(self, input_fn: InputFn, global_batch: int, mode: str,
                        steps: int | None) -> Any:
        batch_size = global_batch // self.num_replicas
        what = "evaluation" if mode == "eval" else "prediction"
        context = tf.distribute.InputContext(1, 0, self.num_replicas)
        probe = inputs.call_input_fn(input_fn, self._params(mode, global_batch, context), what)
        if mode == "eval":
            inputs.check_pair(probe.element_spec, what)
        inputs.check_eval_spec(probe.element_spec, batch_size, what)
        spec = probe.element_spec
        features = spec[0] if isinstance(spec, tuple) and len(spec) == 2 else spec
        self._build(features, mode)
        if mode == "eval" and input_fn not in self._checked_inputs:
            self._check_labels(probe)
            with contextlib.suppress(TypeError):  # an object that cannot be weakly referenced
                self._checked_inputs.add(input_fn)

        workers = self._acc.num_workers

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            # Several workers: the estimator shards the batches itself (round-robin) and
            # gives the input_fn no input_context, so that each example is counted once
            # whether or not the input_fn would shard by it.
            params = self._params(mode, global_batch, None if workers > 1 else context)
            dataset = inputs.call_input_fn(input_fn, params, what)
            per_step = self.num_replicas // context.num_input_pipelines
            if steps is not None:
                dataset = dataset.take(steps * self.num_replicas)
            if workers > 1:
                dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
            return inputs.pad_and_mask(dataset, batch_size, per_step, what)

        return self._strategy.distribute_datasets_from_function(dataset_fn)

    def _with_smaller_batches(self, run: Callable[[int], Any], global_batch: int,
                              what: str) -> Any:
        """Runs `run(batch)`, halving the batch after an out-of-memory error on a GPU."""
        while True:
            try:
                return run(global_batch)
            except tf.errors.ResourceExhaustedError:
                smaller = (global_batch // self.num_replicas // 2) * self.num_replicas
                if smaller < self.num_replicas:
                    raise
                logger.warning("fenwicks: out of memory at %s batch %d; retrying with %d "
                               "(results are unchanged: evaluation is exact)", what,
                               global_batch, smaller)
                global_batch = smaller

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

        Example:
            >>> est.evaluate(lambda params: fw.data.numpy_ds(X, y, params['batch_size'],
            ...                                              training=False))
            {'loss': 0.31, 'accuracy': 0.912, 'global_step': 1000, 'num_examples': 10000}
        """
        if steps is not None:
            steps = _positive_int("steps", steps)
        self._reload_if_stale()

        def run(global_batch: int) -> np.ndarray:
            dataset = self._padded_dataset(input_fn, global_batch, "eval", steps)
            loop = self._loop("eval", lambda: loops.make_eval_loop(
                self._strategy, self._spec, self.config.jit_compile))
            with _training_randomness_kept(self._spec.model):
                per_step = loop(iter(dataset)).numpy().astype(np.float64)
            width = 2 + len(self._spec.metric_fns)  # loss, metrics, count
            return per_step.reshape(-1, width).sum(axis=0)  # an empty input gives zeros

        sums = self._with_smaller_batches(run, self.config.eval_batch_size, "evaluation")
        count = sums[-1]
        if count == 0:
            raise ValueError("the evaluation input_fn yielded no examples")
        result = {"loss": float(sums[0] / count)}
        result.update({name: float(sums[1 + i] / count)
                       for i, name in enumerate(self._spec.metric_fns)})
        result.update(global_step=self.global_step, num_examples=int(count))
        write_eval_summary(self._summary_writer("eval"), self.global_step, result)
        self.history.evals.append(result)
        return result

    def predict(self, input_fn: InputFn) -> Any:
        """Per-example predictions: exactly one row per input example, in input order.

        Args:
            input_fn: ``params -> tf.data.Dataset`` of feature batches (or
                (features, labels) pairs, whose labels are ignored) of at most
                ``params['batch_size']`` examples.

        Returns:
            A NumPy array (or a dict of arrays, as `predict_fn` returns) with one row per
            example; class probabilities for `get_clf_model_func`.

        Example:
            >>> probs = est.predict(lambda params: fw.data.numpy_ds(X, None,
            ...                     params['batch_size'], training=False))
        """
        self._reload_if_stale()
        if self._acc.num_workers > 1:
            raise ValueError(
                f"predict runs on one host, and this run spans {self._acc.num_workers} "
                "workers (TF_CONFIG): each would return only its own share of the rows. "
                "Predict in a single-host process on the work_dir (a new estimator there "
                "restores the model), or export_saved_model and serve that")

        def run(global_batch: int) -> list[Any]:
            dataset = self._padded_dataset(input_fn, global_batch, "predict", None)
            loop = self._loop("predict", lambda: loops.make_predict_loop(
                self._strategy, self._spec, self.config.jit_compile))
            with _training_randomness_kept(self._spec.model):
                return loop(iter(dataset))

        results = self._with_smaller_batches(run, self.config.predict_batch_size,
                                             "prediction")
        if not results:
            raise ValueError("the prediction input_fn yielded no examples")
        mask = np.concatenate([np.asarray(mask) for _, mask in results])
        flat = [np.concatenate([np.asarray(leaf) for leaf in leaves])[mask]
                for leaves in zip(*(tf.nest.flatten(p) for p, _ in results), strict=True)]
        return tf.nest.pack_sequence_as(results[0][0], flat)

    # ---------------------------------------------------------------- export, loops of loops

    def export_saved_model(self, export_dir: str) -> str:
        """Writes a SavedModel whose ``serving_default`` signature gives predictions.

        Args:
            export_dir: local or gs:// directory.

        Returns:
            `export_dir`; reload with ``tf.saved_model.load(export_dir)`` and call
            ``.serve(features)`` or ``.signatures['serving_default'](x=features)``.

        Example:
            >>> loaded = tf.saved_model.load(est.export_saved_model('/tmp/m'))
            >>> loaded.serve(X[:5])['predictions']
        """
        self._require_spec()
        self._reload_if_stale()
        return export.export_saved_model(self._spec, self._features_spec, export_dir)

    def train_and_evaluate(self, train_input_fn: InputFn, eval_input_fn: InputFn,
                           epochs: int | None = None, max_steps: int | None = None,
                           eval_every_epochs: int = 1) -> History:
        """Alternates training and exact evaluation; returns the history for plots.

        Args:
            train_input_fn: as for `train`.
            eval_input_fn: as for `evaluate`.
            epochs: train until ``epochs * steps_per_epoch`` global steps. Give this or
                `max_steps`.
            max_steps: train until this global step.
            eval_every_epochs: evaluate after every this many epochs (and at the end).
                Defaults to 1.

        Returns:
            `History` with per-step losses and one entry per evaluation.

        Example:
            >>> history = est.train_and_evaluate(train_fn, eval_fn, epochs=10)
            >>> plt.plot(*history.metric('accuracy'))
        """
        if (epochs is None) == (max_steps is None):
            raise ValueError(f"give epochs= or max_steps=, exactly one (got epochs={epochs}, "
                             f"max_steps={max_steps})")
        if epochs is not None:
            max_steps = _positive_int("epochs", epochs) * self.config.steps_per_epoch
        max_steps = _positive_int("max_steps", max_steps)
        every = _positive_int("eval_every_epochs", eval_every_epochs)
        interval = every * self.config.steps_per_epoch
        while self.global_step < max_steps:
            next_stop = min(max_steps, (self.global_step // interval + 1) * interval)
            self.train(train_input_fn, max_steps=next_stop)
            result = self.evaluate(eval_input_fn)
            logger.info("fenwicks: step %d: %s", self.global_step, result)
        return self.history


def train_and_evaluate(estimator: Estimator, train_input_fn: InputFn,
                       eval_input_fn: InputFn, epochs: int | None = None,
                       max_steps: int | None = None, eval_every_epochs: int = 1) -> History:
    """Function form of `Estimator.train_and_evaluate`.

    Example:
        >>> history = fw.train.train_and_evaluate(est, train_fn, eval_fn, epochs=10)
    """
    return estimator.train_and_evaluate(train_input_fn, eval_input_fn, epochs=epochs,
                                        max_steps=max_steps,
                                        eval_every_epochs=eval_every_epochs)
