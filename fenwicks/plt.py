"""Plots for notebooks: learning-rate schedules, class balance, image batches, training
curves, the LR finder and forecasts.

Every function returns its `matplotlib.figure.Figure`; a notebook shows it as the cell's
value, a script saves it with ``fig.savefig(path)``. matplotlib is imported on first use,
so ``import fenwicks`` stays light.

    fig = fw.plt.plot_lr_func(lr_func, total_steps=1000)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from fenwicks._removed import removed_error

# Bookkeeping an evaluation or a log row carries next to its metrics: never a curve.
_NOT_CURVES = ("step", "epoch", "global_step", "num_examples")


def _pyplot():
    # Imported here, not at module level: importing fenwicks must not pull in a GUI
    # backend, and matplotlib picks the notebook's inline backend by itself.
    import matplotlib.pyplot as pyplot

    return pyplot


def _new_figure(n_axes: int = 1, figsize: tuple[float, float] = (6.0, 4.0)):
    """A figure with `n_axes` axes side by side, detached from pyplot's state machine.

    Returns:
        ``(fig, axes)`` with `axes` a list, even for one axis.
    """
    pyplot = _pyplot()
    fig, axes = pyplot.subplots(1, n_axes, figsize=figsize, squeeze=False)
    # Closed right away so a loop that plots does not pile up open figures; Jupyter
    # still renders a returned Figure through its repr.
    pyplot.close(fig)
    return fig, list(axes[0])


def _to_float(value: Any) -> float:
    """A Python float from a number, numpy scalar or eager tensor."""
    if hasattr(value, "numpy"):
        value = value.numpy()
    return float(np.asarray(value))


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")


def _schedule_values(lr_func: Callable[[Any], Any], steps: np.ndarray) -> np.ndarray:
    """``lr_func`` at every step: one vectorised call if it takes an array (fw.train
    schedules do; thousands of scalar calls would take seconds), else step by step."""
    try:
        values = np.asarray(lr_func(steps), dtype=float)
    except Exception:  # noqa: BLE001 - any scalar-only callable, e.g. one using `if step < n`
        values = None
    if values is None or values.shape != steps.shape:
        values = np.array([_to_float(lr_func(int(step))) for step in steps])
    return values


def plot_lr_func(lr_func: Callable[[Any], Any], total_steps: int,
                 title: str = "Learning rate schedule"):
    """Plots a learning-rate schedule over steps ``0 .. total_steps - 1``.

    Args:
        lr_func: any callable ``step -> learning rate`` (a `fw.train` schedule, an
            optax-style function, a Keras `LearningRateSchedule`). It may return a
            Python number, a numpy scalar or a tensor.
        total_steps: number of steps to plot.
        title: the axes title. Defaults to ``"Learning rate schedule"``.

    Returns:
        The figure; its one line has x = steps and y = ``lr_func(step)``.

    Raises:
        ValueError: if `lr_func` is not callable or `total_steps` is not a positive int.

    Examples:
        >>> lr_func = fw.train.one_cycle_lr(0.4, 1000, 200, fw.train.linear_decay())
        >>> fw.plt.plot_lr_func(lr_func, 1000)
        <Figure size ... with 1 Axes>
    """
    if not callable(lr_func):
        raise ValueError(f"lr_func={lr_func!r} must be a callable step -> learning rate")
    _check_positive_int("total_steps", total_steps)
    steps = np.arange(total_steps)
    lrs = _schedule_values(lr_func, steps)
    fig, (ax,) = _new_figure()
    ax.plot(steps, lrs)
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return fig


def plot_counts_pie(labels: Iterable[Any], class_names: Sequence[str] | None = None,
                    title: str = "Examples per class", w: int = 500, h: int = 500):
    """Pie chart of how many examples each class has: the first look at class balance.

    Args:
        labels: one label per example (ints or strings; a numpy array, list or tensor).
        class_names: names for integer labels, ``class_names[label]``. Defaults to the
            labels themselves.
        title: the axes title. Defaults to ``"Examples per class"``.
        w: figure width in pixels (at 100 dpi). Defaults to 500.
        h: figure height in pixels. Defaults to 500.

    Returns:
        The figure; wedge ``i`` is the ``i``-th class in sorted order, its text
        ``"<class> (<count>)"``.

    Raises:
        ValueError: if `labels` is empty or a label has no entry in `class_names`.

    Examples:
        >>> y_train = np.array([0, 1, 1, 1])
        >>> fw.plt.plot_counts_pie(y_train, class_names=['cat', 'dog'])
        <Figure size ... with 1 Axes>
    """
    _check_positive_int("w", w)
    _check_positive_int("h", h)
    values = np.asarray(labels.numpy() if hasattr(labels, "numpy") else list(labels))
    if values.size == 0:
        raise ValueError("labels is empty; pass one label per example")
    classes, counts = np.unique(values.reshape(-1), return_counts=True)
    names = [_class_name(c, class_names) for c in classes]
    fig, (ax,) = _new_figure(figsize=(w / 100, h / 100))
    ax.pie(counts, labels=[f"{name} ({count})" for name, count in zip(names, counts, strict=True)],
           autopct="%1.1f%%", startangle=90, counterclock=False)
    ax.set_title(title, pad=24)  # clear of the wedge labels at the top
    ax.axis("equal")  # a round pie, whatever the figure's aspect
    return fig


def _class_name(label: Any, class_names: Sequence[str] | None) -> str:
    if hasattr(label, "decode"):
        label = label.decode()
    if class_names is None:
        return str(label)
    index = int(label)
    if not 0 <= index < len(class_names):
        raise ValueError(
            f"label {index} has no name: class_names has {len(class_names)} entries; "
            "pass a name for every class or class_names=None")
    return str(class_names[index])


def show_batch(data: Any, n: int = 16, converter: Callable[[np.ndarray], Any] | None = None,
               class_names: Sequence[str] | None = None, batch_size: int | None = None,
               cols: int | None = None):
    """Shows the first `n` examples of a dataset as an image grid titled by label.

    Looking at what the model will actually see (after decoding, augmentation and
    normalisation) catches most input bugs: swapped channels, wrong labels, black images.

    Args:
        data: an input function ``params -> tf.data.Dataset`` (called with
            ``{'batch_size': batch_size}``), a `tf.data.Dataset` of ``(image, label)``
            batches or examples, or a tuple ``(images, labels)`` of arrays.
        n: number of examples to show. Defaults to 16.
        converter: applied to each image before display, e.g. to undo normalisation:
            ``lambda x: x * std + mean``. Defaults to none. Float images in [0, 1] are
            shown as they are, in [0, 255] divided by 255, others stretched to [0, 1].
        class_names: names for integer (or one-hot) labels. Defaults to the numbers.
        batch_size: the ``params['batch_size']`` given to an input function. Defaults
            to `n`.
        cols: images per row. Defaults to ``ceil(sqrt(n))``.

    Returns:
        The figure; one axes per image (shown with ``imshow``) titled by its label.

    Raises:
        ValueError: for a non-positive `n`, or data of a type it cannot read.

    Examples:
        >>> X, y = np.random.rand(16, 8, 8, 1), np.arange(16) % 2
        >>> fw.plt.show_batch(lambda params: fw.data.numpy_ds(X, y, params['batch_size']),
        ...                   n=8, class_names=['zero', 'one'])
        <Figure size ... with 8 Axes>
    """
    _check_positive_int("n", n)
    images, labels = _take_examples(data, n, batch_size or n)
    cols = cols or math.ceil(math.sqrt(len(images)))
    rows = math.ceil(len(images) / cols)
    pyplot = _pyplot()
    fig, axes = pyplot.subplots(rows, cols, figsize=(1.8 * cols, 1.9 * rows), squeeze=False)
    pyplot.close(fig)
    for ax in axes.flat[len(images):]:
        fig.delaxes(ax)
    for ax, image, label in zip(axes.flat, images, labels, strict=False):
        _show_image(ax, converter(image) if converter else image)
        ax.set_title(_label_text(label, class_names), fontsize=9)
    fig.tight_layout()
    return fig


def show_image_files(paths: Sequence[str], n_img: int = 20, h_inch: float = 2.0,
                     w_inch: float = 2.0, labels: Sequence[Any] | None = None,
                     class_names: Sequence[str] | None = None, cols: int | None = None):
    """Shows the first `n_img` image files (JPEG, PNG, GIF, BMP; local or ``gs://``) as
    a grid, each titled by its file name or its label.

    Args:
        paths: image files, e.g. the ``paths`` `fw.data.data_dir_tfrecord` returns.
        n_img: how many to show. Defaults to 20.
        h_inch: height of each image in inches. Defaults to 2.
        w_inch: width of each image in inches. Defaults to 2.
        labels: one label per path (titles). Defaults to the file names.
        class_names: names for integer labels.
        cols: images per row. Defaults to ``ceil(sqrt(n))``.

    Returns:
        The figure; one axes per image.

    Examples:
        >>> import os
        >>> png = tf.io.encode_png(tf.zeros([4, 4, 3], tf.uint8)).numpy()
        >>> for path in ['pets/cat/1.png', 'pets/dog/1.png', 'pets/dog/2.png']:
        ...     os.makedirs(os.path.dirname(path), exist_ok=True)
        ...     _ = open(path, 'wb').write(png)
        >>> paths, y, labels = fw.data.data_dir_tfrecord('pets', 'pets.tfrec', shuffle=False)
        >>> fig = fw.plt.show_image_files(paths, labels=y, class_names=labels)
        >>> [ax.get_title() for ax in fig.axes]
        ['cat', 'dog', 'dog']
    """
    import tensorflow as tf  # only for decoding (and reading gs://)

    _check_positive_int("n_img", n_img)
    paths = list(paths)[:n_img]
    if not paths:
        raise ValueError("paths is empty; give at least one image file")
    cols = cols or math.ceil(math.sqrt(len(paths)))
    rows = math.ceil(len(paths) / cols)
    pyplot = _pyplot()
    fig, axes = pyplot.subplots(rows, cols, figsize=(w_inch * cols, (h_inch + 0.3) * rows),
                                squeeze=False)
    pyplot.close(fig)
    for ax in axes.flat[len(paths):]:
        fig.delaxes(ax)
    for i, (ax, path) in enumerate(zip(axes.flat, paths, strict=False)):
        image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        _show_image(ax, image.numpy())
        title = _label_text(labels[i], class_names) if labels is not None \
            else path.replace("\\", "/").rsplit("/", 1)[-1]
        ax.set_title(title, fontsize=8)
    fig.tight_layout()
    return fig


def _take_examples(data: Any, n: int, batch_size: int) -> tuple[list, list]:
    """The first `n` ``(image, label)`` pairs of `data` as numpy arrays."""
    if isinstance(data, tuple) and len(data) == 2:
        images, labels = np.asarray(data[0]), np.asarray(data[1])
        return list(images[:n]), list(labels[:n])
    if callable(data) and not hasattr(data, "element_spec"):
        data = data({"batch_size": batch_size})
    if not hasattr(data, "element_spec"):
        raise ValueError(
            f"data={type(data).__name__} must be an input function params -> "
            "tf.data.Dataset, a tf.data.Dataset or a tuple (images, labels)")
    spec = data.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        raise ValueError(f"data must yield (image, label) pairs; its elements are {spec}")
    batched = _is_batched(spec[0].shape)
    images, labels = [], []
    for x, y in data.as_numpy_iterator():
        images.extend(x if batched else [x])
        labels.extend(y if batched else [y])
        if len(images) >= n:
            break
    return images[:n], labels[:n]


def _is_batched(shape: Any) -> bool:
    """Whether dataset elements of `shape` are batches of images or single images:
    [B, H, W, C] and [B, H, W] (grey, no channel axis) versus [H, W, C] and [H, W]."""
    rank = len(shape)
    if rank == 3:  # [H, W, C] with 1, 3 or 4 channels, else a batch of grey [H, W]
        return shape[-1] not in (1, 3, 4)
    return rank == 4


def _show_image(ax, image: Any) -> None:
    image = np.asarray(image)
    if image.ndim == 3 and image.shape[-1] == 1:
        image = image[..., 0]
    if image.dtype.kind == "f":
        image = _unit_range(image)
    ax.imshow(image, cmap="gray" if image.ndim == 2 else None)
    ax.axis("off")


def _unit_range(image: np.ndarray) -> np.ndarray:
    """Float pixels for imshow, which clips to [0, 1]: [0, 1] as is, [0, 255] scaled,
    anything else (normalised inputs) stretched from its min and max."""
    low, high = float(image.min()), float(image.max())
    if low >= 0 and high <= 1:
        return image
    if low > -1 and high < 256:  # pixel values, give or take rounding after un-normalising
        return np.clip(image / 255.0, 0.0, 1.0)
    return (image - low) / (high - low)


def _label_text(label: Any, class_names: Sequence[str] | None) -> str:
    label = np.asarray(label)
    if label.ndim == 1 and label.size > 1:  # one-hot or probabilities
        label = np.argmax(label)
    return _class_name(label.reshape(()).item(), class_names)


def _history_columns(history: Any) -> dict[str, np.ndarray]:
    """A dict of lists or a list of dicts as numeric columns of equal length."""
    if isinstance(history, Mapping):
        columns = {key: list(values) for key, values in history.items()}
    elif isinstance(history, Sequence) and all(isinstance(row, Mapping) for row in history):
        keys = dict.fromkeys(key for row in history for key in row)
        # Rows may miss a key (validation only every few epochs): NaN leaves a gap.
        columns = {key: [row.get(key, np.nan) for row in history] for key in keys}
    else:
        raise ValueError(
            f"history={type(history).__name__} must be a dict of lists like "
            "{'step': [...], 'loss': [...]}, a list of dicts like [{'loss': 0.5}, ...], "
            "an fw.train.History or the estimator that trained")
    if not columns or not any(len(values) for values in columns.values()):
        raise ValueError("history is empty; train first, then plot what train() returned")
    return {key: np.asarray(values, dtype=float) for key, values in columns.items()
            if _is_numeric(values)}


def _is_numeric(values: list) -> bool:
    try:
        np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        return False
    return True


def _estimator_curves(history: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Curves of an `fw.train.History`: the loss per step, each evaluation metric."""
    if not history.losses and not history.evals:
        raise ValueError("history is empty; train first, then plot what train() returned")
    curves = {"loss": (np.asarray(history.steps, float), np.asarray(history.losses, float))}
    names = dict.fromkeys(key for result in history.evals for key in result)
    for name in names:
        if name in _NOT_CURVES:
            continue
        rows = [result for result in history.evals if name in result]
        label = name if name.startswith("val_") else f"val_{name}"
        curves[label] = (np.array([row["global_step"] for row in rows], float),
                         np.array([row[name] for row in rows], float))
    return curves


def _history_curves(history: Any, x: str | None) -> tuple[str, dict]:
    """``(x label, {name: (xs, ys)})`` from any history `plot_history` accepts."""
    history = getattr(history, "history", history)  # an Estimator or a keras History
    if all(hasattr(history, name) for name in ("steps", "losses", "evals")):
        return "step", _estimator_curves(history)
    columns = _history_columns(history)
    x_key = x or next((key for key in ("step", "epoch") if key in columns), None)
    if x_key is not None and x_key not in columns:
        raise ValueError(f"x={x!r} is not a column of history; columns: {sorted(columns)}")
    length = max(len(values) for values in columns.values())
    xs = columns[x_key] if x_key else np.arange(length, dtype=float)
    return x_key or "point", {key: (xs, values) for key, values in columns.items()
                              if key != x_key and key not in _NOT_CURVES}


def plot_history(history: Any, x: str | None = None):
    """Plots training curves: losses on the left, every other metric on the right.

    Args:
        history: what training recorded: an `fw.train.History` (``est.history``, or
            the estimator itself, which `est.train` returns), a dict of lists such as
            ``{'step': [...], 'loss': [...], 'val_accuracy': [...]}``, a list of dicts
            (one per logged point), or a Keras `History`. Evaluation results of an
            `fw.train.History` are plotted as ``val_<metric>`` at their global step.
        x: the column used as x axis for a dict or list history. Defaults to
            ``'step'``, else ``'epoch'``, else the point's index.

    Returns:
        The figure: axes 0 has one line per loss (``loss``, ``val_loss``, anything
        ending in ``loss``); axes 1, if there are other metrics, one line per metric
        (``val_accuracy``, ...). Line labels are the names.

    Raises:
        ValueError: for an empty history, an unknown `x`, or no loss or metric columns.

    Examples:
        >>> history = fw.train.History(   # est.history after est.train(...)
        ...     steps=[1, 2, 3], losses=[2.3, 1.9, 1.2],
        ...     evals=[{'global_step': 3, 'loss': 1.4, 'accuracy': 0.6}])
        >>> fig = fw.plt.plot_history(history)
        >>> [[line.get_label() for line in ax.get_lines()] for ax in fig.axes]
        [['loss', 'val_loss'], ['val_accuracy']]
    """
    x_label, curves = _history_curves(history, x)
    if not curves:
        raise ValueError("history has no loss or metric columns; record a 'loss' or a "
                         "metric such as 'accuracy'")
    losses = [key for key in curves if key.endswith("loss")]
    metrics = [key for key in curves if key not in losses]
    groups = [group for group in (losses, metrics) if group]
    fig, axes = _new_figure(len(groups), figsize=(5.5 * len(groups), 4.0))
    for ax, group in zip(axes, groups, strict=True):
        _plot_curves(ax, {key: curves[key] for key in group})
        ax.set_xlabel(x_label)
        ax.set_ylabel("loss" if group is losses else "metric")
    return fig


def _plot_curves(ax, curves: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    for key, (xs, values) in curves.items():
        keep = ~np.isnan(values)  # a metric logged less often than the loss
        ax.plot(xs[keep], values[keep], marker="." if keep.sum() < 30 else None, label=key)
    ax.legend()
    ax.grid(alpha=0.3)


def plot_lr_find(lrs: Any, losses: Sequence[float] | None = None,
                 suggested_lr: float | None = None, skip_end: int = 0):
    """Plots the LR finder's loss against learning rate on a log axis.

    Pick a learning rate on the steep descent, roughly ten times below the minimum:
    that is where the loss still falls fast and training is stable.

    Args:
        lrs: the learning rates tried; or the whole result of `fw.train.find_lr` (an
            `LRFinderResult`, or any object or dict with ``lrs`` and ``losses``, and
            optionally ``smoothed`` and ``suggestion``); or a list of ``(lr, loss)`` pairs.
        losses: the loss at each learning rate, when `lrs` is a sequence.
        suggested_lr: a learning rate to mark with a vertical line. Defaults to the
            result's own ``suggestion``, if any.
        skip_end: points to drop at the end, where the loss has blown up and would
            squash the interesting part of the curve. Defaults to 0.

    Returns:
        The figure. Its first line has x = learning rates and y = the smoothed losses
        if the result has them (the curve to read), else the losses; with smoothed
        losses the raw ones follow as a faint second line.

    Raises:
        ValueError: if `lrs` and `losses` differ in length, are empty, or an lr <= 0.

    Examples:
        >>> fig = fw.plt.plot_lr_find([1e-4, 1e-3, 1e-2, 1e-1, 1.0],   # or find_lr's result
        ...                           [2.3, 2.1, 1.5, 1.8, 9.0], suggested_lr=1e-3)
        >>> axes = fig.axes[0]
        >>> axes.get_xscale(), axes.get_lines()[0].get_ydata().tolist()
        ('log', [2.3, 2.1, 1.5, 1.8, 9.0])
    """
    lrs, curves, suggested_lr = _lr_find_arrays(lrs, losses, suggested_lr)
    if skip_end:
        lrs, curves = lrs[:-skip_end], {k: v[:-skip_end] for k, v in curves.items()}
    if lrs.size == 0 or np.any(lrs <= 0):
        raise ValueError(f"lrs must be non-empty and positive for a log axis; got {lrs[:5]}")
    fig, (ax,) = _new_figure()
    for label, values in curves.items():
        ax.plot(lrs, values, label=label, **({"alpha": 0.3} if label == "loss" and
                                             len(curves) > 1 else {}))
    ax.set_xscale("log")
    if suggested_lr is not None:
        ax.axvline(suggested_lr, color="tab:red", linestyle="--",
                   label=f"suggested lr {suggested_lr:.2g}")
    ax.legend()
    ax.set_xlabel("learning rate (log scale)")
    ax.set_ylabel("training loss")
    ax.grid(alpha=0.3)
    return fig


def _lr_find_arrays(lrs: Any, losses: Any, suggested: float | None):
    """``(lrs, {label: values}, suggested_lr)`` from the shapes `plot_lr_find` accepts."""
    curves: dict[str, Any] = {}
    if losses is None:
        result = lrs
        get = result.get if isinstance(result, Mapping) else (
            lambda key, default=None: getattr(result, key, default))
        if get("lrs") is not None:
            lrs, losses = get("lrs"), get("losses")
            if get("smoothed") is not None:
                curves["smoothed loss"] = get("smoothed")
            if suggested is None:
                suggested = get("suggestion", get("suggested_lr"))
        else:  # (lr, loss) pairs
            pairs = np.asarray(result, dtype=float)
            if pairs.ndim != 2 or pairs.shape[1] != 2:
                raise ValueError("plot_lr_find needs lrs and losses, a find_lr result, "
                                 f"or (lr, loss) pairs; got {type(result).__name__}")
            lrs, losses = pairs[:, 0], pairs[:, 1]
    curves["loss"] = losses
    lrs = np.asarray(lrs, dtype=float)
    curves = {label: np.asarray(values, dtype=float) for label, values in curves.items()}
    for values in curves.values():
        if values.shape != lrs.shape:
            raise ValueError(f"lrs has {lrs.size} values but losses has {values.size}; "
                             "pass one loss per learning rate")
    return lrs, curves, suggested


def plot_forecast(y_true: Any, y_pred: Any, history: Any = None,
                  labels: Sequence[str] | None = None, title: str = "Forecast"):
    """Plots predictions against the truth, optionally after the input history.

    Time runs along the x axis: the history (if given) at ``-len(history) .. -1``, the
    forecast horizon at ``0 .. len(y_true) - 1``. Multi-output forecasts (one column
    per variable) get one axes per column.

    Args:
        y_true: true values, shape ``(T,)`` or ``(T, k)`` for `k` variables.
        y_pred: predictions, the same shape as `y_true`.
        history: past observed values before the horizon, ``(H,)`` or ``(H, k)``.
            Defaults to none.
        labels: a name per variable for axes titles. Defaults to ``title``.
        title: the title when `labels` is not given. Defaults to ``"Forecast"``.

    Returns:
        The figure; each axes has the lines ``history`` (if given), ``truth`` and
        ``prediction``, in that order.

    Raises:
        ValueError: if `y_true` and `y_pred` differ in shape, or `history` or `labels`
            do not match the number of variables.

    Examples:
        >>> y_test = np.sin(np.arange(200) / 10)             # the truth, one variable
        >>> preds = y_test + np.random.default_rng(0).normal(0, 0.1, 200)
        >>> fw.plt.plot_forecast(y_test, preds, labels=['temperature'])
        <Figure size ... with 1 Axes>
    """
    y_true, y_pred = _as_columns(y_true), _as_columns(y_pred)
    if y_true.shape != y_pred.shape:
        raise ValueError(f"y_true has shape {y_true.shape} but y_pred has {y_pred.shape}; "
                         "pass one prediction per true value")
    k = y_true.shape[1]
    past = None if history is None else _as_columns(history)
    if past is not None and past.shape[1] != k:
        raise ValueError(f"history has {past.shape[1]} variables but y_true has {k}")
    if labels is not None and len(labels) != k:
        raise ValueError(f"labels has {len(labels)} names for {k} variables")
    fig, axes = _new_figure(k, figsize=(6.0 * k, 3.5))
    horizon = np.arange(len(y_true))
    for column, ax in enumerate(axes):
        if past is not None:
            ax.plot(np.arange(-len(past), 0), past[:, column], color="0.6", label="history")
        ax.plot(horizon, y_true[:, column], label="truth")
        ax.plot(horizon, y_pred[:, column], linestyle="--", label="prediction")
        ax.set_title(labels[column] if labels else title)
        ax.set_xlabel("time step")
        ax.legend()
        ax.grid(alpha=0.3)
    return fig


def _as_columns(values: Any) -> np.ndarray:
    array = np.asarray(values.numpy() if hasattr(values, "numpy") else values, dtype=float)
    if array.ndim == 1:
        return array[:, None]
    if array.ndim == 2:
        return array
    raise ValueError(f"expected values of shape (T,) or (T, k); got shape {array.shape}")


__all__ = [
    "plot_counts_pie",
    "plot_forecast",
    "plot_history",
    "plot_lr_find",
    "plot_lr_func",
    "show_batch",
    "show_image_files",
]


_REMOVED = {
    "setup": "nothing: fw.plt draws matplotlib figures, which notebooks show inline",
    "plot_scatter": "matplotlib directly (fw.plt functions return their Figure)",
    "plot_df_counts": "plot_counts_pie(df[col]) or df[col].value_counts().plot.bar()",
    "plot_pie_df": "plot_counts_pie(labels, class_names)",
    "plot_counts_pie_df": "plot_counts_pie(df[col])",
}


def __getattr__(name: str) -> object:
    raise removed_error("fenwicks.plt", name, _REMOVED)
