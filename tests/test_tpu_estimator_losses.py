"""Issue 50, item 2: a Keras loss object, a ``tf.compat.v1.losses`` loss and a
hand-written ``reduce_mean`` give the same training step and the same evaluation loss on 1
and 8 replicas, each equal to TF1's computed here in NumPy.

TF1's rule: the model_fn's loss is its replica's batch mean; ``minimize`` with one
optimizer steps by the global batch's mean gradient; the evaluation loss is the mean over
every example (Fenwicks evaluates exactly: a padded last batch's padding rows left out).
Keras alone divides a loss object's value by the replica count under tf.distribute (it
read 0.291 for 2.325 on 8 replicas, and stepped an eighth as far).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests import _tf1_loss_forms as forms
from tests.conftest import run_module_json


def _log_softmax(logits):
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def _cross_entropy(w, x, y):
    return -_log_softmax(x @ w)[np.arange(len(y)), y]


def _step(w, x, y):
    probs = np.exp(_log_softmax(x @ w))
    probs[np.arange(len(y)), y] -= 1.0
    return w - forms.LR * x.T @ probs / len(y)


@pytest.fixture(scope="module", params=[1, 8], ids=["1_replica", "8_replicas"])
def trained(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"losses{request.param}")
    out = run_module_json("tests._tf1_loss_forms", str(root),
                          env={"FENWICKS_DEVICE": f"cpu:{request.param}"}, timeout=900)
    assert out["replicas"] == request.param
    return out


@pytest.mark.parametrize("form", forms.FORMS)
def test_each_loss_form_trains_and_evaluates_as_tf1(trained, form):
    x, y = forms.data()
    w = forms.W.astype(np.float64)
    result = trained[form]
    assert result["train_loss"] == pytest.approx(np.mean(_cross_entropy(w, x[:8], y[:8])),
                                                 rel=1e-5)
    trained_w = _step(w, x[:8], y[:8])
    np.testing.assert_allclose(result["w"], trained_w, rtol=1e-5, atol=1e-6)
    # 10 examples in batches of 8: the last batch holds 2, padded to 8 (1 per replica on 8).
    assert result["num_examples"] == 10
    assert result["eval_loss"] == pytest.approx(
        np.mean(_cross_entropy(trained_w, x[8:], y[8:])), rel=1e-5)


def test_the_forms_are_not_vacuous(trained):
    """A step moves the weights, and the padded batch's mean differs from the exact one
    (so an evaluation that counted padding rows would fail above)."""
    x, y = forms.data()
    w = forms.W.astype(np.float64)
    trained_w = _step(w, x[:8], y[:8])
    assert np.abs(trained_w - w).max() > 0.05
    losses = _cross_entropy(trained_w, x[8:], y[8:])
    padded = (np.mean(losses[:8]) * 8 + np.mean(losses[8:]) * 8) / 16
    assert abs(padded - np.mean(losses)) > 1e-3
