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
        >>> from fenwicks.train.options import EstimatorConfig
        >>> acc = fw.accel.current()   # the JAX engine's devices
        >>> config = EstimatorConfig(steps_per_epoch=1, work_dir='run', train_batch_size=4,
        ...                          eval_batch_size=4, predict_batch_size=4, steps_per_loop=1,
        ...                          precision='float32', num_replicas=acc.num_replicas)
        >>> model_func = fw.train.get_clf_model_func(
        ...     lambda: keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)]),
        ...     fw.train.sgd_optimizer(0.1))
        >>> from fenwicks.train.jax.state import JaxRunState
        >>> state = JaxRunState(model_func, config, acc)
        >>> state.build(tf.TensorSpec([None, 2], tf.float32), {})
        >>> state.spec.model.set_weights([np.zeros((2, 2)), np.array([1., 0.])])  # class 0
        >>> path = export_saved_model(state.spec, tf.TensorSpec([4, 2], tf.float32), 'export/1')
        >>> loaded = tf.saved_model.load(path)   # keep it: it owns the variables
        >>> loaded.serve(np.ones((1, 2), 'float32'))['predictions'].numpy().round(4)
        array([[0.7311, 0.2689]], dtype=float32)
        >>> state.close()

        The probabilities of logits [1, 0]: e / (e + 1) and 1 / (e + 1).
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
