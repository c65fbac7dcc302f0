"""Security: a planted credential never shows up in logs, files or error messages; nothing
in Fenwicks unpickles or unpacks untrusted data.

The fake credential is everywhere a real one could be: GOOGLE_OAUTH_ACCESS_TOKEN and
CLOUDSDK_AUTH_ACCESS_TOKEN, an application-default-credentials file with a refresh token
and client secret (GOOGLE_APPLICATION_CREDENTIALS), and on gs:// the bearer token
TensorFlow's client really sends (GOOGLE_AUTH_TOKEN_FOR_TESTING). Python logging runs at
DEBUG, TensorFlow at INFO with its GCS/HTTP/auth modules at VLOG 3.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import secrets
import subprocess
import sys

import pytest

from tests.conftest import run_process
from tests.test_storage_faults import FAST_TF_RETRIES

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fenwicks"

TF_VERBOSE = {
    "TF_CPP_MIN_LOG_LEVEL": "0",
    "TF_CPP_VMODULE": "gcs_file_system=3,curl_http_request=3,google_auth_provider=3,"
                      "oauth_client=3,retrying_file_system=3,retrying_utils=3",
}


@pytest.fixture
def credential(tmp_path):
    """Fake secrets (unique per test) and the environment that plants them."""
    secret = {name: f"FAKE-{name.upper()}-{secrets.token_hex(12)}"
              for name in ("access_token", "refresh_token", "client_secret")}
    adc = tmp_path / "adc.json"
    adc.write_text(json.dumps({"type": "authorized_user", "client_id": "fake.apps",
                               "client_secret": secret["client_secret"],
                               "refresh_token": secret["refresh_token"],
                               "quota_project_id": "fake-project"}))
    broken = tmp_path / "broken_adc.json"  # what a half-copied key file looks like
    broken.write_text('{"type": "authorized_user", "refresh_token": "'
                      + secret["refresh_token"] + '", "client_secret": ')
    env = {"GOOGLE_OAUTH_ACCESS_TOKEN": secret["access_token"],
           "CLOUDSDK_AUTH_ACCESS_TOKEN": secret["access_token"],
           "GOOGLE_APPLICATION_CREDENTIALS": str(adc),
           "FENWICKS_BROKEN_ADC": str(broken), **TF_VERBOSE}
    return secret, env


def _leaks(secret: dict[str, str], text: str) -> list[str]:
    return [name for name, value in secret.items() if value in text]


def _files_with_secret(secret: dict[str, str], *roots: pathlib.Path) -> list[str]:
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file():
                data = path.read_bytes()
                if any(value.encode() in data for value in secret.values()):
                    found.append(str(path))
    return found


def _run(args: list[str], env: dict[str, str], cwd: pathlib.Path,
         timeout: float = 300) -> subprocess.CompletedProcess:
    # The local flows use the planted credential, not the emulator's.
    return run_process(args, {**env, "STORAGE_EMULATOR_HOST": None,
                              "GOOGLE_AUTH_TOKEN_FOR_TESTING": None},
                       cwd=cwd, timeout=timeout, check=False)


@pytest.mark.slow
def test_local_flows_and_cli_never_show_the_credential(credential, tmp_path):
    secret, env = credential
    work, export, demo = tmp_path / "work", tmp_path / "export", tmp_path / "demo"
    # One process (a new interpreter: its start-up output is searched too) runs the
    # flows, then `python -m fenwicks info` and `demo` through the CLI's `main`.
    proc = _run(["-m", "tests._secrets_run", "local", str(work), str(export), str(demo)],
                env, tmp_path)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    assert not _leaks(secret, proc.stdout + proc.stderr)
    # The logging really was verbose, and the credential really was loaded.
    assert "DEBUG" in proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["setup"] == "application-default"
    assert out["flows"]["global_step"] == 4
    assert out["cli"] == {"info": 0, "demo": 0}
    assert "test accuracy" in proc.stdout  # the demo printed its result
    errors = out["errors"]
    assert all(errors.values()), errors  # each flow did raise
    assert "GCSCredentialsError" in errors["broken_adc"]
    for message in errors.values():
        assert not _leaks(secret, message), message
    assert any(export.glob("*/saved_model.pb")) and any(work.glob("checkpoints/[0-9]*"))
    assert not _files_with_secret(secret, work, export, demo)


@pytest.mark.slow
def test_gcs_flows_never_show_the_bearer_token(credential, gcs_fault_emulator, tmp_path):
    secret, env = credential
    local = tmp_path / "to_upload"
    local.mkdir()
    (local / "records.bin").write_bytes(os.urandom(4000))
    root = gcs_fault_emulator.unique_url("secrets")
    # TensorFlow's gs:// client sends this token as its bearer token on every request.
    env = {**env, **FAST_TF_RETRIES, "GOOGLE_AUTH_TOKEN_FOR_TESTING": secret["access_token"]}
    proc = gcs_fault_emulator.run_module("tests._secrets_run", "gcs", f"{root}/work",
                                         f"{root}/export", str(local), env=env)
    assert not _leaks(secret, proc.stdout + proc.stderr)
    assert "DEBUG" in proc.stderr
    assert "gcs_file_system.cc" in proc.stderr  # TensorFlow's GCS client logged verbosely
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["flows"]["global_step"] == 4 and out["uploaded"]
    assert out["objects"] >= 5 and out["objects_with_token"] == []
    assert "CheckpointWriteError" in out["errors"]["failed_save"]
    assert not _files_with_secret(secret, local)


# --------------------------------------------------------------------------- untrusted data

# Calls that run code hidden in data (pickle and friends) or write where an archive says.
_FORBIDDEN_MODULES = {"pickle", "cPickle", "dill", "joblib", "marshal", "shelve", "tarfile",
                      "zipfile"}
_FORBIDDEN_CALLS = {"unpack_archive", "extractall", "load_model", "eval", "exec"}
# fw.io.unzip (fenwicks/archives.py) reads archives member by member, refusing any member whose
# path leaves the target folder and any link (tests/test_archives.py): the one place that
# may open archive modules. It never calls extractall/unpack_archive (still forbidden).
_ARCHIVE_READER = ("fenwicks/archives.py", {"tarfile", "zipfile"})


def _source_files() -> list[pathlib.Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.slow  # over ~1 s on a quiet 2-core machine: the full run checks it
def test_package_neither_unpickles_nor_unpacks_archives():
    problems = []
    for path in _source_files():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [alias.name for alias in node.names]
                if isinstance(node, ast.ImportFrom) and node.module:
                    names.append(node.module)
                allowed = _ARCHIVE_READER[1] if path.relative_to(ROOT).as_posix() \
                    == _ARCHIVE_READER[0] else set()
                problems += [f"{where} imports {name}" for name in names
                             if name.split(".")[0] in _FORBIDDEN_MODULES - allowed]
            elif isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                if name in _FORBIDDEN_CALLS:
                    problems.append(f"{where} calls {name}()")
                if name == "load" and _is_numpy(node.func):
                    problems += _np_load_problems(node, where)
    assert not problems, ("Fenwicks must not unpickle or unpack untrusted data (np.load "
                          "needs allow_pickle=False; archives tarfile's filter='data'):\n"
                          + "\n".join(problems))


def _is_numpy(func: ast.expr) -> bool:
    return isinstance(func, ast.Attribute) and getattr(func.value, "id", "") in {"np",
                                                                                "numpy"}


def _np_load_problems(node: ast.Call, where: str) -> list[str]:
    for keyword in node.keywords:
        if keyword.arg == "allow_pickle":
            if isinstance(keyword.value, ast.Constant) and keyword.value.value is False:
                return []
    return [f"{where} calls np.load without allow_pickle=False"]


def test_the_source_check_finds_what_it_forbids(tmp_path, monkeypatch):
    """The check above is not vacuous: each forbidden pattern, planted, is reported."""
    planted = tmp_path / "fenwicks"
    planted.mkdir()
    (planted / "bad.py").write_text(
        "import pickle\nimport numpy as np\nfrom tarfile import open as t\n"
        "np.load('x.npy')\nnp.load('y.npz', allow_pickle=True)\n"
        "np.load('z.npy', allow_pickle=False)\nimport shutil\nshutil.unpack_archive('a')\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", planted)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError) as failure:
        test_package_neither_unpickles_nor_unpacks_archives()
    report = str(failure.value)
    assert "bad.py:1 imports pickle" in report and "bad.py:3 imports tarfile" in report
    assert "bad.py:4 calls np.load" in report and "bad.py:5 calls np.load" in report
    assert "bad.py:6" not in report and "bad.py:8 calls unpack_archive()" in report
