"""Issue 50, item 1: gradient code in a TPUEstimator model_fn trains as TF1 trained it.

Each idiom of tests/_tf1_gradient_idioms.py trains 2 steps on 1 and on 8 replicas; the
weights are checked against TF1's rule computed here in NumPy: per replica, the gradient
of its batch's mean squared error (plus the body's L2 regulariser only where the model_fn
adds it to its loss), transformed as the model_fn transforms it; across
replicas, ``CrossShardOptimizer.apply_gradients`` sums (``cross_replica_sum``), its
``compute_gradients`` first divides the loss by the replica count, and a plain optimizer's
gradients are averaged (module docstring of fenwicks/train/tf/tf1_gradients.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests import _tf1_gradient_idioms as idioms
from tests.conftest import run_module_json


def _replica_gradients(w1, w2, x, y):
    """d/dW of mean((x W1 W2 - y)^2) on one replica's rows."""
    hidden = x @ w1
    d_out = 2.0 / len(x) * (hidden @ w2 - y)
    return [x.T @ (d_out @ w2.T), hidden.T @ d_out]


def _clip_global(grads, clip):
    norm = np.sqrt(sum(np.sum(g ** 2) for g in grads))
    return [g * clip / max(norm, clip) for g in grads]


def _clip_each(grads, clip):
    return [g * clip / max(np.sqrt(np.sum(g ** 2)), clip) for g in grads]


def _transform(name, grads, replicas):
    if name == "clip_global":
        return _clip_global(grads, idioms.CLIP)
    if name == "clip_per_tensor":
        return _clip_each(grads, idioms.CLIP)
    if name in ("freeze_body", "tvars_subset", "var_list_scope"):
        return [np.zeros_like(grads[0]), grads[1]]
    if name == "compute_gradients_scaled":
        return [g * 0.5 for g in grads]
    return grads


def tf1_rule(idiom, replicas):
    """The weights after idioms.STEPS steps of TF1's update on `replicas` shards."""
    x, y = idioms.data()
    w = [idioms.W1.astype(np.float64), idioms.W2.astype(np.float64)]
    cross_shard = idiom.startswith("cs_")
    name = idiom.removeprefix("cs_")
    rows = len(x) // replicas
    for step in range(idioms.STEPS):
        per_replica = []
        for r in range(replicas):
            part = slice(r * rows, (r + 1) * rows)
            grads = _replica_gradients(*w, x[part], y[part])
            if name in ("reg_added", "reg_total_loss"):  # the model_fn added REG*sum(W1^2)
                grads[0] = grads[0] + 2 * idioms.REG * w[0]
            # CrossShardOptimizer.compute_gradients (minimize too) divides the loss by R.
            if cross_shard and name in ("minimize", "var_list_scope",
                                        "compute_gradients_scaled", "reg_added"):
                grads = [g / replicas for g in grads]
            per_replica.append(_transform(name, grads, replicas))
        combined = [sum(parts) for parts in zip(*per_replica, strict=True)]
        if not cross_shard:  # no cross_replica_sum: the replicas' mean
            combined = [g / replicas for g in combined]
        lr = idioms.LR * 0.5 ** step if idiom == "subclass_scheduled" else idioms.LR
        w = [wi - lr * gi for wi, gi in zip(w, combined, strict=True)]
    return w


@pytest.fixture(scope="module", params=[1, 8], ids=["1_replica", "8_replicas"])
def trained(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"idioms{request.param}")
    out = run_module_json("tests._tf1_gradient_idioms", str(root),
                          env={"FENWICKS_DEVICE": f"cpu:{request.param}"}, timeout=1500)
    assert out["replicas"] == request.param
    return out


@pytest.mark.parametrize("idiom", [i for i in idioms.IDIOMS if i != "ema"])
def test_each_gradient_idiom_trains_as_tf1(trained, idiom):
    result = trained[idiom]
    assert "error" not in result, result
    w1, w2 = tf1_rule(idiom, trained["replicas"])
    np.testing.assert_allclose(result["w1"], w1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result["w2"], w2, rtol=1e-5, atol=1e-6)


def test_the_idioms_are_told_apart(trained):
    """The checks above are not vacuous: clipping to 1e-3 moves the weights by at most
    1e-3 * lr per step (per replica summed), where minimize moves them far more."""
    start = np.concatenate([idioms.W1.ravel(), idioms.W2.ravel()])

    def moved(idiom):
        r = trained[idiom]
        return np.linalg.norm(np.concatenate([np.ravel(r["w1"]), np.ravel(r["w2"])]) - start)

    assert moved("minimize") > 0.1
    bound = idioms.STEPS * idioms.LR * idioms.CLIP
    assert moved("clip_global") <= bound * (1 + 1e-4)
    assert moved("cs_clip_global") <= trained["replicas"] * bound * (1 + 1e-4)
    assert np.allclose(trained["freeze_body"]["w1"], idioms.W1)


def test_a_layer_regulariser_trains_only_where_the_model_fn_adds_it(trained):
    """TF1 put kernel_regularizer's value in the REGULARIZATION_LOSSES collection, and
    only a program that added it (get_regularization_loss, get_total_loss) trained with
    it. Every idiom's body has one; the engine used to add it to every model_fn's loss,
    moving W1 by an extra 2 * REG * W1 * LR per step (freeze_body's too)."""
    plain = tf1_rule("minimize", trained["replicas"])
    added = tf1_rule("reg_added", trained["replicas"])
    assert np.abs(added[0] - plain[0]).max() > 1e-3  # the rule tells them apart
    np.testing.assert_allclose(trained["minimize"]["w1"], plain[0], rtol=1e-5, atol=1e-6)
    for idiom in ("cs_reg_added", "reg_total_loss"):
        np.testing.assert_allclose(trained[idiom]["w1"], added[0], rtol=1e-5, atol=1e-6)


def test_the_eval_loss_with_the_regulariser_added_is_exact_on_a_padded_batch(trained):
    """get_total_loss() in EVAL: each real example's squared error plus the regulariser
    (the same for every example), over the 7 real rows of a batch padded to 8."""
    x, y = idioms.data()
    w1, w2 = tf1_rule("reg_total_loss", trained["replicas"])
    per_example = ((x[:7] @ w1 @ w2 - y[:7]) ** 2).mean(axis=1)
    expected = per_example.mean() + idioms.REG * np.sum(w1 ** 2)
    assert trained["reg_total_loss"]["padded_eval_loss"] == pytest.approx(expected, rel=1e-5)


def test_global_norm_of_tf_gradients_is_the_true_norm(trained):
    """tf.global_norm(tf.gradients(loss, tf.trainable_variables())) in a model_fn is the
    norm of each replica's gradient (it read 0.0 before), averaged over the replicas'
    batches by the mean metric, after minimize's 2 steps."""
    x, y = idioms.data()
    w1, w2 = tf1_rule("minimize", trained["replicas"])
    rows = len(x) // trained["replicas"]
    norms = [np.sqrt(sum(np.sum(g ** 2) for g in _replica_gradients(
        w1, w2, x[r * rows:(r + 1) * rows], y[r * rows:(r + 1) * rows])))
        for r in range(trained["replicas"])]
    assert trained["minimize"]["eval_grad_norm"] == pytest.approx(np.mean(norms), rel=1e-5)


def test_exponential_moving_average_is_refused_in_one_sentence(trained):
    result = trained["ema"]
    assert result["type"] == "ModelFnError"
    assert result["error"].startswith(
        "model_fn called tf.compat.v1.train.ExponentialMovingAverage(...).apply(...)")
    assert "remove the ExponentialMovingAverage lines" in result["error"]
    assert result["error"].count(". ") == 0
