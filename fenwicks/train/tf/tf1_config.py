"""TPUEstimator's configuration types, as a TF1 program names them: `ModeKeys`,
`InputPipelineConfig`, `TPUConfig`, `RunConfig`, `WarmStartSettings` and what a model_fn
returns, `TPUEstimatorSpec` (`check_spec` checks one).

Plain Python: nothing here imports TensorFlow, so ``fw.train.RunConfig(...)`` can be
written on any engine; the model_fn itself runs only on the tf engine
(`fenwicks.train.tf.tpu_estimator`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["ModeKeys", "RunConfig", "TPUConfig", "TPUEstimatorSpec", "EstimatorSpec",
           "WarmStartSettings", "InputPipelineConfig", "ModelFnError", "reset_warnings"]

logger = logging.getLogger("fenwicks")


class ModelFnError(ValueError):
    """A model_fn that cannot run in TensorFlow 2, or returned an unusable spec."""


class ModeKeys:
    """The modes a model_fn is called in, with `tf.estimator.ModeKeys`' values."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


class InputPipelineConfig:
    """TPUEstimator's input placement values, for ``TPUConfig(per_host_input_for_training=
    ...)``. Each input_fn gets ``params['batch_size']`` as TPUEstimator gave it (per host
    for PER_HOST_V1, the default; per replica for PER_HOST_V2, and for PER_SHARD_V1 in
    training; the global batch for BROADCAST), and Fenwicks splits the batches between
    the replicas. BROADCAST on several replicas (each replica a whole copy of the batch)
    is refused."""

    PER_SHARD_V1 = 1
    PER_HOST_V1 = 2
    PER_HOST_V2 = 3
    BROADCAST = 4
    SLICED = 5


_WARNED: set[str] = set()


def reset_warnings() -> None:
    """Forgets which no-effect warnings were given, so each is given once more (a
    notebook that runs its cells again, a test that checks them).

    Examples:
        >>> fw.train.tf.tf1_config.reset_warnings()
    """
    _WARNED.clear()


def warn_once(key: str, message: str) -> None:
    """One warning per process for an accepted argument that has no effect."""
    if key not in _WARNED:
        _WARNED.add(key)
        logger.warning("fenwicks: %s", message)


ENGINE_MODE = {"train": ModeKeys.TRAIN, "eval": ModeKeys.EVAL, "predict": ModeKeys.PREDICT}
ENGINE_MODE_OF = {value: key for key, value in ENGINE_MODE.items()}


@dataclasses.dataclass(frozen=True)
class TPUConfig:
    """TPUEstimator's `TPUConfig`: how many steps run per compiled call.

    Args:
        iterations_per_loop: training steps per compiled call (``steps_per_loop``).
            Defaults to 2, as TPUEstimator's.
        num_shards: the replica count the program expects. Fenwicks uses every replica
            `fw.accel` found; a different number gives a warning. Defaults to None.
        per_host_input_for_training: True (PER_HOST_V1), False (PER_SHARD_V1) or an
            `InputPipelineConfig` value: which ``params['batch_size']`` each input_fn
            gets, by TPUEstimator's rule (`InputPipelineConfig`). Defaults to True.
        eval_training_input_configuration: PER_HOST_V1 (None) or SLICED (evaluation
            and prediction input_fns get the global batch). Defaults to None.
        num_cores_per_replica: None or 1 (model parallelism has no counterpart).
        tpu_job_name, initial_infeed_sleep_secs: accepted with a warning, once each,
            that they have no effect, when not TPUEstimator's defaults.
        input_partition_dims, experimental_host_call_every_n_steps: the same.

    Examples:
        >>> fw.train.TPUConfig(iterations_per_loop=100).per_host_input_for_training
        True
        >>> fw.train.TPUConfig(iterations_per_loop=0)
        Traceback (most recent call last):
        ValueError: iterations_per_loop=0 must be an integer >= 1, e.g. 100
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
        value = self.per_host_input_for_training
        if not (isinstance(value, bool) or (type(value) is int and 1 <= value <= 4)):
            raise ValueError(f"per_host_input_for_training={self.per_host_input_for_training!r}"
                             " must be True, False or an InputPipelineConfig value "
                             "(PER_SHARD_V1, PER_HOST_V1, PER_HOST_V2, BROADCAST)")
        if self.eval_training_input_configuration not in (None, InputPipelineConfig.PER_HOST_V1,
                                                          InputPipelineConfig.SLICED):
            raise ValueError(f"eval_training_input_configuration="
                             f"{self.eval_training_input_configuration!r} must be "
                             "InputPipelineConfig.PER_HOST_V1 or SLICED")
        for name, (default, why) in _IGNORED_TPU_CONFIG.items():
            if getattr(self, name) != default:
                warn_once(f"TPUConfig.{name}", f"TPUConfig({name}="
                          f"{getattr(self, name)!r}) has no effect and is ignored: {why}")
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

    Examples:
        >>> config = fw.train.RunConfig(model_dir='runs/mnist', save_checkpoints_steps=1000,
        ...                             tpu_config=fw.train.TPUConfig(iterations_per_loop=100))
        >>> config.tpu_config.iterations_per_loop, config.keep_checkpoint_max
        (100, 5)
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
                warn_once(f"RunConfig.{name}", f"RunConfig({name}=...) has no effect and is "
                           f"ignored: {_IGNORED_WHY[name]}")


# TPUConfig arguments that change nothing here: their TPUEstimator defaults, and why.
_IGNORED_TPU_CONFIG = {
    "tpu_job_name": (None, "fw.accel finds the TPU (FENWICKS_DEVICE=tpu or "
                           "fw.accel.configure() chooses another)"),
    "initial_infeed_sleep_secs": (None, "there is no infeed thread to delay: tf.data "
                                        "feeds the replicas"),
    "input_partition_dims": (None, "spatial partitioning needs model parallelism, which "
                                   "Fenwicks does not do: every replica gets whole examples"),
    "experimental_host_call_every_n_steps": (1, "host_call has no effect either (the loss "
                                                "is written to TensorBoard every loop)")}

# RunConfig arguments that change nothing here, with their TPUEstimator defaults.
_IGNORED_RUN_CONFIG = {"cluster": None, "master": None, "evaluation_master": None,
                       "session_config": None, "save_summary_steps": 100,
                       "log_step_count_steps": None, "keep_checkpoint_every_n_hours": None}
DEVICE_WHY = ("fw.accel finds the device (FENWICKS_DEVICE=tpu|gpu|cpu:N or "
               "fw.accel.configure() chooses another)")
_IGNORED_WHY = {"cluster": DEVICE_WHY, "master": DEVICE_WHY,
                "evaluation_master": DEVICE_WHY, "session_config": DEVICE_WHY,
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

    Examples:
        >>> ws = fw.train.WarmStartSettings('gs://b/pretrained', vars_to_warm_start='enc.*')
        >>> ws.vars_to_warm_start, ws.var_name_to_prev_var_name
        ('enc.*', None)

        ``fw.train.TPUEstimator(model_fn, model_dir=d, warm_start_from=ws)`` then starts
        a new ``d`` from the encoder's variables of ``gs://b/pretrained``.
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
        train_op: from ``minimize``, ``compute_gradients`` or ``apply_gradients`` of
            ``tf.compat.v1.train.{GradientDescent,Momentum,Adam}Optimizer`` (converted to
            Keras) or of a TF1 optimizer subclass (its ``apply_gradients`` run as the
            update), with or without ``CrossShardOptimizer``: the (gradient, variable)
            pairs the model_fn gives ``apply_gradients`` are what trains
            (`fenwicks.train.tf.tf1_gradients`).
        eval_metrics: ``(metric_fn, tensors)``; ``metric_fn(*tensors)`` (or
            ``**tensors`` for a dict) returns ``{name: (value, update_op)}`` from
            ``tf.compat.v1.metrics`` (accuracy, mean, mean_squared_error, ...) or
            ``{name: keras_mean_metric}`` after its ``update_state``.
        optimizer: a Keras optimizer, or a zero-argument function making one
            (``fw.train.sgd_optimizer(lr_func)``), instead of ``train_op``.
        scaffold_fn: called once per call; ``tf.compat.v1.train.init_from_checkpoint``
            inside it (BERT's warm start) is applied when model_dir has no checkpoint. A
            returned ``Scaffold(init_fn=...)`` (or ``init_op``, ``ready_op``, ``saver``)
            is refused: it needs a TF1 session.
        export_outputs, host_call: accepted with a warning, once, that they have no
            effect (TensorBoard scalars are written every loop; `export_saved_model`
            serves the predictions).
        training_hooks, evaluation_hooks, prediction_hooks: must be empty (TF1
            SessionRunHooks; see the module docstring).

    Examples:
        >>> def model_fn(features, labels, mode, params):
        ...     logits = keras.layers.Dense(3)(features)
        ...     loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
        ...         labels, logits, from_logits=True))
        ...     metric_fn = lambda labels, logits: {'accuracy': tf.compat.v1.metrics.accuracy(
        ...         labels, tf.argmax(logits, -1))}
        ...     return fw.train.TPUEstimatorSpec(mode, loss=loss,
        ...                                      optimizer=keras.optimizers.SGD(0.1),
        ...                                      eval_metrics=(metric_fn, [labels, logits]))
        >>> spec = model_fn(np.zeros((4, 2), 'float32'), np.array([0, 1, 2, 0]), 'train', {})
        >>> round(float(spec.loss), 4)   # zero inputs: logits 0, loss ln 3
        1.0986
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


def check_spec(spec: Any, mode: str) -> TPUEstimatorSpec:
    """The model_fn's spec, or a `ModelFnError` saying what it lacks for `mode`."""
    if not isinstance(spec, TPUEstimatorSpec):
        raise ModelFnError(f"model_fn returned {type(spec).__name__} in mode {mode!r}; "
                              "it must return fw.train.TPUEstimatorSpec(mode, ...)")
    if spec.training_hooks or spec.evaluation_hooks or spec.prediction_hooks:
        raise ModelFnError("TPUEstimatorSpec hooks (SessionRunHooks) need a TF1 session; "
                              "give Keras callbacks to est.train(..., callbacks=[...])")
    if mode != ModeKeys.PREDICT and spec.loss is None:
        raise ModelFnError(f"model_fn gave no loss in mode {mode!r}")
    if mode == ModeKeys.PREDICT and spec.predictions is None:
        raise ModelFnError("model_fn gave no predictions in mode 'infer' (PREDICT): "
                           "return TPUEstimatorSpec(mode, predictions=...) when "
                           "mode == ModeKeys.PREDICT")
    if spec.eval_metric_ops is not None:
        raise ModelFnError("eval_metric_ops is TF1's graph form; give "
                              "eval_metrics=(metric_fn, tensors)")
    if spec.host_call is not None:
        warn_once("host_call", "TPUEstimatorSpec(host_call=...) has no effect and is "
                   "ignored: Fenwicks writes the loss as TensorBoard scalars every loop; "
                   "log other values with Keras callbacks (est.train(..., callbacks=[...]))")
    if spec.export_outputs is not None:
        warn_once("export_outputs", "TPUEstimatorSpec(export_outputs=...) has no effect "
                   "and is ignored: export_saved_model serves the PREDICT predictions as "
                   "its serving_default signature")
    return spec
