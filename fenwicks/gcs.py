"""Google Cloud Storage credentials: `setup()` on Colab, Kaggle or anywhere else.

Nothing of Colab, Kaggle or google-auth is imported until a function here is called.
Credentials are never printed, logged or written by Fenwicks: `setup()` says only where
they came from and which project they belong to.

    import fenwicks as fw
    fw.gcs.setup()           # 'colab', 'kaggle', 'application-default' or 'emulator'
"""

from __future__ import annotations

import json
import os
import sys

READ_WRITE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"

__all__ = ["GCSCredentialsError", "check_credentials", "environment", "setup"]

_SOURCES = {
    "colab": "Colab (google.colab.auth)",
    "kaggle": "Kaggle's Google Cloud integration (kaggle_secrets)",
    "application-default": "application-default credentials (google.auth.default)",
    "emulator": f"a local GCS emulator (${EMULATOR_ENV}, anonymous)",
}

_HOW_TO = (
    "On Colab or Kaggle call fw.gcs.setup() (on Kaggle first attach an account: "
    "Add-ons > Google Cloud Services > Cloud Storage). Elsewhere run "
    "`gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a "
    "service-account key file, then call fw.gcs.setup()."
)

# Where verified credentials came from; None until verified. A failure is not cached:
# the user may fix it (e.g. run `gcloud auth`) and retry in the same session.
_verified: str | None = None


class GCSCredentialsError(RuntimeError):
    """No usable Google Cloud credentials; the message says what to do."""


def setup(project: str | None = None) -> str:
    """Authenticates this notebook or machine for ``gs://`` paths and says how.

    On Colab it runs ``google.colab.auth.authenticate_user()`` (a sign-in prompt); on
    Kaggle it uses the account attached under Add-ons > Google Cloud Services; anywhere
    else it uses application-default credentials (``gcloud auth application-default
    login``, ``GOOGLE_APPLICATION_CREDENTIALS``, or a GCE / TPU VM service account).
    With ``STORAGE_EMULATOR_HOST`` set it talks to that emulator anonymously.

    Args:
        project: Google Cloud project to bill and to report. Defaults to the project
            the credentials carry (or ``GOOGLE_CLOUD_PROJECT``).

    Returns:
        Where the credentials came from: ``'colab'``, ``'kaggle'``,
        ``'application-default'`` or ``'emulator'``.

    Raises:
        GCSCredentialsError: no credentials could be found or obtained; the message says
            what to do. Raised within seconds: nothing waits on the network.

    Examples:
        >>> fw.gcs.setup()
        fenwicks: Google Cloud Storage via Colab (google.colab.auth), project my-proj
        'colab'
    """
    global _verified
    if os.environ.get(EMULATOR_ENV):
        source, found_project = "emulator", project
    else:
        source = _authenticate(environment(), project)
        found_project = _application_default(source, project)
    _verified = source
    suffix = f", project {found_project}" if found_project else ""
    print(f"fenwicks: Google Cloud Storage via {_SOURCES[source]}{suffix}")
    return source


def environment() -> str:
    """``'colab'``, ``'kaggle'`` or ``'other'``, judged without importing either.

    Examples:
        >>> fw.gcs.environment()
        'other'
    """
    if "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ:
        return "colab"
    if "kaggle_secrets" in sys.modules or "KAGGLE_KERNEL_RUN_TYPE" in os.environ:
        return "kaggle"
    return "other"


def check_credentials(path: str = "gs://") -> str:
    """Fails fast, before any connection, when ``gs://`` cannot be reached with credentials.

    `fw.io` calls this before touching a ``gs://`` path: without credentials
    TensorFlow's client and gcsfs would otherwise retry against the metadata server
    and the network for minutes.

    Args:
        path: the path about to be used, named in the error.

    Returns:
        ``'emulator'`` under ``STORAGE_EMULATOR_HOST``, else where credentials came from.

    Raises:
        GCSCredentialsError: if there are none; the message names `path` and the fix.

    Examples:
        >>> fw.gcs.check_credentials('gs://my-bucket/data')
        'application-default'
    """
    global _verified
    if os.environ.get(EMULATOR_ENV):
        return "emulator"
    if _verified is None:
        _application_default("application-default", None, path)
        _verified = "application-default"
    return _verified


def _authenticate(env: str, project: str | None) -> str:
    if env == "colab":
        _authenticate_colab()
        return "colab"
    if env == "kaggle":
        _authenticate_kaggle(project)
        return "kaggle"
    return "application-default"


def _authenticate_colab() -> None:
    from google.colab import auth  # only exists on Colab

    auth.authenticate_user()


def _authenticate_kaggle(project: str | None) -> None:
    try:
        from kaggle_secrets import UserSecretsClient  # only exists on Kaggle

        UserSecretsClient().set_gcloud_credentials(project=project)
    except Exception as err:  # noqa: BLE001 - its errors vary; their text may hold secrets
        raise GCSCredentialsError(
            f"Kaggle's Google Cloud integration gave no credentials ({type(err).__name__}). "
            "In the notebook open Add-ons > Google Cloud Services, attach an account with "
            "Cloud Storage, then call fw.gcs.setup() again") from None


def _application_default(source: str, project: str | None, path: str | None = None) -> str:
    """Verifies credentials are present; returns the project they name (or '')."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        _, found = google.auth.default(scopes=[READ_WRITE_SCOPE])
    except DefaultCredentialsError as err:
        where = f"{path!r} is on Google Cloud Storage, but " if path else ""
        key_file = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        if key_file:  # the user named a file: what is wrong with it is the news
            raise GCSCredentialsError(
                f"{where}GOOGLE_APPLICATION_CREDENTIALS={key_file!r} cannot be used: "
                f"{_key_file_problem(key_file, err)}. Point it at a service-account key "
                "file (JSON, from IAM > Service accounts > Keys in the Cloud console), or "
                "unset it to use `gcloud auth application-default login`; then call "
                "fw.gcs.setup() again") from None
        raise GCSCredentialsError(
            f"{where}no Google Cloud credentials were found (looked for "
            f"{_SOURCES[source]}). {_HOW_TO}") from None
    return project or found or os.environ.get("GOOGLE_CLOUD_PROJECT", "")


def _key_file_problem(key_file: str, err: BaseException) -> str:
    """Why the key file named by GOOGLE_APPLICATION_CREDENTIALS was refused, in words."""
    if not os.path.exists(key_file):
        return "no such file"
    try:
        with open(key_file) as f:
            json.load(f)
    except (OSError, ValueError) as bad:  # never quote the file: it may hold a secret
        return f"it is not a readable JSON key file ({type(bad).__name__})"
    return f"google.auth refused it ({str(err).splitlines()[0][:200]})"


def reset_for_tests() -> None:
    """Test hook: forgets the verified credentials, as a fresh process would."""
    global _verified
    _verified = None
