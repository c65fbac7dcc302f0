"""The model_fn runner: a TPUEstimator ``model_fn`` as the Keras model the engine trains.

`Runner.build` is the estimator's model_func. It calls the model_fn once per mode on
zeros (`fenwicks.train.tf._model_fn` records the Keras objects it makes), makes the
optimizer the TRAIN spec asks for, applies warm starts, and returns a `ModelSpec` whose
model (`ModelFnNet`) calls the model_fn again in every step: the loss and metric terms
come out one value per example, so evaluation is exact.

Examples:
    >>> from fenwicks.train.inputs import make_params
    >>> from fenwicks.train.tf.input_fns import engine_input_fn
    >>> def model_fn(features, labels, mode, params):
    ...     logits = keras.layers.Dense(2, kernel_initializer='zeros')(features)
    ...     if mode == fw.train.ModeKeys.PREDICT:
    ...         return fw.train.TPUEstimatorSpec(mode, predictions=tf.argmax(logits, -1))
    ...     loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    ...     return fw.train.TPUEstimatorSpec(mode, loss=loss,
    ...                                      optimizer=keras.optimizers.SGD(0.1))
    >>> front = fw.train.TPUEstimator(model_fn, model_dir='run', train_batch_size=4,
    ...                               verbose=False)
    >>> front.runner = runner = Runner(front)   # as the front makes it
    >>> x, y = np.ones((4, 3), 'float32'), np.array([0, 1, 0, 1])
    >>> train_input_fn = lambda params: tf.data.Dataset.from_tensor_slices(
    ...     (x, y)).repeat().batch(params['batch_size'], drop_remainder=True)
    >>> params = make_params('train', 4, 1, seed=None, precision='float32', steps_per_epoch=1)
    >>> _ = engine_input_fn(front, train_input_fn, 'train')(params)   # the element spec
    >>> spec = runner.build(params)   # the estimator's model_func
    >>> spec.model({'features': x, 'labels': y}, training=True)['loss'].numpy()  # ln 2 each
    array([0.6931472, 0.6931472, 0.6931472, 0.6931472], dtype=float32)
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from fenwicks.train.model_func import ModelSpec
from fenwicks.train.tf import _model_fn as mf
from fenwicks.train.tf.tf1_config import (
    ENGINE_MODE_OF,
    ModeKeys,
    ModelFnError,
    TPUEstimatorSpec,
    check_spec,
    warn_once,
)
from fenwicks.train.tf.tf1_gradients import gradient_surrogate
from fenwicks.train.tf.tf1_metrics import MetricTerm, example_losses
from fenwicks.train.tf.tf1_optimizers import (
    V1OptimizerAdapter,
    V1SlotsOnly,
    convert_v1_optimizer,
)

logger = logging.getLogger("fenwicks")

NUM, DEN = "#num", "#den"  # a metric's numerator and denominator columns


class ModelFnNet(keras.Model):
    """The Keras model the estimator trains: one call of the model_fn per call."""

    def __init__(self, runner: Runner) -> None:
        super().__init__(name="model_fn")
        self._runner = runner

    @property
    def _default_save_signature(self) -> None:
        # Keras would trace one taking every input as input_dtype (labels as floats);
        # export_saved_model gives the serving signature itself.
        return None

    @property
    def losses(self) -> list[Any]:
        # TF1's rule: a model_fn's loss is what it returns. TF1 put layer regularisers
        # in the REGULARIZATION_LOSSES collection, and only a program that added
        # tf.losses.get_regularization_loss() (or get_total_loss()) trained with them;
        # the engine, which adds a Keras model's losses, must add none here
        # (`Replay.regularization_losses` gives them to the model_fn that asks).
        return []

    def call(self, inputs: Any, training: bool = False) -> Any:
        if tf.inside_function():
            return self._runner.outputs(inputs, bool(training))
        eager = self._runner.eager  # on the runner: Keras would track a dict here
        if bool(training) not in eager:  # the model_fn always runs as a graph
            eager[bool(training)] = tf.function(functools.partial(
                self._runner.outputs, training=bool(training)), autograph=False)
        return eager[bool(training)](inputs)


class Serving(keras.Model):
    """The model_fn's PREDICT mode on plain features, for `export_saved_model`."""

    def __init__(self, net: ModelFnNet) -> None:
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


SCAFFOLD_INIT_FN = (
    "scaffold_fn returned tf.compat.v1.train.Scaffold({field}=...), which TF1 ran in its "
    "session before the first step and which has no session to run in here, so it would "
    "silently never run: warm-start with tf.compat.v1.train.init_from_checkpoint(ckpt, "
    "assignment_map) inside scaffold_fn (BERT's way), or with TPUEstimator("
    "warm_start_from=ckpt), and return tf.compat.v1.train.Scaffold() or nothing")


def _check_scaffold(scaffold: Any) -> None:
    """A Scaffold whose init_fn or init_op would never run is refused in one sentence."""
    if not isinstance(scaffold, tf.compat.v1.train.Scaffold):
        return
    for field in ("init_fn", "init_op", "local_init_op", "ready_op", "saver"):
        if getattr(scaffold, field, None) is not None:
            raise ModelFnError(SCAFFOLD_INIT_FN.format(field=field))


def _zeros(spec: Any, batch: int) -> Any:
    return tf.nest.map_structure(
        lambda s: tf.zeros([batch] + s.shape.as_list()[1:], s.dtype), spec)


class Runner:
    """Calls the model_fn for the net, and builds the `ModelSpec` from its first calls."""

    def __init__(self, front: Any) -> None:
        self.front = front
        self.replay = mf.Replay()
        self.optimizer: Any = None
        self.metric_names: list[str] = []
        self.has_labels: dict[str, bool] = {}
        # mode -> (spec, record, metric names) of its latest call
        self.seen: dict[str, tuple[TPUEstimatorSpec, mf.CallRecord, list[str]]] = {}
        self.v1_learning_rate = False
        self.eager: dict[bool, Any] = {}  # the net's eager calls, as graph functions
        self.predict_error: Exception | None = None  # the PREDICT first call's, if it failed

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
        with mf.tf1_scope(self.replay, record, self._global_step, self.front.num_replicas):
            spec = check_spec(mf.call_user(
                self.front.model_fn, features, labels, mode,
                self.front.model_fn_params(mode, _static_rows(features)), self.front.config),
                mode)
            if spec.scaffold_fn is not None:
                _check_scaffold(mf.call_in_scope(spec.scaffold_fn))
            terms = self._metric_terms(spec) if mode == ModeKeys.EVAL else {}
        self.seen[mode] = (spec, record, list(terms))
        out: dict[str, Any] = {}
        if mode != ModeKeys.PREDICT:
            out["loss"] = self._per_example_loss(spec.loss, features, mode, record)
        if mode == ModeKeys.TRAIN and record.applied is not None:
            # What the model_fn gave apply_gradients is what trains (tf1_gradients).
            out["loss"] = gradient_surrogate(
                out["loss"], record.applied,
                [v for v in self.replay.variables() if v.trainable],
                self.front.train_batch_size, self.front.num_replicas)
        if terms:
            out["metrics"] = {}
            for name, term in terms.items():
                out["metrics"][name + NUM] = _per_row(term.numerator, features)
                out["metrics"][name + DEN] = _per_row(term.denominator, features)
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
            values = example_losses(loss, record.losses, _static_rows(features),
                                    record.regularization)
            if values is not None:
                return values
            warn_once("eval_loss", "the model_fn's EVAL loss is a scalar whose "
                       "per-example values Fenwicks cannot see, so evaluate()'s 'loss' "
                       "counts a padded last batch's padding rows at that batch's mean: "
                       "compute it with tf.compat.v1.losses.* or "
                       "tf.reduce_mean(per_example_loss), or return the [batch] vector")
        loss = tf.cast(loss, tf.float32)
        if loss.shape.rank == 0:  # the batch mean: every example carries it
            return tf.fill([_rows(features)], loss)
        if loss.shape.rank == 1:
            return loss
        raise ModelFnError(f"TPUEstimatorSpec loss has shape {loss.shape}; give a "
                              "scalar (the batch mean) or a per-example [batch] vector")

    def _metric_terms(self, spec: TPUEstimatorSpec) -> dict[str, MetricTerm]:
        if spec.eval_metrics is None:
            return {}
        metric_fn, tensors = spec.eval_metrics
        results = (mf.call_in_scope(metric_fn, **tensors) if isinstance(tensors, dict)
                   else mf.call_in_scope(metric_fn, *tensors))
        terms = {}
        for name, value in dict(results).items():
            if isinstance(value, (tuple, list)) and value and isinstance(value[0],
                                                                         MetricTerm):
                terms[name] = value[0]
            elif isinstance(getattr(value, "fenwicks_metric_term", None), MetricTerm):
                terms[name] = value.fenwicks_metric_term
            else:
                raise ModelFnError(
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
        self.predict_error = None
        spec = self.front.element_specs[built_for]
        features_spec = spec[0] if isinstance(spec, tuple) else spec
        self._first_calls(features_spec, built_for)
        self.replay.check_variants()
        self.replay.name_v1()
        if ModeKeys.EVAL in self.seen:
            self.metric_names = [name + part for name in self.seen[ModeKeys.EVAL][2]
                                 for part in (NUM, DEN)]
        self.optimizer = self._make_optimizer(built_for)
        if ModeKeys.TRAIN in self.seen:
            record_optimizer(self.front.model_dir, self.optimizer)
        self.front.apply_warm_start(self.replay.variables(),
                                    [record for _, record, _ in self.seen.values()])
        net = ModelFnNet(self)
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
            call = _zeros(features_spec, self.front.batch_per_replica(ENGINE_MODE_OF[mode]))
            if mode == ModeKeys.PREDICT and "labels" in call:
                call = {"features": call["features"], "predict_labels": call["labels"]}
            try:
                # A new function per call (only a first call may create variables); a
                # partial, not a lambda: TensorFlow counts a lambda's traces as retracing.
                tf.function(functools.partial(self.run, mode=mode), autograph=False)(call)
            except Exception as error:  # noqa: BLE001 - reported if predict is ever called
                if built_for != "train" and mode == ModeKeys.TRAIN:
                    # Evaluating or predicting only (BERT's --do_eval alone: its TRAIN
                    # needs num_train_steps): TPUEstimator never called TRAIN there, and
                    # the optimizer recorded in model_dir gives the checkpoint's slots.
                    logger.debug("fenwicks: model_fn's TRAIN fails", exc_info=True)
                    continue
                if mode != ModeKeys.PREDICT or built_for == "predict":
                    raise
                # TPUEstimator called the model_fn in PREDICT only for predict, and some
                # model_fns (squeezenet's) fail there: predict() raises this error.
                logger.debug("fenwicks: model_fn fails in PREDICT mode", exc_info=True)
                self.predict_error = error
        for variable, value in snapshot:
            variable.assign(value)

    def _make_optimizer(self, built_for: str) -> Any:
        spec, record, _ = self.seen.get(ModeKeys.TRAIN, (None, None, None))
        if spec is not None and spec.optimizer is not None:
            optimizer = spec.optimizer
            if not isinstance(optimizer, keras.optimizers.Optimizer) and callable(optimizer):
                optimizer = optimizer()
            if not isinstance(optimizer, keras.optimizers.Optimizer):
                raise ModelFnError(f"TPUEstimatorSpec optimizer={spec.optimizer!r} must "
                                      "be a Keras optimizer or a function returning one")
            return optimizer
        minimize = record.minimize if record is not None else None
        if minimize is not None:
            optimizer = convert_v1_optimizer(minimize.optimizer)
            self.v1_learning_rate = not isinstance(minimize.learning_rate, (int, float))
            return optimizer
        if built_for == "train":
            raise ModelFnError(
                "model_fn's TRAIN spec has no optimizer: give TPUEstimatorSpec(mode, "
                "loss=loss, optimizer=keras.optimizers.SGD(lr)) (or train_op=tf.compat.v1."
                "train.GradientDescentOptimizer(lr).minimize(loss, global_step))")
        # Predict only (the TRAIN spec unknown): the optimizer the model_dir was trained
        # with, so that its checkpoint's slots have somewhere to go; it never steps.
        return recorded_optimizer(self.front.model_dir) or keras.optimizers.SGD()


_OPTIMIZER_RECORD = "fenwicks_tpu_estimator_optimizer.json"


def record_optimizer(model_dir: str, optimizer: Any) -> None:
    """Writes the optimizer's Keras config into model_dir, for a later predict-only
    TPUEstimator (which never calls the model_fn in TRAIN) to rebuild its slots."""
    import json

    if isinstance(optimizer, V1OptimizerAdapter):
        # It runs a TF1 object's code, which only the model_fn's TRAIN call makes: its
        # slots' shapes are recorded when it is built, for V1SlotsOnly to make again.
        optimizer.on_build = functools.partial(_record_v1_slots, model_dir)
        return
    try:
        config = keras.optimizers.serialize(optimizer)
        text = json.dumps(config, default=lambda value: None)
    except (TypeError, ValueError):  # a custom optimizer: predict-only cannot rebuild it
        return
    tf.io.gfile.makedirs(model_dir)
    with tf.io.gfile.GFile(f"{model_dir}/{_OPTIMIZER_RECORD}", "w") as f:
        f.write(text)


def _record_v1_slots(model_dir: str, slots: list[list[tuple[list[int], str]]]) -> None:
    import json

    tf.io.gfile.makedirs(model_dir)
    with tf.io.gfile.GFile(f"{model_dir}/{_OPTIMIZER_RECORD}", "w") as f:
        f.write(json.dumps({"fenwicks_v1_slots": slots}))


def recorded_optimizer(model_dir: str) -> Any:
    import json

    path = f"{model_dir}/{_OPTIMIZER_RECORD}"
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        config = json.loads(f.read())
    if "fenwicks_v1_slots" in config:  # a TF1 optimizer subclass's (BERT's)
        return V1SlotsOnly(config["fenwicks_v1_slots"])
    try:
        optimizer = keras.optimizers.deserialize(config)
    except Exception:  # noqa: BLE001 - any failure means: not rebuilt, said below
        optimizer = None
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        logger.warning("fenwicks: could not rebuild the optimizer recorded in %s; "
                       "predicting only may not match the checkpoint's slots", path)
        return None
    return optimizer


def finish_metrics(result: dict[str, Any]) -> dict[str, Any]:
    """The ratios of each metric's numerator and denominator columns."""
    out = {k: v for k, v in result.items() if not k.endswith((NUM, DEN))}
    for key in result:
        if key.endswith(NUM):
            name = key[:-len(NUM)]
            den = result[name + DEN]
            value = result[key] / den if den else float("nan")
            out[name] = value
    return out
