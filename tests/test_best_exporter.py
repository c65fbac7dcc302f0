"""`fw.train.BestExporter` swaps a new best export in only when it is whole: a failure
while exporting leaves the previous best loadable, on local disk and on object storage."""

from __future__ import annotations

import json

import tensorflow as tf

import fenwicks as fw


class _Exporting:
    """The estimator side of BestExporter: writes a two-file export, or fails halfway."""

    def __init__(self):
        self.global_step, self.fail = 0, False

    def export_saved_model(self, export_dir):
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


def scenario(export_dir: str) -> dict:
    """Best at epoch 0; a new best whose export fails halfway; then another best."""
    estimator = _Exporting()
    best = fw.train.BestExporter(export_dir, monitor="val_loss")
    best.estimator = estimator
    seen = {}
    for epoch, (val_loss, fail) in enumerate([(0.9, False), (0.5, True), (0.4, False)]):
        estimator.global_step, estimator.fail = 10 * (epoch + 1), fail
        try:
            best.on_epoch_end(epoch, {"val_loss": val_loss})
            seen[str(epoch)] = {"export": _read(export_dir)}
        except fw.train.ExportError as err:  # one line, naming the export
            seen[str(epoch)] = {"error": str(err), "export": _read(export_dir)}
    parent = export_dir.rsplit("/", 1)[0]
    seen["leftovers"] = sorted(name.rstrip("/") for name in tf.io.gfile.listdir(parent))
    seen["exports"] = best.exports
    return seen


def _check(seen: dict) -> None:
    first = ["model at step 10", "weights at step 10", 10]
    assert list(seen["0"]["export"]) == first
    # the export of the second best failed halfway: the first is still whole
    assert "mid-export; the previous export in" in seen["1"]["error"]
    assert list(seen["1"]["export"]) == first
    assert list(seen["2"]["export"]) == ["model at step 30", "weights at step 30", 30]
    assert seen["leftovers"] == ["best"] and seen["exports"] == 2  # no staging folder


def test_a_failed_export_leaves_the_previous_best_whole_on_local_disk(tmp_path):
    _check(scenario(str(tmp_path / "best")))


def test_a_failed_export_leaves_the_previous_best_whole_on_gcs(gcs_emulator):
    export_dir = gcs_emulator.unique_url("best-exporter") + "/best"
    _check(gcs_emulator.run_json(
        "import json\nfrom tests.test_best_exporter import scenario\n"
        f"print(json.dumps(scenario({export_dir!r}), default=list))"))
