"""SavedModel export with a serving signature that applies the model's predict_fn."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from fenwicks.train.export_dirs import ExportError, serving_outputs  # noqa: F401
from fenwicks.train.model_func import ModelSpec


def export_saved_model(spec: ModelSpec, features_spec: Any, export_dir: str) -> str:
    """Writes a SavedModel whose ``serving_default`` maps features to predictions.

    Args:
        spec: the estimator's model spec (model + predict_fn).
        features_spec: `tf.TensorSpec` (or nest of them) of one batch of features; the
            batch dimension is made dynamic.
        export_dir: a new local or gs:// folder (`export_dirs.write` makes it, a
            version folder's staging, and puts it in place once complete).

    Returns:
        `export_dir`.

    Examples:
        >>> model = keras.Sequential([keras.Input((2,)),
        ...                           keras.layers.Dense(1, kernel_initializer='ones')])
        >>> spec = fw.train.ModelSpec(model, keras.optimizers.SGD(0.1),
        ...                           loss_fn=fw.train.squared_error)
        >>> export_saved_model(spec, tf.TensorSpec([4, 2], tf.float32), 'export/1')
        'export/1'
        >>> loaded = tf.saved_model.load('export/1')   # keep it: it owns the variables
        >>> loaded.serve(np.array([[1., 2.]], 'float32'))['predictions'].numpy()  # any batch
        array([[3.]], dtype=float32)
    """
    features_spec = tf.nest.map_structure(
        lambda s: tf.TensorSpec([None] + s.shape.as_list()[1:], s.dtype), features_spec)
    if isinstance(features_spec, tf.TensorSpec):
        features_spec = tf.TensorSpec(features_spec.shape, features_spec.dtype, name="x")

    module = tf.Module()
    module.model = spec.model

    @tf.function(input_signature=[features_spec])
    def serve(features: Any) -> dict[str, tf.Tensor]:
        outputs = tf.nest.map_structure(
            lambda t: tf.cast(t, tf.float32) if t.dtype.is_floating else t,
            spec.model(features, training=False))
        return serving_outputs(spec.predict_fn(outputs))

    module.serve = serve
    tf.saved_model.save(module, export_dir, signatures={"serving_default": serve})
    return export_dir
