"""Input pipelines: numpy arrays, TFRecord files and tensorflow-datasets into `tf.data`.

An estimator input function returns one of these datasets; ``params['batch_size']`` is
the per-replica batch size::

    train_input_func = lambda params: fw.data.numpy_ds(
        X, y, batch_size=params['batch_size'], training=True,
        input_context=params.get('input_context'))

Training datasets are shuffled, repeated and have a static batch size; evaluation
datasets are one exact pass that keeps the last partial batch.

Modules: `arrays` (numpy_ds), `records` (writing TFRecords), `image_folders` (image
folders, a CSV of labels or a test folder to TFRecords), `parsers`, `readers`
(tfrecord_ds), `tfds_source` (tensorflow-datasets), `scan` (checking files), `options`
(the pipelines' settings, validated once), `pipeline` (the shared tail), `epochs`
(training streams of records that can start at any batch), `position` (where a resumed
run's training input starts) and `service` (the tf.data service: input work on other
machines).
"""

from fenwicks._removed import removed_error
from fenwicks.data._checks import RecordError
from fenwicks.data.arrays import numpy_ds
from fenwicks.data.image_folders import (
    ImageFiles,
    class_folders_tfrecord,
    data_dir_label_csv_tfrecord,
    data_dir_no_label_tfrecord,
    data_dir_tfrecord,
)
from fenwicks.data.parsers import (
    get_tfexample_image_parser,
    tfexample_image_parser,
    tfexample_numpy_image_parser,
)
from fenwicks.data.readers import count_records, match_files, tfrecord_ds
from fenwicks.data.records import (
    files_tfrecord,
    image_example,
    numpy_tfrecord,
    shard_paths,
)
from fenwicks.data.scan import FileScan, scan_tfrecord
from fenwicks.data.service import via_data_service
from fenwicks.data.tfds_source import (
    DatasetUnavailableError,
    tfds_builder,
    tfds_ds,
    tfds_load,
)

__all__ = [
    "DatasetUnavailableError",
    "FileScan",
    "ImageFiles",
    "RecordError",
    "class_folders_tfrecord",
    "count_records",
    "data_dir_label_csv_tfrecord",
    "data_dir_no_label_tfrecord",
    "data_dir_tfrecord",
    "files_tfrecord",
    "get_tfexample_image_parser",
    "image_example",
    "match_files",
    "numpy_ds",
    "numpy_tfrecord",
    "scan_tfrecord",
    "shard_paths",
    "tfds_builder",
    "tfds_ds",
    "tfds_load",
    "tfexample_image_parser",
    "tfexample_numpy_image_parser",
    "tfrecord_ds",
    "via_data_service",
]

_REMOVED = {
    "numpy_tfrecord_shards": "numpy_tfrecord(fn, X, y, num_shards=N)",
    "data_dir_tfrecord_shards": "class_folders_tfrecord(data_dir, fn, num_shards=N)",
    "data_dir_tfrecord_split": "data_dir_tfrecord(data_dir, fn, valid_fraction=0.2, "
                               "valid_fn=...)",
    "to_tfrecord_split": "data_dir_tfrecord(data_dir, fn, valid_fraction=, valid_fn=)",
    "data_dir_re_tfrecord": "files_tfrecord(fn, paths, labels) with labels from your regex",
    "tfexample_raw_parser": "get_tfexample_image_parser(tfms, has_label=...)",
    "crossval_ds": "tfrecord_ds(..., n_folds=, val_fold_idx=)",
    "numpy_tfexample": "numpy_tfrecord (it writes the records)",
    "raw_image_tfexample": "image_example(image_bytes, label)",
}


def __getattr__(name: str) -> object:
    raise removed_error("fenwicks.data", name, _REMOVED)
