"""fw.data: exactness, determinism, sharding, caching, TFRecord writing and checking,
a gs:// round trip on the emulator, and every bad input."""

from __future__ import annotations

import json
import logging
import os
import re

import numpy as np
import pytest
import tensorflow as tf

import fenwicks as fw
from tests.conftest import run_json

H, W, C = 4, 3, 2


def _images(n: int) -> tuple[np.ndarray, np.ndarray]:
    """n distinct uint8 images whose first pixel is their index (and their label)."""
    xs = np.random.default_rng(0).integers(0, 255, (n, H, W, C), dtype=np.uint8)
    xs[:, 0, 0, 0] = np.arange(n)
    return xs, np.arange(n) % 100


def _parser(record):
    return fw.data.tfexample_numpy_image_parser(record, H, W, C)


def _collect(ds, batches=None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    ds = ds if batches is None else ds.take(batches)
    pairs = list(ds.as_numpy_iterator())
    return [x for x, _ in pairs], [y for _, y in pairs]


def _context(num, index):
    return tf.distribute.InputContext(num_input_pipelines=num, input_pipeline_id=index,
                                      num_replicas_in_sync=num)


# --------------------------------------------------------------------------- numpy_ds


@pytest.mark.parametrize("batch_size", [1, 3, 4, 10, 16])
def test_numpy_eval_pass_yields_every_example_once_in_order(batch_size):
    xs, ys = _images(10)
    images, labels = _collect(fw.data.numpy_ds(xs, ys, batch_size, training=False))
    sizes = [len(b) for b in labels]
    assert sizes == [batch_size] * (10 // batch_size) + ([10 % batch_size] if 10 % batch_size
                                                         else [])
    np.testing.assert_array_equal(np.concatenate(images), xs)
    np.testing.assert_array_equal(np.concatenate(labels), ys)


def test_numpy_training_epochs_are_seeded_permutations():
    xs, ys = _images(12)
    ds = fw.data.numpy_ds(xs, ys, 4, training=True, seed=7)
    assert ds.element_spec[0].shape.as_list() == [4, H, W, C]  # static batch for XLA
    assert ds.element_spec[1].dtype == tf.int32
    images, labels = _collect(ds, 6)
    flat = np.concatenate(labels)
    first, second = flat[:12], flat[12:]
    assert sorted(first) == list(range(12)) and sorted(second) == list(range(12))
    assert not np.array_equal(first, second) and not np.array_equal(first, np.arange(12))
    np.testing.assert_array_equal(np.concatenate(images), xs[flat])  # pairs stay together
    again = np.concatenate(_collect(fw.data.numpy_ds(xs, ys, 4, seed=7), 6)[1])
    other = np.concatenate(_collect(fw.data.numpy_ds(xs, ys, 4, seed=8), 6)[1])
    np.testing.assert_array_equal(flat, again)
    assert not np.array_equal(flat, other)


def test_numpy_shards_per_input_pipeline_and_features_only():
    xs, ys = _images(11)
    seen = []
    for index in range(3):
        ds = fw.data.numpy_ds(xs, None, 4, training=False, input_context=_context(3, index))
        seen.append(np.concatenate(list(ds.as_numpy_iterator()))[:, 0, 0, 0])
    np.testing.assert_array_equal(seen[1], [1, 4, 7, 10])
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(11))


def test_numpy_ds_under_a_four_replica_strategy():
    """Per-replica batches from distribute_datasets_from_function: each global step takes
    4 x 3 examples, and the first 24 examples of a seeded run are a permutation."""
    out = run_json("""
        import json, numpy as np, tensorflow as tf, fenwicks as fw
        strategy = fw.train.tf.strategy()
        xs = np.arange(24, dtype=np.float32)[:, None]; ys = np.arange(24)
        def input_fn(ctx):
            return fw.data.numpy_ds(xs, ys, 3, seed=1, input_context=ctx)
        it = iter(strategy.distribute_datasets_from_function(input_fn))
        steps = []
        for _ in range(2):
            per_replica = strategy.experimental_local_results(next(it)[1])
            steps.append([r.numpy().tolist() for r in per_replica])
        # Tear the multi-device iterator down now: left to interpreter shutdown, TF's
        # iterator destructor sometimes waits forever (seen under load, TF 2.21).
        del it, per_replica
        import gc; gc.collect()
        print(json.dumps({"replicas": strategy.num_replicas_in_sync, "steps": steps}))
    """, env={"FENWICKS_DEVICE": "cpu:4"})
    assert out["replicas"] == 4
    assert all(len(r) == 3 for step in out["steps"] for r in step)
    seen = [y for step in out["steps"] for r in step for y in r]
    assert sorted(seen) == list(range(24))


def test_numpy_labels_become_int32_class_ids():
    xs, _ = _images(6)
    ds = fw.data.numpy_ds(xs, np.arange(6, dtype=np.uint8), 6, training=False)
    labels = next(iter(ds))[1]
    assert labels.dtype == tf.int32 and labels.numpy().tolist() == list(range(6))


def test_numpy_ds_does_not_copy_big_arrays():
    """300 MB of features: peak memory grows by far less than the arrays (no graph copy)."""
    out = run_json("""
        import json, resource, numpy as np, tensorflow as tf, fenwicks as fw
        xs = np.ones((300_000, 1000), np.uint8); ys = np.arange(300_000) % 10
        warm = fw.data.numpy_ds(xs[:10], ys[:10], 5, training=False)
        list(warm)  # TF's own one-off allocations do not count against the arrays
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        total, count = 0, 0
        for x, y in fw.data.numpy_ds(xs, ys, 2_000, training=False):
            total += int(tf.reduce_sum(tf.cast(x[:, 0], tf.int64))); count += len(y)
        # Batches of 5 MB: the prefetch buffers (a few batches) must not hide a copy.
        for x, y in fw.data.numpy_ds(xs, ys, 5_000, training=True, seed=0).take(12):
            count += len(y)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"growth": peak - base, "size": xs.nbytes, "total": total,
                          "count": count}))
    """)
    assert out["total"] == 300_000 and out["count"] == 300_000 + 12 * 5_000
    assert out["growth"] < 0.5 * out["size"], out  # peak <= 1.5x the arrays


@pytest.mark.parametrize("xs, ys, batch_size, match", [
    (np.zeros((5, 2)), np.zeros(4, int), 2, "xs has 5 examples but ys has 4"),
    (np.zeros((5, 2)), np.zeros((5, 1), int), 2, r"pass ys.reshape\(-1\)"),
    (np.zeros((5, 2)), np.array(list("abcde")), 2, "dtype <U1"),
    (np.zeros((5, 2)), np.zeros(5, int), 0, "batch_size=0"),
    (np.zeros((5, 2)), np.zeros(5, int), 6, "batch_size=6 is larger than the 5"),
    (np.array([]), np.zeros(0, int), 2, "at least one example"),
])
def test_numpy_bad_inputs(xs, ys, batch_size, match):
    with pytest.raises(ValueError, match=match):
        fw.data.numpy_ds(xs, ys, batch_size, training=True)


# --------------------------------------------------------------------------- TFRecords


@pytest.fixture
def shards(tmp_path):
    xs, ys = _images(20)
    fn = str(tmp_path / "train")
    paths = fw.data.numpy_tfrecord(fn, xs, ys, num_shards=4)
    return fn, paths, xs, ys


@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
def test_numpy_tfrecord_shards_and_eval_pass_is_exact(shards):
    fn, paths, xs, ys = shards
    assert [os.path.basename(p) for p in paths] == [f"train-0000{i}-of-00004" for i in range(4)]
    assert sorted(os.listdir(os.path.dirname(fn))) == sorted(os.path.basename(p) for p in paths)
    # Round robin: shard i holds examples i, i + 4, ...
    first = next(iter(tf.data.TFRecordDataset(paths[1]).map(_parser)))[1].numpy()
    assert first == 1
    assert fw.data.count_records(fn + "*") == 20
    for batch_size in (3, 20, 32):
        images, labels = _collect(fw.data.tfrecord_ds(fn + "*", _parser, batch_size,
                                                      training=False))
        order = np.concatenate(images)[:, 0, 0, 0]
        assert sorted(order) == list(range(20))
        np.testing.assert_array_equal(np.concatenate(images), xs[order])
        np.testing.assert_array_equal(np.concatenate(labels), ys[order])
        assert len(labels[-1]) == (20 % batch_size or batch_size)


@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
def test_tfrecord_training_is_seeded_and_each_epoch_a_permutation(shards):
    fn = shards[0]

    def epochs(seed):
        ds = fw.data.tfrecord_ds(fn + "*", _parser, 5, training=True, shuffle_buf_sz=20,
                                 seed=seed)
        assert ds.element_spec[0].shape.as_list() == [5, H, W, C]
        return np.concatenate([x[:, 0, 0, 0] for x in _collect(ds, 8)[0]])

    order = epochs(3)
    assert sorted(order[:20]) == list(range(20)) and sorted(order[20:]) == list(range(20))
    np.testing.assert_array_equal(order, epochs(3))
    assert not np.array_equal(order, epochs(4))


@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
def test_tfrecord_shards_per_input_pipeline(shards):
    fn = shards[0]
    for pipelines in (2, 3, 5):  # 4 files: by file for 2, by record for 3 and 5
        seen = [np.concatenate([x[:, 0, 0, 0] for x in _collect(fw.data.tfrecord_ds(
            fn + "*", _parser, 4, training=False, input_context=_context(pipelines, i)))[0]])
            for i in range(pipelines)]
        assert sorted(np.concatenate(seen)) == list(range(20)), pipelines
    assert sorted(seen[0]) == [0, 5, 10, 15]  # record-level shard over the file order


def test_overwrite_is_refused_and_stale_shards_are_removed(shards):
    fn, paths, xs, ys = shards
    before = open(paths[0], "rb").read()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        fw.data.numpy_tfrecord(fn, xs[:2], ys[:2], num_shards=4)
    assert open(paths[0], "rb").read() == before
    new = fw.data.numpy_tfrecord(fn, xs[:6], ys[:6], num_shards=2, overwrite=True)
    assert sorted(tf.io.gfile.glob(fn + "*")) == sorted(new)
    assert fw.data.count_records(fn + "*") == 6


@pytest.mark.parametrize("y, error, match", [
    (np.zeros(3, np.float32), ValueError, "y has dtype float32"),
    (np.zeros(2, int), ValueError, "xs has 3 examples but y has 2"),
    (np.zeros((3, 2), int), ValueError, r"shape \(3, 2\)"),
])
def test_numpy_tfrecord_bad_labels_write_nothing(tmp_path, y, error, match):
    with pytest.raises(error, match=match):
        fw.data.numpy_tfrecord(str(tmp_path / "t"), np.zeros((3, 2, 2, 1), np.uint8), y)
    assert os.listdir(tmp_path) == []


def test_failed_write_leaves_no_file(tmp_path):
    good = tmp_path / "a.png"
    good.write_bytes(tf.io.encode_png(np.zeros((2, 2, 3), np.uint8)).numpy())
    bad = tmp_path / "notes.png"
    bad.write_bytes(b"not an image")
    with pytest.raises(ValueError, match="notes.png is not a JPEG"):
        fw.data.files_tfrecord(str(tmp_path / "out"), [str(good), str(bad)], [0, 1])
    assert sorted(os.listdir(tmp_path)) == ["a.png", "notes.png"]  # no partial, no temp


def _damage(path: str, records: int, offset_in_record: int | None, truncate: int = 0):
    data = bytearray(open(path, "rb").read())
    size = len(data) // records  # equal-sized records (same image size, labels < 128)
    if offset_in_record is not None:
        data[2 * size + offset_in_record] ^= 0xFF  # inside record 2
    open(path, "wb").write(bytes(data[:len(data) - truncate]))
    return size


def test_corrupt_record_names_the_file_and_skip_corrupt_counts(shards, caplog):
    fn, paths, _, _ = shards
    _damage(paths[1], 5, offset_in_record=12 + 20)  # 12-byte header, then data
    with pytest.raises(fw.data.RecordError, match="train-00001-of-00004.*corrupted data"):
        fw.data.tfrecord_ds(fn + "*", _parser, 4, training=False)
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        ds = fw.data.tfrecord_ds(fn + "*", _parser, 4, training=False, skip_corrupt=True)
    # TensorFlow's reader stops a file at a bad checksum: records 2, 3, 4 of shard 1 are lost,
    # which are examples 1 + 4 * (2, 3, 4) in the round-robin layout.
    order = np.concatenate([x[:, 0, 0, 0] for x in _collect(ds)[0]])
    assert sorted(order) == sorted(set(range(20)) - {9, 13, 17})
    assert "skipped 3 record(s) in 1 file(s)" in caplog.text
    # Without the up-front scan, TensorFlow's own skipping stops at the damage, never hangs.
    ds = fw.data.tfrecord_ds(fn + "*", _parser, 4, training=False, skip_corrupt=True,
                             verify=False)
    assert sum(len(y) for y in _collect(ds)[1]) == 17


def test_truncated_file_names_the_file(shards):
    fn, paths, _, _ = shards
    _damage(paths[3], 5, offset_in_record=None, truncate=7)
    with pytest.raises(fw.data.RecordError, match="train-00003-of-00004.*truncated data"):
        fw.data.tfrecord_ds(fn + "*", _parser, 4, training=True)
    # count_records walks the files as tfrecord_ds does: the damage is an error, not a
    # short count, unless asked for the readable records (5 per shard, one lost)
    with pytest.raises(fw.data.RecordError, match="train-00003-of-00004 is damaged: "
                                                  "truncated data.*skip_corrupt=True"):
        fw.data.count_records(fn + "*")
    assert fw.data.count_records(fn + "*", skip_corrupt=True) == 4 * 5 - 1
    ds = fw.data.tfrecord_ds(fn + "*", _parser, 19, training=True, skip_corrupt=True)
    assert sorted(next(iter(ds))[0].numpy()[:, 0, 0, 0]) == sorted(set(range(20)) - {19})


@pytest.mark.parametrize("parser, error, match", [
    (lambda r: fw.data.tfexample_numpy_image_parser(r, H, W, 3), fw.data.RecordError,
     "train-00000-of-00004 do not fit parser"),
    (lambda r: (_parser(r)[0], tf.constant("cat")), ValueError, "labels of dtype string"),
    (lambda r: (_parser(r)[0], tf.zeros([2], tf.int32)), ValueError, r"shape \(2,\)"),
])
def test_records_that_do_not_fit_the_parser(shards, parser, error, match):
    with pytest.raises(error, match=match):
        fw.data.tfrecord_ds(shards[0] + "*", parser, 4)


def test_parser_names_the_dtype_and_shape_numpy_tfrecord_stored(tmp_path):
    xs = np.random.default_rng(1).random((5, H, W, C)).astype(np.float32)
    fn = fw.data.numpy_tfrecord(str(tmp_path / "floats"), xs, np.arange(5))[0]
    told = re.escape(f"the record holds float32 values of shape ({H}, {W}, {C})")
    advice = re.escape(f"pass h, w, c = {H}, {W}, {C} and dtype=tf.float32")
    as_uint8 = lambda r: fw.data.tfexample_numpy_image_parser(r, H, W, C, dtype=tf.uint8)
    with pytest.raises(fw.data.RecordError, match=f"floats do not fit .*{told}.*{advice}"):
        fw.data.tfrecord_ds(fn, as_uint8, 5, training=False)
    # No dtype: the one the records hold, eagerly and in the pipeline.
    images, _ = _collect(fw.data.tfrecord_ds(fn, _parser, 5, training=False))
    assert images[0].dtype == np.float32
    np.testing.assert_array_equal(images[0], xs)
    swapped = lambda r: fw.data.tfexample_numpy_image_parser(r, W, H, C, dtype=tf.float32)
    with pytest.raises(fw.data.RecordError, match=f"{told}.*{advice}"):  # same size
        fw.data.tfrecord_ds(fn, swapped, 5, training=False)
    right = lambda r: fw.data.tfexample_numpy_image_parser(r, H, W, C, dtype=tf.float32)
    images, labels = _collect(fw.data.tfrecord_ds(fn, right, 5, training=False))
    np.testing.assert_array_equal(images[0], xs)
    # Inside a pipeline (graph mode) the stored dtype is checked by an op.
    wrong = tf.data.TFRecordDataset(fn).map(
        lambda r: fw.data.tfexample_numpy_image_parser(r, H, W, C, dtype=tf.int32))
    with pytest.raises(tf.errors.InvalidArgumentError, match="another dtype than the int32"):
        next(iter(wrong))


def test_records_without_a_stored_dtype_still_read_and_a_wrong_size_guesses_it(tmp_path):
    # The format numpy_tfrecord wrote before it stored dtype and shape: image and label.
    xs = np.random.default_rng(2).random((4, H, W, C)).astype(np.float32)
    fn = str(tmp_path / "old.tfrec")
    with tf.io.TFRecordWriter(fn) as writer:
        for i, x in enumerate(xs):
            writer.write(fw.data.image_example(x.tobytes(), i))
    n = H * W * C
    with pytest.raises(fw.data.RecordError, match=(
            f"has {4 * n} bytes, not h\\*w\\*c\\*1 = {H}\\*{W}\\*{C}\\*1 = {n} for uint8 "
            f"\\(4x .*float32 or int32\\? pass dtype=tf.float32")):
        fw.data.tfrecord_ds(fn, _parser, 4, training=False)
    right = lambda r: fw.data.tfexample_numpy_image_parser(r, H, W, C, dtype=tf.float32)
    images, labels = _collect(fw.data.tfrecord_ds(fn, right, 4, training=False))
    np.testing.assert_array_equal(images[0], xs)
    np.testing.assert_array_equal(labels[0], np.arange(4))


def test_pattern_matching_nothing_names_the_pattern(tmp_path):
    pattern = str(tmp_path / "nothing-*.tfrec")
    with pytest.raises(FileNotFoundError, match="nothing-"):
        fw.data.tfrecord_ds(pattern, _parser, 4)
    open(tmp_path / "empty.tfrec", "wb").close()
    with pytest.raises(fw.data.RecordError, match="no readable record: .*empty.tfrec"):
        fw.data.tfrecord_ds(str(tmp_path / "empty*"), _parser, 4)


def test_file_cache_is_read_instead_of_the_records(shards, tmp_path):
    fn, _, xs, _ = shards
    cache = str(tmp_path / "cache" / "decoded")
    ds = fw.data.tfrecord_ds(fn + "*", _parser, 8, training=False, cache=cache)
    first = np.concatenate(_collect(ds)[0])
    assert tf.io.gfile.exists(cache + ".index")
    # New records under the same names: a dataset on the same cache still gives the old data.
    fw.data.numpy_tfrecord(fn, 255 - xs, np.zeros(len(xs), int), num_shards=4, overwrite=True)
    ds = fw.data.tfrecord_ds(fn + "*", _parser, 8, training=False, cache=cache)
    np.testing.assert_array_equal(np.concatenate(_collect(ds)[0]), first)
    assert sorted(first[:, 0, 0, 0]) == list(range(20))


def test_augmented_epochs_are_cached_and_cycled(shards):
    fn = shards[0]
    ds = fw.data.tfrecord_ds(fn + "*", _parser, 5, training=True, seed=1, cache=True,
                             batch_transform=fw.transform.random_flip, augmented_epochs=2)
    images, labels = _collect(ds, 12)  # 4 batches per epoch: batches 8..11 replay 0..3
    for k in range(4):
        np.testing.assert_array_equal(images[k], images[k + 8])
    # Epochs 0 and 1 are different draws: some image is flipped in one and not the other.
    # Label = index = pixel (0, 0) of the unflipped image.
    flipped = []
    for e in range(2):
        xs, ys = np.concatenate(images[e * 4:e * 4 + 4]), np.concatenate(labels[e * 4:e * 4 + 4])
        flipped.append({int(y) for x, y in zip(xs, ys, strict=True) if x[0, 0, 0] != y})
    assert 0 < len(flipped[0]) < 20
    assert flipped[0] != flipped[1]


@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
def test_seeded_augmentation_is_reproducible(shards):
    fn = shards[0]

    def run(seed):
        ds = fw.data.tfrecord_ds(fn + "*", _parser, 5, training=True, seed=seed,
                                 transform=fw.transform.tfm_pad_crop(1),
                                 batch_transform=fw.transform.random_flip)
        return np.concatenate(_collect(ds, 8)[0])

    np.testing.assert_array_equal(run(5), run(5))
    assert not np.array_equal(run(5), run(6))


@pytest.mark.parametrize("kwargs, match", [
    ({"batch_size": -1}, "batch_size=-1"),
    ({"cache": 3}, "cache=3"),
    ({"shuffle_buf_sz": 0}, "shuffle_buf_sz=0"),
    ({"augmented_epochs": 2, "training": False}, "augmented_epochs"),
])
def test_tfrecord_bad_arguments(shards, kwargs, match):
    args = {"batch_size": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        fw.data.tfrecord_ds(shards[0] + "*", _parser, **args)


# --------------------------------------------------------------------------- image files


def _png_tree(root, classes: dict[str, int]) -> dict[str, np.ndarray]:
    """class folder -> images; pixel (0, 0) encodes (class index, image index)."""
    made = {}
    for c, (name, count) in enumerate(sorted(classes.items())):
        os.makedirs(root / name)
        images = np.zeros((count, 5, 6, 3), np.uint8)
        images[:, 0, 0, 0], images[:, 0, 0, 1] = c, np.arange(count)
        for i, image in enumerate(images):
            (root / name / f"{i}.png").write_bytes(tf.io.encode_png(image).numpy())
        made[name] = images
    (root / "cat" / "readme.txt").write_text("not an image: skipped by extension")
    return made


def test_data_dir_tfrecord_split_and_encoded_image_parser(tmp_path):
    made = _png_tree(tmp_path / "imgs", {"cat": 5, "dog": 5, "emu": 3})
    train, valid = str(tmp_path / "out" / "train"), str(tmp_path / "out" / "valid")
    names = fw.data.data_dir_tfrecord(str(tmp_path / "imgs"), train, valid_fraction=0.4,
                                      valid_fn=valid, num_shards=2)
    assert names == ["cat", "dog", "emu"]

    def parser(record):
        return fw.data.tfexample_image_parser(record, 5, 6)

    seen = {}
    for split, path in (("train", train), ("valid", valid)):
        images, labels = _collect(fw.data.tfrecord_ds(path + "*", parser, 4, training=False))
        images, labels = np.concatenate(images), np.concatenate(labels)
        np.testing.assert_array_equal(images[:, 0, 0, 0], labels)  # label = folder index
        for image in images:  # PNG is lossless and the size unchanged: pixels are exact
            np.testing.assert_array_equal(image, made[names[image[0, 0, 0]]][image[0, 0, 1]])
        seen[split] = np.bincount(labels, minlength=3).tolist()
    # round(0.4 * 5) = 2 and round(0.4 * 3) = 1 per class go to validation.
    assert seen == {"train": [3, 3, 2], "valid": [2, 2, 1]}


@pytest.mark.parametrize("call", ["split", "shuffle", "class_folders"])
def test_an_empty_class_folder_is_an_error_naming_it(tmp_path, call):
    _png_tree(tmp_path / "imgs", {"cat": 2, "emu": 2})
    (tmp_path / "imgs" / "dog").mkdir()  # class id 1 between them, with no image
    (tmp_path / "imgs" / "dog" / "notes.txt").write_text("not an image")
    data_dir, out = str(tmp_path / "imgs"), str(tmp_path / "out")
    write = {"split": lambda: fw.data.data_dir_tfrecord(data_dir, out),
             "shuffle": lambda: fw.data.data_dir_tfrecord(data_dir, out, shuffle=True),
             "class_folders": lambda: fw.data.class_folders_tfrecord(data_dir, out)}[call]
    folder = re.escape(repr(os.path.join(data_dir, "dog")))
    with pytest.raises(ValueError, match=f"class folder {folder} holds no JPEG, PNG, GIF or "
                                         "BMP image; its class 'dog' \\(id 1\\)"):
        write()
    assert not os.path.exists(out)  # refused before writing
    skipped = fw.data.class_folders_tfrecord(data_dir, out, exclude_dirs=["dog"])
    assert skipped.labels == ["cat", "emu"] and sorted(skipped.y) == [0, 0, 1, 1]


def test_files_tfrecord_keeps_encoded_bytes(tmp_path):
    path = tmp_path / "a.jpg"
    path.write_bytes(tf.io.encode_jpeg(np.full((8, 8, 3), 77, np.uint8)).numpy())
    out = fw.data.files_tfrecord(str(tmp_path / "j"), [str(path)], [3])
    record = next(iter(tf.data.TFRecordDataset(out)))
    example = tf.train.Example.FromString(record.numpy())
    assert example.features.feature["image"].bytes_list.value[0] == path.read_bytes()
    assert example.features.feature["label"].int64_list.value[0] == 3


@pytest.mark.parametrize("kwargs, error, match", [
    ({"valid_fraction": 0.2}, ValueError, "needs valid_fn"),
    ({"valid_fraction": 0.2, "valid_fn": "TRAIN_valid"}, ValueError, "prefix"),
    ({"valid_fraction": 1.5, "valid_fn": "V"}, ValueError, "valid_fraction=1.5"),
    # round(0.8 * 2) = 2 of the class's 2 images would go to validation
    ({"valid_fraction": 0.8, "valid_fn": "V"}, ValueError,
     r"training split .* is empty: valid_fraction=0.8 .* \(rounded; 2 to 2 per class\)"),
    # round(0.2 * 2) = 0
    ({"valid_fraction": 0.2, "valid_fn": "V"}, ValueError, "validation split .* is empty"),
])
def test_data_dir_bad_split(tmp_path, kwargs, error, match):
    _png_tree(tmp_path / "imgs", {"cat": 2})
    train = str(tmp_path / "TRAIN")
    if "valid_fn" in kwargs:
        kwargs["valid_fn"] = str(tmp_path / kwargs["valid_fn"])
    with pytest.raises(error, match=match):
        fw.data.data_dir_tfrecord(str(tmp_path / "imgs"), train, **kwargs)


# ------------------------------------------------ gs://, TPU nodes (tfds: test_tfds.py)


def test_gcs_round_trip(gcs_emulator):
    xs, ys = _images(10)
    root = gcs_emulator.unique_url("data")
    code = f"""
        import json, numpy as np, tensorflow as tf, fenwicks as fw
        xs = np.array({xs.tolist()}, np.uint8); ys = np.arange(10)
        paths = fw.data.numpy_tfrecord({root!r} + "/train", xs, ys, num_shards=2)
        try:
            fw.data.numpy_tfrecord({root!r} + "/train", xs, ys, num_shards=2)
            refused = False
        except FileExistsError:
            refused = True
        parser = lambda r: fw.data.tfexample_numpy_image_parser(r, {H}, {W}, {C})
        ds = fw.data.tfrecord_ds({root!r} + "/train*", parser, 4, training=False,
                                 cache={root!r} + "/cache/train")
        images = np.concatenate([x for x, _ in ds.as_numpy_iterator()])
        print(json.dumps({{"paths": paths, "refused": refused,
                          "count": fw.data.count_records({root!r} + "/train*"),
                          "cached": tf.io.gfile.exists({root!r} + "/cache/train.index"),
                          "images": images.tolist()}}))
    """
    out = gcs_emulator.run_json(code)
    assert out["paths"] == [f"{root}/train-0000{i}-of-00002" for i in range(2)]
    assert out["refused"] and out["count"] == 10 and out["cached"]
    images = np.array(out["images"], np.uint8)
    np.testing.assert_array_equal(images, xs[images[:, 0, 0, 0]])
    assert sorted(images[:, 0, 0, 0]) == list(range(10))


def test_public_names_exist():
    for name in fw.data.__all__:
        assert getattr(fw.data, name) is not None
    assert json.dumps(fw.data.shard_paths("x", 2)) == '["x-00000-of-00002", "x-00001-of-00002"]'


class _RemoteTpu:
    is_remote = True


@pytest.fixture
def remote_tpu(monkeypatch):
    """Pretends a TPU node reached over the network is in use (no Python on its host)."""
    monkeypatch.setattr(fw.accel, "is_initialized", lambda: True)
    monkeypatch.setattr(fw.accel, "current", lambda: _RemoteTpu())


def test_remote_tpu_gets_graph_constants_and_a_clear_limit(remote_tpu):
    xs, ys = _images(7)
    images, labels = _collect(fw.data.numpy_ds(xs, ys, 3, training=False))
    np.testing.assert_array_equal(np.concatenate(images), xs)
    np.testing.assert_array_equal(np.concatenate(labels), ys)
    huge = np.broadcast_to(np.zeros(1, np.uint8), (3 * 2**20, 1024))  # 3 GB view, no memory
    with pytest.raises(ValueError, match="3.0 GB.*numpy_tfrecord"):
        fw.data.numpy_ds(huge, np.zeros(len(huge), np.int32), 8)
    with pytest.raises(ValueError, match="data_dir='/tmp/tfds' is local"):
        fw.data.tfds_ds("mnist", "train", 8, data_dir="/tmp/tfds")
    with pytest.raises(ValueError, match="file_pattern='/tmp/x/train\\*' is local"):
        fw.data.tfrecord_ds("/tmp/x/train*", _parser, 8)


def test_tfds_dir_follows_the_storage_rule(remote_tpu, monkeypatch):
    from fenwicks.data.tfds_source import tfds_data_dir

    monkeypatch.delenv("FENWICKS_ROOT", raising=False)
    monkeypatch.setenv("FENWICKS_BUCKET", "my-bucket")
    assert tfds_data_dir(None) == "gs://my-bucket/tensorflow_datasets"
    assert tfds_data_dir("gs://other/tfds") == "gs://other/tfds"


def test_the_three_pipelines_share_their_options_as_keyword_only_arguments():
    import inspect

    shared = {"shuffle_buf_sz", "seed", "input_context", "batch_transform", "deterministic"}
    for pipeline in (fw.data.numpy_ds, fw.data.tfrecord_ds, fw.data.tfds_ds):
        params = inspect.signature(pipeline).parameters
        positional = [n for n, p in params.items() if p.kind != p.KEYWORD_ONLY]
        assert positional[-2:] == ["batch_size", "training"], pipeline.__name__
        assert all(params[n].kind == params[n].KEYWORD_ONLY for n in shared), pipeline.__name__
    with pytest.raises(TypeError):
        fw.data.numpy_ds(np.zeros((4, 2)), None, 2, True, None, 1)  # seed by position


def test_small_arrays_gathered_in_the_graph_give_the_numpy_gathers_batches(monkeypatch):
    xs = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
    ys = np.arange(50) % 4

    def batches():
        ds = fw.data.numpy_ds(xs, ys, 8, seed=2)
        return [(a.numpy(), b.numpy()) for a, b in ds.take(14)]  # into the second epoch

    in_graph = batches()
    monkeypatch.setattr(fw.data.arrays, "IN_GRAPH_BYTES", 0)  # the numpy_function path
    for (a, b), (c, d) in zip(in_graph, batches(), strict=True):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(b, d)


# ------------------------------------------------- image folders, CSV labels, test folders


def _write_png(path, pixels):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tf.io.write_file(str(path), tf.io.encode_png(pixels))


def _marked_png(path, mark: int, size: int = 5):
    """A PNG whose first pixel holds `mark`, so a parsed image says which file it was."""
    pixels = np.full((size, size, 3), 7, np.uint8)
    pixels[0, 0, 0] = mark
    _write_png(path, pixels)


def _mark(image) -> int:
    return int(round(float(np.asarray(image)[0, 0, 0]) * 255))


def test_label_csv_tfrecord_writes_csv_order_and_parses_back(tmp_path):
    rows = [(3, "dog"), (1, "cat"), (2, "ant"), (4, "dog")]
    for file_id, _ in rows:
        _marked_png(tmp_path / "train" / f"{file_id}.png", 10 * file_id)
    csv_fn = tmp_path / "labels.csv"
    csv_fn.write_text("id,label\n" + "".join(f"{i},{name}\n" for i, name in rows))
    out = str(tmp_path / "train.tfrec")
    paths, y, labels = fw.data.data_dir_label_csv_tfrecord(
        str(tmp_path / "train"), str(csv_fn), out, file_ext="png")
    assert labels == ["ant", "cat", "dog"]  # sorted class names
    assert [os.path.basename(p) for p in paths] == ["3.png", "1.png", "2.png", "4.png"]
    assert y == [2, 1, 0, 2]
    parser = fw.data.get_tfexample_image_parser([fw.transform.tfm_set_shape(5, 5)])
    got = [(_mark(x), int(label)) for x, label in tf.data.TFRecordDataset(out).map(parser)]
    assert got == [(30, 2), (10, 1), (20, 0), (40, 2)]


def test_label_csv_tfrecord_bad_inputs(tmp_path):
    _marked_png(tmp_path / "train" / "1.png", 1)
    csv_fn = tmp_path / "labels.csv"
    csv_fn.write_text("name,label\n1,cat\n")
    with pytest.raises(ValueError, match="id_col='id' is not a column"):
        fw.data.data_dir_label_csv_tfrecord(str(tmp_path / "train"), str(csv_fn),
                                            str(tmp_path / "a"), file_ext="png")
    csv_fn.write_text("id,label\n1,cat\n2,dog\n")
    with pytest.raises(ValueError, match="2.png .*does not exist"):
        fw.data.data_dir_label_csv_tfrecord(str(tmp_path / "train"), str(csv_fn),
                                            str(tmp_path / "a"), file_ext="png")
    with pytest.raises(ValueError, match="not in _labels"):
        fw.data.data_dir_label_csv_tfrecord(str(tmp_path / "train"), str(csv_fn),
                                            str(tmp_path / "a"), file_ext="png",
                                            _labels=["cat"])
    with pytest.raises(TypeError, match="numpy_tfrecord"):
        fw.data.data_dir_label_csv_tfrecord(str(tmp_path / "train"), str(csv_fn),
                                            str(tmp_path / "a"), extractor=np.load)
    assert not os.path.exists(tmp_path / "a")  # nothing written by a refused call


def test_no_label_tfrecord_keeps_sorted_order_and_has_no_label(tmp_path):
    for i in (2, 10, 1):
        _marked_png(tmp_path / "test" / f"{i}.png", i)
    (tmp_path / "test" / "notes.txt").write_text("not an image")
    out = str(tmp_path / "test.tfrec")
    paths = fw.data.data_dir_no_label_tfrecord(str(tmp_path / "test"), out, file_ext="png")
    assert [os.path.basename(p) for p in paths] == ["1.png", "10.png", "2.png"]
    parser = fw.data.get_tfexample_image_parser(has_label=False)
    marks = [_mark(x) for x in tf.data.TFRecordDataset(out).map(parser)]
    assert marks == [1, 10, 2]
    record = next(iter(tf.data.TFRecordDataset(out))).numpy()
    assert set(tf.train.Example.FromString(record).features.feature) == {"image"}
    with pytest.raises(FileExistsError):
        fw.data.data_dir_no_label_tfrecord(str(tmp_path / "test"), out, file_ext="png")


def test_get_tfexample_image_parser_decodes_to_unit_floats_and_applies_tfms(tmp_path):
    pixels = np.arange(5 * 5 * 3, dtype=np.uint8).reshape(5, 5, 3)
    _write_png(tmp_path / "a" / "x.png", pixels)
    fn = str(tmp_path / "r")
    fw.data.files_tfrecord(fn, [str(tmp_path / "a" / "x.png")], [4])
    record = next(iter(tf.data.TFRecordDataset(fn)))
    x, y = fw.data.get_tfexample_image_parser()(record)
    np.testing.assert_allclose(x.numpy(), pixels / 255.0, atol=1e-6)
    assert x.dtype == tf.float32 and int(y) == 4
    double = fw.data.get_tfexample_image_parser([lambda im: im * 2, lambda im: im + 1])
    np.testing.assert_allclose(double(record)[0].numpy(), pixels / 255.0 * 2 + 1, atol=1e-5)
    with pytest.raises(ValueError, match=r"tfms\[1\]"):
        fw.data.get_tfexample_image_parser([lambda im: im, "resize"])


def _class_tree(root, counts):
    for label, count in enumerate(counts):
        for i in range(count):
            _marked_png(root / f"class{label}" / f"{i}.png", 10 * label + i)


def test_data_dir_tfrecord_shuffle_returns_paths_labels_and_names(tmp_path):
    _class_tree(tmp_path / "imgs", [3, 4])
    out = str(tmp_path / "all")
    paths, y, labels = fw.data.data_dir_tfrecord(str(tmp_path / "imgs"), out, shuffle=False)
    assert labels == ["class0", "class1"] and y == [0, 0, 0, 1, 1, 1, 1]
    parser = fw.data.get_tfexample_image_parser()
    stored = [(_mark(x), int(label)) for x, label in tf.data.TFRecordDataset(out).map(parser)]
    expected = [(10 * label + int(os.path.basename(p)[:-4]), label)
                for p, label in zip(paths, y, strict=True)]
    assert stored == expected  # paths[i] and y[i] describe record i
    shuffled = fw.data.data_dir_tfrecord(str(tmp_path / "imgs"), str(tmp_path / "s"),
                                         shuffle=True)
    assert sorted(zip(shuffled.paths, shuffled.y, strict=True)) == sorted(
        zip(paths, y, strict=True))
    assert list(shuffled.paths) != list(paths)  # seed 0 moves 7 files (checked once)
    # The split form is unchanged: it still returns the class names.
    assert fw.data.data_dir_tfrecord(str(tmp_path / "imgs"), str(tmp_path / "t")) == labels
    with pytest.raises(ValueError, match="n_folds"):
        fw.data.data_dir_tfrecord(str(tmp_path / "imgs"), str(tmp_path / "u"), shuffle=True,
                                  valid_fraction=0.2, valid_fn=str(tmp_path / "v"))


def _fold_labels(fn, n_folds, fold, training, **kwargs):
    parser = lambda r: fw.data.tfexample_numpy_image_parser(r, H, W, C)  # noqa: E731
    ds = fw.data.tfrecord_ds(fn, parser, 4, training=training, n_folds=n_folds,
                             val_fold_idx=fold, seed=3, **kwargs)
    if training:
        return [int(v) for _, y in ds.take(10) for v in y]  # > 2 epochs: every record
    return [int(v) for _, y in ds for v in y]


@pytest.mark.slow  # ~8 s: six pipelines over three shards
def test_tfrecord_ds_k_folds_partition_every_record(tmp_path):
    xs, ys = _images(23)
    ys = np.arange(23)  # label = global record index
    fn = str(tmp_path / "d")
    fw.data.numpy_tfrecord(fn, xs, ys, num_shards=3)  # round robin over 3 files
    files = sorted(tf.io.gfile.glob(fn + "*"))
    order = [int(y) for f in files for _, y in tf.data.TFRecordDataset(f).map(_parser)]
    folds = [sorted(_fold_labels(fn + "*", 5, k, False)) for k in range(5)]
    # Expected independently: record i of the files in sorted order is in fold i % 5.
    assert folds == [sorted(order[k::5]) for k in range(5)]
    assert sorted(sum(folds, [])) == list(range(23))  # each record in exactly one fold
    for k in (3,):
        seen = set(_fold_labels(fn + "*", 5, k, True))
        assert seen == set(range(23)) - set(folds[k])  # training reads all folds but k


def test_tfrecord_ds_k_folds_bad_arguments(tmp_path):
    xs, ys = _images(4)
    fn = str(tmp_path / "d")
    fw.data.numpy_tfrecord(fn, xs, ys)
    for kwargs, match in [({"n_folds": 0}, "n_folds=0"), ({"n_folds": 3, "val_fold_idx": 3},
                                                           r"val_fold_idx=3 .*\[0, n_folds=3\)"),
                          ({"n_folds": 5}, "n_folds=5 but .* 4 records")]:
        with pytest.raises(ValueError, match=match):
            fw.data.tfrecord_ds(fn, _parser, 2, **kwargs)
    assert len(_fold_labels(fn, np.int64(2), np.int64(1), False)) == 2  # numpy ints


def test_numpy_tfrecord_accepts_keras_style_n_by_1_labels(tmp_path):
    xs, _ = _images(5)
    fn = str(tmp_path / "d")
    fw.data.numpy_tfrecord(fn, xs, np.arange(5).reshape(5, 1))
    assert [int(y) for _, y in tf.data.TFRecordDataset(fn).map(_parser)] == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="shape"):
        fw.data.numpy_tfrecord(str(tmp_path / "e"), xs, np.zeros((5, 2), np.int64))


def test_numpy_ds_k_folds_hold_out_every_n_th_example():
    xs, _ = _images(11)
    ys = np.arange(11)
    held = [[int(v) for _, y in fw.data.numpy_ds(xs, ys, 4, training=False, n_folds=3,
                                                  val_fold_idx=k) for v in y] for k in range(3)]
    assert held == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8]]  # example i in fold i % 3
    train = fw.data.numpy_ds(xs, ys, 2, training=True, n_folds=3, val_fold_idx=1, seed=0)
    seen = {int(v) for _, y in train.take(8) for v in y}  # 16 draws, 2 epochs of 7
    assert seen == {0, 2, 3, 5, 6, 8, 9}
    with pytest.raises(ValueError, match="val_fold_idx=3"):
        fw.data.numpy_ds(xs, ys, 2, n_folds=3, val_fold_idx=3)


def test_numpy_integers_are_accepted_for_sizes_and_counts(tmp_path):
    xs, ys = _images(6)
    fn = str(tmp_path / "d")
    paths = fw.data.numpy_tfrecord(fn, xs, ys, num_shards=np.int64(2))
    assert len(paths) == 2
    h, w, c = (np.int64(v) for v in xs.shape[1:])  # e.g. from a memmap's shape
    ds = fw.data.tfrecord_ds(fn + "*", lambda r: fw.data.tfexample_numpy_image_parser(
        r, h, w, c), np.int64(3), training=False, shuffle_buf_sz=np.int32(4))
    assert sorted(int(v) for _, y in ds for v in y) == list(ys)

