"""fenwicks.data.options: the input pipelines' settings, validated once and normalised,
and reached through the public pipelines (`numpy_ds`, `tfrecord_ds`, `tfds_ds`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from fenwicks.data.options import PipelineOptions, RecordOptions


def _context(num, index):
    return tf.distribute.InputContext(num_input_pipelines=num, input_pipeline_id=index,
                                      num_replicas_in_sync=num)


def test_pipeline_options_are_normalised_once():
    options = PipelineOptions(np.int64(32), True, cache="memory", seed=np.int32(3),
                              augmented_epochs=np.int64(2))
    assert (options.batch_size, options.cache, options.seed, options.augmented_epochs) \
        == (32, True, 3, 2)
    assert all(type(v) is int for v in (options.batch_size, options.seed,
                                        options.augmented_epochs))
    assert PipelineOptions(8, cache=None).cache is False
    assert PipelineOptions(8, cache="/tmp/c").cache == "/tmp/c"
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.batch_size = 64


@pytest.mark.parametrize("training, seed, given, expected", [
    (True, None, None, False),   # fastest: no order asked for
    (True, 1, None, True),       # a seed asks for a repeatable order
    (False, None, None, True),   # evaluation rows must stay in input order
    (True, None, True, True),
    (False, None, False, False),
])
def test_deterministic_defaults_follow_seed_and_training(training, seed, given, expected):
    assert PipelineOptions(4, training, seed=seed, deterministic=given).deterministic \
        is expected


def test_the_shard_and_cache_suffix_come_from_the_input_context():
    assert (PipelineOptions(4).shard, PipelineOptions(4).cache_suffix) == ((1, 0), "")
    options = PipelineOptions(4, input_context=_context(4, 1))
    assert (options.shard, options.cache_suffix) == ((4, 1), "-1-of-4")


@pytest.mark.parametrize("kwargs, match", [
    ({"batch_size": 0}, "batch_size=0 must be a positive integer"),
    ({"training": "yes"}, "training='yes' must be True or False"),
    ({"shuffle_buf_sz": 0}, "shuffle_buf_sz=0 must be a positive integer"),
    ({"cache": 3}, "cache=3 must be False, True"),
    ({"transform": 5}, "transform=5 must be a function"),
    ({"batch_transform": "flip"}, "batch_transform='flip' must be a function"),
    ({"augmented_epochs": -1}, "augmented_epochs=-1 must be an integer >= 0"),
    ({"augmented_epochs": 2, "training": False}, "augmented_epochs is for training"),
    ({"seed": -1}, "seed=-1 must be an integer >= 0 or None"),
    ({"seed": 1.5}, "seed=1.5 must be an integer"),
    ({"deterministic": "no"}, "deterministic='no' must be True or False"),
])
def test_bad_pipeline_options_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PipelineOptions(**{"batch_size": 4, **kwargs})


@pytest.mark.parametrize("kwargs, match", [
    ({"cycle_length": 0}, "cycle_length=0 must be a positive integer"),
    ({"skip_corrupt": "no"}, "skip_corrupt='no' must be True or False"),
    ({"verify": None}, "verify=None must be True or False"),
    ({"processing_mode": "parallel_epochs"}, "applies to a tf.data service"),
])
def test_bad_record_options_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RecordOptions(**kwargs)


def test_record_options_count_records_unless_tensorflow_skips_damage():
    assert RecordOptions().counted and RecordOptions(skip_corrupt=True).counted
    assert not RecordOptions(skip_corrupt=True, verify=False).counted


def test_the_public_pipelines_check_their_options_before_reading_anything(tmp_path):
    missing = str(tmp_path / "nothing*")  # never read: the options fail first
    parser = fw.data.tfexample_numpy_image_parser
    with pytest.raises(ValueError, match="transform=5 must be a function"):
        fw.data.tfrecord_ds(missing, parser, 4, transform=5)
    with pytest.raises(ValueError, match="cycle_length=0"):
        fw.data.tfrecord_ds(missing, parser, 4, cycle_length=0)
    # numpy_ds's None (every example) has no meaning for a stream of records
    with pytest.raises(ValueError, match="shuffle_buf_sz=None .* tfrecord_ds cannot"):
        fw.data.tfrecord_ds(missing, parser, 4, shuffle_buf_sz=None)
    with pytest.raises(ValueError, match="shuffle_buf_sz=None .* tfds_ds cannot"):
        fw.data.tfds_ds("mnist", "train", 4, shuffle_buf_sz=None, data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="seed=-1"):
        fw.data.numpy_ds(np.zeros((4, 2), np.float32), np.zeros(4, np.int32), 2, seed=-1)
    # evaluation reads no shuffle buffer: None is fine there
    ds = fw.data.numpy_ds(np.arange(6, dtype=np.float32).reshape(3, 2), None, 2,
                          training=False, shuffle_buf_sz=None)
    np.testing.assert_array_equal(np.concatenate(list(ds.as_numpy_iterator())),
                                  np.arange(6).reshape(3, 2))
