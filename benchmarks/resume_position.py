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

    python benchmarks/resume_position.py                  # 10,000 examples
    python benchmarks/resume_position.py --examples 2000  # quick look
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


def main(argv: list[str]) -> int:
    parser_ = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser_.add_argument("--examples", type=int, default=10_000)
    parser_.add_argument("--batch-size", type=int, default=128)
    parser_.add_argument("--epochs", type=int, default=50)
    parser_.add_argument("--repeats", type=int, default=3)
    _results.add_option(parser_)
    args = parser_.parse_args(argv)
    skip = args.epochs * args.examples // args.batch_size
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for name, input_fn in input_fns(directory, args.examples).items():
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
    print(json.dumps(rows))
    now = [r["ratio"] for r in rows if r["way"].startswith("now")]
    if args.results:
        _results.write(__file__, f"time to the first batch, resuming at {args.epochs} "
                       f"epochs vs at step 0 ({args.examples} examples, batch "
                       f"{args.batch_size})", rows, argv,
                       summary=f"largest ratio now: {max(now):.2f} (target <= {TARGET})")
    return 0 if max(now) <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
