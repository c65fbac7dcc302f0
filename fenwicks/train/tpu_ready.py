"""`check_tpu_ready`: catch on the CPU what would fail on a TPU, before paying for one.

A TPU runs each step as one XLA program of fixed shapes. Three things break that and
usually show up only after a TPU session has started: an op XLA cannot compile (a
`tf.py_function`, string ops inside the model), a tensor whose size depends on the data
(`tf.unique`, `tf.boolean_mask`: XLA pads them to a bound, if it compiles them at all), and
an input whose batches are not all the same size (a training dataset batched without
``drop_remainder``). The check builds a fresh copy of the estimator's model on the CPU and
lowers its train, eval and predict steps to XLA's HLO exactly as the estimator compiles
them under `TPUStrategy` (``jit_compile=True``, one replica, the TPU's per-replica batch and
precision). It reads one batch of each input and writes nothing to the work dir.

The input checks are shared; each engine lowers its own steps (`Engine.check_tpu_step`):
the TensorFlow engine with XLA as `TPUStrategy` compiles them
(`fenwicks.train.tf.tpu_steps`), the JAX engine with ``jax.jit`` lowered for the TPU
platform (`fenwicks.train.jax.tpu_steps`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras
import tensorflow as tf

from fenwicks._checks import divisible_by_replicas, positive_int
from fenwicks.train import engines, inputs


class NotTPUReadyError(ValueError):
    """What would fail on a TPU: the mode, the op or tensor, and the fix."""


@dataclasses.dataclass(frozen=True)
class TPUReadiness:
    """What `check_tpu_ready` verified.

    Attributes:
        replicas: the TPU replica count the per-replica batch sizes were computed for.
        precision: the compute precision the steps were compiled in.
        batch_sizes: per-replica batch size of each mode checked, e.g. ``{'train': 16}``.
        shapes: each checked mode's batch shapes as the compiled step sees them.
    """

    replicas: int
    precision: str
    batch_sizes: dict[str, int]
    shapes: dict[str, list[tuple[int, ...]]]


def check_tpu_ready(est: Any, train_input_fn: inputs.InputFn,
                    eval_input_fn: inputs.InputFn | None = None,
                    pred_input_fn: inputs.InputFn | None = None,
                    replicas: int | None = None,
                    precision: str = "bfloat16") -> TPUReadiness:
    """Fails on the CPU where the estimator would fail on a TPU; run it before a TPU session.

    Args:
        est: an `Estimator` from `get_tpu_estimator` (on the CPU). Its model function and
            batch sizes are used; its model, checkpoints and work dir are left alone.
        train_input_fn: the training input function (``params -> tf.data.Dataset``).
        eval_input_fn: the evaluation input function, or None to skip eval.
        pred_input_fn: the prediction input function, or None to skip predict.
        replicas: the replica count of the TPU you will use (1 on a v5e-1, 8 on a v5e-8):
            ``params['batch_size']`` is the global batch size divided by it. Defaults to
            the estimator's replica count.
        precision: the compute precision to compile in. Defaults to ``'bfloat16'``, a
            TPU's automatic choice.

    Returns:
        A `TPUReadiness` saying what was checked.

    Raises:
        NotTPUReadyError: naming the mode and the problem: a batch dimension that varies
            (no ``drop_remainder``), any other dimension that is not static, a string
            tensor sent to the device, an op XLA cannot compile (a `tf.py_function`, a
            string op), or a tensor of data-dependent size inside the model.
        ValueError: for a global batch size not divisible by `replicas`.

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
        >>> fw.train.check_tpu_ready(est, train_fn, eval_fn, replicas=2)
        TPUReadiness(replicas=2, precision='bfloat16', batch_sizes={'train': 2, 'eval': 2},
                     shapes={'train': [(2, 4), (2,)], 'eval': [(2, 4), (2,)]})
    """
    config = est.config
    replicas = est.num_replicas if replicas is None else positive_int("replicas", replicas)
    globals_ = {"train": config.train_batch_size, "eval": config.eval_batch_size,
                "predict": config.predict_batch_size}
    fns = {"train": train_input_fn, "eval": eval_input_fn, "predict": pred_input_fn}
    fns = {mode: fn for mode, fn in fns.items() if fn is not None}
    for mode in fns:
        divisible_by_replicas({"train": "trn_bs", "eval": "val_bs", "predict": "pred_bs"}[mode],
                              globals_[mode], replicas)
    params = {mode: inputs.make_params(mode, globals_[mode], replicas, seed=config.seed,
                                         precision=precision,
                                         steps_per_epoch=config.steps_per_epoch)
              for mode in fns}
    batches = {mode: _first_batch(mode, fns[mode], params[mode]) for mode in fns}
    features, _, _ = inputs.unpack(next(iter(batches.values()))[1])
    features_spec = tf.nest.map_structure(tf.TensorSpec.from_tensor, features)
    engine = engines.current()
    spec, optimizer = engine.build_for_tpu_check(est.model_func, params[next(iter(fns))],
                                                 precision, features_spec)
    for mode, (batch, _) in batches.items():
        engine.check_tpu_step(mode, spec, optimizer, batch, globals_[mode], replicas)
    return TPUReadiness(
        replicas, precision, {mode: p["batch_size"] for mode, p in params.items()},
        {mode: [tuple(t.shape.as_list()) for t in tf.nest.flatten(element)]
         for mode, (_, element) in batches.items()})


def what(mode: str) -> str:
    """What a mode's input and step are called in messages."""
    return {"train": "training", "eval": "evaluation", "predict": "prediction"}[mode]


def _first_batch(mode: str, input_fn: inputs.InputFn, params: dict) -> tuple[Any, Any]:
    """(what the compiled step gets, the user's element) after the shape checks."""
    batch_size = params["batch_size"]
    dataset = input_fn(dict(params))
    if not isinstance(dataset, tf.data.Dataset):
        raise NotTPUReadyError(f"{what(mode)} input_fn returned {type(dataset).__name__}, "
                               "not a tf.data.Dataset")
    spec = dataset.element_spec
    try:
        if mode == "train":
            inputs.check_train_spec(spec, batch_size)
        else:
            inputs.check_eval_spec(spec, batch_size, what(mode))
    except ValueError as err:
        raise NotTPUReadyError(f"{what(mode)} input: {err}") from None
    for path, tensor_spec in _paths(spec):
        dims = tensor_spec.shape.as_list()
        if tensor_spec.dtype == tf.string:
            raise NotTPUReadyError(
                f"{what(mode)} input: {path} is a string tensor {tensor_spec.shape}; a TPU "
                "cannot hold strings. Turn them into numbers in the input_fn (e.g. "
                "keras.layers.StringLookup or tf.strings.to_number in dataset.map)")
        dynamic = [i for i, d in enumerate(dims) if d is None and (i > 0 or mode == "train")]
        if dynamic:
            raise NotTPUReadyError(
                f"{what(mode)} input: {path} has shape {dims}, dimension {dynamic[0]} is "
                "not static; a TPU compiles for fixed shapes: pad or crop to a fixed size "
                "in the input_fn (e.g. ds.padded_batch(..., padded_shapes=...), "
                "tf.image.resize)")
    if mode == "train":
        element = _first(dataset, mode)
        return element, element
    padded = inputs.pad_and_mask(dataset, batch_size, 1, what(mode))
    batch = _first(padded, mode)
    return batch, batch[0]


def _first(dataset: tf.data.Dataset, mode: str) -> Any:
    """The first element of `dataset`; an empty one is an error naming the input."""
    for element in dataset.take(1):
        return element
    raise NotTPUReadyError(
        f"{what(mode)} input: the input_fn's dataset is empty, so there is nothing to "
        "check or train on; check the files or arrays it reads (a glob that matches "
        "nothing, a filter that drops everything, a take(0))")


def _paths(spec: Any) -> list[tuple[str, tf.TensorSpec]]:
    """('features[0]', spec) ... for every tensor of an element spec."""
    features, labels, weights = inputs.unpack(spec)
    found = []
    for name, part in (("features", features), ("labels", labels),
                       ("sample_weight", weights)):
        if part is None:
            continue
        for path, leaf in keras.tree.flatten_with_path(part):
            found.append((name + "".join(f"[{key!r}]" for key in path), leaf))
    return found
