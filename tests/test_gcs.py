"""TensorFlow's own gs:// client against a real GCS server, and `fw.gcs.setup()` branches."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from google.auth.exceptions import DefaultCredentialsError

import fenwicks as fw
from tests import gcs_emulator as emulator_module


def test_tensorflow_gs_client_round_trips(gcs_emulator):
    """TFRecord through tf.data, a CheckpointManager save/restore and a tf.summary event
    file, all on gs:// through TensorFlow's built-in client (one subprocess for speed)."""
    base = gcs_emulator.unique_url("tfclient")
    records = [f"record-{i}".encode() * (i + 1) for i in range(7)]
    weights = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    out = gcs_emulator.run_json(f"""
        import json, os
        import numpy as np
        import tensorflow as tf

        base = {base!r}
        tf.io.gfile.makedirs(base + "/work")
        with tf.io.TFRecordWriter(base + "/data.tfrec") as writer:
            for record in {records!r}:
                writer.write(record)
        read = [r.numpy().decode("latin1")
                for r in tf.data.TFRecordDataset(base + "/data.tfrec")]

        variable = tf.Variable(np.array({weights.tolist()!r}, np.float32))
        step = tf.Variable(0, dtype=tf.int64)
        checkpoint = tf.train.Checkpoint(w=variable, step=step)
        manager = tf.train.CheckpointManager(checkpoint, base + "/work/ckpt", max_to_keep=2)
        for i in range(3):
            step.assign(i + 1)
            manager.save(checkpoint_number=i + 1)
        variable.assign(tf.zeros_like(variable))
        step.assign(0)
        restored = tf.train.Checkpoint(w=variable, step=step).restore(manager.latest_checkpoint)
        restored.assert_consumed()

        writer = tf.summary.create_file_writer(base + "/work/logs")
        with writer.as_default():
            for i in range(4):
                tf.summary.scalar("loss", 1.0 / (i + 1), step=i)
        writer.close()
        events = tf.io.gfile.glob(base + "/work/logs/events.out.tfevents.*")
        scalars = []
        for raw in tf.data.TFRecordDataset(events):
            event = tf.compat.v1.Event.FromString(raw.numpy())
            for value in event.summary.value:
                scalars.append([event.step, float(tf.make_ndarray(value.tensor))])
        print(json.dumps(dict(
            read=read, w=variable.numpy().tolist(), step=int(step.numpy()),
            latest=manager.latest_checkpoint, kept=manager.checkpoints,
            events=len(events), scalars=scalars)))
    """)
    assert out["read"] == [r.decode("latin1") for r in records]
    np.testing.assert_array_equal(np.array(out["w"], np.float32), weights)
    assert out["step"] == 3
    assert out["latest"] == base + "/work/ckpt/ckpt-3"
    assert out["kept"] == [base + "/work/ckpt/ckpt-2", base + "/work/ckpt/ckpt-3"]
    assert out["events"] == 1
    assert out["scalars"] == [[i, np.float32(1.0 / (i + 1))] for i in range(4)]


# --------------------------------------------------------------------------- fw.gcs.setup()

SECRET = "ya29.SECRET-TOKEN-must-never-appear"


class FakeCredentials:
    token = SECRET

    def __repr__(self) -> str:  # a careless print of the object would leak this
        return f"FakeCredentials(token={SECRET})"


@pytest.fixture
def fake_google(monkeypatch):
    """A clean environment with google.auth.default replaced; records its calls.

    Set ``.failing = True`` to simulate a machine with no credentials.
    """
    import google.auth

    state = types.SimpleNamespace(calls=[], failing=False)

    def default(scopes=None, **kwargs):
        state.calls.append(scopes)
        if state.failing:
            raise DefaultCredentialsError("Your default credentials were not found.")
        return FakeCredentials(), "adc-project"

    for name in ("COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE", "STORAGE_EMULATOR_HOST",
                 "GOOGLE_CLOUD_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    for name in ("google.colab", "kaggle_secrets"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(google.auth, "default", default)
    fw.gcs.reset_for_tests()  # as a fresh process
    return state


def fake_module(monkeypatch, name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def test_setup_on_colab(fake_google, monkeypatch, capsys):
    authenticated = []
    auth = types.SimpleNamespace(authenticate_user=lambda: authenticated.append(True))
    fake_module(monkeypatch, "google.colab", auth=auth)
    assert fw.gcs.environment() == "colab"
    assert fw.gcs.setup() == "colab"
    assert authenticated == [True]
    assert fake_google.calls == [[fw.gcs.READ_WRITE_SCOPE]]
    printed = capsys.readouterr().out
    assert "Colab" in printed and "adc-project" in printed and SECRET not in printed
    assert fw.colab_utils.setup_gcs() == "colab"  # the original-Fenwicks alias
    assert authenticated == [True, True]
    assert fw.gcs.check_credentials("gs://b/x") == "colab"


def test_setup_on_kaggle(fake_google, monkeypatch, capsys):
    projects = []

    class UserSecretsClient:
        def set_gcloud_credentials(self, project=None, account=None):
            projects.append(project)

    fake_module(monkeypatch, "kaggle_secrets", UserSecretsClient=UserSecretsClient)
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    assert fw.gcs.environment() == "kaggle"
    assert fw.gcs.setup(project="kaggle-proj") == "kaggle"
    assert projects == ["kaggle-proj"]
    printed = capsys.readouterr().out
    assert "Kaggle" in printed and "kaggle-proj" in printed and SECRET not in printed


def test_setup_on_kaggle_without_integration(fake_google, monkeypatch, capsys):
    class UserSecretsClient:
        def set_gcloud_credentials(self, project=None, account=None):
            raise RuntimeError(f"backend said {SECRET}")

    fake_module(monkeypatch, "kaggle_secrets", UserSecretsClient=UserSecretsClient)
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    with pytest.raises(fw.gcs.GCSCredentialsError, match="Add-ons > Google Cloud") as err:
        fw.gcs.setup()
    assert SECRET not in str(err.value) and err.value.__cause__ is None
    assert SECRET not in capsys.readouterr().out


def test_setup_with_application_default_credentials(fake_google, capsys):
    assert fw.gcs.environment() == "other"
    assert fw.gcs.setup() == "application-default"
    printed = capsys.readouterr().out
    assert "application-default" in printed and SECRET not in printed
    assert "google.colab" not in sys.modules and "kaggle_secrets" not in sys.modules


def test_setup_without_credentials_says_what_to_do(fake_google):
    fake_google.failing = True
    with pytest.raises(fw.gcs.GCSCredentialsError,
                       match="gcloud auth application-default login"):
        fw.gcs.setup()
    with pytest.raises(fw.gcs.GCSCredentialsError, match="'gs://b/data' is on Google Cloud"):
        fw.gcs.check_credentials("gs://b/data")
    fake_google.failing = False  # the user runs `gcloud auth application-default login`
    # A failure was not cached: the next check asks again and succeeds.
    assert fw.gcs.check_credentials("gs://b/data") == "application-default"


def test_setup_with_emulator_needs_no_credentials(fake_google, monkeypatch, capsys):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9023")
    assert fw.gcs.setup() == "emulator"
    assert fw.gcs.check_credentials("gs://b") == "emulator"
    assert fake_google.calls == []
    assert "emulator" in capsys.readouterr().out


# --------------------------------------------------------------------------- the fixture


def test_emulator_fixture_fails_in_ci_and_skips_elsewhere(monkeypatch, tmp_path):
    monkeypatch.setattr(emulator_module.os, "geteuid", lambda: 1000)
    with pytest.raises(emulator_module.EmulatorUnavailable, match="needs root"):
        emulator_module.start(tmp_path)
    monkeypatch.setenv(emulator_module.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="needs root"):
        emulator_module.skip_or_fail("needs root")
    monkeypatch.delenv(emulator_module.REQUIRE_ENV)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        emulator_module.skip_or_fail("needs root")
    assert list(tmp_path.iterdir()) == []  # nothing was set up on the way


@pytest.mark.parametrize("newline", [b"\n", b"\r\n"])  # gcsfs uses LF, Google's libraries CRLF
@pytest.mark.parametrize("content", [b"abc\r", b"abc\r\n", b"", b"x\n--==0==--\ny",
                                     bytes(range(256))])
def test_emulator_multipart_uploads_keep_every_byte(content, newline):
    raw = newline.join([b"--==0==", b"Content-Type: application/json", b"", b'{"name": "k"}',
                        b"--==0==", b"Content-Type: image/png", b"", content, b"--==0==--"])
    fields = emulator_module.multipart_upload_fields(raw, 'multipart/related; boundary="==0=="')
    assert fields == {"meta": {"name": "k"}, "content": content, "content-type": "image/png"}


def test_a_missing_or_malformed_key_file_is_named_with_why(monkeypatch, tmp_path):
    """GOOGLE_APPLICATION_CREDENTIALS set to a file that cannot be used: the message
    names that file and why, not "no Google Cloud credentials were found"."""
    for name in ("COLAB_RELEASE_TAG", "KAGGLE_KERNEL_RUN_TYPE", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    fw.gcs.reset_for_tests()  # as a fresh process
    malformed = tmp_path / "key.json"
    malformed.write_text('{"type": "service_account", "private_key": "-----BEGIN')  # cut
    cases = {str(tmp_path / "missing.json"): "no such file",
             str(malformed): "it is not a readable JSON key file"}
    for key_file, why in cases.items():
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", key_file)
        with pytest.raises(fw.gcs.GCSCredentialsError) as caught:
            fw.gcs.setup()
        message = str(caught.value)
        assert f"GOOGLE_APPLICATION_CREDENTIALS={key_file!r} cannot be used: {why}" in \
            message, message
        assert "no Google Cloud credentials were found" not in message
        assert "BEGIN" not in message  # the file's content is never quoted
