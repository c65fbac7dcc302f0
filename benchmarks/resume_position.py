"""Resuming 50 epochs in: how long until the first batch, compared with a fresh start?

A resumed estimator asks its input for batch n. Before: the dataset was built from the
start and fast-forwarded with ``.skip(n)``, reading, parsing and augmenting every batch
it drops. Now (`fw.data.position`) Fenwicks' pipelines compute where batch n is: numpy_ds
the epoch's permutation, tfrecord_ds the epoch's file and record order, dropping the
records before the position unparsed.

CIFAR-shaped data (random 32x32x3 uint8, made locally), batches of 128 with pad-crop +
flip augmentation. For each pipeline, time-to-first-batch (building the dataset and
taking one batch, as the estimator's resume does through
`fenwicks.train.inputs.resumed_train_dataset`) at step 0 and at 50 epochs in, for both
ways; the ratio resumed / fresh should be <= 1.5 now, and grows with the steps before.

Then a whole resumed run (`resumed_run`): `fw.models.resnet9` (width ``--width``) trained
``--run-steps`` steps with a checkpoint at the end, copied twice; a new estimator on each
copy times its first ``train`` call of one step (finding and reading the checkpoint,
placing the input at its position, compiling, the step), beside the same call on a fresh
work_dir. The two copies are an A/A control: their ratio is what load alone does. The
engine is Fenwicks' choice (``KERAS_BACKEND=jax`` for the JAX engine). The same file,
copied into an older checkout, measures that code.

    python benchmarks/resume_position.py                  # 10,000 examples
    python benchmarks/resume_position.py --examples 2000  # quick look
    KERAS_BACKEND=jax python benchmarks/resume_position.py --skip-pipelines
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout

import fenwicks as fw  # noqa: E402
from benchmarks import _results  # noqa: E402
from fenwicks.train import inputs  # noqa: E402

TARGET = 1.5  # resumed / fresh time-to-first-batch


def augment(x: tf.Tensor) -> tf.Tensor:
    return fw.transform.random_flip(fw.transform.random_pad_crop(x, 4))


def parser(record: tf.Tensor):
    return fw.data.tfexample_numpy_image_parser(record, 32, 32, 3)


def input_fns(directory: str, examples: int) -> dict:
    rng = np.random.default_rng(0)
    xs = rng.integers(0, 256, (examples, 32, 32, 3), dtype=np.uint8)
    ys = rng.integers(0, 10, examples)
    fw.data.numpy_tfrecord(os.path.join(directory, "train"), xs, ys, num_shards=8)
    pattern = os.path.join(directory, "train*")
    return {
        "numpy_ds": lambda params: fw.data.numpy_ds(
            xs, ys, params["batch_size"], seed=1, batch_transform=augment),
        "tfrecord_ds": lambda params: fw.data.tfrecord_ds(
            pattern, parser, params["batch_size"], seed=1, batch_transform=augment),
    }


def first_batch_seconds(input_fn, batch_size: int, skip: int, fast: bool) -> float:
    params = {"batch_size": batch_size}
    start = time.perf_counter()
    if fast:
        dataset = inputs.resumed_train_dataset(input_fn, params, skip)
    else:  # before: build from the start, read and drop `skip` batches
        dataset = inputs.call_input_fn(input_fn, params, "training").skip(skip)
    next(iter(dataset))
    return time.perf_counter() - start


def _run_estimator(work_dir: str, width: int, batch_size: int):
    opt_func = fw.train.sgd_optimizer(0.01, mom=0.9, wd=5e-4)
    model_func = fw.train.get_clf_model_func(lambda: fw.models.resnet9(c=width), opt_func)
    return fw.train.get_tpu_estimator(100, model_func, work_dir, trn_bs=batch_size,
                                      steps_per_loop=1, save_every_secs=None, seed=1,
                                      verbose=False)


def resumed_run(directory: str, input_fn, width: int, batch_size: int, steps: int,
                repeats: int) -> dict:
    """Seconds of the first one-step `train` of a new estimator: resumed from a
    checkpoint at `steps` (two copies: A and its A/A control), and fresh."""
    import shutil

    trained = os.path.join(directory, "trained")
    est = _run_estimator(trained, width, batch_size)
    est.train(input_fn, steps=steps)
    est.close()

    def first_step(work_dir: str) -> float:
        est = _run_estimator(work_dir, width, batch_size)
        start = time.perf_counter()
        est.train(input_fn, steps=1)
        seconds = time.perf_counter() - start
        assert est.global_step == (steps + 1 if work_dir.startswith(trained) else 1)
        est.close()
        return seconds

    times: dict[str, list[float]] = {"resumed A": [], "resumed A/A": [], "fresh": []}
    for repeat in range(repeats):  # interleaved: load changes hit every case
        for case in times:
            name = case.replace(" ", "-").replace("/", "")
            work_dir = f"{trained}-{name}{repeat}" if case != "fresh" else \
                os.path.join(directory, f"fresh{repeat}")
            if case != "fresh":
                shutil.copytree(trained, work_dir)
            times[case].append(first_step(work_dir))
    best = {case: min(seconds) for case, seconds in times.items()}
    return {"engine": fw.train.engines.current().name, "width": width, "steps": steps,
            **{f"{case}_s": round(value, 3) for case, value in best.items()},
            "resumed_over_fresh": round(best["resumed A"] / best["fresh"], 3),
            "aa_control": round(best["resumed A/A"] / best["resumed A"], 3)}


def main(argv: list[str]) -> int:
    parser_ = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser_.add_argument("--examples", type=int, default=10_000)
    parser_.add_argument("--batch-size", type=int, default=128)
    parser_.add_argument("--epochs", type=int, default=50)
    parser_.add_argument("--repeats", type=int, default=3)
    parser_.add_argument("--width", type=int, default=16, help="resnet9's c (resumed run)")
    parser_.add_argument("--run-steps", type=int, default=20,
                         help="steps trained before the resumed run's checkpoint")
    parser_.add_argument("--skip-pipelines", action="store_true",
                         help="only the resumed run")
    _results.add_option(parser_)
    args = parser_.parse_args(argv)
    skip = args.epochs * args.examples // args.batch_size
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        fns = input_fns(directory, args.examples)
        run = resumed_run(os.path.join(directory, "runs"), fns["numpy_ds"], args.width,
                          args.batch_size, args.run_steps, args.repeats)
        for name, input_fn in () if args.skip_pipelines else fns.items():
            first_batch_seconds(input_fn, args.batch_size, 0, True)  # warm: scans, tracing
            for way, fast in (("before (.skip)", False), ("now (position)", True)):
                fresh = statistics.median(first_batch_seconds(
                    input_fn, args.batch_size, 0, fast) for _ in range(args.repeats))
                repeats = args.repeats if fast else 1  # the replay takes long enough
                resumed = statistics.median(first_batch_seconds(
                    input_fn, args.batch_size, skip, fast) for _ in range(repeats))
                rows.append({"pipeline": name, "way": way, "fresh_s": round(fresh, 3),
                             "resumed_s": round(resumed, 3),
                             "ratio": round(resumed / fresh, 2)})
    print(f"time to first batch, resuming at {args.epochs} epochs ({skip} steps of "
          f"{args.batch_size}) vs at step 0; {args.examples} examples; target <= {TARGET}x")
    print(f"{'pipeline':<12} {'way':<16} {'fresh s':>8} {'resumed s':>10} {'ratio':>7}")
    for r in rows:
        print(f"{r['pipeline']:<12} {r['way']:<16} {r['fresh_s']:>8.3f} "
              f"{r['resumed_s']:>10.3f} {r['ratio']:>6.2f}x")
    print(f"resumed run ({run['engine']} engine, resnet9 c={run['width']}, checkpoint at "
          f"step {run['steps']}): first train(steps=1) {run['resumed A_s']:.3f} s resumed, "
          f"{run['resumed A/A_s']:.3f} s its A/A copy, {run['fresh_s']:.3f} s fresh; "
          f"resumed / fresh {run['resumed_over_fresh']:.3f}, A/A {run['aa_control']:.3f}")
    print(json.dumps(rows + [run]))
    now = [r["ratio"] for r in rows if r["way"].startswith("now")] or [0.0]
    if args.results:
        _results.write(__file__, f"time to the first batch, resuming at {args.epochs} "
                       f"epochs vs at step 0 ({args.examples} examples, batch "
                       f"{args.batch_size})", rows, argv,
                       summary=f"largest ratio now: {max(now):.2f} (target <= {TARGET})")
    return 0 if max(now) <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
