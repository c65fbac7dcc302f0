"""fw.data's tensorflow-datasets path against the real library, offline: a small dataset
built on disk by tfds's own machinery (a `GeneratorBasedBuilder` defined here), read back
through `tfds_ds` / `tfds_load`, and the fast failure when a dataset cannot be had."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import fenwicks as fw
from tests.conftest import run_process

NUM_TRAIN, NUM_TEST, NUM_SHARDS = 40, 13, 4
OFFLINE_LIMIT = 30  # seconds; tfds.load alone retries for minutes


class TinyShapes(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Example i is a 4x4 grey image filled with i, labelled i % 10."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(4, 4, 1)),
                "label": tfds.features.ClassLabel(num_classes=10)}),
            supervised_keys=("image", "label"))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(0, NUM_TRAIN),
                "test": self._generate_examples(NUM_TRAIN, NUM_TRAIN + NUM_TEST)}

    def _generate_examples(self, start, stop):
        for i in range(start, stop):
            yield i, {"image": np.full((4, 4, 1), i, np.uint8), "label": i % 10}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    """TinyShapes prepared by tfds in a temporary data_dir, 4 files per split."""
    root = str(tmp_path_factory.mktemp("tfds"))
    config = tfds.download.DownloadConfig(num_shards=NUM_SHARDS)
    TinyShapes(data_dir=root).download_and_prepare(download_config=config)
    return root


def _ids(ds) -> list[int]:
    """Example ids (the fill value) in the order the dataset yields them, label-checked."""
    ids = []
    for images, labels in ds.as_numpy_iterator():
        assert images.dtype == np.uint8 and images.shape[1:] == (4, 4, 1)
        assert (images == images[:, :1, :1, :]).all()  # one fill value per image
        batch = images[:, 0, 0, 0].astype(int)
        np.testing.assert_array_equal(labels, batch % 10)  # (image, label) pairs intact
        ids += batch.tolist()
    return ids


def _context(num, index):
    return tf.distribute.InputContext(num_input_pipelines=num, input_pipeline_id=index,
                                      num_replicas_in_sync=num)


def test_the_builder_wrote_several_files_per_split(data_dir):
    files = tf.io.gfile.glob(os.path.join(data_dir, "tiny_shapes", "1.0.0", "*train*"))
    assert len(files) == NUM_SHARDS


def test_evaluation_reads_each_split_once_with_its_last_partial_batch(data_dir):
    train = fw.data.tfds_ds("tiny_shapes", "train", 7, training=False, data_dir=data_dir)
    test = fw.data.tfds_ds("tiny_shapes", "test", 7, training=False, data_dir=data_dir)
    assert sorted(_ids(train)) == list(range(NUM_TRAIN))
    assert sorted(_ids(test)) == list(range(NUM_TRAIN, NUM_TRAIN + NUM_TEST))
    assert [len(y) for _, y in test.as_numpy_iterator()] == [7, 6]  # 13 = 7 + 6


def test_split_slices_partition_the_split(data_dir):
    first = _ids(fw.data.tfds_ds("tiny_shapes", "train[:25%]", 4, training=False,
                                 data_dir=data_dir))
    rest = _ids(fw.data.tfds_ds("tiny_shapes", "train[25%:]", 4, training=False,
                                data_dir=data_dir))
    assert len(first) == NUM_TRAIN // 4 and len(rest) == NUM_TRAIN - NUM_TRAIN // 4
    assert sorted(first + rest) == list(range(NUM_TRAIN))


def test_tfds_load_gives_what_tfds_gives(data_dir):
    ours = fw.data.tfds_load("tiny_shapes", split="test", data_dir=data_dir,
                             as_supervised=True)
    builder = tfds.builder("tiny_shapes", data_dir=data_dir)
    theirs = builder.as_dataset(split="test", as_supervised=True)
    assert [(x.tobytes(), int(y)) for x, y in ours.as_numpy_iterator()] == \
        [(x.tobytes(), int(y)) for x, y in theirs.as_numpy_iterator()]
    info = fw.data.tfds_builder("tiny_shapes", data_dir=data_dir).info
    assert info.splits["train"].num_examples == NUM_TRAIN


@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
def test_training_shuffles_files_repeats_and_keeps_batches_static(data_dir):
    def epoch_orders(seed, epochs=2):
        # shuffle_buf_sz=1: the order is the file order alone, so an epoch is exactly
        # the next 40 examples
        ds = fw.data.tfds_ds("tiny_shapes", "train", 8, training=True, data_dir=data_dir,
                             shuffle_buf_sz=1, seed=seed)
        ids = _ids(ds.take(epochs * NUM_TRAIN // 8))
        return [ids[i * NUM_TRAIN:(i + 1) * NUM_TRAIN] for i in range(epochs)]

    unshuffled = _ids(fw.data.tfds_ds("tiny_shapes", "train", 8, training=False,
                                      data_dir=data_dir))
    orders = {seed: epoch_orders(seed) for seed in range(4)}
    for first, second in orders.values():
        assert sorted(first) == sorted(second) == list(range(NUM_TRAIN))  # whole epochs
    assert orders[0] == epoch_orders(0)  # a seed repeats the order
    assert len({tuple(first) for first, _ in orders.values()}) > 1, \
        "the file order does not depend on the seed"
    assert any(first != unshuffled for first, _ in orders.values())


# 8 > 4 files: sharded by example. The fast subset checks 2; the full run all four.
@pytest.mark.parametrize("pipelines", [2, *(pytest.param(n, marks=pytest.mark.slow)
                                            for n in (4, 3, 8))])
def test_input_context_shards_each_example_to_exactly_one_pipeline(data_dir, pipelines):
    per_pipeline = [_ids(fw.data.tfds_ds("tiny_shapes", "train", 4, training=False,
                                         data_dir=data_dir, input_context=_context(pipelines, i)))
                    for i in range(pipelines)]
    everything = [i for ids in per_pipeline for i in ids]
    assert sorted(everything) == list(range(NUM_TRAIN))  # once each, none twice
    assert all(per_pipeline), "a pipeline got nothing"


def test_training_pipelines_together_cover_an_epoch(data_dir):
    pipelines = 2
    seen = []
    for i in range(pipelines):
        ds = fw.data.tfds_ds("tiny_shapes", "train", 4, training=True, data_dir=data_dir,
                             seed=3, shuffle_buf_sz=1, input_context=_context(pipelines, i))
        seen += _ids(ds.take(NUM_TRAIN // pipelines // 4))  # its half of one epoch
    assert sorted(seen) == list(range(NUM_TRAIN))


def test_download_false_on_a_missing_dataset_is_an_error_naming_data_dir(tmp_path):
    with pytest.raises(fw.data.DatasetUnavailableError,
                       match=rf"'mnist' is not in data_dir='{tmp_path}'.*download=False"):
        fw.data.tfds_ds("mnist", "train", 8, data_dir=str(tmp_path), download=False)
    assert issubclass(fw.data.DatasetUnavailableError, FileNotFoundError)


def test_no_warning_about_a_dataset_folder_that_does_not_exist(tmp_path):
    # tfds warns "Variant folder <data_dir>/mnist/3.0.1 has no dataset_info.json" when it
    # looks for a dataset not prepared yet: noise about a folder nobody made. tfds logs
    # through absl's logger; a handler on it sees what reaches any output.
    import logging

    from absl import logging as absl_logging

    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())
    logger = logging.getLogger("absl")
    logger.addHandler(handler)
    verbosity = absl_logging.get_verbosity()  # another test may have set it to errors
    absl_logging.set_verbosity(absl_logging.WARNING)
    try:
        with pytest.raises(fw.data.DatasetUnavailableError):
            fw.data.tfds_builder("mnist", data_dir=str(tmp_path), download=False)
        assert [m for m in seen if "Variant folder" in m] == []
        # A folder that is there but holds no dataset is worth the warning: a broken copy.
        os.makedirs(tmp_path / "mnist" / "3.0.1")
        with pytest.raises(fw.data.DatasetUnavailableError):
            fw.data.tfds_builder("mnist", data_dir=str(tmp_path), download=False)
    finally:
        logger.removeHandler(handler)
        absl_logging.set_verbosity(verbosity)
    assert [m for m in seen if "Variant folder" in m] == [
        f"Variant folder {tmp_path}/mnist/3.0.1 has no dataset_info.json"]


def _run(code: str, tmp_path) -> tuple[subprocess.CompletedProcess, float]:
    proc = run_process(["-c", textwrap.dedent(code)], cwd=tmp_path, timeout=300, check=False)
    return proc, proc.seconds


@pytest.mark.parametrize("name, message", [
    ("mnist", r"tensorflow-datasets could not download 'mnist': .* is unreachable .*; and "
              r"'mnist' is not in data_dir="),
    ("no_such_dataset_xyz", r"tensorflow-datasets has no dataset 'no_such_dataset_xyz'"),
])
def test_offline_a_dataset_not_in_data_dir_fails_within_seconds(tmp_path, name, message):
    # This machine has no route to the internet: tfds.load('mnist') alone would retry
    # its downloads for minutes. A fresh process, as a user's script would be.
    if fw.data.tfds_source.network_problem(timeout=2) is None:
        pytest.skip("storage.googleapis.com answers: this machine is online")
    code = f"""
        import fenwicks as fw
        try:
            fw.data.tfds_ds({name!r}, 'train', 8, data_dir={str(tmp_path)!r})
        except fw.data.DatasetUnavailableError as err:
            print(err)
    """
    proc, seconds = _run(code, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(message, proc.stdout), proc.stdout
    assert f"data_dir={str(tmp_path)!r}" in proc.stdout
    assert "gs://my-bucket/tensorflow_datasets" in proc.stdout  # how to point at a bucket
    assert len(proc.stdout.strip().splitlines()) == 1  # not a list of 1,000 datasets
    assert seconds < OFFLINE_LIMIT, f"took {seconds:.0f} s"
    print(f"{name}: failed in {seconds:.1f} s (TensorFlow's import included)")


def test_a_global_seed_of_zero_does_not_break_the_seeded_file_order(data_dir):
    """keras.utils.set_random_seed(0) (an estimator with seed=0 calls it) made TensorFlow
    compare the epoch's tensor shuffle seed with 0 in Python while the epoch was traced:
    OperatorNotAllowedInGraphError (seen when a seed-0 test ran first in a worker)."""
    try:
        tf.random.set_seed(0)
        ds = fw.data.tfds_ds("tiny_shapes", "train", 4, training=True, data_dir=data_dir,
                             seed=3, shuffle_buf_sz=1)
        seen = _ids(ds.take(NUM_TRAIN // 4))  # one epoch
    finally:
        tf.random.set_seed(None)
    assert sorted(seen) == list(range(NUM_TRAIN))
