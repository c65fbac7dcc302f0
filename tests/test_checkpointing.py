"""`fenwicks.train.checkpointing`, what every engine's checkpoints share: what counts as
storage failing (never taken for a damaged checkpoint), and that the module imports no
TensorFlow (the run format is written and read without it)."""

from __future__ import annotations

import ast
import pathlib

import pytest
import tensorflow as tf

from fenwicks.train import checkpointing

TRAIN = pathlib.Path(checkpointing.__file__).parent


@pytest.mark.parametrize("error", [
    tf.errors.AbortedError(None, None, "All 10 retry attempts failed. The last failure: "
                                       "Unavailable: 503"),
    tf.errors.UnavailableError(None, None, "connection reset"),
    tf.errors.DeadlineExceededError(None, None, "timed out"),
    # The status code lost on the way: only the text says it.
    tf.errors.UnknownError(None, None, "All 6 retry attempts failed"),
    ValueError("Error reading gs://b/w/ckpt-4.index: ABORTED: All 10 retry attempts failed"),
])
def test_a_failure_to_reach_storage_is_a_storage_error(error):
    assert checkpointing.is_storage_error(error)


@pytest.mark.parametrize("error", [
    tf.errors.NotFoundError(None, None, "gs://b/w/checkpoints/4/record/metadata"),
    tf.errors.DataLossError(None, None, "Checksum does not match"),
    tf.errors.PermissionDeniedError(None, None, "403"),
    ValueError("Shapes (3, 2) and (3, 3) are incompatible"),
    FileNotFoundError("gs://b/w/checkpoints/4"),
    OSError("No space left on device"),
])
def test_a_file_reached_and_found_missing_or_damaged_is_not(error):
    assert not checkpointing.is_storage_error(error)


def _imported_modules(path: pathlib.Path, *, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_shared_checkpoint_modules_import_no_tensorflow():
    assert "tensorflow" not in _imported_modules(TRAIN / "checkpointing.py",
                                                 top_level_only=False)
    # The run format: only where it asks TensorFlow's gs:// client (fenwicks.io's).
    assert "tensorflow" not in _imported_modules(TRAIN / "run_format.py",
                                                 top_level_only=True)
    assert "tensorflow" not in _imported_modules(TRAIN / "save_policy.py",
                                                 top_level_only=False)
