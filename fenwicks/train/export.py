"""SavedModel export with a serving signature that applies the model's predict_fn."""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any

import tensorflow as tf

from fenwicks import _deadline
from fenwicks._text import first_line
from fenwicks.train.model_func import ModelSpec


def serving_outputs(predictions: Any) -> dict[str, tf.Tensor]:
    """Serving signatures return dicts; a single tensor becomes {'predictions': ...}."""
    if isinstance(predictions, dict):
        return dict(predictions)
    if isinstance(predictions, (tuple, list)):
        return {f"output_{i}": p for i, p in enumerate(predictions)}
    return {"predictions": predictions}


def export_saved_model(spec: ModelSpec, features_spec: Any, export_dir: str) -> str:
    """Writes a SavedModel whose ``serving_default`` maps features to predictions.

    Args:
        spec: the estimator's model spec (model + predict_fn).
        features_spec: `tf.TensorSpec` (or nest of them) of one batch of features; the
            batch dimension is made dynamic.
        export_dir: local or gs:// directory.

    Returns:
        `export_dir`.

    Example:
        >>> loaded = tf.saved_model.load(est.export_saved_model('/tmp/export'))
        >>> loaded.serve(x)['predictions']
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
    existed = _existed(export_dir)
    # A local export that exists is replaced only when the new one is whole: written
    # beside it, then swapped in. (gs:// has no directory rename: written in place.)
    staged = existed and "://" not in export_dir
    written = f"{export_dir}.new" if staged else export_dir
    try:
        if staged and tf.io.gfile.exists(written):
            tf.io.gfile.rmtree(written)  # a half-written export of an earlier failure
        # bounded on gs://: storage that stops answering is an error naming the export
        _deadline.run(tf.saved_model.save, module, written,
                      signatures={"serving_default": serve}, what="SavedModel export",
                      path=export_dir)
    except _deadline.StorageTimeoutError:
        raise  # storage stopped answering: cleaning up would hang as well
    except (tf.errors.OpError, OSError) as err:
        if written != export_dir or not existed:  # a partial SavedModel: never left
            with contextlib.suppress(tf.errors.OpError, OSError):
                tf.io.gfile.rmtree(written)
        kept = (f"; the previous export in {export_dir} is untouched" if staged else
                "" if existed else "; the partial folder was removed")
        raise ExportError(
            f"could not export the SavedModel to {export_dir}: {first_line(err)}{kept}. "
            "Free space there (or pick another export_dir) and call export_saved_model "
            "again; the checkpoints in work_dir are untouched") from err
    if staged:
        _replace(written, export_dir)
    return export_dir


def _existed(export_dir: str) -> bool:
    """Whether `export_dir` exists; True when storage cannot say (then a failed export
    removes nothing: the folder may hold someone's earlier export)."""
    if "://" not in export_dir:
        return os.path.exists(export_dir)
    try:  # bounded: storage that stops answering is an error naming the export
        return bool(_deadline.run(tf.io.gfile.exists, export_dir, what="SavedModel export",
                                  path=export_dir))
    except _deadline.StorageTimeoutError:
        raise
    except (tf.errors.OpError, OSError):
        return True


def _replace(new: str, target: str) -> None:
    """Puts local directory `new` in place of `target`; the old one goes only after."""
    old = f"{target}.old"
    if os.path.exists(old):
        shutil.rmtree(old)
    os.rename(target, old)
    os.rename(new, target)
    shutil.rmtree(old)


class ExportError(OSError):
    """A SavedModel export failed (a full disk, storage errors); nothing partial is left."""
