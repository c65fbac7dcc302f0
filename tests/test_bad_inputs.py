"""No silent wrong numbers, clear errors: bad evaluation data, one-hot labels for a
sparse classifier, an input_fn without `params`. One trained flagship mnist_net (width 4,
8x8 digits) is shared by the module. (An untrained model's warning: the shared evaluator's,
end to end in test_reference_engine.py.)
"""

from __future__ import annotations

import numpy as np
import pytest

import fenwicks as fw
from tests import _flagship as flagship


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    x, y = flagship.digits("mnist_net")
    est = flagship.estimator("mnist_net", str(tmp_path_factory.mktemp("bad") / "run"))
    est.train(flagship.train_input(x, y), steps=5)
    return est, x[flagship.NUM_TRAIN:], y[flagship.NUM_TRAIN:]


def _eval_fn(x, y):
    return lambda params: fw.data.numpy_ds(x, y, params["batch_size"], training=False)


def test_evaluation_data_with_a_label_out_of_range_is_an_error_with_the_count(trained):
    est, x, y = trained
    y = y.copy()
    y[-3:] = [10, 12, -1]  # past the first batch: the up-front check cannot see them
    with pytest.raises(ValueError, match=r"3 class label\(s\) outside \[0, 10\), of 773 "
                                         r"examples"):
        est.evaluate(_eval_fn(x, y))


def test_evaluation_data_with_nan_features_is_an_error_with_the_count(trained):
    est, x, y = trained
    x = x.copy()
    x[-1, 3, 3, 0], x[-2, 0, 0, 0] = np.nan, np.inf
    with pytest.raises(ValueError, match=r"2 example\(s\) with NaN or infinite features, "
                                         r"of 773 examples"):
        est.evaluate(_eval_fn(x, y))
    good = est.evaluate(_eval_fn(x[:-2], y[:-2]))  # the rest evaluates as before
    assert good["num_examples"] == 771 and np.isfinite(good["loss"])


def test_one_hot_labels_for_a_sparse_classifier_name_both_fixes(trained):
    est, x, y = trained
    one_hot = np.eye(10, dtype=np.float32)[y]
    fn = lambda params: fw.data.numpy_ds(x, one_hot, params["batch_size"])  # noqa: E731
    with pytest.raises(ValueError, match=r"labels have shape \[32, 10\], one-hot") as caught:
        est.train(fn, steps=1)
    assert "argmax" in str(caught.value)
    assert "categorical_crossentropy" in str(caught.value)
    assert est.global_step == 5  # nothing ran


def test_an_input_fn_without_params_is_named(trained):
    est, x, y = trained
    for call in (lambda: est.train(lambda: fw.data.numpy_ds(x, y, 32), steps=1),
                 lambda: est.evaluate(lambda: fw.data.numpy_ds(x, y, 32, training=False))):
        with pytest.raises(ValueError, match=r"input_fn must take one argument, params "
                                             r".*signature is <lambda>\(\)"):
            call()


def test_float_labels_that_are_not_class_ids_are_refused_by_a_classifier(trained):
    est, x, y = trained
    halves = y.astype(np.float32) + 0.5  # 0.5, 1.5, ...: truncated to 0, 1 before
    fn = lambda params: fw.data.numpy_ds(x, halves, params["batch_size"])  # noqa: E731
    with pytest.raises(ValueError, match=r"labels must be class ids \(whole numbers\), but "
                                         r"they are float32 and 32 of the first 32 are not "
                                         r"whole \(e\.g\. \d\.5\).*get_reg_model_func"):
        est.train(fn, steps=1)
    assert est.global_step == 5  # nothing ran
    with pytest.raises(ValueError, match=r"labels must be class ids"):
        est.evaluate(_eval_fn(x, halves))
    whole = est.evaluate(_eval_fn(x, y.astype(np.float32)))  # 3.0 is class 3: accepted
    assert whole["num_examples"] == len(y)
