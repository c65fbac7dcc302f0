"""fw.plt: each plot returns a figure whose drawn data equals independently computed values."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # headless: no display in CI

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import fenwicks as fw  # noqa: E402


def _lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def test_plot_lr_func_draws_the_schedule_at_every_step():
    def triangle(step):  # warm up 0 -> 1 over 4 steps, then down to 0 at step 10
        return step / 4 if step < 4 else (10 - step) / 6

    fig = fw.plt.plot_lr_func(triangle, total_steps=10)
    assert isinstance(fig, Figure)
    (line,) = fig.axes[0].get_lines()
    np.testing.assert_array_equal(line.get_xdata(), np.arange(10))
    expected = [0, 0.25, 0.5, 0.75, 1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6]
    np.testing.assert_allclose(line.get_ydata(), expected)


def test_plot_lr_func_evaluates_fenwicks_schedules_at_every_step():
    # one-cycle: 0 -> 0.4 linearly over 4 steps, then linearly down to 0 at step 10.
    lr_func = fw.train.one_cycle_lr(0.4, 10, 4, fw.train.linear_decay())
    fig = fw.plt.plot_lr_func(lr_func, total_steps=11)
    expected = [0, 0.1, 0.2, 0.3, 0.4, 0.4 * 5 / 6, 0.4 * 4 / 6, 0.4 * 3 / 6, 0.4 * 2 / 6,
                0.4 / 6, 0]
    np.testing.assert_allclose(fig.axes[0].get_lines()[0].get_ydata(), expected,
                               rtol=1e-6, atol=1e-7)


def test_plot_lr_func_accepts_tensor_returning_schedules():
    schedule = tf.keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=5,
                                                              decay_rate=0.5)
    fig = fw.plt.plot_lr_func(schedule, total_steps=11)
    expected = 0.1 * 0.5 ** (np.arange(11) / 5)
    np.testing.assert_allclose(fig.axes[0].get_lines()[0].get_ydata(), expected, rtol=1e-6)


@pytest.mark.parametrize("steps", [0, -3, 2.5, True])
def test_plot_lr_func_rejects_bad_total_steps(steps):
    with pytest.raises(ValueError, match="total_steps"):
        fw.plt.plot_lr_func(lambda s: 0.1, total_steps=steps)


def test_plot_lr_func_rejects_a_non_callable():
    with pytest.raises(ValueError, match="lr_func"):
        fw.plt.plot_lr_func(0.1, total_steps=5)


def test_plot_counts_pie_wedges_are_proportional_to_class_counts():
    labels = np.array([2, 0, 0, 1, 0, 2, 0, 0])  # counts: 0 -> 5, 1 -> 1, 2 -> 2
    fig = fw.plt.plot_counts_pie(labels, class_names=["cat", "dog", "bird"])
    wedges = fig.axes[0].patches
    angles = np.array([(w.theta2 - w.theta1) % 360 for w in wedges])
    np.testing.assert_allclose(angles, 360 * np.array([5, 1, 2]) / 8, atol=1e-6)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert {"cat (5)", "dog (1)", "bird (2)"} <= set(texts)
    assert "62.5%" in texts  # 5 / 8


def test_plot_counts_pie_string_labels_and_errors():
    fig = fw.plt.plot_counts_pie(["b", "a", "b"])
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert {"a (1)", "b (2)"} <= set(texts)
    with pytest.raises(ValueError, match="empty"):
        fw.plt.plot_counts_pie([])
    with pytest.raises(ValueError, match="label 3 has no name"):
        fw.plt.plot_counts_pie([0, 3], class_names=["a", "b"])


def _images(n, h=4, w=5, c=1):
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(n, h, w, c)).astype(np.uint8)


def test_show_batch_from_an_input_function_shows_the_first_n_images_with_labels():
    images, labels = _images(10), np.arange(10) % 3
    seen = {}

    def input_func(params):
        seen.update(params)
        return tf.data.Dataset.from_tensor_slices((images, labels)).batch(
            params["batch_size"])

    fig = fw.plt.show_batch(input_func, n=6, class_names=["a", "b", "c"], batch_size=4)
    assert seen == {"batch_size": 4}
    assert len(fig.axes) == 6  # 3 x 3 grid, 3 unused axes removed
    for i, ax in enumerate(fig.axes):
        np.testing.assert_array_equal(ax.images[0].get_array(), images[i, :, :, 0])
        assert ax.get_title() == "abc"[labels[i]]


def test_show_batch_unbatched_dataset_one_hot_labels_and_converter():
    images = _images(3, c=3).astype(np.float32)
    one_hot = np.eye(4, dtype=np.float32)[[3, 1, 2]]
    ds = tf.data.Dataset.from_tensor_slices((images, one_hot))
    fig = fw.plt.show_batch(ds, n=3, converter=lambda x: x / 255.0)
    assert [ax.get_title() for ax in fig.axes] == ["3", "1", "2"]
    # float images already in [0, 1] are shown unchanged
    np.testing.assert_allclose(fig.axes[0].images[0].get_array(), images[0] / 255.0,
                               rtol=1e-6)


def test_show_batch_float_pixels_and_normalised_images_map_to_unit_range():
    pixels = np.array([[[0.0, 127.5], [255.0, 51.0]]], np.float32)  # [1, 2, 2] grey
    normalised = np.array([[[-2.0, 0.0], [2.0, 1.0]]], np.float32)
    fig = fw.plt.show_batch((np.concatenate([pixels, normalised]), np.array([0, 1])), n=2)
    np.testing.assert_allclose(fig.axes[0].images[0].get_array(),
                               [[0.0, 0.5], [1.0, 0.2]], rtol=1e-6)
    np.testing.assert_allclose(fig.axes[1].images[0].get_array(),
                               [[0.0, 0.5], [1.0, 0.75]], rtol=1e-6)  # (x + 2) / 4


def test_show_batch_grey_images_without_a_channel_axis_batched_or_not():
    grey = np.arange(2 * 5 * 6, dtype=np.uint8).reshape(2, 5, 6)
    for ds in (tf.data.Dataset.from_tensor_slices((grey, [4, 5])),
               tf.data.Dataset.from_tensor_slices((grey, [4, 5])).batch(2)):
        fig = fw.plt.show_batch(ds, n=2)
        assert [ax.get_title() for ax in fig.axes] == ["4", "5"]
        np.testing.assert_array_equal(fig.axes[1].images[0].get_array(), grey[1])


def test_show_batch_from_arrays_and_bad_input():
    images = _images(2, c=1)
    fig = fw.plt.show_batch((images, np.array([7, 8])), n=5)
    assert [ax.get_title() for ax in fig.axes] == ["7", "8"]
    with pytest.raises(ValueError, match="n=0"):
        fw.plt.show_batch((images, np.array([7, 8])), n=0)
    with pytest.raises(ValueError, match="data=str"):
        fw.plt.show_batch("images/", n=2)
    with pytest.raises(ValueError, match=r"\(image, label\) pairs"):
        fw.plt.show_batch(tf.data.Dataset.from_tensor_slices(images), n=2)


def test_plot_history_dict_of_lists_splits_losses_and_metrics():
    history = {"step": [10, 20, 30], "loss": [2.0, 1.0, 0.5], "val_loss": [2.2, 1.3, 0.9],
               "accuracy": [0.3, 0.6, 0.8], "val_accuracy": [0.25, 0.5, 0.7]}
    fig = fw.plt.plot_history(history)
    loss_ax, metric_ax = fig.axes
    losses, metrics = _lines(loss_ax), _lines(metric_ax)
    assert set(losses) == {"loss", "val_loss"} and set(metrics) == {"accuracy", "val_accuracy"}
    np.testing.assert_array_equal(losses["val_loss"].get_xdata(), [10, 20, 30])
    np.testing.assert_array_equal(losses["val_loss"].get_ydata(), [2.2, 1.3, 0.9])
    np.testing.assert_array_equal(metrics["accuracy"].get_ydata(), [0.3, 0.6, 0.8])
    assert loss_ax.get_xlabel() == "step"


def test_plot_history_list_of_dicts_with_gaps_and_keras_history():
    rows = [{"epoch": 1, "loss": 1.0}, {"epoch": 2, "loss": 0.8, "val_accuracy": 0.5},
            {"epoch": 3, "loss": 0.6}, {"epoch": 4, "loss": 0.4, "val_accuracy": 0.75}]
    fig = fw.plt.plot_history(rows)
    val = _lines(fig.axes[1])["val_accuracy"]
    np.testing.assert_array_equal(val.get_xdata(), [2, 4])  # missing points are skipped
    np.testing.assert_array_equal(val.get_ydata(), [0.5, 0.75])

    class FakeKerasHistory:  # keras.callbacks.History keeps its dict in .history
        history = {"loss": [3.0, 2.0]}

    fig = fw.plt.plot_history(FakeKerasHistory())
    (line,) = fig.axes[0].get_lines()
    np.testing.assert_array_equal(line.get_xdata(), [0, 1])
    np.testing.assert_array_equal(line.get_ydata(), [3.0, 2.0])


def test_plot_history_of_the_estimator_per_step_loss_and_evaluations():
    history = fw.train.History(
        steps=[1, 2, 3, 4], losses=[2.0, 1.5, 1.2, 1.0],
        evals=[{"global_step": 2, "loss": 1.6, "accuracy": 0.5, "num_examples": 10},
               {"global_step": 4, "loss": 1.1, "accuracy": 0.7, "num_examples": 10}])

    class FakeEstimator:  # est.train(...) returns the estimator; its .history is a History
        pass

    estimator = FakeEstimator()
    estimator.history = history
    for source in (history, estimator):
        fig = fw.plt.plot_history(source)
        losses, metrics = _lines(fig.axes[0]), _lines(fig.axes[1])
        np.testing.assert_array_equal(losses["loss"].get_xdata(), [1, 2, 3, 4])
        np.testing.assert_array_equal(losses["loss"].get_ydata(), [2.0, 1.5, 1.2, 1.0])
        np.testing.assert_array_equal(losses["val_loss"].get_xdata(), [2, 4])
        np.testing.assert_array_equal(losses["val_loss"].get_ydata(), [1.6, 1.1])
        np.testing.assert_array_equal(metrics["val_accuracy"].get_ydata(), [0.5, 0.7])
        assert set(losses) == {"loss", "val_loss"} and set(metrics) == {"val_accuracy"}
    with pytest.raises(ValueError, match="empty"):
        fw.plt.plot_history(fw.train.History())


def test_plot_history_bad_input():
    with pytest.raises(ValueError, match="empty"):
        fw.plt.plot_history({"loss": []})
    with pytest.raises(ValueError, match="dict of lists"):
        fw.plt.plot_history(3.0)
    with pytest.raises(ValueError, match="x='time'"):
        fw.plt.plot_history({"loss": [1.0]}, x="time")
    with pytest.raises(ValueError, match="no loss or metric"):
        fw.plt.plot_history({"step": [1, 2]})


def test_plot_lr_find_log_axis_and_suggestion_from_any_result_shape():
    lrs = np.geomspace(1e-5, 1.0, 6)
    losses = np.array([2.3, 2.2, 1.9, 1.2, 1.5, 9.0])
    for result in ({"lrs": lrs, "losses": losses, "suggestion": 1e-3},
                   type("Result", (), {"lrs": lrs, "losses": losses,
                                       "suggested_lr": 1e-3})()):
        fig = fw.plt.plot_lr_find(result)
        ax = fig.axes[0]
        assert ax.get_xscale() == "log"
        curve, marker = ax.get_lines()
        np.testing.assert_allclose(curve.get_xdata(), lrs)
        np.testing.assert_allclose(curve.get_ydata(), losses)
        np.testing.assert_allclose(marker.get_xdata(), [1e-3, 1e-3])
    fig = fw.plt.plot_lr_find(lrs, losses, skip_end=1)
    np.testing.assert_allclose(fig.axes[0].get_lines()[0].get_ydata(), losses[:-1])
    fig = fw.plt.plot_lr_find(list(zip(lrs, losses, strict=True)))
    np.testing.assert_allclose(fig.axes[0].get_lines()[0].get_xdata(), lrs)


def test_plot_lr_find_of_an_lr_finder_result_reads_the_smoothed_curve():
    lrs = [1e-4, 1e-3, 1e-2, 1e-1]
    losses = [2.0, 1.0, 0.5, 4.0]
    smoothed = [2.0, 1.5, 1.1, 1.8]
    result = fw.train.LRFinderResult(lrs=lrs, losses=losses, smoothed=smoothed,
                                     suggestion=1e-2, min_loss_lr=1e-2, diverged=True)
    lines = _lines(fw.plt.plot_lr_find(result).axes[0])
    np.testing.assert_allclose(lines["smoothed loss"].get_ydata(), smoothed)
    np.testing.assert_allclose(lines["loss"].get_ydata(), losses)
    np.testing.assert_allclose(lines["suggested lr 0.01"].get_xdata(), [1e-2, 1e-2])
    assert lines["loss"].get_alpha() == 0.3  # raw losses faint behind the smoothed curve


def test_plot_lr_find_bad_input():
    with pytest.raises(ValueError, match="losses has 2"):
        fw.plt.plot_lr_find([1e-3, 1e-2, 1e-1], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        fw.plt.plot_lr_find([0.0, 1e-2], [1.0, 2.0])
    with pytest.raises(ValueError, match="find_lr result"):
        fw.plt.plot_lr_find([1e-3, 1e-2])


def test_plot_forecast_history_truth_and_prediction_per_variable():
    t = np.arange(5)
    truth = np.stack([np.sin(t), np.cos(t)], axis=1)
    pred = truth + 0.1
    past = np.ones((3, 2))
    fig = fw.plt.plot_forecast(truth, pred, history=past, labels=["temp", "wind"])
    assert [ax.get_title() for ax in fig.axes] == ["temp", "wind"]
    lines = _lines(fig.axes[1])
    np.testing.assert_array_equal(lines["history"].get_xdata(), [-3, -2, -1])
    np.testing.assert_array_equal(lines["truth"].get_xdata(), t)
    np.testing.assert_allclose(lines["truth"].get_ydata(), np.cos(t))
    np.testing.assert_allclose(lines["prediction"].get_ydata(), np.cos(t) + 0.1)


def test_plot_forecast_bad_input():
    with pytest.raises(ValueError, match="y_pred has"):
        fw.plt.plot_forecast(np.zeros(4), np.zeros(5))
    with pytest.raises(ValueError, match="history has 2 variables"):
        fw.plt.plot_forecast(np.zeros(4), np.zeros(4), history=np.zeros((3, 2)))
    with pytest.raises(ValueError, match="labels has 2"):
        fw.plt.plot_forecast(np.zeros(4), np.zeros(4), labels=["a", "b"])
    with pytest.raises(ValueError, match="shape"):
        fw.plt.plot_forecast(np.zeros((2, 2, 2)), np.zeros((2, 2, 2)))


def test_plot_counts_pie_takes_the_originals_width_in_pixels():
    fig = fw.plt.plot_counts_pie([0, 1, 1], ["a", "b"], w=450)
    assert tuple(fig.get_size_inches()) == (4.5, 5.0)  # 450 px and the default 500 px
    assert tuple(fw.plt.plot_counts_pie([0], w=300, h=200).get_size_inches()) == (3.0, 2.0)
    with pytest.raises(ValueError, match="w=0"):
        fw.plt.plot_counts_pie([0], w=0)


def test_show_image_files_shows_each_file_titled_by_name_or_label(tmp_path):
    paths = []
    for i in range(3):
        pixels = np.full((4, 6, 3), 40 * i, np.uint8)
        paths.append(str(tmp_path / f"img{i}.png"))
        tf.io.write_file(paths[-1], tf.io.encode_png(pixels))
    fig = fw.plt.show_image_files(paths, n_img=2, h_inch=1, w_inch=1)
    assert [ax.get_title() for ax in fig.axes] == ["img0.png", "img1.png"]
    np.testing.assert_array_equal(fig.axes[1].images[0].get_array(),
                                  np.full((4, 6, 3), 40, np.uint8))
    fig = fw.plt.show_image_files(paths, labels=[1, 0, 1], class_names=["cat", "dog"])
    assert [ax.get_title() for ax in fig.axes] == ["dog", "cat", "dog"]
    with pytest.raises(ValueError, match="paths is empty"):
        fw.plt.show_image_files([])
