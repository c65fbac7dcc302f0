"""TPUEstimator's names on the Fenwicks estimator: a TPUEstimator program ports with a
handful of edits (tutorials/PORTING.md, 'TPUEstimator programs').

    config = fw.train.RunConfig(model_dir=work_dir, save_checkpoints_steps=1000,
                                tpu_config=fw.train.TPUConfig(iterations_per_loop=100))
    est = fw.train.TPUEstimator(model_fn=model_fn, config=config, params={'data_dir': d},
                                train_batch_size=1024, eval_batch_size=1000)
    est.train(train_input_fn, max_steps=10000)
    est.evaluate(eval_input_fn)                  # every example once, no steps needed
    for pred in est.predict(predict_input_fn):   # one dict per example
        print(pred['class_ids'])

``model_fn(features, labels, mode, params)`` returns a `TPUEstimatorSpec`. It runs inside
a `tf.function`, as a TF1 graph function ran, and builds its network from Keras layers;
the layers it creates on its first calls are handed back on later calls, so train, eval
and predict share one set of variables (`fenwicks.train.tf._model_fn`). Everything the
estimator adds comes along: exact evaluation, resume from ``model_dir``, ``gs://`` or local
storage, background checkpoint writes, the same run on a TPU, GPUs or the CPU.

What cannot work in TensorFlow 2, and fails with a message saying so: variables made
outside Keras and ``tf.compat.v1.get_variable`` (``tf.compat.v1.layers``, a hand-made
``tf.Variable``), graph collections (``tf.compat.v1.get_collection``: Keras layers apply
their own batch-norm updates and regularisers), ``train_op``s of stock TF1 optimizers
other than GradientDescent, Momentum and Adam (pass ``optimizer=`` instead), metrics that
are not a ratio of per-example sums (``auc``), ``SessionRunHook``s. A TF1 optimizer of a
program's own (BERT's AdamWeightDecayOptimizer) runs as written. Arguments that have no
effect here (``host_call``, ``RunConfig(session_config=)``, ...) give one warning each.
On the jax engine the front door is refused at construction, in one sentence
(`Engine.tf1_model_fn_refusal`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import math
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from fenwicks import accel
from fenwicks.train import engines
from fenwicks.train.estimator import Estimator, get_tpu_estimator
from fenwicks.train.model_func import ModelSpec
from fenwicks.train.tf import _model_fn as mf
from fenwicks.train.tf import assignment_map

__all__ = ["ModeKeys", "RunConfig", "TPUConfig", "TPUEstimator", "TPUEstimatorSpec",
           "EstimatorSpec", "WarmStartSettings", "InputPipelineConfig", "reset_warnings"]

logger = logging.getLogger("fenwicks")

_NUM, _DEN = "#num", "#den"


class ModeKeys:
    """The modes a model_fn is called in, with `tf.estimator.ModeKeys`' values."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


class InputPipelineConfig:
    """TPUEstimator's input placement values, for ``TPUConfig(per_host_input_for_training=
    ...)``. Fenwicks feeds every replica from one pipeline per host whichever is given:
    the training input_fn gets the per-replica batch (PER_HOST_V2's), the evaluation and
    prediction ones the per-host batch (TPUEstimator's)."""

    PER_SHARD_V1 = 1
    PER_HOST_V1 = 2
    PER_HOST_V2 = 3
    BROADCAST = 4
    SLICED = 5


_WARNED: set[str] = set()


def reset_warnings() -> None:
    """Forgets which no-effect warnings were given, so each is given once more (a
    notebook that runs its cells again, a test that checks them).

    Example:
        >>> fw.train.tpu_estimator.reset_warnings()
    """
    _WARNED.clear()


def _warn_once(key: str, message: str) -> None:
    """One warning per process for an accepted argument that has no effect."""
    if key not in _WARNED:
        _WARNED.add(key)
        logger.warning("fenwicks: %s", message)


_ENGINE_MODE = {"train": ModeKeys.TRAIN, "eval": ModeKeys.EVAL, "predict": ModeKeys.PREDICT}
_ENGINE_MODE_OF = {value: key for key, value in _ENGINE_MODE.items()}


@dataclasses.dataclass(frozen=True)
class TPUConfig:
    """TPUEstimator's `TPUConfig`: how many steps run per compiled call.

    Args:
        iterations_per_loop: training steps per compiled call (``steps_per_loop``).
            Defaults to 2, as TPUEstimator's.
        num_shards: the replica count the program expects. Fenwicks uses every replica
            `fw.accel` found; a different number gives a warning. Defaults to None.
        per_host_input_for_training: accepted (any `InputPipelineConfig` value): the
            training input_fn gets the per-replica batch, evaluation and prediction
            input_fns the per-host batch, whatever it says.
        num_cores_per_replica: None or 1 (model parallelism has no counterpart).

    Example:
        >>> fw.train.TPUConfig(iterations_per_loop=100, num_shards=8)
    """

    iterations_per_loop: int = 2
    num_shards: int | None = None
    num_cores_per_replica: Any = None
    per_host_input_for_training: Any = True
    tpu_job_name: Any = None
    initial_infeed_sleep_secs: Any = None
    input_partition_dims: Any = None
    eval_training_input_configuration: Any = None
    experimental_host_call_every_n_steps: Any = 1

    InputPipelineConfig = InputPipelineConfig  # tpu_config.InputPipelineConfig.PER_HOST_V2

    def __post_init__(self) -> None:
        if not isinstance(self.iterations_per_loop, int) or self.iterations_per_loop < 1:
            raise ValueError(f"iterations_per_loop={self.iterations_per_loop!r} must be an "
                             "integer >= 1, e.g. 100")
        if self.num_cores_per_replica not in (None, 1):
            raise ValueError(f"num_cores_per_replica={self.num_cores_per_replica!r}: model "
                             "parallelism has no counterpart in Fenwicks; leave it None")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """TPUEstimator's `RunConfig`: where and how often checkpoints are written.

    Args:
        tpu_config: a `TPUConfig`. Defaults to ``TPUConfig()``.
        model_dir: checkpoints and logs (local or ``gs://``); as `TPUEstimator`'s
            ``model_dir``. Defaults to None.
        save_checkpoints_steps: also checkpoint every this many steps (rounded up to
            whole loops of ``iterations_per_loop``). Defaults to None.
        save_checkpoints_secs: also checkpoint this often. Defaults to None: 600 s when
            ``save_checkpoints_steps`` is None too, as TPUEstimator.
        keep_checkpoint_max: how many checkpoints to keep. Defaults to 5.
        tf_random_seed: seeds Python, NumPy, TensorFlow and Keras. Defaults to None.
        session_config: accepted with a warning, once, that it has no effect, as are
            `cluster`, `master`, `evaluation_master`, `save_summary_steps`,
            `log_step_count_steps` and `keep_checkpoint_every_n_hours` (`fw.accel` finds
            the TPU; summaries are written every loop).

    Example:
        >>> fw.train.RunConfig(model_dir=work_dir, save_checkpoints_steps=1000,
        ...                    tpu_config=fw.train.TPUConfig(iterations_per_loop=100))
    """

    tpu_config: TPUConfig | None = None
    evaluation_master: Any = None
    master: Any = None
    cluster: Any = None
    model_dir: str | None = None
    tf_random_seed: int | None = None
    save_summary_steps: Any = 100
    save_checkpoints_steps: int | None = None
    save_checkpoints_secs: float | None = None
    session_config: Any = None
    keep_checkpoint_max: int = 5
    keep_checkpoint_every_n_hours: Any = None
    log_step_count_steps: Any = None

    def __post_init__(self) -> None:
        if self.tpu_config is None:
            object.__setattr__(self, "tpu_config", TPUConfig())
        if not isinstance(self.tpu_config, TPUConfig):
            raise ValueError(f"tpu_config={self.tpu_config!r} must be fw.train.TPUConfig(...)")
        if self.save_checkpoints_steps is not None and self.save_checkpoints_secs is not None:
            raise ValueError(f"save_checkpoints_steps={self.save_checkpoints_steps} and "
                             f"save_checkpoints_secs={self.save_checkpoints_secs}: give one")
        for name, default in _IGNORED_RUN_CONFIG.items():
            if getattr(self, name) != default:
                _warn_once(f"RunConfig.{name}", f"RunConfig({name}=...) has no effect and is "
                           f"ignored: {_IGNORED_WHY[name]}")


# RunConfig arguments that change nothing here, with their TPUEstimator defaults.
_IGNORED_RUN_CONFIG = {"cluster": None, "master": None, "evaluation_master": None,
                       "session_config": None, "save_summary_steps": 100,
                       "log_step_count_steps": None, "keep_checkpoint_every_n_hours": None}
_DEVICE_WHY = ("fw.accel finds the device (FENWICKS_DEVICE=tpu|gpu|cpu:N or "
               "fw.accel.configure() chooses another)")
_IGNORED_WHY = {"cluster": _DEVICE_WHY, "master": _DEVICE_WHY,
                "evaluation_master": _DEVICE_WHY, "session_config": _DEVICE_WHY,
                "save_summary_steps": "TensorBoard scalars are written once per loop "
                                      "(iterations_per_loop)",
                "log_step_count_steps": "the progress line is printed once per loop",
                "keep_checkpoint_every_n_hours": "keep_checkpoint_max says how many stay"}


@dataclasses.dataclass(frozen=True)
class WarmStartSettings:
    """`tf.estimator.WarmStartSettings`: initialise from another checkpoint by name.

    Used when ``model_dir`` has no checkpoint of its own (a resumed run restores its own).

    Args:
        ckpt_to_initialize_from: a checkpoint prefix or a directory holding checkpoints.
        vars_to_warm_start: a regular expression, or a list of them, over the current
            variables' names (Keras paths, e.g. ``'dense/kernel'``). Defaults to ``'.*'``.
        var_name_to_prev_var_name: current name -> name in the checkpoint, for those
            that differ. Defaults to None (the same names).
        var_name_to_vocab_info: not supported (vocabulary remapping); must be None.

    Example:
        >>> ws = fw.train.WarmStartSettings('gs://b/pretrained', vars_to_warm_start='enc.*')
        >>> est = fw.train.TPUEstimator(model_fn, model_dir=d, warm_start_from=ws)
    """

    ckpt_to_initialize_from: str
    vars_to_warm_start: str | Sequence[str] | None = ".*"
    var_name_to_vocab_info: Any = None
    var_name_to_prev_var_name: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if self.var_name_to_vocab_info:
            raise ValueError("var_name_to_vocab_info (vocabulary remapping) has no "
                             "counterpart in Fenwicks; load the rows yourself")


@dataclasses.dataclass
class TPUEstimatorSpec:
    """What a model_fn returns: TPUEstimator's `TPUEstimatorSpec`, plus ``optimizer``.

    Args:
        mode: the `ModeKeys` value the model_fn was called with.
        predictions: a tensor or a dict of tensors with a leading batch axis (predict).
        loss: a scalar (the batch mean, as TPUEstimator's), or a per-example ``[B]``
            vector. The evaluation 'loss' is exact on a padded last batch for a vector
            and for scalars from ``tf.compat.v1.losses`` or ``reduce_mean(per_example)``.
        train_op: from ``tf.compat.v1.train.{GradientDescent,Momentum,Adam}Optimizer(...)
            .minimize(loss, global_step)`` (converted to Keras), or from the
            ``apply_gradients`` of a TF1 optimizer subclass (run as the update).
        eval_metrics: ``(metric_fn, tensors)``; ``metric_fn(*tensors)`` (or
            ``**tensors`` for a dict) returns ``{name: (value, update_op)}`` from
            ``tf.compat.v1.metrics`` (accuracy, mean, mean_squared_error, ...) or
            ``{name: keras_mean_metric}`` after its ``update_state``.
        optimizer: a Keras optimizer, or a zero-argument function making one
            (``fw.train.sgd_optimizer(lr_func)``), instead of ``train_op``.
        scaffold_fn: called once per call; ``tf.compat.v1.train.init_from_checkpoint``
            inside it (BERT's warm start) is applied when model_dir has no checkpoint.
        export_outputs, host_call: accepted with a warning, once, that they have no
            effect (TensorBoard scalars are written every loop; `export_saved_model`
            serves the predictions).
        training_hooks, evaluation_hooks, prediction_hooks: must be empty (TF1
            SessionRunHooks; see the module docstring).

    Example:
        >>> return fw.train.TPUEstimatorSpec(mode, loss=loss, optimizer=keras.optimizers.SGD(0.1),
        ...                                  eval_metrics=(metric_fn, [labels, logits]))
    """

    mode: str
    predictions: Any = None
    loss: Any = None
    train_op: Any = None
    eval_metrics: Any = None
    export_outputs: Any = None
    scaffold_fn: Callable[[], Any] | None = None
    host_call: Any = None
    training_hooks: Any = None
    evaluation_hooks: Any = None
    prediction_hooks: Any = None
    optimizer: Any = None
    eval_metric_ops: Any = None  # EstimatorSpec's name for metric results


EstimatorSpec = TPUEstimatorSpec  # the non-TPU `tf.estimator.EstimatorSpec`


def _check_spec(spec: Any, mode: str) -> TPUEstimatorSpec:
    if not isinstance(spec, TPUEstimatorSpec):
        raise mf.ModelFnError(f"model_fn returned {type(spec).__name__} in mode {mode!r}; "
                              "it must return fw.train.TPUEstimatorSpec(mode, ...)")
    if spec.training_hooks or spec.evaluation_hooks or spec.prediction_hooks:
        raise mf.ModelFnError("TPUEstimatorSpec hooks (SessionRunHooks) need a TF1 session; "
                              "give Keras callbacks to est.train(..., callbacks=[...])")
    if mode != ModeKeys.PREDICT and spec.loss is None:
        raise mf.ModelFnError(f"model_fn gave no loss in mode {mode!r}")
    if mode == ModeKeys.PREDICT and spec.predictions is None:
        raise mf.ModelFnError("model_fn gave no predictions in mode 'infer' (PREDICT)")
    if spec.eval_metric_ops is not None:
        raise mf.ModelFnError("eval_metric_ops is TF1's graph form; give "
                              "eval_metrics=(metric_fn, tensors)")
    if spec.host_call is not None:
        _warn_once("host_call", "TPUEstimatorSpec(host_call=...) has no effect and is "
                   "ignored: Fenwicks writes the loss as TensorBoard scalars every loop; "
                   "log other values with Keras callbacks (est.train(..., callbacks=[...]))")
    if spec.export_outputs is not None:
        _warn_once("export_outputs", "TPUEstimatorSpec(export_outputs=...) has no effect "
                   "and is ignored: export_saved_model serves the PREDICT predictions as "
                   "its serving_default signature")
    return spec


# --------------------------------------------------------------------------- the runner


class _ModelFnNet(keras.Model):
    """The Keras model the estimator trains: one call of the model_fn per call."""

    def __init__(self, runner: _Runner) -> None:
        super().__init__(name="model_fn")
        self._runner = runner

    @property
    def _default_save_signature(self) -> None:
        # Keras would trace one taking every input as input_dtype (labels as floats);
        # export_saved_model gives the serving signature itself.
        return None

    def call(self, inputs: Any, training: bool = False) -> Any:
        if tf.inside_function():
            return self._runner.outputs(inputs, bool(training))
        eager = self._runner.eager  # on the runner: Keras would track a dict here
        if bool(training) not in eager:  # the model_fn always runs as a graph
            eager[bool(training)] = tf.function(functools.partial(
                self._runner.outputs, training=bool(training)), autograph=False)
        return eager[bool(training)](inputs)


class _Serving(keras.Model):
    """The model_fn's PREDICT mode on plain features, for `export_saved_model`."""

    def __init__(self, net: _ModelFnNet) -> None:
        super().__init__(name="serving")
        self.net = net

    @property
    def _default_save_signature(self) -> None:
        # Keras would trace one taking every feature as float32 (an integer id fed to
        # tf.one_hot then fails); export_saved_model gives the serving signature itself.
        return None

    def call(self, features: Any, training: bool = False) -> Any:
        return self.net({"features": features}, training=False)


def _rows(features: Any) -> tf.Tensor:
    return tf.shape(tf.nest.flatten(features)[0])[0]


def _static_rows(features: Any) -> int | None:
    return tf.nest.flatten(features)[0].shape[0]


def _per_row(values: tf.Tensor, features: Any) -> tf.Tensor:
    """A metric term as one value per example row of the batch."""
    rows = _static_rows(features)
    length = values.shape[0] if values.shape.rank == 1 else None
    if values.shape.rank == 1 and rows is not None and length is not None and length != rows:
        # Not one value per example (squeezenet's lr_repeat has train_batch_size rows in
        # EVAL too): the batch's total goes on its first row, real unless the whole batch
        # is padding, so TF1's sum over every batch is kept.
        return tf.scatter_nd([[0]], [tf.reduce_sum(values)], [rows])
    return tf.broadcast_to(values, [_rows(features)])


def _zeros(spec: Any, batch: int) -> Any:
    return tf.nest.map_structure(
        lambda s: tf.zeros([batch] + s.shape.as_list()[1:], s.dtype), spec)


class _Runner:
    """Calls the model_fn for the net, and builds the `ModelSpec` from its first calls."""

    def __init__(self, front: TPUEstimator) -> None:
        self.front = front
        self.replay = mf.Replay()
        self.optimizer: Any = None
        self.metric_names: list[str] = []
        self.has_labels: dict[str, bool] = {}
        # mode -> (spec, record, metric names) of its latest call
        self.seen: dict[str, tuple[TPUEstimatorSpec, mf.CallRecord, list[str]]] = {}
        self.v1_learning_rate = False
        self.eager: dict[bool, Any] = {}  # the net's eager calls, as graph functions

    def _global_step(self) -> tf.Tensor:
        if self.optimizer is None:
            return tf.constant(0, tf.int64)
        return tf.cast(self.optimizer.iterations, tf.int64)

    @tf.autograph.experimental.do_not_convert
    def outputs(self, inputs: dict, training: bool) -> dict:
        mode = ModeKeys.TRAIN if training else (
            ModeKeys.EVAL if "labels" in inputs else ModeKeys.PREDICT)
        return self.run(inputs, mode)

    def run(self, inputs: dict, mode: str) -> dict:
        features = inputs["features"]
        known = self.has_labels.get(mode, any(self.has_labels.values()))
        # PREDICT: the predict input's labels, if it yields them (TPUEstimator gave None;
        # some model_fns compute their loss in every mode).
        labels = inputs.get("labels", inputs.get("predict_labels")) if known else None
        record = mf.CallRecord()
        self.replay.start(mode)
        with mf.tf1_scope(self.replay, record, self._global_step):
            spec = _check_spec(mf.call_user(
                self.front.model_fn, features, labels, mode,
                self.front.model_fn_params(mode, _static_rows(features)), self.front.config),
                mode)
            if spec.scaffold_fn is not None:
                mf.call_in_scope(spec.scaffold_fn)
            terms = self._metric_terms(spec) if mode == ModeKeys.EVAL else {}
        self.seen[mode] = (spec, record, list(terms))
        out: dict[str, Any] = {}
        if mode != ModeKeys.PREDICT:
            out["loss"] = self._per_example_loss(spec.loss, features, mode, record)
        if terms:
            out["metrics"] = {}
            for name, term in terms.items():
                out["metrics"][name + _NUM] = _per_row(term.numerator, features)
                out["metrics"][name + _DEN] = _per_row(term.denominator, features)
        if mode == ModeKeys.PREDICT:
            out["predictions"] = spec.predictions
        if mode == ModeKeys.TRAIN and self.v1_learning_rate and record.minimize is not None:
            # TF1 computed the rate from the global step in the graph: so does this step.
            self.optimizer.learning_rate.assign(
                tf.cast(record.minimize.learning_rate, tf.float32))
        return out

    @staticmethod
    def _per_example_loss(loss: Any, features: Any, mode: str,
                          record: mf.CallRecord) -> tf.Tensor:
        loss = tf.convert_to_tensor(loss)
        if loss.shape.rank == 0 and mode == ModeKeys.EVAL:
            # Exact evaluation needs each example's loss: a padded last batch's mean
            # would count its padding rows. The graph shows them for tf.compat.v1.losses
            # and reduce_mean(per_example_loss).
            values = mf.example_losses(loss, record.losses, _static_rows(features))
            if values is not None:
                return values
            _warn_once("eval_loss", "the model_fn's EVAL loss is a scalar whose "
                       "per-example values Fenwicks cannot see, so evaluate()'s 'loss' "
                       "counts a padded last batch's padding rows at that batch's mean: "
                       "compute it with tf.compat.v1.losses.* or "
                       "tf.reduce_mean(per_example_loss), or return the [batch] vector")
        loss = tf.cast(loss, tf.float32)
        if loss.shape.rank == 0:  # the batch mean: every example carries it
            return tf.fill([_rows(features)], loss)
        if loss.shape.rank == 1:
            return loss
        raise mf.ModelFnError(f"TPUEstimatorSpec loss has shape {loss.shape}; give a "
                              "scalar (the batch mean) or a per-example [batch] vector")

    def _metric_terms(self, spec: TPUEstimatorSpec) -> dict[str, mf.MetricTerm]:
        if spec.eval_metrics is None:
            return {}
        metric_fn, tensors = spec.eval_metrics
        results = (mf.call_in_scope(metric_fn, **tensors) if isinstance(tensors, dict)
                   else mf.call_in_scope(metric_fn, *tensors))
        terms = {}
        for name, value in dict(results).items():
            if isinstance(value, (tuple, list)) and value and isinstance(value[0],
                                                                         mf.MetricTerm):
                terms[name] = value[0]
            elif isinstance(getattr(value, "fenwicks_metric_term", None), mf.MetricTerm):
                terms[name] = value.fenwicks_metric_term
            else:
                raise mf.ModelFnError(
                    f"eval_metrics' metric_fn gave {name!r}: {value!r}; give "
                    "tf.compat.v1.metrics results (accuracy, mean, ...) or a Keras mean "
                    "metric after update_state (keras.metrics.SparseCategoricalAccuracy)")
        return terms

    # ---------------------------------------------------------------- building

    def build(self, params: dict) -> ModelSpec:
        """The engine's model_func: the first calls, the optimizer, warm start."""
        built_for = params["mode"]
        # A rebuild (model_dir emptied between calls) starts from new layers, as the
        # estimator's fresh initialisation does: nothing of the last build is handed back.
        self.replay, self.seen, self.optimizer, self.eager = mf.Replay(), {}, None, {}
        self.v1_learning_rate, self.metric_names = False, []
        spec = self.front.element_specs[built_for]
        features_spec = spec[0] if isinstance(spec, tuple) else spec
        self._first_calls(features_spec, built_for)
        self.replay.check_variants()
        self.replay.name_v1()
        if ModeKeys.EVAL in self.seen:
            self.metric_names = [name + part for name in self.seen[ModeKeys.EVAL][2]
                                 for part in (_NUM, _DEN)]
        self.optimizer = self._make_optimizer(built_for)
        if ModeKeys.TRAIN in self.seen:
            _record_optimizer(self.front.model_dir, self.optimizer)
        self.front.apply_warm_start(self.replay.variables(),
                                    [record for _, record, _ in self.seen.values()])
        net = _ModelFnNet(self)
        for index, layer in enumerate(self.replay.layers()):
            # One attribute each: TensorFlow's checkpoint graph does not see a plain list.
            setattr(net, f"model_fn_layer_{index}", layer)
        self.replay.recording = False
        inputs = _zeros(features_spec, self.front.batch_per_replica(built_for))
        net(inputs if built_for != "predict" else {"features": inputs["features"]})
        metric_fns = {name: (lambda y, out, n=name: out["metrics"][n])
                      for name in self.metric_names}
        return ModelSpec(net, self.optimizer, lambda y, out: out["loss"], metric_fns,
                         lambda out: out["predictions"], "mean")

    def _first_calls(self, features_spec: Any, built_for: str) -> None:
        """Calls the model_fn in each mode on zeros, recording the objects it creates;
        the TRAIN call's batch-norm updates are undone."""
        # Predict only: TRAIN too where it runs without labels (BERT's are features), so
        # the optimizer, and so the checkpoint's slots, are the trained model_dir's.
        modes = [ModeKeys.PREDICT, ModeKeys.TRAIN] if built_for == "predict" else [
            ModeKeys.EVAL, ModeKeys.PREDICT, ModeKeys.TRAIN]
        snapshot: list[tuple[Any, np.ndarray]] = []
        for mode in modes:
            if mode == ModeKeys.TRAIN:
                snapshot = [(v, v.numpy()) for v in self.replay.variables()]
            # Each mode at its own batch size: params['batch_size'] says it to the model_fn.
            call = _zeros(features_spec, self.front.batch_per_replica(_ENGINE_MODE_OF[mode]))
            if mode == ModeKeys.PREDICT and "labels" in call:
                call = {"features": call["features"], "predict_labels": call["labels"]}
            try:
                # A new function per call (only a first call may create variables); a
                # partial, not a lambda: TensorFlow counts a lambda's traces as retracing.
                tf.function(functools.partial(self.run, mode=mode), autograph=False)(call)
            except Exception:  # noqa: BLE001 - reported if predict is ever called
                if built_for == "predict" and mode == ModeKeys.TRAIN:
                    # No labels to train on: the optimizer recorded in model_dir is used.
                    logger.debug("fenwicks: model_fn's TRAIN needs labels", exc_info=True)
                    continue
                if mode != ModeKeys.PREDICT or built_for == "predict":
                    raise
                # TPUEstimator called the model_fn in PREDICT only for predict, and some
                # model_fns (squeezenet's) fail there: a later predict says why.
                logger.debug("fenwicks: model_fn fails in PREDICT mode", exc_info=True)
        for variable, value in snapshot:
            variable.assign(value)

    def _make_optimizer(self, built_for: str) -> Any:
        spec, record, _ = self.seen.get(ModeKeys.TRAIN, (None, None, None))
        if spec is not None and spec.optimizer is not None:
            optimizer = spec.optimizer
            if not isinstance(optimizer, keras.optimizers.Optimizer) and callable(optimizer):
                optimizer = optimizer()
            if not isinstance(optimizer, keras.optimizers.Optimizer):
                raise mf.ModelFnError(f"TPUEstimatorSpec optimizer={spec.optimizer!r} must "
                                      "be a Keras optimizer or a function returning one")
            return optimizer
        minimize = record.minimize if record is not None else None
        if minimize is not None:
            optimizer = mf.convert_v1_optimizer(minimize.optimizer, record.clip_norm)
            self.v1_learning_rate = not isinstance(minimize.learning_rate, (int, float))
            return optimizer
        if built_for == "train":
            raise mf.ModelFnError(
                "model_fn's TRAIN spec has no optimizer: give TPUEstimatorSpec(mode, "
                "loss=loss, optimizer=keras.optimizers.SGD(lr)) (or train_op=tf.compat.v1."
                "train.GradientDescentOptimizer(lr).minimize(loss, global_step))")
        # Predict only (the TRAIN spec unknown): the optimizer the model_dir was trained
        # with, so that its checkpoint's slots have somewhere to go; it never steps.
        return _recorded_optimizer(self.front.model_dir) or keras.optimizers.SGD()


# --------------------------------------------------------------------------- the front door


class TPUEstimator:
    """TPUEstimator's constructor and methods on the Fenwicks `Estimator`.

    Args:
        model_fn: ``model_fn(features, labels, mode, params)`` (``labels``, ``mode``,
            ``params`` and ``config`` optional, by name) returning a `TPUEstimatorSpec`.
        model_dir: checkpoints and logs; the run resumes from here. Defaults to
            ``config.model_dir``, else a new temporary directory (with a warning).
        config: a `RunConfig`. Defaults to ``RunConfig()``.
        params: a dict given to every input_fn and model_fn, beside ``'batch_size'``
            (the current mode's: per replica for the training input_fn and the model_fn,
            per host for evaluation and prediction input_fns, as TPUEstimator gave
            them), ``'num_shards'`` and ``'num_replicas'``
            (the replica count), ``'use_tpu'`` and Fenwicks' own keys
            (`fenwicks.train.inputs.make_params`).
        use_tpu, eval_on_tpu, export_to_tpu, export_to_cpu, batch_axis: accepted; the
            accelerator is `fw.accel`'s (``fw.accel.configure`` chooses another), and a
            ``use_tpu`` that says otherwise gives a warning, once.
        train_batch_size: global training batch size. Defaults to 128.
        eval_batch_size: global evaluation batch size. Defaults to `train_batch_size`.
        predict_batch_size: global prediction batch size. Defaults to `eval_batch_size`.
        warm_start_from: a checkpoint or directory (every variable whose checkpoint name
            and shape match), or `WarmStartSettings` (by variable name, with renames).
        labels_key: for inputs whose features dict holds the labels (BERT's
            ``'label_ids'``): the model_fn gets ``features[labels_key]`` as ``labels``
            (the key stays in the features). Defaults to None.
        steps_per_epoch: steps per epoch, for epoch logs and callbacks. Defaults to
            ``iterations_per_loop``.
        precision: as `get_tpu_estimator`'s. Defaults to ``'auto'``.
        verbose: show a progress bar. Defaults to True.

    Example:
        >>> est = fw.train.TPUEstimator(model_fn=model_fn, config=fw.train.RunConfig(
        ...     model_dir=d, tpu_config=fw.train.TPUConfig(100)), train_batch_size=1024,
        ...     params={'data_dir': data_dir})
        >>> est.train(train_input_fn, max_steps=1000)
    """

    def __init__(self, model_fn: Callable[..., TPUEstimatorSpec], model_dir: str | None = None,
                 config: RunConfig | None = None, params: Mapping[str, Any] | None = None,
                 use_tpu: bool = True, train_batch_size: int | None = None,
                 eval_batch_size: int | None = None, predict_batch_size: int | None = None,
                 batch_axis: Any = None, eval_on_tpu: bool = True,
                 export_to_tpu: bool = True, export_to_cpu: bool = True,
                 warm_start_from: str | WarmStartSettings | None = None,
                 embedding_config_spec: Any = None,
                 export_saved_model_api_version: Any = None, *,
                 labels_key: str | None = None, steps_per_epoch: int | None = None,
                 precision: str = "auto", verbose: bool = True) -> None:
        if not callable(model_fn):
            raise ValueError(f"model_fn={model_fn!r} must be callable (features, labels, "
                             "mode, params) -> fw.train.TPUEstimatorSpec")
        if embedding_config_spec is not None:
            raise ValueError("embedding_config_spec (TPU embeddings) has no counterpart in "
                             "Fenwicks; use keras.layers.Embedding in the model_fn")
        _check_engine()
        self.model_fn = model_fn
        self.config = config if config is not None else RunConfig()
        if not isinstance(self.config, RunConfig):
            raise ValueError(f"config={config!r} must be fw.train.RunConfig(...)")
        self.model_dir = model_dir or self.config.model_dir or _temporary_model_dir()
        params = dict(params or {})
        if "batch_size" in params:
            raise ValueError(f"params['batch_size']={params['batch_size']!r}: give "
                             "train_batch_size= (global), as TPUEstimator required")
        self.params = params
        self.use_tpu = bool(use_tpu)
        self.train_batch_size = 128 if train_batch_size is None else train_batch_size
        self.eval_batch_size = eval_batch_size or self.train_batch_size
        self.predict_batch_size = predict_batch_size or self.eval_batch_size
        self.labels_key = labels_key
        self.warm_start_from = warm_start_from
        self.warm_start_report: dict[str, list[str]] | None = None
        self.element_specs: dict[str, Any] = {}
        self._steps_per_epoch = steps_per_epoch
        self._precision = precision
        self._verbose = verbose
        self._est: Estimator | None = None
        self._built_for: str | None = None
        self._runner: _Runner | None = None
        self._check_shards()
        self._check_device(use_tpu, eval_on_tpu)

    def _check_shards(self) -> None:
        wanted = self.config.tpu_config.num_shards or self.params.get("num_shards")
        replicas = accel.current().num_replicas
        if wanted is not None and wanted != replicas:
            logger.warning("fenwicks: num_shards=%d asked for, but %d replica(s) are "
                           "available: training runs on %d, and params['num_shards'] says "
                           "so (batch sizes are global, so the update is the same)",
                           wanted, replicas, replicas)

    def _check_device(self, use_tpu: bool, eval_on_tpu: bool) -> None:
        """use_tpu and eval_on_tpu choose nothing here: say so when the run differs."""
        kind = accel.current().kind
        if bool(use_tpu) != (kind == "tpu"):
            _warn_once("use_tpu", f"use_tpu={use_tpu!r} has no effect: this runs on the "
                       f"{kind}, which {_DEVICE_WHY}")
        if use_tpu and not eval_on_tpu and kind == "tpu":
            _warn_once("eval_on_tpu", "eval_on_tpu=False has no effect: evaluation runs "
                       "on the TPU, exact on any batch size")
        evidence = accel.tpu_host_evidence() if kind != "tpu" else []
        if evidence:
            _warn_once("tpu_host", f"this is a TPU host ({', '.join(evidence[:2])}) whose "
                       "TensorFlow cannot reach the TPU, so fw.train.TPUEstimator trains on "
                       "the host CPU; to train on the TPU, write the model as a Keras "
                       "model_func (tutorials/PORTING.md, 'TPUEstimator programs on the jax "
                       "engine') and run it in a new Python process that imports fenwicks "
                       "before TensorFlow, without FENWICKS_ENGINE=tf, so the jax engine "
                       "is chosen")

    # ---------------------------------------------------------------- the engine

    @property
    def num_replicas(self) -> int:
        return accel.current().num_replicas

    def batch_per_replica(self, mode: str) -> int:
        size = {"train": self.train_batch_size, "eval": self.eval_batch_size,
                "predict": self.predict_batch_size}[mode]
        return size // self.num_replicas

    def model_fn_params(self, mode: str, rows: int | None = None) -> dict[str, Any]:
        """The model_fn's params; ``'batch_size'`` is the rows of the batch it gets (the
        mode's per-replica batch, or fewer in the estimator's eager label check)."""
        batch = rows or self.batch_per_replica(_ENGINE_MODE_OF[mode])
        # num_shards is the replicas there are (a program's own value, squeezenet's 8, is
        # replaced: num_shards * batch_size must stay the global batch).
        return {"use_tpu": self.use_tpu, **self.params, "batch_size": batch,
                "num_shards": self.num_replicas, "num_replicas": self.num_replicas}

    def _estimator(self, mode: str) -> Estimator:
        """The Fenwicks estimator; one built for predict only is replaced for training
        or evaluation (it has no optimizer slots or metrics)."""
        if self._est is not None and self._built_for == "predict" and mode != "predict":
            self._est.close()
            self._est = None
        if self._est is None:
            tpu = self.config.tpu_config
            loops = None
            if self.config.save_checkpoints_steps:
                loops = max(1, math.ceil(self.config.save_checkpoints_steps
                                         / tpu.iterations_per_loop))
            secs = self.config.save_checkpoints_secs
            if secs is None and loops is None:
                secs = 600.0
            warm = self.warm_start_from
            self._runner = _Runner(self)
            self._built_for = None
            self._est = get_tpu_estimator(
                self._steps_per_epoch or tpu.iterations_per_loop, self._model_func,
                self.model_dir, trn_bs=self.train_batch_size, val_bs=self.eval_batch_size,
                pred_bs=self.predict_batch_size, steps_per_loop=tpu.iterations_per_loop,
                precision=self._precision, seed=self.config.tf_random_seed,
                warm_start_from=warm if isinstance(warm, str) else None,
                save_every_secs=secs, save_every_loops=loops,
                keep_checkpoints=self.config.keep_checkpoint_max, verbose=self._verbose)
        return self._est

    def _model_func(self, params: dict) -> ModelSpec:
        self._built_for = params["mode"]
        return self._runner.build(params)

    def apply_warm_start(self, variables: list[Any], records: list[mf.CallRecord]) -> None:
        """`WarmStartSettings` and the model_fn's ``init_from_checkpoint`` calls; the
        engine's restore then replaces them if model_dir has a checkpoint."""
        report: dict[str, list[str]] = {"loaded": [], "not_loaded": []}
        sources: list[tuple[str, Any]] = []
        if isinstance(self.warm_start_from, WarmStartSettings):
            settings = self.warm_start_from
            sources.append((settings.ckpt_to_initialize_from, assignment_map.settings_map(
                variables, settings.vars_to_warm_start, settings.var_name_to_prev_var_name)))
        seen = set()
        for record in records:
            for source, mapping in record.init_from_checkpoint:
                key = (source, tuple(sorted((k, str(v)) for k, v in mapping.items())))
                if key not in seen:
                    seen.add(key)
                    sources.append((source, mapping))
        restored = tf.train.latest_checkpoint(self.model_dir) if sources else None
        if restored is not None:
            # The engine restores model_dir's own checkpoint over any warm start.
            self.warm_start_report = {"loaded": [], "not_loaded": [],
                                      "restored_instead": [restored]}
            logger.info("fenwicks: warm start not applied: model_dir holds %s, restored "
                        "instead", restored)
            return
        for source, mapping in sources:
            part = assignment_map.warm_start(variables, source, mapping)
            report["loaded"] += part["loaded"]
            report["not_loaded"] += part["not_loaded"]
        if sources:
            self.warm_start_report = report
            logger.info("fenwicks: warm start loaded %d variable(s), not %s",
                        len(report["loaded"]), report["not_loaded"] or "none")

    def _wrap(self, input_fn: Callable[..., Any], mode: str) -> Callable[[dict], Any]:
        """The input_fn as the engine calls it: TPUEstimator's params in, and each
        element as ``({'features', 'labels'}, labels)`` (predict: ``{'features'}``)."""
        def wrapped(params: dict) -> tf.data.Dataset:
            full = {"use_tpu": self.use_tpu, **self.params, **params,
                    "num_shards": params["num_replicas"]}
            per_replica = params["batch_size"]
            if mode != "train":
                # TPUEstimator gave evaluation and prediction input_fns the per-host batch
                # and split it between the cores: a drop_remainder=True input then keeps
                # the same examples as it did there.
                full["batch_size"] = params["global_batch_size"] // _pipelines(params)
            dataset = _dataset_of(input_fn, full, self.config, _ENGINE_MODE[mode], mode)
            if full["batch_size"] != per_replica:
                dataset = dataset.rebatch(per_replica)
            return dataset.map(self._splitter(dataset.element_spec, mode))

        return wrapped

    def _splitter(self, element_spec: Any, mode: str) -> Callable[..., Any]:
        pair = isinstance(element_spec, tuple) and len(element_spec) == 2
        if not pair and not isinstance(element_spec, (dict, tf.TensorSpec)):
            raise ValueError(f"the {mode} input_fn yields {element_spec}; yield features "
                             "or (features, labels)")
        features_spec = element_spec[0] if pair else element_spec
        in_features = isinstance(features_spec, dict) and self.labels_key in features_spec
        if self.labels_key is not None and not pair and not in_features and mode != "predict":
            raise ValueError(f"labels_key={self.labels_key!r} is not a key of the {mode} "
                             f"input's features ({_keys(features_spec)})")
        has_labels = pair or in_features
        self._runner_has_labels(mode, has_labels)

        def split(*element: Any) -> Any:
            features = element[0]
            labels = element[1] if pair else None
            if labels is None and in_features:
                labels = features[self.labels_key]
            if mode == "predict":
                if labels is None:
                    return {"features": features}
                return {"features": features, "predict_labels": labels}
            engine_labels = labels if labels is not None else tf.zeros([_rows(features)],
                                                                        tf.int32)
            return {"features": features, "labels": engine_labels}, engine_labels

        return split

    def _runner_has_labels(self, mode: str, has_labels: bool) -> None:
        if self._runner is not None:
            self._runner.has_labels[_ENGINE_MODE[mode]] = has_labels

    def _wrapped(self, input_fn: Callable[..., Any], mode: str) -> Callable[[dict], Any]:
        engine_fn = self._wrap(input_fn, mode)

        def recorded(params: dict) -> tf.data.Dataset:
            dataset = engine_fn(params)
            self.element_specs[mode] = dataset.element_spec
            return dataset

        return recorded

    # ---------------------------------------------------------------- TPUEstimator's API

    def train(self, input_fn: Callable[..., Any], hooks: Any = None, steps: int | None = None,
              max_steps: int | None = None, saving_listeners: Any = None, *,
              callbacks: Sequence[keras.callbacks.Callback] | None = None) -> TPUEstimator:
        """Trains `steps` more steps, or up to global step `max_steps`; resumes from
        model_dir. ``hooks``/``saving_listeners`` have no counterpart: use ``callbacks``.

        Example:
            >>> est.train(train_input_fn, max_steps=1000)
        """
        _no_hooks(hooks, saving_listeners)
        est = self._estimator("train")
        est.train(self._wrapped(input_fn, "train"), steps=steps, max_steps=max_steps,
                  callbacks=callbacks)
        return self

    def evaluate(self, input_fn: Callable[..., Any], steps: int | None = None,
                 hooks: Any = None, checkpoint_path: str | None = None,
                 name: str | None = None) -> dict[str, Any]:
        """Loss and eval_metrics over every example (or the first `steps` batches).

        Returns:
            ``{'loss', <each metric>, 'global_step', 'num_examples'}``; each metric is
            exact: its per-example sums over every example, padding rows of the last
            batch left out.

        Example:
            >>> est.evaluate(eval_input_fn)['accuracy']
        """
        _no_hooks(hooks, None)
        _no_checkpoint_path(checkpoint_path)
        if name is not None:
            _warn_once("evaluate.name", f"evaluate(name={name!r}) has no effect: Fenwicks "
                       "keeps one evaluation history in model_dir; keep the returned dict "
                       "to tell evaluations apart")
        result = self._estimator("eval").evaluate(self._wrapped(input_fn, "eval"), steps)
        return _finish_metrics(result)

    def predict(self, input_fn: Callable[..., Any], predict_keys: Sequence[str] | None = None,
                hooks: Any = None, checkpoint_path: str | None = None,
                yield_single_examples: bool = True) -> Iterator[Any]:
        """Yields one prediction per example (a dict if the model_fn's predictions are a
        dict), in input order; with ``yield_single_examples=False``, batches of
        ``predict_batch_size``.

        Example:
            >>> for pred in est.predict(predict_input_fn):
            ...     print(pred['class_ids'], pred['probabilities'])
        """
        _no_hooks(hooks, None)
        _no_checkpoint_path(checkpoint_path)
        predictions = tf.nest.map_structure(  # plain arrays, as TPUEstimator yielded
            lambda a: np.asarray(a).view(np.ndarray),
            self._estimator("predict").predict(self._wrapped(input_fn, "predict")))
        if isinstance(predictions, dict) and predict_keys is not None:
            missing = set(predict_keys) - set(predictions)
            if missing:
                raise ValueError(f"predict_keys={list(predict_keys)}: {sorted(missing)} are "
                                 f"not among the predictions {sorted(predictions)}")
            predictions = {key: predictions[key] for key in predict_keys}
        rows = len(tf.nest.flatten(predictions)[0])
        step = 1 if yield_single_examples else self.predict_batch_size
        for start in range(0, rows, step):
            part = tf.nest.map_structure(
                lambda a, s=start: a[s] if yield_single_examples else a[s:s + step],
                predictions)
            yield part

    def export_saved_model(self, export_dir_base: str,
                           serving_input_receiver_fn: Any = None, **unused: Any) -> str:
        """Writes a SavedModel of the PREDICT-mode predictions to `export_dir_base`; its
        ``serve(features)`` takes a batch of features as the predict input_fn yields them.
        ``serving_input_receiver_fn`` and the other TPUEstimator keywords are accepted
        with a warning, once, that they have no effect.

        Example:
            >>> tf.saved_model.load(est.export_saved_model('/tmp/m')).serve(images)
        """
        from fenwicks.train import export_dirs
        from fenwicks.train.tf import export
        if serving_input_receiver_fn is not None:
            _warn_once("serving_input_receiver_fn", "export_saved_model("
                       "serving_input_receiver_fn=...) has no effect: the SavedModel's "
                       "serve(features) takes a batch of the features the input_fns yield "
                       "(parse serialized tf.Examples before calling it)")
        for name in sorted(unused):
            _warn_once(f"export.{name}", f"export_saved_model({name}=...) has no effect "
                       "and is ignored: the export is the latest checkpoint's PREDICT mode "
                       "as one serving_default signature")
        est = self._estimator(self._built_for or "predict")
        spec = est.parts.state.spec  # raises the "built on first use" error before any call
        features_spec = est.parts.state.features_spec["features"]
        serving = dataclasses.replace(spec, model=_Serving(spec.model))
        return export_dirs.write(export_dir_base, lambda folder: export.export_saved_model(
            serving, features_spec, folder))

    @property
    def estimator(self) -> Estimator:
        """The Fenwicks `Estimator` underneath (history, callbacks, check_input)."""
        return self._estimator(self._built_for or "train")

    def get_variable_names(self) -> list[str]:
        """Names of the model's variables (Keras paths), for warm-start maps."""
        if self._runner is None:
            return []
        return [assignment_map.current_name(v) for v in self._runner.replay.variables()]

    def close(self) -> None:
        if self._est is not None:
            self._est.close()

    def __enter__(self) -> TPUEstimator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_OPTIMIZER_RECORD = "fenwicks_tpu_estimator_optimizer.json"


def _record_optimizer(model_dir: str, optimizer: Any) -> None:
    """Writes the optimizer's Keras config into model_dir, for a later predict-only
    TPUEstimator (which never calls the model_fn in TRAIN) to rebuild its slots."""
    import json

    if isinstance(optimizer, mf.V1OptimizerAdapter):
        return  # it runs a TF1 object's code: only the model_fn's TRAIN call makes it
    try:
        config = keras.optimizers.serialize(optimizer)
        text = json.dumps(config, default=lambda value: None)
    except (TypeError, ValueError):  # a custom optimizer: predict-only cannot rebuild it
        return
    tf.io.gfile.makedirs(model_dir)
    with tf.io.gfile.GFile(f"{model_dir}/{_OPTIMIZER_RECORD}", "w") as f:
        f.write(text)


def _recorded_optimizer(model_dir: str) -> Any:
    import json

    path = f"{model_dir}/{_OPTIMIZER_RECORD}"
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        config = json.loads(f.read())
    try:
        optimizer = keras.optimizers.deserialize(config)
    except Exception:  # noqa: BLE001 - any failure means: not rebuilt, said below
        optimizer = None
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        logger.warning("fenwicks: could not rebuild the optimizer recorded in %s; "
                       "predicting only may not match the checkpoint's slots", path)
        return None
    return optimizer


def _keys(spec: Any) -> str:
    return f"keys {sorted(spec)}" if isinstance(spec, dict) else "not a dict"


def _finish_metrics(result: dict[str, Any]) -> dict[str, Any]:
    """The ratios of each metric's numerator and denominator columns."""
    out = {k: v for k, v in result.items() if not k.endswith((_NUM, _DEN))}
    for key in result:
        if key.endswith(_NUM):
            name = key[:-len(_NUM)]
            den = result[name + _DEN]
            value = result[key] / den if den else float("nan")
            out[name] = value
    return out


def _no_hooks(hooks: Any, listeners: Any) -> None:
    if hooks or listeners:
        raise TypeError("hooks and saving_listeners are TF1 SessionRunHooks, which need a "
                        "TF1 session; pass Keras callbacks: est.train(..., callbacks=[...])")


def _no_checkpoint_path(checkpoint_path: str | None) -> None:
    if checkpoint_path is not None:
        raise TypeError(f"checkpoint_path={checkpoint_path!r}: Fenwicks evaluates and "
                        "predicts with the latest checkpoint of model_dir; make a "
                        "TPUEstimator on that checkpoint's directory")


def _pipelines(params: dict) -> int:
    context = params.get("input_context")
    return context.num_input_pipelines if context is not None else 1


class _Captured(Exception):  # noqa: N818 - control flow, never seen by a user
    def __init__(self, dataset: tf.data.Dataset) -> None:
        super().__init__("make_one_shot_iterator")
        self.dataset = dataset


class _OneShotIterator:
    """Stands in for ``make_one_shot_iterator(dataset)`` while an input_fn runs: the first
    call captures the dataset; the per-element call gets the element from get_next()."""

    def __init__(self, dataset: tf.data.Dataset, element: Any) -> None:
        self.dataset, self.element = dataset, element

    def get_next(self, name: str | None = None) -> Any:
        if self.element is None:
            raise _Captured(self.dataset)
        return self.element


def _dataset_of(input_fn: Callable[..., Any], params: dict, config: RunConfig, mode: str,
                what: str) -> tf.data.Dataset:
    """The input_fn's dataset. One returning ``make_one_shot_iterator(ds).get_next()``
    tensors (squeezenet's InputReader) becomes ``ds.map(<the input_fn on each element>)``:
    the code after get_next() (casts, set_shape) runs on every element, as TF1 ran it."""
    element: list[Any] = [None]

    def make(dataset: Any, *args: Any, **kwargs: Any) -> _OneShotIterator:
        return _OneShotIterator(dataset, element[0])

    @contextlib.contextmanager
    def one_shot() -> Iterator[None]:
        with mf.patched(tf.compat.v1.data, "make_one_shot_iterator", make), \
                mf.patched(tf.compat.v1.data.Dataset, "make_one_shot_iterator", make):
            yield

    try:
        with one_shot():
            result = _call_input_fn(input_fn, params, config, mode)
    except _Captured as captured:
        def per_element(*values: Any) -> Any:
            element[0] = values[0] if len(values) == 1 else values
            return _call_input_fn(input_fn, params, config, mode)

        with one_shot():  # the map function is traced here
            return captured.dataset.map(per_element)
    if not isinstance(result, tf.data.Dataset):
        raise ValueError(
            f"the {what} input_fn returned {type(result).__name__}; return a "
            "tf.data.Dataset, or make_one_shot_iterator(dataset).get_next() of one")
    return result


def _call_input_fn(input_fn: Callable[..., Any], params: dict, config: RunConfig,
                   mode: str) -> Any:
    """Calls an input_fn as TPUEstimator did: ``params`` (by name, or its one
    positional argument), and ``config``/``mode`` if it names them."""
    try:
        names = list(inspect.signature(input_fn).parameters)
    except (TypeError, ValueError):
        return input_fn(params)
    kwargs = {name: value for name, value in (("config", config), ("mode", mode))
              if name in names}
    if "params" in names:
        return input_fn(params=params, **kwargs)
    if [name for name in names if name not in kwargs]:
        return input_fn(params, **kwargs)
    return input_fn(**kwargs)


def _check_engine() -> None:
    """A TF1 model_fn runs on engines that can run TensorFlow graphs; the others say so
    in one sentence, before any work (`Engine.tf1_model_fn_refusal`)."""
    refusal = engines.current().tf1_model_fn_refusal()
    if refusal:
        raise ValueError(refusal)


def _temporary_model_dir() -> str:
    path = tempfile.mkdtemp(prefix="fenwicks_model_dir_")
    logger.warning("fenwicks: no model_dir given; using the temporary %s", path)
    return path
