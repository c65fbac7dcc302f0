"""Deadlines on ``gs://`` calls (`fenwicks._deadline`): clean-up calls get a short bound of
their own, say so when they run out, and never cost the caller its results."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from fenwicks import _deadline
from fenwicks.train.progress import TrainSummaries, write_eval_summary

BOUND = 0.3  # seconds, for both kinds of call in these tests


@pytest.fixture
def storage_hangs(monkeypatch):
    """A storage call that blocks until the test ends (then it is let go)."""
    monkeypatch.setenv(_deadline.CLEANUP_ENV, str(BOUND))  # the test hook
    monkeypatch.setenv(_deadline.DEADLINE_ENV, str(BOUND))
    release = threading.Event()
    yield lambda *args, **kwargs: release.wait(30)
    release.set()
    _deadline.reset_for_tests(join_secs=5)


def test_a_timed_out_call_names_the_deadline_variable(storage_hangs):
    with pytest.raises(_deadline.StorageTimeoutError,
                       match=rf"checkpoint save of gs://b/ckpt .*within {BOUND} s "
                             rf"\({_deadline.DEADLINE_ENV}\)"):
        _deadline.run(storage_hangs, what="checkpoint save", path="gs://b/ckpt")


def test_a_clean_up_call_names_its_own_bound_and_does_not_raise(storage_hangs, caplog):
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        out = _deadline.run(storage_hangs, what="summary flush", path="gs://b/train",
                            best_effort=True)
    assert out is None and time.monotonic() - start < BOUND + 2
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "summary flush of gs://b/train failed" in message
    assert "the bound for a clean-up call" in message
    assert _deadline.DEADLINE_ENV not in message  # it was not that deadline


class _HangingWriter:
    """A summary writer whose storage does not answer."""

    def __init__(self, hang):
        self.hang = hang

    def as_default(self, step=None):
        self.hang()
        raise AssertionError("not reached while storage hangs")

    def flush(self):
        self.hang()


def test_evaluation_summary_on_hanging_storage_is_skipped_with_a_warning(storage_hangs,
                                                                          caplog):
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        write_eval_summary(_HangingWriter(storage_hangs), 10, {"loss": 0.5},
                           path="gs://b/run/eval")
    assert time.monotonic() - start < BOUND + 2
    assert any("evaluation summary of gs://b/run/eval failed" in r.getMessage()
               for r in caplog.records)


def test_closing_progress_on_hanging_storage_ends_within_the_bound(storage_hangs, caplog):
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="fenwicks"):
        TrainSummaries(_HangingWriter(storage_hangs), path="gs://b/run/train").close()
    assert time.monotonic() - start < BOUND + 2
    assert any("training summary flush of gs://b/run/train failed" in r.getMessage()
               for r in caplog.records)


def test_local_summaries_are_written_directly(tmp_path):
    import tensorflow as tf

    writer = tf.summary.create_file_writer(str(tmp_path))
    write_eval_summary(writer, 3, {"loss": 0.25, "global_step": 3}, path=str(tmp_path))
    events = [e for f in tmp_path.iterdir() for e in tf.compat.v1.train.summary_iterator(str(f))]
    tags = {v.tag for e in events for v in e.summary.value}
    assert tags == {"loss"}


_ORDER_PROBE = """
import json, logging
{imports}
from fenwicks import _deadline

records = []
handler = logging.Handler()
handler.emit = records.append
logging.getLogger("fenwicks").addHandler(handler)
for _ in range(3):  # three gs:// calls (nothing is sent: the call is a no-op)
    _deadline.run(lambda: None, what="probe", path="gs://bucket/x")
_deadline.run(lambda: None, what="probe", path="/tmp/x")
print(json.dumps([r.getMessage() for r in records]))
"""


# as on a user's machine: this test process's `import fenwicks` set them in os.environ
_UNSET = dict.fromkeys(_deadline.tensorflow_settings())


@pytest.mark.parametrize("imports, env, warned", [
    ("import tensorflow\nimport fenwicks", _UNSET, 1),
    ("import fenwicks\nimport tensorflow", _UNSET, 0),
    # the user gave TensorFlow its settings before importing it: nothing was lost
    ("import tensorflow\nimport fenwicks", dict(_deadline.tensorflow_settings()), 0),
], ids=["tensorflow-first", "fenwicks-first", "tensorflow-first-with-settings"])
def test_tensorflow_imported_first_is_said_once_at_the_first_gs_call(imports, env, warned):
    from tests.conftest import run_json

    # a new interpreter: the import order is the property
    messages = run_json(_ORDER_PROBE.format(imports=imports), env=env, fresh=True)
    said = [m for m in messages if "imported before Fenwicks" in m]
    assert len(said) == warned, messages
    if warned:
        assert "import fenwicks before tensorflow" in said[0]
        assert f"within {_deadline.deadline_secs():g} s" in said[0]


def test_an_epoch_log_write_on_hanging_storage_names_the_file(storage_hangs, monkeypatch):
    import tensorflow as tf

    from fenwicks.train import history

    monkeypatch.setattr(tf.io.gfile, "GFile", storage_hangs)  # the write hangs
    monkeypatch.setattr(history, "read_epochs", lambda work_dir, step: [])
    with pytest.raises(_deadline.StorageTimeoutError,
                       match="epoch log write of gs://b/run/epochs.jsonl"):
        history.append_epoch("gs://b/run", 0, 10, {"val_loss": 0.5})


def test_an_export_on_hanging_storage_names_the_export(storage_hangs, monkeypatch):
    import types

    import keras
    import tensorflow as tf

    from fenwicks.train import export_dirs
    from fenwicks.train.tf import export

    monkeypatch.setattr(tf.saved_model, "save", storage_hangs)
    monkeypatch.setattr(tf.io.gfile, "exists", lambda path: False)  # a new folder
    monkeypatch.setattr(tf.io.gfile, "isdir", lambda path: False)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    spec = types.SimpleNamespace(model=model, predict_fn=lambda outputs: outputs)
    with pytest.raises(_deadline.StorageTimeoutError,
                       match="SavedModel export of gs://b/best"):
        export_dirs.write("gs://b/best", lambda folder: export.export_saved_model(
            spec, tf.TensorSpec([4, 3]), folder))
    monkeypatch.setattr(tf.io.gfile, "exists", storage_hangs)  # checking the folder hangs
    with pytest.raises(_deadline.StorageTimeoutError,
                       match="SavedModel export of gs://b/best"):
        export_dirs.check_base("gs://b/best")
