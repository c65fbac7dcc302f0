"""SavedModel export on the JAX engine: the model and its predict_fn converted to a
TensorFlow graph by Keras's own export (``keras.export.ExportArchive``, which uses
``jax2tf``), with the same ``serve`` / ``serving_default`` signature as the TensorFlow
engine's export (`export_dirs.serving_outputs`): ``{'predictions': ...}`` (or the
predict_fn's dict).
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from fenwicks.train.export_dirs import serving_outputs
from fenwicks.train.model_func import ModelSpec


def export_saved_model(spec: ModelSpec, features_spec: Any, export_dir: str) -> str:
    """Writes a SavedModel whose ``serve`` and ``serving_default`` give predictions.

    Raises:
        ValueError: the model cannot be converted (jax2tf), naming what to use instead.

    Examples:
        >>> loaded = tf.saved_model.load(est.export_saved_model('/tmp/export'))  # .../<version>
        >>> loaded.serve(x)['predictions']
    """
    signature = tf.nest.map_structure(
        lambda s: tf.TensorSpec([None] + s.shape.as_list()[1:], s.dtype), features_spec)

    def serve(features: Any) -> Any:
        outputs = keras.tree.map_structure(
            lambda t: keras.ops.cast(t, "float32")
            if keras.backend.is_float_dtype(t.dtype) else t,
            spec.model(features, training=False))
        return serving_outputs(spec.predict_fn(outputs))

    archive = keras.export.ExportArchive()
    archive.track(spec.model)
    try:
        # polymorphic_shapes: the batch dimension stays dynamic, as on the TF engine.
        archive.add_endpoint("serve", serve, input_signature=[signature])
        archive.write_out(export_dir, verbose=False)
    except Exception as err:  # jax2tf's errors have many types; the cause is in the text
        raise ValueError(
            f"export_saved_model on the JAX engine could not convert the model with "
            f"jax2tf ({str(err).splitlines()[0][:200]}). Export from the TensorFlow "
            "engine instead: a new estimator on the same work_dir with "
            "FENWICKS_ENGINE=tf (or KERAS_BACKEND=tensorflow) reads this run's "
            "checkpoints, or save the Keras model with est.model.save('model.keras')"
        ) from err
    return export_dir
