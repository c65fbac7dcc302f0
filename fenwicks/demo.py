"""``python -m fenwicks demo``: the tutorial-1 network on scikit-learn's handwritten digits.

Real data with no download (1,797 8x8 images bundled with scikit-learn), trained through
the estimator on whatever accelerator is present, with the progress bar. It prints the
exact test accuracy, the training speed, whether the input kept up with training
(`Estimator.check_input`), and where checkpoints and TensorBoard logs are.

    python -m fenwicks demo --epochs 12 --batch-size 64 --work-dir /tmp/demo

A second run on the same work dir resumes the first (it says so, and at which step);
``--fresh`` deletes the previous run and starts over.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Any

import numpy as np

DEFAULT_EPOCHS = 12
DEFAULT_BATCH_SIZE = 64  # global; the 1,347 training digits make 21 steps per epoch
LEARNING_RATE = 2e-3     # Adam, decayed exponentially to ~2% of this over the run
WEIGHT_DECAY = 1e-4      # decoupled, not on biases or BatchNorm
WIDTH = 32               # channels of the first conv, as in tutorial 1
SEED = 0
PROJECT = "demo"
NUM_TRAIN = 1347  # 75% of scikit-learn's 1,797 digits


@dataclasses.dataclass(frozen=True)
class DemoResult:
    """What the demo measured.

    Attributes:
        accuracy: test accuracy over all test digits.
        num_test: test digits evaluated.
        examples_per_sec: the steady-state training speed: the examples of the compiled
            loops after the first (which compiles) over their seconds; with one loop only,
            that loop's, compilation included. None if nothing was trained (the work dir
            was already at the final step).
        seconds: wall time of the `train` call (compilation included).
        global_step: the step the model is at.
        work_dir: checkpoints, TensorBoard logs.
        input_verdict: `fw.train.InputVerdict` of the training input against this
            run's training speed (no verdict if nothing was trained). Defaults to None.
        steady_steps: the steps `examples_per_sec` was measured over. Defaults to 0.
        steady_seconds: their seconds: ``examples_per_sec * steady_seconds`` is their
            examples. Defaults to 0.0.
        first_loop_seconds: what the rest of the `train` call took: the first loop with
            its compilation, and the call's start and end (the final checkpoint).
            Defaults to 0.0.
    """

    accuracy: float
    num_test: int
    examples_per_sec: float | None
    seconds: float
    global_step: int
    work_dir: str
    input_verdict: Any = None
    steady_steps: int = 0
    steady_seconds: float = 0.0
    first_loop_seconds: float = 0.0


def steady_state(loops: list[tuple[int, float]], start_step: int,
                 batch_size: int) -> tuple[int, float]:
    """(steps, seconds) of the compiled loops after the first, from the history's
    ``(step at the loop's end, examples/s)`` entries of one `train` call that began at
    `start_step`; all of them if there is only one loop.

    Examples:
        >>> steady_state([(21, 500.0), (42, 1344.0), (63, 1344.0)], 0, 64)
        (42, 2.0)
    """
    steps = [(end - begin, rate) for (begin, _), (end, rate)
             in zip([(start_step, 0.0), *loops[:-1]], loops, strict=True)]
    timed = steps[1:] or steps
    return (sum(n for n, _ in timed),
            sum(n * batch_size / rate for n, rate in timed))


def _positive_int(name: str, value: Any, example: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer, e.g. "
                         f"--{name.replace('_', '-')} {example}")
    return value


def _check_args(epochs: Any, batch_size: Any,
                work_dir: str | None = None) -> tuple[int, int]:
    """Validated (epochs, batch_size): before any device is touched or anything compiles."""
    epochs = _positive_int("epochs", epochs, DEFAULT_EPOCHS)
    batch_size = _positive_int("batch_size", batch_size, DEFAULT_BATCH_SIZE)
    if batch_size > NUM_TRAIN:
        raise ValueError(f"batch_size={batch_size} exceeds the {NUM_TRAIN} training "
                         f"digits; use --batch-size {DEFAULT_BATCH_SIZE}")
    if work_dir is not None:
        import tensorflow as tf

        if tf.io.gfile.exists(work_dir) and not tf.io.gfile.isdir(work_dir):
            raise NotADirectoryError(f"work_dir={work_dir!r} is a file; give a directory "
                                     "for checkpoints and logs (created if missing)")
    return epochs, batch_size


def default_work_dir() -> str:
    """``<storage root>/work/demo`` (`fw.io.get_project_dirs`), created if missing."""
    from fenwicks import io

    return io.get_project_dirs(None, PROJECT)[1]


def checkpoint_step(work_dir: str) -> int | None:
    """The step of the latest checkpoint in ``work_dir``, or None if it holds none.

    The estimator names its checkpoints ``ckpt-<global step>`` (TensorFlow engine) or
    ``orbax/<global step>`` (JAX engine).
    """
    from fenwicks.train.checkpointing import step_of
    from fenwicks.train.cross_engine import any_engines_latest

    # Either engine's newest complete checkpoint (on gs:// an orbax step counts once its
    # marker is there), found as the estimator finds it.
    latest = any_engines_latest(work_dir)
    return step_of(latest) if latest and step_of(latest) >= 0 else None


def load_digits(seed: int = SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``(X_train, y_train, X_test, y_test)``.

    Images are float32 ``[N, 8, 8, 1]`` in [0, 1] (the raw pixels are 0..16), labels
    int32. A stratified 75/25 split, so every digit is in both parts in proportion.

    Examples:
        >>> X_train, y_train, X_test, y_test = load_digits()
        >>> X_train.shape, X_test.shape
        ((1347, 8, 8, 1), (450, 8, 8, 1))
    """
    try:
        from sklearn.datasets import load_digits as sklearn_digits
        from sklearn.model_selection import train_test_split
    except ImportError as err:
        raise ImportError("the demo reads scikit-learn's bundled digits; install it with "
                          "pip install 'fenwicks[demo]' (or pip install scikit-learn)") from err
    X, y = sklearn_digits(return_X_y=True)
    X = (X.reshape(-1, 8, 8, 1) / 16.0).astype(np.float32)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y.astype(np.int32), test_size=0.25, random_state=seed, stratify=y)
    return X_train, y_train, X_test, y_test


def build_nn(width: int = WIDTH):
    """The tutorial-1 network, `fw.models.mnist_net`, for 8x8 single-channel digits.

    Its global max + average pooling make it independent of the image size: the same
    net trains on 28x28 MNIST (tutorial 1) and on these 8x8 digits.

    Examples:
        >>> tuple(build_nn()(np.zeros((2, 8, 8, 1))).shape)   # 10 digits' scores each
        (2, 10)
    """
    from fenwicks import models

    return models.mnist_net(n_classes=10, c=width, input_shape=(8, 8, 1))


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _estimator(work_dir: str, steps_per_epoch: int, total_steps: int, batch_size: int,
               num_test: int, replicas: int):
    from fenwicks import train

    lr_func = train.exp_decay_lr(init_lr=LEARNING_RATE, decay_steps=max(1, total_steps // 4),
                                 base_lr=LEARNING_RATE / 100)
    opt_func = train.adam_optimizer(lr_func, wd=WEIGHT_DECAY, exclude_from_wd="bn_and_bias")
    model_func = train.get_clf_model_func(lambda: build_nn(), opt_func)
    # One evaluation batch holds the whole test set (padded to a multiple of the replicas).
    return train.get_tpu_estimator(steps_per_epoch, model_func, work_dir, trn_bs=batch_size,
                                   val_bs=_round_up(num_test, replicas), seed=SEED)


def train_demo(epochs: int = DEFAULT_EPOCHS, batch_size: int = DEFAULT_BATCH_SIZE,
               work_dir: str | None = None) -> DemoResult:
    """Trains and evaluates the demo model; the work of `run` without the printing.

    Args:
        epochs: passes over the 1,347 training digits. Defaults to 12.
        batch_size: global batch size, divisible by the number of replicas.
            Defaults to 64.
        work_dir: checkpoints and logs; a run there is resumed. Defaults to
            ``<storage root>/work/demo`` (`fw.io.get_project_dirs`), resumed too.

    Returns:
        A `DemoResult`.

    Examples:
        >>> import tempfile
        >>> result = train_demo(epochs=1, batch_size=512, work_dir=tempfile.mkdtemp())
        >>> result.global_step, result.num_test   # 1,347 // 512 steps; 450 test digits
        (2, 450)
    """
    from fenwicks import accel, data

    epochs, batch_size = _check_args(epochs, batch_size, work_dir)
    X_train, y_train, X_test, y_test = load_digits()
    work_dir = default_work_dir() if work_dir is None else work_dir
    steps_per_epoch = len(X_train) // batch_size
    est = _estimator(work_dir, steps_per_epoch, epochs * steps_per_epoch, batch_size,
                     len(X_test), accel.current().num_replicas)
    def train_input(params: dict) -> Any:
        return data.numpy_ds(X_train, y_train, params["batch_size"], training=True,
                             seed=SEED, input_context=params.get("input_context"))

    start_step, start = checkpoint_step(work_dir) or 0, time.perf_counter()
    est.train(train_input, max_steps=epochs * steps_per_epoch)
    seconds = time.perf_counter() - start
    verdict = est.check_input(train_input)  # can the input keep up? (about a second)
    result = est.evaluate(lambda params: data.numpy_ds(
        X_test, y_test, params["batch_size"], training=False,
        input_context=params.get("input_context")))
    loops = [(step, rate) for step, rate in est.history.examples_per_sec if step > start_step]
    steps, steady = steady_state(loops, start_step, batch_size) if loops else (0, 0.0)
    return DemoResult(float(result["accuracy"]), len(X_test),
                      steps * batch_size / steady if loops else None, seconds,
                      int(result["global_step"]), work_dir, verdict, steps, steady,
                      seconds - steady if len(loops) > 1 else 0.0)


def report(epochs: int | None = None, batch_size: int | None = None,
           work_dir: str | None = None, fresh: bool = False) -> DemoResult:
    """Trains like `train_demo`, printing where it starts, then accuracy, speed and paths.

    Args:
        epochs: see `train_demo`. Defaults to 12.
        batch_size: see `train_demo`. Defaults to 64.
        work_dir: see `train_demo`. Defaults to ``<storage root>/work/demo``.
        fresh: delete the previous run in ``work_dir`` first: only Fenwicks' own files
            (`fw.io.create_clean_dir` without ``force``); a folder holding others is
            refused, naming one. Defaults to False (resume).

    Returns:
        The `DemoResult`.

    Raises:
        ValueError, NotADirectoryError, ImportError, fw.accel.AcceleratorError: for bad
            arguments or environment, before anything is written or compiled.

    Examples:
        >>> import tempfile
        >>> work_dir = tempfile.mkdtemp()
        >>> _ = open(work_dir + '/notes.txt', 'w').write('mine')
        >>> report(work_dir=work_dir, fresh=True)   # refused before anything trains
        Traceback (most recent call last):
        ...
        ValueError: path=... holds '.../notes.txt', which Fenwicks did not write; ...

        ``report()`` trains 12 epochs (a minute or so on a CPU) and prints where it
        starts, then "test accuracy 0.98..." (each of the 450 test digits counted once),
        the training speed, the input check and where the checkpoints are.
    """
    from fenwicks import accel, io

    epochs, batch_size = _check_args(DEFAULT_EPOCHS if epochs is None else epochs,
                                     DEFAULT_BATCH_SIZE if batch_size is None else batch_size,
                                     work_dir)
    acc = accel.current()
    print("Fenwicks demo: the tutorial-1 network on scikit-learn's handwritten digits")
    print(f"accelerator      {acc.kind} x{acc.num_replicas}, {acc.precision}", flush=True)
    work_dir = default_work_dir() if work_dir is None else work_dir
    step = None if fresh else checkpoint_step(work_dir)
    if fresh:  # only the previous run's own files: a folder with others is refused
        io.create_clean_dir(work_dir)
        print(f"starting fresh in {work_dir} (--fresh: the previous run there was deleted)")
    elif step is None:
        print(f"starting fresh in {work_dir}")
    else:
        print(f"resuming {work_dir} at step {step} (--fresh starts over)", flush=True)
    result = train_demo(epochs, batch_size, work_dir)
    correct = round(result.accuracy * result.num_test)
    print(f"test accuracy    {result.accuracy:.4f} ({correct} of {result.num_test} test "
          "digits, each counted once)")
    if result.examples_per_sec is None:
        print(f"training speed   - (already at step {result.global_step}: resumed a "
              "finished run from the work dir)")
    elif result.first_loop_seconds:
        print(f"training speed   {result.examples_per_sec:,.0f} examples/s "
              f"({result.steady_steps} steps x {batch_size} examples in "
              f"{result.steady_seconds:.2f} s, after compiling)")
        print(f"first loop       {result.first_loop_seconds:.1f} s "
              f"({result.global_step - result.steady_steps} steps, compilation included; "
              "and the final checkpoint)")
    else:  # one loop: nothing ran after compiling
        print(f"training speed   {result.examples_per_sec:,.0f} examples/s "
              f"({result.steady_steps} steps x {batch_size} examples in "
              f"{result.steady_seconds:.2f} s, compilation included)")
    print(f"input check      {result.input_verdict}")
    print(f"checkpoints      {result.work_dir}")
    print(f"TensorBoard      tensorboard --logdir {result.work_dir}")
    return result


def run(epochs: int | None = None, batch_size: int | None = None,
        work_dir: str | None = None, fresh: bool = False) -> int:
    """`report`, with a user error printed as one line on stderr instead of raised.

    Returns:
        The process exit status: 0, or 2 after printing what was wrong.

    Examples:
        >>> run(epochs=0)   # stderr: fenwicks demo: error: epochs=0 must be a positive ...
        2

        ``run()`` trains 12 epochs and prints `report`'s lines ("test accuracy 0.98...").
    """
    from fenwicks import accel

    try:
        report(epochs, batch_size, work_dir, fresh)
    except (ValueError, ImportError, OSError, accel.AcceleratorError) as err:
        print(f"fenwicks demo: error: {err}", file=sys.stderr)
        return 2
    return 0
