"""`fw.train.BestExporter` writes each new best as a version made visible only when
whole: a failure while exporting leaves the previous best loadable, on local disk and on
object storage; keep-N removes only versions exactly as it wrote them (issue 52)."""

from __future__ import annotations

import json

import pytest
import tensorflow as tf

import fenwicks as fw


class _Exporting:
    """The estimator side of BestExporter: writes a two-file export, or fails halfway."""

    def __init__(self):
        self.global_step, self.fail = 0, False

    def saved_model_writer(self):
        return self._write

    def _write(self, export_dir):
        tf.io.gfile.makedirs(f"{export_dir}/variables")
        with tf.io.gfile.GFile(f"{export_dir}/saved_model.pb", "w") as f:
            f.write(f"model at step {self.global_step}")
        if self.fail:
            raise tf.errors.UnavailableError(None, None, "storage went away mid-export")
        with tf.io.gfile.GFile(f"{export_dir}/variables/data", "w") as f:
            f.write(f"weights at step {self.global_step}")
        return export_dir


def _read(export_dir):
    def text(name):
        with tf.io.gfile.GFile(f"{export_dir}/{name}") as f:
            return f.read()
    return (text("saved_model.pb"), text("variables/data"),
            json.loads(text("best.json"))["step"])


def scenario(export_dir: str, keep: int = 5) -> dict:
    """Best at epoch 0; a new best whose export fails halfway; then more bests, a user's
    file put into the first version (keep-N must leave that one)."""
    estimator = _Exporting()
    best = fw.train.BestExporter(export_dir, monitor="val_loss", exports_to_keep=keep)
    best.estimator = estimator
    seen = {}
    losses = [(0.9, False), (0.5, True), (0.4, False), (0.3, False), (0.2, False)]
    for epoch, (val_loss, fail) in enumerate(losses):
        estimator.global_step, estimator.fail = 10 * (epoch + 1), fail
        try:
            best.on_epoch_end(epoch, {"val_loss": val_loss})
            seen[str(epoch)] = {"export": _read(fw.train.latest_export(export_dir))}
        except fw.train.ExportError as err:  # one line, naming the export
            seen[str(epoch)] = {"error": str(err),
                                "export": _read(fw.train.latest_export(export_dir))}
        if epoch == 0:
            seen["first"] = best.last_export
            with tf.io.gfile.GFile(f"{seen['first']}/mine.txt", "w") as f:
                f.write("user's")
    seen["versions"] = sorted(name.rstrip("/") for name in tf.io.gfile.listdir(export_dir))
    seen["exports"] = best.exports
    with tf.io.gfile.GFile(f"{seen['first']}/mine.txt") as f:
        seen["user_file"] = f.read()
    return seen


def _check(seen: dict, keep: int) -> None:
    first = ["model at step 10", "weights at step 10", 10]
    assert list(seen["0"]["export"]) == first
    # the export of the second best failed halfway: the first is still whole
    assert "mid-export; the partial version was removed and earlier exports" in \
        seen["1"]["error"]
    assert list(seen["1"]["export"]) == first
    assert list(seen["2"]["export"]) == ["model at step 30", "weights at step 30", 30]
    assert list(seen["4"]["export"]) == ["model at step 50", "weights at step 50", 50]
    assert seen["exports"] == 4 and seen["user_file"] == "user's"
    # no staging left; keep 5: all four; keep 1: the newest, and the first (a user's file)
    assert len(seen["versions"]) == (4 if keep == 5 else 2)
    assert all(name.isdigit() for name in seen["versions"])
    assert seen["first"].rsplit("/", 1)[1] in seen["versions"]


@pytest.mark.parametrize("keep", [5, 1])
def test_a_failed_export_leaves_the_previous_best_whole_on_local_disk(tmp_path, keep):
    _check(scenario(str(tmp_path / "best"), keep), keep)


def test_a_failed_export_leaves_the_previous_best_whole_on_gcs(gcs_emulator):
    export_dir = gcs_emulator.unique_url("best-exporter") + "/best"
    _check(gcs_emulator.run_json(
        "import json\nfrom tests.test_best_exporter import scenario\n"
        f"print(json.dumps(scenario({export_dir!r}, 1), default=list))"), 1)
