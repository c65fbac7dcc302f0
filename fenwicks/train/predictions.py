"""What `Estimator.predict` returns: an array of class probabilities whose rows also
answer the original Fenwicks's (TPUEstimator's) per-example keys.

The original yielded one dict per example, ``{'y_pred': class id, 'y_prob':
probabilities}``; notebooks loop ``for pred in est.predict(fn): pred['y_pred']``. Here
`predict` returns one array (``preds.argmax(1)``, ``preds[:, 1]`` work as on any array),
and iterating it gives rows on which ``row['y_pred']`` and ``row['y_prob']`` still work.
"""

from __future__ import annotations

from typing import Any

import numpy as np

KEYS = ("y_pred", "y_prob")


class ClassProbabilities(np.ndarray):
    """A NumPy array of ``[N, classes]`` probabilities (or one ``[classes]`` row) that
    also takes the keys ``'y_pred'`` (the class id, argmax) and ``'y_prob'``.

    Examples:
        >>> preds = class_probabilities(np.array([[0.9, 0.1], [0.2, 0.8]]))  # est.predict's
        >>> [pred['y_pred'] for pred in preds]         # as the original's dicts
        [0, 1]
        >>> preds['y_pred']                            # [N] class ids
        array([0, 1])
        >>> preds.argmax(1).tolist(), float(preds[1, 1])   # and an array as any other
        ([0, 1], 0.8)
    """

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            plain = self.view(np.ndarray)
            if key == "y_pred":
                ids = np.argmax(plain, axis=-1)
                return int(ids) if plain.ndim == 1 else ids
            if key == "y_prob":
                return plain
            raise KeyError(f"{key!r}: predictions are class probabilities; their keys are "
                           f"{KEYS} (or pass as_dicts=True to predict for a list of dicts)")
        return super().__getitem__(key)


def class_probabilities(predictions: Any) -> Any:
    """`predictions` as `ClassProbabilities` if they are ``[N, classes]`` floats, else as
    they are."""
    if (isinstance(predictions, np.ndarray) and predictions.ndim == 2
            and predictions.dtype.kind == "f"):
        return predictions.view(ClassProbabilities)
    return predictions
