"""Building a model for training: the model and its optimizer under the precision policy,
and the checks of model against data made before anything compiles (input shape, labels).

Shared by the estimator and `find_lr`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import keras
import tensorflow as tf

from fenwicks.train.model_func import ModelSpec

ModelFunc = Callable[[dict], ModelSpec]


@contextlib.contextmanager
def precision_policy(precision: str) -> Iterator[None]:
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

    Called inside the strategy's scope and under `precision_policy`. Returns the spec and
    the optimizer to step with (wrapped in a `LossScaleOptimizer` under float16).
    """
    spec = model_func(params)
    if not isinstance(spec, ModelSpec):
        raise ValueError(f"model_func returned {type(spec).__name__}; it must return "
                         "fw.train.ModelSpec (e.g. from fw.train.get_clf_model_func)")
    check_input_shape(spec.model, features_spec)
    if not spec.model.built:
        spec.model(_zeros_like_spec(features_spec), training=False)
    optimizer = spec.optimizer
    if precision == "float16" and not isinstance(
            optimizer, keras.optimizers.LossScaleOptimizer):
        # float16 gradients underflow without a loss scale; bfloat16 has float32's range.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(spec.model.trainable_variables)
    return spec, optimizer


def check_input_shape(model: keras.Model, features_spec: Any) -> None:
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


def check_same_features(built: Any, got: Any, mode: str) -> None:
    """Features of `mode` against those the model was built for (per example).

    A fully convolutional net built for 8x8 images also runs on 9x9 ones and returns
    predictions, silently, for inputs it was never built or trained for.

    Raises:
        ValueError: naming both shapes.
    """
    def shapes(spec: Any) -> list[tuple]:
        return [tuple(s.shape.as_list()[1:]) for s in tf.nest.flatten(spec)]

    def fits(w: tuple, h: tuple) -> bool:  # None (unknown) matches any size
        return len(w) == len(h) and all(a is None or b is None or a == b
                                        for a, b in zip(w, h, strict=True))

    def show(found: list[tuple]) -> Any:  # one tensor: its shape alone
        return found[0] if len(found) == 1 else found

    if isinstance(built, dict) and isinstance(got, dict):
        # Keys one mode lacks (labels fed to a TPUEstimator model_fn in training, not in
        # predict) are the model's to judge; the shapes of the shared ones are ours.
        shared = sorted(set(built) & set(got))
        built, got = [built[k] for k in shared], [got[k] for k in shared]
    want, have = shapes(built), shapes(got)
    if len(want) != len(have) or not all(map(fits, want, have)):
        raise ValueError(
            f"the {mode} input_fn gives features of shape {show(have)} per example, but "
            f"this estimator's model was built for {show(want)} (from the first input it "
            f"saw); give {mode} features of that shape (resize or crop them), or use a "
            "new estimator (another work_dir) for the new shape")


@contextlib.contextmanager
def training_randomness_kept(model: keras.Model) -> Iterator[None]:
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


def check_labels(engine: Any, spec: ModelSpec, dataset: tf.data.Dataset) -> None:
    """Runs the loss on a few examples of `dataset` as `engine` (a
    `fenwicks.train.engines.Engine`) computes it: labels that do not fit the model are a
    ValueError now, before anything compiles (compiled, an out-of-range label can only
    give NaN). Labels that look one-hot for a loss that takes class indices get the hint
    naming both fixes, on every engine."""
    for element in dataset.take(1).as_numpy_iterator():
        features, labels, _ = keras.utils.unpack_x_y_sample_weight(
            keras.tree.map_structure(lambda t: t[:64], element))
        outputs = engine.model_outputs(spec, features)
        try:
            engine.loss(spec, labels, outputs)
        except engine.label_errors as err:
            _explain_one_hot(labels, outputs, err)
            raise


def _shape(value: Any) -> tuple[int | None, ...] | None:
    """The shape of one array, tensor or abstract value, as a tuple; None for a structure."""
    shape = getattr(value, "shape", None)
    return None if shape is None else tuple(shape)


def _explain_one_hot(labels: Any, outputs: Any, err: BaseException) -> None:
    """Raises a ValueError naming both fixes if `labels` look one-hot for `outputs`,
    which a sparse (class index) loss rejected with `err`; else returns."""
    shape, out = _shape(labels), _shape(outputs)
    if (shape is None or out is None or len(shape) != len(out) or len(shape) < 2
            or shape[-1] != out[-1] or (shape[-1] or 0) < 2):
        return
    raise ValueError(
        f"the labels have shape {list(shape)}, one-hot (or probabilities) over the "
        f"model's {shape[-1]} outputs, but the loss takes class indices, shape "
        f"{list(shape[:-1])}. Either argmax the labels (y.argmax(axis=-1) in NumPy, "
        "or ds.map(lambda x, y: (x, tf.argmax(y, -1))) in the input_fn), or use a "
        "categorical loss: fw.train.get_model_func(build_nn, opt_func, loss_fn=lambda y, "
        "out: keras.losses.categorical_crossentropy(y, out, from_logits=True), "
        "metric_fns=...)") from err
