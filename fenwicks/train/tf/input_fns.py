"""A TPUEstimator program's input_fns as the engine calls them.

`engine_input_fn` gives the engine's input_fn: TPUEstimator's ``params`` in (by name,
or as the one positional argument, with ``config`` and ``mode`` if named), and each
element out as ``({'features', 'labels'}, labels)`` (predict: ``{'features'}``). An
input_fn that returns ``make_one_shot_iterator(dataset).get_next()`` tensors
(squeezenet's InputReader) becomes ``dataset.map(<the input_fn on each element>)``.

Examples:
    >>> from fenwicks.train.inputs import make_params
    >>> est = fw.train.TPUEstimator(lambda features, labels, mode, params: None,
    ...                             model_dir='run', train_batch_size=8, verbose=False)
    >>> def train_input_fn(params):   # a TPUEstimator program's
    ...     x, y = np.ones((16, 3), 'float32'), np.zeros(16, 'int64')
    ...     return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(
    ...         params['batch_size'], drop_remainder=True)
    >>> engine_fn = engine_input_fn(est, train_input_fn, 'train')
    >>> params = make_params('train', 8, 1, seed=None, precision='float32', steps_per_epoch=1)
    >>> features, labels = engine_fn(params).element_spec   # the labels twice: see above
    >>> features
    {'features': TensorSpec(shape=(8, 3), dtype=tf.float32, name=None),
     'labels': TensorSpec(shape=(8,), dtype=tf.int64, name=None)}
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from fenwicks.train.tf.tf1_config import ENGINE_MODE, InputPipelineConfig
from fenwicks.train.tf.tf1_variables import patched


def _wrap(front: Any, input_fn: Callable[..., Any], mode: str) -> Callable[[dict], Any]:
    """The input_fn as the engine calls it: TPUEstimator's params in, and each
    element as ``({'features', 'labels'}, labels)`` (predict: ``{'features'}``)."""
    def wrapped(params: dict) -> tf.data.Dataset:
        full = {"use_tpu": front.use_tpu, **front.params, **params,
                "num_shards": params["num_replicas"]}
        per_replica = params["batch_size"]
        # A drop_remainder=True input then keeps the examples it kept under TPUEstimator;
        # the batches are split between the replicas here, as TPUEstimator split them.
        full["batch_size"] = input_batch_size(front.config.tpu_config, front.use_tpu, mode,
                                              params)
        dataset = _dataset_of(input_fn, full, front.config, ENGINE_MODE[mode], mode)
        if full["batch_size"] != per_replica:
            dataset = dataset.rebatch(per_replica)
        return dataset.map(_splitter(front, dataset.element_spec, mode))

    return wrapped


def placement(tpu_config: Any) -> int:
    """``per_host_input_for_training`` as an `InputPipelineConfig` value (TPUConfig made
    True PER_HOST_V1 and False PER_SHARD_V1)."""
    value = tpu_config.per_host_input_for_training
    if isinstance(value, bool):
        return InputPipelineConfig.PER_HOST_V1 if value else InputPipelineConfig.PER_SHARD_V1
    return value


def input_batch_size(tpu_config: Any, use_tpu: bool, mode: str, params: dict) -> int:
    """``params['batch_size']`` for a mode's input_fn, by TPUEstimator's rule
    (``_TPUContext.batch_size_for_input_fn``): the global batch where the input is
    broadcast (BROADCAST; SLICED evaluation) or TPUEstimator ran on the CPU
    (``use_tpu=False``); the per-replica batch for PER_HOST_V2, and for PER_SHARD_V1 in
    training; else (PER_HOST_V1, the default; PER_SHARD_V1 outside training) the
    per-host batch."""
    global_batch, chosen = params["global_batch_size"], placement(tpu_config)
    sliced = (mode != "train"
              and tpu_config.eval_training_input_configuration == InputPipelineConfig.SLICED)
    if not use_tpu or chosen == InputPipelineConfig.BROADCAST or sliced:
        return global_batch
    if chosen == InputPipelineConfig.PER_HOST_V2 or (
            mode == "train" and chosen == InputPipelineConfig.PER_SHARD_V1):
        return global_batch // params["num_replicas"]
    return global_batch // _pipelines(params)


def _splitter(front: Any, element_spec: Any, mode: str) -> Callable[..., Any]:
    pair = isinstance(element_spec, tuple) and len(element_spec) == 2
    if not pair and not isinstance(element_spec, (dict, tf.TensorSpec)):
        raise ValueError(f"the {mode} input_fn yields {element_spec}; yield features "
                         "or (features, labels)")
    features_spec = element_spec[0] if pair else element_spec
    in_features = isinstance(features_spec, dict) and front.labels_key in features_spec
    if front.labels_key is not None and not pair and not in_features and mode != "predict":
        raise ValueError(f"labels_key={front.labels_key!r} is not a key of the {mode} "
                         f"input's features ({_keys(features_spec)})")
    has_labels = pair or in_features
    _runner_has_labels(front, mode, has_labels)

    def split(*element: Any) -> Any:
        features = element[0]
        labels = element[1] if pair else None
        if labels is None and in_features:
            labels = features[front.labels_key]
        if mode == "predict":
            if labels is None:
                return {"features": features}
            return {"features": features, "predict_labels": labels}
        if labels is None:  # the engine's step takes labels: a zero per row stands in
            labels = tf.zeros([tf.shape(tf.nest.flatten(features)[0])[0]], tf.int32)
        return {"features": features, "labels": labels}, labels

    return split


def _runner_has_labels(front: Any, mode: str, has_labels: bool) -> None:
    if front.runner is not None:
        front.runner.has_labels[ENGINE_MODE[mode]] = has_labels


def engine_input_fn(front: Any, input_fn: Callable[..., Any], mode: str
                    ) -> Callable[[dict], Any]:
    """The engine's input_fn for `mode` of `front` (the TPUEstimator); it records the
    element spec the model_fn runner builds the model from."""
    engine_fn = _wrap(front, input_fn, mode)

    def recorded(params: dict) -> tf.data.Dataset:
        dataset = engine_fn(params)
        front.element_specs[mode] = dataset.element_spec
        return dataset

    return recorded


def _keys(spec: Any) -> str:
    return f"keys {sorted(spec)}" if isinstance(spec, dict) else "not a dict"


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


def _dataset_of(input_fn: Callable[..., Any], params: dict, config: Any, mode: str,
                what: str) -> tf.data.Dataset:
    """The input_fn's dataset. One returning ``make_one_shot_iterator(ds).get_next()``
    tensors (squeezenet's InputReader) becomes ``ds.map(<the input_fn on each element>)``:
    the code after get_next() (casts, set_shape) runs on every element, as TF1 ran it."""
    element: list[Any] = [None]

    def make(dataset: Any, *args: Any, **kwargs: Any) -> _OneShotIterator:
        return _OneShotIterator(dataset, element[0])

    @contextlib.contextmanager
    def one_shot() -> Iterator[None]:
        with patched(tf.compat.v1.data, "make_one_shot_iterator", make), \
                patched(tf.compat.v1.data.Dataset, "make_one_shot_iterator", make):
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


def _call_input_fn(input_fn: Callable[..., Any], params: dict, config: Any,
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
