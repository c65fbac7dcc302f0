"""fw.data.position: a resumed run's input starts at its batch without replaying the data.

Each Fenwicks pipeline, started at batch k, gives exactly the batches k, k+1, ... of the
uninterrupted stream (augmentation, shuffling, caches and input-pipeline shards included);
how many examples it gathers or parses does not grow with k; and through the real
estimator, across real processes, N + M steps resumed equal N + M steps in one go, on 1
and on 2 replicas, with a user's own input_fn resumed by the `.skip` fallback.
"""

from __future__ import annotations

import concurrent.futures
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import fenwicks as fw
from fenwicks.data import position
from tests import _resume_position as helper
from tests.conftest import run_module_json
from tests.test_tfds import TinyShapes

H, W, C = 4, 3, 2
N = 37  # examples; with batches of 4 an epoch ends mid-batch
BATCH = 4
EPOCHS_IN = 50


def _images(n: int = N) -> tuple[np.ndarray, np.ndarray]:
    """n distinct uint8 images whose first pixel is their index (and their label)."""
    xs = np.random.default_rng(0).integers(0, 255, (n, H, W, C), dtype=np.uint8)
    xs[:, 0, 0, 0] = np.arange(n)
    return xs, np.arange(n)


def _parser(record):
    return fw.data.tfexample_numpy_image_parser(record, H, W, C)


def _context(num, index):
    return tf.distribute.InputContext(num_input_pipelines=num, input_pipeline_id=index,
                                      num_replicas_in_sync=num)


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> str:
    fn = str(tmp_path_factory.mktemp("records") / "r.tfrec")
    fw.data.numpy_tfrecord(fn, *_images(), num_shards=4)
    return fn + "*"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    """TinyShapes (tests/test_tfds.py) prepared by tfds, and the digits as TFRecords."""
    root = str(tmp_path_factory.mktemp("resume_data"))
    TinyShapes(data_dir=root).download_and_prepare(
        download_config=tfds.download.DownloadConfig(num_shards=4))
    helper.write_records(root)
    return root


def _params(options: dict, fast: str) -> list:
    """The `fast` variant (if any) in the fast subset, every variant in the full run."""
    return [pytest.param(value, id=key, marks=() if key == fast else pytest.mark.slow)
            for key, value in options.items()]


def _batches(make, start: int, count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` batches of ``make()`` built at batch ``start`` (claimed, if start > 0)."""
    with position.resume_at(start) as request:
        ds = make()
    assert request.started(ds) == (start > 0)
    return list(ds.take(count).as_numpy_iterator())


def _assert_resumes_exactly(make, starts=(1, 9, 23)) -> None:
    total = 32  # > 3 epochs of 37 examples in batches of 4
    full = _batches(make, 0, total)
    for start in starts:
        resumed = _batches(make, start, total - start)
        for (x, y), (fx, fy) in zip(resumed, full[start:], strict=True):
            np.testing.assert_array_equal(x, fx)
            np.testing.assert_array_equal(y, fy)


NUMPY_OPTIONS = {
    "permutation": {},
    "shuffle_buffer": {"shuffle_buf_sz": 7},
    "augmented": {"batch_transform": fw.transform.tfm_pad_crop(1)},
    "pipeline_1_of_3": {"input_context": _context(3, 1),
                        "batch_transform": fw.transform.random_flip},
}


@pytest.mark.parametrize("options", _params(NUMPY_OPTIONS, fast="permutation"))
def test_numpy_ds_started_at_batch_k_is_the_uninterrupted_stream_from_k(options):
    xs, ys = _images()
    _assert_resumes_exactly(lambda: fw.data.numpy_ds(xs, ys, BATCH, seed=3, **options))


TFRECORD_OPTIONS = {
    "default": {},
    "augmented": {"shuffle_buf_sz": 9, "transform": fw.transform.tfm_pad_crop(1),
                  "batch_transform": fw.transform.random_flip},
    "memory_cache": {"cache": True, "transform": fw.transform.random_flip},
    "augmented_epochs": {"cache": True, "augmented_epochs": 2,
                         "transform": fw.transform.random_flip},
    "by_file_1_of_2": {"input_context": _context(2, 1),
                       "batch_transform": fw.transform.random_flip},
    "by_record_2_of_5": {"input_context": _context(5, 2),
                         "transform": fw.transform.random_flip},
    "unverified": {"verify": False},
}


@pytest.mark.parametrize("options", _params(TFRECORD_OPTIONS, fast=""))
def test_tfrecord_ds_started_at_batch_k_is_the_uninterrupted_stream_from_k(records, options):
    _assert_resumes_exactly(lambda: fw.data.tfrecord_ds(records, _parser, BATCH, seed=3,
                                                        **options))


@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
def test_tfrecord_ds_file_cache_resumes_exactly(records, tmp_path):
    cache = str(tmp_path / "cache" / "parsed")
    _assert_resumes_exactly(lambda: fw.data.tfrecord_ds(
        records, _parser, BATCH, seed=3, cache=cache, batch_transform=fw.transform.random_flip))
    assert tf.io.gfile.exists(cache + ".index")


TFDS_OPTIONS = {
    "default": {"batch_transform": fw.transform.random_flip},
    "slice": {"split": "train[5:33]", "transform": fw.transform.random_flip},
    "by_file_1_of_2": {"input_context": _context(2, 1)},
    "by_example_3_of_5": {"input_context": _context(5, 3)},
}


@pytest.mark.parametrize("options", _params(TFDS_OPTIONS, fast=""))
def test_tfds_ds_started_at_batch_k_is_the_uninterrupted_stream_from_k(data_dir, options):
    options = dict(options)
    split = options.pop("split", "train")
    _assert_resumes_exactly(lambda: fw.data.tfds_ds("tiny_shapes", split, BATCH, seed=3,
                                                    data_dir=data_dir, **options))


# ------------------------------------------------------------------ the jump is cheap


class _CountingArray(np.ndarray):
    """Counts the examples gathered from it by fancy indexing (numpy_ds's one gather)."""

    rows = 0

    def __getitem__(self, index):
        if isinstance(index, np.ndarray):
            _CountingArray.rows += index.size
        return np.asarray(super().__getitem__(index))


def _first_batch_cost(make, start: int, counter) -> int:
    """What building the dataset at batch ``start`` and taking one batch costs."""
    with position.resume_at(start) as request:
        ds = make()
    if not request.started(ds):
        ds = make().skip(start)  # the fallback, to show the counter sees replays
    before = counter()
    next(iter(ds))
    return counter() - before


@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
def test_numpy_ds_gathers_the_same_few_examples_wherever_it_starts(monkeypatch):
    # Small arrays are gathered in the graph; the numpy gather (of large arrays) is the
    # one a counting array can watch, and the index stream is the same for both.
    monkeypatch.setattr(fw.data.arrays, "IN_GRAPH_BYTES", 0)
    xs, ys = _images()
    counting = xs.view(_CountingArray)
    steps_per_epoch = N // BATCH

    def make():
        return fw.data.numpy_ds(counting, ys, BATCH, seed=3)

    costs = [_first_batch_cost(make, k * steps_per_epoch, lambda: _CountingArray.rows)
             for k in (0, 1, EPOCHS_IN)]
    # One batch plus whatever prefetching reads ahead: far below one epoch of examples.
    assert all(cost < N for cost in costs), costs

    def replay():
        return fw.data.numpy_ds(counting, ys, BATCH, seed=3).unbatch().batch(BATCH)

    assert _first_batch_cost(replay, EPOCHS_IN * steps_per_epoch,
                             lambda: _CountingArray.rows) >= EPOCHS_IN * steps_per_epoch * BATCH


def _counting_parser(parsed: list[int]):
    def count(records: np.ndarray) -> np.int64:
        parsed[0] += np.asarray(records).size
        return np.int64(0)

    def parser(record):
        done = tf.numpy_function(count, [record], tf.int64, stateful=True)
        with tf.control_dependencies([done]):
            return _parser(tf.identity(record))

    return parser


@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
def test_tfrecord_ds_parses_the_same_few_records_wherever_it_starts(records):
    parsed = [0]
    parser = _counting_parser(parsed)
    steps_per_epoch = N // BATCH

    def make(**options):
        return lambda: fw.data.tfrecord_ds(records, parser, BATCH, seed=3,
                                           transform=fw.transform.random_flip, **options)

    costs = [_first_batch_cost(make(), k * steps_per_epoch, lambda: parsed[0])
             for k in (0, 1, EPOCHS_IN)]
    # This parser takes vectors, so records are parsed 256 per call: a batch plus
    # read-ahead is one or two such calls, never the skipped epochs (50 x 37 records).
    assert all(cost <= 2 * 256 for cost in costs), costs
    # With a memory cache a new process parses one epoch to fill it, no more.
    cached = [_first_batch_cost(make(cache=True), k * steps_per_epoch, lambda: parsed[0])
              for k in (1, EPOCHS_IN)]
    assert all(cost <= 2 * 256 for cost in cached), cached

    def replay():  # re-batched: not a per-batch op, so the caller must replay
        return make()().unbatch().batch(BATCH)

    assert _first_batch_cost(replay, EPOCHS_IN * steps_per_epoch,
                             lambda: parsed[0]) >= EPOCHS_IN * steps_per_epoch * BATCH


# --------------------------------------------------------------- what counts as started


@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
def test_only_per_batch_ops_keep_a_started_pipeline_started():
    xs, ys = _images()
    with position.resume_at(5) as request:
        ds = fw.data.numpy_ds(xs, ys, BATCH, seed=1)
        evaluation = fw.data.numpy_ds(xs, ys, BATCH, training=False)
    assert request.started(ds)
    assert request.started(ds.map(lambda x, y: (x, y)).prefetch(1)
                           .map(lambda x, y: (x, y), num_parallel_calls=2))
    for other in (ds.unbatch(), ds.skip(1), ds.filter(lambda x, y: True),
                  tf.data.Dataset.zip((ds, ds)), tf.data.Dataset.range(3)):
        assert not request.started(other)
    assert not request.started(evaluation)  # evaluation always reads from the start
    np.testing.assert_array_equal(np.concatenate([y for _, y in evaluation]), ys)
    outside = fw.data.numpy_ds(xs, ys, BATCH, seed=1)  # no request: batch 0
    np.testing.assert_array_equal(next(iter(outside))[1],
                                  next(iter(fw.data.numpy_ds(xs, ys, BATCH, seed=1)))[1])


def test_a_bad_position_is_a_clear_error():
    with pytest.raises(ValueError, match="batches=-1"):
        with position.resume_at(-1):
            pass


# ------------------------------------------------- through the estimator, across processes


def _train(work_root, data_dir, steps, kinds, env=None) -> dict:
    return run_module_json("tests._resume_position", "train", str(work_root), data_dir,
                           str(steps), ",".join(kinds), env=env)


def _resume_vs_uninterrupted(tmp_path, data_dir, kinds, first, more, env=None) -> None:
    resumed_root, whole_root = tmp_path / "resumed", tmp_path / "whole"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # independent processes
        part = pool.submit(_train, resumed_root, data_dir, first, kinds, env)
        whole = pool.submit(_train, whole_root, data_dir, first + more, kinds, env).result()
        part.result()
    resumed = _train(resumed_root, data_dir, more, kinds, env)
    for kind in kinds:
        assert resumed[kind]["step"] == whole[kind]["step"] == first + more
        for a, b in zip(resumed[kind]["weights"], whole[kind]["weights"], strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=kind)
        log = resumed[kind]["resume"]
        replicas = int((env or {}).get("FENWICKS_DEVICE", "cpu:1").split(":")[1])
        skipped = first * replicas  # one batch per replica per step, one input pipeline
        if kind in ("user", "wrapped"):
            expected = f"fenwicks: the training input reads and drops {skipped} batches to resume"
        else:
            expected = f"fenwicks: the training input starts at batch {skipped} directly"
        assert expected in log, log


@pytest.mark.slow
def test_resumed_training_equals_uninterrupted_on_one_replica(tmp_path, data_dir):
    # 15 steps of 16 = 240 examples: the resumed run starts mid-epoch 2 of 200 examples
    # (tfds: 40 examples, epoch 7); 'user' and 'wrapped' resume through .skip.
    _resume_vs_uninterrupted(tmp_path, data_dir, helper.KINDS, 15, 11,
                             env={"FENWICKS_DEVICE": "cpu:1"})


@pytest.mark.slow
def test_resumed_training_equals_uninterrupted_on_two_replicas(tmp_path, data_dir):
    _resume_vs_uninterrupted(tmp_path, data_dir, ("numpy", "tfrecord", "tfds"), 9, 7,
                             env={"FENWICKS_DEVICE": "cpu:2"})


def test_the_helper_writes_four_record_shards(data_dir):
    shards = tf.io.gfile.glob(os.path.join(data_dir, "digits.tfrec*"))
    assert len(shards) == 4
    assert fw.data.count_records(shards) == helper.NUM_TRAIN
